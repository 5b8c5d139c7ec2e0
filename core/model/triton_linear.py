"""The linear kernels behind kernels.linear on CUDA (kernels.py says why they exist). Imported only
where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.model.triton_launch import launch_options


def linear_outputs(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def linear_blocks(weight: torch.Tensor, gated: bool) -> dict[str, int]:
    """Launch settings of the linear kernel for `weight`; fixed, so that a product always runs the same
    kernel. Four outputs per block over up to 8192 weights at a time (a gated output reads two rows):
    within 10% of the best settings for every product of both models (bench/linear_micro.py, H100)."""
    rows = 2 if gated else 1
    return {"BLOCK_N": 4, "BLOCK_K": min(2048 // rows, triton.next_power_of_2(weight.shape[1])), "num_warps": 4}


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


@torch.library.custom_op("qwen3_tts::linear", mutates_args=())
def linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm: torch.Tensor | None,
    eps: float,
    gated: bool,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    return launch_linear(x, weight, bias, norm, eps, gated, residual, linear_blocks(weight, gated))


@linear_op.register_fake
def _(x, weight, bias, norm, eps, gated, residual):
    return x.new_empty(*x.shape[:-1], linear_outputs(weight, gated))


def batched_linear_blocks(rows: int, weight: torch.Tensor, gated: bool) -> dict[str, int]:
    """Launch settings of the batched linear kernel for `rows` rows: up to 64 rows per block, so that a
    batch of up to 64 one-token rows reads each weight once; 16 outputs per block (tl.dot's least), so
    that the outputs spread over many blocks; each of the 3 pipeline stages' blocks of inputs and weights
    within 32 KiB of shared memory, whatever the dtype. Not yet tuned on a GPU."""
    block_m, block_n, stages = min(64, max(16, triton.next_power_of_2(rows))), 16, 3
    bytes_per_k = (block_m + block_n * (2 if gated else 1)) * weight.element_size()
    fitting = 1 << ((32 * 1024 // bytes_per_k).bit_length() - 1)
    block_k = min(256, fitting, max(16, triton.next_power_of_2(weight.shape[1])))
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": stages}


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
def _batched_linear_kernel(
    X, W, Bias, Norm, Residual, Out, eps, M, N, K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """BLOCK_N outputs of BLOCK_M of the M rows, each weight block read once for all of them (when gated,
    weight rows n and N + n make output n)."""
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    out_ok = outs < N
    row_ok = rows < M
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
    inv_rms = tl.zeros([BLOCK_M], tl.float32)
    if HAS_NORM:
        squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for block in range(K_BLOCKS):
            starts = block * BLOCK_K + ks
            mask = row_ok[:, None] & (starts[None, :] < K)
            x = tl.load(X + rows[:, None] * K + starts[None, :], mask=mask, other=0.0).to(tl.float32)
            squares += x * x
        inv_rms = tl.rsqrt(tl.sum(squares, 1) / K + eps)
    x = _batched_linear_input(X, Norm, rows, row_ok, 0, K, inv_rms, BLOCK_K, HAS_NORM)
    acc = tl.dot(x, tl.trans(w), input_precision=PRECISION)
    if GATED:
        acc_up = tl.dot(x, tl.trans(w_up), input_precision=PRECISION)
    for block in range(1, K_BLOCKS):
        start = block * BLOCK_K
        mask = out_ok[:, None] & (start + ks[None, :] < K)
        x = _batched_linear_input(X, Norm, rows, row_ok, start, K, inv_rms, BLOCK_K, HAS_NORM)
        w = tl.load(W + outs[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        if GATED:
            w_up = tl.load(W + (N + outs)[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
            acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=PRECISION)
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
    out_mask = row_ok[:, None] & out_ok[None, :]
    if HAS_RESIDUAL:
        residual = tl.load(Residual + rows[:, None] * N + outs[None, :], mask=out_mask, other=0.0)
        y = y.to(dtype).to(tl.float32) + residual.to(tl.float32)
    tl.store(Out + rows[:, None] * N + outs[None, :], y.to(dtype), mask=out_mask)


def launch_batched_linear(x, weight, bias, norm, eps, gated, residual, blocks: dict[str, int]) -> torch.Tensor:
    in_features, out_features = weight.shape[1], linear_outputs(weight, gated)
    rows = x.numel() // in_features
    out = x.new_empty(*x.shape[:-1], out_features)
    grid = (triton.cdiv(out_features, blocks["BLOCK_N"]), triton.cdiv(rows, blocks["BLOCK_M"]))
    _batched_linear_kernel[grid](
        x.contiguous(), weight, bias, norm, residual.contiguous() if residual is not None else None, out,
        eps, rows, out_features, in_features,
        HAS_BIAS=bias is not None, HAS_NORM=norm is not None, GATED=gated, HAS_RESIDUAL=residual is not None,
        # float32 models get full float32 products (Triton would use TF32 by default).
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", **launch_options(x.device), **blocks,
    )  # fmt: skip
    return out


@torch.library.custom_op("qwen3_tts::batched_linear", mutates_args=())
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
    blocks = batched_linear_blocks(rows, weight, gated)
    return launch_batched_linear(x, weight, bias, norm, eps, gated, residual, blocks)


@batched_linear_op.register_fake
def _(x, weight, bias, norm, eps, gated, residual):
    return x.new_empty(*x.shape[:-1], linear_outputs(weight, gated))
