"""The built page in a real browser: Debian's chromium, headless, driven by Playwright.

Skips with how to install what is missing, unless ROSETTA_REQUIRE_BROWSER=1 (set by .ci/run,
which installs chromium): then a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conformance.oracle import assert_within
from docs.site import browser
from docs.site.page import build


def _need_browser() -> None:
    why = browser.missing()
    if why:
        if os.environ.get("ROSETTA_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ROSETTA_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The page, built once for the tests that only read it."""
    return build(tmp_path_factory.mktemp("site"))


def test_the_page_in_headless_chromium(tmp_path, built):
    _need_browser()
    shot = tmp_path / "screenshot.png"
    report = browser.inspect_page(built.index, shot)

    assert report.title == "Rosetta Attention, side by side"
    assert browser.problems(report) == []  # console errors, unloaded images, empty cells
    assert report.console_errors == []
    assert len(report.images) == len(built.figures)
    assert all(img["width"] > 0 for img in report.images)
    seen = {sec["id"]: sec["rows"] for sec in report.sections}
    assert list(seen) == [s.section.id for s in built.sections]
    for s in built.sections:
        rows = seen[s.section.id]
        assert [r["label"].split("\n")[0] for r in rows] == [step.label for step in s.steps]
        for row in rows:
            assert [c["framework"] for c in row["cells"]] == ["numpy", "torch", "jax"]
            assert all(c["code"] > 0 for c in row["cells"]), (s.section.id, row["label"])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_a_broken_page_is_caught(tmp_path):
    """The check itself can fail: a missing image and an empty cell are reported."""
    _need_browser()
    built = build(tmp_path / "site")
    (built.index.parent / "figures" / f"{built.figures[0]}.png").unlink()
    page = built.index.read_text()
    start = page.index('<td class="code" data-framework="torch">')
    end = page.index("</td>", start)
    built.index.write_text(page[:start] + '<td class="code" data-framework="torch">' + page[end:])
    found = browser.problems(browser.inspect_page(built.index))
    assert any(f"image not loaded: figures/{built.figures[0]}.png" in p for p in found), found
    assert any("non-empty columns ['numpy', 'jax']" in p for p in found), found
    assert any("ERR_FILE_NOT_FOUND" in p for p in found), found  # the console saw it too


def test_the_visualizer_redraws_what_numpy_computes(tmp_path, built):
    """Move the temperature slider to three places on layer 2's induction head, pick layer 1's
    previous-token head, turn causal off, add padding and a window, type a prompt: each time the
    drawn numbers are impl_numpy's attention_weights at that tau on the queries and keys of the
    project's modules (the reference, in float64), rows sum to 1 (0 for a row with no allowed
    key) and a lower tau draws sharper rows. A typed non-token is refused in words."""
    _need_browser()
    from docs.site import visualizer
    from docs.site.browser import Setting, drive_visualizer

    prompts = visualizer.prompts()
    # 32 tokens typed (the model was trained on 24)
    typed = "3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 2 3 8 4 6 2 6 4 3 3 8 3 2 7 9 5"
    settings = [
        Setting(prompt=0, layer=1, head=0, position=-8),  # tau 0.25
        Setting(prompt=0, layer=1, head=0, position=0),  # tau 1
        Setting(prompt=0, layer=1, head=0, position=8),  # tau 4
        Setting(prompt=0, layer=0, head=2, position=0),  # the previous-token head
        Setting(prompt=3, layer=0, head=2, position=3, causal=False),
        Setting(prompt=1, layer=1, head=3, position=-5, padding=6, window=2),
        Setting(prompt=2, tokens=typed, layer=1, head=1, position=-2),
    ]
    shots = tmp_path / "shots"
    readings, errors = drive_visualizer(built.index, [*settings, Setting(tokens="1 2 x 40")], shots)
    assert errors == []
    *readings, refused = readings
    assert refused["error"] == "not a token (0 to 31): x 40" and refused["weights"] == []
    for s, r in zip(settings, readings):
        tokens = [
            int(t) for t in (s.tokens or " ".join(map(str, prompts[s.prompt].tokens))).split()
        ]
        tau = visualizer.tau_of(s.position)
        asked = (" ".join(map(str, tokens)), s.layer, s.head, tau, s.causal, s.padding, s.window)
        drawn = (r["tokens"], r["layer"], r["head"], r["tau"], r["causal"], r["padding"])
        assert (*drawn, r["window"]) == asked and r["shownTau"] == f"{tau:.3f}"
        ref = visualizer.reference(
            tokens, s.layer, s.head, tau, causal=s.causal, padding=s.padding, window=s.window
        )
        w = np.array(r["weights"])
        assert w.shape == ref.shape == (len(tokens), len(tokens))
        # both float64, the same steps: a few roundings apart (BLAS and V8 sum in other orders)
        assert_within(w, ref, "float64", what="weights: ")
        assert_within(np.array(r["entropy"]), visualizer.entropy(ref), "float64", what="entropy: ")
        empty = ref.sum(-1) == 0  # no allowed key in the row
        assert_within(w.sum(-1)[~empty], 1.0, "float64", what="row sums: ")
        assert (w[empty] == 0).all()
        assert r["titles"][5][3].endswith(f": {ref[5, 3]:.6f}")  # the number a reader sees
    sharp, plain, soft = readings[:3]
    tops = [np.max(r["weights"], -1).mean() for r in (sharp, plain, soft)]
    spreads = [np.mean(r["entropy"]) for r in (sharp, plain, soft)]
    assert tops[0] > tops[1] > tops[2] and spreads[0] < spreads[1] < spreads[2]
    assert not np.allclose(readings[3]["weights"], plain["weights"])  # another head, redrawn
    assert np.triu(np.array(readings[4]["weights"]), 1).max() > 0  # causal off: the future
    assert np.array(readings[5]["weights"]).sum(-1)[-1] == 0  # a row of padding only
    for i in range(len(settings) + 1):
        assert (shots / f"visualizer-{i}.png").read_bytes()[:4] == b"\x89PNG"
