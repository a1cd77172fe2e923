#!/bin/bash
# Goodput side by side, in one command (issue 41): `disaggsdk bench SPEC URL --request-rate search`
# launches SPEC (its model replaced by the tiny Qwen3 directory both servers load), sweeps it for its
# goodput rate and tears it down, then sweeps `vllm serve` (colocated, chunked prefill) on the same
# directory with the same client, prompts and SLOs, and prints both rates and their ratio.
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh), alone on
# the machine:
#   tools/peers/goodput_vs_vllm.sh [SPEC] [TTFT_MS] [TPOT_MS] [INPUT_LEN] [OUTPUT_LEN] [NUM_PROMPTS]
# Defaults: specs/tiny_pd.yaml 1000 25 1024 128 40. ROUNDS=R (default 3) sweeps R times per server;
# RATES (default `search`) may be a list such as 1,2,4; STEPS (default 4) bisections per search.
# `vllm serve` is up (idle) while the spec is swept: its CPU time over 10 s of that idleness is printed
# first, so a reader can tell what it took from our side. The JSON goes to stdout (KEEP=DIR keeps it).
set -u
SPEC=${1:-specs/tiny_pd.yaml}; TTFT=${2:-1000}; TPOT=${3:-25}; IN=${4:-1024}; OUT=${5:-128}; N=${6:-40}
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m), wait_up
$PY - "$W/m" "$SPEC" "$W/spec.yaml" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[2])); s["model"] = sys.argv[1]
yaml.safe_dump(s, open(sys.argv[3], "w"))
PY
setsid "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 \
  --host 127.0.0.1 --port 8394 >"$W/vllm.log" 2>&1 & VL=$!
trap 'kill -TERM -$VL 2>/dev/null' INT TERM
if ! wait_up 8394 $VL; then tail -5 "$W/vllm.log"; echo "vllm serve did not come up"; exit 1; fi
$PY - $VL >&2 <<'PY'
import os, sys, time
def cpu_s(session):  # user + system time of every process of the server's session
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
before = cpu_s(int(sys.argv[1])); time.sleep(10); after = cpu_s(int(sys.argv[1]))
print(f"vllm serve idle: {after - before:.2f} CPU s in 10 s (its whole session)")
PY
lscpu | grep "Model name" >&2
$EXE bench "$W/spec.yaml" http://127.0.0.1:8394 --request-rate "${RATES:-search}" --search-steps "${STEPS:-4}" \
  --goodput ttft:$TTFT tpot:$TPOT --repeat "${ROUNDS:-3}" --input-len $IN --output-len $OUT --num-prompts $N \
  --no-live --json --output "$W/goodput.json"
rc=$?
kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
exit $rc
