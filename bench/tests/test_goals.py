"""Goals timed interleaved (bench/goals.py, BenchSession.run_goal): the per-round ratio is
immune to the machine's speed drifting during the measurement, and a goal is met or missed
only when the spread allows it."""

from __future__ import annotations

import statistics

import pytest

from bench import goals
from bench.gate import GateCache
from bench.plan import Case, Plan
from bench.rows import Goal, row_by_name
from bench.session import BenchSession
from bench.workloads import Workload

from .helpers import B, D, E, H, K, L, S, machine, stub


class DriftingMachine:
    """A fake clock and two calls: A costs 2 units of work, B 1, and the machine slows down
    with every call (each unit of work costs more than the last), as a busy machine does."""

    def __init__(self):
        self.now = 0.0
        self.speed = 1.0
        self.order: list[str] = []

    def clock(self) -> float:
        return self.now

    def call(self, name: str, work: float):
        def run():
            self.order.append(name)
            self.now += work * self.speed
            self.speed *= 1.02  # 2% slower after every call

        return run


def test_interleaved_ratio_stays_true_while_the_machine_drifts():
    m = DriftingMachine()
    t = goals.interleave(m.call("A", 2.0), m.call("B", 1.0), rounds=8, min_sample_s=0.0,
                         clock=m.clock)
    assert m.order[:4] == ["A", "B", "A", "B"]  # warm-up A B, then the sizing calls A B
    rounds = m.order[4:]
    assert rounds[:4] == ["A", "B", "B", "A"] and rounds[4:8] == ["A", "B", "B", "A"]  # ABBA
    s = t.summary()
    assert s["rounds"] == 8 and len(s["ratios"]) == 8
    assert s["ratio"]["median"] == pytest.approx(2.0, rel=0.025)  # true ratio 2, drift 2%/call
    # timed apart (all of A, then all of B) the same machine would report far from 2
    assert t.a_s[-1] / t.b_s[0] > 2.5
    assert s["ratio"]["min"] <= s["ratio"]["q1"] <= s["ratio"]["median"] <= s["ratio"]["q3"]


def test_samples_repeat_a_fast_call_until_it_is_long_enough():
    m = DriftingMachine()
    m.speed = 1e-4  # 0.1 ms per unit
    t = goals.interleave(m.call("A", 1.0), m.call("B", 1.0), rounds=3, min_sample_s=0.005,
                         clock=m.clock)
    assert t.inner >= 40 and t.summary()["rounds"] == goals.MIN_ROUNDS  # at least 5 rounds


def test_slow_calls_are_sized_by_their_warm_up_alone():
    """Calls that take SURE times the shortest sample in their warm-up are one call a sample:
    no second, sizing call each (seconds saved per goal at L = S = 2048); a fast pair still
    gets its sizing calls after the warm-up."""
    m = DriftingMachine()
    m.speed = goals.SURE * 0.005  # one unit: SURE samples of 5 ms
    t = goals.interleave(m.call("A", 2.0), m.call("B", 1.0), rounds=5, min_sample_s=0.005,
                         clock=m.clock)
    assert t.inner == 1 and m.order[:2] == ["A", "B"]
    assert m.order[2:6] == ["A", "B", "B", "A"] and len(m.order) == 2 + 2 * 5  # rounds only
    m = DriftingMachine()
    m.speed = 0.9 * goals.SURE * 0.005  # just short of it: warm-up, sizing, rounds
    goals.interleave(m.call("A", 1.0), m.call("B", 1.0), rounds=5, min_sample_s=0.005,
                     clock=m.clock)
    assert len(m.order) == 4 + 2 * 5


def test_a_slow_pair_stops_starting_rounds_past_its_time_budget():
    """A round costs about 3 units here: no round starts past max_s, but never fewer than 5."""

    def rounds(max_s):
        m = DriftingMachine()
        t = goals.interleave(m.call("A", 2.0), m.call("B", 1.0), rounds=9, min_sample_s=0.0,
                             max_s=max_s, clock=m.clock)
        return len(t.a_s)

    assert rounds(None) == rounds(100.0) == 9
    assert rounds(20.0) == 6  # five rounds end at ~17, the sixth starts before 20
    assert rounds(1.0) == goals.MIN_ROUNDS


