"""The runner's sharded rows: which fixtures run with which n, how a JAX port gets its devices
and a torch port its processes, and what a port without sharded functions sees (nothing)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

import impl_numpy
from attention_spec import DimensionMismatchError
from conformance.__main__ import main
from conformance.runner import (
    DEFAULT_SHARDS,
    SHARDED_ALIASES,
    _child_env,
    load_port,
    plan_runs,
    run_suite,
    runs_for,
)


def _sizes(run) -> tuple[int, int, int]:
    q, k = run.case.entry["shapes"]["query"], run.case.entry["shapes"]["key"]
    return q[-2], k[-2], k[-3]


def test_sharded_runs_carry_n_and_run_only_where_n_fits() -> None:
    runs = runs_for(functions=SHARDED_ALIASES, shards=(2, 3, 4))
    assert DEFAULT_SHARDS == (2, 4)
    by_alias: dict[str, list] = {a: [r for r in runs if r.function == a] for a in SHARDED_ALIASES}
    assert all(by_alias.values())
    for run in runs:
        if run.case.kind == "error":  # its own n_shards and layout, run once
            assert run.shards is None and run.case.op == "ring"
            assert run.id == f"{run.function}.error.{run.case.entry['variant']}.float32"
            continue
        n = run.shards
        assert run.id.startswith(f"{run.function}.n{n}.")
        if run.function == "head_parallel_gqa":
            module = run.case.entry["module"]
            assert module.get("n_kv_heads", module["n_heads"]) % n == 0
            continue
        L, S, K = _sizes(run)
        if run.function == "ring":
            assert L % n == 0 and S % n == 0
        elif run.function == "ring_zigzag":
            assert L % (2 * n) == 0 and S % (2 * n) == 0
        elif run.function == "ulysses":
            H = run.case.entry["shapes"]["query"][-3]
            assert H % n == 0 and L % n == 0 and S % n == 0 and (K % n == 0 or n % K == 0)
        elif run.function == "usp":  # u = 2, r = n / 2, zigzag: 2 u r = 2n chunks
            H = run.case.entry["shapes"]["query"][-3]
            assert n >= 4 and H % 2 == 0 and (K % 2 == 0 or K == 1)
            assert L % (2 * n) == 0 and S % (2 * n) == 0
        else:
            assert K % n == 0
    ids = {r.id for r in runs}
    assert "ring.n4.causal.top_left.l64_s64.float32" in ids  # a ring fixture, n = 4
    assert "ring_zigzag.n4.causal.top_left.l64_s64.float32" in ids  # 8 chunks of 8 rows
    assert "head_parallel.n3.gqa.h6_k3.float32" in ids  # an sdpa fixture with K = 3
    assert "head_parallel.n2.gqa.h6_k3.float32" not in ids  # 2 does not divide K = 3
    assert "ring.n2.gqa.h6_k2.float32" not in ids  # L = 5, S = 7: no ring fits it
    assert "head_parallel_gqa.n2.gqa.h6_k2.float32" in ids  # a module fixture
    assert {r.id for r in runs if r.case.kind == "error"} >= {
        "ring.error.length_not_divisible.float32",
        "ring_zigzag.error.length_not_divisible_zigzag.float32",
        "head_parallel.error.kv_heads_not_divisible.float32",
        "ring.error.unknown_layout.float32",
    }


def test_a_port_without_sharded_functions_plans_no_sharded_runs() -> None:
    port = load_port(
        SimpleNamespace(
            __name__="sdpa_only",
            scaled_dot_product_attention=impl_numpy.scaled_dot_product_attention,
        )
    )
    assert not [r for r in plan_runs(port) if r.function in SHARDED_ALIASES]
    # asked for, a missing sharded function fails as not implemented
    report = run_suite(port, functions=["ring"], pattern="ring.n2.causal.top_left.l64_s64.*")
    assert report.outcomes and all(o.status == "fail" for o in report.outcomes)
    assert report.outcomes[0].message == "not implemented: port has no `ring_attention`"


def test_the_sharded_functions_are_found_in_the_ports_sharded_submodule() -> None:
    port = load_port("impl_numpy")
    assert port.function("ring") is impl_numpy.sharded.ring_attention
    assert set(SHARDED_ALIASES) <= {r.function for r in plan_runs(port)}


def test_cli_shards_and_list(capsys) -> None:
    argv = ["--impl", "impl_numpy", "--function", "ring", "--function", "ring_zigzag"]
    assert not main([*argv, "--shards", "8", "--list"])
    ids = capsys.readouterr().out.split()
    assert "ring.n8.causal.top_left.l64_s64.float32" in ids
    assert "ring_zigzag.n8.causal.top_left.l64_s64.float32" in ids  # 16 chunks of 4 rows
    assert "ring.n2.segments.with_window.float32" not in ids  # only the n asked for
    assert not [i for i in ids if ".n2." in i or ".n4." in i]


def test_a_worker_is_given_jax_devices_for_the_largest_shard_count(monkeypatch) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert "XLA_FLAGS" not in _child_env()
    assert _child_env(4)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert _child_env(8)["XLA_FLAGS"].split() == [
        "--xla_cpu_enable_fast_math=false",
        "--xla_force_host_platform_device_count=8",
    ]
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # the user's
    assert _child_env(8)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_jax_in_a_process_with_one_device_skips_with_the_reason() -> None:
    """Here (pytest) JAX started with one CPU device: the sharded run says how to get more and
    is skipped, not failed; an error run still runs (validation comes before the devices)."""
    import jax

    if len(jax.devices()) >= 2:
        pytest.skip("this process has several JAX devices")
    report = run_suite(
        "impl_jax", functions=["ring"], pattern="ring.*.causal.top_left.l64_s64.float32"
    )
    (outcome, *_) = report.outcomes
    assert outcome.status == "skip" and report.ok
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=2" in outcome.message
    errors = run_suite("impl_jax", functions=["ring"], pattern="ring.error.*")
    assert errors.ok and {o.status for o in errors.outcomes} == {"pass"}


@pytest.mark.slow
def test_jax_through_the_cli_worker_runs_on_simulated_devices() -> None:
    """``python -m conformance`` (isolated): the worker's XLA_FLAGS give JAX 4 CPU devices."""
    report = run_suite(
        "impl_jax",
        functions=["ring_zigzag"],
        pattern="ring_zigzag.n4.causal.top_left.l64_s64.float32",
        isolate=True,
    )
    assert [(o.run_id, o.status) for o in report.outcomes] == [
        ("ring_zigzag.n4.causal.top_left.l64_s64.float32", "pass")
    ], report.table()


