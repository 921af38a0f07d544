"""pytest options for running ``bench/bench_attention.py`` directly (``python -m bench`` passes
its own session and these options are then unused)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory to torch too

import pytest

from bench.session import SESSION_KEY


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rosetta-bench")
    group.addoption("--bench-device", default="auto", help="auto | cpu | cuda | tpu")
    group.addoption("--bench-grid", default="quick", help="quick | full")
    group.addoption("--bench-rows", default="", help="comma-separated substrings of row names")
    group.addoption("--bench-skip-gate", action="store_true", help="time ungated rows")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if SESSION_KEY in config.stash:  # python -m bench registered its session already
        return
    from bench.__main__ import make_session

    session = make_session(
        config.getoption("--bench-device"),
        config.getoption("--bench-grid"),
        rows=config.getoption("--bench-rows"),
        skip_gate=config.getoption("--bench-skip-gate"),
    )
    config.pluginmanager.register(session, "rosetta-bench-session")
    config.stash[SESSION_KEY] = session
