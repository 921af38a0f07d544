"""One sentence per step on what differs in the idiom: the page's notes and the README's excerpt.

Keyed by section id (docs/site/sections.py) and then by the row: a numbered step by its NumPy
label (``"5. causal, whole blocks"``), a function shown whole by its NumPy name. The build fails
on a note whose row no longer exists, and on a ``code span`` in a note that none of the three
implementations' lines of that row contain, so a note cannot go on describing code that changed.
"""

from __future__ import annotations

IDIOMS: dict[str, dict[str, str]] = {
    "functional": {
        "1. scores": (
            "NumPy views the query heads as `(..., K, G, L, D)` groups against a broadcast key "
            "`[..., :, None, :, :]` and scales in place (`s *= dims.scale`); torch copies each "
            "key head G times with `repeat_interleave` and scales with `mul_`; JAX contracts the "
            "same groups against the unexpanded key in one `jnp.einsum`."
        ),
        "2. softcap": (
            "NumPy divides, takes `np.tanh(s, out=s)` and multiplies, all in place; torch stays "
            "out of place because `torch.tanh` keeps its output for the backward pass; JAX "
            "writes the formula as it reads."
        ),
        "3. bias": (
            "NumPy adds in place (`s +=`) and torch too (`add_`: autograd keeps nothing of the "
            "scores here), while JAX arrays are immutable: `s = s + bias`."
        ),
        "4. mask": (
            "NumPy writes -inf in place with `np.copyto(s, -np.inf, where=~mask)`, torch with "
            "`masked_fill_`, JAX selects into a new array with `jnp.where(mask, s, -jnp.inf)`."
        ),
        "5. causal": (
            "The same `causal_mask(L, S, alignment=causal_alignment)` in all three; torch builds "
            "it where the scores live (`device=s.device`), and under JAX's jit L and S are "
            "static, so the mask is a constant of the compiled program."
        ),
        "6. softmax over S, stable": (
            "Subtract the row max, exponentiate, divide, with a row of no allowed key sent to "
            "zeros: NumPy in place (`np.exp(s, out=s)`, `initial=-np.inf`), torch on "
            "`s.detach()` with `sub_` and `exp_`, JAX with `jax.lax.stop_gradient` (the max is a "
            "constant for autodiff in both)."
        ),
        "7. output": (
            "NumPy and JAX multiply the weights grouped as `(..., K, G, L, S)` against the "
            "unexpanded value (`w @ v`, `jnp.einsum`), torch repeats the value heads with "
            "`repeat_interleave`; all three cast back to the input dtype only here."
        ),
    },
    "flash": {
        "5. causal, whole blocks": (
            "NumPy and torch stop their Python loop over key blocks at `j_end`; a JAX scan "
            "cannot stop early, so each invisible block is skipped with `jax.lax.cond`."
        ),
        "1. scores": (
            "The functional step on one block: NumPy slices `k[..., j0:j1, :]` inside a Python "
            "loop, torch also repeats the block's key heads (`repeat_interleave`), and JAX gets "
            "its blocks as arguments of a scan body (`q_blk`, `k_blk`)."
        ),
        "2. softcap": (
            "As in the functional path: in place in NumPy (`np.tanh(s, out=s)`), out of place "
            "in torch (`torch.tanh`) and JAX."
        ),
        "3. bias": (
            "NumPy and torch cut the block's slice of the bias with `_block` at Python indices "
            "(NumPy in place with `s +=`), JAX is handed `bias_blk`, sliced at a traced start."
        ),
        "4. mask": (
            "NumPy writes -inf in place with `np.copyto`; torch and JAX select with "
            "`torch.where` and `jnp.where`."
        ),
        "5. causal, inside the block": (
            "NumPy and torch mask only a block the diagonal crosses (`j1 - 1 > i0 + offset`, "
            "decided in Python); JAX masks every block, and also the keys below `j0` of a last "
            "block shifted back to keep its size static (`j >= j0`)."
        ),
        "6. online softmax": (
            "The same recurrence (`m_new`, `alpha`, `l`) in all three; the max is a constant "
            "for autodiff through `s.detach()` in torch and `jax.lax.stop_gradient` in JAX, "
            "and NumPy exponentiates in place (`np.exp(s, out=s)`)."
        ),
        "7. output, accumulated": (
            "NumPy and JAX multiply grouped `p` against the unexpanded value block, torch "
            "against `repeat_interleave`d heads; NumPy and torch free the block (`del s, p`), "
            "JAX hands the scan its new carry (`return m_new, l, acc`)."
        ),
        "6. (end) divide by the row sum once, after the last key block": (
            "Divide once by `l` (1 for a row with no allowed key): NumPy writes into a "
            "preallocated `out[..., i0:i1, :]`, torch appends to a list (`outs.append`), JAX "
            "returns the block from the scan body, and the scan stacks the blocks."
        ),
    },
    "modules": {
        "GroupedQueryAttention.__init__": (
            "NumPy builds its own `Linear` (kernel `(M, H*D)`, in by out), torch uses "
            "`nn.Linear` (weight `(H*D, M)`, out by in) and `reset_parameters`, JAX "
            "flax's nnx.Linear through `_linear` (kernel `(M, H*D)`) with `rngs`."
        ),
        "GroupedQueryAttention._project_query": (
            "Split the heads: `reshape` and `transpose(0, 2, 1, 3)` in NumPy and JAX, "
            "torch's `view` and `transpose(1, 2)`."
        ),
        "GroupedQueryAttention._project_key_value": (
            "The same split for K key/value heads, not H: `reshape` in NumPy and JAX, `view` in "
            "torch."
        ),
        "GroupedQueryAttention._attend": (
            "Identical in the three: the module calls the functional "
            "`scaled_dot_product_attention`, and `attention_weights` only when asked."
        ),
        "GroupedQueryAttention._project_output": (
            "Merge the heads back to `(B, L, H*E)`: `transpose(0, 2, 1, 3)` in NumPy and JAX, "
            "`transpose(1, 2)` in torch, then the output projection."
        ),
        "GroupedQueryAttention.__call__": (
            "torch's entry point is `forward` (called through the module's __call__); NumPy and "
            "JAX convert their inputs first (`np.asarray`, `jnp.asarray`), torch takes tensors "
            "as they are."
        ),
    },
    "decode": {
        "GroupedQueryAttention.init_cache": (
            "Zero buffers for K heads of `max_len` tokens; torch puts them on the weights' "
            "device (`device=self.q_proj.weight.device`)."
        ),
        "KVCache.write": (
            "NumPy and torch write the new tokens into the buffers in place; JAX arrays are "
            "immutable, so `.at[:, :, self.position : end].set(k)` makes new buffers and a new "
            "cache."
        ),
        "KVCache.read": "Identical in the three: a view of the first `self.position` tokens.",
        "GroupedQueryAttention.decode": (
            "The same steps in the three: project, `cache.write`, `cache.read`, then attend "
            'with `causal_alignment="bottom_right"`; only the input conversion differs.'
        ),
    },
}
