"""The built page in a real browser: Debian's chromium, headless, driven by Playwright.

Skips with how to install what is missing, unless ROSETTA_REQUIRE_BROWSER=1 (set by .ci/run,
which installs chromium): then a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import os

import pytest

from docs.site import browser
from docs.site.page import build


def _need_browser() -> None:
    why = browser.missing()
    if why:
        if os.environ.get("ROSETTA_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ROSETTA_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)


def test_the_page_in_headless_chromium(tmp_path):
    _need_browser()
    built = build(tmp_path / "site")
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
