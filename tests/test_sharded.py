"""Sharded attention (ring and head-parallel) in all three frameworks, held to the goldens.

The fixtures are the conformance suite's (``conformance/cases/ring.py``, and the ``sdpa`` and
``module`` fixtures wherever the shards fit), and every verdict is the conformance runner's own
``check`` of a sharded run (``ring``, ``ring_zigzag``, ``head_parallel``, ``head_parallel_gqa``
with n shards; tests/sharded_runs.py):

- NumPy, the specification, runs every sharded run with the runner's default shard counts in
  ``conformance/tests/test_conformance.py``, and here with 1, 3 and 8 shards;
- JAX runs in one subprocess on 8 simulated CPU devices (XLA_FLAGS set before JAX starts), a
  chosen list on meshes of 2, 3, 4 and 8 of them; torch in one subprocess that forks 2, then 4,
  gloo processes, each running every sharded run of that many shards. Both hand back the
  runner's outcomes (tests/sharded_worker.py). Each subprocess runs once per session, however
  many pytest-xdist workers there are (a file lock in the session's shared temporary folder).

Also: the errors (identical in all three), the ring's schedule (which blocks each device
computes at each step, the drawing of docs/SHARDED.md), the bytes sent per step against the
formula, JAX's per-device memory and gradients through the ring. The broken sharded ports are
caught by the runner in conformance/tests/test_broken_ports.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

import impl_jax.sharded
import impl_numpy.sharded
import impl_torch.sharded
from attention_spec import SHARDED_ERROR_CODES, AttentionError, ConfigError
from attention_spec.sharded import (
    RingStep,
    block_visible,
    ring_bytes_per_step,
    ring_memory_per_device,
    shard_chunks,
)
from conformance.oracle import assert_within, attention_vjp
from conformance.runner import SHARDED_ALIASES, Run, run_suite
from tests.frameworks import FRAMEWORKS, same_error
from tests.sharded_runs import (
    JAX_DEVICES,
    JAX_GRAD_RUNS,
    MEMORY_PROBE,
    TORCH_WORLDS,
    call,
    jax_runs,
    run_inputs,
    runs_by_id,
    torch_runs,
)
from tests.sharded_worker import grad_output

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# Session-wide results, computed once whatever the number of xdist workers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, worker_id) -> Path:
    """A folder all xdist workers of this session share (each session has its own)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def _once(path: Path, produce) -> Path:
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            produce(path)
    return path


