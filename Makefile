# Rosetta Attention. The two commands a new user needs: `make test` and `make bench`.
# Both create (once) and reuse a local virtual environment in .venv.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv

# Which framework builds go into the venv: cpu, or cuda when nvidia-smi is found.
# Override on the command line, e.g. `make test ACCEL=cpu` or `make test TORCH_SPEC='torch==2.6.0'`.
ACCEL ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
ifeq ($(ACCEL),cuda)
TORCH_SPEC ?= torch>=2.4
JAX_SPEC ?= jax[cuda12]>=0.4.35
else
# The CPU wheel; an unpinned `torch` from PyPI is a multi-gigabyte CUDA build.
TORCH_SPEC ?= torch==2.13.0
JAX_SPEC ?= jax>=0.4.35
endif

# The interpreter. By default the venv's, created on demand. On a machine that already has the
# frameworks (a lent GPU box without network): `make bench PY=python3` installs nothing.
PY ?= $(VENV)/bin/python
ENV_READY := $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed,)

# Benchmark knobs: DEVICE=auto|cpu|cuda|tpu, BENCH=quick|full.
DEVICE ?= auto
BENCH ?= quick
# Test parallelism (pytest-xdist workers).
WORKERS ?= 2

.PHONY: help install test lint format conformance conformance-frameworks conformance-kernels fixtures fixtures-check bench bench-compare clean

help:
	@echo "make test         create/reuse .venv, install, run every test"
	@echo "make bench        benchmark on DEVICE=$(DEVICE) (BENCH=quick|full)"
	@echo "make conformance  run the golden fixtures against impl_numpy, impl_torch, impl_jax"
	@echo "make conformance-frameworks  the same suite against torch's and jax's own kernels"
	@echo "make conformance-kernels  every fixture against the Triton and Pallas kernel ports"
	@echo "                 (interpreted on CPU: slow, several minutes; DEVICE=cuda on a GPU)"
	@echo "make lint         ruff"
	@echo "make fixtures     regenerate conformance/fixtures/v1 (fixtures-check: prove no drift)"
	@echo "make install      only build the environment;  make clean: remove it and caches"
	@echo "ACCEL=$(ACCEL) TORCH_SPEC='$(TORCH_SPEC)' JAX_SPEC='$(JAX_SPEC)' PY=$(PY)"

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" "$(JAX_SPEC)"
	$(VENV)/bin/python -m pip install --quiet -e ".[all]"
	touch $@

install: $(ENV_READY)

test: $(ENV_READY)
	$(PY) -m pytest -n $(WORKERS) -q

lint: $(ENV_READY)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(ENV_READY)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

conformance: $(ENV_READY)
	$(PY) -m conformance --impl impl_numpy --impl impl_torch --impl impl_jax

conformance-frameworks: $(ENV_READY)
	$(PY) -m conformance --impl torch_fused --impl jax_fused --show-xfails

# The Triton and Pallas kernel ports: interpreted on the CPU (TRITON_INTERPRET, interpret=True),
# compiled with DEVICE=cuda. Several minutes on the CPU; make test runs a fixed subset.
conformance-kernels: $(ENV_READY)
	$(PY) -m conformance --impl conformance.ports.triton_flash --impl conformance.ports.pallas_flash \
		--device $(if $(filter auto,$(DEVICE)),cpu,$(DEVICE))

fixtures: $(ENV_READY)
	$(PY) -m conformance.generate --out conformance/fixtures/v1

fixtures-check: $(ENV_READY)
	$(PY) -m conformance.generate --check conformance/fixtures/v1

bench: $(ENV_READY)
	$(PY) -m bench --device $(DEVICE) --grid $(BENCH) $(BENCH_ARGS)

bench-compare: $(ENV_READY)
	$(PY) -m bench.compare $(A) $(B)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .benchmarks *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
