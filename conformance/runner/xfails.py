"""A port's known failures: the xfails file, one glob over run ids per line."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class XfailEntry:
    """One line of an xfails file (see :class:`Xfails`)."""

    pattern: str
    device: str | None = None
    reason: str = ""
    skip: bool = False
    negate: bool = False

    def matches(self, run_id: str, device: str) -> bool:
        on_device = self.device is None or device.split(":")[0] == self.device
        return on_device and fnmatch.fnmatchcase(run_id, self.pattern)


class Xfails:
    """A port's known failures: one glob over run ids per line, ``#`` starts the reason.

    ::

        # torch_fused.xfails
        causal_mask.*            # torch has no public causal-mask function
        cuda: sdpa.foo.float16   # only on that device
        skip: decode.error.*     # crashes the port: not run, reported as skipped
        *.float64                # no float64 at all ...
        !*.scale.zero.float64    # ... but scale zero passes: not listed after all

    Prefixes ending in ``:`` may come in any order before the glob: ``skip:`` and a device
    (``cuda:``, ``cpu:``, ``tpu:``). A glob starting with ``!`` excludes what it matches from
    the lines above it. The last line that matches a run decides, as in ``.gitignore``.
    """

    def __init__(self, entries: Iterable[XfailEntry] = ()) -> None:
        self.entries = list(entries)

    @classmethod
    def parse(cls, text: str) -> Xfails:
        entries = []
        for line in text.splitlines():
            body, _, reason = line.partition("#")
            tokens = body.split()
            if not tokens:
                continue
            device, skip = None, False
            while tokens and tokens[0].endswith(":"):
                prefix = tokens.pop(0)[:-1]
                if prefix == "skip":
                    skip = True
                else:
                    device = prefix
            if len(tokens) != 1:
                raise ValueError(f"xfails line {line.strip()!r}: expected [device:] [skip:] glob")
            pattern = tokens[0]
            negate = pattern.startswith("!")
            entries.append(
                XfailEntry(pattern.removeprefix("!"), device, reason.strip(), skip, negate)
            )
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> Xfails:
        return cls.parse(Path(path).read_text())

    def __add__(self, other: Xfails) -> Xfails:
        return Xfails(self.entries + other.entries)

    def lookup(self, run_id: str, device: str) -> XfailEntry | None:
        """The entry that decides ``run_id`` on ``device`` (the last that matches), or None when
        it is not listed (or excluded by a ``!`` line)."""
        for entry in reversed(self.entries):
            if entry.matches(run_id, device):
                return None if entry.negate else entry
        return None

    def reason(self, run_id: str, device: str) -> str | None:
        """The reason a run is expected to fail (or skipped) on ``device``, or None."""
        entry = self.lookup(run_id, device)
        return None if entry is None else entry.reason or "listed in xfails"

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_json(cls, data: Sequence[dict[str, Any]]) -> Xfails:
        return cls(XfailEntry(**d) for d in data)
