# Rosetta Attention. The two commands a new user needs: `make test` and `make bench`.
# Both create (once) and reuse a local virtual environment in .venv.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv

# Which framework builds go into the venv: cpu, or cuda when nvidia-smi is found.
# Override on the command line, e.g. `make test ACCEL=cpu` or `make test TORCH_SPEC='torch==2.6.0'`.
ACCEL ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
ifeq ($(ACCEL),cuda)
# The newest CUDA the driver runs (nvidia-smi's "CUDA Version") picks JAX's plugin: jax[cuda12]
# for a CUDA 12 driver, jax[cuda13] otherwise (current JAX ships its CUDA 13 plugin there).
CUDA_MAJOR ?= $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\).*/\1/p' | head -n 1)
JAX_CUDA ?= $(if $(filter 12,$(CUDA_MAJOR)),cuda12,cuda13)
TORCH_SPEC ?= torch>=2.4
JAX_SPEC ?= jax[$(JAX_CUDA)]>=0.4.35
# A GPU box usually has its CUDA frameworks installed system-wide: let the venv see them.
VENV_ARGS ?= --system-site-packages
else
# The CPU wheel; an unpinned `torch` from PyPI is a multi-gigabyte CUDA build.
TORCH_SPEC ?= torch==2.13.0
JAX_SPEC ?= jax>=0.4.35
VENV_ARGS ?=
endif

# The interpreter. By default the venv's, created on demand. On a machine that already has the
# frameworks (a lent GPU box without network): `make bench PY=python3` installs nothing.
PY ?= $(VENV)/bin/python
ENV_READY := $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed,)

# Device knob: DEVICE=auto|cpu|cuda|tpu. The benchmark's auto is the best device found; the
# conformance targets' auto is cpu (DEVICE=cuda runs the fixtures on the GPU). BENCH=quick|full.
DEVICE ?= auto
BENCH ?= quick
CONFORMANCE_DEVICE = $(if $(filter auto,$(DEVICE)),cpu,$(DEVICE))
# Test parallelism (pytest-xdist workers).
WORKERS ?= 2
# JAX's persistent compilation cache for the tests: about 800 fixture runs each compile one XLA
# program (0.3-2 s of CPU apiece, most of a cold run's time); a warm run loads them instead. The
# key is the program, the JAX version and the flags, so a changed function compiles afresh.
JAX_CACHE ?= .cache/jax
JAX_CACHE_ENV = JAX_COMPILATION_CACHE_DIR=$(abspath $(JAX_CACHE)) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# `make gpu-check` installs nothing: the box's own python3 unless PY= names another.
GPU_PY ?= $(if $(filter $(VENV)/bin/python,$(PY)),python3,$(PY))

.PHONY: help install test test-slow lint format conformance conformance-frameworks conformance-kernels fixtures fixtures-check bench bench-compare gpu-check docs figures clean

help:
	@echo "make test         create/reuse .venv, install, run the tests (all but the slowest)"
	@echo "make test-slow    the slowest tests (fuzzers, whole-suite runs, end-to-end benches)"
	@echo "make bench        benchmark on DEVICE=$(DEVICE) (BENCH=quick|full)"
	@echo "make gpu-check    on a GPU box, with python3, installing nothing: every check, one summary"
	@echo "make conformance  run the golden fixtures against impl_numpy, impl_torch, impl_jax (DEVICE=$(CONFORMANCE_DEVICE))"
	@echo "make conformance-frameworks  the same suite against the frameworks' own kernels"
	@echo "                  (torch SDPA and FlexAttention eager and compiled, jax, flax; onnx, onnxruntime, tinygrad and hf with their extras; mlx and keras with the frameworks extra)"
	@echo "make conformance-kernels  every fixture against the Triton and Pallas kernel ports"
	@echo "                 (interpreted on CPU: slow, several minutes; DEVICE=cuda on a GPU)"
	@echo "make lint         ruff"
	@echo "make fixtures     regenerate conformance/fixtures/v1 (fixtures-check: prove no drift)"
	@echo "make docs         the side-by-side page, build/docs/index.html (and make figures)"
	@echo "make figures      remake the PNGs in docs/figures/"
	@echo "make install      only build the environment;  make clean: remove it and caches"
	@echo "ACCEL=$(ACCEL) TORCH_SPEC='$(TORCH_SPEC)' JAX_SPEC='$(JAX_SPEC)' PY=$(PY)"

# Building the venv needs the package index. Offline (a lent GPU box), or when pip fails, say
# how to use the machine's own frameworks instead of retrying for minutes.
NO_VENV_HINT = echo "make: could not build $(VENV) ($(1)). On a machine whose python3 already has torch, jax, flax and pytest-benchmark, install nothing: make $(or $(MAKECMDGOALS),test) PY=python3" >&2; exit 1
PIP = $(VENV)/bin/python -m pip --disable-pip-version-check

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV_ARGS) $(VENV) || { $(call NO_VENV_HINT,$(PYTHON) -m venv failed); }
	@$(PIP) index versions pip --retries 0 --timeout 5 >/dev/null 2>&1 || { $(call NO_VENV_HINT,the package index cannot be reached: offline?); }
	$(PIP) install --quiet --upgrade pip || { $(call NO_VENV_HINT,pip failed); }
	$(PIP) install --quiet "$(TORCH_SPEC)" "$(JAX_SPEC)" || { $(call NO_VENV_HINT,pip failed); }
	$(PIP) install --quiet -e ".[all]" || { $(call NO_VENV_HINT,pip failed); }
	touch $@

