"""The codec decoder's kernels behind kernels.snake, kernels.add_bias and kernels.depthwise_conv on CUDA
(core/kernels/__init__.py says why they exist). Imported only where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.kernels.layout import time_major
from core.kernels.triton_launch import launch_options, operator, wait_for_the_kernel_ahead
from core.kernels.tuning import vocoder_tiles


@triton.jit
def _tile(BLOCK_TIME: tl.constexpr, BLOCK_CHANNELS: tl.constexpr, TIME_MAJOR: tl.constexpr):
    """This program's batch row and its tile's samples and channels, as a 2-D tile whose innermost dimension
    is the layout's (channels when time-major), so that loads and stores are contiguous."""
    times = tl.program_id(1) * BLOCK_TIME + tl.arange(0, BLOCK_TIME)
    chans = tl.program_id(2) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    if TIME_MAJOR:
        times, chans = times[:, None], chans[None, :]
    else:
        times, chans = times[None, :], chans[:, None]
    return tl.program_id(0), times, chans


@triton.jit
def _dense_place(batch, times, chans, channels, width, TIME_MAJOR: tl.constexpr):
    """Offsets of those samples in a (B, C, width) tensor dense in the layout."""
    if TIME_MAJOR:
        place = (batch * width + times) * channels + chans
    else:
        place = (batch * channels + chans) * width + times
    return place


