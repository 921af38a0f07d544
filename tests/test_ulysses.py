"""Ulysses (all-to-all sequence parallelism) in all three frameworks (contract v3).

NumPy, the specification, runs here; JAX (8 simulated CPU devices) and torch (2 and 4 forked
gloo processes) run in subprocesses (tests/ulysses_worker.py), marked ``slow`` (about 35 s and
10 s on one core). Checked: where every head lands (head-encoding values, for H/K = 12/4, 12/12,
8/2 and 8/1 at n = 2, 4, 8), equality with the unsharded contract on random inputs with every
keyword, the bytes each device sends against the formula, the errors (identical in all three),
and JAX's gradients against the unsharded ones.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import impl_jax.ulysses  # noqa: F401  (fw.module.ulysses)
import impl_numpy
import impl_numpy.ulysses
import impl_torch.ulysses  # noqa: F401
from attention_spec import AttentionError, check_attention
from attention_spec.sharded import (
    RingStep,
    check_ulysses,
    check_usp,
    ring_bytes_per_step,
    ulysses_bytes_per_exchange,
    usp_bytes_per_device,
)
from conformance.oracle import assert_within
from tests.frameworks import same_error
from tests.ulysses_calls import (
    HEAD_PAIRS,
    SHARD_COUNTS,
    USP_CALLS,
    USP_CONFIGS,
    encoding_call,
    expected_encoding,
    fits,
    random_calls,
    usp_fits,
)
from tests.ulysses_worker import TORCH_WORLDS

ROOT = Path(__file__).resolve().parent.parent
ENCODINGS = [(H, K, n) for H, K in HEAD_PAIRS for n in SHARD_COUNTS]
RANDOM = [(name, n) for name, (_, _, shards) in random_calls().items() for n in shards]


def _plan(H: int, K: int, n: int):
    q, k, v = np.zeros((1, H, 8, 2)), np.zeros((1, K, 8, 2)), np.zeros((1, K, 8, 2))
    return check_ulysses(check_attention(q, k, v), n)


def test_the_gqa_rule_for_8_2_at_4_devices() -> None:
    """The drawing of docs/SHARDED.md: query heads 0-1, 2-3 read kv head 0, 4-5, 6-7 kv head 1;
    each kv head goes to the 2 devices of its group."""
    plan = _plan(8, 2, 4)
    assert plan.heads == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert plan.kv_heads == ((0, 1), (0, 1), (1, 2), (1, 2))
    assert _plan(12, 4, 2).kv_heads == ((0, 2), (2, 4))  # split: K % n == 0
    assert _plan(8, 1, 8).kv_heads == ((0, 1),) * 8  # MQA: every device holds the one head


@pytest.mark.parametrize(("H", "K", "n"), ENCODINGS, ids=[f"{h}_{k}.n{n}" for h, k, n in ENCODINGS])
def test_numpy_every_head_lands_where_the_contract_says(H: int, K: int, n: int) -> None:
    """Each row attends only its own position (window (0, 0)), so the output is the value row
    it read: its batch, position and key/value head must be the contract's. Where n does not
    fit, the contract's error."""
    (q, k, v), kw = encoding_call(H, K)
    if not fits(H, K, n):
        with pytest.raises(AttentionError) as info:
            impl_numpy.ulysses.ulysses_attention(q, k, v, n_shards=n, **kw)
        assert info.value.code == ("ulysses_heads" if H % n else "ulysses_kv_heads")
        return
    out = impl_numpy.ulysses.ulysses_attention(q, k, v, n_shards=n, **kw)
    np.testing.assert_array_equal(out, expected_encoding(H, K))
    plan = _plan(H, K, n)
    for r in range(n):  # the query heads of device r all read the kv heads it was given
        lo, hi = plan.heads[r]
        assert {h // (H // K) for h in range(lo, hi)} <= set(range(*plan.kv_heads[r]))


@pytest.mark.parametrize(("name", "n"), RANDOM, ids=[f"{a}.n{n}" for a, n in RANDOM])
def test_numpy_equals_the_unsharded_contract(name: str, n: int) -> None:
    (q, k, v), kw, _ = random_calls()[name]
    got = impl_numpy.ulysses.ulysses_attention(q, k, v, n_shards=n, **kw)
    want = impl_numpy.scaled_dot_product_attention(q, k, v, **kw)
    assert_within(got, want, "float64")
    if "mask" in kw and kw["mask"].shape[1] == 8:  # the fully masked row stays zero
        assert not got[:, 3, 5].any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("H", "K", "n"), [(8, 2, 2), (8, 2, 4), (8, 1, 8), (12, 12, 4)])
