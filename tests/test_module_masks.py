"""Contract v2 in the modules: window, sinks, ALiBi, softcap and segment ids per layer, and the
KV cache with a window (plain and rolling), in the three implementations.

Expected values: the float64 oracle's module forward (``conformance.oracle.module_forward``,
which has its own ALiBi slopes and knows nothing of impl_*), and, for decoding, the same
module's full causal forward over the whole sequence (itself checked against the oracle here).
JAX runs under ``nnx.jit`` (module_frameworks.py), which compiles each decode step anew, so it
gets the chunkings with the fewest steps.
"""

from __future__ import annotations

import numpy as np
import pytest

import impl_jax.interop
import impl_torch.interop
from attention_spec import AttentionError
from conformance.cases.base import canonical
from conformance.oracle import assert_within, module_forward
from tests.module_frameworks import MODULE_FRAMEWORKS, B, H, K, M, random_canonical

T = 9  # sequence length of the decode tests (distinct from every other size)
WINDOW = (3, 0)  # left 3: a rolling cache of 4 slots
MAX_LEN = 12
CHUNKINGS = {"tokens": [1] * T, "uneven": [3, 1, 4, 1], "long_chunk": [6, 3]}


@pytest.fixture(params=list(MODULE_FRAMEWORKS), ids=list(MODULE_FRAMEWORKS))
def mf(request):
    return MODULE_FRAMEWORKS[request.param]


def _weights(sinks: bool = True, k: int = K) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(110)
    weights = random_canonical(rng, K=k)
    if sinks:
        weights["sinks"] = rng.standard_normal(H) + np.arange(H) / 3.0  # (H,), per head
    return weights


def _x(n: int = T, seed: int = 111) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((B, n, M))


SETTINGS = {
    "window": dict(window=[2, 1]),
    "sinks": dict(),  # the weights' sinks (H,)
    "alibi": dict(alibi=True),
    "softcap": dict(softcap=0.7),
    "all": dict(window=[2, 0], alibi=True, softcap=2.0, rope_theta=100.0, rotary_dim=10, scale=0.3),
}


@pytest.mark.parametrize(
    ("name", "setting"),
    [(fw, s) for fw in MODULE_FRAMEWORKS for s in SETTINGS if fw != "jax" or s == "all"],
)
def test_module_settings_match_the_oracle(name, setting):
    """Each v2 setting of a layer reaches the attention, causal self-attention with packed
    segments (two documents per row) in float64; sinks are the canonical weight. JAX (one
    compilation per setting) runs them all at once."""
    mf = MODULE_FRAMEWORKS[name]
    options = SETTINGS[setting]
    weights = _weights(sinks=setting in ("sinks", "all"))
    x = _x(6)
    ids = np.array([[0, 0, 0, 1, 1, 1], [5, 5, 5, 5, 2, 2]])
    module = mf.build(weights, H, K, **options)
    got, w = mf.forward(
        module, x, is_causal=True, return_weights=True, q_segment_ids=ids, kv_segment_ids=ids
    )
    golden = module_forward(weights, x, n_heads=H, n_kv_heads=K, is_causal=True,
                            q_segment_ids=ids, kv_segment_ids=ids, **options)
    assert_within(got, golden.output, "float64", what="output: ")
    assert_within(w, golden.weights, "float64", what="weights: ")
    assert np.all(w[0, :, 3:, :3] == 0) and np.all(w[1, :, :4, 4:] == 0)  # no leak across docs
    plain = mf.forward(mf.build(_weights(sinks=False), H, K), x, is_causal=True)
    assert np.abs(got - plain).max() > 1e-3  # the setting changed the result


def _decode(mf, module, x, chunks, cache):
    outputs, start = [], 0
    for n in chunks:
        y, cache = mf.decode(module, x[:, start : start + n], cache)
        outputs.append(y)
        start += n
        assert cache.position == start
    return np.concatenate(outputs, axis=1), cache


def _decode_cases():
    for fw in MODULE_FRAMEWORKS:
        for rolling in (False, True):
            for chunking in CHUNKINGS:
                if fw != "jax" or chunking == "long_chunk":
                    kind = "rolling" if rolling else "plain"
                    yield pytest.param(fw, rolling, chunking, id=f"{fw}-{kind}-{chunking}")