def test_each_sample_starts_after_the_pause_and_the_pauses_stay_out_of_the_budget():
    """settle_s: a pause before each sample of the rounds (not before the warm-up and sizing
    calls), recorded in the summary; a round budget counts the calls' time, not the pauses'."""

    def run(settle_s, max_s=None):
        m = DriftingMachine()

        def sleep(s):
            m.order.append("pause")
            m.now += s

        t = goals.interleave(m.call("A", 2.0), m.call("B", 1.0), rounds=9, min_sample_s=0.0,
                             max_s=max_s, settle_s=settle_s, clock=m.clock,
                             sleep=sleep)
        return m.order, t

    order, t = run(100.0)
    assert order[:4] == ["A", "B", "A", "B"]  # warm-up and sizing: no pause
    assert order[4:12] == ["pause", "A", "pause", "B", "pause", "B", "pause", "A"]
    assert order.count("pause") == 2 * 9 and t.summary()["settle_s"] == 100.0
    assert t.summary()["ratio"]["median"] == pytest.approx(2.0, rel=0.025)  # pauses untimed
    assert "pause" not in run(0.0)[0] and run(0.0)[1].summary()["settle_s"] == 0.0
    # the same budget stops at the same round with or without 100-unit pauses (test above: 6)
    assert len(run(100.0, max_s=20.0)[1].a_s) == len(run(0.0, max_s=20.0)[1].a_s) == 6


def test_only_a_goal_across_two_frameworks_pauses(monkeypatch):
    """numpy sdpa against torch F.sdpa pauses before each sample (two thread pools), numpy
    sdpa against numpy flash does not."""
    from bench import session as session_mod

    asked = []
    real = goals.interleave

    def interleave(*args, settle_s, **kw):  # records the pause asked, times without it
        asked.append(settle_s)
        return real(*args, **kw)

    monkeypatch.setattr(session_mod.goals, "interleave", interleave)
    w = Workload("attention", B, H, K, L, S, D, E)
    qc, _ = stub(True, 8)
    for other in ("torch F.sdpa", "numpy flash"):
        a, b = row_by_name("numpy sdpa"), row_by_name(other)
        case = Case("goal|z", "goal", "numpy", "cpu", a, w, goal=Goal("ratio", 1000.0, other),
                    pair=((a, w, "cpu"), (b, w, "cpu")))
        plan = Plan(machine("cpu"), "test", [w], (a, b), goal_cases=[case], goal_sample_s=0.0001,
                    goal_settle_s=0.25)
        session = BenchSession(plan, gates=GateCache(quick_check=qc))
        session.run_goal(case)
    assert asked == [0.25, 0.0]


def test_a_goal_is_met_only_when_its_whole_iqr_is():
    assert goals.decide("ratio", 2.5, 2.1, 2.4) == "met"
    assert goals.decide("ratio", 2.5, 2.4, 2.6) == "unclear"
    assert goals.decide("ratio", 2.5, 2.6, 3.4) == "missed"
    assert goals.decide("ratio", 2.5, 2.5, 2.5) == "met"
    assert goals.decide("faster", 1.0, 0.9, 1.0) == "unclear"  # faster: strictly below
    assert goals.decide("causal", 0.6, 0.45, 0.55) == "met"
    assert goals.spread([3.0, 1.0, 2.0, 5.0, 4.0]) == {
        "min": 1.0, "q1": 2.0, "median": 3.0, "q3": 4.0, "max": 5.0,
    }