#: The JAX subprocess: 8 host devices; XLA's cheapest code generation (the programs are tiny,
#: and compiling them is what takes the time, about halved by these); and JAX's persistent
#: compilation cache in .pytest_cache, keyed by the program, so that a second run of the
#: tests compiles nothing that has not changed (about 26 s of CPU down to 9 s here).
JAX_ENV = {
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={JAX_DEVICES} "
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
    "JAX_COMPILATION_CACHE_DIR": str(ROOT / ".pytest_cache" / "jax-compilation-cache"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def _run_worker(which: str, out: Path, env: dict[str, str]) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sharded_worker", which, str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    (out / f"{which}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{which} worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


class WorkerResults:
    """What a worker handed back: a JSON record per run (the runner's outcome, measurements),
    and arrays (gradients)."""

    def __init__(self, folder: Path, name: str) -> None:
        with np.load(folder / f"{name}.npz") as data:
            self.arrays = {k: data[k] for k in data.files}
        self.meta = json.loads((folder / f"{name}.json").read_text())

    def outcome(self, run_id: str) -> dict:
        record = self.meta["runs"].get(run_id)
        assert record is not None, f"{run_id}: not run"
        assert "error" not in record, f"{run_id} raised {record['error']}"
        return record["outcome"]


def _jax_worker(shared_dir: Path, which: str) -> WorkerResults:
    folder = shared_dir / f"sharded_{which}"

    def produce(done: Path) -> None:
        folder.mkdir(exist_ok=True)
        _run_worker(which, folder, JAX_ENV)
        done.touch()

    _once(shared_dir / f"sharded_{which}.done", produce)
    return WorkerResults(folder, which)


@pytest.fixture(scope="session")
def jax_results(shared_dir) -> WorkerResults:
    return _jax_worker(shared_dir, "jax")


@pytest.fixture(scope="session")
def jax_grads(shared_dir) -> WorkerResults:
    return _jax_worker(shared_dir, "jax_grads")


@pytest.fixture(scope="session")
def torch_results(shared_dir) -> dict[tuple[int, int], WorkerResults]:
    folder = shared_dir / "sharded_torch"

    def produce(done: Path) -> None:
        folder.mkdir(exist_ok=True)
        _run_worker("torch", folder, {})
        done.touch()

    _once(shared_dir / "sharded_torch.done", produce)
    return {
        (w, r): WorkerResults(folder, f"torch_w{w}_r{r}") for w in TORCH_WORLDS for r in range(w)
    }


def _assert_passed(outcome: dict) -> None:
    assert outcome["status"] == "pass", f"{outcome['run_id']}: {outcome['message']}"


# ---------------------------------------------------------------------------------------------
# 1. Every run against the goldens: NumPy here, JAX and torch from their subprocesses
# ---------------------------------------------------------------------------------------------


def test_numpy_with_1_3_and_8_shards() -> None:
    """The runner's default shard counts (2 and 4) run in test_conformance; the others here,
    in one suite (the whole of it takes NumPy about a second)."""
    report = run_suite("impl_numpy", functions=SHARDED_ALIASES, shards=(1, 3, 8))
    assert report.ok, "\n".join(o.line() for o in report.failures)
    counts = {n: sum(f".n{n}." in o.run_id for o in report.outcomes) for n in (1, 3, 8)}
    assert counts[1] > 100 and counts[3] >= 4 and counts[8] >= 10, counts


JAX_RUNS = jax_runs()


@pytest.mark.parametrize("run", JAX_RUNS, ids=lambda r: r.id)
def test_jax(run: Run, jax_results: WorkerResults) -> None:
    _assert_passed(jax_results.outcome(run.id))


TORCH_RUNS = [(world, run) for world in TORCH_WORLDS for run in torch_runs(world)]


@pytest.mark.parametrize("world", TORCH_WORLDS)
def test_torch(world: int, torch_results) -> None:
    """Every sharded run of ``world`` shards, on every rank of a gloo group of ``world``
    processes (each returns the whole output, each is checked)."""
    failures = []
    for run in torch_runs(world):
        for rank in range(world):
            outcome = torch_results[world, rank].outcome(run.id)
            if outcome["status"] != "pass":
                failures.append(f"rank {rank}: {outcome['run_id']}: {outcome['message']}")
    assert not failures, "\n".join(failures[:20])
    assert len(torch_runs(world)) >= 40


def test_jax_covers_2_3_4_and_8_devices_both_layouts_head_parallel_and_the_module() -> None:
    covered = {(run.function, run.shards) for run in JAX_RUNS}
    for n in (2, 4, 8):
        assert {("ring", n), ("ring_zigzag", n)} & covered, n
    assert {("ring", 2), ("ring_zigzag", 2), ("ring", 4), ("ring_zigzag", 4)} <= covered
    assert {("head_parallel", 2), ("head_parallel", 3), ("head_parallel_gqa", 2)} <= covered


def test_every_ring_fixture_runs_with_the_shard_counts_it_was_written_for() -> None:
    """NumPy runs each ``ring.*`` fixture with every n it lists (2 and 4 in test_conformance,
    the rest here), torch with 2 and 4 processes wherever it fits."""
    torch_ids = {run.id for _, run in TORCH_RUNS}
    fixtures = {run.case.id: run.case for run in runs_by_id().values() if run.case.op == "ring"}
    assert len(fixtures) >= 15
    for case in fixtures.values():
        if case.kind == "error":
            continue
        for n in case.entry["shards"]:
            assert f"ring.n{n}{case.id[4:]}" in runs_by_id(), (case.id, n)
        assert any(f".n{w}{case.id[4:]}" in i for w in TORCH_WORLDS for i in torch_ids), case.id


# ---------------------------------------------------------------------------------------------
# 2. Gradients through the ring (JAX) equal the unsharded gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("run", "wrt"),
    [(runs_by_id()[run_id], wrt) for run_id, wrt in JAX_GRAD_RUNS if run_id.endswith("float64")],
    ids=lambda x: getattr(x, "id", ""),
)
def test_jax_gradients_through_the_ring(run, wrt, jax_grads: WorkerResults) -> None:
    """jax.grad through shard_map, ppermute and the causal cond equals jax.grad of
    impl_jax.scaled_dot_product_attention (float64, the float64 bound of the tolerance rule);
    rows that see no key get exactly zero gradient, never NaN."""
    assert "error" not in jax_grads.meta["runs"][run.id], jax_grads.meta["runs"][run.id]
    arrays, _ = run_inputs(run)
    for name in wrt:
        got = jax_grads.arrays[f"grad.ring.{name}.{run.id}"]
        want = jax_grads.arrays[f"grad.sdpa.{name}.{run.id}"]
        assert got.shape == arrays[name].shape and np.isfinite(got).all()
        assert_within(got, want, "float64", what=f"d{name}: ")
    dq = jax_grads.arrays[f"grad.ring.query.{run.id}"]  # rows 0 .. 7, 30, 50 see no key
    assert (dq[..., [0, 1, 2, 3, 4, 5, 6, 7, 30, 50], :] == 0.0).all()
    assert (dq != 0.0).any()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("run", "wrt"),
    [(runs_by_id()[run_id], wrt) for run_id, wrt in JAX_GRAD_RUNS if run_id.endswith("float32")],
    ids=lambda x: getattr(x, "id", ""),
)
def test_jax_float32_gradients_through_the_ring_jitted(run, wrt, jax_grads: WorkerResults) -> None:
    """A float32 training step through the ring, jitted (as the worker runs it), gets the
    float64 oracle's gradients within the float32 bound (the plain float32 backward's error).
    The ring block clamps ``s - max`` at 0 with the gradient passed through, where a
    ``jnp.where`` clamp loses the gradient of every score XLA rounds above 0 (the row max's own
    key: dK), as it did in the functional path. Measured: with that ``jnp.where`` put back, this
    test still passes with this jax/XLA on CPU (tried causal and not, softcap, 1 to 4 shards,
    both layouts): XLA does not recompute the ring block's scores inside its readers here, so
    no score rounds above 0. It holds the float32 ring gradient, and the clamp wherever a
    compiler does. The jitted unsharded path is held to the same bound."""
    assert "error" not in jax_grads.meta["runs"][run.id], jax_grads.meta["runs"][run.id]
    arrays, keywords = run_inputs(run)
    f64 = {n: a.astype(np.float64) for n, a in arrays.items() if n in ("query", "key", "value")}
    do = grad_output((*f64["query"].shape[:-1], f64["value"].shape[-1]))
    do = do.astype(np.float32).astype(np.float64)  # the cotangent the worker used
    golden = attention_vjp(f64["query"], f64["key"], f64["value"], do, **keywords)
    plain = attention_vjp(f64["query"], f64["key"], f64["value"], do, **keywords,
                          round_to="float32")
    for name in wrt:
        want = getattr(golden, name)
        for path in ("ring", "sdpa"):
            got = jax_grads.arrays[f"grad.{path}.{name}.{run.id}"]
            assert got.dtype == np.float32 and got.shape == want.shape, (path, name)
            assert_within(got, want, "float32", getattr(plain, name), what=f"{path} d{name}: ")