@pytest.mark.parametrize(("name", "rolling", "chunking"), list(_decode_cases()))
def test_windowed_decoding_matches_the_full_forward(name, rolling, chunking):
    """Token by token, in uneven chunks and in a chunk longer than the window, into a plain and
    a rolling cache: the full causal forward with the same window (with sinks and ALiBi, whose
    distance is absolute, and RoPE at absolute positions)."""
    mf = MODULE_FRAMEWORKS[name]
    weights, x = _weights(), _x()
    options = dict(window=WINDOW, alibi=True, rope_theta=100.0, rotary_dim=10)
    module = mf.build(weights, H, K, **options)
    full = mf.forward(module, x, is_causal=True)
    golden = module_forward(weights, x, n_heads=H, n_kv_heads=K, is_causal=True, **options)
    assert_within(full, golden.output, "float64", what="the full forward: ")
    decoded, cache = _decode(
        mf, module, x, CHUNKINGS[chunking], module.init_cache(B, MAX_LEN, rolling=rolling)
    )
    assert_within(decoded, full, "float64", what="decoded against the full forward: ")
    assert cache.slots == (WINDOW[0] + 1 if rolling else MAX_LEN)


def test_plain_cache_with_window_differs_from_no_window():
    """The window matters in decode: without it, the last token sees all 9 keys."""
    mf = MODULE_FRAMEWORKS["numpy"]
    weights, x = _weights(), _x()
    module = mf.build(weights, H, K, window=WINDOW)
    windowed, _ = _decode(mf, module, x, [T], module.init_cache(B, MAX_LEN))
    unbounded = mf.forward(mf.build(weights, H, K), x, is_causal=True)
    assert np.abs(windowed[:, -1] - unbounded[:, -1]).max() > 1e-3


def test_rolling_cache_is_the_window_over_max_len_in_bytes(mf):
    """(left + 1) / max_len of the plain cache's bytes, and it does not grow with the sequence:
    the buffers are the same objects' shapes after 40 tokens."""
    module = mf.build(_weights(), H, K, window=(3, 0))
    plain, rolling = module.init_cache(B, 400), module.init_cache(B, 400, rolling=True)
    assert rolling.nbytes * 400 == plain.nbytes * 4 and rolling.slots == 4
    assert module.init_cache(B, 3, rolling=True).slots == 3  # never more than max_len
    x = _x(40).astype(np.float64)
    for step in range(2):
        _, rolling = mf.decode(module, x[:, 20 * step : 20 * step + 20], rolling)
    assert rolling.position == 40 and rolling.key.shape == (B, K, 4, module.dims.D)
    assert rolling.nbytes * 400 == plain.nbytes * 4


