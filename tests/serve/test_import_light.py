"""The HTTP front end imports without torch, flashinfer or the native transfer module: a router or
a CPU-only front-end process must not pay for (or need) the engine's heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY_MODULES = ("torch", "flashinfer", "disaggsdk.transfer._fabric")


def test_openai_app_imports_without_heavy_modules():
    code = (
        "import json, sys\n"
        "import disaggsdk.serve.http.openai_app\n"
        f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