# ---------------------------------------------------------------------------------------------
# 3. The schedule: which blocks each device computes at each step
# ---------------------------------------------------------------------------------------------


def ring_schedule(n: int, layout: str, L: int, S: int, **keywords) -> list[RingStep]:
    """The NumPy ring's record of a causal call with n shards (zeros as data: only the
    schedule matters)."""
    stats: list[RingStep] = []
    q, k, v = np.zeros((1, 1, L, 2)), np.zeros((1, 1, S, 2)), np.zeros((1, 1, S, 3))
    impl_numpy.sharded.ring_attention(q, k, v, n_shards=n, layout=layout, stats=stats, **keywords)
    return stats


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize(("L", "S", "alignment"), [(64, 64, "top_left"), (64, 96, "bottom_right"),
                                                   (96, 64, "top_left")])
def test_every_visible_block_is_computed_once_and_no_other(layout, L, S, alignment) -> None:
    """At step t device r holds shard (r - t) mod n; over the n steps it meets every key chunk
    once, and computes exactly the (query chunk, key chunk) blocks the causal rule does not
    empty."""
    n = 4
    stats = ring_schedule(n, layout, L, S, is_causal=True, causal_alignment=alignment)
    chunks = shard_chunks(n, layout)
    c = len(chunks[0])
    Lc, Sc = L // (c * n), S // (c * n)
    offset = 0 if alignment == "top_left" else S - L
    assert [(s.t, s.r, s.src) for s in stats] == [
        (t, r, (r - t) % n) for t in range(n) for r in range(n)
    ]
    for r in range(n):
        seen = [b for s in stats if s.r == r for b in s.blocks]
        want = [(a, b) for a in chunks[r] for b in range(c * n)
                if block_visible(a, b, Lc, Sc, offset)]
        assert sorted(seen) == sorted(want) and len(seen) == len(set(seen))


