"""attention_spec's stable API (conformance/PORTING.md, "The attention_spec API"): every
documented form is called here, the deprecated ones of API 1.0 included, and gives what the
document says. Pure Python: no array framework is imported (ArraySpecs stand in for arrays)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re
import warnings
from pathlib import Path

import pytest

import attention_spec
from attention_spec import (
    API_VERSION,
    NO_VALUE,
    PUBLIC_API,
    ArraySpec,
    AttentionCall,
    AttentionDims,
    AttentionError,
    ConfigError,
    DimensionMismatchError,
    MaskError,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_cache_size,
    check_canonical,
    check_causal_mask_args,
    check_decode_inputs,
    check_flag,
    check_module_config,
    check_module_inputs,
    make_error,
    tiled_blocks,
)
from attention_spec.validate import KEYWORDS

PORTING = Path(attention_spec.__file__).resolve().parent.parent / "conformance" / "PORTING.md"

#: Pairwise-distinct sizes: B=2, H=6, K=2, L=5, S=7, D=11, E=13.
Q, K, V = (ArraySpec((2, 6, 5, 11), "float32"), ArraySpec((2, 2, 7, 11), "float32"),
           ArraySpec((2, 2, 7, 13), "float32"))


def _1_0(shape_dtype: ArraySpec) -> tuple[tuple[int, ...], str]:
    return shape_dtype.shape, shape_dtype.dtype


# -- the list and its version --------------------------------------------------------------------


def test_the_stable_api_is_listed_once_with_its_version() -> None:
    assert API_VERSION == "1.1"
    assert len(set(PUBLIC_API)) == len(PUBLIC_API)
    assert set(PUBLIC_API) <= set(attention_spec.__all__)
    for name in attention_spec.__all__:
        assert hasattr(attention_spec, name), name


def test_porting_md_documents_exactly_the_stable_api() -> None:
    """PORTING.md's table of the API names each entry of PUBLIC_API once, and every name the
    document imports from attention_spec is in it (or a module of it)."""
    text = PORTING.read_text()
    section = text.split("## The attention_spec API", 1)[1].split("\n## ", 1)[0]
    assert f"version {API_VERSION}" in section
    rows = re.findall(r"^\| `([A-Za-z_]+)", section, re.M)
    assert sorted(rows) == sorted(PUBLIC_API)
    imported = set()
    for names in re.findall(r"from attention_spec(?:\.modules)? import \(?([^)]*?)\)?\n", text):
        imported |= {n.strip() for n in names.replace("\n", ",").split(",") if n.strip()}
    imported |= set(re.findall(r"`attention_spec\.(?:modules\.)?([A-Za-z_]+)`", text)) - {"modules"}
    assert imported <= set(PUBLIC_API), imported - set(PUBLIC_API)


# -- check_attention: the arrays' form (1.1) ----------------------------------------------------


def test_check_attention_returns_the_call_object() -> None:
    call = check_attention(Q, K, V, is_causal=True, causal_alignment="bottom_right", window=(3, 1),
                           softcap=30, sinks=ArraySpec((6,), "float32"))
    assert isinstance(call, AttentionCall) and isinstance(call, AttentionDims)
    assert (call.batch, call.H, call.K, call.G, call.L, call.S, call.D, call.E) == (
        (2,), 6, 2, 3, 5, 7, 11, 13,
    )
    assert call.scale == 11**-0.5 and call.softcap == 30.0 and type(call.softcap) is float
    assert (call.is_causal, call.window, call.causal_alignment) == (True, (3, 1), "bottom_right")
    assert call.offset == 2 and call.bands is True  # S - L; row 0 sees keys 0..2 of 7
    assert call.scores_shape == (2, 6, 5, 7) and call.output_shape == (2, 6, 5, 13)
    assert list(call.keywords) == [k.name for k in KEYWORDS]
    assert call.keywords["sinks"] == ArraySpec((6,), "float32") == call.sinks
    assert call.mask is None and call.keywords["scale"] == call.scale
    assert pickle.loads(pickle.dumps(call)) == call and hash(call) == hash(
        dataclasses.replace(call)
    )
    assert dataclasses.replace(call, E=7).E == 7  # what the kernel ports do for the weights
    with pytest.raises(AttributeError):
        _ = call.not_a_keyword


@pytest.mark.parametrize(
    ("keywords", "offset", "bands"),
    [
        ({}, 0, False),
        ({"is_causal": True}, 0, True),
        ({"is_causal": True, "causal_alignment": "bottom_right"}, 2, True),
        ({"window": (7, 7)}, 0, False),  # wider than the keys: every pair allowed
        ({"window": (None, 6)}, 0, False),
        ({"window": (None, 5)}, 0, True),  # row 0 may not see key 6
    ],
)
def test_the_band_decision(keywords, offset, bands) -> None:
    call = check_attention(Q, K, V, **keywords)
    assert (call.offset, call.bands) == (offset, bands)


def test_a_decode_step_needs_no_band() -> None:
    """One new token against the whole cache, bottom-right: the causal rule allows every key."""
    q = ArraySpec((2, 6, 1, 11), "float32")
    call = check_attention(q, K, V, is_causal=True, causal_alignment="bottom_right")
    assert (call.offset, call.bands) == (6, False)


def test_check_attention_has_the_contracts_keywords_and_no_other() -> None:
    params = inspect.signature(check_attention).parameters
    assert list(params) == ["query", "key", "value", *(k.name for k in KEYWORDS)]
    assert params["value"].default is NO_VALUE
    with pytest.raises(TypeError, match="unexpected keyword argument 'mask_typo'"):
        check_attention(Q, K, V, mask_typo=None)


def test_attention_weights_pass_no_value() -> None:
    assert check_attention(Q, K, NO_VALUE).E == 1
    with pytest.raises(AttentionError) as info:
        check_attention(Q, K, None)
    assert info.value.code == "not_an_array"


# -- check_attention: API 1.0's form, shapes and dtype names ------------------------------------

#: Calls of the array form and the same call in 1.0's form (PORTING.md of 2026-11-30).
BAD = ArraySpec((2, 3, 5, 7), "bool")
FORMS = {
    "valid": ((Q, K, V), {}, (*_1_0(Q), *_1_0(K), *_1_0(V)), {}),
    "weights": ((Q, K), {}, (*_1_0(Q), *_1_0(K), None, None), {}),
    "mask_and_bias": (
        (Q, K, V), {"mask": ArraySpec((5, 7), "bool"), "bias": ArraySpec((6, 5, 7), "float16")},
        (*_1_0(Q), *_1_0(K), *_1_0(V)),
        {"mask_shape": (5, 7), "mask_dtype": "bool", "bias_shape": (6, 5, 7),
         "bias_dtype": "float16"},
    ),
    "keywords": (
        (Q, K, V), {"causal_alignment": "bottom_right", "scale": 0.5, "softcap": 20.0},
        (*_1_0(Q), *_1_0(K), *_1_0(V)),
        {"causal_alignment": "bottom_right", "scale": 0.5, "softcap": 20.0},
    ),
    "mask_shape_error": (
        (Q, K, V), {"mask": BAD}, (*_1_0(Q), *_1_0(K), *_1_0(V)),
        {"mask_shape": BAD.shape, "mask_dtype": "bool"},
    ),
    "mask_dtype_error": (
        (Q, K, V), {"mask": ArraySpec((5, 7), "int32")}, (*_1_0(Q), *_1_0(K), *_1_0(V)),
        {"mask_shape": (5, 7), "mask_dtype": "int32"},
    ),
    "heads_error": (
        (Q, ArraySpec((2, 4, 7, 11), "float32")), {}, (*_1_0(Q), (2, 4, 7, 11), "float32"), {},
    ),
    "dtype_error": (
        (Q, ArraySpec((2, 2, 7, 11), "float16"), V), {},
        (*_1_0(Q), (2, 2, 7, 11), "float16", *_1_0(V)), {},
    ),
    "softcap_error": ((Q, K, V), {"softcap": 1e38}, (*_1_0(Q), *_1_0(K), *_1_0(V)),
                      {"softcap": 1e38}),
}


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except AttentionError as err:
        return (type(err), err.code, str(err))


@pytest.mark.parametrize("name", list(FORMS))
def test_check_attention_1_0_form_warns_and_gives_the_array_forms_result(name) -> None:
    arrays, keywords, old_args, old_keywords = FORMS[name]
    want = _outcome(check_attention, *arrays, **keywords)
    with pytest.warns(DeprecationWarning, match="API 1.0") as caught:
        got = _outcome(check_attention, *old_args, **old_keywords)
    assert got == want
    assert all(Path(w.filename).name == "test_public_api.py" for w in caught)  # the caller's line
    if name.endswith("_error"):
        assert isinstance(want, tuple)  # a broken call: the same class, code and message


def test_the_1_0_forms_error_classes() -> None:
    """The classes the old form's users caught are the taxonomy's, as before."""
    with pytest.warns(DeprecationWarning):
        with pytest.raises(MaskError):
            check_attention(*_1_0(Q), *_1_0(K), *_1_0(V), mask_shape=BAD.shape, mask_dtype="bool")
        with pytest.raises(DimensionMismatchError):
            check_attention(*_1_0(Q), (2, 4, 7, 11), "float32")


def test_the_array_form_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_attention(Q, K, V, mask=ArraySpec((5, 7), "bool"))


# -- the other functions PORTING.md offers ------------------------------------------------------


def test_causal_offset_and_the_causal_mask_arguments() -> None:
    assert causal_offset(5, 7) == 0 and causal_offset(5, 7, "bottom_right") == 2
    check_causal_mask_args(5, 0, "top_left")
    with pytest.raises(ConfigError) as info:
        check_causal_mask_args(-1, 7, "top_left")
    assert info.value.code == "non_positive_size"
    with pytest.raises(ConfigError) as info:
        causal_offset(5, 7, "lower_right")
    assert info.value.code == "unknown_alignment"


def test_flags_block_sizes_and_errors() -> None:
    assert check_flag("return_lse", False) is False
    with pytest.raises(ConfigError, match="not_a_bool"):
        check_flag("return_lse", "False")
    check_block_sizes(2, 3)
    with pytest.raises(ConfigError, match="block_k must be an integer >= 1; got 0"):
        check_block_sizes(2, 0)
    err = make_error("unsupported_dtype", "the kernel computes float32; got float64")
    assert type(err).__name__ == "DTypeError" and err.code == "unsupported_dtype"


def test_tiled_blocks_takes_the_packages_pair() -> None:
    """Not part of the stable API; its package-name form of before is gone, with a clear
    error (no port or document used it)."""
    assert tiled_blocks((128, 512), None, None, True, (256, 0)) == (128, 384)
    with pytest.raises(TypeError, match=r"\(rows, widest\) pair"):
        tiled_blocks("numpy", None, None, True, (256, 0))


# -- the modules' checks: 1.1 and 1.0 forms -----------------------------------------------------

DIMS = check_module_config(24, 6, 2, 11, 13, bias=True)  # M=24, H=6, K=2, D=11, E=13
X, CONTEXT = ArraySpec((2, 5, 24), "float32"), ArraySpec((2, 7, 24), "float32")


def test_check_module_config_takes_the_machines_memory_from_the_caller() -> None:
    """attention_spec reads nothing of the machine: the bound is the caller's number."""
    check_module_config(24, 6, 2, 11, 13)  # no number: only the 2**62 bytes no machine has
    with pytest.raises(MemoryError, match="GiB"):
        check_module_config(24, 6, 2, 11, 13, memory_bytes=1000)


