"""The side-by-side page (docs/site): the steps line up in the real source, drift fails the build
with a message that says where, the idiom notes cannot describe code that is gone, and README's
excerpt is what the generator makes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from docs.site import idioms
from docs.site.page import build, check_idioms, readme_block, readme_excerpt
from docs.site.sections import FRAMEWORK_NAMES, SECTIONS, Section
from docs.site.steps import DriftError, Incomplete, all_steps, section_steps, unshown_steps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real():
    return {s.section.id: s for s in all_steps(ROOT)}


def test_the_real_source_lines_up(real):
    # all_steps raises DriftError on any difference; what it found must also be what we expect
    # (by structure, not by name, so that renumbering the steps only needs new idiom notes).
    assert set(real) == {s.id for s in SECTIONS}  # every section is on the page, none optional
    assert not any(s.optional for s in SECTIONS)
    numbers = [int(s.key.split()[0]) for s in real["functional"].steps]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 6  # 0: fp8 dequantize
    # the tiled path walks the same steps, block by block (it refuses fp8: no step 0)
    flash = {int(s.key.split()[0]) for s in real["flash"].steps}
    assert flash == set(numbers) - {0}
    assert "(end)" in real["flash"].steps[-1].key  # and finishes the softmax after the loop
    backward = {int(s.key.split()[0]) for s in real["flash_backward"].steps}
    assert backward == set(numbers) - {0}  # the tiled backward walks them too
    ring = [s.key.split()[0] for s in real["sharded"].steps]
    assert {"R1", "R5", "R7", "P1", "P3"} <= set(ring)
    assert set(map(str, numbers)) - {"0"} <= set(ring)
    for section in real.values():
        for step in section.steps:
            assert list(step.code) == ["numpy", "torch", "jax"]
            for fw, code in step.code.items():
                assert code.path.startswith(f"impl_{fw}/") and code.text.strip(), (step.id, fw)
                first = (ROOT / code.path).read_text().splitlines()[code.start - 1].strip()
                if step.id != step.group:  # a numbered step, cut at its step comment
                    number = step.key.split()[0]
                    assert f"# {number}. " in first and code.text.startswith(first), (step.id, fw)
    # every numbered step of those files is on a row, but the plain backward NumPy writes alone
    assert unshown_steps(list(real.values()), ROOT) == []


def _copy(root: Path) -> Path:
    for fw in ("numpy", "torch", "jax"):
        shutil.copytree(
            ROOT / f"impl_{fw}", root / f"impl_{fw}", ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"the drift this test makes needs {old!r} in {path}"
    path.write_text(text.replace(old, new, 1))


FUNCTIONAL_SECTION = next(s for s in SECTIONS if s.id == "functional")


@pytest.mark.parametrize(
    ("framework", "old", "new", "expected"),
    [
        # a step missing in one script: named with the file and line where the others have it
        (
            "torch",
            "# 3. additive terms:",
            "# additive terms:",
            r'step "3\. additive terms" is in impl_numpy/functional\.py:\d+ but not in PyTorch',
        ),
        # two steps swapped: the row where the sequences part
        (
            "jax",
            "# 3. additive terms:",
            "# 4. allowed:",
            r'step "3\. additive terms" is in .* but not in JAX',
        ),
        # a renumbered step
        (
            "numpy",
            "# 5. softmax over S",
            "# 4. softmax over S",
            r"step \"4\. softmax over S, stable, with a sink per head\" is in impl_numpy",
        ),
    ],
)
def test_a_drifted_copy_fails_the_build(tmp_path, framework, old, new, expected):
    root = _copy(tmp_path / "repo")
    _edit(root / f"impl_{framework}" / "functional.py", old, new)
    with pytest.raises(DriftError, match=expected) as e:
        build(tmp_path / "site", root=root, figures_dir=ROOT / "docs" / "figures")
    message = str(e.value)
    assert "Scaled dot-product attention" in message and "steps found:" in message
    assert not (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize(
    ("file", "framework", "old", "new", "label"),
    [  # a step comment retitled (its first word kept) in each file the page reads
        (
            "functional.py",
            "jax",
            "# 5. softmax over S, stable, with a sink per head",
            "# 5. softmax over S, stable",
            "5. softmax over S, stable",
        ),
        (
            "flash.py",
            "torch",
            "# 5. online softmax:",
            "# 5. online rescaled softmax:",
            "5. online rescaled softmax",
        ),
        (
            "flash.py",
            "numpy",
            "# 6. output:  dV",
            "# 6. output, by hand:  dV",
            "6. output, by hand",
        ),
        (
            "modules.py",
            "jax",
            "# 3. heads merged back, output projection",
            "# 3. heads merged, output projection",
            "3. heads merged, output projection",
        ),
        ("modules.py", "torch", "# 2. the cache:", "# 2. the new cache:", "2. the new cache"),
        ("sharded.py", "jax", "# R5. merge:", "# R5. merge by lse:", "R5. merge by lse"),
        ("sharded.py", "torch", "# P3. gather:", "# P3. gather all:", "P3. gather all"),
        ("rotary.py", "numpy", "# 3. pairs:", "# 3. pairs of features:", "3. pairs of features"),
    ],
)
def test_a_retitled_step_comment_fails_the_build(tmp_path, file, framework, old, new, label):
    root = _copy(tmp_path / "repo")
    _edit(root / f"impl_{framework}" / file, old, new)
    others = " and ".join(n for fw, n in FRAMEWORK_NAMES.items() if fw != framework)
    with pytest.raises(
        DriftError,
        match=rf'step "{re.escape(label)}" is in '
        rf"impl_{framework}/{re.escape(file)}:\d+ but not in {others}",
    ):
        build(tmp_path / "site", root=root, figures_dir=ROOT / "docs" / "figures")
    assert not (tmp_path / "site" / "index.html").exists()


def test_a_numbered_step_on_no_row_fails(tmp_path, monkeypatch):
    root = _copy(tmp_path / "repo")
    path = root / "impl_torch" / "sharded.py"
    path.write_text(
        path.read_text() + "\n\ndef _extra(x):\n    # 1. scores: torch only\n    return x\n"
    )
    with pytest.raises(
        DriftError,
        match=r"on no row of the side-by-side page.*\n  impl_torch/sharded\.py:\d+: "
        r"# 1\. scores: torch only \(in _extra\)$",
    ):
        all_steps(root)
    # NumPy's hand-written plain backward is left off by name, with its reason; without that
    # it is reported too
    monkeypatch.setattr("docs.site.steps.UNCOMPARED", {})
    with pytest.raises(DriftError) as e:
        all_steps(ROOT)
    assert re.search(
        r"impl_numpy/functional\.py:\d+: # 6\. output = weights @ value: .* "
        r"\(in scaled_dot_product_attention_vjp\)",
        str(e.value),
    )
    # and attention_weights' step 0 (the same dequantize as the row's) in all three
    assert len(re.findall(r"# 0\. dequantize: .*\(in attention_weights\)", str(e.value))) == 3
    vjp = [line for line in str(e.value).splitlines() if "_vjp)" in line]
    assert vjp and all(line.strip().startswith("impl_numpy/") for line in vjp)


def test_a_reordered_step_names_the_row(tmp_path):
    root = _copy(tmp_path / "repo")
    path = root / "impl_jax" / "functional.py"
    text = path.read_text()
    bias = re.search(r"\n    # 3\. additive.*?\n\n", text, re.S).group(0)
    mask = re.search(r"\n    # 4\. allowed.*?\n\n", text, re.S).group(0)
    path.write_text(
        text.replace(bias, "\n#BIAS#\n").replace(mask, bias).replace("\n#BIAS#\n", mask)
    )
    with pytest.raises(
        DriftError,
        match=r'differ at row 4: NumPy has "3\. additive terms" .* JAX has "4\. allowed" '
        r"\(impl_jax/functional\.py:\d+\)",
    ):
        section_steps(FUNCTIONAL_SECTION, root)


def test_a_function_missing_in_one_framework_fails(tmp_path):
    root = _copy(tmp_path / "repo")
    _edit(root / "impl_torch" / "modules.py", "def _project_output(", "def _merge_heads(")
    with pytest.raises(DriftError, match=r"_project_output.* not in impl_torch/modules\.py"):
        all_steps(root)


def _write(root: Path, fw: str, text: str) -> None:
    (root / f"impl_{fw}").mkdir(parents=True, exist_ok=True)
    (root / f"impl_{fw}" / "toy.py").write_text(text)


PLAIN = """
def run(x):
    y = x
    # 1. first: one line.
    y = y + 1
    # 2. second: the helper's steps come after this one.
    y = helper(y)
    # 3. third: the last.
    return y


