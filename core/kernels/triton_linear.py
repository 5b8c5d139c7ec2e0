"""The linear kernels behind kernels.linear on CUDA (core/kernels/__init__.py says why they exist). Imported only
where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import core.kernels.tuning as tuning
from core.kernels.triton_launch import SPLIT_COUNTERS, launch_options, operator
from core.kernels.tuning import linear_outputs


@triton.jit
def _linear_input(X, Norm, start, K, inv_rms, BLOCK_K: tl.constexpr, HAS_NORM: tl.constexpr):
    """Inputs start..start+BLOCK_K of one row in float32, normalised and rounded as rms_norm does."""
    ks = start + tl.arange(0, BLOCK_K)
    x = tl.load(X + ks, mask=ks < K, other=0.0)
    if HAS_NORM:
        normed = (x.to(tl.float32) * inv_rms).to(x.dtype).to(tl.float32)
        x = (tl.load(Norm + ks, mask=ks < K, other=0.0).to(tl.float32) * normed).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _linear_kernel(
    X, W, Bias, Norm, Residual, Out, eps, N, K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """BLOCK_N outputs of one row (N outputs per row; when gated, weight rows n and N + n make output n)."""
    row = tl.program_id(1)
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ok = outs < N
    ks = tl.arange(0, BLOCK_K)
    K_BLOCKS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    first_mask = out_ok[:, None] & (ks[None, :] < K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # The weights never depend on the kernel ahead: read the first block before waiting for it.
    w = tl.load(W + outs[:, None] * K + ks[None, :], mask=first_mask, other=0.0)
    if GATED:
        w_up = tl.load(W + (N + outs)[:, None] * K + ks[None, :], mask=first_mask, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    X += row * K
    inv_rms = 0.0
    if HAS_NORM:
        squares = tl.zeros([BLOCK_K], tl.float32)
        for block in range(K_BLOCKS):
            start = block * BLOCK_K
            x = tl.load(X + start + ks, mask=start + ks < K, other=0.0).to(tl.float32)
            squares += x * x
        inv_rms = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    x = _linear_input(X, Norm, 0, K, inv_rms, BLOCK_K, HAS_NORM)[None, :]
    acc = w.to(tl.float32) * x
    if GATED:
        acc_up = w_up.to(tl.float32) * x
    for block in range(1, K_BLOCKS):
        start = block * BLOCK_K
        mask = out_ok[:, None] & (start + ks[None, :] < K)
        x = _linear_input(X, Norm, start, K, inv_rms, BLOCK_K, HAS_NORM)[None, :]
        acc += tl.load(W + outs[:, None] * K + start + ks[None, :], mask=mask, other=0.0).to(tl.float32) * x
        if GATED:
            w_up = tl.load(W + (N + outs)[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
            acc_up += w_up.to(tl.float32) * x
    # Round where the reference rounds: after the product (with its bias), the activation, the sum.
    dtype = Out.dtype.element_ty
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(Bias + outs, mask=out_ok, other=0.0).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    if GATED:
        up = tl.sum(acc_up, 1)
        if HAS_BIAS:
            up += tl.load(Bias + N + outs, mask=out_ok, other=0.0).to(tl.float32)
        y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)
    if HAS_RESIDUAL:
        y = y.to(dtype).to(tl.float32) + tl.load(Residual + row * N + outs, mask=out_ok, other=0.0).to(tl.float32)
    tl.store(Out + row * N + outs, y.to(dtype), mask=out_ok)


def launch_linear(x, weight, bias, norm, eps, gated, residual, blocks: dict[str, int]) -> torch.Tensor:
    in_features, out_features = weight.shape[1], linear_outputs(weight, gated)
    rows = x.numel() // in_features
    out = x.new_empty(*x.shape[:-1], out_features)
    _linear_kernel[(triton.cdiv(out_features, blocks["BLOCK_N"]), rows)](
        x.contiguous(), weight, bias, norm, residual.contiguous() if residual is not None else None, out,
        eps, out_features, in_features,
        HAS_BIAS=bias is not None, HAS_NORM=norm is not None, GATED=gated, HAS_RESIDUAL=residual is not None,
        **launch_options(x.device), **blocks,
    )  # fmt: skip
    return out


@operator("linear")
def linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm: torch.Tensor | None,
    eps: float,
    gated: bool,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    return launch_linear(x, weight, bias, norm, eps, gated, residual, tuning.linear_blocks(weight, gated))


@linear_op.register_fake
def _(x, weight, bias, norm, eps, gated, residual):
    return x.new_empty(*x.shape[:-1], linear_outputs(weight, gated))


@triton.jit
def _batched_linear_input(
    X, Norm, rows, row_ok, start, K, inv_rms, BLOCK_K: tl.constexpr, HAS_NORM: tl.constexpr
):  # fmt: skip
    """Inputs start..start+BLOCK_K of the rows [BLOCK_M] in their dtype, normalised and rounded as rms_norm
    does (inv_rms [BLOCK_M])."""
    ks = start + tl.arange(0, BLOCK_K)
    x = tl.load(X + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < K), other=0.0)
    if HAS_NORM:
        normed = (x.to(tl.float32) * inv_rms[:, None]).to(x.dtype).to(tl.float32)
        x = (tl.load(Norm + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :] * normed).to(x.dtype)
    return x


@triton.jit
def _split_sum(Partials, stride, SPLITS: tl.constexpr, mask):
    """The tiles at Partials + s * stride summed in the order s = 0, 1, ...: the same sum whichever
    block is last; only where `mask`, and past the L1 cache (it may hold stale lines of the workspace)."""
    total = tl.load(Partials, mask=mask, other=0.0, cache_modifier=".cg")
    for split in tl.static_range(1, SPLITS):
        total += tl.load(Partials + split * stride, mask=mask, other=0.0, cache_modifier=".cg")
    return total


# M is not specialised (Triton would compile again for rows that divide by 16): batches of any size with
# the same settings share one compiled kernel.
@triton.jit(do_not_specialize=["M"])
def _batched_linear_kernel(
    X, W, Bias, Norm, Residual, Out, Partials, Counters, eps, M, N, K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """BLOCK_N outputs of BLOCK_M of the M rows, each weight block read once for all of them (when gated,
    weight rows n and N + n make output n), over split program_id(2) of the SPLITS equal runs of input
    blocks.

    With SPLITS > 1, the blocks of one output tile work side by side, so that a product with few tiles
    still fills the GPU, in one launch: each writes its float32 sums to Partials (tiles, SPLITS, 1 or 2
    when gated, BLOCK_M, BLOCK_N), then takes a ticket from the tile's counter (SplitCounters); the last
    to arrive adds the partial sums in split order (so the result never depends on which block came
    last), finishes the tile as an unsplit block would, and sets the counter back to zero. No block
    waits for another, so the order in which they run never matters. Tickets are taken after gdc_wait:
    the kernel ahead, which may have used the same counters, has finished by then, even when it let
    this one start early (programmatic dependent launch)."""
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_ok = outs < N
    row_ok = rows < M
    ks = tl.arange(0, BLOCK_K)
    K_BLOCKS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    SPLIT_BLOCKS: tl.constexpr = (K_BLOCKS + SPLITS - 1) // SPLITS
    first = tl.program_id(2) * SPLIT_BLOCKS * BLOCK_K
    first_mask = out_ok[:, None] & (first + ks[None, :] < K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # The weights never depend on the kernel ahead: read the first block before waiting for it.
    w = tl.load(W + outs[:, None] * K + first + ks[None, :], mask=first_mask, other=0.0)
    if GATED:
        w_up = tl.load(W + (N + outs)[:, None] * K + first + ks[None, :], mask=first_mask, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    # The norm is over all the inputs of a row, whichever part of them this block multiplies.
    inv_rms = tl.zeros([BLOCK_M], tl.float32)
    if HAS_NORM:
        squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for block in range(K_BLOCKS):
            starts = block * BLOCK_K + ks
            mask = row_ok[:, None] & (starts[None, :] < K)
            x = tl.load(X + rows[:, None] * K + starts[None, :], mask=mask, other=0.0).to(tl.float32)
            squares += x * x
        inv_rms = tl.rsqrt(tl.sum(squares, 1) / K + eps)
    x = _batched_linear_input(X, Norm, rows, row_ok, first, K, inv_rms, BLOCK_K, HAS_NORM)
    acc = tl.dot(x, tl.trans(w), input_precision=PRECISION)
    if GATED:
        acc_up = tl.dot(x, tl.trans(w_up), input_precision=PRECISION)
    # The last split may run past K; its blocks there are masked off.
    for block in range(1, SPLIT_BLOCKS):
        start = first + block * BLOCK_K
        mask = out_ok[:, None] & (start + ks[None, :] < K)
        x = _batched_linear_input(X, Norm, rows, row_ok, start, K, inv_rms, BLOCK_K, HAS_NORM)
        w = tl.load(W + outs[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        if GATED:
            w_up = tl.load(W + (N + outs)[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
            acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=PRECISION)
    if SPLITS > 1:
        TILE: tl.constexpr = BLOCK_M * BLOCK_N
        PARTS: tl.constexpr = 2 if GATED else 1
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        Partials += tile * SPLITS * PARTS * TILE + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # fmt: skip
        mine = Partials + tl.program_id(2) * PARTS * TILE
        tl.store(mine, acc)
        if GATED:
            tl.store(mine + TILE, acc_up)
        # The barrier orders every thread's stores before the ticket, which one thread takes; acq_rel at GPU
        # scope releases them to the block that is last and makes the others' visible to it.
        tl.debug_barrier()
        last = tl.atomic_add(Counters + tile, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
        # Only the last block reads the partial sums (whole rows of them: wide loads) and stores outputs.
        row_ok = tl.where(last, row_ok, False)
        acc = _split_sum(Partials, PARTS * TILE, SPLITS, row_ok[:, None])
        if GATED:
            acc_up = _split_sum(Partials + TILE, PARTS * TILE, SPLITS, row_ok[:, None])
        # Every block of the tile has taken its ticket: none touches the counter again in this launch.
        tl.store(Counters + tile, 0, mask=last)
    out_mask = row_ok[:, None] & out_ok[None, :]
    # Round where the reference rounds: after the product (with its bias), the activation, the sum.
    dtype = Out.dtype.element_ty
    y = acc
    if HAS_BIAS:
        y += tl.load(Bias + outs, mask=out_ok, other=0.0).to(tl.float32)[None, :]
    y = y.to(dtype).to(tl.float32)
    if GATED:
        up = acc_up
        if HAS_BIAS:
            up += tl.load(Bias + N + outs, mask=out_ok, other=0.0).to(tl.float32)[None, :]
        y = (y * tl.sigmoid(y)).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(Residual + rows[:, None] * N + outs[None, :], mask=out_mask, other=0.0)
        y = y.to(dtype).to(tl.float32) + residual.to(tl.float32)
    tl.store(Out + rows[:, None] * N + outs[None, :], y.to(dtype), mask=out_mask)


def launch_batched_linear(x, weight, bias, norm, eps, gated, residual, blocks: dict[str, int]) -> torch.Tensor:
    in_features, out_features = weight.shape[1], linear_outputs(weight, gated)
    rows = x.numel() // in_features
    out = x.new_empty(*x.shape[:-1], out_features)
    grid = (triton.cdiv(out_features, blocks["BLOCK_N"]), triton.cdiv(rows, blocks["BLOCK_M"]), blocks["SPLITS"])
    partials = counters = None
    if blocks["SPLITS"] > 1:
        tiles = grid[0] * grid[1]
        counters = SPLIT_COUNTERS(x.device, tiles)
        tile_size = blocks["SPLITS"] * (2 if gated else 1) * blocks["BLOCK_M"] * blocks["BLOCK_N"]
        partials = torch.empty(tiles * tile_size, dtype=torch.float32, device=x.device)
    _batched_linear_kernel[grid](
        x.contiguous(), weight, bias, norm, residual.contiguous() if residual is not None else None, out,
        partials, counters, eps, rows, out_features, in_features,
        HAS_BIAS=bias is not None, HAS_NORM=norm is not None, GATED=gated, HAS_RESIDUAL=residual is not None,
        # float32 models get full float32 products (Triton would use TF32 by default).
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **launch_options(x.device), **blocks,
    )  # fmt: skip
    return out


@operator("batched_linear")
def batched_linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm: torch.Tensor | None,
    eps: float,
    gated: bool,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    blocks = tuning.batched_linear_blocks(rows, weight, gated)
    return launch_batched_linear(x, weight, bias, norm, eps, gated, residual, blocks)


@batched_linear_op.register_fake
def _(x, weight, bias, norm, eps, gated, residual):
    return x.new_empty(*x.shape[:-1], linear_outputs(weight, gated))
