"""The notebooks of ``notebooks/`` on the page: a link to each and to its rendered copy.

``make docs`` executes each notebook (nbclient, on ipykernel's ``python3``: this interpreter)
and renders it with nbconvert to ``<out>/notebooks/<name>.html``, so the copy shows the numbers
and the drawings; about 40 s for all six on 2 cores. ``build`` unexecuted (its default, the
tests') renders the cells alone in about a second.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

#: nbconvert's lab template without the scripts it loads from a CDN (require.js, MathJax,
#: mermaid): the notebooks use none, and the copies then open offline like the page.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


@dataclass(frozen=True)
class Notebook:
    """One notebook on the page: ``source`` relative to the repository root, ``rendered``
    relative to the page."""

    title: str
    source: str
    rendered: str


def _title(notebook) -> str:
    """The first markdown heading, without its ``#``."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def render(root: Path, out: Path, *, execute: bool) -> list[Notebook]:
    """Render every ``root/notebooks/*.ipynb`` to ``out/notebooks/<name>.html`` (executed top
    to bottom first when ``execute``; a failing cell raises nbclient's CellExecutionError)."""
    paths = sorted((root / "notebooks").glob("*.ipynb"))
    if not paths:
        return []
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
        template_file="offline.html.j2",
    )
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    found = []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if execute:
            import nbclient

            resources = {"metadata": {"path": str(path.parent)}}  # the kernel's working directory
            client = nbclient.NotebookClient(
                notebook, timeout=120, kernel_name="python3", resources=resources
            )
            client.execute()
        body, _ = exporter.from_notebook_node(notebook)
        (out / "notebooks" / f"{path.stem}.html").write_text(body)
        source = path.relative_to(root).as_posix()
        found.append(Notebook(_title(notebook), source, f"notebooks/{path.stem}.html"))
    return found


GITHUB = "https://github.com/"
COLAB = "https://colab.research.google.com/github/"


def colab_url(base: str, source: str) -> str | None:
    """Colab's address of a notebook when the page links a GitHub blob
    (``https://github.com/<owner>/<repo>/blob/<ref>/``), else None."""
    if base.startswith(GITHUB) and "/blob/" in base:
        return COLAB + base[len(GITHUB) :] + source
    return None


def section_html(notebooks: list[Notebook], base: str) -> str:
    """The page's Notebooks section; ``base`` prefixes the source links, as the code cells'
    (a GitHub blob URL adds an "open in Colab" link to each)."""
    items = []
    for n in notebooks:
        colab = colab_url(base, n.source)
        colab_html = f', <a class="colab" href="{html.escape(colab)}">Colab</a>' if colab else ""
        items.append(
            f'<li><a class="notebook" href="{html.escape(base + n.source)}">'
            f"<code>{html.escape(n.source)}</code></a> "
            f'(<a class="rendered" href="{html.escape(n.rendered)}">rendered</a>{colab_html}): '
            f"{html.escape(n.title)}</li>"
        )
    items = "\n".join(items)
    return (
        '<section id="notebooks" class="notebooks">\n<h2>Notebooks</h2>\n'
        "<p>Run them with <code>jupyter lab notebooks/</code> (the <code>notebooks</code> extra) "
        "or open the rendered copy; each cell asserts the numbers it shows, and "
        "<code>make test</code> runs them all. In Colab, the first cell needs the repository "
        "cloned and installed (README.md, <em>Notebooks and the visualizer</em>).</p>\n"
        f"<ul>\n{items}\n</ul>\n</section>"
    )
