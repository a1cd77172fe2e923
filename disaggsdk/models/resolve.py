"""Turn a spec's `model` field (catalog name or checkpoint directory) into a `ModelArch`."""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

from disaggsdk.errors import ModelError, printable
from disaggsdk.models.arch import ModelArch, arch_from_hf_config
from disaggsdk.models.catalog import CATALOG, catalog_config, catalog_names


def looks_like_path(model: str) -> bool:
    """A model string naming a directory rather than a catalog entry."""
    return "/" in model or model.startswith(".") or model.startswith("~")


def read_hf_config(directory: str | Path) -> dict:
    """Read ``config.json`` of a local Hugging Face checkpoint directory.

    Raises:
        ModelError: the directory or its config.json is missing, unreadable or not valid JSON.
    """
    path = Path(directory).expanduser()
    config_path = path / "config.json"
    try:
        if not path.is_dir():
            raise ModelError(f"model directory {str(path)!r} does not exist")
        if not config_path.is_file():
            raise ModelError(f"{printable(str(config_path))} is missing: a Hugging Face checkpoint needs config.json")
        return json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError) as exc:  # a name too long, a folder it may not enter, a binary file
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ModelError(f"model directory {str(path)!r}: cannot read its config.json ({why})") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{printable(str(config_path))} is not valid JSON: {exc}") from None


def resolve_model(model: str) -> ModelArch:
    """The architecture of a catalog model name or a local checkpoint directory.

    Raises:
        ModelError: unknown name (the message lists the catalog and the closest name) or a
            directory that cannot be read.
    """
    if model in CATALOG:
        return arch_from_hf_config(catalog_config(model), name=model)
    if looks_like_path(model) or os.path.isdir(os.path.expanduser(model)):  # False for a name too long to be a path
        return arch_from_hf_config(read_hf_config(model), name=model)
    close = difflib.get_close_matches(model, catalog_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ModelError(f"unknown model {model!r}; {hint}use a catalog name ({', '.join(catalog_names())}) "
                     f"or a path to a Hugging Face checkpoint directory")