install: $(ENV_READY)

# The suite without its slowest tests (marked `slow`: the fuzzers, whole-suite runs of the
# frameworks' kernels, end-to-end benches, a whole fixture generation); `make test-slow` runs
# those, and .ci/run runs both, so every check still runs on each submission.
test: $(ENV_READY)
	$(JAX_CACHE_ENV) $(PY) -m pytest -n $(WORKERS) -q -m "not slow"

test-slow: $(ENV_READY)
	$(JAX_CACHE_ENV) $(PY) -m pytest -n $(WORKERS) -q -m slow

# Layout is by hand, not by a formatter: the three scripts keep their argument lists filled and
# their continuation lines aligned so that the same step reads line for line in each, which no
# formatter writes (ruff's format put 904 statements under `# fmt: skip` and would have added
# ~5,000 lines). ruff check holds what a formatter would: line length, whitespace, imports.
lint: $(ENV_READY)
	$(PY) -m ruff check .
	@if git grep -n "fmt: skip\|fmt: off" -- '*.py' '*.md'; then echo "lint: formatter markers above (layout is by hand)"; exit 1; fi

format: $(ENV_READY)
	$(PY) -m ruff check --fix .

conformance: $(ENV_READY)
	$(PY) -m conformance --impl impl_numpy --impl impl_torch --impl impl_jax --device $(CONFORMANCE_DEVICE)

# torch's and jax's kernels always; MLX's and keras's when the `frameworks` extra is installed
# (each keras backend is its own port: keras picks its backend once per process).
conformance-frameworks: $(ENV_READY)
	@impls="--impl torch_fused --impl jax_fused --impl flax_nnx --impl torch_flex --impl torch_flex_compiled"; \
	if $(PY) -c "import onnx" 2>/dev/null; then impls="$$impls --impl onnx_ref"; \
	else echo "conformance-frameworks: skipping onnx_ref: onnx is not installed (pip install -e '.[onnx]')"; fi; \
	if $(PY) -c "import transformers" 2>/dev/null; then impls="$$impls --impl hf_eager --impl hf_sdpa --impl hf_gpt_oss_eager --impl hf_flex"; \
	else echo "conformance-frameworks: skipping hf_eager, hf_sdpa, hf_gpt_oss_eager, hf_flex: transformers is not installed (pip install -e '.[hf]')"; fi; \
	ort="--impl onnxruntime_attention_23 --impl onnxruntime_attention_24 --impl onnxruntime_attention --impl onnxruntime_gqa"; \
	if $(PY) -c "import onnxruntime, onnx" 2>/dev/null; then impls="$$impls $$ort"; \
	else echo "conformance-frameworks: skipping onnxruntime_*: onnxruntime is not installed (pip install -e '.[onnxruntime]')"; fi; \
	if $(PY) -c "import tinygrad" 2>/dev/null; then impls="$$impls --impl tinygrad_sdpa"; \
	else echo "conformance-frameworks: skipping tinygrad_sdpa: tinygrad is not installed (pip install -e '.[tinygrad]')"; fi; \
	if $(PY) -c "import mlx.core" 2>/dev/null; then impls="$$impls --impl mlx_fast"; \
	else echo "conformance-frameworks: skipping mlx_fast: mlx is not installed (pip install -e '.[frameworks]')"; fi; \
	if $(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('keras') is None)"; \
	then impls="$$impls --impl keras_ops --impl keras_ops_torch"; \
	else echo "conformance-frameworks: skipping keras_ops, keras_ops_torch: keras is not installed (pip install -e '.[frameworks]')"; fi; \
	echo "$(PY) -m conformance $$impls --show-xfails --device $(CONFORMANCE_DEVICE)"; \
	$(PY) -m conformance $$impls --show-xfails --device $(CONFORMANCE_DEVICE)

# The Triton and Pallas kernel ports: interpreted on the CPU (TRITON_INTERPRET, interpret=True),
# compiled with DEVICE=cuda. Several minutes on the CPU; make test runs a fixed subset.
conformance-kernels: $(ENV_READY)
	$(PY) -m conformance --impl conformance.ports.triton_flash --impl conformance.ports.pallas_flash \
		--device $(CONFORMANCE_DEVICE)

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

# No $(ENV_READY): installs nothing. docs/BENCH.md says how to read results/gpu-check-*/summary.md.
gpu-check:
	$(GPU_PY) -m bench.gpu_check --device $(if $(filter auto,$(DEVICE)),cuda,$(DEVICE)) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .hypothesis .benchmarks *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
