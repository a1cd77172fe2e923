#!/usr/bin/env bash
# The one-GPU check of the CUDA path (docs/gpu.md), in under 8 minutes:
#   1. every `gpu`-marked test (pytest -m gpu), each test's outcome recorded;
#   2. a disaggregated deployment of the tiny model, a prefill and a decode unit on GPU 0
#      (specs/tiny_pd_cuda.yaml: launch.cuda_devices [0, 0]), its greedy tokens for a few prompts
#      compared with the CPU engine's in float32: in float32, every token equal; then the same in
#      bfloat16 (FlashInfer's dtype), each prompt's first token equal;
#   3. ONE JSON document on stdout (tools/gpu_check.py summary); progress goes to stderr, each
#      step's output to files under the log directory the JSON names.
#
# Usage: tools/gpu_check.sh            (from anywhere; uses the repository's .venv)
# Environment:
#   GPU_CHECK_PYTHON   the Python to use (default: REPO/.venv/bin/python, else python3)
#   GPU_CHECK_SPEC     the deployment's spec, from the repository root (default: specs/tiny_pd_cuda.yaml)
#   GPU_CHECK_LOG_DIR  where the logs go (default: a new /tmp/gpu_check.XXXXXX)
#   GPU_CHECK_NO_INSTALL=1  install nothing (default: cuda-python and flashinfer-python if missing)
# Exit: 0 everything passed; 1 something failed (the JSON says what); 2 no CUDA GPU here;
# 130 / 143 interrupted (SIGINT / SIGTERM), once what it started has stopped.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
START_S=$SECONDS
# the whole check's budget: each step gets what is left of it, at most its own limit
BUDGET_S=450

if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
  PY=$GPU_CHECK_PYTHON
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY=$ROOT/.venv/bin/python
else
  PY=$(command -v python3)
fi
SPEC=${GPU_CHECK_SPEC:-specs/tiny_pd_cuda.yaml}

say() { echo "gpu_check: $*" >&2; }

# Without a GPU: one JSON, exit 2, before anything slow. No nvidia-smi and no /dev/nvidia0 is no GPU;
# otherwise nvidia-smi must list one.
has_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
  else
    [[ -e /dev/nvidia0 ]]
  fi
}
if ! has_gpu; then
  printf '{"ok": false, "reason": "no CUDA GPU", "gpu_name": null, "elapsed_s": %d}\n' $((SECONDS - START_S))
  exit 2
fi

LOG_DIR=${GPU_CHECK_LOG_DIR:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$LOG_DIR"
say "logs in $LOG_DIR"

# Every step runs in a session of its own, so cleanup can stop it with all it started (pytest's
# spawned ranks, the launch and its units): SIGTERM first (the launch cleans shared memory up on
# it), SIGKILL for what is still there after a grace period.
STEP_PIDS=()
cleanup() {
  local pid
  for pid in "${STEP_PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null
  done
  for _ in $(seq 30); do
    local alive=0
    for pid in "${STEP_PIDS[@]}"; do
      kill -0 -- "-$pid" 2>/dev/null && alive=1
    done
    [[ $alive == 0 ]] && return
    sleep 1
  done
  for pid in "${STEP_PIDS[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null
  done
}
# stopped from outside: what was started goes first, then the one JSON says so
interrupted() {
  cleanup
  printf '{"ok": false, "reason": "interrupted by %s", "log_dir": "%s", "elapsed_s": %d}\n' \
    "$1" "$LOG_DIR" $((SECONDS - START_S))
  exit "$2"
}
trap cleanup EXIT
trap 'interrupted SIGINT 130' INT
trap 'interrupted SIGTERM 143' TERM

# run_step LIMIT_S OUT_FILE COMMAND...: COMMAND with stdout to OUT_FILE (stderr beside it, .err),
# stopped after LIMIT_S or what is left of the budget; returns its exit status (124: timed out).
run_step() {
  local limit_s=$1 out=$2
  shift 2
  local left_s=$((BUDGET_S - (SECONDS - START_S)))
  ((left_s < limit_s)) && limit_s=$left_s
  ((limit_s < 10)) && limit_s=10
  # `wait` (not a foreground child) keeps the traps live while the step runs
  setsid timeout --kill-after=30 "$limit_s" "$@" >"$out" 2>"${out%.*}.err" &
  local pid=$!
  STEP_PIDS+=("$pid")
  wait "$pid"
}

# what CUDA tests take, and the tokens comparable: float32 matmuls in IEEE float32, not TF32
export NVIDIA_TF32_OVERRIDE=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# install what is missing and cheap: the gpu extra (cuda-python) and flashinfer-python from PyPI
has_module() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
INSTALL_NOTES=()
install_if_missing() {
  local module=$1 requirement=$2
  has_module "$module" && return
  if [[ "${GPU_CHECK_NO_INSTALL:-0}" == 1 ]]; then
    INSTALL_NOTES+=("$requirement: missing")
    return
  fi
  say "installing $requirement"
  if run_step 120 "$LOG_DIR/install_$module.log" "$PY" -m pip install --retries 1 --timeout 20 "$requirement"; then
    INSTALL_NOTES+=("$requirement: installed")
  else
    INSTALL_NOTES+=("$requirement: install failed (see install_$module.log)")
  fi
}
install_if_missing cuda "cuda-python>=12.3"
install_if_missing flashinfer flashinfer-python

say "machine and versions"
run_step 120 "$LOG_DIR/environment.json" "$PY" tools/gpu_check.py environment

TORCH_SEES_CUDA=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1])).get('torch_sees_cuda'))" \
  "$LOG_DIR/environment.json" 2>/dev/null)
