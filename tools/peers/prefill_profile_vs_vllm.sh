#!/bin/bash
# One prefill, profiled side by side on one tiny Qwen3 directory: our LLMEngine (one torch thread,
# as a prefill unit of specs/tiny_pd.yaml runs) against vLLM's LLM.generate (its model on one core,
# its front end on the other), split by kind of kernel (tools/peers/prefill_profile.py says which).
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh says how):
#   tools/peers/prefill_profile_vs_vllm.sh [TOKENS] [float32|bfloat16] [LAYERS HIDDEN]
# PROFILE_ARGS=--shapes adds each side's GEMM and attention calls by input shape.
# Prints one JSON object: each side's split and, per kind, ours over vLLM's milliseconds.
set -u
TOKENS=${1:-1024}; DTYPE=${2:-float32}; LAYERS=${3:-4}; HIDDEN=${4:-256}
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=.venv/bin/python
VPY=$("$HERE/env.sh") || exit 2  # env.sh said what to set
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
$PY "$HERE/make_model.py" "$W/m" --layers "$LAYERS" --hidden "$HIDDEN" >/dev/null 2>&1 || { echo "model build failed"; exit 1; }
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
$PY "$HERE/prefill_profile.py" ours "$W/m" --tokens "$TOKENS" --dtype "$DTYPE" ${PROFILE_ARGS:-} 2>"$W/ours.err" | grep "^{\"who\"" >"$W/ours.json"
[ -s "$W/ours.json" ] || { tail -5 "$W/ours.err"; exit 1; }
"$VPY" "$HERE/prefill_profile.py" vllm "$W/m" --tokens "$TOKENS" --dtype "$DTYPE" ${PROFILE_ARGS:-} 2>"$W/vllm.err" | grep "^{\"who\"" >"$W/vllm.json"
[ -s "$W/vllm.json" ] || { tail -5 "$W/vllm.err"; exit 1; }
$PY - "$W" "$LAYERS" "$HIDDEN" <<'PY'
import json, sys
w, layers, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours, vllm = (json.load(open(f"{w}/{n}.json")) for n in ("ours", "vllm"))
from disaggsdk.records.host_cpu import host_cpu
cpu = host_cpu().as_json()
kinds = sorted(set(ours["ms"]) | set(vllm["ms"]))
ratio = {k: round(ours["ms"].get(k, 0) / vllm["ms"][k], 2) for k in kinds if vllm["ms"].get(k)}
ratio["prefill"] = round(ours["prefill_ms"]["median"] / vllm["prefill_ms"]["median"], 2)
print(json.dumps({"model": {"layers": layers, "hidden": hidden}, "cpu": cpu, "ours": ours, "vllm": vllm,
                  "ours_over_vllm_ms": ratio}, indent=1))
PY