def test_zigzag_balances_causal_work_and_contiguous_does_not() -> None:
    """L = S, causal, 4 shards. Contiguous: device r computes one block at steps 0 .. r and
    none after, so every step waits for device 3. Zigzag: at every step every device computes
    the same number of (quarter-size) blocks: 3 at step 0 (two half-masked diagonal ones),
    2 at every later step."""
    count = {}
    for layout in ("contiguous", "zigzag"):
        stats = ring_schedule(4, layout, 64, 64, is_causal=True)
        count[layout] = [[len(s.blocks) for s in stats if s.r == r] for r in range(4)]
    assert count["contiguous"] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert count["zigzag"] == [[3, 2, 2, 2]] * 4


def schedule_drawing(n: int, layout: str) -> str:
    """The docs/SHARDED.md drawing of the causal (L = S) schedule: each (query chunk, key
    chunk) block marked with the step that computes it, '.' where causal skips it."""
    stats = ring_schedule(n, layout, 4 * n, 4 * n, is_causal=True)
    chunks = shard_chunks(n, layout)
    n_chunks = n * len(chunks[0])
    owner = {a: r for r, shard in enumerate(chunks) for a in shard}
    step = {block: s.t for s in stats for block in s.blocks}
    lines = ["key chunk ->  " + " ".join(f"{b:>2}" for b in range(n_chunks))]
    for a in range(n_chunks):
        cells = " ".join(f"{step.get((a, b), '.'):>2}" for b in range(n_chunks))
        lines.append(f"query {a:>2}     {cells}    device {owner[a]}")
    work = [[len(s.blocks) for s in stats if s.r == r] for r in range(n)]
    lines.append("")
    lines.append("blocks computed, device by device, step by step:")
    for r in range(n):
        steps = " ".join(str(x) for x in work[r])
        lines.append(f"device {r}: {steps}  (total {sum(work[r])})")
    return "\n".join(lines)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_docs_draw_the_schedule_the_code_runs(layout) -> None:
    text = (ROOT / "docs" / "SHARDED.md").read_text()
    assert schedule_drawing(4, layout) in text, schedule_drawing(4, layout)


# ---------------------------------------------------------------------------------------------
# 4. Communication and memory, measured, against the formulas of docs/SHARDED.md
# ---------------------------------------------------------------------------------------------


def _formula_bytes(run: Run) -> list[int]:
    arrays, _ = run_inputs(run)
    k, v = arrays["key"], arrays["value"]
    return ring_bytes_per_step(k.shape, v.shape, run.shards, k.dtype.itemsize)


def run_numpy(run: Run, **extra) -> np.ndarray:
    arrays, keywords = run_inputs(run)
    return call(impl_numpy.sharded, run, arrays, keywords, **extra)


RING_FIXTURE_RUNS = [
    r for r in runs_by_id().values() if r.function.startswith("ring") and r.case.op == "ring"
    and r.shards
]


@pytest.mark.parametrize("run", RING_FIXTURE_RUNS[::7], ids=lambda r: r.id)
def test_numpy_bytes_sent_per_step_match_the_formula(run: Run) -> None:
    stats: list[RingStep] = []
    run_numpy(run, stats=stats)
    formula = _formula_bytes(run)
    for r in range(run.shards):
        assert [s.bytes_sent for s in stats if s.r == r] == formula


