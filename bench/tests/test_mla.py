"""The MLA decode rows (issue 29): the absorbed step against the naive one at P = 1024 and 8192
(H = 16, R = 512, Dr = 64, Dn = E = 128), its goal timed interleaved, the cache bytes per token
against MHA and GQA, and the timed steps computing the layer's last row. No timing asserted."""

from __future__ import annotations

import numpy as np
import pytest

from bench import preparers
from bench.flops import decode_flops, mla_decode_flops
from bench.report import _cache_note, fmt_bytes, mla_cache_text
from bench.rows import ROWS, row_by_name
from bench.workloads import MLA_GOAL_WORKLOAD, MLA_GQA_GROUP, Workload, grid
from conformance.oracle import mla_forward, module_forward

from .helpers import assert_within_bound, goal_cases, to_np

_FRAMEWORKS = ("numpy", "torch", "jax")


def test_every_framework_has_an_absorbed_and_a_naive_row_and_the_goal_between_them():
    for fw in _FRAMEWORKS:
        absorbed, naive = row_by_name(f"{fw} MLA decode"), row_by_name(f"{fw} MLA naive decode")
        assert (absorbed.call, naive.call) == ("mla_decode", "mla_decode_naive")
        assert absorbed.target == naive.target == f"impl_{fw}.mla:MultiHeadLatentAttention"
        assert absorbed.ref == naive.name and naive.ref is None  # the ratio column: / naive
        assert (absorbed.gate_port, absorbed.gate_alias) == (f"impl_{fw}", "decode")
        (goal,) = absorbed.goals
        assert (goal.kind, goal.limit, goal.ref, goal.on) == ("ratio", 1.0, naive.name,
                                                             MLA_GOAL_WORKLOAD)
        assert goal.text() == f"<= 1x {naive.name} (MLA P=8192)"
        assert goal.met(0.99) and goal.met(1.0) and not goal.met(1.01)
    w = MLA_GOAL_WORKLOAD
    assert (w.op, w.B, w.H, w.P, w.R, w.Dr, w.D, w.E, w.L, w.M) == (
        "mla_decode", 1, 16, 8192, 512, 64, 128, 128, 1, 2048,
    )
    mla_rows = {r.name for r in ROWS if r.workloads == "mla_decode"}
    assert len(mla_rows) == 6
    for r in ROWS:  # MLA rows take only MLA workloads, the others none of them
        assert r.applies_to(w) == (r.name in mla_rows)
        assert not r.applies_to(Workload("decode", 1, 16, 16, 1, 8193, 128, 128)) or (
            r.name not in mla_rows
        )


def test_the_quick_grid_steps_p_1024_and_the_full_grid_adds_the_goal_at_8192():
    def contexts(name: str) -> set[int]:
        return {w.P for w in grid("cpu", name) if w.op == "mla_decode"}

    assert contexts("quick") == {1024} and contexts("full") == {1024, 8192}
    for name in ("quick", "full"):
        for w in grid("cpu", name):
            if w.op == "mla_decode":
                assert (w.H, w.R, w.Dr, w.D, w.E) == (16, 512, 64, 128, 128)
                assert Workload.from_dict(w.to_dict()) == w
    full = goal_cases("cpu", grid("cpu", "full"), ROWS, resolve_error=lambda r: None)
    mla = [c for c in full if c.workload.op == "mla_decode"]
    assert [c.row.name for c in mla] == [f"{fw} MLA decode" for fw in _FRAMEWORKS]
    for c in mla:  # the absorbed step and the naive one, on the same workload, interleaved
        (a, wa, _), (b, wb, _) = c.pair
        assert (a.call, b.call) == ("mla_decode", "mla_decode_naive")
        assert wa == wb == MLA_GOAL_WORKLOAD
    quick = goal_cases("cpu", grid("cpu", "quick"), ROWS, resolve_error=lambda r: None)
    assert not [c for c in quick if c.workload.op == "mla_decode"]


