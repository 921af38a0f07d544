"""Read the numbered steps out of the three implementations and check that they line up.

The three scripts share numbered step comments (``# 1. scores = ...``, ``# 2. softcap: ...``);
this module finds them, cuts each function into one piece of source per step, and checks that
NumPy, PyTorch and JAX have the same steps in the same order. A step runs from its comment to the
next step comment, or to the end of the block the comment sits in (the first line indented less),
or to the end of the function. Two refinements keep the reading order honest:

- a helper named in the section (``_weights``, ``_attend_block``) is read where its caller calls
  it or hands it on (the last such line): its steps come right after the caller's step that
  contains that line;
- a comment that repeats the current step's number with a tag in parentheses right after it,
  such as JAX's ``# 5. (tiling)``, continues that step; ``# 6. (end)`` after step 7 is a step of
  its own.

Steps are compared by number, tag and title, the comment's text up to its first ``:``, ``;`` or
``=`` (``5 softmax over S, stable, with a sink per head``): what follows says how the framework
does it and may differ, but a retitled, swapped, missing or extra step is drift, and
``DriftError`` says where. So is a numbered step in one of the sections' files that is on no row
of the page (a function the sections do not name), unless ``sections.UNCOMPARED`` names its
function and says why.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from docs.site.sections import FRAMEWORK_NAMES, FRAMEWORKS, SECTIONS, UNCOMPARED, Section

ROOT = Path(__file__).resolve().parents[2]

#: ``# 5. causal, whole blocks: ...`` or ``# 6. (end) divide ...``; the text after the number.
#: A capital letter before the number (``# R3. step t: ...``, ``# P1. split: ...``) numbers the
#: steps of an algorithm around the contract's own (the ring's, head-parallel's).
STEP_COMMENT = re.compile(r"#\s*(?P<number>[A-Z]?\d+)\.\s+(?:\((?P<tag>[^)]*)\)\s*)?(?P<text>.*)")


class DriftError(Exception):
    """The three implementations do not have the same steps (or a section names a function one
    of them lacks). The message says which file, function, step and line."""


class Incomplete(Exception):
    """An optional section whose file or functions exist in some implementations only: it is
    left off the page (with this message) until all three have them, and then checked."""


@dataclass(frozen=True)
class Code:
    """One framework's source of one step (or of one whole function without steps)."""

    path: str  # relative to the repository root, e.g. "impl_torch/functional.py"
    function: str  # the qualified name it was found in, e.g. "GroupedQueryAttention.forward"
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str  # the lines, dedented (a function shown whole loses its docstring)


@dataclass(frozen=True)
class Step:
    """One row of the page: the same step in the three frameworks."""

    id: str  # the idiom notes' key: NumPy's label, or NumPy's name of a function shown whole
    key: str  # what the check compares: "5 causal", "6 (end) divide", or a function's name
    label: str  # what the page shows: "5. causal, whole blocks"; taken from NumPy
    group: str  # the section's function this step belongs to
    code: dict[str, Code]  # framework -> its source


@dataclass(frozen=True)
class SectionSteps:
    section: Section
    steps: tuple[Step, ...]
    groups: tuple[str, ...]  # the section's functions, in order


@dataclass
class _Raw:
    """A step as found in one framework, before the three are lined up."""

    key: str
    label: str
    function: str
    start: int
    end: int  # last line of the step before trailing blank lines are dropped
    col: int  # the indentation of the comment's line: the step ends below it; -1: a whole function
    path: str = ""


# ---------------------------------------------------------------------------------------------
# one source file