if [[ "$TORCH_SEES_CUDA" != True ]]; then
  # a CPU build of torch (make install's constraints-cpu.txt) or a driver it cannot use: nothing below can run
  printf '{"ok": false, "error": "torch does not see a CUDA GPU: install a CUDA build of torch (docs/gpu.md)"}\n' \
    >"$LOG_DIR/gpu_tests.json"
  printf '{"ok": false, "error": "not run: torch does not see a CUDA GPU"}\n' >"$LOG_DIR/deployment.json"
  printf '{"ok": false, "dtype": "bfloat16", "error": "not run: torch does not see a CUDA GPU"}\n' \
    >"$LOG_DIR/deployment_bfloat16.json"
else
  mapfile -t GPU_TEST_FILES < <(grep -rl "mark.gpu" tests --include='*.py' | sort)
  say "${#GPU_TEST_FILES[@]} files of gpu tests"
  # -v: a line per test as it ends, what the summary reads if the run is stopped before its report
  PER_TEST_LIMIT=()
  has_module pytest_timeout && PER_TEST_LIMIT=(--timeout=150)
  run_step 240 "$LOG_DIR/pytest.log" "$PY" -m pytest -m gpu -p no:cacheprovider -v -rA "${PER_TEST_LIMIT[@]}" \
    --junitxml="$LOG_DIR/gpu_tests.xml" "${GPU_TEST_FILES[@]}"
  say "pytest exited $? (pytest.log)"
  run_step 60 "$LOG_DIR/gpu_tests.json" "$PY" tools/gpu_check.py gpu-tests "$LOG_DIR/gpu_tests.xml" \
    --log "$LOG_DIR/pytest.log"

  # float32 (the spec's): every token must equal the CPU engine's
  say "disaggregated deployment of $SPEC"
  run_step 150 "$LOG_DIR/deployment.json" "$PY" tools/gpu_check.py deploy "$SPEC" \
    --log-dir "$LOG_DIR/deployment" --timeout-s 120
  say "deployment exited $?"
  # bfloat16, the dtype FlashInfer's kernels take (their prefill has no float32 path): each prompt's
  # first token must equal float32's; later ones may part at a near tie
  say "the same deployment in bfloat16"
  run_step 150 "$LOG_DIR/deployment_bfloat16.json" "$PY" tools/gpu_check.py deploy "$SPEC" \
    --dtype bfloat16 --compare first-token --log-dir "$LOG_DIR/deployment_bfloat16" --timeout-s 120
  say "bfloat16 deployment exited $?"
fi

ENV_NOTES=$(printf '%s\n' "${INSTALL_NOTES[@]+"${INSTALL_NOTES[@]}"}")
"$PY" tools/gpu_check.py summary "$LOG_DIR/environment.json" "$LOG_DIR/gpu_tests.json" \
  "$LOG_DIR/deployment.json" "$LOG_DIR/deployment_bfloat16.json" --elapsed-s $((SECONDS - START_S)) --log-dir "$LOG_DIR" --notes "$ENV_NOTES"