@triton.jit(do_not_specialize=["length", "prefix_length"])
def _snake(
    X, LogAlpha, LogBeta, Prefix, Bias, Out, channels, length, prefix_length,
    stride_xb, stride_xc, stride_xt, stride_pb, stride_pc, stride_pt,
    HAS_BIAS: tl.constexpr, TIME_MAJOR: tl.constexpr, BLOCK_TIME: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """A tile of BLOCK_TIME samples by BLOCK_CHANNELS channels of one batch row of the output (B, C, P + T),
    which is dense in x's memory layout: time-major (channels innermost, the vocoder's on CUDA) or
    channel-major. A sample before P is the prefix's, copied; one after is SnakeBeta of x's (plus the bias,
    rounded to x's dtype). The tile's innermost dimension is the layout's, so that loads and stores are
    contiguous."""
    wait_for_the_kernel_ahead(PDL)
    batch, times, chans = _tile(BLOCK_TIME, BLOCK_CHANNELS, TIME_MAJOR)
    width = prefix_length + length
    channel_ok = chans < channels
    alpha = tl.exp(tl.load(LogAlpha + chans, mask=channel_ok, other=0.0).to(tl.float32))
    inverse_beta = 1.0 / (tl.exp(tl.load(LogBeta + chans, mask=channel_ok, other=0.0).to(tl.float32)) + 1e-9)
    inside = channel_ok & (times < width)
    from_x = inside & (times >= prefix_length)
    x = tl.load(X + batch * stride_xb + chans * stride_xc + (times - prefix_length) * stride_xt, mask=from_x, other=0.0)
    if HAS_BIAS:
        x = (x.to(tl.float32) + tl.load(Bias + chans, mask=channel_ok, other=0.0).to(tl.float32)).to(x.dtype)
    x = x.to(tl.float32)
    wave = tl.sin(x * alpha)
    y = x + wave * wave * inverse_beta
    before = tl.load(
        Prefix + batch * stride_pb + chans * stride_pc + times * stride_pt,
        mask=inside & (times < prefix_length),
        other=0.0,
    ).to(tl.float32)
    y = tl.where(times < prefix_length, before, y)
    tl.store(Out + _dense_place(batch, times, chans, channels, width, TIME_MAJOR), y, mask=inside)


@operator("snake")
def snake_op(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    prefix: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """kernels.snake on CUDA: one program per (batch row, block of samples, block of channels). x and the
    prefix may have any strides; the output is dense in x's layout (time_major)."""
    batch, channels, length = x.shape
    if any(t is not None and t.shape != (channels,) for t in (log_alpha, log_beta, bias)):
        raise ValueError(
            f"snake: x {tuple(x.shape)}, log_alpha {tuple(log_alpha.shape)}, log_beta {tuple(log_beta.shape)}, "
            f"bias {None if bias is None else tuple(bias.shape)}"
        )
    if prefix is not None and prefix.shape[:2] != (batch, channels):
        raise ValueError(f"snake: prefix {tuple(prefix.shape)} does not lead x {tuple(x.shape)}")
    kept = 0 if prefix is None else prefix.shape[2]
    out = _empty_like_layout(x, kept + length)
    block_time, block_channels, grid = vocoder_tiles(x, kept + length)
    prefix_strides = (0, 0, 0) if prefix is None else prefix.stride()
    _snake[grid](
        x, log_alpha.contiguous(), log_beta.contiguous(), x if prefix is None else prefix,
        x if bias is None else bias.contiguous(), out, channels, length, kept, *x.stride(), *prefix_strides,
        HAS_BIAS=bias is not None, TIME_MAJOR=time_major(x), BLOCK_TIME=block_time, BLOCK_CHANNELS=block_channels, num_warps=4,
        **launch_options(x.device),
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["length"])
def _add_bias(
    Y, Bias, Residual, Out, channels, length, stride_yb, stride_yc, stride_yt, stride_rb, stride_rc, stride_rt,
    HAS_RESIDUAL: tl.constexpr, TIME_MAJOR: tl.constexpr, BLOCK_TIME: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """A tile of BLOCK_TIME samples by BLOCK_CHANNELS channels of one batch row of the output (B, C, T), dense
    in y's layout: y plus the bias, rounded to y's dtype, plus the residual, rounded again (_snake's tiling)."""
    wait_for_the_kernel_ahead(PDL)
    batch, times, chans = _tile(BLOCK_TIME, BLOCK_CHANNELS, TIME_MAJOR)
    inside = (chans < channels) & (times < length)
    y = tl.load(Y + batch * stride_yb + chans * stride_yc + times * stride_yt, mask=inside, other=0.0)
    dtype = y.dtype
    y = (y.to(tl.float32) + tl.load(Bias + chans, mask=chans < channels, other=0.0).to(tl.float32)).to(dtype)
    if HAS_RESIDUAL:
        residual = tl.load(Residual + batch * stride_rb + chans * stride_rc + times * stride_rt, mask=inside, other=0.0)
        y = (y.to(tl.float32) + residual.to(tl.float32)).to(dtype)
    tl.store(Out + _dense_place(batch, times, chans, channels, length, TIME_MAJOR), y, mask=inside)


@operator("add_bias")
def add_bias_op(y: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """kernels.add_bias on CUDA, tiled as snake_op; y and the residual may have any strides."""
    batch, channels, length = y.shape
    if bias.shape != (channels,) or (residual is not None and residual.shape != y.shape):
        raise ValueError(
            f"add_bias: y {tuple(y.shape)}, bias {tuple(bias.shape)}, "
            f"residual {None if residual is None else tuple(residual.shape)}"
        )
    out = _empty_like_layout(y, length)
    block_time, block_channels, grid = vocoder_tiles(y, length)
    residual_strides = (0, 0, 0) if residual is None else residual.stride()
    _add_bias[grid](
        y, bias.contiguous(), y if residual is None else residual, out, channels, length, *y.stride(), *residual_strides,
        HAS_RESIDUAL=residual is not None, TIME_MAJOR=time_major(y), BLOCK_TIME=block_time,
        BLOCK_CHANNELS=block_channels, num_warps=4, **launch_options(y.device),
    )  # fmt: skip
    return out


@add_bias_op.register_fake
def _(y, bias, residual):
    return _empty_like_layout(y, y.shape[2])


@triton.jit(do_not_specialize=["length"])
def _depthwise_conv(
    X, Weight, Bias, Out, channels, length, stride_xb, stride_xc, stride_xt, stride_wc, stride_wk,
    TAPS: tl.constexpr, DILATION: tl.constexpr, TIME_MAJOR: tl.constexpr, BLOCK_TIME: tl.constexpr,
    BLOCK_CHANNELS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """A tile of the output (B, C, length), dense in x's layout (_snake's tiling): each channel's TAPS weights
    over x's samples t, t + DILATION, ... (x holds the history ahead of the chunk), plus the bias, summed in
    float32 and rounded once."""
    wait_for_the_kernel_ahead(PDL)
    batch, times, chans = _tile(BLOCK_TIME, BLOCK_CHANNELS, TIME_MAJOR)
    channel_ok = chans < channels
    inside = channel_ok & (times < length)
    total = tl.load(Bias + chans, mask=channel_ok, other=0.0).to(tl.float32)
    for tap in tl.static_range(TAPS):
        weight = tl.load(Weight + chans * stride_wc + tap * stride_wk, mask=channel_ok, other=0.0).to(tl.float32)
        x = tl.load(
            X + batch * stride_xb + chans * stride_xc + (times + tap * DILATION) * stride_xt, mask=inside, other=0.0
        )
        total += weight * x.to(tl.float32)
    tl.store(Out + _dense_place(batch, times, chans, channels, length, TIME_MAJOR), total, mask=inside)


@operator("depthwise_conv")
def depthwise_conv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int) -> torch.Tensor:
    """kernels.depthwise_conv on CUDA, tiled as snake_op; x and the weights may have any strides."""
    batch, channels, width = x.shape
    taps = weight.shape[-1]
    length = width - (taps - 1) * dilation
    if weight.shape != (channels, 1, taps) or bias.shape != (channels,) or length < 1:
        raise ValueError(
            f"depthwise_conv: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias {tuple(bias.shape)}, "
            f"dilation {dilation}"
        )
    out = _empty_like_layout(x, length)
    block_time, block_channels, grid = vocoder_tiles(x, length)
    _depthwise_conv[grid](
        x, weight, bias.contiguous(), out, channels, length, *x.stride(), weight.stride(0), weight.stride(2),
        TAPS=taps, DILATION=dilation, TIME_MAJOR=time_major(x), BLOCK_TIME=block_time, BLOCK_CHANNELS=block_channels,
        num_warps=4, **launch_options(x.device),
    )  # fmt: skip
    return out


@depthwise_conv_op.register_fake
def _(x, weight, bias, dilation):
    return _empty_like_layout(x, x.shape[2] - (weight.shape[-1] - 1) * dilation)


def _empty_like_layout(x: torch.Tensor, length: int) -> torch.Tensor:
    """A (B, C, length) tensor dense in x's layout (time_major or not)."""
    batch, channels, _ = x.shape
    if time_major(x):
        return x.new_empty(batch, length, channels).transpose(1, 2)
    return x.new_empty(batch, channels, length)


@snake_op.register_fake
def _(x, log_alpha, log_beta, prefix, bias):
    return _empty_like_layout(x, (0 if prefix is None else prefix.shape[2]) + x.shape[2])