def test_packed_prefill_into_a_plain_cache(mf):
    """Segment ids through decode: a packed prefill (two documents) then one more token of the
    second document equal the full forward with those ids."""
    weights, x = _weights(), _x(6)
    module = mf.build(weights, H, K, window=(4, 0))
    ids = np.array([[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    full = mf.forward(module, x, is_causal=True, q_segment_ids=ids, kv_segment_ids=ids)
    cache = module.init_cache(B, 8)
    y1, cache = mf.decode(module, x[:, :5], cache, q_segment_ids=ids[:, :5],
                          kv_segment_ids=ids[:, :5])
    y2, cache = mf.decode(module, x[:, 5:], cache, q_segment_ids=ids[:, 5:],
                          kv_segment_ids=ids)
    assert_within(np.concatenate([y1, y2], axis=1), full, "float64")


def _error(fn) -> tuple[str, str, str]:
    with pytest.raises(AttentionError) as info:
        fn()
    return type(info.value).__name__, info.value.code, str(info.value)


def _rolling_refusals(mf) -> list[tuple[str, str, str]]:
    windowed = mf.build(_weights(), H, K, window=(2, 0))
    x = mf.asarray(_x(2))
    cache = windowed.init_cache(B, 8, rolling=True)
    ids = mf.asarray(np.zeros((B, 2), np.int32))
    mask = mf.asarray(np.ones((B, 1, 1, 2), bool))
    other = mf.build(_weights(), H, K, window=(4, 0)).init_cache(B, 8, rolling=True)
    return [
        _error(lambda: mf.build(_weights(), H, K).init_cache(B, 8, rolling=True)),
        _error(lambda: windowed.decode(x, cache, mask=mask)),
        _error(lambda: windowed.decode(x, cache, q_segment_ids=ids, kv_segment_ids=ids)),
        _error(lambda: windowed.decode(x, other)),
    ]


def test_rolling_cache_refusals_are_identical():
    """A rolling cache for a module without a window, a rolling cache given a mask or segment
    ids, a rolling cache of another window: the same class, code and message in all three."""
    seen = [_rolling_refusals(mf) for mf in MODULE_FRAMEWORKS.values()]
    assert seen[0] == seen[1] == seen[2]
    assert [code for _, code, _ in seen[0]] == [
        "rolling_cache", "rolling_cache", "rolling_cache", "cache_mismatch",
    ]
    assert "mask" in seen[0][1][2] and "q_segment_ids, kv_segment_ids" in seen[0][2][2]


def test_sinks_round_trip_through_canonical_save_and_load(tmp_path):
    """sinks=True adds the learned weight ``sinks (H,)``: exported by to_canonical, written by
    save with the window, ALiBi and softcap in the metadata, loaded by every implementation into
    a module computing the same output."""
    weights, x = _weights(), _x(5)
    options = dict(window=(2, 0), alibi=True, softcap=3.0)
    outputs = {}
    for name, mf in MODULE_FRAMEWORKS.items():
        module = mf.build(weights, H, K, **options)
        exported = module.to_canonical()
        assert set(exported) == set(weights) and np.array_equal(exported["sinks"], weights["sinks"])
        module.save(tmp_path / f"{name}.safetensors")
    for writer in MODULE_FRAMEWORKS:
        for name, mf in MODULE_FRAMEWORKS.items():
            loaded = mf.modules.GroupedQueryAttention.load(tmp_path / f"{writer}.safetensors")
            assert loaded.options == mf.build(weights, H, K, **options).options
            outputs[writer, name] = mf.forward(loaded, x, is_causal=True)
    golden = module_forward(weights, x, n_heads=H, n_kv_heads=K, is_causal=True, **options)
    for (writer, name), out in outputs.items():
        assert_within(out, golden.output, "float64", what=f"{writer}'s file in {name}: ")


def test_sinks_flag_must_agree_with_the_weights():
    """from_canonical(sinks=True) without a sinks weight, or sinks=False with one, is refused
    (weight_shape), identically; a fresh module's sinks are zeros."""
    seen = []
    for mf in MODULE_FRAMEWORKS.values():
        seen.append([
            _error(lambda mf=mf: mf.build(_weights(sinks=False), H, K, sinks=True)),
            _error(lambda mf=mf: mf.build(_weights(sinks=True), H, K, sinks=False)),
        ])
        fresh = mf.modules.GroupedQueryAttention(24, H, K, sinks=True, dtype="float64")
        assert np.array_equal(fresh.to_canonical()["sinks"], np.zeros(H))
    assert seen[0] == seen[1] == seen[2]
    assert {code for _, code, _ in seen[0]} == {"weight_shape"}


def test_framework_modules_without_sinks_refuse_them():
    """torch.nn.MultiheadAttention and flax.nnx.MultiHeadAttention have no sink logits: the
    converters refuse weights with sinks (weight_shape, naming the broken rule) instead of
    dropping them; the same weights without sinks convert."""
    weights = canonical(np.random.default_rng(112), k=6)  # M = 24 = H * D, K = H, E = D
    with_sinks = weights | {"sinks": np.ones(6)}
    for convert in (
        impl_torch.interop.to_torch_multihead_attention,
        impl_jax.interop.to_flax_multihead_attention,
    ):
        convert(weights, n_heads=6)
        _, code, message = _error(lambda convert=convert: convert(with_sinks, n_heads=6))
        assert code == "weight_shape" and "breaking no sinks" in message


def test_jax_rolling_step_compiles_to_the_same_program_at_any_position():
    """A rolling cache's decode step costs O(W), not O(P), in JAX: jitted at position 101 and
    at position 1002 (both long past the window), the compiled programs are one program, the
    ring slots it writes and reads aside (integer constants). Every buffer, shape and
    operation is the same, so nothing in the step grows with P (the bench's rolling goal times
    the same thing, with noise)."""
    import dataclasses
    import re

    import jax
    from flax import nnx

    mf = MODULE_FRAMEWORKS["jax"]
    module = mf.build(_weights(), H, K, window=WINDOW)
    graphdef, state = nnx.split(module)
    x = _x(1).astype(np.float64)

    def step(state, x, cache):
        return nnx.merge(graphdef, state).decode(x, cache)

    def program(P: int) -> str:
        empty = module.init_cache(B, 2000, rolling=True)  # a ring of WINDOW[0] + 1 slots
        cache = dataclasses.replace(empty, position=P)
        text = jax.jit(step).lower(state, x, cache).compile().as_text()
        text = re.sub(r", metadata=\{[^}]*\}", "", text)  # where each op was traced from
        text = re.sub(r"(?m)^\d+ \{file_name_id=.*$", "", text)  # likewise
        return re.sub(r"constant\([^()]*\)", "constant(N)", text)  # the ring's slots

    assert 101 % (WINDOW[0] + 1) != 1002 % (WINDOW[0] + 1)  # two different ring slots
    assert program(101) == program(1002)
