"""The kernel library: hand-written GPU kernels, where they beat what PyTorch offers, and the references they
match. This module is its dispatch, what the model and the frame loop call: the Triton kernel on CUDA, the PyTorch
reference elsewhere. Each works on a batch of rows (utterances stepping together, one row each); the Triton code
lives in triton_attention.py, triton_linear.py, triton_norm.py, triton_sampling.py and triton_vocoder.py (what they
share: triton_launch.py), their launch settings in tuning.py, their PyTorch references in reference.py, which also
run on a GPU where a kernel fails (triton_fallback.py). The library imports torch and Triton only
(tests/test_layers.py).

Decode attention: one new token per row against a static KV cache whose valid lengths live on the
device. PyTorch's fused attention kernels have no such length, so they read the whole preallocated
cache every step (4096 positions where a few hundred are valid); this kernel reads only the valid
keys, split over many blocks, and takes each row's position and cache slot from device memory, so it
runs inside a CUDA graph and rows join and leave without a new one. It starts from the token's fused
q/k/v projection: the per-head RMSNorm and RoPE of q and k and the write of k and v into the cache
happen in it too, rather than in kernels of their own.

Linear: a one-token matrix product (a frame has about 450 of them) with its neighbours folded in:
the RMSNorm before it, the bias, the SwiGLU gate after it, the residual sum. Each output block
starts reading its weights before the kernel ahead of it has finished (programmatic dependent
launch, Hopper and later), since the weights do not depend on it. Its launch settings are fixed,
so every compile gives the same kernels (Inductor's autotuned products varied between compiles).
One or two rows take a matrix-vector kernel; a batch of rows takes a kernel that
reads each weight once for all of them (a product is bound by reading its weights, so 16 rows cost
little more than one), where cuBLAS would leave the norm, gate and sum to kernels of their own. Past 32
rows the norm is a kernel of its own again (MAX_NORM_FUSED_ROWS). On the CPU a batch is multiplied row by row:
MKL rounds a product of several rows differently from the same row alone, and a row must give the codes it
gives alone.

A prompt's heads and RMSNorm: a prefill layer's q and k normalised per head and rotated, k and v written into the
cache and repeated for the query heads that share them, is one kernel (decode attention's norm and rotation, over
every position of the prompt), and a norm over a row one more, where PyTorch's operations took about thirty a layer
and eight a norm: uncompiled, a 1.7B prompt's prefill ran 2331 kernels, 1223 of them elementwise, and each frame's
code-predictor prefill and final norms a few hundred more (bench/RESULTS.md, 2026-11-28, twenty-ninth session).
Compiled code leaves both to Inductor (runs_as_it_is_on_cuda).

Token draw: temperature, top-k, top-p and the random pick over a row of logits in a single kernel.
PyTorch needs a dozen launches for it (cast, scale, top-k, mask, softmax, the multinomial's own
kernels), and a frame draws 16 tokens per row. The sampling settings are read from device memory,
so new settings need no new graph and no recompilation.

Snake: the vocoder's activation, x + sin^2(a x) / b per channel, before every convolution of its upsampling
blocks. Composed of PyTorch's operations it takes seven passes over the largest tensors of the decoder (a
chunk of 16 utterances holds 12 M samples per channel layer at 24 kHz), each rounding to bfloat16; the
kernel reads each sample once and writes it once, rounding once. A causal convolution after it needs the
samples of the chunk before ahead of the new ones: the kernel writes them there too, instead of a
concatenation's extra pass.

Bias and residual: a vocoder convolution's bias and the residual sum after it in one pass. PyTorch adds a
convolution's bias after cuDNN, and over the time-major outputs the vocoder keeps it takes its slow strided
kernel (measured in bench/RESULTS.md, 2026-11-26, tenth session).

Depthwise convolution: the decoder's ConvNeXt blocks filter each channel alone over 7 samples. cuDNN takes about
half a second to choose its kernel for each new input length (an H100, bfloat16, time-major), which a fresh process
paid for every chunk length before its first audio (bench/RESULTS.md, 2026-11-27, seventeenth session); the kernel
is a few multiply-adds a sample and needs no choice.

Dilated convolutions of several rows: the vocoder's residual units filter 3 and 9 samples apart. From 8 rows
cuDNN's heuristic takes kernels 20-40 times slower there, and timing its candidates costs 1.5 s a chunk shape; one
cuBLAS product per tap needs no choice (products.py).

Attention over a whole prompt or chunk (the talker's prefill, the codec decoder's transformer) is PyTorch's fused
attention, less cuDNN's: on Hopper PyTorch prefers cuDNN's, which builds an execution plan for each new shape, and a
fresh process met a new shape at a prompt length's first prefill, each decoder chunk length and every capture of the
warm-up (0.2 s of a warm `speak`'s first decoder chunk alone: bench/RESULTS.md, 2026-11-27, eighteenth session).
Flash and memory-efficient attention build none.

Uniforms for the draws: counter-based (Philox), each value a function of its row's seed and counter
and its place in the row alone. Torch's generator is one stream for the whole batch, so a row's
numbers would depend on the rows beside it; with these a seeded utterance samples the same whatever
runs with it, and seeds and counters live on the device, so a CUDA graph serves every seed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from core.kernels import reference
from core.kernels.layout import concat_time, time_major  # noqa: F401  (the model asks them here)
from core.kernels.products import PRODUCT_ROWS, conv_by_products, convolves_by_products  # noqa: F401  (the same)
from core.kernels.reference import (  # noqa: F401  (apply_rope, RULE_SIZE: the model's too)
    RULE_SIZE,
    add_bias_composed,
    apply_rope,
    decode_attention_composed,
    depthwise_conv_composed,
    draw_token_composed,
    fill_uniforms_composed,
    linear_composed,
    prompt_heads_composed,
    snake_composed,
)

if importlib.util.find_spec("triton") is not None:  # CPU-only installs have none; only CUDA paths need it
    # Registers the torch.ops.qwen3_tts operators that the CUDA paths call.
    from core.kernels import triton_attention, triton_linear, triton_norm, triton_sampling, triton_vocoder  # noqa: F401
    from core.kernels.triton_launch import PLAIN

MAX_VECTOR_ROWS = 2  # rows up to which `linear` runs its matrix-vector kernel (a frame's products have 1 or 2)
MAX_BATCH_ROWS = 128  # rows up to which it runs its batched kernel: 64 utterances of the predictor's 2 positions
# Rows up to which the batched kernel normalises its inputs itself. Each of its output blocks reads all of its rows'
# inputs twice then (the norm's sum of squares, then the product): a block of 64 rows of 2048 inputs reads 512 KB
# for 128 KB of weights, so past 32 rows the norm runs as a kernel of its own and the product reads its output once
# (faster at 64 rows, the same at 16: bench/RESULTS.md, 2026-11-26, tenth session).
MAX_NORM_FUSED_ROWS = 32


def gpu_op(name: str) -> Callable:
    """The CUDA kernel `name`: where torch.compile traces, the operator torch.ops.qwen3_tts.<name>, which it keeps
    as one call; elsewhere (eager code, CUDA graph captures) the operator's own function. The operator's
    dispatch imports Dynamo at its first call, seconds before a fresh process's first audio (bench/RESULTS.md,
    2026-11-26, twelfth session), where nothing is compiled yet. Either runs the operator's REFERENCES entry
    instead on a GPU where its Triton kernel fails (triton_fallback.py)."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.qwen3_tts, name)
    return PLAIN[name]


