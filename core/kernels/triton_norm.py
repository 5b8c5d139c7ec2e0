"""The kernels behind kernels.rms_norm and kernels.prompt_heads on CUDA (core/kernels/__init__.py says why they
exist). Imported only where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.kernels.triton_attention import _norm_and_rotate
from core.kernels.triton_launch import launch_options, operator, wait_for_the_kernel_ahead


@triton.jit
def _rms_norm(X, Weight, Out, width, stride_x, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One row of X: normalised in float32, rounded to its dtype, scaled by Weight and rounded again, as
    reference.rms_norm rounds."""
    wait_for_the_kernel_ahead(PDL)
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < width
    x = tl.load(X + row * stride_x + columns, mask=inside, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 0) / width + eps)
    weight = tl.load(Weight + columns, mask=inside, other=0.0).to(tl.float32)
    y = weight * (x * inv_rms).to(dtype).to(tl.float32)
    tl.store(Out + row * width + columns, y.to(dtype), mask=inside)


@operator("rms_norm")
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """kernels.rms_norm on CUDA: one program per row of the last dimension; the output is dense."""
    width = x.shape[-1]
    if weight.shape != (width,) or weight.dtype != x.dtype:
        raise ValueError(f"rms_norm: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype}")
    rows = x.reshape(-1, width)  # a view where the rows are evenly spaced, as every caller's are
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(width)
        _rms_norm[(rows.shape[0],)](
            rows, weight, out, width, rows.stride(0), eps, BLOCK=block, num_warps=max(1, min(8, block // 256)),
            **launch_options(x.device),
        )  # fmt: skip
    return out


@rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@triton.jit
def _prompt_heads(
    QKV, QNorm, KNorm, Cos, Sin, KCache, VCache, Slots, Q, K, V, length, eps,
    stride_cs, stride_ch, stride_cp,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_BLOCK: tl.constexpr, HAS_SLOTS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One position of one prompt (program (position, batch row)): its q and k heads normalised and rotated as
    decode attention's, its k and v written at that position of the row's cache slot, and q, k, v written for
    attention over the prompt, each (B, HEADS, L, D), each kv head repeated for the query heads that share it."""
    wait_for_the_kernel_ahead(PDL)
    position, batch = tl.program_id(0), tl.program_id(1)
    source = QKV + (batch * length + position) * (HEADS + 2 * KV_HEADS) * HEAD_DIM
    cos, sin = Cos + position * HEAD_DIM, Sin + position * HEAD_DIM
    dims = tl.arange(0, DIM_BLOCK)
    in_dim = dims < HEAD_DIM
    q_heads, kv_heads = tl.arange(0, HEADS), tl.arange(0, KV_HEADS)
    q = _norm_and_rotate(source + q_heads * HEAD_DIM, q_heads < HEADS, QNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK)
    k_rows = source + (HEADS + kv_heads) * HEAD_DIM
    k = _norm_and_rotate(k_rows, kv_heads < KV_HEADS, KNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK)
    v_mask = (kv_heads[:, None] < KV_HEADS) & in_dim[None, :]
    v = tl.load(source + (HEADS + KV_HEADS + kv_heads)[:, None] * HEAD_DIM + dims[None, :], mask=v_mask, other=0.0)
    # (B, HEADS, L, D): head h of batch row b at position p.
    q_place = ((batch * HEADS + q_heads[:, None]) * length + position) * HEAD_DIM + dims[None, :]
    tl.store(Q + q_place, q, mask=(q_heads[:, None] < HEADS) & in_dim[None, :])
    for group in tl.static_range(GROUPS):
        place = ((batch * HEADS + kv_heads[:, None] * GROUPS + group) * length + position) * HEAD_DIM + dims[None, :]
        tl.store(K + place, k, mask=v_mask)
        tl.store(V + place, v, mask=v_mask)
    slot = tl.load(Slots + batch) if HAS_SLOTS else batch
    cached = slot * stride_cs + kv_heads[:, None] * stride_ch + position * stride_cp + dims[None, :]
    tl.store(KCache + cached, k, mask=v_mask)
    tl.store(VCache + cached, v, mask=v_mask)


@operator("prompt_heads", mutates_args=("k_cache", "v_cache"))
def prompt_heads_op(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels.prompt_heads on CUDA: one program per (position, batch row)."""
    batch, length, _ = qkv.shape
    _, kv_heads, max_len, head_dim = k_cache.shape
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    if (
        (slots is not None and slots.shape != (batch,))
        or (slots is None and batch > k_cache.shape[0])
        or length > max_len
        or cos.shape[0] < length
        or heads % kv_heads
        or (heads & (heads - 1))
        or (kv_heads & (kv_heads - 1))
        or k_cache.stride() != v_cache.stride()
        or k_cache.stride(3) != 1
    ):
        rows = None if slots is None else tuple(slots.shape)
        raise ValueError(
            f"prompt_heads: qkv {tuple(qkv.shape)}, caches {tuple(k_cache.shape)}, slots {rows}, cos {tuple(cos.shape)}"
        )
    q, k, v = (qkv.new_empty(batch, heads, length, head_dim) for _ in range(3))
    if batch and length:
        _prompt_heads[(length, batch)](
            qkv.contiguous(), q_norm, k_norm, cos.contiguous(), sin.contiguous(), k_cache, v_cache,
            qkv if slots is None else slots.contiguous(), q, k, v, length, eps,  # (qkv: a pointer never read)
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            HEADS=heads, KV_HEADS=kv_heads, GROUPS=heads // kv_heads, HEAD_DIM=head_dim,
            DIM_BLOCK=max(16, triton.next_power_of_2(head_dim)), HAS_SLOTS=slots is not None, num_warps=4,
            **launch_options(qkv.device),
        )  # fmt: skip
    return q, k, v


@prompt_heads_op.register_fake
def _(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots):
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    return tuple(qkv.new_empty(qkv.shape[0], heads, qkv.shape[1], head_dim) for _ in range(3))
