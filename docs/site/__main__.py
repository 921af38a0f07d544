"""``python -m docs.site``: write the side-by-side page and refresh the README's excerpt.

    python -m docs.site [--out build/docs] [--check-readme] [--source-url URL] [--no-execute]

The notebooks' rendered copies are executed first (about 40 s); --no-execute renders the cells
alone.

Exits 1 with the reason when the three implementations' steps do not line up, when an idiom
note is stale, or (with --check-readme) when README.md's excerpt is not what the generator makes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from docs.site.page import build, readme_block, readme_excerpt, update_readme
from docs.site.steps import ROOT, DriftError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.site", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "docs")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument(
        "--check-readme", action="store_true", help="fail if the README excerpt is stale"
    )
    parser.add_argument("--source-url", help="base of the file:line links (default: the files)")
    parser.add_argument(
        "--no-execute", action="store_true", help="render the notebooks without running them"
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        built = build(
            args.out.resolve(), source_url=args.source_url, execute_notebooks=not args.no_execute
        )
    except (DriftError, FileNotFoundError) as e:
        print(f"docs/site: the page was not built.\n{e}", file=sys.stderr)
        return 1
    excerpt = readme_excerpt(built.sections)
    if args.check_readme:
        if readme_block(args.readme.read_text()) != excerpt:
            print(f"docs/site: {args.readme} excerpt is stale; run `make docs`", file=sys.stderr)
            return 1
    elif update_readme(args.readme, excerpt):
        print(f"updated the generated excerpt in {args.readme}")
    rows = sum(len(s.steps) for s in built.sections)
    print(
        f"wrote {built.index} ({len(built.sections)} sections, {rows} rows, "
        f"{len(built.figures)} figures, {len(built.notebooks)} notebooks) "
        f"in {time.perf_counter() - t0:.1f} s; "
        f"open file://{built.index}"
    )
    for reason in built.skipped:
        print(f"  left off until all three implementations have it: {reason}")
    for note in built.missing_notes:
        print(f"  no idiom note yet (docs/site/idioms.py): {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
