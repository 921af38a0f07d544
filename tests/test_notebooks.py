"""The notebooks in notebooks/: each runs top to bottom without an error (their cells assert the
numbers that must agree), and none is committed with outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
#: Every notebook runs in make test. 06 (the tiny model) runs NumPy only: with torch and jax it
#: took 13 s (2 cores at a load average of 5.5), now 5 s (3 s less loaded); tests/test_tiny_model.py
#: checks the three frameworks agree on it. 01 imports all three, its point: 14 s (8 s).
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(PATHS) >= 6, PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    notebook = nbformat.read(path, as_version=4)
    # The kernel is ipykernel's own "python3", which runs this interpreter (sys.executable): the
    # venv's. Its working directory is notebooks/; the notebooks find the repository root
    # themselves, and PYTHONPATH carries it too.
    root = str(NOTEBOOKS.parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("MPLBACKEND", "agg")
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs committed"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


def test_outside_the_repository_the_first_cell_says_what_to_do(tmp_path, monkeypatch):
    """Every notebook starts with the same cell; run anywhere else (a fresh Colab), it stops
    with what to do instead of an ImportError further down."""
    firsts = {
        next(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
        for p in PATHS
    }
    assert len(firsts) == 1
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="is not inside the repository: clone it"):
        exec(firsts.pop(), {})
