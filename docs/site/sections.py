"""What the side-by-side page shows: one entry per section. Data only; ``steps.py`` reads it.

Each section names a file that ``impl_numpy/``, ``impl_torch/`` and ``impl_jax/`` all have, and the
functions in it to put side by side (``Class.method``; ``a | b`` when the frameworks name it
differently, as torch's ``forward`` is NumPy's and JAX's ``__call__``). A function with numbered
step comments (``# 1. ...``) gives one row per step; one without gives a single row. A helper is
read where the function calls it: its steps come right after the caller's step that calls it.
``"*"`` means every function of the file that has numbered steps. An optional section appears by
itself once its file and functions exist in all three implementations, and is then checked like
the others; while only some have them it is left off the page, and the build says so.
"""

from __future__ import annotations

from dataclasses import dataclass

FRAMEWORKS = ("numpy", "torch", "jax")  # the page's columns, in this order
FRAMEWORK_NAMES = {"numpy": "NumPy", "torch": "PyTorch", "jax": "JAX"}


@dataclass(frozen=True)
class Section:
    id: str  # the HTML anchor and the key of the section's idiom notes in idioms.py
    title: str
    file: str  # the file name inside each impl_<framework>/ package
    functions: tuple[str, ...]  # shown in this order; "*": every function with numbered steps
    helpers: tuple[str, ...] = ()  # read where the functions call them
    optional: bool = False  # shown once all three have its file and functions


SECTIONS: tuple[Section, ...] = (
    Section(
        "functional",
        "Scaled dot-product attention",
        "functional.py",
        functions=("scaled_dot_product_attention",),
        helpers=("_weights",),
    ),
    Section(
        "flash",
        "Tiled (flash) attention",
        "flash.py",
        functions=("_forward",),
        helpers=("key_blocks", "_key_blocks", "scores", "_block_scores", "_attend_block"),
    ),
    Section(
        "modules",
        "Modules and their projections",
        "modules.py",
        functions=(
            "GroupedQueryAttention.__init__",
            "GroupedQueryAttention._project_query",
            "GroupedQueryAttention._project_key_value",
            "GroupedQueryAttention._rotate",
            "GroupedQueryAttention._attend",
            "GroupedQueryAttention._project_output",
            "GroupedQueryAttention.__call__ | GroupedQueryAttention.forward",
        ),
    ),
    Section(
        "cache",
        "The KV cache",
        "cache.py",
        functions=("KVCache.quantize", "KVCache.write", "KVCache._put", "KVCache.read"),
    ),
    Section(
        "decode",
        "KV-cache decoding",
        "modules.py",
        functions=("GroupedQueryAttention.init_cache", "GroupedQueryAttention.decode"),
    ),
    Section(
        "rotary",
        "Rotary position embedding",
        "rotary.py",
        functions=("apply_rotary",),
    ),
    # The tiled backward is written out in all three (the plain one is not: UNCOMPARED).
    Section(
        "flash_backward",
        "Tiled backward pass (vjp)",
        "flash.py",
        functions=("_backward",),
        helpers=("key_blocks", "_key_blocks", "scores", "_block_scores", "_grad_block"),
    ),
    Section(
        "sharded",
        "Sharded attention",
        "sharded.py",
        functions=("ring_attention", "head_parallel_attention", "head_parallel_gqa"),
        helpers=("_ring_device", "_ring_step", "_attend_block"),
    ),
    # USP's ring is a call of the ring (NumPy's and torch's ring_attention, JAX's _ring_device,
    # shown in the section above): no helpers here, so S3 is one row in the three.
    Section(
        "ulysses",
        "All-to-all sequence parallelism (Ulysses, USP)",
        "ulysses.py",
        functions=("ulysses_attention", "usp_attention"),
    ),
    Section(
        "mla",
        "Multi-head latent attention",
        "mla.py",
        functions=(
            "MultiHeadLatentAttention._project_query",
            "MultiHeadLatentAttention._project_latent",
            "MultiHeadLatentAttention._rotate",
            "MultiHeadLatentAttention._expand",
            "MultiHeadLatentAttention._heads",
            "MultiHeadLatentAttention._project_output",
            "MultiHeadLatentAttention.__call__ | MultiHeadLatentAttention.forward",
        ),
    ),
    Section(
        "paged_decode",
        "KV-cache decoding on a paged cache",
        "modules.py",
        functions=("GroupedQueryAttention._decode_paged",),
    ),
    Section(
        "prefill",
        "Packed prefill of sequences of different lengths",
        "modules.py",
        functions=("GroupedQueryAttention.prefill",),
    ),
    Section(
        "paged_flash",
        "Paged tiled read: each sequence's pages in blocks (paged_flash_attention)",
        "flash.py",
        functions=("paged_flash_attention",),
    ),
    Section(
        "varlen",
        "Variable-length batches: the packed call (varlen_attention)",
        "varlen.py",
        functions=("_sequence_rules", "varlen_attention", "varlen_attention_vjp"),
    ),
    Section(
        "varlen_flash",
        "Variable-length tiled path: each sequence's own blocks (varlen_flash_attention)",
        "varlen.py",
        functions=("varlen_flash_attention", "varlen_flash_attention_vjp"),
    ),
    Section(
        "mla_decode",
        "Multi-head latent attention: the absorbed decode",
        "mla.py",
        functions=(
            "MultiHeadLatentAttention._absorbed",
            "MultiHeadLatentAttention.init_cache",
            "MultiHeadLatentAttention.decode",
        ),
    ),
    # FlashMLA's form: the absorbed decode's steps, its cache (step 4) a paged latent pool and its
    # MQA (step 5) a paged_attention call (the paged_decode section's).
    Section(
        "mla_decode_paged",
        "Multi-head latent attention: the absorbed decode on a paged latent cache",
        "mla.py",
        functions=("MultiHeadLatentAttention._decode_paged",),
    ),
    # The naive decode: the forward's steps with the KV cache's append (section decode) in step 3.
    Section(
        "mla_decode_naive",
        "Multi-head latent attention: the naive decode",
        "mla.py",
        functions=(
            "MultiHeadLatentAttention.init_kv_cache",
            "MultiHeadLatentAttention.decode_naive",
        ),
    ),
)

#: The functions (``"impl_<framework>/<file>::<qualified name>"``) whose numbered steps are on no
#: row of the page, and why. Every other numbered step of a section's file must be on one
#: (``steps.all_steps`` checks it), so a step added in one script only cannot go unseen.
UNCOMPARED: dict[str, str] = {
    "impl_numpy/functional.py::scaled_dot_product_attention_vjp": (
        "the plain backward: NumPy writes its steps 6 to 1 out by hand, torch and JAX take their "
        "autograd of the forward, so there is no second and third column to line up"
    ),
    **{
        f"impl_{fw}/functional.py::attention_weights": (
            "scaled_dot_product_attention's rows already show it: its step 0 is the same "
            "dequantize, its steps 1 to 5 are the same `_weights` helper, and it has no step 6"
        )
        for fw in FRAMEWORKS
    },
    **{
        f"impl_{fw}/flash.py::flash_attention": (
            "its one numbered step is the functional section's step 0 (the same `_dequantized` "
            "call, row 'dequantize' there); the tiled steps are `_forward`'s, in the flash section"
        )
        for fw in FRAMEWORKS
    },
}
