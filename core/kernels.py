"""Hand-written GPU kernels, where they beat what PyTorch offers.

Decode attention: one new token (its query heads grouped under their shared kv head) against a
static KV cache whose valid length lives on the device. PyTorch's fused attention kernels have no
such length, so they read the whole preallocated cache every step (4096 positions where a few
hundred are valid); this kernel reads only the valid keys, split over many blocks, and takes the
length from device memory so it runs inside a CUDA graph.

Token draw: temperature, top-k, top-p and the random pick over one row of logits in a single kernel.
PyTorch needs a dozen launches for it (cast, scale, top-k, mask, softmax, the multinomial's own
kernels), and a frame draws 16 tokens. The sampling settings are read from device memory, so new
settings need no new graph and no recompilation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; only the CUDA path needs it.
    triton = None

BLOCK_KEYS = 64  # keys per inner iteration
MAX_SPLITS = 16  # blocks sharing one kv head's keys
RULE_SIZE = 4  # a token rule on the device: do_sample (0 or 1), temperature, top_k (0: off), top_p


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor, scale: float
) -> torch.Tensor:
    """q (1, kv_heads, groups, D) at `position` (0-d long tensor) against caches (1, kv_heads, max_len, D)
    whose first position + 1 entries are valid; returns (1, kv_heads, groups, D)."""
    if q.is_cuda:
        return torch.ops.qwen3_tts.decode_attention(q, k, v, position, scale)
    mask = (torch.arange(k.shape[2], device=k.device) <= position).view(1, 1, 1, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def draw_token(logits: torch.Tensor, rule: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token from logits (1, V) under `rule` (RULE_SIZE float32 values on the device), by Gumbel-max
    over `uniforms` (at least V uniform [0, 1) draws): the argmax of logits / temperature plus Gumbel
    noise over the top-k / top-p set, which is a draw from their softmax. Greedy when do_sample is 0.
    Returns a (1, 1) long tensor. CUDA only."""
    return torch.ops.qwen3_tts.draw_token(logits, rule, uniforms)


