"""The README's example runs as written and prints what it says, in all three frameworks."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_module_example_prints_the_documented_numbers(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("One weight file, three frameworks") :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:3]
    documented = re.search(r"Each prints\n\n```\n(.*?)\n```", section, flags=re.S).group(1)
    assert [("impl_" + fw) in b for fw, b in zip(("numpy", "torch", "jax"), blocks)] == [True] * 3
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    for block in blocks:  # in order: the NumPy block writes the weight file the others load
        run = subprocess.run(
            [sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == documented


def test_readme_hugging_face_example_is_within_the_float32_bound(tmp_path):
    """The README's tiny-Llama example: Hugging Face's layer and our three modules, the largest
    difference printed. It must be within the fixture rule's float32 bound of that layer (the
    bound each of them has against the float64 oracle), recomputed here from the checkpoint the
    example wrote and the same input."""
    import numpy as np
    import pytest

    pytest.importorskip("transformers")
    from conformance.oracle import module_forward, tolerance_bound
    from impl_torch.hf import load_hf_attention

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Rotary positions and Hugging Face models") :]
    block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    printed = float(
        re.fullmatch(r"largest difference from Hugging Face: (\S+)", run.stdout.strip())[1]
    )

    weights, options = load_hf_attention(tmp_path / "tiny-llama", layer=1)
    x = np.random.default_rng(0).standard_normal((1, 7, 64)).astype(np.float32)  # the example's
    w64 = {n: a.astype(np.float64) for n, a in weights.items()}
    kw = dict(n_heads=options["n_heads"], n_kv_heads=options["n_kv_heads"], is_causal=True,
              rope_theta=options["rope_theta"])
    golden = module_forward(w64, x.astype(np.float64), **kw).output
    plain = module_forward(w64, x.astype(np.float64), **kw, round_to="float32").output
    bound = tolerance_bound(golden, plain, "float32")
    assert printed <= bound, (printed, bound)


def test_the_drawn_rule_grids_are_the_rules():
    """Every grid in docs/SEMANTICS.md's "The v2 rules, drawn" is what attention_spec.rules
    computes for the expression in the comment above it (L = 6 rows, S = 8 keys)."""
    import numpy as np

    from attention_spec import rules

    text = (ROOT / "docs" / "SEMANTICS.md").read_text()
    drawn = re.findall(r"<!-- (grid|distances): (.*?) -->\n```\n(.*?)\n```", text, flags=re.S)
    assert len(drawn) >= 6
    i, j = np.arange(6)[:, None], np.arange(8)[None, :]
    for kind, expression, picture in drawn:
        value = np.broadcast_to(
            eval(expression, {"rules": rules, "np": np, "i": i, "j": j}), (6, 8)
        )
        if kind == "grid":
            expected = "\n".join(" ".join("#" if x else "." for x in row) for row in value)
        else:
            expected = "\n".join(" ".join(str(int(x)) for x in row) for row in value)
        assert picture == expected, expression
