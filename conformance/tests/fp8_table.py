"""The fp8 bounds table of docs/SEMANTICS.md ("FP8 inputs", "Both bounds on three fixtures"):
for three ``sdpa.fp8.*`` fixtures, the manifest's two bounds (``tolerance``, the strict one,
and ``kernel_tolerance``, the kernels' practice) and the error of the unbroken NumPy port and
of four broken ports of :data:`conformance.tests.broken_ports.BUGS` on them, each measured by
the runner itself (its largest element error against the golden ``output``).

``python -m conformance.tests.fp8_table`` prints it as a Markdown table.
"""

from __future__ import annotations

from conformance.fixtures import load_manifest
from conformance.runner.suite import run_suite
from conformance.tests.broken_ports import make_port

__all__ = ["TABLE_BUGS", "TABLE_FIXTURES", "bounds_table", "markdown"]

#: The fixtures of the table: all fp8 with GQA and per-head descales; all fp8 with causal,
#: a window and softcap; an e4m3 cache with a float32 query (a decoding step). All e4m3, so
#: the e5m2 rounding bug changes their inputs.
TABLE_FIXTURES: tuple[str, ...] = (
    "sdpa.fp8.all.per_head.float8_e4m3fn",
    "sdpa.fp8.all.causal_window_softcap.float8_e4m3fn",
    "sdpa.fp8.kv_cache.float32_query.decode.float8_e4m3fn",
)
#: The broken ports measured, by their column's title.
TABLE_BUGS: dict[str, str] = {
    "drop v_descale": "fp8_v_descale_dropped",
    "k_descale twice": "fp8_k_descale_twice",
    "e5m2 rounding for e4m3": "fp8_e5m2_rounding_for_e4m3",
    "k_descale by query head": "fp8_k_descale_by_query_head",
}


def _errors(bug: str | None) -> dict[str, float]:
    """The runner's error of ``make_port(bug)`` on each of :data:`TABLE_FIXTURES` (sdpa)."""
    wanted = set(TABLE_FIXTURES)
    report = run_suite(make_port(bug), functions=("sdpa",), select=lambda r: r.case.id in wanted)
    return {o.run_id: o.error for o in report.outcomes}


def bounds_table() -> list[dict[str, float | str]]:
    """One row per fixture: ``fixture``, ``kernel bound``, ``strict bound``, ``correct port``
    (the unbroken NumPy port's error) and one error per :data:`TABLE_BUGS` title."""
    cases = load_manifest().by_id()
    measured = {"correct port": _errors(None)}
    measured |= {title: _errors(bug) for title, bug in TABLE_BUGS.items()}
    rows = []
    for fixture in TABLE_FIXTURES:
        case = cases[fixture]
        row: dict[str, float | str] = {
            "fixture": fixture,
            "kernel bound": case.kernel_tolerance["output"],
            "strict bound": case.tolerance["output"],
        }
        rows.append(row | {title: errors[fixture] for title, errors in measured.items()})
    return rows


def markdown(rows: list[dict[str, float | str]]) -> str:
    """``rows`` as a Markdown table, numbers to 3 significant digits."""
    titles = list(rows[0])
    lines = ["| " + " | ".join(titles) + " |", "| " + " | ".join("---" for _ in titles) + " |"]
    for row in rows:
        cells = [f"`{v}`" if isinstance(v, str) else f"{v:.3g}" for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(bounds_table()))
