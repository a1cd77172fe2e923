#!/bin/bash
# Do our client (`disaggsdk bench`) and vLLM's (`vllm bench serve`) measure the same thing? Both load
# ONE server with the same load, given with the same flags (ours accepts vLLM's spellings), and
# the script prints a JSON document comparing mean TTFT / TPOT / ITL (ratio ours / vLLM; issue #19
# asks for agreement within 10%). Run it alone on the machine: on 2 cores anything else moves both.
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh):
#   tools/peers/bench_agreement.sh [SPEC|URL] [RATE] [INPUT_LEN] [OUTPUT_LEN] [NUM_PROMPTS] [REPEAT] [BACKEND]
# Defaults: specs/tiny_local.yaml 2 256 64 100 3 openai (BACKEND openai-chat loads /v1/chat/completions).
# A URL uses a server that is already up (its first model; its tokenizer must be a catalog name or a
# directory on this machine); a SPEC is launched on port 8123 and stopped at the end.
# The two clients alternate REPEAT times (ours, vLLM, ours, vLLM...), so a slow minute hurts both;
# each metric is the median over the repeats. A warm-up round of each (other prompts: seed 2) goes
# first and is not counted.
set -u
TARGET=${1:-specs/tiny_local.yaml}; RATE=${2:-2}; IN=${3:-256}; OUT=${4:-64}; N=${5:-100}; REPEAT=${6:-3}
BACKEND=${7:-openai}
PEERS="$(cd "$(dirname "$0")" && pwd)"  # tools/peers: env.sh, vllm_cli.py
PY=.venv/bin/python
VPY=$("$PEERS/env.sh") || exit 2  # env.sh said what to set
W=$(mktemp -d); SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill -TERM -- "-$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; fi
  rm -rf "$W"
}
trap cleanup EXIT
export HF_HUB_OFFLINE=1
case "$BACKEND" in
  openai) ENDPOINT=/v1/completions ;;
  openai-chat) ENDPOINT=/v1/chat/completions ;;
  *) echo "BACKEND must be openai or openai-chat" >&2; exit 2 ;;
esac

if [[ "$TARGET" == http* ]]; then
  URL=${TARGET%/}
else
  URL=http://127.0.0.1:8123
  setsid $PY -m disaggsdk.cli.main launch "$TARGET" --port 8123 --no-live >"$W/server.log" 2>&1 & SERVER=$!
  for _ in $(seq 1 240); do
    curl -sf "$URL/health" >/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || { tail -5 "$W/server.log" >&2; echo "the server did not start" >&2; exit 1; }
    sleep 1
  done
fi
MODEL=$(curl -sf "$URL/v1/models" | $PY -c "import sys, json; print(json.load(sys.stdin)['data'][0]['id'])") \
  || { echo "no model at $URL" >&2; exit 1; }
# vLLM's client needs a tokenizer directory: the shipped checkpoint of a tiny catalog model, or the path itself
TOKENIZER=$($PY -c "
import sys
from disaggsdk.models.shipped import shipped_checkpoint
try:
    print(shipped_checkpoint(sys.argv[1]) or sys.argv[1])
except Exception:
    print(sys.argv[1])" "$MODEL")

# the same flags for both clients (vLLM's spellings); only the program differs
LOAD=(--backend "$BACKEND" --endpoint "$ENDPOINT" --base-url "$URL" --model "$MODEL" --tokenizer "$TOKENIZER"
      --dataset-name random --random-input-len "$IN" --random-output-len "$OUT" --num-prompts "$N"
      --request-rate "$RATE" --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el
      --metric-percentiles 50,99 --save-result --save-detailed --result-dir "$W")
ours() {  # ours RESULT SEED
  $PY -m disaggsdk.cli.main bench "${LOAD[@]}" --seed "$2" --result-filename "$1" >"$W/$1.log" 2>&1 \
    || { tail -5 "$W/$1.log" >&2; echo "disaggsdk bench failed" >&2; exit 1; }
}
vllm() {  # vllm RESULT SEED
  "$VPY" "$PEERS/vllm_cli.py" bench serve "${LOAD[@]}" --seed "$2" --result-filename "$1" >"$W/$1.log" 2>&1 \
    || { tail -5 "$W/$1.log" >&2; echo "vllm bench serve failed" >&2; exit 1; }
}
ours warm-ours.json 2; vllm warm-vllm.json 2
for i in $(seq 1 "$REPEAT"); do ours "ours-$i.json" 1; vllm "vllm-$i.json" 1; done

$PY - "$W" "$REPEAT" "$URL" "$MODEL" "$RATE" "$IN" "$OUT" "$N" "$BACKEND" <<'PY'
import json, statistics, sys
w, repeat = sys.argv[1], int(sys.argv[2])
keys = ["mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "median_ttft_ms", "median_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "mean_e2el_ms", "output_throughput", "completed", "failed"]
def runs(tool):
    return [json.load(open(f"{w}/{tool}-{i}.json")) for i in range(1, repeat + 1)]
sides = {tool: {k: statistics.median(r.get(k) or 0 for r in runs(tool)) for k in keys} for tool in ("ours", "vllm")}
ratio = {k: sides["ours"][k] / sides["vllm"][k] if sides["vllm"][k] else None for k in keys[:8]}
main3 = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
print(json.dumps({
    "load": dict(zip(["url", "model", "request_rate", "input_len", "output_len", "num_prompts", "backend"], sys.argv[3:]),
                 repeat=repeat),
    "ours": sides["ours"], "vllm": sides["vllm"], "ratio_ours_over_vllm": ratio,
    "per_run_mean_ttft_ms": {t: [r["mean_ttft_ms"] for r in runs(t)] for t in ("ours", "vllm")},
    "within_10_percent": all(ratio[k] is not None and abs(ratio[k] - 1) <= 0.10 for k in main3),
}, indent=2))
PY