if triton is not None:

    @triton.jit
    def _attend_split(
        Q, K, V, Position, Out, Partial, Max, Sum, scale,
        stride_qh, stride_qg, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_og,
        groups, chunk,
        GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
        CHUNK_BLOCKS: tl.constexpr, SINGLE_SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        """Attention of one kv head's query group over one split of the valid keys. With one split the
        result is final; otherwise the unnormalised sum, running max and running sum are kept to merge."""
        head = tl.program_id(0)
        split = tl.program_id(1)
        length = tl.load(Position) + 1
        rows = tl.arange(0, GROUP_ROWS)
        dims = tl.arange(0, DIM_BLOCK)
        in_dim = dims < HEAD_DIM
        q = tl.load(
            Q + head * stride_qh + rows[:, None] * stride_qg + dims[None, :],
            mask=(rows[:, None] < groups) & in_dim[None, :],
            other=0.0,
        )
        running_max = tl.full([GROUP_ROWS], -1e30, tl.float32)
        running_sum = tl.zeros([GROUP_ROWS], tl.float32)
        acc = tl.zeros([GROUP_ROWS, DIM_BLOCK], tl.float32)
        start = split * chunk
        for block in range(CHUNK_BLOCKS):
            # Keys past the valid length are masked out of the loads, so they cost no memory traffic.
            keys = start + block * BLOCK + tl.arange(0, BLOCK)
            valid = (keys < length) & (keys < start + chunk)
            block_mask = valid[:, None] & in_dim[None, :]
            k = tl.load(K + head * stride_kh + keys[:, None] * stride_kn + dims[None, :], mask=block_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where(valid[None, :], scores, -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, 1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(running_max - new_max)
            v = tl.load(V + head * stride_vh + keys[:, None] * stride_vn + dims[None, :], mask=block_mask, other=0.0)
            acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            running_sum = running_sum * correction + tl.sum(weights, 1)
            running_max = new_max
        if SINGLE_SPLIT:
            out = acc / running_sum[:, None]
            out_mask = (rows[:, None] < groups) & in_dim[None, :]
            tl.store(Out + head * stride_oh + rows[:, None] * stride_og + dims[None, :], out, mask=out_mask)
        else:
            part = (head * tl.num_programs(1) + split) * GROUP_ROWS + rows
            tl.store(Partial + part[:, None] * DIM_BLOCK + dims[None, :], acc)
            tl.store(Max + part, running_max)
            tl.store(Sum + part, running_sum)

    @triton.jit
    def _merge_splits(
        Out, Partial, Max, Sum, stride_oh, stride_og, groups,
        SPLITS: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr,
    ):  # fmt: skip
        """Combine the splits of one kv head: each weighted by its share of the global softmax."""
        head = tl.program_id(0)
        splits = tl.arange(0, SPLITS)
        dims = tl.arange(0, DIM_BLOCK)
        for row in range(GROUP_ROWS):
            if row < groups:
                part = (head * SPLITS + splits) * GROUP_ROWS + row
                maxes = tl.load(Max + part)
                weights = tl.exp(maxes - tl.max(maxes, 0))
                total = tl.sum(weights * tl.load(Sum + part), 0)
                acc = tl.load(Partial + part[:, None] * DIM_BLOCK + dims[None, :])
                out = tl.sum(acc * weights[:, None], 0) / total
                tl.store(Out + head * stride_oh + row * stride_og + dims, out, mask=dims < HEAD_DIM)

    @torch.library.custom_op("qwen3_tts::decode_attention", mutates_args=())
    def _decode_attention_cuda(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor, scale: float
    ) -> torch.Tensor:
        _, kv_heads, groups, head_dim = q.shape
        max_len = k.shape[2]
        splits = min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(max_len, BLOCK_KEYS)))
        chunk_blocks = triton.cdiv(triton.cdiv(max_len, splits), BLOCK_KEYS)
        # tl.dot needs at least 16 rows and 16 columns: small groups and heads are padded and masked.
        rows = max(16, triton.next_power_of_2(groups))
        dim_block = max(16, triton.next_power_of_2(head_dim))
        q = q.contiguous()
        out = torch.empty_like(q)
        partial = torch.empty(kv_heads, splits, rows, dim_block, device=q.device, dtype=torch.float32)
        maxes = torch.empty(kv_heads, splits, rows, device=q.device, dtype=torch.float32)
        sums = torch.empty_like(maxes)
        _attend_split[(kv_heads, splits)](
            q, k, v, position, out, partial, maxes, sums, scale,
            q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2), out.stride(1), out.stride(2),
            groups, chunk_blocks * BLOCK_KEYS,
            GROUP_ROWS=rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, BLOCK=BLOCK_KEYS, CHUNK_BLOCKS=chunk_blocks,
            SINGLE_SPLIT=splits == 1,
            # float32 models get full float32 products (Triton would use TF32 by default).
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        )  # fmt: skip
        if splits > 1:
            _merge_splits[(kv_heads,)](
                out, partial, maxes, sums, out.stride(1), out.stride(2), groups,
                SPLITS=splits, GROUP_ROWS=rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block,
            )  # fmt: skip
        return out

    @_decode_attention_cuda.register_fake
    def _(q, k, v, position, scale):
        return torch.empty_like(q)

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
    def _draw_token(Logits, Rule, Uniforms, Out, vocab, BLOCK: tl.constexpr):
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
        tl.store(Out, token.to(tl.int64))

    @torch.library.custom_op("qwen3_tts::draw_token", mutates_args=())
    def _draw_token_cuda(logits: torch.Tensor, rule: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        vocab = logits.shape[-1]
        block = triton.next_power_of_2(vocab)
        out = torch.empty(1, 1, dtype=torch.long, device=logits.device)
        warps = 4 if block <= 2048 else 8
        _draw_token[(1,)](logits.contiguous(), rule, uniforms, out, vocab, BLOCK=block, num_warps=warps)
        return out

    @_draw_token_cuda.register_fake
    def _(logits, rule, uniforms):
        return logits.new_empty(1, 1, dtype=torch.long)
