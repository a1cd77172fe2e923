# Sourced by the peer scripts (from the project root, after `make install`): the vLLM venv ($VPY:
# $VLLM_VENV's python, tools/peers/env.sh), our interpreter and CLI ($PY, $EXE), a work folder
# removed at exit ($W) holding make_model.py's tiny Qwen3 directory ($W/m), and wait_up. KEEP=DIR keeps the result JSONs and logs
# in DIR (per-request TTFTs and ITLs, to look into a figure).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # tools/peers: env.sh, make_model.py, vllm_cli.py
PY=${PY:-.venv/bin/python}; EXE=${EXE:-.venv/bin/disaggsdk}  # (another checkout's: PY=... EXE="$PY -m disaggsdk.cli.main")
VPY=$("$HERE/env.sh") || exit 2  # env.sh said what to set
W=$(mktemp -d); trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$W"/*.json "$W"/*.log "$KEEP"/ 2>/dev/null; rm -rf "$W"' EXIT
# LAYERS=N HIDDEN=H: a deeper or wider random model than make_model.py's 4 x 256 (a prefill-heavy load);
# MAX_POSITION=TOKENS a longer context than its 2,048
$PY "$HERE/make_model.py" "$W/m" --layers "${LAYERS:-4}" --hidden "${HIDDEN:-256}" \
  --max-position "${MAX_POSITION:-2048}" >/dev/null 2>&1 \
  || { echo "model build failed"; exit 1; }
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2

# wait_up PORT PID: wait (up to 240 s) until the server on PORT answers /health with 200 (it can
# serve: ours answers 503 while no decode unit is routable, vLLM's while its engine is down), then (up to 900 s)
# until none of our units still compiles its step in the background (our /health lists them under
# "compile"; vLLM compiles before it answers), so that what is measured next is the compiled step;
# fail at once when process PID (the server) is gone.
wait_up() {
  local up=""
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && { up=1; break; }
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  [ -n "$up" ] || return 1
  for _ in $(seq 1 900); do
    curl -sf "http://127.0.0.1:$1/health" | $PY -c 'import json, sys; text = sys.stdin.read()
sys.exit(1 if text.startswith("{") and "compiling" in json.loads(text).get("compile", {}).values() else 0)' && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
