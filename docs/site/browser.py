"""Open the built page in headless Chromium and report what a reader would see.

Debian's ``chromium`` (``apt-get install chromium``), driven by Playwright's Python API with
``executable_path``: Playwright's own browser download is not used. The browser starts with a
fresh profile and no network of its own (the page needs none).

    python -m docs.site.browser [build/docs/index.html] [--screenshot build/docs/screenshot.png]
        [--visualizer docs/visualizer.png]

``--visualizer PATH``: also a screenshot of the visualizer section as it opens (the README's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
INSTALL_HINT = (
    "the browser test needs Debian's chromium and Playwright's Python package: "
    "`sudo apt-get install chromium` and `pip install -e '.[docs]'` (or `pip install playwright`); "
    "set ROSETTA_CHROMIUM to the browser's path if it is not /usr/bin/chromium"
)

#: What the page's DOM says, measured in the browser (JavaScript run by Playwright).
_INSPECT = """() => {
  const images = [...document.images].map(img => ({
    src: img.getAttribute('src'), complete: img.complete, width: img.naturalWidth,
  }));
  const sections = [...document.querySelectorAll('section.steps')].map(sec => ({
    id: sec.id,
    rows: [...sec.querySelectorAll('tr.step')].map(tr => ({
      label: tr.querySelector('th.label').innerText.trim(),
      cells: [...tr.querySelectorAll('td.code')].map(td => ({
        framework: td.dataset.framework,
        code: (td.querySelector('pre') || {innerText: ''}).innerText.trim().length,
      })),
    })),
  }));
  return {title: document.title, images, sections};
}"""


@dataclass
class PageReport:
    title: str
    console_errors: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    sections: list[dict] = field(default_factory=list)
    screenshot: Path | None = None


def chromium_path() -> str | None:
    """The Chromium to drive: $ROSETTA_CHROMIUM, else chromium on PATH, else None."""
    path = os.environ.get("ROSETTA_CHROMIUM")
    if path:
        return path if Path(path).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why the browser check cannot run here (with how to fix it), or None if it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return INSTALL_HINT + " (playwright is not importable)"
    if chromium_path() is None:
        return INSTALL_HINT + " (no chromium found)"
    return None


def inspect_page(
    index: Path, screenshot: Path | None = None, *, full_page: bool = False, timeout_s: float = 60
) -> PageReport:
    """Load ``index`` from file://, collect console errors, failed requests, the images' sizes
    and the text of every step cell; write a full-page screenshot if asked."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rosetta-chromium-") as profile:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile,  # a fresh --user-data-dir
                executable_path=chromium_path(),
                headless=True,
                args=list(CHROMIUM_FLAGS),
                viewport={"width": 1600, "height": 1000},
                timeout=timeout_s * 1000,
            )
            try:
                page = context.new_page()
                page.on(
                    "console",
                    lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None,
                )
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.on(
                    "requestfailed",
                    lambda r: errors.append(f"request failed: {r.url} {r.failure}"),
                )
                page.goto(index.resolve().as_uri(), wait_until="load", timeout=timeout_s * 1000)
                found = page.evaluate(_INSPECT)
                if screenshot is not None:
                    screenshot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(screenshot), full_page=full_page)
            finally:
                context.close()
    return PageReport(found["title"], errors, found["images"], found["sections"], screenshot)


#: The visualizer's heatmap as drawn: the settings it says it drew and every cell's number.
_READ_VISUALIZER = """() => {
  const t = document.getElementById('viz-heatmap');
  const rows = [...t.querySelectorAll('tr.row')];
  return {
    tokens: t.dataset.tokens, error: t.dataset.error || null,
    layer: +t.dataset.layer, head: +t.dataset.head,
    tau: Number(t.dataset.tau), shownTau: document.getElementById('viz-tau-value').textContent,
    causal: t.dataset.causal === 'true', padding: +t.dataset.padding,
    window: t.dataset.window === '' ? null : +t.dataset.window,
    weights: rows.map(r => [...r.querySelectorAll('td[data-w]')].map(td => Number(td.dataset.w))),
    titles: rows.map(r => [...r.querySelectorAll('td[data-w]')].map(td => td.title)),
    entropy: rows.map(r => Number(r.querySelector('td.entropy').dataset.h)),
    summary: document.getElementById('viz-summary').textContent,
  };
}"""


