"""Performance goals a reader can trust: each goal's two calls timed interleaved, in one process.

A goal compares two calls: a row and its reference kernel on the goal's workload, or one row's
causal and non-causal runs. In the table those are rows timed minutes apart, and on a shared
machine that measures the machine as much as the code: the same quick grid run twice an hour
apart gave numpy sdpa 2.41x then 3.40x torch's fused kernel, whose own median moved from 69.6
to 56.8 ms. So each goal is measured on its own (:func:`interleave`):

1. both calls are prepared and warmed up (one untimed call each, plus one that sizes the
   samples; when both warm-up calls already took :data:`SURE` times the shortest sample, the
   sample is one call and that second call is saved: a steady call ten times faster than its
   first is not what these rows do, and a goal at L = S = 2048 saves seconds);
2. a sample is ``inner`` back-to-back calls, ``inner`` chosen so that the faster call's sample
   lasts at least ``min_sample_s`` (timer resolution and call overhead out of the way);
3. each round times one sample of A and one of B, in the order A B, then B A the next round
   (ABBA: a steady drift in the machine's speed cancels instead of biasing one side), and
   records the round's ratio A / B;
4. when the two calls are different frameworks' (NumPy against torch's fused kernel), each
   sample starts after a pause of ``settle_s`` (:data:`SETTLE_S`): a thread pool the other call
   left spinning (OpenBLAS's idle threads busy-wait about 0.1 s after a call) would otherwise
   share the two cores with the sample. The pauses are not counted in ``max_s``;
5. the goal's ratio is the **median of the per-round ratios**, its spread their
   inter-quartile range ``q1..q3`` (and ``min..max``), over at least 5 rounds; past ``max_s``
   seconds of rounds no new round starts once those 5 are done (a slow pair on a busy
   machine would otherwise take minutes).

:func:`decide`: a goal is **met** only when the whole IQR meets it, **missed** when the whole
IQR misses it, and **unclear** when the IQR straddles the limit (the measurement cannot tell;
rerun on a quieter machine). Goals are reported, never asserted.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_ROUNDS", "SETTLE_S", "SURE", "Interleaved", "decide", "interleave", "spread"]

#: The fewest rounds a goal is measured with.
MIN_ROUNDS = 5
#: A warm-up call this many times the shortest sample sizes the samples itself (one call each).
SURE = 10
#: Seconds of pause before each sample when a goal's two calls are different frameworks' (the
#: quick and full grids; module docstring, 4). Measured on the 2-core AVX2 machine, numpy decode
#: against torch F.sdpa decode (GQA 8:2, P = 4096, 21 rounds): per-round ratios 0.08-3.35 (IQR
#: 0.25-1.48) and 0.14-2.19 (0.58-1.42) without a pause; 0.16-3.53 with 0.05 s; 0.55-1.31
#: (0.57-1.20) and 0.56-2.36 (0.59-1.21) with 0.2 s; 0.53-1.30 (0.61-1.09) with 0.5 s.
SETTLE_S = 0.25


def spread(values: list[float]) -> dict[str, float]:
    """``min, q1, median, q3, max`` of ``values`` (quartiles by linear interpolation between
    the order statistics, ``statistics.quantiles(method="inclusive")``)."""
    xs = sorted(values)
    if len(xs) == 1:
        q1 = med = q3 = xs[0]
    else:
        q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return {"min": xs[0], "q1": q1, "median": med, "q3": q3, "max": xs[-1]}


@dataclass
class Interleaved:
    """The rounds of one interleaved measurement: per-round seconds of one call of A and of
    B (a sample's time / ``inner``) and their ratios A / B; ``settle_s``: the pause before
    each sample."""

    a_s: list[float]
    b_s: list[float]
    inner: int
    settle_s: float = 0.0

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.a_s, self.b_s)]

    def summary(self) -> dict[str, Any]:
        """The ratio's median and spread, the rounds, and each side's median call time."""
        return {
            "ratio": spread(self.ratios),
            "rounds": len(self.a_s),
            "inner": self.inner,
            "order": "ABBA",
            "settle_s": self.settle_s,
            "a_median_s": statistics.median(self.a_s),
            "b_median_s": statistics.median(self.b_s),
            "ratios": self.ratios,
        }


def interleave(
    call_a: Callable[[], Any],
    call_b: Callable[[], Any],
    *,
    rounds: int = MIN_ROUNDS,
    min_sample_s: float = 0.005,
    max_s: float | None = None,
    settle_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Interleaved:
    """Time ``call_a`` and ``call_b`` alternately (module docstring): ``rounds`` rounds, at
    least :data:`MIN_ROUNDS`, fewer (never below that) when the rounds pass ``max_s`` seconds,
    each sample after ``sleep(settle_s)`` when ``settle_s > 0`` (not counted in ``max_s``).
    Each call must synchronize (the prepared calls do, ``bench/frameworks.py``)."""
    rounds = max(rounds, MIN_ROUNDS)

    def once(call: Callable[[], Any]) -> float:
        t0 = clock()
        call()
        return clock() - t0

    # warm-up: first-call effects stay out of every sample
    warm = min(once(call_a), once(call_b))
    if warm >= SURE * min_sample_s and min_sample_s > 0:  # slow calls: one per sample
        inner = 1
    else:  # size the samples on a second, warm call of each
        fastest = max(min(once(call_a), once(call_b)), 1e-9)
        inner = max(1, math.ceil(min_sample_s / fastest))

    paused = 0.0

    def sample(call: Callable[[], Any]) -> float:
        nonlocal paused
        if settle_s > 0:  # the other framework's idle threads go to sleep first
            t0 = clock()
            sleep(settle_s)
            paused += clock() - t0
        t0 = clock()
        for _ in range(inner):
            call()
        return (clock() - t0) / inner

    a_s: list[float] = []
    b_s: list[float] = []
    start = clock()
    for r in range(rounds):
        if r >= MIN_ROUNDS and max_s is not None and clock() - start - paused > max_s:
            break
        if r % 2 == 0:
            a_s.append(sample(call_a))
            b_s.append(sample(call_b))
        else:
            b_s.append(sample(call_b))
            a_s.append(sample(call_a))
    return Interleaved(a_s, b_s, inner, settle_s)


def decide(kind: str, limit: float, q1: float, q3: float) -> str:
    """``met`` / ``missed`` / ``unclear`` for a ratio whose IQR is ``q1..q3``.

    ``kind="faster"`` needs ratio < limit, the others ratio <= limit.
    """

    def meets(r: float) -> bool:
        return r < limit if kind == "faster" else r <= limit

    if meets(q3):
        return "met"
    if not meets(q1):
        return "missed"
    return "unclear"
