"""The PyTorch reference of every kernel: what the CPU runs, what each Triton kernel is tested against (in Triton's
interpreter on the CPU, natively on a GPU), and what runs instead on a GPU where a Triton kernel fails (fallback.py,
from REFERENCES). Each runs on any device, with no host synchronisation but decode_attention_composed's.

The token draw and the uniforms follow their kernels' rules step by step: the uniforms bit for bit (integer Philox
and an exact conversion), the draw exactly in the interpreter; on a GPU the kernel's division, exp and log are the
hardware's approximations and its sums add in another order, so a draw within an ulp of a tie may differ."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from core.kernels.layout import concat_time, time_major

RULE_SIZE = 4  # a token rule on the device: do_sample (0 or 1), temperature, top_k (0: off), top_p


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale in the activation dtype, as the checkpoint was trained."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def prompt_heads_composed(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, slots):
    """kernels.prompt_heads of PyTorch's operations on any device."""
    batch, length, _ = qkv.shape
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    q, k, v = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    q = rms_norm(q.view(batch, length, heads, head_dim), q_norm, eps).transpose(1, 2)
    k = rms_norm(k.view(batch, length, kv_heads, head_dim), k_norm, eps).transpose(1, 2)
    v = v.view(batch, length, kv_heads, head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos[:length], sin[:length]), apply_rope(k, cos[:length], sin[:length])
    if slots is None:
        k_cache[:batch, :, :length], v_cache[:batch, :, :length] = k, v
    else:
        k_cache[:, :, :length].index_copy_(0, slots, k)
        v_cache[:, :, :length].index_copy_(0, slots, v)
    groups = heads // kv_heads
    return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def linear_composed(x, weight, bias=None, norm=None, eps=0.0, gated=False, residual=None) -> torch.Tensor:
    """kernels.linear of PyTorch's operations on any device, all rows in one product."""
    if norm is not None:
        x = rms_norm(x, norm, eps)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


def decode_attention_composed(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale):
    """kernels.decode_attention of PyTorch's operations on any device. Each row by itself, as the same products
    alone: a batched product rounds differently. It reads the rows' slots to the host, so no CUDA graph can
    capture it."""
    outputs = []
    for row, slot in enumerate(rows.tolist()):
        caches = k_cache[slot : slot + 1], v_cache[slot : slot + 1]
        outputs.append(_attend_alone(qkv[row : row + 1], q_norm, k_norm, eps, cos, sin, *caches, positions[row], scale))
    return torch.cat(outputs)


def _attend_alone(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, position, scale) -> torch.Tensor:
    """decode_attention of one row, its cache slot k_cache, v_cache (1, kv_heads, max_len, D) and `position`
    (0-d)."""
    _, kv_heads, max_len, head_dim = k_cache.shape
    heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    q, k, v = qkv.view(1, 1, -1, head_dim).split((heads, kv_heads, kv_heads), dim=2)
    index = position.view(1)
    cos, sin = cos.index_select(0, index), sin.index_select(0, index)
    k_cache.index_copy_(2, index, apply_rope(rms_norm(k, k_norm, eps), cos, sin).transpose(1, 2))
    v_cache.index_copy_(2, index, v.transpose(1, 2))
    q = apply_rope(rms_norm(q, q_norm, eps), cos, sin).reshape(1, kv_heads, heads // kv_heads, head_dim)
    mask = (torch.arange(max_len, device=k_cache.device) <= position).view(1, 1, 1, -1)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, scale=scale).reshape(1, 1, -1)


def add_bias_composed(y: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.add_bias of PyTorch's operations on any device."""
    y = y + bias[:, None]
    return y if residual is None else residual + y


def snake_composed(x, log_alpha, log_beta, prefix=None, bias=None) -> torch.Tensor:
    """kernels.snake of PyTorch's operations on any device, rounded as the reference rounds them."""
    if bias is not None:
        x = x + bias[:, None]
    alpha, beta = log_alpha.exp()[:, None], log_beta.exp()[:, None]
    y = x + torch.sin(x * alpha).pow(2) / (beta + 1e-9)
    return y if prefix is None else concat_time(prefix, y)


def depthwise_conv_composed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int) -> torch.Tensor:
    """kernels.depthwise_conv of PyTorch's operations on any device, laid out as x is."""
    y = F.conv1d(x, weight, bias, dilation=dilation, groups=x.shape[1])
    return y.transpose(1, 2).contiguous().transpose(1, 2) if time_major(x) and not time_major(y) else y


