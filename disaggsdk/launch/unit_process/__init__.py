"""The unit's side of the process boundary: what runs inside one unit process (its loop, the parts
it assembles for its role, its lease on its launcher, a Ray node's host of it). The launcher's
side is in `launch.launcher`; what both sides share (the contract, the messages and their channel,
the health checks) is in `disaggsdk.launch` itself.
"""