def test_torch_bytes_sent_and_blocks_match_the_formula_and_the_specification(
    torch_results,
) -> None:
    """What each rank handed to batch_isend_irecv at each step is the formula's count, and the
    blocks it computed are the NumPy simulation's for that device."""
    checked = 0
    for world, run in TORCH_RUNS:
        if not run.function.startswith("ring") or run.case.op != "ring" or not run.shards:
            continue
        stats: list[RingStep] = []
        run_numpy(run, stats=stats)
        for rank in range(world):
            record = torch_results[world, rank].meta["runs"][run.id]
            assert record["bytes_sent"] == _formula_bytes(run), run.id
            blocks = [[list(b) for b in s.blocks] for s in stats if s.r == rank]
            assert record["blocks"] == blocks, (run.id, rank)
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize("run", [r for r in JAX_RUNS if r.function.startswith("ring")],
                         ids=lambda r: r.id)
def test_jax_collective_permutes_move_the_formula_bytes(run, jax_results) -> None:
    """The program's collective-permutes: one for the key shard, one for the value shard,
    together the formula's bytes per step (in a loop of n - 1 steps; the last step sends
    nothing). JAX asks for exactly that; XLA's CPU backend sends it too, except bfloat16, which
    it widens to float32 before the transfer (it computes bfloat16 in float32): twice the bytes
    on CPU, measured here so that the number is known."""
    record = jax_results.meta["runs"][run.id]
    arrays, _ = run_inputs(run)
    per_step = _formula_bytes(run)[0]
    k_bytes = arrays["key"].nbytes // run.shards
    formula = sorted([k_bytes, per_step - k_bytes])
    assert sorted(record["permute_bytes_lowered"]) == formula
    widened = 2 if run.case.dtype == "bfloat16" else 1
    assert sorted(record["permute_bytes_compiled"]) == [widened * b for b in formula]


@pytest.mark.parametrize("run", [r for r in JAX_RUNS if r.function == "ring"], ids=lambda r: r.id)
def test_jax_device_holds_one_query_shard_and_one_key_value_shard(run, jax_results) -> None:
    """Per device (XLA's memory analysis of the compiled SPMD program): the arguments are
    exactly its query shard, its key/value shard and its rows of mask and bias; the scratch
    XLA allocates stays below one whole (..., H, L, S) score matrix."""
    record = jax_results.meta["runs"][run.id]["memory"]
    arrays, _ = run_inputs(run)
    n = run.shards
    shards = sum(a.nbytes // (n if a.ndim >= 2 and a.shape[-2] != 1 else 1)
                 for name, a in arrays.items()
                 if name in ("query", "key", "value", "mask", "bias"))
    assert record["argument"] == shards
    q, k = arrays["query"], arrays["key"]
    scores = math.prod(np.broadcast_shapes(q.shape[:-3], k.shape[:-3])) * q.shape[-3]
    scores *= q.shape[-2] * k.shape[-2] * (8 if q.dtype == np.float64 else 4)
    assert record["temp"] < scores


def test_jax_memory_per_device_is_the_formula(jax_results) -> None:
    """XLA's memory analysis of the compiled ring, per device (contiguous, causal, float32,
    L = S = 1024, 4 and 8 devices): the arguments are exactly one query shard and one key/value
    shard, the output one output shard, and the scratch is the formula's extra (the arriving
    key/value shard, the accumulators, one block's scores and exponentials) plus at most one
    block's key and value rows, the garbage rule's zeroed copy (XLA fuses part of it away;
    measured: 57% of it with 4 devices, 58% with 8)."""
    p = MEMORY_PROBE
    shapes = ((p["B"], p["H"], p["L"], p["D"]), (p["B"], p["K"], p["L"], p["D"]),
              (p["B"], p["K"], p["L"], p["E"]))
    for n in p["shards"]:
        measured = jax_results.meta["memory_probe"][str(n)]
        formula = ring_memory_per_device(*shapes, n, "contiguous", 4, 4)
        assert measured["argument"] == formula["query_shard"] + formula["kv_shard"]
        assert measured["output"] == formula["output_shard"]
        most = formula["extra"] + formula["kv_block_zeroed"]
        assert formula["extra"] <= measured["temp"] <= most, (n, measured, formula)