def test_numpy_bytes_sent_per_exchange_are_the_formula(H, K, n, dtype) -> None:
    """Every device sends (n - 1)/n of its query and output shards and of its key and value
    shards (split), or one key/value head's positions to each other device (replicated)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, H, 16, 5)).astype(dtype)
    k = rng.standard_normal((2, K, 8, 5)).astype(dtype)
    v = rng.standard_normal((2, K, 8, 3)).astype(dtype)
    stats = []
    impl_numpy.ulysses.ulysses_attention(q, k, v, n_shards=n, stats=stats)
    formula = ulysses_bytes_per_exchange(q.shape, k.shape, v.shape, (2, H, 16, 3), n,
                                         q.dtype.itemsize)
    assert len(stats) == 4 * n
    for s in stats:
        assert s.bytes_sent == formula[s.exchange], s


ERROR_CASES = {
    "heads": ((6, 2, 8, 8), 4, "ulysses_heads", "so 4 must divide H; got H=6"),
    "length_l": ((8, 2, 6, 8), 4, "ulysses_length", "so 4 must divide L and S; got L=6, S=8"),
    "length_s": ((8, 2, 8, 6), 4, "ulysses_length", "got L=8, S=6"),
    "kv_heads": ((12, 6, 8, 8), 4, "ulysses_kv_heads", "neither holds (H=12)"),
    "zero_shards": ((8, 2, 8, 8), 0, "non_positive_size", "got 0"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_ulysses_errors_are_identical_in_all_three(name: str) -> None:
    """Validation runs before any device or process group is asked for."""
    (H, K, L, S), n, code, fragment = ERROR_CASES[name]
    q, k, v = np.zeros((1, H, L, 4)), np.zeros((1, K, S, 4)), np.zeros((1, K, S, 3))

    def call(fw):
        return fw.module.ulysses.ulysses_attention(*(fw.asarray(x) for x in (q, k, v)),
                                                   n_shards=n)

    same_error(call, code=code, fragment=fragment)


@pytest.mark.parametrize(
    ("H", "K", "L", "u", "r", "layout", "fragment"),
    [
        (6, 2, 16, 4, 2, "contiguous", "H=6 is not divisible by ulysses_shards=4"),
        (12, 6, 16, 4, 2, "contiguous", "neither K % u nor u % K is 0"),
        (8, 2, 12, 2, 4, "contiguous", "8 does not divide L=12"),
        (8, 2, 12, 2, 2, "zigzag", "8 does not divide L=12"),  # fits u r = 4, not 2 u r
    ],
)
def test_usp_shape(H, K, L, u, r, layout, fragment) -> None:
    q, k, v = np.zeros((1, H, L, 2)), np.zeros((1, K, L, 2)), np.zeros((1, K, L, 2))
    dims = check_attention(q, k, v)
    with pytest.raises(AttentionError, match=fragment) as info:
        check_usp(dims, u, r, layout)
    assert info.value.code == "usp_shape"
    check_usp(dims, 2, 1, "contiguous")  # 2 divides H and K and L


# ---------------------------------------------------------------------------------------------
# USP: Ulysses inside each of r ring groups (NumPy, the specification)
# ---------------------------------------------------------------------------------------------

USP = [(name, cfg) for name in USP_CALLS for cfg in USP_CONFIGS]


@pytest.mark.parametrize(
    ("name", "config"), USP, ids=[f"{a}.u{u}_r{r}.{ly}" for a, (u, r, ly) in USP]
)
def test_numpy_usp_equals_the_unsharded_contract(name: str, config) -> None:
    u, r, layout = config
    (q, k, v), kw, _ = random_calls()[name]
    if not usp_fits(q.shape[-3], k.shape[-3], u):
        pytest.skip("the heads do not fit u")
    stats = []
    got = impl_numpy.ulysses.usp_attention(q, k, v, ulysses_shards=u, ring_shards=r,
                                           layout=layout, stats=stats, **kw)
    want = impl_numpy.scaled_dot_product_attention(q, k, v, **kw)
    assert_within(got, want, "float64")
    out_shape = (*q.shape[:-1], v.shape[-1])
    formula = usp_bytes_per_device(q.shape, k.shape, v.shape, out_shape, u, r, 8)
    ring = [s for s in stats if isinstance(s, RingStep)]
    exchanges = [s for s in stats if not isinstance(s, RingStep)]
    assert len(exchanges) == 4 * u * r and len(ring) == r * u * r  # r steps on every device
    for s in exchanges:
        assert s.bytes_sent == formula[s.exchange], s
    for g in range(u * r):  # the ring runs across the groups: member j's ring is j, u + j, ..
        steps = sorted((s for s in ring if s.r == g), key=lambda s: s.t)
        assert sum(s.bytes_sent for s in steps) == formula["ring"]
        assert {s.src % u for s in steps} == {g % u}
        assert {s.src // u for s in steps} == set(range(r))


def test_usp_with_u_1_is_the_ring_and_with_r_1_is_ulysses() -> None:
    (q, k, v), kw, _ = random_calls()["sinks_alibi"]
    want = impl_numpy.scaled_dot_product_attention(q, k, v, **kw)
    for u, r in ((1, 4), (4, 1), (8, 1)):
        got = impl_numpy.ulysses.usp_attention(q, k, v, ulysses_shards=u, ring_shards=r, **kw)
        assert_within(got, want, "float64", what=f"u={u} r={r}: ")


def _drawn_rows(section: str) -> dict[str, list[str]]:
    """The drawings of docs/SEMANTICS.md's Ulysses section: label -> the digits after it."""
    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    text = text.split("## Ulysses and USP sequence parallelism")[1].split("### Contract v3")[0]
    rows = {}
    for line in text.split(section)[1].split("```")[1].splitlines():
        label, _, digits = line.partition("  ")
        cells = list(itertools.takewhile(str.isdigit, digits.split()))  # up to a comment
        if cells and not label.startswith(" "):
            rows[label.strip()] = cells
    return rows


