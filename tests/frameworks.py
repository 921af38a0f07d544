"""The three implementations behind one small adapter each, for tests that run all three.

Test inputs are made in NumPy (float64, then rounded to the case's dtype) and handed to each
framework exactly; results come back as NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)  # float64 is one of the four dtypes

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import impl_jax  # noqa: E402
import impl_numpy  # noqa: E402
import impl_torch  # noqa: E402
from attention_spec import AttentionError  # noqa: E402
from conformance.oracle import NOISE_FLOOR, assert_within  # noqa: E402

DTYPES = ("float64", "float32", "float16", "bfloat16")
NP_DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "bool": np.dtype(bool),
}
TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _torch_from_numpy(a: Any) -> Any:
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:  # torch.from_numpy has no bfloat16; the cast is exact
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    # a copy, not np.ascontiguousarray, which makes a 0-d array 1-d (a scalar bias)
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy())


def _torch_to_numpy(t: Any) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


@dataclass(frozen=True)
class Framework:
    name: str
    module: ModuleType
    asarray: Callable[[Any], Any]
    to_numpy: Callable[[Any], np.ndarray]

    def sdpa(self, q, k, v, **kw) -> np.ndarray:
        """The implementation's scaled_dot_product_attention on NumPy inputs and keywords."""
        args = [None if x is None else self.asarray(x) for x in (q, k, v)]
        return self.to_numpy(self.module.scaled_dot_product_attention(*args, **self._kw(kw)))

    def flash(self, q, k, v, **kw) -> np.ndarray:
        """The implementation's tiled flash_attention on NumPy inputs and keywords (block_q,
        block_k among them)."""
        args = [None if x is None else self.asarray(x) for x in (q, k, v)]
        return self.to_numpy(self.module.flash_attention(*args, **self._kw(kw)))

    def weights(self, q, k, **kw) -> np.ndarray:
        args = [self.asarray(x) for x in (q, k)]
        return self.to_numpy(self.module.attention_weights(*args, **self._kw(kw)))

    def _kw(self, kw: dict) -> dict:
        return {n: self.asarray(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}


#: How far two of the three implementations (or a package's plain and tiled paths) may differ on
#: one call, absolutely: not a tolerance against the oracle (that is
#: ``conformance.oracle.assert_within``). A second table, not the rule, because no plain
#: same-dtype computation of the call is at hand for the rule's first term. All three compute in
#: float32 (float64 for float64) and round once at the end, so they may differ by reassociation
#: plus, for half types, one rounding step of the output. So float64 is the rule's floor (and
#: :func:`assert_agree` applies the rule itself there), a half type twice its floor (one ulp of
#: an output below 4: 2**-9 and 2**-6), and float32 a measured 1e-5 (the three packages'
#: reassociation over the property tests' shapes, 5 floors; two results each within the rule's
#: 2 x plain's error + the floor of the oracle may differ about as much).
AGREE = {
    "float64": NOISE_FLOOR["float64"],
    "float32": 1e-5,
    "float16": 2 * NOISE_FLOOR["float16"],
    "bfloat16": 2 * NOISE_FLOOR["bfloat16"],
}


def assert_agree(got: Any, want: Any, dtype: str, *, what: str = "") -> None:
    """Two implementations' results for one call (or two paths of one package): float64 under the
    tolerance rule, the other's float64 result as the golden (``oracle.assert_within``); a
    rounded dtype within :data:`AGREE`."""
    if dtype == "float64":
        assert_within(got, want, dtype, what=what)
    else:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        np.testing.assert_allclose(got, want, rtol=0, atol=AGREE[dtype], err_msg=what)


FRAMEWORKS = {
    "numpy": Framework("numpy", impl_numpy, np.asarray, np.asarray),
    "torch": Framework("torch", impl_torch, _torch_from_numpy, _torch_to_numpy),
    "jax": Framework("jax", impl_jax, jnp.asarray, np.asarray),
}


def random_qkv(rng: np.random.Generator, batch, H, K, L, S, D, E, dtype="float64"):
    """query (*batch, H, L, D), key (*batch, K, S, D), value (*batch, K, S, E), rounded to dtype."""
    dt = NP_DTYPES[dtype]
    q = rng.standard_normal((*batch, H, L, D)).astype(dt)
    k = rng.standard_normal((*batch, K, S, D)).astype(dt)
    v = rng.standard_normal((*batch, K, S, E)).astype(dt)
    return q, k, v


def same_error(
    call: Callable[[Any], object],
    cls: type[AttentionError] | None = None,
    code: str | None = None,
    fragment: str | None = None,
    *,
    frameworks: Mapping[str, Any] = FRAMEWORKS,
) -> AttentionError:
    """``call(fw)`` raises the same error for each of ``frameworks`` (NumPy, PyTorch and JAX, as
    :data:`FRAMEWORKS` or ``tests.module_frameworks.MODULE_FRAMEWORKS``): an AttentionError with
    one class, ``code``, message, ``expected`` and ``actual`` in all of them. The class ``cls``
    (exactly), the ``code`` and a ``fragment`` of the message, when given, are asserted too.
    Returns the error."""
    errors = {}
    for name, fw in frameworks.items():
        with pytest.raises(AttentionError) as info:
            call(fw)
        errors[name] = info.value
    fields = {
        name: (type(err), err.code, str(err), err.expected, err.actual)
        for name, err in errors.items()
    }
    assert len(set(fields.values())) == 1, f"the frameworks raised differently: {fields}"
    err = next(iter(errors.values()))
    assert cls is None or type(err) is cls, (cls, err)
    assert code is None or err.code == code, (code, err)
    assert fragment is None or fragment in str(err), (fragment, err)
    return err