# ---------------------------------------------------------------------------------------------
# 5. Errors: the same class, code and message in all three
# ---------------------------------------------------------------------------------------------


def _qkv(H=4, K=2, L=8, S=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((1, H, L, 5)).astype(dtype),
            rng.standard_normal((1, K, S, 5)).astype(dtype),
            rng.standard_normal((1, K, S, 3)).astype(dtype))


ERROR_CASES = {
    "zero_shards": ("ring", _qkv(), {"n_shards": 0}, "non_positive_size", "got 0"),
    "float_shards": ("head", _qkv(), {"n_shards": 2.0}, "non_positive_size", "got 2.0"),
    "unknown_layout": ("ring", _qkv(), {"n_shards": 2, "layout": "striped"}, "unknown_layout",
                       "('contiguous', 'zigzag'); got 'striped'"),
    "length": ("ring", _qkv(L=6, S=6), {"n_shards": 4}, "length_not_divisible",
               "4 contiguous shards, so 4 must divide both; got L=6, S=6"),
    "length_zigzag": ("ring", _qkv(L=8, S=12), {"n_shards": 4, "layout": "zigzag"},
                      "length_not_divisible", "2 * 4 = 8 chunks (layout='zigzag')"),
    "kv_heads": ("head", _qkv(H=6, K=2), {"n_shards": 4}, "kv_heads_not_divisible",
                 "so 4 must divide K; got K=2 (H=6)"),
    "contract_first": ("ring", _qkv(L=6), {"n_shards": 4, "causal_alignment": "lower"},
                       "unknown_alignment", "got 'lower'"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_sharded_errors_are_identical_in_all_three(name: str) -> None:
    """Validation happens before any device or process is asked for, so it runs here: no
    process group, one JAX device."""
    which, (q, k, v), kw, code, fragment = ERROR_CASES[name]

    def call(fw):
        module = fw.module.sharded
        fn = module.ring_attention if which == "ring" else module.head_parallel_attention
        return fn(*(fw.asarray(x) for x in (q, k, v)), **kw)

    same_error(call, code=code, fragment=fragment)


def test_every_sharded_code_is_raised_somewhere() -> None:
    from tests.test_ulysses import ERROR_CASES as ULYSSES_ERROR_CASES  # and usp_shape there

    ulysses = {c[2] for c in ULYSSES_ERROR_CASES.values()} | {"usp_shape"}
    assert {c[3] for c in ERROR_CASES.values()} | {"shard_devices"} | ulysses >= SHARDED_ERROR_CODES


def test_too_few_devices_or_processes_is_a_config_error() -> None:
    """JAX: more shards than devices (this process has one); torch: no process group."""
    import jax

    q, k, v = _qkv(L=16, S=16)
    n = len(jax.devices()) * 2
    with pytest.raises(ConfigError, match="XLA_FLAGS=--xla_force_host_platform") as info:
        impl_jax.sharded.ring_attention(q, k, v, n_shards=n)
    assert info.value.code == "shard_devices"
    torch_q, torch_k, torch_v = (FRAMEWORKS["torch"].asarray(x) for x in (q, k, v))
    with pytest.raises(ConfigError, match="init_process_group") as info:
        impl_torch.sharded.head_parallel_attention(torch_q, torch_k, torch_v, n_shards=2)
    assert info.value.code == "shard_devices"


def test_module_head_parallel_validates_like_the_module() -> None:
    module = impl_numpy.GroupedQueryAttention(12, 6, 2, dtype=np.float32)
    x = np.zeros((2, 5, 12), np.float32)
    with pytest.raises(AttentionError) as info:
        impl_numpy.sharded.head_parallel_gqa(module, x, n_shards=4)
    assert info.value.code == "kv_heads_not_divisible"
    with pytest.raises(AttentionError) as info:
        impl_numpy.sharded.head_parallel_gqa(module, x[..., :11], n_shards=2)
    assert info.value.code == "model_width_mismatch"
