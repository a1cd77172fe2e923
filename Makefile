# Two doors for a newcomer: `make demo` and `make test`. Each installs what is missing first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3

.PHONY: demo check test test-all install sysdeps clean

# libfabric comes from Debian; the native transfer library is built against it.
sysdeps:
	@if ! dpkg -s libfabric-dev >/dev/null 2>&1; then \
	  echo "installing libfabric-dev (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libfabric-dev libfabric-bin; \
	fi
	@# chromium: the quickstart notebook's test opens its HTML export in a headless browser
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing chromium (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; \
	fi
	@# shellcheck: tests/tools/test_gpu_check.py lints tools/gpu_check.sh with it
	@if ! command -v shellcheck >/dev/null 2>&1; then \
	  echo "installing shellcheck (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq shellcheck; \
	fi
	@# iproute2: the testbed (tests/testbed) builds nodes with ip and tc; nsenter/unshare are util-linux
	@if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then \
	  echo "installing iproute2 (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq iproute2; \
	fi
	@# nftables, iptables: on a kernel without sch_netem the testbed's link faults drop packets with nft,
	@# and delay them (jitter) through iptables' NFQUEUE (testbed/packet_delay.py)
	@if ! command -v nft >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then \
	  echo "installing nftables and iptables (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nftables iptables; \
	fi

$(STAMP): pyproject.toml constraints-cpu.txt setup.py $(wildcard native/*.c native/*.h native/*.py native/cpu_attention/* native/cpu_linear/*)
	$(MAKE) sysdeps
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[engine,transfer,notebook,serve,ray,trace,dev]'
	touch $(STAMP)

install: $(STAMP)

# Launch the tiny CPU deployment (1 prefill + 2 decode processes), show what the trained tiny
# model writes, load it with the live view, print the benchmark summary, shut everything down.
demo: install
	$(VENV)/bin/disaggsdk plan specs/tiny_local.yaml
	$(VENV)/bin/disaggsdk launch specs/tiny_local.yaml --port 0 --bench \
	  --complete 'def fib(n):' --complete 'class Stack:' \
	  --num-prompts 24 --qps 6 --input-len 256 --output-len 32

# The default suite (about 15 minutes on 2 cores) leaves out the tests marked slow: each is a
# bigger case of something the default run covers. test-all runs everything. Both check first:
# ruff (config in pyproject.toml) and mypy (strict on testbed, spec, plan, messenger, report, launch, serve).
check: install
	$(VENV)/bin/ruff check disaggsdk tests tools
	$(VENV)/bin/mypy

# --durations: the slowest tests, printed at the end, so the suite's time stays in view
test: check
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

test-all: check
	$(PY) -m pytest -q -p no:cacheprovider -m 'slow or not slow'

clean:
	rm -rf $(VENV) build *.egg-info disaggsdk/transfer/_fabric*.so disaggsdk/engine/attention/_cpu_kernels*.so
