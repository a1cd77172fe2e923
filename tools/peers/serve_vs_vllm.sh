#!/bin/bash
# Serving side by side, measured by vLLM's own client (`vllm bench serve`) on one tiny Qwen3
# directory: a disaggsdk spec (default specs/tiny_pd.yaml, its model replaced by that directory)
# against `vllm serve` (colocated, chunked prefill) on the same machine, the same load.
# Usage, from the project root after `make install`:
#   ../shared/peers/vllm/serve_vs_vllm.sh [SPEC] [RATE] [INPUT_LEN] [OUTPUT_LEN] [NUM_PROMPTS]
# RATE "inf" sends every request at once. Defaults: specs/tiny_pd.yaml 2.5 1024 128 40.
#
# The project's copy of ../shared/peers/vllm/serve_vs_vllm.sh with one change: the warm-up run uses
# other prompts (seed 2) than the measured run (seed 1). With the same seed, `vllm serve`'s prefix
# cache (on by default) holds every measured prompt after the warm-up, so its measured TTFT is the
# cost of one token: 23-56 ms against ~100 ms for its own prefill of 1,024 tokens (LLM.generate,
# max_tokens=1, on this machine): the original compares a cache hit with a full prefill. Random
# prompts share no prefix, so with distinct warm-up prompts the cache helps neither side; it stays
# on in both, as each ships it (tools/peers/multi_turn_vs_vllm.sh measures it).
set -u
SPEC=${1:-specs/tiny_pd.yaml}; RATE=${2:-2.5}; IN=${3:-1024}; OUT=${4:-128}; N=${5:-40}
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m), wait_up
bench() {  # bench PORT MODEL_NAME RESULT [SEED]
  "$VPY" "$HERE/vllm_cli.py" bench serve --backend openai --base-url "http://127.0.0.1:$1" \
    --model "$2" --tokenizer "$W/m" --dataset-name random --random-input-len $IN \
    --random-output-len $OUT --num-prompts $N --ignore-eos --request-rate $RATE --seed ${4:-1} \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99,99.9 \
    --save-result --result-dir "$W" --result-filename "$3" >"$W/$3.log" 2>&1
}
$PY - "$W/m" "$SPEC" "$W/spec.yaml" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[2])); s["model"] = sys.argv[1]
s.setdefault("serve", {})["port"] = 8393
yaml.safe_dump(s, open(sys.argv[3], "w"))
PY
setsid $EXE launch "$W/spec.yaml" >"$W/ours.log" 2>&1 & OURS=$!
wait_up 8393 $OURS || { tail -5 "$W/ours.log"; kill -TERM -$OURS; echo "disaggsdk did not come up"; exit 1; }
name=$(curl -s http://127.0.0.1:8393/v1/models | $PY -c "import sys,json; print(json.load(sys.stdin)['data'][0]['id'])")
bench 8393 "$name" warm.json 2
bench 8393 "$name" ours.json
kill -TERM -$OURS 2>/dev/null; wait $OURS 2>/dev/null
setsid "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 \
  --host 127.0.0.1 --port 8394 >"$W/vllm.log" 2>&1 & VL=$!
if wait_up 8394 $VL; then bench 8394 "$W/m" warm.json 2; bench 8394 "$W/m" vllm.json; else tail -5 "$W/vllm.log"; fi
kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
$PY - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
keys = ["completed", "failed", "total_input_tokens", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_itl_ms", "p99_itl_ms", "p99.9_itl_ms", "p99_e2el_ms"]
rows = {n: json.load(open(os.path.join(w, n + ".json"))) for n in ("ours", "vllm") if os.path.exists(os.path.join(w, n + ".json"))}
for n, r in rows.items():
    print(n, " ".join(f"{k}={r[k]:.1f}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}" for k in keys))
if len(rows) == 2:
    o, v = rows["ours"], rows["vllm"]
    print(f"ours/vllm: output throughput {o['output_throughput'] / v['output_throughput']:.2f}x, "
          f"mean TTFT {o['mean_ttft_ms'] / v['mean_ttft_ms']:.2f}x, mean TPOT {o['mean_tpot_ms'] / v['mean_tpot_ms']:.2f}x, "
          f"p99 ITL {o['p99_itl_ms'] / v['p99_itl_ms']:.2f}x")
PY
