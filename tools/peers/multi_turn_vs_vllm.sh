#!/bin/bash
# Prefix caching side by side on a multi-turn chat load (issue #21): a disaggsdk spec (default
# specs/tiny_pd.yaml, its model replaced by make_model.py's tiny Qwen3 directory) with its
# prefix cache on, the same spec with it off, and `vllm serve` (colocated, prefix caching on, as it
# ships), one after the other on the same machine, measured by OUR client (`disaggsdk bench
# --dataset-name multi-turn`: `vllm bench serve` has no dataset whose turns resend the history).
# Usage, from the project root after `make install`, alone on the machine, with VLLM_VENV set:
#   tools/peers/multi_turn_vs_vllm.sh [SPEC] [CONVERSATIONS_PER_S] [CONVERSATIONS] [TURNS] [SYSTEM_LEN] [USER_LEN] [OUT]
# Defaults: specs/tiny_pd.yaml 1 16 4 512 64 64 (~86% of prompt tokens repeat an earlier prompt).
# Each server gets an untimed warm-up on other conversations (seed 2), then the measured run (seed 1).
# KV bytes sent are the prefill units' `disaggsdk_kv_transfer_bytes` counters before and after the run.
# MAX_LOCAL_PREFILL_TOKENS=N sets `transfer.max_local_prefill_tokens` in both of our runs (conditional
# disaggregation: decode prefills prompts with at most N tokens missing from its cache itself).
set -u
SPEC=${1:-specs/tiny_pd.yaml}; RATE=${2:-1}; N=${3:-16}; TURNS=${4:-4}; SYS=${5:-512}; USER=${6:-64}; OUT=${7:-64}
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m), wait_up
bench() {  # bench PORT RESULT SEED
  $EXE bench "http://127.0.0.1:$1" --dataset-name multi-turn --num-prompts $N --multi-turn-turns $TURNS \
    --multi-turn-system-len $SYS --input-len $USER --output-len $OUT --ignore-eos --request-rate $RATE \
    --seed $3 --tokenizer "$W/m" --metric-percentiles 50,99 --save-result --result-dir "$W" \
    --result-filename "$2" >"$W/$2.log" 2>&1 || tail -3 "$W/$2.log"
}
sent_bytes() {  # sent_bytes PORT: KV bytes the prefill units wrote so far
  curl -s "http://127.0.0.1:$1/metrics" | awk '/^disaggsdk_kv_transfer_bytes_total/ {s += $NF} END {printf "%d\n", s}'
}
ours() {  # ours NAME PREFIX_CACHING
  $PY - "$W/m" "$SPEC" "$W/$1.yaml" "$2" "${MAX_LOCAL_PREFILL_TOKENS:-}" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[2])); s["model"] = sys.argv[1]
s.setdefault("serve", {})["port"] = 8393
s.setdefault("engine", {})["prefix_caching"] = sys.argv[4] == "on"
if sys.argv[5]:
    s.setdefault("transfer", {})["max_local_prefill_tokens"] = int(sys.argv[5])
yaml.safe_dump(s, open(sys.argv[3], "w"))
PY
  setsid $EXE launch "$W/$1.yaml" >"$W/$1.launch.log" 2>&1 & local pid=$!
  if wait_up 8393 $pid; then
    bench 8393 "warm-$1.json" 2
    local before; before=$(sent_bytes 8393)
    bench 8393 "$1.json" 1
    echo $(( $(sent_bytes 8393) - before )) >"$W/$1.bytes"
  else
    tail -5 "$W/$1.launch.log"; echo "disaggsdk ($1) did not come up"
  fi
  kill -TERM -$pid 2>/dev/null; wait $pid 2>/dev/null
}
ours cached on
ours uncached off
setsid "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 --enable-prompt-tokens-details \
  --host 127.0.0.1 --port 8394 >"$W/vllm.log" 2>&1 & VL=$!
if wait_up 8394 $VL; then bench 8394 warm-vllm.json 2; bench 8394 vllm.json 1; else tail -5 "$W/vllm.log"; fi
kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
$PY - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
keys = ["completed", "failed", "total_input_tokens", "output_throughput", "median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "p99_itl_ms", "total_cached_tokens", "cached_token_ratio"]
out = {}
for name in ("cached", "uncached", "vllm"):
    path = os.path.join(w, name + ".json")
    if not os.path.exists(path):
        continue
    r = json.load(open(path))
    out[name] = {k: r.get(k) for k in keys} | {"prefix_reuse_ratio": r.get("multi_turn", {}).get("prefix_reuse_ratio")}
    if os.path.exists(os.path.join(w, name + ".bytes")):
        out[name]["kv_bytes_sent"] = int(open(os.path.join(w, name + ".bytes")).read())
c, u, v = out.get("cached"), out.get("uncached"), out.get("vllm")
if c and u:
    out["uncached_over_cached"] = {"p50_ttft": u["median_ttft_ms"] / c["median_ttft_ms"],
                                   "kv_bytes_sent": u["kv_bytes_sent"] / max(c["kv_bytes_sent"], 1)}
if c and v:
    out["cached_over_vllm"] = {"p50_ttft": c["median_ttft_ms"] / v["median_ttft_ms"],
                               "mean_tpot": c["mean_tpot_ms"] / v["mean_tpot_ms"],
                               "output_throughput": c["output_throughput"] / v["output_throughput"],
                               "p99_itl": c["p99_itl_ms"] / v["p99_itl_ms"]}
print(json.dumps(out, indent=1))
PY