def test_run_goal_gates_both_calls_and_records_the_ratios():
    """A goal case between two real NumPy rows on a small workload: both gated once, timed
    interleaved, recorded with the per-round ratios, their spread and a decision."""
    a, b = row_by_name("numpy sdpa"), row_by_name("numpy flash")
    w = Workload("attention", B, H, K, L, S, D, E)
    qc, calls = stub(True, 8)
    goal = Goal("ratio", 1000.0, "numpy flash")
    case = Case("goal|x", "goal", "numpy", "cpu", a, w, goal=goal,
                pair=((a, w, "cpu"), (b, w, "cpu")))
    plan = Plan(machine("cpu"), "test", [w], (a, b), goal_cases=[case], goal_rounds=6,
                goal_sample_s=0.0001)
    session = BenchSession(plan, gates=GateCache(quick_check=qc))
    session.run_goal(case)
    rec = session.records["goal|x"]
    assert rec.status == "ok" and rec.kind == "goal"
    g = rec.goal
    assert (g["a"]["row"], g["b"]["row"], g["rounds"]) == ("numpy sdpa", "numpy flash", 6)
    assert len(g["ratios"]) == 6 and g["status"] == "met"  # any ratio is <= 1000
    assert g["ratio"]["median"] == pytest.approx(statistics.median(g["ratios"]))
    assert sorted(c[2] for c in calls) == ["flash", "sdpa"]  # each row's own gate, once
    assert 0 < rec.wall_s < 60  # the case's own seconds, for the report's "time:" line


def test_a_goal_whose_row_fails_its_gate_is_not_timed():
    a, b = row_by_name("numpy sdpa"), row_by_name("torch F.sdpa")
    w = Workload("attention", B, H, K, L, S, D, E)
    qc, _ = stub(False, 8, ["FAIL sdpa.x: wrong"])
    case = Case("goal|y", "goal", "numpy", "cpu", a, w, goal=Goal("ratio", 2.5, b.name),
                pair=((a, w, "cpu"), (b, w, "cpu")))
    plan = Plan(machine("cpu"), "test", [w], (a, b), goal_cases=[case])
    session = BenchSession(plan, gates=GateCache(quick_check=qc))
    with pytest.raises(pytest.skip.Exception, match="correctness gate"):
        session.run_goal(case)
    rec = session.records["goal|y"]
    assert rec.status == "failed" and "numpy sdpa" in rec.reason and "ratios" not in rec.goal


def test_a_memory_goal_measures_both_paths_once_and_decides_on_bytes():
    """The memory goal of a tiled training step: the row's peak extra bytes (one call) against
    the limit, the plain path's beside it; a plain path that cannot fit is named, not run."""
    a, b = row_by_name("numpy flash train"), row_by_name("numpy sdpa train")
    w = Workload("train", 1, H, K, 768, 768, D, E)  # longer than a block of either path
    qc, calls = stub(True, 8)

    def run(limit, budget=None):
        goal = Goal("memory", limit, b.name, op="train")
        case = Case("goal|m", "goal", "numpy", "cpu", a, w, goal=goal,
                    pair=((a, w, "cpu"), (b, w, "cpu")))
        plan = Plan(machine("cpu", memory=budget), "test", [w], (a, b), goal_cases=[case])
        s = BenchSession(plan, gates=GateCache(quick_check=qc))
        s.run_goal(case)
        return s.records["goal|m"].goal

    g = run(2**30)
    assert g["status"] == "met" and 0 < g["a_peak_bytes"] < g["b_peak_bytes"]
    assert g["b_peak_bytes"] > w.B * w.H * w.L * w.S * 4  # the plain path holds the scores
    assert g["a_memory_method"] == "tracemalloc - O, grads"
    assert run(1024)["status"] == "missed"  # a tiled step needs more than 1 KiB
    small = run(2**30, budget=2 * w.input_bytes())  # the plain path's scores would not fit
    assert small["b_peak_bytes"] is None and "not run: needs" in small["b_memory_method"]
    assert small["status"] == "met"
    assert sorted({c[2] for c in calls}) == ["flash_grad", "grad"]