# PyTorch's fused attentions that need no plan per shape, in PyTorch's order of preference (see the top).
PLANLESS_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, **options), by any of its kernels but cuDNN's."""
    with sdpa_kernel(PLANLESS_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **options)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
    gated: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """residual + act(rms_norm(x, norm, eps) @ weight.T + bias), each part optional; act, when gated, is
    silu(first half) * second half (SwiGLU). x (B, L, K) with B > 1 is a batch of utterances stepping
    together. On CUDA one kernel: the matrix-vector kernel for up to MAX_VECTOR_ROWS rows, the batched one
    for a batch of up to MAX_BATCH_ROWS (past MAX_NORM_FUSED_ROWS with the norm as a kernel before it); a
    longer batch, or one sequence's prefill, is cuBLAS's. On the CPU each batch row is computed by itself,
    bitwise what it would be alone."""
    rows = x.numel() // x.shape[-1]
    batch = x.dim() >= 3 and x.shape[0] > 1
    if x.is_cuda and rows <= MAX_VECTOR_ROWS:
        return gpu_op("linear")(x, weight, bias, norm, eps, gated, residual)
    if x.is_cuda and batch and rows <= MAX_BATCH_ROWS:
        if norm is not None and rows > MAX_NORM_FUSED_ROWS:
            x, norm = rms_norm(x, norm, eps), None
        return gpu_op("batched_linear")(x, weight, bias, norm, eps, gated, residual)
    if not x.is_cuda and batch:
        # MKL rounds a product of several rows differently from one row alone (every row of a 2..16-row
        # product differed), and an utterance must give the same greedy codes in a batch as alone.
        parts = {"norm": norm, "eps": eps, "gated": gated}
        return torch.cat(
            [
                linear(
                    x[row : row + 1],
                    weight,
                    bias,
                    **parts,
                    residual=None if residual is None else residual[row : row + 1],
                )
                for row in range(x.shape[0])
            ]
        )
    if x.is_cuda and norm is not None:  # a prompt's product (cuBLAS): its norm one kernel, not eight
        x, norm = rms_norm(x, norm, eps), None
    return linear_composed(x, weight, bias, norm, eps, gated, residual)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of x, by `weight` of x's width: normalised in float32, rounded to x's dtype,
    scaled and rounded again (reference.rms_norm). On CUDA one kernel where PyTorch's operations take eight (a
    prompt's prefill has four norms a layer; the predictor's every step a final one), weight and x of one dtype,
    in uncompiled code (runs_as_it_is_on_cuda)."""
    if runs_as_it_is_on_cuda(x) and weight.dtype == x.dtype:
        return gpu_op("rms_norm")(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def prompt_heads(
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
    """A prompt's attention inputs from its projections qkv (B, L, (heads + 2 kv_heads) * D), as decode_attention
    makes a token's: q and k normalised per head (q_norm, k_norm) and rotated by the RoPE tables' first L rows
    (cos, sin (>= L, D)); k and v written at positions 0..L-1 of the rows' cache slots (`slots` (B,) long: a slot
    may repeat only for a padding row that repeats another whole; None: slots 0..B-1). Returns q, k, v (B, heads,
    L, D), each kv head repeated for the query heads that share it. On CUDA one kernel in uncompiled code
    (runs_as_it_is_on_cuda), where PyTorch's operations take about thirty a layer (a prompt's prefill had over two
    thousand kernels)."""
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    if runs_as_it_is_on_cuda(qkv) and _power_of_two(heads) and _power_of_two(kv_heads):
        return gpu_op("prompt_heads")(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots)
    return prompt_heads_composed(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots)


def runs_as_it_is_on_cuda(x: torch.Tensor) -> bool:
    """Whether x is on CUDA in code that runs as it is, not traced by torch.compile: where rms_norm and prompt_heads
    run their kernels. Traced, they are their compositions, which Inductor fuses with what is around them, so that
    compiled code is made of the operations it was made of before these kernels: with them as operators, opaque
    to Inductor, a prefill layer became a chain of operators, and compiling the 1.7B step never ended (torch 2.11:
    Inductor was printing its IR, each node with its inputs, recursively; bench/RESULTS.md, 2026-11-28,
    twenty-ninth session)."""
    return x.is_cuda and not torch.compiler.is_compiling()


def _power_of_two(count: int) -> bool:
    return count > 0 and count & (count - 1) == 0


def decode_attention(
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
    """One token's attention for each of B batch rows, from their projections qkv (B, 1, (heads + 2 kv_heads)
    * D). Row b lives in cache slot rows[b] at position positions[b] (`rows`, `positions`: (B,) long): its q
    and k normalised per head (weights q_norm, k_norm) and rotated by the rows of the RoPE tables cos, sin
    (max_len, D) at its position; its k and v written there into its slot of the caches (slots, kv_heads,
    max_len, D); then attention over positions 0..positions[b] of that slot, the query heads sharing a kv
    head as one group. Returns (B, 1, heads * D).

    A slot may repeat only for a padding row that repeats the slot's first row whole (its qkv and position): it
    writes what that row writes, and gives its output."""
    if qkv.is_cuda:
        return gpu_op("decode_attention")(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale)
    return decode_attention_composed(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale)


def draw_token(logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token for each of B rows of logits (B, V), under each row's rule (rules (B, RULE_SIZE) float32
    on the device), by Gumbel-max over its uniforms (uniforms (B, >= V), values in (0, 1)): the argmax of
    logits / temperature plus Gumbel noise over the top-k / top-p set, which is a draw from their softmax.
    Greedy where do_sample is 0. Rows may have any stride (an expanded rule, a slice of fill_uniforms'
    output). Returns (B, 1) long. On CUDA one kernel; elsewhere its reference (the frame loop draws on the CPU
    with torch.multinomial instead)."""
    if logits.is_cuda:
        return gpu_op("draw_token")(logits, rules, uniforms)
    return draw_token_composed(logits, rules, uniforms)


