"""Project tools that are not part of the installed package (training the tiny checkpoints, peers)."""