@pytest.mark.parametrize(
    ("w", "dtype_bytes"),
    [
        (MLA_GOAL_WORKLOAD, 4),
        # pairwise distinct sizes, so a formula with one letter for another cannot pass
        (Workload("mla_decode", 2, 8, 8, 1, 10, 24, 40, dtype="bfloat16", R=96, Dr=16), 2),
    ],
)
def test_the_cache_bytes_per_token_are_the_formulas(w, dtype_bytes):
    H, R, Dr, Dn, E, D, K = w.H, w.R, w.Dr, w.D, w.E, w.D, w.H // MLA_GQA_GROUP
    per = w.cache_bytes_per_token()
    assert per == {
        "MLA latent": (R + Dr) * dtype_bytes,  # c_kv and the rotated k_pe, shared by the heads
        "MLA naive": H * (Dn + Dr + E) * dtype_bytes,  # every head's key and value
        "MHA": 2 * H * D * dtype_bytes,
        "GQA": 2 * K * D * dtype_bytes,
    }
    assert w.to_dict()["cache_bytes_per_token"] == per
    assert w.cache_bytes() == w.B * w.S * per["MLA naive"]  # the naive cache of B * S tokens
    text = mla_cache_text(w.to_dict())
    assert text == (
        f"latent {fmt_bytes(per['MLA latent'])} (R + Dr), "
        f"naive {fmt_bytes(per['MLA naive'])} (H (Dn + Dr + E)), "
        f"MHA {fmt_bytes(per['MHA'])} (2 H D), GQA {H}:{K} {fmt_bytes(per['GQA'])} (2 K D)"
    )
    assert _cache_note(w.to_dict()) == f"cache per token: {text}"  # the workload's table line
    assert Workload("decode", 1, 8, 2, 1, 9, 4, 4).cache_bytes_per_token() == {}


def test_the_goal_workload_s_latent_is_a_ninth_of_the_naive_cache():
    per = MLA_GOAL_WORKLOAD.cache_bytes_per_token()
    assert (per["MLA latent"], per["MLA naive"], per["MHA"], per["GQA"]) == (
        576 * 4, 5120 * 4, 4096 * 4, 1024 * 4,
    )
    assert mla_cache_text(MLA_GOAL_WORKLOAD.to_dict()).startswith("latent 2.25 KiB (R + Dr)")


def test_the_flops_are_the_naive_step_s_and_the_absorbed_one_does_3_4x_per_key():
    B, H, P, R, Dr, Dn, E, M = 2, 3, 10, 11, 4, 5, 7, 13
    proj = 2 * B * (M * H * (Dn + Dr) + M * (R + Dr) + H * E * M)
    S = P + 1
    naive = mla_decode_flops(B, H, P, R, Dr, Dn, E, M, absorbed=False)
    absorbed = mla_decode_flops(B, H, P, R, Dr, Dn, E, M, absorbed=True)
    assert naive == proj + 2 * B * R * H * (Dn + E) + 2 * B * H * S * (Dn + Dr + E)
    assert absorbed == proj + 2 * B * H * (Dn * R + R * E) + 2 * B * H * S * (R + Dr + R)
    w = MLA_GOAL_WORKLOAD
    n, useful = w.flops()
    assert n == useful == mla_decode_flops(1, 16, 8192, 512, 64, 128, 128, 2048, absorbed=False)

    def per_key(absorbed: bool) -> int:  # the FLOPs one more cached key adds
        sizes = (16, 512, 64, 128, 128, 2048)
        H, R, Dr, Dn, E, M = sizes
        one, none = (mla_decode_flops(1, H, p, R, Dr, Dn, E, M, absorbed=absorbed) for p in (1, 0))
        return one - none

    assert round(per_key(True) / per_key(False), 1) == 3.4
    assert decode_flops(1, 16, 16, 0, 128, 128, 2048) != n  # not the GQA step's count


# ------------------------------------------------------------------------ the timed steps

# small sizes, pairwise distinct: B=2, H=3, P=6 cached tokens, R=10, Dr=4, Dn=5, E=7 (M=15)
_W = Workload("mla_decode", 2, 3, 3, 1, 7, 5, 7, dtype="float64", R=10, Dr=4)
_MLA_ROWS = [  # JAX's absorbed step compiles its prefill and its step: over 10 s cold
    pytest.param(r.name, marks=[pytest.mark.slow] if r.name == "jax MLA decode" else [])
    for r in ROWS
    if r.workloads == "mla_decode"
]


