"""Options for running ``bench/bench_attention.py`` under plain pytest (``python -m bench``
passes its own session and these options are then unused). Options only: this file is also
loaded when pytest collects ``bench/tests``, so it changes nothing else."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rosetta-bench")
    group.addoption("--bench-device", default="auto", help="auto | cpu | cuda | tpu")
    group.addoption("--bench-grid", default="quick", help="quick | full | small | smoke")
    group.addoption("--bench-rows", default="", help="comma-separated substrings of row names")
    group.addoption("--bench-skip-gate", action="store_true", help="time ungated rows")