def test_the_semantics_drawings_are_what_the_plans_do() -> None:
    """Ulysses at n = 2 (H = 4, K = 2, L = 4) and USP at u = 2, r = 2, zigzag (L = 8): each cell
    of docs/SEMANTICS.md's drawings is the device the plan puts that head and position on."""
    plan = _plan(4, 2, 2)
    drawn = _drawn_rows("Drawn at n = 2")
    for h in range(4):
        before, after = drawn[f"query head {h}"][:4], drawn[f"query head {h}"][4:]
        assert before == [str(p // (4 // plan.n)) for p in range(4)], h  # L = 4
        owner = next(d for d, (lo, hi) in enumerate(plan.heads) if lo <= h < hi)
        assert after == [str(owner)] * 4, h
    for kh in range(2):
        owners = [d for d, (lo, hi) in enumerate(plan.kv_heads) if lo <= kh < hi]
        assert drawn[f"key/value head {kh}"][4:] == [str(owners[0])] * 4 and len(owners) == 1
    assert _plan(4, 1, 2).kv_heads == ((0, 1), (0, 1))  # the K = 1 sentence: both devices

    q = np.zeros((1, 4, 8, 2))
    usp = check_usp(check_attention(q, q[:, :2], q[:, :2]), 2, 2, "zigzag")
    rows = impl_numpy.ulysses._shard_order(usp.ring, usp.ring.Lc)
    held = {
        int(p): g for g in range(4) for p in rows[g * usp.ulysses.Lc : (g + 1) * usp.ulysses.Lc]
    }
    drawn = _drawn_rows("USP at n = 4")
    assert drawn["S1, every head"] == [str(held[p]) for p in range(8)]
    for j, label in enumerate(("after S2, query heads 0-1", "after S2, query heads 2-3")):
        assert usp.ulysses.heads[j] == (2 * j, 2 * j + 2)
        group = [held[p] // usp.u for p in range(8)]  # the ring group holding position p
        assert drawn[label] == [str(usp.rank(i, j)) for i in group], label


def test_the_sharded_md_bytes_table_is_the_formulas() -> None:
    """docs/SHARDED.md's table (MiB per device over one call, B = 1, H = 32, L = S = 32768,
    D = E = 128, bfloat16): ring, Ulysses and USP at u = 2 and 4, from the three formulas."""
    text = (ROOT / "docs" / "SHARDED.md").read_text()
    table = text.split("| K | n | ring | Ulysses |")[1].split("\n\n")[0]
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) == 6
    B, H, L, D, item, MiB = 1, 32, 32768, 128, 2, 2**20
    for K, n, ring, uly, *usp in rows:
        K, n = int(K), int(n)
        q, k = (B, H, L, D), (B, K, L, D)
        assert float(ring) == sum(ring_bytes_per_step(k, k, n, item)) / MiB
        assert float(uly) == sum(ulysses_bytes_per_exchange(q, k, k, q, n, item).values()) / MiB
        for u, cell in zip((2, 4), usp):
            want = sum(usp_bytes_per_device(q, k, k, q, u, n // u, item).values()) / MiB
            assert cell == ("-" if u >= n else f"{want:g}"), (K, n, u)


USP_ERRORS = {
    "no_sizes": ({}, "non_positive_size", "usp_attention needs both group sizes"),
    "no_ring_shards": ({"ulysses_shards": 2}, "non_positive_size", "ring_shards is None"),
    "no_ulysses_shards": ({"ring_shards": 2}, "non_positive_size", "ulysses_shards is None"),
    "zero": ({"ulysses_shards": 0, "ring_shards": 2}, "non_positive_size", "got 0"),
    "layout": ({"ulysses_shards": 2, "ring_shards": 2, "layout": "striped"}, "unknown_layout",
               "striped"),
    "heads": ({"ulysses_shards": 3, "ring_shards": 2}, "usp_shape",
              "H=8 is not divisible by ulysses_shards=3"),
    "length": ({"ulysses_shards": 2, "ring_shards": 4, "layout": "zigzag"}, "usp_shape",
               "16 does not divide L=16 and S=24"),
}


@pytest.mark.parametrize("name", list(USP_ERRORS))
def test_usp_errors_are_identical_in_all_three(name: str) -> None:
    """A hybrid without its group sizes is an error (never a run without context parallelism:
    Megatron-Bridge PR 2665); validation runs before any device or process group is asked for."""
    sizes, code, fragment = USP_ERRORS[name]
    (q, k, v), _, _ = random_calls()["causal_top_left"]

    def call(fw):
        return fw.module.ulysses.usp_attention(*(fw.asarray(x) for x in (q, k, v)), **sizes)

    same_error(call, code=code, fragment=fragment)


# ---------------------------------------------------------------------------------------------
# JAX and torch on several devices (subprocesses)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker_out(tmp_path_factory):
    """Run a worker once per module: ``get(which)`` -> its folder."""
    done: dict[str, Path] = {}

    def get(which: str) -> Path:
        if which not in done:
            out = tmp_path_factory.mktemp(f"ulysses_{which}")
            env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS":
                   "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                   "--xla_llvm_disable_expensive_passes=true"}
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
            proc = subprocess.run(
                [sys.executable, "-m", "tests.ulysses_worker", which, str(out)],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            done[which] = out
        return done[which]

    return get


def _expected(name: str) -> np.ndarray:
    kind, what, _ = name.split(".")
    if kind == "usp":
        (q, k, v), kw, _ = random_calls()[what]
        return impl_numpy.scaled_dot_product_attention(q, k, v, **kw)
    if kind == "encoding":
        return expected_encoding(*map(int, what.split("_")))
    (q, k, v), kw, _ = random_calls()[what]
    return impl_numpy.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.slow
def test_jax_every_head_lands_and_equals_the_unsharded_contract(worker_out) -> None:
    with np.load(worker_out("jax") / "jax.npz") as data:
        got = {name: data[name] for name in data.files}
    names = [n for n in got if not n.startswith("grad.")]
    assert {f"encoding.{h}_{k}.n{n}" for h, k, n in ENCODINGS if fits(h, k, n)} <= set(names)
    assert sum(n.startswith("usp.") for n in names) >= 20  # every USP config on 4 and 8 devices
    for name in names:
        assert_within(got[name], _expected(name), "float64", what=f"{name}: ")
    for n in (2, 8):  # gradients through both all-to-alls, split and replicated kv heads
        for x in "qkv":
            assert_within(got[f"grad.n{n}.{x}"], got[f"grad.ref.{x}"], "float64",
                          what=f"n={n} d{x}: ")
    for x in "qkv":  # USP (u = 4, r = 2): through the all-to-alls and the ring
        assert_within(got[f"grad.usp.{x}"], got[f"grad.ref.{x}"], "float64", what=f"usp d{x}: ")


@pytest.mark.slow
@pytest.mark.parametrize("world", TORCH_WORLDS)
def test_torch_every_rank_gets_the_contract_and_sends_the_formula(world, worker_out) -> None:
    folder = worker_out("torch")
    for rank in range(world):
        with np.load(folder / f"torch_{world}_{rank}.npz") as data:
            got = {name: data[name] for name in data.files}
        names = [n for n in got if not n.endswith(".bytes") and not n.startswith("grad.")]
        assert any(n.startswith("encoding.8_1") for n in names)
        grads = [n for n in got if n.startswith("grad.") and not n.endswith(".ref")]
        assert len(grads) == 13  # q, k, v of 3 calls; sinks, slopes; 2 biases
        for name in grads:  # through both all-to-alls, split (n = 2) and replicated (4) kv heads
            assert_within(got[name], got[f"{name}.ref"], "float64", what=f"rank {rank}: {name}: ")
        assert any(n.startswith("usp.") for n in names) == (world == 4)
        for name in names:
            assert_within(got[name], _expected(name), "float64", what=f"rank {rank}: {name}: ")
        (q, k, v), _, _ = random_calls()["causal_top_left"]
        out_shape = (*q.shape[:-1], v.shape[-1])
        formula = ulysses_bytes_per_exchange(q.shape, k.shape, v.shape, out_shape, world, 8)
        sent = got[f"random.causal_top_left.n{world}.bytes"]
        assert list(sent) == [formula[x] for x in ("query", "key", "value", "output")]
        if world == 4:  # USP u = r = 2: the group's all-to-alls, then r ring steps
            usp = usp_bytes_per_device(q.shape, k.shape, v.shape, out_shape, 2, 2, 8)
            sent = list(got["usp.causal_top_left.u2_r2_zigzag.bytes"])
            # r - 1 = 1 sending ring step, then the last, which sends nothing
            assert sent == [usp["query"], usp["key"], usp["value"], usp["ring"], 0, usp["output"]]