def test_check_canonical_both_forms() -> None:
    weights = {name: ArraySpec(shape, "float32") for name, shape in DIMS.canonical_shapes().items()}
    assert check_canonical(weights, n_heads=6, n_kv_heads=2) == DIMS
    shapes = {name: spec.shape for name, spec in weights.items()}
    dtypes = {name: "float32" for name in weights}
    with pytest.warns(DeprecationWarning, match=r"check_canonical\(shapes, dtypes"):
        assert check_canonical(shapes, dtypes, n_heads=6, n_kv_heads=2) == DIMS
    dtypes["o_proj.bias"] = "float16"
    with pytest.warns(DeprecationWarning), pytest.raises(AttentionError) as info:
        check_canonical(shapes, dtypes, n_heads=6, n_kv_heads=2)
    assert info.value.code == "dtype_mismatch"


def test_check_module_inputs_both_forms() -> None:
    mask = ArraySpec((2, 1, 5, 7), "bool")
    want = check_module_inputs(DIMS, "float32", X, CONTEXT, mask=mask)
    assert (want.H, want.K, want.L, want.S, want.E) == (6, 2, 5, 7, 13)
    with pytest.warns(DeprecationWarning, match="check_module_inputs"):
        got = check_module_inputs(DIMS, "float32", X.shape, "float32", CONTEXT.shape, "float32",
                                  mask_shape=mask.shape, mask_dtype="bool")
    assert got == want
    with pytest.warns(DeprecationWarning), pytest.raises(AttentionError) as info:
        check_module_inputs(DIMS, "float32", (2, 5, 23), "float32")
    assert info.value.code == "model_width_mismatch"


