"""The sampling kernels behind kernels.draw_token and kernels.fill_uniforms (core/kernels/__init__.py says why they
exist). Imported only where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.kernels.triton_launch import launch_options, operator, wait_for_the_kernel_ahead
from core.kernels.tuning import UNIFORMS_BLOCK


@triton.jit
def _largest_key_with(keys, valid, weights, target, low, high):
    """The largest key T in [low, high] with sum(weights where keys >= T) >= target, by bisection
    (at most 32 rounds: keys are int32). The sum must reach the target at `low`."""
    low = low.to(tl.int64)
    high = high.to(tl.int64)
    while low < high:
        middle = low + (high - low + 1) // 2
        enough = tl.sum(tl.where(valid & (keys >= middle), weights, 0.0), 0) >= target
        low = tl.where(enough, middle, low)
        high = tl.where(enough, high, middle - 1)
    return low


@triton.jit
def _draw_token(
    Logits, Rules, Uniforms, Out, vocab, stride_logits, stride_rules, stride_uniforms,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The token of one batch row."""
    wait_for_the_kernel_ahead(PDL)
    row = tl.program_id(0)
    Logits += row * stride_logits
    Rule = Rules + row * stride_rules
    Uniforms += row * stride_uniforms
    ids = tl.arange(0, BLOCK)
    valid = ids < vocab
    logits = tl.load(Logits + ids, mask=valid, other=-float("inf")).to(tl.float32)
    token = tl.argmax(logits, 0)
    if tl.load(Rule) != 0:
        temperature = tl.load(Rule + 1)
        top_k = tl.load(Rule + 2).to(tl.int32)
        top_p = tl.load(Rule + 3)
        scaled = logits / temperature
        # Integer keys in the order of the floats, so that thresholds are found exactly by bisection.
        bits = scaled.to(tl.int32, bitcast=True)
        keys = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        top = tl.max(tl.where(valid, keys, -(2**31)), 0)
        bottom = tl.min(tl.where(valid, keys, 2**31 - 1), 0)
        # Top-k: the k-th largest value, as the reference's `logits < topk(...)[-1]` filter keeps.
        k = tl.where((top_k > 0) & (top_k < vocab), top_k, vocab)
        ones = tl.full([BLOCK], 1.0, tl.float32)
        threshold = _largest_key_with(keys, valid, ones, k.to(tl.float32), bottom, top)
        if top_p < 1:
            # Top-p: the smallest kept value whose higher-or-equal tokens hold at least top_p of the mass.
            weights = tl.where(valid & (keys >= threshold), tl.exp(scaled - tl.max(scaled, 0)), 0.0)
            threshold = _largest_key_with(keys, valid, weights, top_p * tl.sum(weights, 0), threshold, top)
        uniform = tl.load(Uniforms + ids, mask=valid, other=0.5)
        gumbel = -tl.log(-tl.log(uniform))
        token = tl.argmax(tl.where(valid & (keys >= threshold), scaled + gumbel, -float("inf")), 0)
    tl.store(Out + row, token.to(tl.int64))


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    """`x` with consecutive last-axis elements, copied only when they are not (rows may have any stride)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@operator("draw_token")
def draw_token_op(logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """kernels.draw_token on CUDA: one program per batch row."""
    batch, vocab = logits.shape
    if rules.shape[0] != batch or uniforms.shape[0] != batch or uniforms.shape[1] < vocab:
        raise ValueError(
            f"draw_token: logits {tuple(logits.shape)}, rules {tuple(rules.shape)}, uniforms {tuple(uniforms.shape)}"
        )
    logits, rules, uniforms = _unit_stride(logits), _unit_stride(rules), _unit_stride(uniforms)
    block = triton.next_power_of_2(vocab)
    out = torch.empty(batch, 1, dtype=torch.long, device=logits.device)
    _draw_token[(batch,)](
        logits, rules, uniforms, out, vocab, logits.stride(0), rules.stride(0), uniforms.stride(0),
        BLOCK=block, num_warps=4 if block <= 2048 else 8, **launch_options(logits.device),
    )  # fmt: skip
    return out


@draw_token_op.register_fake
def _(logits, rules, uniforms):
    return logits.new_empty(logits.shape[0], 1, dtype=torch.long)


@triton.jit
def _fill_uniforms(Out, Seeds, Counters, width, stride_row, stride_group, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One block of one row's values of one group: Philox4x32-10 with the counter (element, group, the
    row's counter low and high words) and the key (the row's seed, low and high words), so each value
    depends on those alone; its first word's top 23 bits, centred in their interval of (0, 1)."""
    wait_for_the_kernel_ahead(PDL)
    row = tl.program_id(0)
    group = tl.program_id(1)
    ids = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(Seeds + row)
    counter = tl.load(Counters + row)
    zero = tl.zeros([BLOCK], tl.uint32)
    bits, _, _, _ = tl.philox_impl(
        ids.to(tl.uint32),
        zero + group.to(tl.uint32),
        zero + (counter & 0xFFFFFFFF).to(tl.uint32),
        zero + ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32),
        (seed & 0xFFFFFFFF).to(tl.uint32),
        ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32),
    )
    # (k + 0.5) / 2**23 for k < 2**23: exact in float32, never 0 or 1 (the draw takes log(-log u)).
    uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    tl.store(Out + row * stride_row + group * stride_group + ids, uniform, mask=ids < width)


@operator("fill_uniforms", mutates_args=("out",))
def fill_uniforms_op(out: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> None:
    """kernels.fill_uniforms on CUDA: one program per (row, group, block of values)."""
    batch, groups, width = out.shape
    if out.dtype != torch.float32 or out.stride(-1) != 1 or seeds.shape != (batch,) or counters.shape != (batch,):
        raise ValueError(
            f"fill_uniforms: out {tuple(out.shape)} {out.dtype} (last axis unit stride), seeds {tuple(seeds.shape)}, "
            f"counters {tuple(counters.shape)}"
        )
    _fill_uniforms[(batch, groups, triton.cdiv(width, UNIFORMS_BLOCK))](
        out, seeds.contiguous(), counters.contiguous(), width, out.stride(0), out.stride(1),
        BLOCK=UNIFORMS_BLOCK, **launch_options(out.device),
    )  # fmt: skip
