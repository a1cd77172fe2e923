#!/bin/bash
# A load that shifts (short prompts, then long ones, then short again), side by side on one tiny Qwen3
# directory: our 3-unit deployment (1 prefill + 2 decode) with the layout fixed, the same with
# `serve.autoscale` on, and `vllm serve` (colocated, chunked prefill) on the same cores, each loaded by
# `python -m disaggsdk.bench.load_shift` with the same seeded arrivals and prompts. Prints one JSON
# document: each server's phases (SLO attainment over each phase's last half) and our autoscale decisions.
# Usage, from the project root after `make install`, with VLLM_VENV set (tools/peers/env.sh):
#   tools/peers/load_shift_vs_vllm.sh [TTFT_MS] [TPOT_MS] [PHASE...]
# Defaults: 1500 60 short:40:6:32:64 long:40:2.5:1024:8 short:40:6:32:64; LAYERS/HIDDEN as common.sh;
# ONLY="fixed autoscale vllm" picks the servers; LAYOUT=P:D another starting layout than 1:2.
set -u
TTFT=${1:-1500}; TPOT=${2:-60}; shift $(( $# > 2 ? 2 : $# ))
PHASES=("$@"); [ ${#PHASES[@]} -gt 0 ] || PHASES=(short:40:6:32:64 long:40:2.5:1024:8 short:40:6:32:64)
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m), wait_up
ARGS=(); for p in "${PHASES[@]}"; do ARGS+=(--phase "$p"); done
for mode in fixed autoscale; do
  $PY - "$W/m" "$W/$mode.yaml" "$mode" "$TTFT" "$TPOT" "${LAYOUT:-1:2}" <<'PY'
import sys, yaml
model, out, mode, ttft, tpot, layout = sys.argv[1:]
s = yaml.safe_load(open("specs/tiny_pd.yaml")); s["model"] = model
s["prefill"]["replicas"], s["decode"]["replicas"] = (int(n) for n in layout.split(":"))
s["hardware"]["cpu_memory_gb"] = 1.0
s.setdefault("serve", {})["port"] = 8393
s["serve"]["autoscale"] = {"enabled": mode == "autoscale", "ttft_ms": float(ttft), "tpot_ms": float(tpot),
                           "attainment": 0.9, "window_s": 8.0, "cooldown_s": 8.0}
yaml.safe_dump(s, open(out, "w"))
PY
done
run_ours() {  # run_ours MODE
  setsid $EXE launch "$W/$1.yaml" >"$W/$1.log" 2>&1 & OURS=$!
  if wait_up 8393 $OURS; then
    name=$(curl -s http://127.0.0.1:8393/v1/models | $PY -c "import sys,json; print(json.load(sys.stdin)['data'][0]['id'])")
    $PY -m disaggsdk.bench.load_shift http://127.0.0.1:8393 --model "$name" "${ARGS[@]}" --ttft-ms "$TTFT" \
      --tpot-ms "$TPOT" >"$W/$1.json" 2>"$W/$1.err"
  else
    tail -5 "$W/$1.log"; echo "disaggsdk did not come up"
  fi
  kill -TERM -$OURS 2>/dev/null; wait $OURS 2>/dev/null
}
run_vllm() {
  setsid "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len 2048 \
    --host 127.0.0.1 --port 8394 >"$W/vllm.log" 2>&1 & VL=$!
  if wait_up 8394 $VL; then
    $PY -m disaggsdk.bench.load_shift http://127.0.0.1:8394 --model "$W/m" "${ARGS[@]}" --ttft-ms "$TTFT" \
      --tpot-ms "$TPOT" >"$W/vllm.json" 2>"$W/vllm.err"
  else tail -5 "$W/vllm.log"; fi
  kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
}
for s in ${ONLY:-fixed autoscale vllm}; do
  if [ "$s" = vllm ]; then run_vllm; else run_ours "$s"; fi
done
$PY - "$W" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, os, sys
w, cpu = sys.argv[1], sys.argv[2]
doc = {"cpu": cpu, "servers": {}}
for name in ("fixed", "autoscale", "vllm"):
    path = os.path.join(w, f"{name}.json")
    if os.path.exists(path) and os.path.getsize(path):
        run = json.load(open(path))
        if name != "vllm":
            run["decisions"] = [l.strip() for l in open(os.path.join(w, f"{name}.log")) if "autoscale P" in l]
        doc["servers"][name] = run
fixed, auto = doc["servers"].get("fixed"), doc["servers"].get("autoscale")
if fixed and auto:  # greedy, same seeded prompts: a moved request's output equals the fixed layout's
    pairs = list(zip(fixed["outputs"], auto["outputs"]))
    doc["autoscale_outputs_equal_fixed"] = {"equal": sum(a == b for a, b in pairs), "of": len(pairs)}
for run in doc["servers"].values():
    run["outputs"] = len(run["outputs"])  # compared above; too long to print
print(json.dumps(doc, indent=1))
for name, run in doc["servers"].items():
    print(name, " ".join(f"{p['name']}: last half {p['attainment_last_half']:.0%} (ttft {p['mean_ttft_ms'] or 0:.0f} ms, "
                         f"tpot {p['mean_tpot_ms'] or 0:.0f} ms, max gap {p['max_itl_ms'] or 0:.0f} ms, "
                         f"failed {p['failed']})" for p in run["phases"]), file=sys.stderr)
if "autoscale_outputs_equal_fixed" in doc:
    print("autoscale outputs equal to the fixed layout's:", doc["autoscale_outputs_equal_fixed"], file=sys.stderr)
PY
