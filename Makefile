# `make test`, `make soak` and `make demo` set everything up from nothing: apt packages,
# the virtual environment in .venv, then run.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := iproute2 nftables
PYTEST_ARGS ?=
# workers for the parallel part of `make test` (the tests mostly wait on sockets and sleeps)
JOBS ?= 4

.PHONY: test soak demo bench mpi apt venv clean bytecode

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "note: not root, cannot install$$missing (the testbed needs root anyway)"; fi; \
	fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch: exactly the CPU build (an unpinned torch pulls a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,demo,metrics,plot,torchft]'
	touch $(STAMP)

venv: $(STAMP)

# `make test`: every test but the long runs (marked soak, tests/conftest.py's SOAK); `make soak`:
# those. Each in two parts: the tests in parallel (pytest-xdist), then those marked serial alone
# (timing-judged: stalls, detection, rates; or loading every core). Exit status 5 (no test selected)
# is not a failure. Together they run every test once (CI: .ci/run runs both).
# --maxschedchunk 1: workers get tests two at a time; by default each got a quarter of its share
# up front, one after the other in collection order, so the first worker got every long test
# (tests/conftest.py puts them first) and ran them alone for the last three minutes.
# Bytecode first: the tests start hundreds of processes that import linkescape, and where
# PYTHONDONTWRITEBYTECODE is set none of them would leave its compiled modules for the next.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q src tools >/dev/null

define run_tests
	@rc=0; \
	$(BIN)/python -m pytest -n $(JOBS) --maxschedchunk 1 -m "not serial and $(1)" $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	$(BIN)/python -m pytest -m "serial and $(1)" $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	exit $$rc
endef

test: apt $(STAMP) bytecode
	$(call run_tests,not soak)

soak: apt $(STAMP) bytecode mpi
	$(call run_tests,soak)

demo: apt $(STAMP) bytecode
	$(BIN)/linkescape demo

bench: $(STAMP)
	$(BIN)/linkescape bench all --world-size 2 --backend linkescape,gloo

# `make mpi`: Open MPI for `linkescape bench --backend linkescape,gloo,mpi` (Debian's openmpi-bin,
# and mpi4py from PyPI in .venv: its wheel loads that libmpi)
mpi: $(STAMP)
	@$(MAKE) --no-print-directory apt APT_PACKAGES="openmpi-bin"
	$(BIN)/pip install -q -e '.[mpi]'

clean:
	rm -rf $(VENV) build *.egg-info
