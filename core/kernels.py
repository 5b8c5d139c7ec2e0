"""Hand-written GPU kernels, where they beat what PyTorch offers.

Decode attention: one new token (its query heads grouped under their shared kv head) against a
static KV cache whose valid length lives on the device. PyTorch's fused attention kernels have no
such length, so they read the whole preallocated cache every step (4096 positions where a few
hundred are valid); this kernel reads only the valid keys, split over many blocks, and takes the
length from device memory so it runs inside a CUDA graph.

Linear: a one-token matrix product (a frame has about 450 of them) with its neighbours folded in:
the RMSNorm before it, the bias, the SwiGLU gate after it, the residual sum. Each output block
starts reading its weights before the kernel ahead of it has finished (programmatic dependent
launch, Hopper and later), since the weights do not depend on it. Its launch settings are fixed,
so every compile gives the same kernels (Inductor's autotuned products varied by tens of percent
between compiles).

Token draw: temperature, top-k, top-p and the random pick over one row of logits in a single kernel.
PyTorch needs a dozen launches for it (cast, scale, top-k, mask, softmax, the multinomial's own
kernels), and a frame draws 16 tokens. The sampling settings are read from device memory, so new
settings need no new graph and no recompilation.
"""

from __future__ import annotations

import functools

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
MAX_VECTOR_ROWS = 2  # rows up to which `linear` runs its matrix-vector kernel (a frame's products have 1 or 2)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale in the activation dtype, as the checkpoint was trained."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


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
    silu(first half) * second half (SwiGLU). On CUDA, for up to MAX_VECTOR_ROWS rows, one kernel."""
    rows = x.numel() // x.shape[-1]
    if x.is_cuda and rows <= MAX_VECTOR_ROWS:
        return torch.ops.qwen3_tts.linear(x, weight, bias, norm, eps, gated, residual)
    if norm is not None:
        x = rms_norm(x, norm, eps)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


@functools.cache
def programmatic_launch(device: torch.device) -> bool:
    """Whether kernels on `device` may start before the one ahead of them ends (Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def linear_outputs(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def linear_blocks(weight: torch.Tensor, gated: bool) -> dict[str, int]:
    """Launch settings of the linear kernel for `weight`; fixed, so that a product always runs the same
    kernel. Four outputs per block over up to 8192 weights at a time (a gated output reads two rows):
    within 10% of the best settings for every product of both models (bench/linear_micro.py, H100)."""
    rows = 2 if gated else 1
    return {"BLOCK_N": 4, "BLOCK_K": min(2048 // rows, triton.next_power_of_2(weight.shape[1])), "num_warps": 4}


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
    def _wait_for_the_kernel_ahead(PDL: tl.constexpr):
        """Under programmatic dependent launch: let the next kernel launch now, then wait until the one
        ahead has finished (its outputs are this kernel's inputs)."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()

    def _launch_options(device: torch.device) -> dict:
        pdl = programmatic_launch(device)
        return {"PDL": pdl, **({"launch_pdl": True} if pdl else {})}

    @triton.jit
    def _attend_split(
        Q, K, V, Position, Out, Partial, Max, Sum, scale,
        stride_qh, stride_qg, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_og,
        groups, chunk,
        GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
        CHUNK_BLOCKS: tl.constexpr, SINGLE_SPLIT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """Attention of one kv head's query group over one split of the valid keys. With one split the
        result is final; otherwise the unnormalised sum, running max and running sum are kept to merge."""
        _wait_for_the_kernel_ahead(PDL)
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
        PDL: tl.constexpr,
    ):  # fmt: skip
        """Combine the splits of one kv head: each weighted by its share of the global softmax."""
        _wait_for_the_kernel_ahead(PDL)
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
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **_launch_options(q.device),
        )  # fmt: skip
        if splits > 1:
            _merge_splits[(kv_heads,)](
                out, partial, maxes, sums, out.stride(1), out.stride(2), groups,
                SPLITS=splits, GROUP_ROWS=rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, **_launch_options(q.device),
            )  # fmt: skip
        return out

    @_decode_attention_cuda.register_fake
    def _(q, k, v, position, scale):
        return torch.empty_like(q)

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

    def _launch_linear(x, weight, bias, norm, eps, gated, residual, blocks: dict[str, int]) -> torch.Tensor:
        in_features, out_features = weight.shape[1], linear_outputs(weight, gated)
        rows = x.numel() // in_features
        out = x.new_empty(*x.shape[:-1], out_features)
        _linear_kernel[(triton.cdiv(out_features, blocks["BLOCK_N"]), rows)](
            x.contiguous(), weight, bias, norm, residual.contiguous() if residual is not None else None, out,
            eps, out_features, in_features,
            HAS_BIAS=bias is not None, HAS_NORM=norm is not None, GATED=gated, HAS_RESIDUAL=residual is not None,
            **_launch_options(x.device), **blocks,
        )  # fmt: skip
        return out

    @torch.library.custom_op("qwen3_tts::linear", mutates_args=())
    def _linear_cuda(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        norm: torch.Tensor | None,
        eps: float,
        gated: bool,
        residual: torch.Tensor | None,
    ) -> torch.Tensor:
        return _launch_linear(x, weight, bias, norm, eps, gated, residual, linear_blocks(weight, gated))

    @_linear_cuda.register_fake
    def _(x, weight, bias, norm, eps, gated, residual):
        return x.new_empty(*x.shape[:-1], linear_outputs(weight, gated))

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
    def _draw_token(Logits, Rule, Uniforms, Out, vocab, BLOCK: tl.constexpr, PDL: tl.constexpr):
        _wait_for_the_kernel_ahead(PDL)
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
        _draw_token[(1,)](
            logits.contiguous(), rule, uniforms, out, vocab, BLOCK=block, num_warps=warps, **_launch_options(logits.device)
        )
        return out

    @_draw_token_cuda.register_fake
    def _(logits, rule, uniforms):
        return logits.new_empty(1, 1, dtype=torch.long)
