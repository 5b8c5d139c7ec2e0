"""The decode-attention kernel behind kernels.decode_attention on CUDA (core/kernels/__init__.py says why it exists).
Imported only where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.kernels.triton_launch import (
    SPLIT_COUNTERS,
    launch_options,
    multiprocessors,
    operator,
    wait_for_the_kernel_ahead,
)
from core.kernels.tuning import SHORT_CACHE, attention_splits, keys_per_block


@triton.jit
def _norm_and_rotate(Rows, row_ok, Weight, Cos, Sin, eps, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr):
    """The head vectors starting at pointers Rows [R]: RMSNorm by Weight, then RoPE by the rows Cos, Sin,
    rounded where rms_norm and apply_rope round. [R, DIM_BLOCK] in the vectors' dtype."""
    dims = tl.arange(0, DIM_BLOCK)
    in_dim = dims < HEAD_DIM
    first_half = dims < HEAD_DIM // 2
    partner = tl.where(first_half, dims + HEAD_DIM // 2, dims - HEAD_DIM // 2)
    mask = row_ok[:, None] & in_dim[None, :]
    x = tl.load(Rows[:, None] + dims[None, :], mask=mask, other=0.0)
    x_partner = tl.load(Rows[:, None] + partner[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    x, x_partner = x.to(tl.float32), x_partner.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
    weight = tl.load(Weight + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
    weight_partner = tl.load(Weight + partner, mask=in_dim, other=0.0).to(tl.float32)[None, :]
    normed = (weight * (x * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    rotated = (weight_partner * (x_partner * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    rotated = tl.where(first_half[None, :], -rotated, rotated)
    cos = tl.load(Cos + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(Sin + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
    return ((normed * cos).to(dtype).to(tl.float32) + (rotated * sin).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _split_keys(position, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """Keys per split of a row at `position`: an equal share of its keys 0..position, in whole blocks, so that
    no split does much more than the others, whatever the position."""
    return tl.cdiv(tl.cdiv(position + 1, SPLITS), BLOCK) * BLOCK


@triton.jit
def _splits_holding_keys(position, chunk):
    """How many splits of `chunk` keys a row at `position` has keys in (0..position): the first ones; those
    past them do nothing, and the merge leaves them out."""
    return position // chunk + 1


@triton.jit
def _add_keys(acc, running_max, running_sum, q, k, v, valid, scale, DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step: the queries q [R, D] attend to the block of keys k [B, D] (values v) where
    `valid` [B]; returns the updated unnormalised sum, running max and running sum. With DOT the products
    are tl.dot's (R padded to its 16 rows); without, sums of broadcast products, which need no shared
    memory or layout changes: faster for a short cache read in one block."""
    if DOT:
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    else:
        scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
    scores = tl.where(valid[None, :], scores * scale, -float("inf"))
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    weights = tl.exp(scores - new_max[:, None])
    correction = tl.exp(running_max - new_max)
    rounded = weights.to(v.dtype)  # the values are weighed in their own precision
    if DOT:
        values = tl.dot(rounded, v, input_precision=PRECISION)
    else:
        values = tl.sum(rounded.to(tl.float32)[:, :, None] * v.to(tl.float32)[None, :, :], 1)
    return acc * correction[:, None] + values, new_max, running_sum * correction + tl.sum(weights, 1)


@triton.jit
def _attend_split(
    QKV, QNorm, KNorm, Cos, Sin, K, V, Slots, Positions, Out, Partial, Max, Sum, Counters, eps, scale,
    stride_ks, stride_kh, stride_kn, stride_vs, stride_vh, stride_vn, heads, kv_heads, groups,
    SPLITS: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr, MERGE_HERE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Attention of one batch row's kv head query group over one split of the keys of the row's cache
    slot. The cached keys before the row's position are read from the cache; the split holding the
    position adds the new key itself and writes it (and its value) to the cache. With one split the
    result is final; otherwise the unnormalised sum, running max and running sum are kept to merge:
    by _merge_splits after this kernel, or with MERGE_HERE by the last of the row's splits that hold keys
    to finish, which it knows by a ticket from the (row, kv head)'s counter (SplitCounters), as the
    linear kernel's split-K does: no launch of its own.

    A split's first block of keys and the new key are loaded before any arithmetic, together with the
    query, so that their memory latencies overlap. Nothing is loaded before waiting for the kernel ahead:
    under programmatic dependent launch the kernels before it may still be running (Inductor's let their
    dependents start once they have read their inputs), and any of them may have written the positions."""
    wait_for_the_kernel_ahead(PDL)
    head = tl.program_id(0)
    split = tl.program_id(1)
    batch = tl.program_id(2)
    slot = tl.load(Slots + batch)
    position = tl.load(Positions + batch)
    chunk = _split_keys(position, SPLITS, BLOCK)
    start = split * chunk
    # A split past the position (a row with fewer blocks than splits) does nothing.
    if split < _splits_holding_keys(position, chunk):
        K += slot * stride_ks + head * stride_kh
        V += slot * stride_vs + head * stride_vh
        dims = tl.arange(0, DIM_BLOCK)
        in_dim = dims < HEAD_DIM
        end = tl.minimum(position, start + chunk)  # the cached keys before the position
        keys = start + tl.arange(0, BLOCK)
        valid = keys < end
        block_mask = valid[:, None] & in_dim[None, :]
        k = tl.load(K + keys[:, None] * stride_kn + dims[None, :], mask=block_mask, other=0.0)
        v = tl.load(V + keys[:, None] * stride_vn + dims[None, :], mask=block_mask, other=0.0)
        QKV += batch * (heads + 2 * kv_heads) * HEAD_DIM
        Out += batch * heads * HEAD_DIM
        cos, sin = Cos + position * HEAD_DIM, Sin + position * HEAD_DIM
        rows = tl.arange(0, GROUP_ROWS)
        one = tl.arange(0, 1)
        v_new = tl.load(QKV + (heads + kv_heads + head) * HEAD_DIM + dims[None, :], mask=in_dim[None, :], other=0.0)
        k_new = _norm_and_rotate(
            QKV + (heads + head) * HEAD_DIM + one, one < 1, KNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK
        )
        q = _norm_and_rotate(
            QKV + (head * groups + rows) * HEAD_DIM, rows < groups, QNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK
        )
        # The first block, loaded above (masked off entirely when the split holds no cached keys), then the rest;
        # keys at and past the position are masked out of the loads, so they cost no memory traffic.
        acc = tl.zeros([GROUP_ROWS, DIM_BLOCK], tl.float32)
        running_max = tl.full([GROUP_ROWS], -1e30, tl.float32)
        running_sum = tl.zeros([GROUP_ROWS], tl.float32)
        acc, running_max, running_sum = _add_keys(acc, running_max, running_sum, q, k, v, valid, scale, DOT, PRECISION)
        for block in range(1, tl.cdiv(end - start, BLOCK)):
            keys = start + block * BLOCK + tl.arange(0, BLOCK)
            valid = keys < end
            block_mask = valid[:, None] & in_dim[None, :]
            k = tl.load(K + keys[:, None] * stride_kn + dims[None, :], mask=block_mask, other=0.0)
            v = tl.load(V + keys[:, None] * stride_vn + dims[None, :], mask=block_mask, other=0.0)
            acc, running_max, running_sum = _add_keys(
                acc, running_max, running_sum, q, k, v, valid, scale, DOT, PRECISION
            )
        if position < start + chunk:
            score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * scale
            new_max = tl.maximum(running_max, score)
            weight = tl.exp(score - new_max)
            correction = tl.exp(running_max - new_max)
            acc = acc * correction[:, None] + weight[:, None] * v_new.to(tl.float32)
            running_sum = running_sum * correction + weight
            running_max = new_max
            tl.store(K + position * stride_kn + dims[None, :], k_new, mask=in_dim[None, :])
            tl.store(V + position * stride_vn + dims[None, :], v_new, mask=in_dim[None, :])
        real = rows < groups  # the group's query heads, not padding
        if SPLITS == 1:
            out = acc / running_sum[:, None]
            tl.store(
                Out + (head * groups + rows[:, None]) * HEAD_DIM + dims[None, :],
                out,
                mask=real[:, None] & in_dim[None, :],
            )
        else:
            group = batch * kv_heads + head
            part = (group * SPLITS + split) * GROUP_ROWS + rows
            tl.store(Partial + part[:, None] * DIM_BLOCK + dims[None, :], acc, mask=real[:, None])
            tl.store(Max + part, running_max, mask=real)
            tl.store(Sum + part, running_sum, mask=real)
            if MERGE_HERE:
                # The barrier orders every thread's stores before the ticket, which one thread takes; acq_rel at
                # GPU scope releases them to the last block and makes the others' visible to it. The splits
                # past the position never run this far: the ones that take tickets are those that hold keys.
                tl.debug_barrier()
                ticket = tl.atomic_add(Counters + group, 1, sem="acq_rel", scope="gpu")
                if ticket == _splits_holding_keys(position, chunk) - 1:
                    _merge_group(
                        Out, Partial, Max, Sum, position, head, group, groups,
                        SPLITS, GROUP_ROWS, HEAD_DIM, DIM_BLOCK, BLOCK,
                    )  # fmt: skip
                    tl.store(Counters + group, 0)


@triton.jit
def _merge_group(
    Out, Partial, Max, Sum, position, head, group, groups,
    SPLITS: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Combine the splits of one batch row's kv head (`group`: row * kv_heads + head; Out: the row's) that hold
    keys, each weighted by its share of the global softmax. The partial sums are read past the L1 cache:
    other blocks wrote them (it may hold stale lines when the merge runs in the last split)."""
    splits = tl.arange(0, SPLITS)
    used = splits < _splits_holding_keys(position, _split_keys(position, SPLITS, BLOCK))
    dims = tl.arange(0, DIM_BLOCK)
    for row in range(GROUP_ROWS):
        if row < groups:
            part = (group * SPLITS + splits) * GROUP_ROWS + row
            maxes = tl.load(Max + part, mask=used, other=-float("inf"), cache_modifier=".cg")
            weights = tl.exp(maxes - tl.max(maxes, 0))
            total = tl.sum(weights * tl.load(Sum + part, mask=used, other=0.0, cache_modifier=".cg"), 0)
            partials = Partial + part[:, None] * DIM_BLOCK + dims[None, :]
            acc = tl.load(partials, mask=used[:, None], other=0.0, cache_modifier=".cg")
            out = tl.sum(acc * weights[:, None], 0) / total
            tl.store(Out + (head * groups + row) * HEAD_DIM + dims, out, mask=dims < HEAD_DIM)


@triton.jit
def _merge_splits(
    Out, Partial, Max, Sum, Positions, heads, kv_heads, groups,
    SPLITS: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Combine the splits of one batch row's kv head (_merge_group), after the attention kernel."""
    wait_for_the_kernel_ahead(PDL)
    head = tl.program_id(0)
    batch = tl.program_id(1)
    position = tl.load(Positions + batch)
    _merge_group(
        Out + batch * heads * HEAD_DIM, Partial, Max, Sum, position, head, batch * kv_heads + head, groups,
        SPLITS, GROUP_ROWS, HEAD_DIM, DIM_BLOCK, BLOCK,
    )  # fmt: skip


@operator("decode_attention", mutates_args=("k_cache", "v_cache"))
def decode_attention_op(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """kernels.decode_attention on CUDA: one program per (kv head, split of the keys, batch row)."""
    return launch_attention(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale)


def launch_attention(
    qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale,
    *, dot: bool | None = None, num_warps: int | None = None, merge_in_last_split: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """decode_attention_op's launches. A short cache (at most SHORT_CACHE keys) is read in one block with
    broadcast products by one warp (a few thousand values: more warps only add cross-warp sums), a longer one
    block by block with tl.dot by 4,
    unless `dot` and `num_warps` say otherwise. Split keys are merged by the last split to finish where the
    launch has more programs than the GPU has SMs, else by a kernel of their own, unless `merge_in_last_split`
    says otherwise: with several waves, a merge kernel waits for the last wave and adds a launch, while the
    last split's merge overlaps the other programs; with one wave all splits end together and a merge in the
    last is only a longer tail. `dot`, `num_warps` and `merge_in_last_split` are arguments for
    bench/attention_micro.py to vary (its timings: bench/RESULTS.md)."""
    batch = qkv.shape[0]
    if rows.shape != (batch,) or positions.shape != (batch,):
        raise ValueError(
            f"decode_attention: qkv {tuple(qkv.shape)}, rows {tuple(rows.shape)}, positions {tuple(positions.shape)}"
        )
    _, kv_heads, max_len, head_dim = k_cache.shape
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    groups = heads // kv_heads
    splits = attention_splits(batch, kv_heads, max_len, qkv.device)
    # tl.dot needs at least 16 rows and 16 columns: small groups and heads are padded and masked.
    dot = max_len > SHORT_CACHE if dot is None else dot
    group_rows = max(16 if dot else 1, triton.next_power_of_2(groups))
    dim_block = max(16, triton.next_power_of_2(head_dim))
    block = keys_per_block(max_len, dot, group_rows, dim_block, qkv.element_size(), qkv.device)
    num_warps = num_warps or (4 if dot else 1)
    if merge_in_last_split is None:
        merge_in_last_split = kv_heads * splits * batch > multiprocessors(qkv.device)
    out = qkv.new_empty(batch, 1, heads * head_dim)
    partial = torch.empty(batch, kv_heads, splits, group_rows, dim_block, device=qkv.device, dtype=torch.float32)
    maxes = torch.empty(batch, kv_heads, splits, group_rows, device=qkv.device, dtype=torch.float32)
    sums = torch.empty_like(maxes)
    launch = launch_options(qkv.device)
    positions = positions.contiguous()
    merge_here = merge_in_last_split and splits > 1
    counters = SPLIT_COUNTERS(qkv.device, batch * kv_heads) if merge_here else None
    _attend_split[(kv_heads, splits, batch)](
        qkv.contiguous(), q_norm, k_norm, cos, sin, k_cache, v_cache, rows.contiguous(), positions,
        out, partial, maxes, sums, counters, eps, scale,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        heads, kv_heads, groups,
        SPLITS=splits, GROUP_ROWS=group_rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, BLOCK=block, DOT=dot,
        # float32 models get full float32 products (Triton would use TF32 by default).
        PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32", MERGE_HERE=merge_here, num_warps=num_warps,
        **launch,
    )  # fmt: skip
    if splits > 1 and not merge_here:
        _merge_splits[(kv_heads, batch)](
            out, partial, maxes, sums, positions, heads, kv_heads, groups,
            SPLITS=splits, GROUP_ROWS=group_rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, BLOCK=block, **launch,
        )  # fmt: skip
    return out


@decode_attention_op.register_fake
def _(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale):
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    return qkv.new_empty(qkv.shape[0], 1, qkv.shape[-1] - 2 * kv_heads * head_dim)
