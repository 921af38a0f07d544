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

.PHONY: help install test lint format conformance conformance-frameworks fixtures fixtures-check bench bench-compare docs figures clean

help:
	@echo "make test         create/reuse .venv, install, run every test"
	@echo "make bench        benchmark on DEVICE=$(DEVICE) (BENCH=quick|full)"
	@echo "make conformance  run the golden fixtures against impl_numpy, impl_torch, impl_jax"
	@echo "make conformance-frameworks  the same suite against the frameworks' own kernels"
	@echo "                  (torch, jax; mlx and keras too with the frameworks extra)"
	@echo "make lint         ruff"
	@echo "make fixtures     regenerate conformance/fixtures/v1 (fixtures-check: prove no drift)"
	@echo "make docs         the side-by-side page, build/docs/index.html (and make figures)"
	@echo "make figures      remake the PNGs in docs/figures/"
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

# torch's and jax's kernels always; MLX's and keras's when the `frameworks` extra is installed
# (each keras backend is its own port: keras picks its backend once per process).
conformance-frameworks: $(ENV_READY)
	@impls="--impl torch_fused --impl jax_fused"; \
	if $(PY) -c "import mlx.core" 2>/dev/null; then impls="$$impls --impl mlx_fast"; \
	else echo "conformance-frameworks: skipping mlx_fast: mlx is not installed (pip install -e '.[frameworks]')"; fi; \
	if $(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('keras') is None)"; \
	then impls="$$impls --impl keras_ops --impl keras_ops_torch"; \
	else echo "conformance-frameworks: skipping keras_ops, keras_ops_torch: keras is not installed (pip install -e '.[frameworks]')"; fi; \
	echo "$(PY) -m conformance $$impls --show-xfails"; \
	$(PY) -m conformance $$impls --show-xfails

fixtures: $(ENV_READY)
	$(PY) -m conformance.generate --out conformance/fixtures/v1

fixtures-check: $(ENV_READY)
	$(PY) -m conformance.generate --check conformance/fixtures/v1

bench: $(ENV_READY)
	$(PY) -m bench --device $(DEVICE) --grid $(BENCH) $(BENCH_ARGS)

bench-compare: $(ENV_READY)
	$(PY) -m bench.compare $(A) $(B)

figures: $(ENV_READY)
	$(PY) -m docs.site.figures --out docs/figures

docs: figures
	$(PY) -m docs.site --out build/docs

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .benchmarks *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
