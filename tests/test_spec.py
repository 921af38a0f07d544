"""attention_spec on its own: the framework-free rules."""

import pickle

import pytest

from attention_spec import (
    ArraySpec,
    ConfigError,
    DimensionMismatchError,
    broadcast_shapes,
    causal_offset,
    check_attention,
)


def test_imports_no_array_framework():
    import subprocess
    import sys

    code = (
        "import sys, attention_spec; "
        "print(sorted(m for m in ('numpy', 'torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("L", "S", "alignment", "offset"),
    [
        (3, 5, "top_left", 0),
        (3, 5, "bottom_right", 2),
        (5, 3, "bottom_right", -2),
        (4, 4, "bottom_right", 0),
    ],
)
def test_causal_offset(L, S, alignment, offset):
    assert causal_offset(L, S, alignment) == offset


def test_broadcast_shapes():
    assert broadcast_shapes((2, 1), (3,), ()) == (2, 3)
    assert broadcast_shapes((2,), (3,)) is None
    assert broadcast_shapes() == ()


def test_dims_and_default_scale():
    dims = check_attention(
        ArraySpec((2, 6, 5, 16), "float32"),
        ArraySpec((1, 2, 7, 16), "float32"),
        ArraySpec((2, 7, 13), "float32"),
    )
    assert (dims.batch, dims.H, dims.K, dims.G, dims.L, dims.S, dims.D, dims.E) == (
        (2,),
        6,
        2,
        3,
        5,
        7,
        16,
        13,
    )
    assert (
        dims.scale == 0.25
        and dims.scores_shape == (2, 6, 5, 7)
        and dims.output_shape == (2, 6, 5, 13)
    )
    q, k = ArraySpec((6, 5, 16), "float32"), ArraySpec((2, 7, 16), "float32")
    assert check_attention(q, k, scale=-3).scale == -3.0


def test_errors_pickle_with_their_code():
    err = DimensionMismatchError(
        "heads_not_divisible", "key heads (K=3) must divide query heads (H=8)"
    )
    again = pickle.loads(pickle.dumps(err))
    assert (
        type(again) is DimensionMismatchError and again.code == err.code and str(again) == str(err)
    )


def test_bool_is_not_a_scale():
    with pytest.raises(ConfigError):
        one = ArraySpec((1, 1, 1), "float32")
        check_attention(one, one, scale=True)