@dataclass
class Setting:
    """What to set on the visualizer: the preset prompt's index, then ``tokens`` typed over it
    (None: the preset's), ``layer`` and ``head``, the temperature slider's position (moved with
    the arrow keys, as a reader would), causal, the padded keys at the end and the window
    (None: off)."""

    prompt: int = 0
    tokens: str | None = None
    layer: int = 1
    head: int = 0
    position: int = 0
    causal: bool = True
    padding: int = 0
    window: int | None = None


def drive_visualizer(
    index: Path,
    settings: list[Setting],
    screenshots: Path | None = None,
    *,
    timeout_s: float = 60,
) -> tuple[list[dict], list[str]]:
    """Open ``index``, apply each of ``settings`` in turn through the controls and read the
    heatmap back (:data:`_READ_VISUALIZER`); with ``screenshots``, write
    ``visualizer-<i>.png`` of the section after each. Returns the readings and the console
    errors."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    readings = []
    with tempfile.TemporaryDirectory(prefix="rosetta-chromium-") as profile:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=chromium_path(),
                headless=True,
                args=list(CHROMIUM_FLAGS),
                viewport={"width": 1400, "height": 1000},
                timeout=timeout_s * 1000,
            )
            try:
                page = context.new_page()
                page.on(
                    "console",
                    lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None,
                )
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.goto(index.resolve().as_uri(), wait_until="load", timeout=timeout_s * 1000)
                for i, s in enumerate(settings):
                    page.select_option("#viz-prompt", str(s.prompt))
                    if s.tokens is not None:
                        page.fill("#viz-tokens", s.tokens)
                    page.select_option("#viz-head", f"{s.layer}:{s.head}")
                    slider = page.locator("#viz-tau")
                    moves = s.position - int(slider.input_value())
                    slider.focus()
                    for _ in range(abs(moves)):
                        page.keyboard.press("ArrowRight" if moves > 0 else "ArrowLeft")
                    page.locator("#viz-causal").set_checked(s.causal)
                    page.fill("#viz-padding", str(s.padding))
                    page.fill("#viz-window", "" if s.window is None else str(s.window))
                    readings.append(page.evaluate(_READ_VISUALIZER))
                    if screenshots is not None:
                        screenshots.mkdir(parents=True, exist_ok=True)
                        page.locator("#visualizer").screenshot(
                            path=str(screenshots / f"visualizer-{i}.png")
                        )
            finally:
                context.close()
    return readings, errors


def problems(report: PageReport) -> list[str]:
    """What is wrong with the page as the browser saw it (empty: nothing)."""
    out = list(report.console_errors)
    out += [f"image not loaded: {i['src']}" for i in report.images if not i["width"] > 0]
    if not report.images:
        out.append("the page shows no image")
    if not report.sections:
        out.append("the page has no section of steps")
    for sec in report.sections:
        if not sec["rows"]:
            out.append(f"section {sec['id']}: no step rows")
        for row in sec["rows"]:
            cells = [c["framework"] for c in row["cells"] if c["code"] > 0]
            if cells != ["numpy", "torch", "jax"]:
                out.append(f"section {sec['id']}, {row['label']!r}: non-empty columns {cells}")
    return out


def _small_png(source: Path, target: Path) -> None:
    """Copy a screenshot as a 64-colour PNG (a third of the bytes; Pillow comes with the docs
    extra's matplotlib)."""
    from PIL import Image

    with Image.open(source) as image:
        image.convert("RGB").quantize(64).save(target, optimize=True)


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="python -m docs.site.browser", description=__doc__)
    parser.add_argument("index", type=Path, nargs="?", default=root / "build/docs/index.html")
    parser.add_argument("--screenshot", type=Path, default=root / "build/docs/screenshot.png")
    parser.add_argument("--full-page", action="store_true", help="screenshot the whole page")
    parser.add_argument("--visualizer", type=Path, help="write the visualizer's screenshot here")
    args = parser.parse_args(argv)
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    report = inspect_page(args.index, args.screenshot, full_page=args.full_page)
    summary = {
        "title": report.title,
        "images": len(report.images),
        "sections": {s["id"]: len(s["rows"]) for s in report.sections},
        "screenshot": str(report.screenshot),
        "problems": problems(report),
    }
    if args.visualizer:
        with tempfile.TemporaryDirectory() as shots:
            _, errors = drive_visualizer(args.index, [Setting()], Path(shots))
            summary["problems"] += errors
            args.visualizer.parent.mkdir(parents=True, exist_ok=True)
            _small_png(Path(shots) / "visualizer-0.png", args.visualizer)
        summary["visualizer"] = str(args.visualizer)
    print(json.dumps(summary, indent=1))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
