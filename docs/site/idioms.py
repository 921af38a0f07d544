"""One sentence per step on what differs in the idiom: the page's notes and the README's excerpt.

Keyed by section id (docs/site/sections.py) and then by the row: a numbered step by its NumPy
label (``"5. causal, whole blocks"``), a function shown whole by its NumPy name. The build fails
on a note whose row no longer exists, and on a ``code span`` in a note that none of the three
implementations' lines of that row contain, so a note cannot go on describing code that changed.
"""

from __future__ import annotations

IDIOMS: dict[str, dict[str, str]] = {
    "functional": {
        "0. dequantize": (
            'Identical in the three: `_dequantized(query, "q_descale", call, kw)` turns an fp8 '
            "input into float32 times its descale (the same few lines in each helper: none of "
            "the three has an fp8 matmul on a CPU) and passes any other input through, so the "
            "steps below run in float32; `_output_dtype(query.dtype)` is bfloat16 for an fp8 "
            "query, the query's own dtype otherwise."
        ),
        "1. scores": (
            "NumPy and torch reshape the query heads of a group into `G * L` rows against "
            "their one key head (`reshape(*query.shape[:-3], K, G * L, D)`: no copy of the "
            "keys) and scale in place (`s *= call.scale`, `mul_`); JAX contracts the same "
            "groups against the unexpanded key in one `jnp.einsum`, the scale on the queries "
            "(`q * call.scale`: XLA would fuse a later s * scale into s - max as an FMA)."
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
            "place with `np.copyto(s, -np.inf, where=~allowed)`, torch with "
            '`s.masked_fill_(~allowed, float("-inf"))` (on every device, with or without '
            "autograd), JAX selects into a new array with `jnp.where(allowed, s, -jnp.inf)`."
        ),
        "5. softmax over S, stable, with a sink per head": (
            "The same lines in the three, with and without autograd: subtract the row max, "
            "clamp the exponent at 0, exponentiate, divide, a row of no allowed key sent to "
            "zeros. NumPy in place (`np.minimum(s, 0.0, out=s)`); torch in place on a detached "
            "max (`s.sub_(row_max).clamp_(max=0.0)`, `exp_`), not `torch.softmax`, which "
            "leaves an empty row NaN with a NaN gradient and has no sink; JAX with the max "
            "held constant (`jax.lax.stop_gradient`) and a clamp that passes the gradient "
            "through (`_min0`)."
        ),
        "6. output": (
            "NumPy and torch multiply the weights grouped as `G * L` rows per value head "
            "against the unexpanded value (`w @ v`), JAX contracts `(..., K, G, L, S)` in "
            "`jnp.einsum`; all three cast back to the input dtype only here."
        ),
    },
    "flash": {
        "4. allowed, whole blocks": (
            "NumPy and torch yield only the key blocks some row may see, from a Python loop "
            "that starts at the band's first key (`range(lo, hi, self.block_k)`); JAX, causal, "
            "runs two `jax.lax.fori_loop`s whose bounds depend on the query block (the blocks "
            "every row sees, then the diagonal's), and otherwise a scan of fixed length, each "
            "block outside the bands skipped with `jax.lax.cond` and one past the last key "
            "doing nothing (`j0 < S`)."
        ),
        "4. allowed, this block": (
            "NumPy and torch build the block's `allowed` only where a boundary crosses it "
            "(`every` is decided in Python); JAX decides it per loop (`if bands:`, False for the "
            "blocks inside the bands), with the keys below `j0` of a block shifted back to keep "
            "its size static (`j >= blk.j0`). Key and "
            "value rows no row of the block attends are zeroed (`_unattended_zeroed`), and only "
            "when a mask, segment ids or a bias can leave one unattended (`banded`)."
        ),
        "1. scores": (
            "The functional step on one block: NumPy and torch multiply the `G * bq` rows of a "
            "group against the block `k_blk` sliced in the Python loop (torch scales with "
            "`mul_` in place), and JAX contracts the groups in one `jnp.einsum` on blocks its "
            "loops hand it, the scale on the block's queries (`blk.q * call.scale`: XLA would "
            "fuse a later s * scale into s - max as an FMA)."
        ),
        "2. softcap": (
            "Kept as `tanh` for the backward's factor: in place in NumPy "
            "(`np.tanh(s, out=s)`) and torch (`tanh_()`), out of place in JAX (`jnp.tanh`)."
        ),
        "3. additive terms": (
            "Each gets the block's slice of the bias, `bias_blk`, and ALiBi at the block's own "
            "rows and keys (never an (H, L, S) tensor): NumPy adds in place with `s +=`, torch "
            "with `add_`, JAX out of place."
        ),
        "4. allowed": (
            "NumPy writes -inf in place with `np.copyto`, torch with `masked_fill_`, JAX "
            "selects with `jnp.where`."
        ),
        "5. online softmax": (
            "The same recurrence (`m_new`, `alpha`, `l`) in all three, the exponent clamped at "
            "0: NumPy in place (`np.minimum(s, 0.0, out=s)`), torch chained in place "
            "(`clamp_`, `exp_`), JAX out of place (`jnp.minimum(s, 0.0)`; autodiff never "
            "enters: the backward is the custom one, which rebuilds the weights from the row "
            "log-sum-exp)."
        ),
        "6. output, accumulated": (
            "All three multiply grouped `p` against the unexpanded value block (torch as "
            "`G * bq` rows per value head, `reshape(*p.shape[:-3], K, G * bq, j1 - j0)`); "
            "NumPy and torch free the block (`del s, p`), JAX hands the scan its new carry "
            "(`return m_new, l, acc`)."
        ),
        "5. (end) the sink joins the denominator once, as one more logit with no value": (
            "Then divide once by `l` (1 for a row with no allowed key) and keep the row "
            "log-sum-exp for the backward: NumPy and torch write into preallocated "
            "`out[..., i0:i1, :]`, JAX returns the block from the scan body and the scan "
            "stacks the blocks."
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
            "The float64 numbers of `dims.frequencies` (computed once, in attention_spec), or the "
            "caller's `inv_freq` (llama3, YaRN) taken to float64, become an array in the compute "
            "dtype: `np.asarray`, `torch.as_tensor` on `x.device`, `jnp.asarray`."
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
    "cache": {
        "KVCache.quantize": (
            "Identical in the three: a cache of the module's dtype gives the new tokens back; an "
            "fp8 cache quantizes them at its descales (`_quantized`, the package's own "
            "quantize), the first write's dynamic ones kept on a new cache (`replace`)."
        ),
        "KVCache.write": (
            "Identical in the three: `self.quantize(k, v)`, then `cache._put(k, v)` stores "
            "tokens already in the buffers' dtype."
        ),
        "KVCache._put": (
            "NumPy and torch write the new tokens into the buffers in place; JAX arrays are "
            "immutable, so `.at[:, :, self.position : end].set(k)` makes new buffers and a new "
            "cache."
        ),
        "KVCache.read": (
            "Identical in the three: a plain cache's first `self.position` tokens (a view); a "
            "rolling cache's last ones, gathered from their ring slots (`self._ring`)."
        ),
    },
    "decode": {
        "GroupedQueryAttention.init_cache": (
            "Zero buffers for K heads of T slots (`max_len`, or a rolling cache's window); "
            "torch puts them on the weights' device (`device = self.q_proj.weight.device`)."
        ),
        "1. projections of the new tokens": (
            "The same in the three, after the cache was validated (before any write, so an "
            "error leaves it as it was)."
        ),
        "2. the cache": (
            "`cache.append` writes the new tokens (NumPy and torch into the buffers in place, "
            "JAX into new buffers) and returns the cache with its position advanced and the keys "
            "and values to attend; a rolling cache returns its kept window, then the new tokens."
        ),
        "3. attention over the S keys, bottom-right causal": (
            'The functional API with `causal_alignment="bottom_right"`: new token i sees every '
            "cached token and new tokens 0..i, within the module's window."
        ),
        "4. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`."
        ),
    },
    "paged_decode": {
        "1. projections of the new tokens": (
            "The contiguous decode's step, after check_paged_decode_inputs (before any page is "
            "taken or written, so an error leaves the cache as it was)."
        ),
        "2. the cache": (
            "`cache.write` takes each sequence's new pages from the front of the pool's free "
            "list (Python bookkeeping, the same in the three) and stores the tokens with "
            "paged_cache_write: NumPy and torch into the pool in place, JAX into a new pool."
        ),
        "3. attention through paged_attention": (
            "The queries go token-major, NumPy and JAX with `transpose(0, 2, 1, 3)`, torch with "
            "`transpose(1, 2)`; `seq_lens` and `cu_seqlens_q` are built in the framework "
            "(`torch.full`/`torch.arange` on the queries' device, `jnp.full`) and the block "
            "table comes from `cache.block_table()`, -1 past the pages held."
        ),
        "4. heads merged back, output projection": (
            "Back to heads-first, then `self._project_output` as in the contiguous decode."
        ),
    },
    "prefill": {
        "1. projections of the packed tokens, token-major": (
            "The row x (1, T, M) goes through the usual projections; each token's own position "
            'comes from a search over `cu` (`np.searchsorted` with `side="right"`, torch\'s '
            "`right=True`, `jnp.searchsorted`), and RoPE rotates with it."
        ),
        "2. attention of each sequence over its own keys": (
            "Identical in the three: `varlen_attention` with `cu_seqlens` for both queries and "
            "keys and the module's options."
        ),
        "3. heads merged back, output projection": (
            "Back to heads-first (`transpose(1, 0, 2)`, torch `transpose(0, 1)`), then "
            "`self._project_output`."
        ),
    },
    "varlen": {
        "0. dequantize": (
            "Each row's sequence by searchsorted (the same call in the three), then the paged "
            "path's _descaled at those rows; an fp8 cache with a half query runs in float32."
        ),
        "1. each packed row's sequence and its position there": (
            "searchsorted on the boundaries in the three (NumPy's side=right, torch's "
            "right=True): no loop over sequences, so JAX traces the boundaries."
        ),
        "2. each sequence's diagonal, from its own L_n and S_n": (
            "One `(N,)` vector of offsets gathered at each row's sequence, the same indexing in "
            "the three."
        ),
        "3. allowed(i, j)": (
            "The shared rules of attention_spec.rules on broadcast (Tq, 1) and (1, Tk) "
            "positions, ANDed with the same-sequence test; ALiBi becomes a bias."
        ),
        "4. the packed call, heads-first": (
            "A heads-first view (_heads_first) into the plain scaled_dot_product_attention "
            "with the block-diagonal mask, the same call in the three."
        ),
        "4. the packed call's gradients, heads-first": (
            "The plain vjp of the packed call: NumPy's by hand, torch's and JAX's through autograd."
        ),
        "5. back to token-major": (
            "A swap of the first two axes, made contiguous in NumPy and torch (JAX has no "
            "layout to fix)."
        ),
    },
    "varlen_flash": {
        "0. dequantize": (
            "As the packed call's step 0; the tiled calls below then see float32 inputs."
        ),
        "1. each sequence alone, tiled": (
            "A Python list over attention_spec.sequence_bounds (host ints) in the three, each "
            "a flash_attention(_vjp) of the sequence's slices; JAX's loop needs concrete "
            "boundaries, so it is called outside jit (traced ones are ConfigError)."
        ),
        "2. back to token-major, the sequences one after another": (
            "Concatenated along the rows (np.concatenate, torch.cat, jnp.concatenate), then "
            "the axes swapped back; dsinks is a Python sum over the sequences in the three."
        ),
    },
    "paged_flash": {
        "0. the block": (
            "A Python loop over attention_spec.sequence_pages (host ints) in the three, then over "
            "each sequence's blocks of pages; a block is one gather of whole pages "
            "(`key_cache[pages]`, the same in the three, `pages` a slice of the sequence's "
            "block-table row; torch slices `table`, its int64 copy). JAX's loops need concrete "
            "seq_lens and cu_seqlens_q, so under jit they are closed over (traced ones are "
            "ConfigError); the block table may be traced."
        ),
        "1. scores": (
            "One batched matmul per key/value head over the block, the G query heads and L_n "
            "rows of the group stacked as rows: `@` in NumPy and torch, `jnp.matmul` with "
            "`precision=_PRECISION` in JAX so float32 stays float32 on every backend."
        ),
        "2. softcap": (
            "The formula as it reads, out of place in the three (`np.tanh`, `torch.tanh`, "
            "`jnp.tanh`)."
        ),
        "3. ALiBi, -slope[h] * |i - j|": (
            "The shared rule `alibi` of attention_spec on the sequence's positions and the "
            "block's keys."
        ),
        "4. allowed": (
            "The shared rules `causal` and `window_rule` on the positions `i`; the masked scores "
            "go to -inf with `where` (`np.where`, `torch.where`, `jnp.where`)."
        ),
        "5. online softmax, as flash_attention's": (
            "flash_attention's update: `np.minimum`/`jnp.minimum` where torch writes "
            "`clamp(max=0.0)`, and `amax` for torch's row max."
        ),
        "6. output, accumulated": (
            "The weights times the block's values, the same batched matmul as step 1; `acc` is "
            "rebound in the loop in the three (JAX's Python loop is unrolled when traced)."
        ),
        "5. (end) the sink joins the denominator once": (
            "After a sequence's last block, the same lines in the three: the sink rescales `l` "
            "and `acc` once, and an empty row divides by 1."
        ),
    },
    "flash_backward": {
        "4. allowed, whole blocks": (
            "The forward's tiling, visited again in the same order: NumPy and torch reuse the "
            "forward's loop over `key_band`; JAX runs the forward's loops again "
            "(`jax.lax.fori_loop`, `jax.lax.scan`), recomputing each block's first key."
        ),
        "4. allowed, this block": (
            "The forward's block rules (`_allowed`), the same code; in JAX the keys below `j0` "
            "of a last block shifted back stay out (`j >= blk.j0`)."
        ),
        "1. scores": (
            "Recomputed per block rather than kept from the forward (FlashAttention-2's trade: "
            "memory linear in L for one more matmul per block); the backward reads the "
            "forward's grouped blocks, one key and value head per group."
        ),
        "2. softcap": (
            "The forward's step; `tanh` is returned with the scores, for the chain rule's "
            "1 - tanh^2."
        ),
        "3. additive terms": (
            "The forward's step; the block's slice of the bias is returned too, so dS can be "
            "summed into the bias gradient."
        ),
        "4. allowed": (
            "As in the forward: NumPy `np.copyto`, torch `masked_fill_`, JAX `jnp.where`; the "
            "backward's P is then zero there, so dS is too."
        ),
        "5. (end) the sink": (
            "One gradient per head and row: NumPy and torch write each block's rows into "
            "`dsinks[..., i0:i1]` and sum them afterwards; JAX carries the running sum through "
            "the scan, summing the batch axes and the rows "
            "of each block (`per_row.sum(axis=(*range(per_row.ndim - 2), -1))`)."
        ),
        "5. the block's weights, rebuilt from the row log-sum-exp": (
            "The forward's clamped exponent again, so P never exceeds 1: NumPy in place "
            "(`np.minimum(s, 0.0, out=s)`), torch chained in place (`clamp_(max=0.0)`), JAX "
            "out of place (`jnp.minimum(s, 0.0)`: the backward is written by hand, so the clamp "
            "needs no gradient); torch then views P as the group's `G * bq` rows."
        ),
        "6. output": (
            "dV summed over each group of G query heads: NumPy on grouped arrays "
            "(`.sum(axis=-3)`), torch inside one matmul over the group's rows "
            "(`p.transpose(-2, -1) @ do_blk`), JAX in one `jnp.einsum` with no group axis in "
            "its output, added at a traced row (`_add_rows`)."
        ),
        "5. softmax": (
            "The same `dS = P * (dP - D)` in the three; torch reuses dP's memory "
            "(`dp.sub_(delta).mul_(p)`)."
        ),
    },
    "sharded": {
        "R1. split": (
            "NumPy builds every device's pieces as lists indexed by rank (`held`); a torch rank "
            "cuts only its own (`torch.cat`); JAX puts rows and keys in shard order (zigzag: "
            "`jnp.take`) and lets `jax.shard_map` cut them along L and S (`in_specs`), running "
            "`_ring_device` on each device's pieces."
        ),
        "R2. the ring": (
            "The accumulators start at output 0 and log-sum-exp -inf in all three; NumPy and "
            "torch loop over the steps in Python (`for t in range(n)`), JAX marks the "
            "accumulators as differing between devices (`_varying`: lax.pcast along the mesh "
            "axes the keys differ along, which lax.cond and lax.scan need) "
            "and runs steps 0 .. n-2 as one `jax.lax.scan`, then the last step, which sends "
            "nothing (`send=False`)."
        ),
        "R3. step t": (
            "The same arithmetic in all three, `src = (r - t) % n`: in NumPy `r` is the loop "
            "over simulated devices, in torch this process's rank, in JAX a traced integer "
            "(lax.axis_index)."
        ),
        "R4. rotate, started": (
            "NumPy puts the held shard in its right neighbour's slot of `arriving`; torch posts "
            "`dist.batch_isend_irecv` (two sends to the right, two receives from the left into "
            "`torch.empty_like` buffers); JAX's `jax.lax.ppermute` is a collective-permute that "
            "XLA may overlap with the blocks. None sends at the last step."
        ),
        "4. allowed, whole blocks": (
            "The same decision in all three, on positions and segment ids, never on shard "
            "numbers (`block_computed`: causal, window and segment rules on the block's "
            "corners): NumPy and torch `continue` their Python loop; JAX's chunk numbers are "
            "traced, so `jax.lax.cond` runs `_attend_block` or `_unseen`, whose zeros and -inf "
            "a merge leaves unchanged."
        ),
        "4. allowed, this block": (
            "The flash block's rule at this block's rows and keys, functional.py's `_allowed` "
            "at the positions `q_pos` and `k_pos` (traced in JAX) with the block's slices of "
            "the mask and segment ids; "
            "functional.py's `_attended` and `_unattended_zeroed` zero the key and value rows "
            "no row of the block attends. NumPy keeps key heads as `(..., K, 1, Sc, D)` for its "
            "grouped matmul."
        ),
        "1. scores": (
            "As in the functional path: NumPy multiplies the grouped query heads against the "
            "broadcast key (`(..., K, G, Lc, Sc)`), torch the group's `G * Lc` rows against "
            "its one key head (`reshape(*q.shape[:-3], K, G * Lc, D)`), JAX contracts the "
            "groups in one `jnp.einsum`, the scale on the queries."
        ),
        "2. softcap": (
            "In place in NumPy (`np.tanh(s, out=s)`), out of place in torch (`torch.tanh`) and JAX."
        ),
        "3. additive terms": (
            "The block's columns of the device's bias rows and ALiBi at the block's positions "
            "(`alibi`): added in place in NumPy (`s += bias`) and torch (`add_`); JAX writes "
            "`s = s + bias`."
        ),
        "4. allowed": (
            "NumPy writes -inf in place with `np.copyto`, torch with `masked_fill_`, JAX "
            "selects with `jnp.where` (and broadcasts to the batch only then)."
        ),
        "5. softmax over this block's keys, stable, and its row log-sum-exp": (
            "The functional softmax on one block, plus the row log-sum-exp `lse` the merge "
            "needs: subtract the row max (0 for a row with no allowed key here), clamp the "
            "exponent at 0 (`np.minimum`, `clamp_`, and in JAX `_min0`, the functional "
            "path's clamp that passes the gradient through), divide by the row sum (1 where "
            "it is 0); JAX holds the max constant for autodiff (`jax.lax.stop_gradient`), "
            "torch works in place (`sub_`, `exp_`, `div_`)."
        ),
        "6. output": (
            "Grouped weights against the unexpanded value block in the three: NumPy "
            "(`w @ v`), torch as `G * Lc` rows per value head, JAX in `jnp.einsum`; normalized "
            "over this block's keys only, in the compute dtype."
        ),
        "R5. merge": (
            "`_merge` is the same stable log-sum-exp in the three: each side reweighted by "
            "exp(its lse - the larger one), a side at -inf counting nothing; JAX holds the "
            "larger one constant for autodiff, so gradients flow through both shares."
        ),
        "R4. (end) rotate, finished": (
            "NumPy swaps in the shards that arrived (`held = arriving`); torch waits for each "
            "request (`request.wait()`) before the received buffers become the held shard; JAX "
            "returns them as the scan's next carry."
        ),
        "R6. sink": (
            "The same merge in the three, once per query chunk after the ring: the sink is a "
            "block whose value is zero and whose lse is `sinks[h]`; JAX does it on the device, "
            "inside shard_map."
        ),
        "R7. gather": (
            "NumPy writes each device's chunks into one array; torch ranks exchange their rows "
            "with `dist.all_gather` (after the one rounding) and each puts them in place; in "
            "JAX the result is already one array sharded along L (`out_specs`), and zigzag's "
            "rows go back in order with `jnp.take`."
        ),
        "P1. split": (
            "NumPy and torch slice the device's heads out of the whole arrays (torch with "
            "flash's `_block`); JAX gives shard_map specs that cut the head axes "
            "(`_spec(a, -3, HEADS)`): K/n key/value heads and H/n query heads per device."
        ),
        "P2. attend": (
            "Identical in the three: the framework's own `scaled_dot_product_attention` on the "
            "device's heads, with its heads of the array keywords and every other keyword as "
            "given (`**on_heads`)."
        ),
        "P3. gather": (
            "NumPy concatenates along H (`np.concatenate`), torch gathers every rank's heads "
            "(`dist.all_gather`); in JAX the shard_map call is the gather: its `out_specs` put "
            "the devices' heads side by side along H."
        ),
        "P1. split the projections": (
            "Megatron's column-parallel split: NumPy and torch project with the device's "
            "features only (torch: rows of nn.Linear's weight, `proj.weight[start:stop]`); "
            "JAX shards the kernels with `P(None, HEADS)` (o_proj's rows with "
            "`P(HEADS, None)`) and projects inside the per-device function."
        ),
        "P2. attend on its heads": (
            "Identical in the three: the unsharded contract on the device's heads; NumPy and "
            "torch cut the mask's and bias's heads (`_block`), JAX's come cut by shard_map."
        ),
        "P3. row-parallel output projection": (
            "The device's features meet its rows of o_proj's kernel (NumPy, JAX) or its "
            "columns of torch's `(M, H*E)` weight, in the compute dtype: "
            "`F.linear(merged.to(ct), cols.to(ct))`."
        ),
        "P4. all-reduce": (
            "NumPy sums the list of partials; torch's `dist.all_reduce` sums in place on every "
            "rank; JAX's `jax.lax.psum` over the heads axis, inside shard_map."
        ),
        "P5. output bias": (
            "Added once, after the sum, never per device (that would add it n times); JAX's "
            "`out_specs=P()` says the shard_map result is the same on every device."
        ),
    },
    "ulysses": {
        "U1. split": (
            "NumPy cuts every device's positions into lists indexed by rank; a torch rank cuts "
            "only its own, with `_Split.apply(query, -2, r, n, group)` (an autograd Function "
            "whose backward gathers the ranks' parts, so every rank gets the whole gradient); "
            "JAX gives shard_map specs that cut along the positions (`_spec(a, -2, SEQ)`), and "
            "along the heads for a mask or bias with H heads, sinks and slopes (`P(SEQ)`)."
        ),
        "U2. all-to-all, positions to heads": (
            "One text in the three: piece d is the device's positions of device d's query "
            "heads and of the key/value heads they read, read off the plan "
            "(`kv_heads[d]`: split, or the one head d*K // n when n % K == 0, sent as it "
            "is, never repeated into extra heads first), and `_exchange` joins what arrives "
            "along the positions. Its all-to-all: NumPy transposes a list of lists, torch "
            "stacks the pieces in rank order for dist.all_to_all_single (gloo has it on CPU; "
            "an autograd Function whose backward is the same exchange), JAX stacks them for "
            "lax.all_to_all over dim 0 inside shard_map (its transpose is the reverse "
            "all-to-all)."
        ),
        "U3. attend": (
            "The framework's own `scaled_dot_product_attention` on the device's heads, every "
            "position; NumPy and torch cut the mask's heads (`_block`), torch the differentiable "
            "keywords with `_held` (the whole gradient back to every rank), JAX's come cut by "
            "shard_map (`x.get(name)`)."
        ),
        "U4. all-to-all, heads to positions": (
            "The same `_exchange`, pieces the device's heads at device d's rows, joined along "
            "the heads; then NumPy concatenates the devices' rows, torch gathers them on every "
            "rank (`_Gather.apply(mine, -2, r, n, group)`: its backward is the rank's own "
            "part), and JAX returns the rows as they are: shard_map's out_specs make them one "
            "array sharded along L."
        ),
        "S1. split": (
            "Rows and keys in ring shard order, then device g = i*u + j takes the g-th 1/(u r): "
            "NumPy cuts lists from `query[..., rows, :]`, a torch rank indexes only its own "
            "(`rows[g * Lm : (g + 1) * Lm]`), JAX reorders with `jnp.take` and lets shard_map "
            "cut along both mesh axes (`both = (SEQ, ULY)`)."
        ),
        "S2. all-to-all inside the ring group, positions to heads (Ulysses' U2)": (
            "Ulysses' exchange among the u members of a ring group: NumPy runs it per group "
            "(`_in_group`), a torch rank in its Ulysses sub-group (`mates`, made once by "
            "new_group), JAX over the mesh's `ULY` axis; the pieces are the plan's heads in "
            "the three."
        ),
        "S3. the ring across the groups": (
            "Member j's heads ring across the groups: NumPy and torch call their own "
            "`ring_attention` (torch in its ring sub-group, `group=ring_mates`, on arrays that "
            "hold this rank's shard in place and zeros it never reads), JAX runs the ring's "
            "per-device body `_ring_device` over the mesh's seq axis inside the same shard_map."
        ),
        "S4. all-to-all inside the ring group, heads to positions (Ulysses' U4)": (
            "The second exchange of the group, member d's rows of every member's heads; torch "
            "finds member d's rows in the whole ring output (`its_rows`), JAX's ring device "
            "holds only its shard's rows (`_rows(out, d * Lm, Lm)`)."
        ),
        "S5. gather": (
            "The devices' rows in device order are the sequence in shard order: NumPy "
            "concatenates, torch gathers on every rank (`_gather`), JAX's result is sharded "
            "along L; all three put the rows back with the inverse order (`argsort(rows)`)."
        ),
    },
    "mla": {
        "MultiHeadLatentAttention._project_query": (
            "`q_proj`, or `q_a_proj`, the float32 RMSNorm and `q_b_proj` when the query has a "
            "latent, then the heads split and cut into nope and rope parts: `reshape` and "
            "`transpose(0, 2, 1, 3)` in NumPy and JAX, torch's `view` and `transpose(1, 2)`; JAX "
            "reads the norm's nnx parameter as `self.q_a_layernorm[...]`."
        ),
        "MultiHeadLatentAttention._project_latent": (
            "Identical in the three: one `kv_a_proj_with_mqa`, its first R features normed "
            "(`rms_norm`) into the latent, the last Dr the one shared key head, both given a "
            "head axis of 1 (`c_kv[:, None]`)."
        ),
        "MultiHeadLatentAttention._rotate": (
            "The project's `apply_rotary` of the rope parts only, at positions "
            "`start + np.arange(q_pe.shape[2])`, `torch.arange` on the query's device or "
            "`jnp.arange`; a YaRN or llama3 `inv_freq` goes in as float64 (torch's "
            "`torch.tensor(r.inv_freq, dtype=torch.float64, device=device)`)."
        ),
        "MultiHeadLatentAttention._expand": (
            "`kv_b_proj` of the latent, its `(B, S, H, Dn + E)` rows split into keys and "
            "values: `reshape` and `transpose(0, 2, 1, 3)` in NumPy and JAX, `view` and "
            "`transpose(1, 2)` in torch."
        ),
        "MultiHeadLatentAttention._heads": (
            "The one shared `k_pe` head is broadcast to the H heads without a copy "
            "(`np.broadcast_to`, torch's `k_pe.expand`, `jnp.broadcast_to`) and each head's "
            "query and key are the nope and rope parts side by side (`np.concatenate`, "
            "`torch.cat`, `jnp.concatenate`)."
        ),
        "MultiHeadLatentAttention._project_output": (
            "Merge the heads back to `(B, L, H * E)`: `transpose(0, 2, 1, 3)` in NumPy and JAX, "
            "`transpose(1, 2)` in torch, then `self.o_proj`."
        ),
        "1. projections": (
            "The same calls in the three: `self._project_query(x)` and "
            "`self._project_latent(x)`, on inputs each framework converted first."
        ),
        "2. RoPE of q_pe and k_pe": (
            "Identical in the three: `self._rotate(q_pe, k_pe, 0)`, the rope parts only."
        ),
        "3. keys and values of every head from the latent": (
            "Identical in the three: `self._expand(c_kv)`, then `self._heads` joins the nope "
            "and rope parts per head."
        ),
        "4. attention of every head, scale (Dn + Dr) ** -0.5 unless given": (
            "Identical in the three: `self._attend` calls the functional attention with the "
            "module's scale, window, softcap and sinks, every mask keyword passed through "
            "(`q_segment_ids=q_segment_ids`), as GQA's does."
        ),
        "5. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`."
        ),
    },
    "mla_decode": {
        "MultiHeadLatentAttention._absorbed": (
            "`kv_b_proj`'s kernel of R rows viewed per head (`(R, H, Dn + E)`) and split into "
            "W_UK and W_UV: "
            "NumPy reads its own `self.kv_b_proj.kernel`, JAX the nnx parameter's value "
            "(`self.kv_b_proj.kernel[...]`), torch transposes nn.Linear's out-by-in weight "
            "(`linear_weight(self.kv_b_proj.weight)`)."
        ),
        "MultiHeadLatentAttention.init_cache": (
            "One zero buffer of one head, the latent `[c_kv, k_pe]` of R + Dr numbers per "
            "token, and a zero-width value (`np.zeros`, `torch.zeros` on the RMSNorm weight's "
            "device, `jnp.zeros`), in the project's `KVCache`: the key slots hold c_kv and the "
            "rotated key in one row, and the values are read from them."
        ),
        "1. projections of the new tokens": (
            "The same calls as the forward's (`self._project_latent(x)`), after the latent cache "
            "was validated, before any write."
        ),
        "2. RoPE": (
            "Identical in the three: `self._rotate(q_pe, k_pe_new, cache.position)`; the "
            "rotated key is what the cache keeps, so a cached token is never rotated again."
        ),
        "3. absorption of kv_b_proj's key part into the query": (
            "One einsum per framework in the compute dtype (`np.einsum`, `torch.einsum`, "
            "`jnp.einsum` with `precision=_PRECISION`, as every JAX matmul of the project), "
            "cast back with `astype(self.dtype)` or `to(self.dtype)`."
        ),
        "4. the latent cache": (
            "The L new rows `[c_kv, k_pe]` concatenated (`np.concatenate`, `torch.cat`, "
            "`jnp.concatenate`), then `cache.append(latent_new, latent_new[..., :0])`: NumPy "
            "and torch write into the buffer in place, JAX returns a new one; all three return "
            "the S cached rows to attend."
        ),
        "5. one MQA over the latent": (
            "The project's own attention with K = 1: the query `[q_lat, q_pe]` concatenated, "
            "the key the S cached rows and the value their first R features, `v = k[..., :R]`: "
            "a view in NumPy and torch (the cached tokens are not copied), a slice in JAX; "
            "bottom-right causal."
        ),
        "6. absorption of the value part into the output": (
            'The second einsum, `"bhlr,rhe->bhle"` with W_UV in the compute dtype; JAX '
            "casts on a line of its own (`out = out.astype(self.dtype)`)."
        ),
        "7. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`, the forward's own."
        ),
    },
    "mla_decode_paged": {
        "1. projections of the new tokens": (
            "The absorbed decode's calls, after check_paged_decode_inputs on the paged latent "
            "pool's dims (one head, keys of R + Dr, values of R), before any page is taken."
        ),
        "2. RoPE": (
            "Identical in the three: `self._rotate(q_pe, k_pe_new, cache.position)`; the pool "
            "keeps the rotated k_pe, as the contiguous latent cache does."
        ),
        "3. absorption of kv_b_proj's key part into the query": (
            "The absorbed decode's einsum, line for line (JAX with `precision=_PRECISION`)."
        ),
        "4. the latent cache": (
            "`cache.write` with the key `[c_kv, k_pe]` and the value `c_kv_new`, the GQA paged "
            "cache's own write with K = 1: the key pages get the concatenation "
            "(`np.concatenate`, `torch.cat`, `jnp.concatenate`), the value pages the latent; "
            "NumPy and torch in place, JAX into a new pool."
        ),
        "5. one MQA through paged_attention": (
            "The query `[q_lat, q_pe]` token-major (NumPy and JAX `transpose(0, 2, 1, 3)`, "
            "torch `transpose(1, 2)`), `seq_lens` and `cu_seqlens_q` built in the framework "
            "(torch on x's device), the module's scale, window, softcap and sinks passed "
            "explicitly; the output o_lat has the R features of the value pages."
        ),
        "6. absorption of the value part into the output": (
            "The absorbed decode's second einsum; JAX casts on a line of its own."
        ),
        "7. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`."
        ),
    },
    "mla_decode_naive": {
        "MultiHeadLatentAttention.init_kv_cache": (
            "Two zero buffers of all H heads, keys of Dn + Dr and values of E numbers per token "
            "(`np.zeros`, `torch.zeros` with the module's dtype and device, `jnp.zeros`), in the "
            "project's `KVCache`, the GQA module's cache with K = H: H (Dn + Dr + E) numbers "
            "per token against the latent cache's R + Dr."
        ),
        "1. projections of the new tokens": (
            "The forward's calls, `self._project_query(x)` and `self._project_latent(x)`, after "
            "the cache was validated (against the naive cache's shapes), "
            "before any write."
        ),
        "2. RoPE": (
            "Identical in the three: `self._rotate(q_pe, k_pe, cache.position)`, so the cached "
            "keys hold their rope part already rotated, as the GQA cache does."
        ),
        "3. keys and values of every head, appended to the cache": (
            "The forward's `self._expand(c_kv)` and `self._heads` of the new tokens only, "
            "then `cache.append(k_new, v_new)`: NumPy and torch write into the buffers in "
            "place, JAX returns new ones; all three give back the S cached keys and values."
        ),
        "4. attention over the S keys, bottom-right causal": (
            "Identical in the three: `self._attend` with `is_causal=True` and "
            '`causal_alignment="bottom_right"`, the module\'s scale, (Dn + Dr) ** -0.5 '
            "unless given, and every mask keyword passed through."
        ),
        "5. heads merged back, output projection": (
            "Identical in the three: `self._project_output(out)`, the forward's own."
        ),
    },
}
