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
        "3. additive terms": (
            "NumPy adds in place (`s +=`) and torch too (`add_`: autograd keeps nothing of the "
            "scores here), while JAX arrays are immutable: `s = s + bias`."
        ),
        "4. allowed": (
            "One boolean, `allowed`, from the rules (mask AND causal): NumPy writes -inf in "
            "place with `np.copyto(s, -np.inf, where=~allowed)`, torch with `masked_fill_`, JAX "
            "selects into a new array with `jnp.where(allowed, s, -jnp.inf)`."
        ),
        "5. softmax over S, stable": (
            "Subtract the row max, clamp the exponent at 0, exponentiate, divide, with a row of "
            "no allowed key sent to zeros: NumPy in place (`np.minimum(s, 0.0, out=s)`), torch "
            "on `s.detach()` with `sub_`, `clamp_` and `exp_`, JAX with "
            "`jax.lax.stop_gradient` and a second shift (`_finite_max`), because XLA computes "
            "the first one as a fused multiply-add of the unrounded scores."
        ),
        "6. output": (
            "NumPy and JAX multiply the weights grouped as `(..., K, G, L, S)` against the "
            "unexpanded value (`w @ v`, `jnp.einsum`), torch repeats the value heads with "
            "`repeat_interleave`; all three cast back to the input dtype only here."
        ),
    },
    "flash": {
        "4. allowed, whole blocks": (
            "NumPy and torch stop their Python loop over key blocks at `j_end`; a JAX scan "
            "cannot stop early, so each invisible block is skipped with `jax.lax.cond`."
        ),
        "4. allowed, this block": (
            "NumPy and torch build the block's `allowed` only where a boundary crosses it (the "
            "diagonal test `j1 - 1 > i0 + offset` is decided in Python); JAX builds it for every "
            "block, with the keys below `j0` of a last block shifted back to keep its size "
            "static (`j >= j0`). Key and value rows no row of the block attends are zeroed "
            "(`_unattended_zeroed`)."
        ),
        "1. scores": (
            "The functional step on one block: NumPy and torch multiply the block `k_blk` they "
            "sliced in the Python loop (torch also repeats its key heads, "
            "`repeat_interleave`), and JAX gets its blocks as arguments of a scan body "
            "(`q_blk`, `k_blk`)."
        ),
        "2. softcap": (
            "As in the functional path: in place in NumPy (`np.tanh(s, out=s)`), out of place "
            "in torch (`torch.tanh`) and JAX."
        ),
        "3. additive terms": (
            "Each gets the block's slice of the bias, `bias_blk`: NumPy and torch cut it at "
            "Python indices (NumPy adds in place with `s +=`), JAX at a traced start."
        ),
        "4. allowed": (
            "NumPy writes -inf in place with `np.copyto`; torch and JAX select with "
            "`torch.where` and `jnp.where`."
        ),
        "5. online softmax": (
            "The same recurrence (`m_new`, `alpha`, `l`) in all three; the max is a constant "
            "for autodiff through `s.detach()` in torch and `jax.lax.stop_gradient` in JAX, "
            "and NumPy exponentiates in place (`np.exp(s, out=s)`)."
        ),
        "6. output, accumulated": (
            "NumPy and JAX multiply grouped `p` against the unexpanded value block, torch "
            "against `repeat_interleave`d heads; NumPy and torch free the block (`del s, p`), "
            "JAX hands the scan its new carry (`return m_new, l, acc`)."
        ),
        "5. (end) divide by the row sum once, after the last key block": (
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
        "GroupedQueryAttention._rotate": (
            "The same in the three: `apply_rotary` of the query and key heads at positions "
            "`q_start + np.arange(L)`, `q_start + torch.arange(L, device=q.device)` or "
            "`q_start + jnp.arange(L)`; nothing when `self.rope is None`."
        ),
        "GroupedQueryAttention._attend": (
            "Identical in the three: the module calls the functional "
            "`scaled_dot_product_attention`, and `attention_weights` only when asked."
        ),
        "GroupedQueryAttention._project_output": (
            "Merge the heads back to `(B, L, H*E)`: `transpose(0, 2, 1, 3)` in NumPy and JAX, "
            "`transpose(1, 2)` in torch, then the output projection."
        ),
        "1. projections": (
            "The same calls in the three scripts: `self._project_query(x)` and "
            "`self._project_key_value`, on inputs each framework converted first."
        ),
        "2. attention of every head": (
            "Identical in the three: `self._attend` on the projected heads."
        ),
        "3. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`."
        ),
    },
    "rotary": {
        "1. frequencies": (
            "The float64 numbers of `dims.frequencies` (computed once, in attention_spec) become "
            "an array in the compute dtype: `np.asarray`, `torch.tensor` on `x.device`, "
            "`jnp.asarray`."
        ),
        "2. angles": (
            "Positions broadcast to `(..., L)` (`np.broadcast_to`, torch's `expand`, "
            "`jnp.broadcast_to`), then `pos[..., None, :, None] * inv_freq`: one angle per token "
            "and pair, shared by the heads."
        ),
        "3. pairs": (
            "NumPy and JAX slice with a step (`rotated[..., 0::2]`) or in halves; torch views "
            "the interleaved pairs as `unflatten(-1, (P, 2))` and splits the halves with `split`."
        ),
        "4. rotation": "Identical in the three: `x1 * cos - x2 * sin` and `x2 * cos + x1 * sin`.",
        "5. pairs back in their places, in the input dtype": (
            "Interleaved pairs are stacked on a last axis and flattened (`np.stack` and "
            "`reshape`, `torch.stack` and `flatten(-2)`, `jnp.stack`), halves concatenated; the "
            "features past R are appended as they were."
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
        "1. projections of the new tokens": (
            "The same in the three, after the cache was validated (before any write, so an "
            "error leaves it as it was)."
        ),
        "2. the cache": (
            "`cache.write` fills NumPy's and torch's buffers in place and returns a cache with "
            "the position advanced; JAX's returns new buffers."
        ),
        "3. attention over all S keys, bottom-right causal": (
            'The functional API with `causal_alignment="bottom_right"`: new token i sees every '
            "cached token and new tokens 0..i."
        ),
        "4. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`."
        ),
    },
}