def helper(y):
    # 9. inside: helper
    return y * 2
"""


def test_helpers_are_read_where_called_and_a_tagged_repeat_continues_its_step(tmp_path):
    _write(tmp_path, "numpy", PLAIN)
    _write(tmp_path, "torch", PLAIN)
    inline = PLAIN.replace("y = helper(y)", "y = y * 2").replace(
        "    # 3. third",
        "    # 2. (extra) a note that only this script needs\n    y = y + 0\n    # 3. third",
    )
    inline = inline.replace("    # 9. inside: helper\n", "")
    _write(tmp_path, "jax", inline)
    section = Section("toy", "Toy", "toy.py", functions=("run",), helpers=("helper",))
    with pytest.raises(
        DriftError, match=r'step "9\. inside" is in impl_numpy/toy\.py:13 but not in JAX'
    ):
        section_steps(section, tmp_path)
    _write(
        tmp_path,
        "jax",
        PLAIN.replace("    # 3. third", "    # 2. (extra) a note\n    y = y + 0\n    # 3. third"),
    )
    steps = section_steps(section, tmp_path).steps
    assert [s.key for s in steps] == ["1 first", "2 second", "9 inside", "3 third"]
    assert steps[2].code["numpy"].function == "helper"
    assert "# 2. (extra) a note" in steps[1].code["jax"].text  # the continuation joined step 2
    assert "# 2. (extra)" not in steps[1].code["numpy"].text
    assert steps[0].code["numpy"].text == "# 1. first: one line.\ny = y + 1"  # dedented, no blank


CLOSURE = """
def run(x):
    y = x
    # 1. first: one line.
    y = y + 1

    def later(z):
        return helper(z)

    # 2. second: the helper runs in this step, through a local function defined before it.
    y = later(y)
    if y is not None:  # 3. third: a step comment after the code it names
        y = y
    return y