@pytest.fixture
def x64():
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("name", _MLA_ROWS)
def test_the_timed_step_is_the_last_row_of_the_float64_layer(name, x64):
    """The timed step, from a cache filled by the same path with P tokens, is the oracle's
    causal MLA layer's last row over the P + 1 tokens (from the module's canonical weights);
    repeated rounds are the same step at the same position, the cache never advanced."""
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    w, naive = _W, row.call == "mla_decode_naive"
    p = preparers.prepare(row, w, "cpu")
    m, x_new = p.module, p.inputs[-2]
    assert p.layout == ("mla_naive" if naive else "mla_latent")
    prefix = np.random.default_rng(3).standard_normal((w.B, w.P, w.M))  # (B, P, M) float64
    init, step = (m.init_kv_cache, m.decode_naive) if naive else (m.init_cache, m.decode)
    if row.framework == "torch":
        import torch

        with torch.no_grad():
            _, cache = step(torch.from_numpy(prefix), init(w.B, w.S))
    else:
        to = np.asarray if row.framework == "numpy" else __import__("jax.numpy").numpy.asarray
        _, cache = step(to(prefix), init(w.B, w.S))
    assert cache.position == w.P
    heads = w.H if naive else 1
    assert tuple(cache.key.shape) == (w.B, heads, w.S, w.D + w.Dr if naive else w.R + w.Dr)
    assert tuple(cache.value.shape) == (w.B, heads, w.S, w.E if naive else 0)
    for name in ("key", "value"):  # the bench's cache made at P has the module's own layout
        assert tuple(getattr(p.inputs[-1], name).shape) == tuple(getattr(cache, name).shape)
    p.inputs[-1] = cache  # the call reads its cache from its inputs
    weights = {k: to_np(a) for k, a in m.to_canonical().items()}
    x = np.concatenate([prefix, to_np(x_new)], axis=1)  # (B, P + 1, M)
    golden = mla_forward(weights, x, n_heads=w.H, qk_rope_head_dim=w.Dr, is_causal=True)
    expected = golden.output[:, -1:]
    outs = [np.array(to_np(p.call())) for _ in range(3)]
    assert outs[0].shape == (w.B, 1, w.M)
    assert_within_bound(outs[0], expected, expected, "float64")
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])  # the same step, bit for bit
    assert p.inputs[-1].position == w.P


# -- MLA prefill against the same-size GQA module --------------------------------------------

_WP = Workload("mla_prefill", 2, 4, 1, 6, 6, 5, 7, True, "float64", R=10, Dr=4)


def test_the_prefill_rows_and_their_workloads():
    """Each framework: MLA's prefill, its ratio against the GQA module of the same H, score
    width Dn + Dr and E with K = H / 4, no goal; the grids hold L = 512 (quick) and 2048
    (full); the FLOPs are MLA's projections and attention."""
    for fw in _FRAMEWORKS:
        mla, gqa = row_by_name(f"{fw} MLA prefill"), row_by_name(f"{fw} GQA prefill (MLA size)")
        assert (mla.call, gqa.call, mla.ref, mla.goals) == ("mla_prefill", "mla_prefill_gqa",
                                                           gqa.name, ())
        assert gqa.target == f"impl_{fw}.modules:GroupedQueryAttention"
        assert mla.gate_alias == gqa.gate_alias == "module"
    prefill = {n: [w for w in grid("cpu", n) if w.op == "mla_prefill"] for n in ("quick", "full")}
    assert [w.L for w in prefill["quick"]] == [512] and [w.L for w in prefill["full"]] == [
        512,
        2048,
    ]
    w = prefill["quick"][0]
    assert (w.H, w.K, w.R, w.Dr, w.D, w.E, w.M, w.is_causal) == (
        16,
        4,
        512,
        64,
        128,
        128,
        2048,
        True,
    )
    proj = 2 * 512 * (2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048)
    assert w.flops()[0] == proj + 2 * 16 * 512 * 512 * (192 + 128)
    assert w.variant == "MLA" and w.id.startswith("mla_prefill.b1.h16.k4.l512.")


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_the_timed_prefills_are_the_float64_layers(fw):
    """The timed MLA call is the oracle's causal MLA layer; the GQA twin is the oracle's GQA
    module with head_dim Dn + Dr, E and RoPE on Dr features, from its canonical weights."""
    pytest.importorskip(fw)
    for name in (f"{fw} MLA prefill", f"{fw} GQA prefill (MLA size)"):
        p = preparers.prepare(row_by_name(name), _WP, "cpu")
        weights = {k: to_np(a) for k, a in p.module.to_canonical().items()}
        x = to_np(p.inputs[-1])  # (B, L, M)
        if "MLA prefill" in name:
            golden = mla_forward(weights, x, n_heads=4, qk_rope_head_dim=4, is_causal=True)
        else:
            assert (p.module.dims.K, p.module.dims.D, p.module.dims.E) == (1, 9, 7)
            golden = module_forward(weights, x, n_heads=4, n_kv_heads=1, is_causal=True,
                                    rope_theta=10000.0, rotary_dim=4)
        out = to_np(p.call())
        assert_within_bound(out, golden.output, golden.output, "float64")
