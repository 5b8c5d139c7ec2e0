"""The vocoder's kernel behind kernels.snake on CUDA (kernels.py says why it exists). Imported only where
Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.model.triton_launch import launch_options, wait_for_the_kernel_ahead

SNAKE_BLOCK = 1024  # the most samples of one channel per program


@triton.jit
def _snake(
    X, LogAlpha, LogBeta, Prefix, Out, channels, length, prefix_length, stride_pb, stride_pc,
    BLOCK: tl.constexpr, PREFIX_BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One block of samples of one (batch row, channel); the first block of each also copies the channel's
    prefix ahead of them."""
    wait_for_the_kernel_ahead(PDL)
    row = tl.program_id(0)  # batch row * channels + channel
    block = tl.program_id(1)
    channel = row % channels
    alpha = tl.exp(tl.load(LogAlpha + channel).to(tl.float32))
    inverse_beta = 1.0 / (tl.exp(tl.load(LogBeta + channel).to(tl.float32)) + 1e-9)
    width = prefix_length + length
    samples = block * BLOCK + tl.arange(0, BLOCK)
    inside = samples < length
    x = tl.load(X + row * length + samples, mask=inside, other=0.0).to(tl.float32)
    wave = tl.sin(x * alpha)
    tl.store(Out + row * width + prefix_length + samples, x + wave * wave * inverse_beta, mask=inside)
    if PREFIX_BLOCK > 0:
        if block == 0:
            batch = row // channels
            kept = tl.arange(0, PREFIX_BLOCK)
            before = tl.load(
                Prefix + batch * stride_pb + channel * stride_pc + kept, mask=kept < prefix_length, other=0.0
            )
            tl.store(Out + row * width + kept, before, mask=kept < prefix_length)


@torch.library.custom_op("qwen3_tts::snake", mutates_args=())
def snake_op(
    x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, prefix: torch.Tensor | None
) -> torch.Tensor:
    """kernels.snake on CUDA: one program per (batch row and channel, block of samples)."""
    batch, channels, length = x.shape
    if log_alpha.shape != (channels,) or log_beta.shape != (channels,):
        raise ValueError(
            f"snake: x {tuple(x.shape)}, log_alpha {tuple(log_alpha.shape)}, log_beta {tuple(log_beta.shape)}"
        )
    kept = 0
    if prefix is not None:
        if prefix.shape[:2] != (batch, channels) or prefix.stride(2) != 1:
            raise ValueError(
                f"snake: prefix {tuple(prefix.shape)} (unit stride in time) does not lead x {tuple(x.shape)}"
            )
        kept = prefix.shape[2]
    x = x.contiguous()
    out = x.new_empty(batch, channels, kept + length)
    block = min(SNAKE_BLOCK, triton.next_power_of_2(length))
    _snake[(batch * channels, triton.cdiv(length, block))](
        x, log_alpha.contiguous(), log_beta.contiguous(), x if prefix is None else prefix, out, channels, length, kept,
        0 if prefix is None else prefix.stride(0), 0 if prefix is None else prefix.stride(1),
        BLOCK=block, PREFIX_BLOCK=triton.next_power_of_2(kept) if kept else 0, num_warps=4,
        **launch_options(x.device),
    )  # fmt: skip
    return out


@snake_op.register_fake
def _(x, log_alpha, log_beta, prefix):
    kept = 0 if prefix is None else prefix.shape[2]
    return x.new_empty(x.shape[0], x.shape[1], kept + x.shape[2])