@dataclass
class _Source:
    path: Path
    rel: str
    lines: list[str] = field(default_factory=list)
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    comments: list[tuple[int, int, str]] = field(default_factory=list)  # (line, col, text)
    starts: dict[int, int] = field(default_factory=dict)  # line -> column of a statement start

    @classmethod
    def read(cls, path: Path, root: Path) -> _Source:
        text = path.read_text()
        src = cls(path, path.relative_to(root).as_posix(), text.splitlines())
        tree = ast.parse(text, filename=str(path))
        for node in tree.body:  # module functions and class methods, not nested functions
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                src.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                        src.functions[f"{node.name}.{sub.name}"] = sub
        previous = tokenize.NEWLINE
        skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                src.comments.append((tok.start[0], tok.start[1], tok.string))
            if tok.type in skip:
                continue
            if previous == tokenize.NEWLINE:  # the first token of a logical line
                src.starts[tok.start[0]] = tok.start[1]
            previous = tok.type
        return src

    def find(self, spec: str) -> str | None:
        """The qualified name of ``spec`` ("name", "Class.name", "a | b") in this file."""
        for name in (s.strip() for s in spec.split("|")):
            if name in self.functions:
                return name
            matches = [q for q in self.functions if q.rsplit(".", 1)[-1] == name]
            if len(matches) == 1:
                return matches[0]
        return None

    def own_steps(self, name: str) -> list[_Raw]:
        """The numbered steps written inside function ``name`` (nested functions included)."""
        node = self.functions[name]
        first, last = node.lineno, node.end_lineno
        marks = [  # a step comment on a line of its own, or after the code it names
            (line, len(self.lines[line - 1]) - len(self.lines[line - 1].lstrip()), m)
            for line, _, text in self.comments
            if first <= line <= last and (m := STEP_COMMENT.fullmatch(text))
        ]
        steps: list[_Raw] = []
        for n, (line, col, m) in enumerate(marks):
            end = marks[n + 1][0] - 1 if n + 1 < len(marks) else last
            for later in range(line + 1, end + 1):  # the block the comment sits in ends here
                if self.starts.get(later, col) < col:
                    end = later - 1
                    break
            number, tag, text = m["number"], m["tag"], m["text"]
            title = re.split(r"[:;=]", text, maxsplit=1)[0].strip().rstrip(".,")
            head = f"{number}." + (f" ({tag})" if tag else "")
            if tag and steps and steps[-1].key.split()[0] == number and steps[-1].end == line - 1:
                steps[-1].end = end  # "# 5. (tiling)" right after step 5 continues it
                continue
            key = " ".join([number, *([f"({tag})"] if tag else []), *title.split()])
            steps.append(_Raw(key, f"{head} {title}".strip(), name, line, end, col, self.rel))
        return steps

    def runs(self, name: str, callee: str) -> int | None:
        """The line of function ``name`` where ``callee`` runs: the last line that calls it or
        hands it on (``shard_map(partial(_ring_device, ...))``); a use inside a local function
        without step comments of its own (``def attend(c): return _attend_block(...)``) counts
        where that function is used."""
        top = self.functions[name]
        marked = {line for line, _, text in self.comments if STEP_COMMENT.fullmatch(text)}
        parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(top):
            for child in ast.iter_child_nodes(node):
                parent[child] = node

        def local_def(node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
            while node in parent:
                node = parent[node]
                if node is top:
                    return None
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    return node
            return None

        def last_use(short: str, seen: frozenset[str]) -> int | None:
            lines = []
            for node in ast.walk(top):
                used = (isinstance(node, ast.Name) and node.id == short) or (
                    isinstance(node, ast.Attribute) and node.attr == short
                )
                if not used:
                    continue
                inner = local_def(node)
                if (
                    inner is None
                    or inner.name in seen
                    or any(inner.lineno <= n <= inner.end_lineno for n in marked)
                ):
                    lines.append(node.lineno)
                elif (line := last_use(inner.name, seen | {inner.name})) is not None:
                    lines.append(line)
            return max(lines, default=None)

        return last_use(callee.rsplit(".", 1)[-1], frozenset())

    def steps(self, name: str, helpers: tuple[str, ...], seen: tuple[str, ...] = ()) -> list[_Raw]:
        """The steps of ``name`` in reading order, with the helpers' steps where they are called."""
        steps = self.own_steps(name)
        for spec in helpers:
            helper = self.find(spec)
            if helper is None or helper == name or helper in seen:
                continue
            line = self.runs(name, helper)
            if line is None:
                continue
            inner = self.steps(helper, helpers, (*seen, name))
            at = sum(1 for s in steps if s.start <= line)  # after the step holding the call
            steps[at:at] = inner
        return steps

    def whole(self, name: str) -> _Raw:
        """A function without numbered steps, as one row labelled with its name."""
        node = self.functions[name]
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return _Raw(name.rsplit(".", 1)[-1], name, name, start, node.end_lineno, -1, self.rel)

    def code(self, raw: _Raw) -> Code:
        lines = list(range(raw.start, raw.end + 1))
        node = self.functions[raw.function]
        if raw.col < 0 and node.body and _is_docstring(node.body[0]):
            doc = node.body[0]
            lines = [n for n in lines if not doc.lineno <= n <= doc.end_lineno]
        while lines and not self.lines[lines[-1] - 1].strip():
            lines.pop()
        text = textwrap.dedent("\n".join(self.lines[n - 1] for n in lines))
        return Code(self.rel, raw.function, raw.start, lines[-1] if lines else raw.start, text)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# ---------------------------------------------------------------------------------------------
# the three lined up


def _sources(section: Section, root: Path) -> dict[str, _Source | None]:
    out: dict[str, _Source | None] = {}
    for fw in FRAMEWORKS:
        path = root / f"impl_{fw}" / section.file
        out[fw] = _Source.read(path, root) if path.is_file() else None
    return out


def _where(fw: str, section: Section) -> str:
    return f"impl_{fw}/{section.file}"


def _functions(section: Section, sources: dict[str, _Source | None]) -> list[str]:
    """The section's function specs; "*" becomes every function with numbered steps."""
    if section.functions != ("*",):
        return list(section.functions)
    helpers = {h for h in section.helpers}
    names: list[str] = []
    for fw in FRAMEWORKS:
        src = sources[fw]
        if src is None:
            continue
        for name in src.functions:
            if name not in names and name not in helpers and src.own_steps(name):
                names.append(name)
    return names


def _describe(steps: list[_Raw]) -> str:
    return ", ".join(f"{s.key} (line {s.start})" for s in steps) or "no numbered steps"


def _compare(section: Section, spec: str, found: dict[str, list[_Raw]]) -> None:
    """Raise DriftError unless the three step sequences are the same."""
    keys = {fw: [s.key for s in steps] for fw, steps in found.items()}
    if len({tuple(k) for k in keys.values()}) == 1:
        return
    where = {fw: _where(fw, section) for fw in FRAMEWORKS}
    problems = []
    for fw in FRAMEWORKS:
        for s in found[fw]:
            missing = [f for f in FRAMEWORKS if s.key not in keys[f]]
            if missing:
                absent = " and ".join(FRAMEWORK_NAMES[f] for f in missing)
                problems.append(
                    f'step "{s.label}" is in {s.path}:{s.start} but not in {absent} '
                    f"({', '.join(where[f] for f in missing)})"
                )
    if not problems:  # the same steps, in another order or another number of times
        n = next(
            i
            for i in range(max(map(len, keys.values())))
            if len({tuple(k[i : i + 1]) for k in keys.values()}) > 1
        )
        at = "; ".join(
            f"{FRAMEWORK_NAMES[fw]} has "
            + (
                f'"{found[fw][n].label}" ({found[fw][n].path}:{found[fw][n].start})'
                if n < len(found[fw])
                else "nothing"
            )
            for fw in FRAMEWORKS
        )
        problems.append(f"the step sequences differ at row {n + 1}: {at}")
    listing = "\n".join(
        f"    {FRAMEWORK_NAMES[fw]:8} {where[fw]}: {_describe(found[fw])}" for fw in FRAMEWORKS
    )
    raise DriftError(
        f'"{section.title}" ({section.file}, {spec}): the three implementations must have the same '
        f"numbered steps in the same order (STYLE.md: one text in three scripts).\n  "
        + "\n  ".join(problems)
        + f"\n  steps found:\n{listing}"
    )


def section_steps(section: Section, root: Path = ROOT) -> SectionSteps | None:
    """The rows of one section; None for an optional section whose code does not exist yet.

    Raises DriftError when the three implementations differ in their steps, or a function the
    section names is in some of them and not in the others (Incomplete for an optional section).
    """
    sources = _sources(section, root)
    present = [fw for fw in FRAMEWORKS if sources[fw] is not None]
    if not present and section.optional:
        return None
    if len(present) < len(FRAMEWORKS):
        lacking = ", ".join(_where(fw, section) for fw in FRAMEWORKS if sources[fw] is None)
        raise (Incomplete if section.optional else DriftError)(
            f'"{section.title}": {", ".join(_where(fw, section) for fw in present)} exist(s) but '
            f"{lacking} does not; the three implementations have the same files."
        )
    steps: list[Step] = []
    groups: list[str] = []
    for spec in _functions(section, sources):
        names = {fw: sources[fw].find(spec) for fw in FRAMEWORKS}
        if all(n is None for n in names.values()) and section.optional:
            continue
        if any(n is None for n in names.values()):
            has = ", ".join(f"{_where(fw, section)} ({n})" for fw, n in names.items() if n)
            lacks = ", ".join(_where(fw, section) for fw, n in names.items() if n is None)
            raise (Incomplete if section.optional else DriftError)(
                f'"{section.title}": {spec!r} is in {has} but not in {lacks}; the three '
                f"implementations have the same functions (or list each name in docs/site/"
                f"sections.py as 'a | b')."
            )
        found = {fw: sources[fw].steps(names[fw], section.helpers) for fw in FRAMEWORKS}
        if not any(found.values()):  # no numbered steps anywhere: the function is one row
            found = {fw: [sources[fw].whole(names[fw])] for fw in FRAMEWORKS}
            key = spec.split("|")[0].strip().rsplit(".", 1)[-1]
            for raws in found.values():
                raws[0].key = key
        _compare(section, spec, found)
        others = [names[fw].rsplit(".", 1)[-1] for fw in FRAMEWORKS if names[fw] != names["numpy"]]
        group = " / ".join(dict.fromkeys([names["numpy"], *others]))  # "Cls.__call__ / forward"
        groups.append(group)
        for i, raw in enumerate(found["numpy"]):
            code = {fw: sources[fw].code(found[fw][i]) for fw in FRAMEWORKS}
            whole = raw.col < 0
            step_id = names["numpy"] if whole else raw.label
            steps.append(Step(step_id, raw.key, group if whole else raw.label, group, code))
    if not steps:
        return None
    return SectionSteps(section, tuple(steps), tuple(groups))


def unshown_steps(
    built: list[SectionSteps], root: Path = ROOT, files: tuple[str, ...] | None = None
) -> list[str]:
    """The numbered steps of the sections' files (``files``, default: those of ``built``) in the
    three implementations that are on no row of ``built``, as ``"path:line: comment (in
    function)"``, leaving out those in a function ``UNCOMPARED`` names."""
    rows: dict[str, set[int]] = {}
    for s in built:
        for step in s.steps:
            for code in step.code.values():
                rows.setdefault(code.path, set()).update(range(code.start, code.end + 1))
    files = tuple(dict.fromkeys(s.section.file for s in built)) if files is None else files
    unshown = []
    for file in files:
        for fw in FRAMEWORKS:
            path = root / f"impl_{fw}" / file
            if not path.is_file():
                continue
            src = _Source.read(path, root)
            for line, _, text in src.comments:
                if not STEP_COMMENT.fullmatch(text) or line in rows.get(src.rel, ()):
                    continue
                inside = [
                    name
                    for name, node in src.functions.items()
                    if node.lineno <= line <= node.end_lineno
                ]
                where = inside[-1] if inside else "module level"
                if f"{src.rel}::{where}" not in UNCOMPARED:
                    unshown.append(f"{src.rel}:{line}: {text.strip()} (in {where})")
    return unshown


def all_steps(
    root: Path = ROOT, sections: tuple[Section, ...] = SECTIONS, skipped: list[str] | None = None
) -> list[SectionSteps]:
    """Every section that exists, checked; raises DriftError at the first that does not line up,
    and when a numbered step of a section's file is on no row (:func:`unshown_steps`).

    An optional section present in only some implementations is left out, and why is appended
    to ``skipped``; its file's steps are then not asked to be shown.
    """
    out, left_out = [], set()
    for sec in sections:
        try:
            found = section_steps(sec, root)
        except Incomplete as e:
            if skipped is not None:
                skipped.append(f"{sec.id}: {e}")
            left_out.add(sec.file)
            continue
        if found is not None:
            out.append(found)
    files = tuple(dict.fromkeys(s.section.file for s in out if s.section.file not in left_out))
    unshown = unshown_steps(out, root, files)
    if unshown:
        raise DriftError(
            "numbered steps on no row of the side-by-side page: name their function in "
            "docs/site/sections.py (a section's functions or helpers), or in UNCOMPARED with "
            "the reason it has no counterpart in the other two scripts.\n  " + "\n  ".join(unshown)
        )
    return out