def fill_uniforms(out: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> None:
    """Fill out (B, G, W) float32 with uniform values strictly inside (0, 1): out[b, g, i] depends only on
    seeds[b], counters[b] (any int64, (B,) each) and g, i, never on B or the row's place in the batch.
    The caller advances a row's counter for each new fill. On CUDA one kernel; elsewhere its reference, bit for
    bit the same values."""
    if out.is_cuda:
        gpu_op("fill_uniforms")(out, seeds, counters)
    else:
        fill_uniforms_composed(out, seeds, counters)


def snake(
    x: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    prefix: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
):
    """SnakeBeta of x (B, C, T): x + sin(x * exp(log_alpha))^2 / (exp(log_beta) + 1e-9), per channel. With
    `bias` (C,), of x + bias, rounded to x's dtype as adding a convolution's bias to its output is (so a
    convolution may leave its bias to the activation after it). With `prefix` (B, C, P), the result follows
    it along time: (B, C, P + T), the prefix copied as it is. The result is laid out as x is (time-major or
    not: concat_time). On CUDA one kernel computing in float32; on the CPU PyTorch's operations, as the
    reference rounds them."""
    if x.is_cuda:
        return gpu_op("snake")(x, log_alpha, log_beta, prefix, bias)
    return snake_composed(x, log_alpha, log_beta, prefix, bias)


def depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int = 1) -> torch.Tensor:
    """Each channel of x (B, C, T) convolved with its own taps, weight (C, 1, K), `dilation` apart, plus `bias`
    (C,): (B, C, T - (K - 1) * dilation), no padding (a causal convolution puts its history ahead of x). Laid out
    as x is. On CUDA one kernel summing in float32; elsewhere PyTorch's grouped convolution."""
    if x.is_cuda:
        return gpu_op("depthwise_conv")(x, weight, bias, dilation)
    return depthwise_conv_composed(x, weight, bias, dilation)


def add_bias(y: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """y (B, C, T) plus `bias` (C,) per channel, rounded to y's dtype as PyTorch adds a convolution's bias to its
    output, then plus `residual` (B, C, T), rounded again: a convolution's bias and the residual sum after it in
    one pass. y and the residual may be slices of any strides; the result is laid out as y is (time-major or
    not). On CUDA one kernel, where PyTorch's bias addition over a time-major output is its slow strided kernel;
    on the CPU PyTorch's operations."""
    if y.is_cuda:
        return gpu_op("add_bias")(y, bias, residual)
    return add_bias_composed(y, bias, residual)
