#!/bin/bash
# First start side by side: `disaggsdk launch` (one prefill and two decode units on the CPU) against
# `vllm serve`, on one tiny Qwen3 directory (make_model.py), each with empty compile caches, as on a
# machine that never ran either: the seconds from the start to the first answered completion, and
# the latency of one greedy completion once the server settled (disaggsdk.bench.first_start).
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh), alone
# on the machine:
#   tools/peers/first_start_vs_vllm.sh [DURATION_S]     # default 180: how long each server is loaded
set -u
DURATION=${1:-180}
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m)
fresh() { mktemp -d -p "$W"; }
TORCHINDUCTOR_CACHE_DIR=$(fresh) $PY -m disaggsdk.bench.first_start --port 8393 --duration-s "$DURATION" -- \
  "$EXE" launch --model "$W/m" --device cpu --decoders 2 --port 8393 --no-live >"$W/ours.json" \
  || { echo "disaggsdk: first_start failed"; exit 1; }
TORCHINDUCTOR_CACHE_DIR=$(fresh) VLLM_CACHE_ROOT=$(fresh) $PY -m disaggsdk.bench.first_start --port 8394 \
  --duration-s "$DURATION" -- "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 \
  --host 127.0.0.1 --port 8394 >"$W/vllm.json" || { echo "vllm: first_start failed"; exit 1; }
$PY - "$W" <<'PY'
import json, platform, subprocess, sys
w = sys.argv[1]
ours, vllm = (json.load(open(f"{w}/{name}.json")) for name in ("ours", "vllm"))
cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout
            .splitlines() if line.startswith("Model name")), platform.processor())
keys = ("first_completion_s", "median_latency_first_s", "median_latency_last_s", "completions")
print(json.dumps({"cpu": cpu, "ours": {k: ours[k] for k in keys} | {"compiled": ours["compiled_lines"]},
                  "vllm": {k: vllm[k] for k in keys},
                  "ours/vllm": {k: round(ours[k] / vllm[k], 3) for k in keys[:3] if ours[k] and vllm[k]}}, indent=1))
PY
