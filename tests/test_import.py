"""`import disaggsdk` stays light: no torch, no native module, no cffi, no flashinfer."""

import subprocess
import sys


def test_import_and_plan_pull_in_no_heavy_modules():
    code = (
        "import sys, disaggsdk\n"
        "from disaggsdk import Cluster\n"
        "Cluster().prefill(tp=8).decoders(3, tp=8).model('qwen3-coder').spec\n"
        "heavy = [m for m in ('torch', 'flashinfer', 'cffi', 'cuda', 'transformers') if m in sys.modules]\n"
        "heavy += [m for m in sys.modules if m.startswith('disaggsdk.transfer._')]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