def test_check_cache_size_and_check_decode_inputs_both_forms() -> None:
    assert check_cache_size(2, 9) == 9
    key, value = ArraySpec((2, 2, 4, 11), "float32"), ArraySpec((2, 2, 4, 13), "float32")
    new = ArraySpec((2, 3, 24), "float32")
    want = check_decode_inputs(DIMS, "float32", new, cache_key=key, cache_value=value,
                               position=4, max_len=9)
    assert (want.L, want.S, want.offset, want.causal_alignment) == (3, 7, 4, "bottom_right")
    with pytest.warns(DeprecationWarning, match="check_decode_inputs"):
        got = check_decode_inputs(DIMS, "float32", new.shape, "float32", cache_batch=2,
                                  position=4, max_len=9)
    assert got == want
    with pytest.warns(DeprecationWarning), pytest.raises(AttentionError) as info:
        check_decode_inputs(DIMS, "float32", new.shape, "float32", cache_batch=2, position=7,
                            max_len=9)
    assert info.value.code == "cache_overflow"


def test_the_module_checks_are_also_in_attention_spec_modules() -> None:
    """PORTING.md imports them from there; they live in modules, weights and cache."""
    import attention_spec.modules as modules

    for name in ("check_module_config", "check_canonical", "check_module_inputs",
                 "check_cache_size", "check_decode_inputs", "module_dtype"):
        assert getattr(modules, name) is getattr(attention_spec, name)
