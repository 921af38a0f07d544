"""``make gpu-check``: one command that checks a GPU box end to end and says what failed.

    python -m bench.gpu_check [--device cuda] [--out DIR] [--budget-s 450] [--steps a,b]

Installs nothing: it runs with the interpreter it is started with (``make gpu-check`` uses
``python3`` unless ``PY=`` says otherwise). Each step is a child process with its own time
limit, taken from one budget (7.5 minutes by default, so the whole check ends in under 8 on one
GPU); a step that crashes or runs out of time is recorded and the next one runs. The folder
(``results/gpu-check-<timestamp>/``) holds:

- ``versions.json`` (Python, torch with its CUDA and cuDNN, jax/jaxlib and their plugins, flax,
  the device, the TF32 settings, the git commit) and ``nvidia-smi.txt``;
- ``tf32.json``: the TF32 probe (``bench/tf32_probe.py``), what float32 matmuls and attention
  actually run at by default, with TF32 allowed, and inside the gate (must be IEEE);
- ``gates/gates.json``: every correctness gate of every row on the device, pass/fail
  (``python -m bench --gates-only``), pinned backends on their own kernels;
- ``conformance-<ports>-<k>of<n>.json``: ``python -m conformance --device cuda`` for impl_numpy
  with impl_torch (``impl``), impl_jax (``jax``), torch_fused with jax_fused (``fused``), and
  the Triton and Pallas kernel ports (``triton``, ``pallas``; those with their xfails), each in
  n interleaved parts run at once (``--part k/n``), so that the box's cores make every run
  within the step's limit; a part cut short by it says how many of its runs it made;
- ``bench-smoke/`` and ``bench-small/``: ``make bench``'s smoke grid and the small CUDA grid;
- one ``<step>.log`` per step, and ``summary.md``: one page of what failed, with candidate
  ``cuda:`` xfail lines for the fused and kernel ports (docs/BENCH.md says how to read it).

Exit status 0 when every step passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["BUDGET_S", "STEPS", "Step", "StepResult", "main", "run_steps", "summarize"]

REPO = Path(__file__).resolve().parent.parent
#: The whole check's time budget in seconds (under 8 minutes with start-up and the summary).
BUDGET_S = 450.0
#: A step is not started with less than this left of the budget.
MIN_STEP_S = 10.0

_VERSIONS = """
import json, sys
from importlib import metadata
from bench.devices import environment
env = environment(sys.argv[1])
names = ("torch", "jax", "jaxlib", "flax", "numpy", "ml_dtypes", "pytest-benchmark",
         "jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt",
         "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
packages = {}
for n in names:
    try:
        packages[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        pass
env["packages"] = packages
json.dump(env, open(sys.argv[2], "w"), indent=1, default=str)
print(json.dumps({k: env.get(k) for k in ("device_name", "versions", "cuda")}, default=str))
"""


@dataclass(frozen=True)
class Step:
    """One step: a command (``{py}``, ``{device}``, ``{out}``, ``{small}`` and ``{budget}``, the
    seconds it may take, filled in) and its time cap. Consecutive steps of one ``group`` run
    at the same time (the conformance runs: they time nothing, so they may share the GPU)."""

    name: str
    what: str
    argv: tuple[str, ...]
    cap_s: float
    group: str | None = None


def _py(template: str) -> tuple[str, ...]:
    """``{py} <template>`` as an argument vector (tokens are formatted after the split)."""
    return ("{py}", *template.split())


#: The conformance steps whose ports list device-dependent xfails: the summary writes candidate
#: ``cuda:`` xfail lines for their failures and XPASSes.
_XFAIL_CANDIDATES = ("conformance-fused", "conformance-triton", "conformance-pallas")


def _conformance(name: str, what: str, ports: str, parts: int) -> tuple[Step, ...]:
    """``python -m conformance`` of ``ports`` on the device in ``parts`` steps of the group
    ``conformance``, ``conformance-<name>-<k>of<parts>``, each one ``--part k/parts`` with its
    own report (``<step>.json``)."""
    return tuple(
        Step(
            f"conformance-{name}-{k}of{parts}",
            f"conformance: {what}, part {k}/{parts}",
            _py(
                f"-m conformance {ports} --device {{device}} --part {k}/{parts} "
                f"--report {{out}}/conformance-{name}-{k}of{parts}.json"
            ),
            150,
            group="conformance",
        )
        for k in range(1, parts + 1)
    )


#: The steps, most telling first (a budget that runs out drops the last ones).
STEPS: tuple[Step, ...] = (
    Step(
        "versions",
        "versions and nvidia-smi",
        ("{py}", "-c", _VERSIONS, "{device}", "{out}/versions.json"),
        60,
    ),
    Step(
        "tf32",
        "TF32 probe",
        _py("-m bench.tf32_probe --device {device} --out {out}/tf32.json"),
        60,
    ),
    Step(
        "gates",
        "every gate on the device",
        _py("-m bench --device {device} --gates-only --budget-s {budget} --out {out}/gates"),
        150,
    ),
    # the conformance runs, each port's runs in interleaved parts (``--part K/N``), every part
    # a process of its own: they time nothing, so the 14 share the box's cores and the GPU
    *_conformance("impl", "impl_numpy, impl_torch", "--impl impl_numpy --impl impl_torch", 2),
    *_conformance("jax", "impl_jax", "--impl impl_jax", 4),
    *_conformance(
        "fused", "torch_fused, jax_fused (with their xfails)",
        "--impl torch_fused --impl jax_fused --show-xfails", 2,
    ),
    *_conformance(
        "triton", "the Triton kernel port, compiled (with its xfails)",
        "--impl conformance.ports.triton_flash --show-xfails", 3,
    ),
    *_conformance(
        "pallas", "the Pallas kernel port, compiled (with its xfails)",
        "--impl conformance.ports.pallas_flash --show-xfails", 3,
    ),
    Step(
        "bench-smoke",
        "make bench's smoke grid",
        _py(
            "-m bench --device {device} --grid smoke --no-plots --budget-s {budget} "
            "--out {out}/bench-smoke"
        ),
        90,
    ),
    Step(
        "bench-small",
        "the small CUDA grid",
        _py(
            "-m bench --device {device} --grid {small} --budget-s {budget} --out {out}/bench-small"
        ),
        300,
    ),
)


@dataclass
class StepResult:
    """How a step ended: ``passed``, ``failed`` (non-zero exit), ``timeout``, ``not run``."""

    name: str
    what: str
    status: str
    seconds: float = 0.0
    returncode: int | None = None
    command: list[str] = field(default_factory=list)
    tail: str = ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share the GPU
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_steps(
    steps: tuple[Step, ...],
    *,
    py: str,
    device: str,
    out: Path,
    budget_s: float = BUDGET_S,
    small_grid: str = "small",
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run ``steps`` in order (a group's steps at once), each under ``min(cap, what is left of
    the budget)``; output to ``<out>/<step>.log``. A step with under :data:`MIN_STEP_S` left
    is ``not run``. A step that would outlive its limit is killed (``timeout``); the bench
    steps get the limit less 30 s as their own ``--budget-s``, so they stop early and still
    write their results."""
    deadline = clock() + budget_s
    results: list[StepResult] = []
    i = 0
    while i < len(steps):
        batch = [steps[i]]
        while steps[i].group and i + 1 < len(steps) and steps[i + 1].group == steps[i].group:
            i += 1
            batch.append(steps[i])
        i += 1
        left = deadline - clock()
        if left < MIN_STEP_S:
            for step in batch:
                results.append(
                    StepResult(
                        step.name, step.what, "not run", tail="the check's time budget was spent"
                    )
                )
            continue
        results += _run_batch(batch, py, device, out, small_grid, left, clock)
    return results


def _fill(token: str, fill: dict[str, object]) -> str:
    """``token`` with each ``{name}`` of ``fill`` replaced (other braces left alone)."""
    for name, value in fill.items():
        token = token.replace("{" + name + "}", str(value))
    return token


def _run_batch(
    batch: list[Step], py: str, device: str, out: Path, small: str, left: float, clock
) -> list[StepResult]:
    t0 = clock()
    running = []
    for step in batch:
        limit = min(step.cap_s, left)
        fill = {
            "py": py,
            "device": device,
            "out": out,
            "small": small,
            "budget": f"{max(limit - 30, 5):.0f}",
        }
        argv = [_fill(a, fill) for a in step.argv]
        log = open(out / f"{step.name}.log", "w")  # closed once the step ends
        try:
            proc = subprocess.Popen(
                argv, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT
            )
        except OSError as e:  # the interpreter is missing
            log.write(f"could not start: {e}\n")
            proc = None
        running.append((step, argv, limit, log, proc))
    results = []
    for step, argv, limit, log, proc in running:
        if proc is None:
            status, code = "failed", None
        else:
            try:
                code = proc.wait(timeout=max(t0 + limit - clock(), 0.1))
                status = "passed" if code == 0 else "failed"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status, code = "timeout", None
        log.close()
        text = (out / f"{step.name}.log").read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        results.append(StepResult(step.name, step.what, status, clock() - t0, code, argv, tail))
    return results


def _nvidia_smi(out: Path) -> str:
    """``nvidia-smi``'s page, written to ``nvidia-smi.txt``, and the GPUs' compute modes
    appended (one per GPU, ``Default`` or ``Exclusive_Process``; ``Prohibited`` too)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        text = "nvidia-smi: not found on PATH\n"
    else:
        text = ""
        for args in ([], ["--query-gpu=compute_mode", "--format=csv,noheader"]):
            try:
                text += subprocess.run([exe, *args], capture_output=True, text=True,
                                       timeout=30).stdout
            except (OSError, subprocess.SubprocessError) as e:
                text += f"nvidia-smi failed: {e}\n"
    (out / "nvidia-smi.txt").write_text(text)
    return text


def _one_process_at_a_time(nvidia_smi: str) -> bool:
    """Whether a GPU takes one process at a time (compute mode ``Exclusive_Process``): then a
    group's steps cannot share it and run one after another."""
    return "Exclusive_Process" in nvidia_smi


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize(
    out: Path, steps: list[StepResult], *, device: str, wall_s: float | None = None,
    notes: list[str] | None = None, max_lines: int = 12,
) -> str:
    """``summary.md``: one page saying what failed (module docstring); ``wall_s``: the whole
    check's seconds (a group's steps run at the same time: their seconds overlap); ``notes``:
    lines on how the check ran, under the versions."""
    versions = _load(out / "versions.json") or {}
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    name = versions.get("device_name", device)
    v = versions.get("versions", {})
    cuda = versions.get("cuda", {})
    lines = [
        f"# GPU check, {when}, {name}",
        "",
        f"torch {v.get('torch')} (CUDA {cuda.get('torch.version.cuda')}, cuDNN "
        f"{cuda.get('cudnn')}), jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, flax "
        f"{v.get('flax')}; commit {str((versions.get('git') or {}).get('commit'))[:10]}; "
        f"{sum(s.seconds for s in steps) if wall_s is None else wall_s:.0f} s wall",
        "",
        *(f"{note}\n" for note in notes or ()),
        "| step | result | s | notes |",
        "| --- | --- | --- | --- |",
    ]
    details: list[str] = []
    for s in steps:
        note, more = _step_notes(out, s, max_lines)
        lines.append(f"| {s.what} | {s.status} | {s.seconds:.0f} | {note} |")
        if more:
            details += ["", f"## {s.what}", "", *more]
        elif s.status in ("failed", "timeout"):
            details += ["", f"## {s.what} ({s.status})", "", "```", s.tail, "```"]
    text = "\n".join(lines + details) + "\n"
    (out / "summary.md").write_text(text)
    return text


def _tf32_notes(out: Path, s: StepResult, max_lines: int) -> tuple[str, list[str]]:
    data = _load(out / "tf32.json")
    if not data:
        return "no tf32.json", []
    from bench.tf32_probe import must_be_ieee

    probes = data["probes"]
    leaks = [p for p in probes if must_be_ieee(p) and p.get("reads_as") != "ieee"]
    tf32 = [
        f"{p['framework']} {p['what']} ({p['setting']})"
        for p in probes
        if p.get("reads_as") == "tf32" and not must_be_ieee(p)
    ]
    rows = [
        f"- {p['framework']} {p['what']}, {p['setting']}: "
        f"{p.get('reads_as') or p.get('error')} ({p.get('rel_error', float('nan')):.1e})"
        for p in probes
    ]
    note = f"TF32 where allowed: {', '.join(tf32) or 'none'}"
    if leaks:
        note = f"**{len(leaks)} gate/port probes not IEEE**; " + note
    return note, rows


def _gates_notes(out: Path, s: StepResult, max_lines: int) -> tuple[str, list[str]]:
    data = _load(out / "gates" / "gates.json")
    if not data:
        return "no gates.json", []
    bad = [g for g in data if g["status"] not in ("passed", "unsupported")]
    uns = [g for g in data if g["status"] == "unsupported"]
    note = f"{len(data) - len(bad)}/{len(data)} passed or unsupported ({len(uns)} unsupported)"
    more = [
        f"- {g['status']}: {g['port']} {g['op']} {g['pin'] or ''} ({', '.join(g['rows'])}):"
        f" {g['detail'][:300]}"
        for g in bad
    ]
    return note, more[:max_lines]


def _conformance_notes(out: Path, s: StepResult, max_lines: int) -> tuple[str, list[str]]:
    data = _load(out / f"{s.name}.json")
    if not data:
        return "no report", []
    notes, more = [], []
    for rep in data:
        c = rep["counts"]
        loaded = " (did not load)" if rep.get("error") else ""
        made, planned = len(rep["outcomes"]), rep.get("planned")
        cut = "" if rep.get("complete", True) else f" (cut short: {made} of {planned} runs made)"
        notes.append(
            f"{rep['port'].rsplit('.', 1)[-1]} {c['pass']} pass, {c['fail']} fail, "
            f"{c['xfail']} xfail, {c['xpass']} xpass{loaded}{cut}"
        )
        bad = [o for o in rep["outcomes"] if o["status"] in ("fail", "xpass")]
        if rep.get("error"):
            more.append(f"- {rep['port']}: could not load: {rep['error']}")
        for o in bad[:max_lines]:
            more.append(f"- {rep['port']} {o['status']} `{o['run_id']}`: {o['message'][:200]}")
        if len(bad) > max_lines:
            more.append(f"- ... {len(bad) - max_lines} more in {s.name}.json")
        if bad and s.name.startswith(_XFAIL_CANDIDATES):  # on CUDA: a kernel's
            fails = [_xfail_line(o) for o in bad if o["status"] == "fail"]
            xpasses = [f"# XPASS on cuda, narrow its entry: {o['run_id']}" for o in bad
                       if o["status"] == "xpass"]
            more += ["", f"Candidate `cuda:` lines for {rep['port']}'s xfails (check each):"]
            more += ["", "```", *fails[:max_lines], *xpasses[:max_lines], "```"]
    return "; ".join(notes), more


def _bench_notes(out: Path, s: StepResult, max_lines: int) -> tuple[str, list[str]]:
    data = _load(out / s.name / "results.json")
    if not data:
        return "no results.json", []
    counts: dict[str, int] = {}
    bad: dict[str, dict] = {}
    for r in data["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r["status"] in ("failed", "error"):
            bad.setdefault(r["row"], r)
    note = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    more = [f"- {r['status']}: {row}: {r['reason'][:250]}" for row, r in bad.items()]
    return note, more[:max_lines]


#: How each kind of step is summarized, by the first word of its name.
_NOTES: dict[str, Callable[[Path, StepResult, int], tuple[str, list[str]]]] = {
    "tf32": _tf32_notes,
    "gates": _gates_notes,
    "conformance": _conformance_notes,
    "bench": _bench_notes,
}


def _step_notes(out: Path, s: StepResult, max_lines: int) -> tuple[str, list[str]]:
    """A table cell and the detail lines of one step, from the files it wrote."""
    if s.status == "not run":
        return s.tail, []
    notes = _NOTES.get(s.name.split("-")[0])
    return notes(out, s, max_lines) if notes else ("", [])


def _xfail_line(o: dict) -> str:
    reason = o["message"].replace("#", "")[:120]
    return f"cuda: {o['run_id']:<40} # measured by gpu-check: {reason}"


def _whole(name: str) -> str:
    """A part step's name without its part (``conformance-jax-2of4``: ``conformance-jax``)."""
    stem, _, part = name.rpartition("-")
    return stem if stem and "of" in part and part.replace("of", "").isdigit() else name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__.split("\n")[0]
    )
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (to try the check)")
    p.add_argument("--out", type=Path, help="the folder (default results/gpu-check-<time>)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for every step")
    p.add_argument("--steps", default="", help="comma-separated step names (default: all)")
    p.add_argument("--small-grid", default="small", help="the grid of the bench-small step")
    p.add_argument("--python", default=sys.executable, help="interpreter of the steps")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = (args.out or REPO / "results" / f"gpu-check-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    wanted = {s.strip() for s in args.steps.split(",") if s.strip()}
    names = {s.name: {s.name, _whole(s.name)} for s in STEPS}  # a step, or all its parts
    unknown = wanted - set().union(*names.values())
    if unknown:
        p.error(f"unknown steps {sorted(unknown)}; steps: {sorted(set().union(*names.values()))}")
    steps = tuple(s for s in STEPS if not wanted or names[s.name] & wanted)
    print(
        f"gpu-check on {args.device}: {len(steps)} steps, budget {args.budget_s:.0f} s, "
        f"folder {out}",
        flush=True,
    )
    t0 = time.monotonic()
    notes = []
    if _one_process_at_a_time(_nvidia_smi(out)):
        steps = tuple(replace(s, group=None) for s in steps)
        notes.append("The GPU's compute mode is Exclusive_Process: the conformance parts ran one "
                     "at a time, so the later ones may not have run (nvidia-smi.txt).")
    results = run_steps(
        steps,
        py=args.python,
        device=args.device,
        out=out,
        budget_s=args.budget_s,
        small_grid=args.small_grid,
    )
    (out / "steps.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(summarize(out, results, device=args.device, wall_s=time.monotonic() - t0, notes=notes))
    print(f"gpu-check: {out / 'summary.md'}")
    return 0 if all(r.status == "passed" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
