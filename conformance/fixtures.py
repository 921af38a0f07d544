"""Reading and writing the golden fixtures: safetensors files and the JSON manifest.

A fixture folder (``conformance/fixtures/v1/``) holds one ``<case id>.safetensors`` file per
value case and one ``manifest.json`` describing every case (error cases live in the manifest
only: they have no tensors). Everything here is NumPy plus the ``safetensors`` package, so any
port, in any framework, can read the same files.

Low-precision tensors are stored in their real dtype: safetensors' ``F16``, ``BF16``, and the
fp8 formats' ``F8_E4M3`` and ``F8_E5M2`` (their bytes; NumPy spells bfloat16 and the fp8
formats through ``ml_dtypes``). ``safetensors.numpy`` writes BF16 but cannot
read it back, so :func:`read_tensors` decodes the raw bytes itself.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

__all__ = [
    "ARRAY_KEYWORDS",
    "FIXTURES_DIR",
    "KEYWORD_GROUPS",
    "NP_DTYPES",
    "Case",
    "Manifest",
    "decode_keywords",
    "encode_keywords",
    "load_manifest",
    "read_tensors",
    "sha256_of",
    "tensor_bytes",
]

#: The optional array arguments of the attention functions, stored in a fixture when a case
#: gives them: v1's mask and bias, v2's segment ids, sinks and ALiBi slopes.
ARRAY_KEYWORDS = ("mask", "bias", "q_segment_ids", "kv_segment_ids", "sinks", "alibi_slopes",
                  "q_descale", "k_descale", "v_descale")
# The contract v2 keywords and the case family (``sdpa.<family>.*``) that pins each.
KEYWORD_GROUPS = {
    "window": "window",
    "q_segment_ids": "segments",
    "kv_segment_ids": "segments",
    "sinks": "sinks",
    "alibi_slopes": "alibi",
    "q_descale": "fp8",  # contract v3's fp8 descales: the sdpa.fp8.* family
    "k_descale": "fp8",
    "v_descale": "fp8",
}

#: The committed fixtures of this version of the contract.
FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures" / "v1"

#: dtype names used in the manifest -> NumPy dtypes.
NP_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "bool": np.dtype(bool),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),  # contract v3: stored as their bytes
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}

#: safetensors dtype codes -> NumPy dtypes (the subset the fixtures use).
_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BOOL": np.dtype(bool),
    "I32": np.dtype(np.int32),
    "I8": np.dtype(np.int8),
    "I64": np.dtype(np.int64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


def tensor_bytes(tensors: dict[str, np.ndarray], case_id: str) -> bytes:
    """Serialize ``tensors`` to safetensors bytes; deterministic for equal input.

    The header lists tensors by dtype alignment then name (safetensors' own order), and the
    only metadata is the case id, so the bytes depend on nothing but the arrays.
    """
    contiguous = {name: a if a.flags.c_contiguous else a.copy() for name, a in tensors.items()}
    return safetensors.numpy.save(contiguous, metadata={"case": case_id})


def read_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Decode safetensors bytes into NumPy arrays, bfloat16 included (read-only views)."""
    out = {}
    for name, info in safetensors.deserialize(data):
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        out[name] = np.frombuffer(bytes(info["data"]), dtype=dtype).reshape(info["shape"])
    return out


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# JSON has no inf or NaN; keywords that hold them (error cases: scale=inf) are tagged.
def encode_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """Keywords as strict JSON: a non-finite float becomes ``{"float": "inf"}``."""

    def enc(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return {"float": repr(x)}  # 'inf', '-inf', 'nan'
        return x

    return {k: enc(v) for k, v in keywords.items()}


def decode_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`encode_keywords`."""

    def dec(x: Any) -> Any:
        if isinstance(x, dict) and set(x) == {"float"}:
            return float(x["float"])
        if isinstance(x, list):  # JSON has no tuples: window=(left, right) comes back a pair
            return tuple(dec(item) for item in x)
        return x

    return {k: dec(v) for k, v in keywords.items()}


@dataclass
class Case:
    """One manifest entry.

    ``kind`` is ``"values"`` (tensors in ``file``: the inputs ``inputs`` names, a module's
    canonical ``weights``, and the goldens) or ``"error"`` (the inputs are shapes and dtypes in
    ``inputs``; ``expected_error`` is the class name and code). conformance/FORMAT.md describes
    every field.
    ``functions`` lists the port functions the case is run against, by short name
    (``sdpa``, ``weights``, ``flash``, ``causal_mask``).
    """

    entry: dict[str, Any]
    folder: Path
    _tensors: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return self.entry["id"]

    @property
    def op(self) -> str:
        return self.entry["op"]

    @property
    def feature(self) -> str:
        return self.entry["feature"]

    @property
    def kind(self) -> str:
        return self.entry["kind"]

    @property
    def dtype(self) -> str:
        return self.entry["dtype"]

    @property
    def contract(self) -> str:
        """The contract version the case pins: ``"v1"``, ``"v2"`` or ``"v3"`` (FORMAT.md)."""
        return self.entry["contract"]

    @property
    def functions(self) -> list[str]:
        return list(self.entry["functions"])

    @property
    def keywords(self) -> dict[str, Any]:
        return decode_keywords(self.entry["keywords"])

    @property
    def tolerance(self) -> dict[str, float]:
        return dict(self.entry.get("tolerance", {}))

    @property
    def kernel_tolerance(self) -> dict[str, float]:
        """The kernels' bound (an fp8 case's ``kernel_tolerance``; FORMAT.md): used instead of
        :attr:`tolerance` for a port that declares ``KERNEL_TOLERANCE = True``."""
        return dict(self.entry.get("kernel_tolerance", {}))

    @property
    def result_dtype(self) -> str:
        """The dtype of the results (``result_dtype``: bfloat16 for an fp8 query), else the
        case's dtype."""
        return self.entry.get("result_dtype", self.entry["dtype"])

    @property
    def n_elements(self) -> int:
        return sum(math.prod(s) for s in self.entry.get("shapes", {}).values())

    def tensors(self) -> dict[str, np.ndarray]:
        """The case's arrays (inputs and goldens), read once and checked against the sha256."""
        if self._tensors is None:
            data = (self.folder / self.entry["file"]).read_bytes()
            if sha256_of(data) != self.entry["sha256"]:
                raise RuntimeError(f"{self.entry['file']}: sha256 differs from the manifest")
            self._tensors = read_tensors(data)
        return self._tensors


@dataclass
class Manifest:
    """The parsed ``manifest.json`` of one fixture folder."""

    data: dict[str, Any]
    folder: Path
    cases: list[Case]

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}


_CACHE: dict[Path, Manifest] = {}


def load_manifest(folder: str | Path | None = None) -> Manifest:
    """Load (once per process) the manifest of ``folder`` (default: the committed v1 fixtures)."""
    folder = Path(folder or FIXTURES_DIR).resolve()
    if folder not in _CACHE:
        data = json.loads((folder / "manifest.json").read_text())
        cases = [Case(entry, folder) for entry in data["cases"]]
        _CACHE[folder] = Manifest(data, folder, cases)
    return _CACHE[folder]