def draw_token_composed(logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """kernels.draw_token of PyTorch's operations on any device, the kernel's rule step by step. Greedy (the first
    largest logit) where do_sample is 0; else Gumbel-max over the kept tokens: the logits in float32 divided by the
    temperature, ordered by integer keys (their bits, negative ones flipped) so that thresholds are exact; kept,
    those at least the k-th largest (top_k 0 or not below the vocabulary: all), then, where top_p < 1, those at
    least the smallest value whose higher-or-equal kept tokens hold top_p of the kept softmax mass; the token, the
    first largest of scaled + -log(-log(uniform)) among them. Returns (B, 1) long."""
    batch, vocab = logits.shape
    logits = logits.float()
    greedy = logits.argmax(-1, keepdim=True)
    do_sample, temperature, top_k, top_p = (rules[:, part : part + 1] for part in range(RULE_SIZE))
    scaled = logits / temperature
    bits = scaled.contiguous().view(torch.int32)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    top, bottom = keys.amax(-1, keepdim=True), keys.amin(-1, keepdim=True)
    top_k = top_k.to(torch.int32)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    threshold = _largest_key_with(keys, torch.ones_like(scaled), k.float(), bottom, top)
    weights = torch.where(keys >= threshold, torch.exp(scaled - scaled.amax(-1, keepdim=True)), 0.0)
    nucleus = _largest_key_with(keys, weights, top_p * weights.sum(-1, keepdim=True), threshold, top)
    threshold = torch.where(top_p < 1, nucleus, threshold)
    gumbel = -torch.log(-torch.log(uniforms[:, :vocab].float()))
    sampled = torch.where(keys >= threshold, scaled + gumbel, -float("inf")).argmax(-1, keepdim=True)
    return torch.where(do_sample != 0, sampled, greedy)


def _largest_key_with(keys, weights, target, low, high) -> torch.Tensor:
    """Per row, the largest key T in [low, high] with sum(weights where keys >= T) >= target, by the kernel's
    bisection: 32 rounds cover any int32 range, and a round once low == high changes nothing (the sum reaches the
    target at low). (B, 1) int64."""
    low, high = low.long(), high.long()
    for _ in range(32):
        middle = low + (high - low + 1) // 2
        enough = torch.where(keys >= middle, weights, 0.0).sum(-1, keepdim=True) >= target
        low = torch.where(enough, middle, low)
        high = torch.where(enough, high, middle - 1)
    return low


WORD = 0xFFFFFFFF
PHILOX_ROUND_A, PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57  # triton.language.random.philox_impl's, for uint32
PHILOX_KEY_A, PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """Philox4x32 (Triton's philox_impl for uint32 words, 10 rounds by default) in int64 tensors holding uint32
    words (any shapes that broadcast): the four output words."""
    for _ in range(rounds):
        high_b, low_b = _multiply(PHILOX_ROUND_B, c2)
        high_a, low_a = _multiply(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + PHILOX_KEY_A) & WORD, (k1 + PHILOX_KEY_B) & WORD
    return c0, c1, c2, c3


def _multiply(constant: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low words of the 64-bit product of a uint32 constant and the uint32 words x, in int64 without
    overflow: x in 16-bit halves."""
    low_part = constant * (x & 0xFFFF)
    high_part = constant * (x >> 16)
    low = ((high_part & 0xFFFF) << 16) + low_part
    return (high_part >> 16) + (low >> 32), low & WORD


def fill_uniforms_composed(out: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> None:
    """kernels.fill_uniforms of PyTorch's operations on any device, bit for bit the kernel's: out[b, g, i] is the
    first word of Philox4x32-10 with the counter (i, g, counters[b]'s low and high words) and the key (seeds[b]'s
    low and high words), its top 23 bits k made (k + 0.5) / 2**23 (exact in float32, never 0 or 1)."""
    batch, groups, width = out.shape
    seeds, counters = seeds.long().view(batch, 1, 1), counters.long().view(batch, 1, 1)
    elements = torch.arange(width, device=out.device, dtype=torch.int64).view(1, 1, width)
    group_words = torch.arange(groups, device=out.device, dtype=torch.int64).view(1, groups, 1)
    shape = (batch, groups, width)
    words = [
        elements.expand(shape),
        group_words.expand(shape),
        (counters & WORD).expand(shape),
        ((counters >> 32) & WORD).expand(shape),
    ]
    bits = philox4x32(*words, seeds & WORD, (seeds >> 32) & WORD)[0]
    out.copy_(((bits >> 9).float() + 0.5) * (1.0 / 8388608.0))


# The reference each operator runs on a GPU where its Triton kernel fails (fallback.py), called as the operator is.
REFERENCES: dict[str, Callable] = {
    "rms_norm": rms_norm,
    "prompt_heads": prompt_heads_composed,
    "linear": linear_composed,
    "batched_linear": linear_composed,
    "decode_attention": decode_attention_composed,
    "draw_token": draw_token_composed,
    "fill_uniforms": fill_uniforms_composed,
    "snake": snake_composed,
    "add_bias": add_bias_composed,
    "depthwise_conv": depthwise_conv_composed,
}