def test_torch_runs_each_sharded_call_on_n_forked_gloo_processes() -> None:
    chosen = {
        "ring.n2.causal.bottom_right.l64_s96.float64",
        "ring_zigzag.n4.garbage.padding.l32_s64.bfloat16",
        "head_parallel.n2.mask_broadcast.hls.float32",
        "head_parallel_gqa.n2.gqa.h6_k2.float32",
        "ring.error.length_not_divisible.float32",
        "ulysses.n4.ulysses.gqa.h8_k1.causal.l32_s32.float64",
        "usp.n4.ulysses.gqa.h8_k2.head_mask.sinks.alibi.l32_s48.float64",  # 2 x 2 ranks
        "usp.error.usp_without_group_sizes.float32",  # no sizes: refused before any fork
    }
    report = run_suite("impl_torch", functions=SHARDED_ALIASES, select=lambda r: r.id in chosen)
    assert {o.run_id for o in report.outcomes} == chosen
    assert report.ok and {o.status for o in report.outcomes} == {"pass"}, report.table()


def test_torch_usp_with_its_ring_inside_the_ulysses_group_is_caught() -> None:
    """The broken port ``usp_ring_inside_group`` of sharded_broken.py in torch: every rank's
    ring is its own Ulysses group (u == r == 2 here), whose members hold different heads of the
    same positions. The forked ranks inherit the patch; the run fails on its values."""
    import torch.distributed as dist

    import impl_torch.ulysses as torch_ulysses

    made = torch_ulysses._usp_groups

    def ring_inside_group(u, r, group):  # ring j: this rank's Ulysses group, not member j's
        ulysses, _ = made(u, r, group)
        return ulysses, [ulysses[dist.get_rank() // u]] * u

    run_id = "usp.n4.causal.top_left.l64_s64.float64"
    with mock.patch.object(torch_ulysses, "_usp_groups", ring_inside_group):
        report = run_suite("impl_torch", functions=["usp"], select=lambda r: r.id == run_id)
    assert [(o.run_id, o.status) for o in report.outcomes] == [(run_id, "fail")], report.table()
    assert report.outcomes[0].message.startswith("output max error"), report.outcomes[0].message


def test_torch_ranks_must_agree_and_their_errors_come_back() -> None:
    import torch
    import torch.distributed as dist

    from conformance.ports.torch_adapter import RankError, on_ranks

    def per_rank(x, *, n_shards):  # a broken port: each rank returns its own rank
        return x + dist.get_rank()

    with pytest.raises(RankError, match="rank 1 returned another output than rank 0"):
        on_ranks(per_rank)(torch.zeros(3), n_shards=2)

    def refuses(x, *, n_shards):
        raise DimensionMismatchError("length_not_divisible", "no", expected="a", actual="b")

    with pytest.raises(DimensionMismatchError) as info:
        on_ranks(refuses)(torch.zeros(3), n_shards=2)
    assert info.value.code == "length_not_divisible" and info.value.expected == "a"

    def fails(x, *, n_shards):
        return x[7]

    with pytest.raises(RankError, match=r"rank 0: IndexError: .* \(at test_sharded_runner\.py"):
        on_ranks(fails)(torch.zeros(3), n_shards=2)
    same = on_ranks(lambda x, *, n_shards: x * n_shards)(torch.ones(2), n_shards=4)
    np.testing.assert_array_equal(same.numpy(), [4.0, 4.0])
