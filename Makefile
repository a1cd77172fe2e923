# Two doors for a newcomer: `make demo` and `make test`. Each installs what is missing first, and
# only what it needs: the demo the extras that serve (engine, transfer, serve) and libfabric; the
# tests every extra, the development tools and the system packages the suite drives.
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
PYTHON ?= python3
SOURCES := pyproject.toml constraints-cpu.txt setup.py $(wildcard native/*.c native/*.h native/*.py native/cpu_attention/* native/cpu_linear/*)

.PHONY: demo check test test-all test-latest test-oldest install install-demo sysdeps sysdeps-test clean

# apt-get install PACKAGES where COMMAND (or the package itself) is missing; sudo unless root
define apt_install
	@if ! ( $(1) ) >/dev/null 2>&1; then \
	  echo "installing $(2) (Debian)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(2); \
	fi
endef

# libfabric comes from Debian; the native transfer library is built against it (the demo's only system package).
sysdeps:
	$(call apt_install,dpkg -s libfabric-dev,libfabric-dev libfabric-bin)

# what the test suite drives besides: chromium (the quickstart notebook's HTML export in a headless
# browser), shellcheck (tools/gpu_check.sh is linted), iproute2 (the testbed's nodes: ip, tc),
# nftables and iptables (link faults and the packet delayer on a kernel without sch_netem),
# redis-server (the shared store of the KV tiers, started by launch/kv_store_server.py)
sysdeps-test: sysdeps
	$(call apt_install,command -v chromium,chromium)
	$(call apt_install,command -v redis-server || command -v valkey-server,redis-server)
	$(call apt_install,command -v shellcheck,shellcheck)
	$(call apt_install,command -v ip && command -v tc,iproute2)
	$(call apt_install,command -v nft && command -v iptables,nftables iptables)

# constrained to the CPU build of torch the suite is run against (constraints-cpu.txt): without it
# pip would fetch the newest CUDA build, several GB (docs/install.md)
# torch alone first, from the CPU wheel index where it answers (else a local wheel or PyPI): resolved
# with every extra at once, pip took PyPI's CUDA build of the same version (a 7 GB venv) over the
# CPU one; installed, it is kept
TORCH_CPU := --extra-index-url https://download.pytorch.org/whl/cpu --timeout 10 --retries 0
$(DEMO_STAMP): $(SOURCES)
	$(MAKE) sysdeps
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(PY) -m pip install -q -c constraints-cpu.txt $(TORCH_CPU) torch
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[engine,transfer,serve]'
	touch $(DEMO_STAMP)

$(TEST_STAMP): $(SOURCES)
	$(MAKE) sysdeps-test
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(PY) -m pip install -q -c constraints-cpu.txt $(TORCH_CPU) torch
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[engine,transfer,notebook,serve,ray,trace,gpu,kernels,dev]'
	touch $(TEST_STAMP) $(DEMO_STAMP)

install-demo: $(DEMO_STAMP)
install: $(TEST_STAMP)

# Launch the tiny CPU deployment (1 prefill + 2 decode processes), show what the trained tiny
# model writes, load it with the live view, print the benchmark summary, shut everything down.
demo: install-demo
	$(VENV)/bin/disaggsdk plan specs/tiny_local.yaml
	$(VENV)/bin/disaggsdk launch specs/tiny_local.yaml --port 0 --bench \
	  --complete 'def fib(n):' --complete 'class Stack:' \
	  --num-prompts 24 --request-rate 6 --input-len 256 --output-len 32

# The default suite (about 15 minutes on 2 cores) leaves out the tests marked slow: each is a
# bigger case of something the default run covers. test-all runs everything. Both check first:
# ruff (config in pyproject.toml) and mypy (strict on testbed, spec, plan, records, messenger, report, launch, serve).
check: install
	$(VENV)/bin/ruff check disaggsdk tests tools
	$(VENV)/bin/mypy

# --durations: the slowest tests, printed at the end, so the suite's time stays in view
test: check
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

test-all: check
	$(PY) -m pytest -q -p no:cacheprovider -m 'slow or not slow'

# Against other dependency versions (every bound in pyproject.toml is one a run used): a fresh venv
# with no constraint file, at the newest versions pip picks (test-latest) or at every lower bound
# (test-oldest), runs the tests marked deps_smoke. Downloads torch (a CUDA build from PyPI where the
# CPU index is unreachable: several GB) into build/venv-latest or build/venv-oldest.
test-latest:
	$(PYTHON) -m tools.deps_check latest

test-oldest:
	$(PYTHON) -m tools.deps_check oldest

clean:
	rm -rf $(VENV) build *.egg-info disaggsdk/transfer/_fabric*.so disaggsdk/engine/attention/_cpu_kernels*.so