def helper(y):
    # 9. inside: helper
    return y * 2
"""


def test_a_helper_runs_where_its_local_wrapper_is_used(tmp_path):
    for fw in ("numpy", "torch"):
        _write(tmp_path, fw, PLAIN)
    _write(tmp_path, "jax", CLOSURE)  # JAX's idiom: def attend(c): ...; lax.cond(..., attend)
    section = Section("toy", "Toy", "toy.py", functions=("run",), helpers=("helper",))
    steps = section_steps(section, tmp_path).steps
    assert [s.key for s in steps] == ["1 first", "2 second", "9 inside", "3 third"]
    third = steps[3].code["jax"]
    assert third.text.splitlines() == [
        "if y is not None:  # 3. third: a step comment after the code it names",
        "    y = y",
        "return y",
    ]


def test_an_optional_section_appears_once_all_three_have_it_and_is_then_checked(tmp_path):
    section = Section("toy", "Toy", "toy.py", functions=("*",), optional=True)
    assert section_steps(section, tmp_path) is None
    _write(tmp_path, "numpy", PLAIN)  # one framework first: left off the page, and said why
    with pytest.raises(Incomplete, match=r"impl_numpy/toy\.py exist\(s\) but impl_torch/toy\.py"):
        section_steps(section, tmp_path)
    skipped: list[str] = []
    assert all_steps(tmp_path, (section,), skipped) == [] and skipped[0].startswith("toy: ")
    for fw in ("torch", "jax"):
        _write(tmp_path, fw, PLAIN)
    found = section_steps(section, tmp_path)
    assert found.groups == ("run", "helper")  # "*": every function with numbered steps
    _write(tmp_path, "jax", PLAIN.replace("# 3. third", "# 4. third"))  # now drift is an error
    with pytest.raises(DriftError, match=r'step "3\. third" is in impl_numpy/toy\.py:8'):
        section_steps(section, tmp_path)
    # a fixed section with a file missing in one framework is drift, not incomplete
    fixed = Section("toy", "Toy", "toy.py", functions=("run",))
    (tmp_path / "impl_torch" / "toy.py").unlink()
    with pytest.raises(DriftError, match=r"impl_torch/toy\.py does not"):
        section_steps(fixed, tmp_path)


def test_every_row_of_the_fixed_sections_has_an_idiom_note(real):
    missing = check_idioms(list(real.values()))
    fixed = {s.id for s in SECTIONS if not s.optional}
    assert [m for m in missing if m.split(":")[0] in fixed] == []


def test_a_note_quoting_code_that_is_gone_fails(real, monkeypatch):
    notes = {**idioms.IDIOMS, "functional": {**idioms.IDIOMS["functional"]}}
    # what the hand-written README table said after torch moved to masked_fill_
    notes["functional"]["4. allowed"] = "torch selects with `torch.where(mask, s, -inf)`"
    monkeypatch.setattr("docs.site.page.IDIOMS", notes)
    with pytest.raises(DriftError, match=r"quotes `torch\.where\(mask, s, -inf\)`, which none"):
        check_idioms(list(real.values()))
    notes["functional"] = {"3. biases": "no such row"}
    with pytest.raises(DriftError, match=r"\['functional'\]\['3\. biases'\] is about no row"):
        check_idioms(list(real.values()))


def test_the_readme_excerpt_is_what_the_generator_makes(real):
    block = readme_block((ROOT / "README.md").read_text())
    assert block == readme_excerpt(list(real.values())), "README.md is stale: run `make docs`"
    assert "| 3. additive terms |" in block and "`add_`" in block


def test_the_page_is_static_and_has_every_row(tmp_path, real):
    built = build(tmp_path / "site")
    page = built.index.read_text()
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page)  # nothing from the network
    # the only scripts: the visualizer's data and its own file, next to the page
    scripts = re.findall(r"<script[^>]*>", page)
    assert scripts == [
        '<script type="application/json" id="viz-data">',
        '<script src="visualizer.js">',
    ]
    for s in real.values():
        assert f'id="{s.section.id}"' in page
    assert page.count('<tr class="step"') == sum(len(s.steps) for s in real.values())
    assert page.count('<td class="code"') == 3 * page.count('<tr class="step"')
    assert (
        'class="highlight"' in page
        and ".highlight .k" in (built.index.parent / "style.css").read_text()
    )
    for name in built.figures:
        assert (built.index.parent / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    link = re.search(r'href="([^"]+)#L(\d+)">impl_numpy/functional\.py:(\d+)', page)
    target = (built.index.parent / link.group(1)).resolve()
    assert target == ROOT / "impl_numpy" / "functional.py" and link.group(2) == link.group(3)


def test_the_page_links_every_notebook_and_its_rendered_copy(tmp_path):
    pytest.importorskip("nbconvert")
    out = tmp_path / "site"
    built = build(out)
    page = built.index.read_text()
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(built.notebooks) == len(paths) >= 6
    for path, notebook in zip(paths, built.notebooks):
        source = f"notebooks/{path.name}"
        assert notebook.source == source and notebook.title
        href = re.search(f'<a class="notebook" href="([^"]*{re.escape(source)})"', page)
        assert href, source
        assert (out / href.group(1)).resolve() == path  # the link reaches the notebook
        assert f'<a class="rendered" href="{notebook.rendered}">' in page
        rendered = (out / notebook.rendered).read_text()
        assert "<html" in rendered
        assert not re.search(r"""(src|href)=["'](https?:)?//""", rendered)  # opens offline
        # the title's words (nbconvert escapes quotes its own way)
        assert all(word in rendered for word in re.findall(r"[A-Za-z]{4,}", notebook.title))


def test_a_github_source_url_adds_a_colab_link_to_each_notebook(tmp_path):
    pytest.importorskip("nbconvert")
    base = "https://github.com/owner/rosetta/blob/0123abc/"
    built = build(tmp_path / "site", source_url=base)
    page = built.index.read_text()
    for n in built.notebooks:
        colab = f"https://colab.research.google.com/github/owner/rosetta/blob/0123abc/{n.source}"
        assert f'<a class="colab" href="{colab}">Colab</a>' in page
    assert 'class="colab"' not in build(tmp_path / "local").index.read_text()  # file links
