"""The trained tiny checkpoints that ship inside the package (no download, no training step).

``disaggsdk/models/checkpoints/<name>/`` holds a Hugging Face checkpoint for each tiny catalog
model: config.json, model.safetensors (bfloat16), tokenizer.json, tokenizer_config.json (with the
chat template), generation_config.json, the corpus manifest and the training log. They are
reproduced by ``python -m tools.train_tiny.train <name> --out disaggsdk/models/checkpoints/<name>``
(docs/trained_checkpoints.md). A catalog name resolves to its checkpoint's weights and tokenizer;
``load_format="dummy"`` asks for seeded random weights of the same shape instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHECKPOINTS_DIR = Path(__file__).with_name("checkpoints")


def shipped_checkpoint(name: str) -> Path | None:
    """The directory of catalog model ``name``'s trained checkpoint, or None when none ships."""
    directory = CHECKPOINTS_DIR / name
    return directory if (directory / "model.safetensors").is_file() else None


def checkpoint_directory(model: str) -> Path | None:
    """Where ``model``'s files live: a shipped checkpoint for a catalog name, else the directory itself
    (None for a catalog name without one)."""
    from disaggsdk.models.catalog import CATALOG

    if model in CATALOG:
        return shipped_checkpoint(model)
    return Path(model).expanduser()


def read_generation_config(model: str) -> dict[str, Any]:
    """``generation_config.json`` of ``model``'s checkpoint ({} when it has none)."""
    directory = checkpoint_directory(model)
    path = directory / "generation_config.json" if directory else None
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
