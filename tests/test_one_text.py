"""One text in three scripts: the numbered steps of each kind of code agree in all three.

``impl_numpy``, ``impl_torch`` and ``impl_jax`` carry the same numbered step comments
(``# 1. scores = ...``, ``# 6. (end) ...``) in the same order in each file of a kind, so that a
reader (and the side-by-side page) can line the three up step by step. This test reads the
comments from the source and fails, naming the file and the step, when the sequences differ.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("impl_numpy", "impl_torch", "impl_jax")
KINDS = ("functional.py", "flash.py", "modules.py")
#: ``# 5. causal, whole blocks: ...`` -> number 5, title "causal" (up to the first , ; : or .)
STEP = re.compile(r"^\s*# (\d+)\. ((?:\(\w+\) )?[^,;:.]*)")


def steps(path: Path) -> list[tuple[str, str]]:
    """The (number, title) of every numbered step comment of ``path``, in source order."""
    found = []
    for line in path.read_text().splitlines():
        m = STEP.match(line)
        if m:
            found.append((m.group(1), m.group(2).strip()))
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_the_three_scripts_have_the_same_steps(kind: str) -> None:
    sequences = {fw: steps(REPO / fw / kind) for fw in FRAMEWORKS}
    reference = sequences["impl_numpy"]
    assert len(reference) >= 4, f"impl_numpy/{kind} has no numbered steps"
    for fw, seq in sequences.items():
        for i, (want, got) in enumerate(zip(reference, seq)):
            assert got == want, f"{fw}/{kind}: step #{i + 1} is {got}, impl_numpy has {want}"
        assert len(seq) == len(reference), f"{fw}/{kind}: {len(seq)} steps, not {len(reference)}"


def test_the_extraction_sees_a_drifted_step(tmp_path: Path) -> None:
    drifted = (REPO / "impl_torch" / "functional.py").read_text().replace("# 3. bias", "# 4. bias")
    (tmp_path / "functional.py").write_text(drifted)
    assert steps(tmp_path / "functional.py") != steps(REPO / "impl_numpy" / "functional.py")
