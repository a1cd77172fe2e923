#!/bin/bash
# Serving side by side, measured by vLLM's own client (`vllm bench serve`) on one tiny Qwen3
# directory: a disaggsdk spec (default specs/tiny_pd.yaml, its model replaced by that directory)
# against `vllm serve` (colocated, chunked prefill) on the same machine, the same load.
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh):
#   tools/peers/serve_vs_vllm.sh [SPEC] [RATE] [INPUT_LEN] [OUTPUT_LEN] [NUM_PROMPTS]
# RATE "inf" sends every request at once. Defaults: specs/tiny_pd.yaml 2.5 1024 128 40.
# ROUNDS=R (default 1) runs R rounds, each one run of both servers (which starts first alternates),
# and prints each round's ratios and the medians over the rounds. This machine's speed drifts by a
# third within minutes (vLLM's own mean TTFT moved between 98 and 153 ms in one afternoon), so one
# pair of runs can land either side of a line; rounds show the spread and the median.
#
# The project's copy of the serving harness the sessions shared, with one change: the warm-up run uses
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
$PY - "$W/m" "$SPEC" "$W/spec.yaml" ${LAYERS:+bigger} ${HIDDEN:+bigger} <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[2])); s["model"] = sys.argv[1]
s.setdefault("serve", {})["port"] = 8393
if len(sys.argv) > 4:  # LAYERS / HIDDEN: a bigger model than the spec's memory was sized for; give each rank 1 GB
    hw = s.setdefault("hardware", {})
    hw["cpu_memory_gb"] = max(float(hw.get("cpu_memory_gb", 0.25)), 1.0)
yaml.safe_dump(s, open(sys.argv[3], "w"))
PY
run_ours() {  # run_ours RESULT
  setsid $EXE launch "$W/spec.yaml" >"$W/ours.log" 2>&1 & OURS=$!
  if wait_up 8393 $OURS; then
    name=$(curl -s http://127.0.0.1:8393/v1/models | $PY -c "import sys,json; print(json.load(sys.stdin)['data'][0]['id'])")
    bench 8393 "$name" warm.json 2
    bench 8393 "$name" "$1"
  else
    tail -5 "$W/ours.log"; echo "disaggsdk did not come up"
  fi
  kill -TERM -$OURS 2>/dev/null; wait $OURS 2>/dev/null
}
run_vllm() {  # run_vllm RESULT
  setsid "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 \
    --host 127.0.0.1 --port 8394 >"$W/vllm.log" 2>&1 & VL=$!
  if wait_up 8394 $VL; then bench 8394 "$W/m" warm.json 2; bench 8394 "$W/m" "$1"; else tail -5 "$W/vllm.log"; fi
  kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
}
for r in $(seq 1 ${ROUNDS:-1}); do
  if [ $((r % 2)) = 1 ]; then run_ours ours_$r.json; run_vllm vllm_$r.json; else run_vllm vllm_$r.json; run_ours ours_$r.json; fi
done
$PY - "$W" <<'PY'
import json, os, statistics, sys
w = sys.argv[1]
keys = ["completed", "failed", "total_input_tokens", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_itl_ms", "p99_itl_ms", "p99.9_itl_ms", "p99_e2el_ms"]
ratios = {"output throughput": "output_throughput", "mean TTFT": "mean_ttft_ms", "mean TPOT": "mean_tpot_ms",
          "p99 ITL": "p99_itl_ms"}
rounds = []
for r in range(1, 1000):
    rows = {n: os.path.join(w, f"{n}_{r}.json") for n in ("ours", "vllm")}
    if not any(os.path.exists(f) for f in rows.values()):
        break
    rows = {n: json.load(open(f)) for n, f in rows.items() if os.path.exists(f)}
    for n, row in rows.items():
        print(f"round {r} {n}", " ".join(f"{k}={row[k]:.1f}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                                       for k in keys))
    if len(rows) == 2:
        o, v = rows["ours"], rows["vllm"]
        rounds.append({label: o[k] / v[k] for label, k in ratios.items()})
        print(f"round {r} ours/vllm: " + ", ".join(f"{label} {x:.2f}x" for label, x in rounds[-1].items()))
if len(rounds) > 1:
    print(f"median of {len(rounds)} rounds, ours/vllm: "
          + ", ".join(f"{label} {statistics.median(r[label] for r in rounds):.2f}x" for label in ratios))
PY
