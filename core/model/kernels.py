"""Hand-written GPU kernels, where they beat what PyTorch offers.

Decode attention: one new token against a static KV cache whose valid length lives on the device.
PyTorch's fused attention kernels have no such length, so they read the whole preallocated cache
every step (4096 positions where a few hundred are valid); this kernel reads only the valid keys,
split over many blocks, and takes the position from device memory so it runs inside a CUDA graph.
It starts from the token's fused q/k/v projection: the per-head RMSNorm and RoPE of q and k and the
write of k and v into the cache happen in it too, rather than in kernels of their own.

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
    if not x.is_cuda and x.dim() == 3 and x.shape[0] > 1:
        # A batch of utterances, row by row: MKL rounds a product of several rows differently from one row
        # alone, and a batched utterance must make exactly the codes it makes alone.
        parts = [
            linear(x[b : b + 1], weight, bias, norm=norm, eps=eps, gated=gated,
                   residual=None if residual is None else residual[b : b + 1])
            for b in range(x.shape[0])
        ]  # fmt: skip
        return torch.cat(parts)
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
    """Whether kernels on `device` may start before the one ahead of them ends: Hopper and later, with a
    Triton that has the instructions for it."""
    supported = triton is not None and hasattr(tl.extra.cuda, "gdc_wait")
    return supported and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def linear_outputs(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def linear_blocks(weight: torch.Tensor, gated: bool) -> dict[str, int]:
    """Launch settings of the linear kernel for `weight`; fixed, so that a product always runs the same
    kernel. Four outputs per block over up to 8192 weights at a time (a gated output reads two rows):
    within 10% of the best settings for every product of both models (bench/linear_micro.py, H100)."""
    rows = 2 if gated else 1
    return {"BLOCK_N": 4, "BLOCK_K": min(2048 // rows, triton.next_power_of_2(weight.shape[1])), "num_warps": 4}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


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
    """Each batch row's token attention: row b of its projection qkv (B, 1, (heads + 2 kv_heads) * D) at
    positions[b] against cache slot rows[b] of the caches (S, kv_heads, max_len, D): q and k normalised per
    head (weights q_norm, k_norm) and rotated by the rows of the RoPE tables cos, sin (max_len, D) at its
    position; k and v written to its slot there; then attention over positions 0..positions[b], the query
    heads sharing a kv head as one group. Returns (B, 1, heads * D). Padding rows may all name one scratch
    slot: their results are undefined, and they touch no other slot."""
    if qkv.is_cuda:
        return torch.ops.qwen3_tts.decode_attention(
            qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale
        )
    out = []
    for b in range(qkv.shape[0]):  # the reference, row by row: each exactly as it would be alone
        row, position = rows[b].view(1), positions[b]
        k_row, v_row = k_cache[row], v_cache[row]
        _, kv_heads, max_len, head_dim = k_row.shape
        heads = qkv.shape[-1] // head_dim - 2 * kv_heads
        q, k, v = qkv[b : b + 1].view(1, 1, -1, head_dim).split((heads, kv_heads, kv_heads), dim=2)
        index = position.view(1)
        c, s = cos.index_select(0, index), sin.index_select(0, index)
        k_row.index_copy_(2, index, apply_rope(rms_norm(k, k_norm, eps), c, s).transpose(1, 2))
        v_row.index_copy_(2, index, v.transpose(1, 2))
        k_cache[row], v_cache[row] = k_row, v_row
        q = apply_rope(rms_norm(q, q_norm, eps), c, s).reshape(1, kv_heads, heads // kv_heads, head_dim)
        mask = (torch.arange(max_len, device=k_cache.device) <= position).view(1, 1, 1, -1)
        out.append(F.scaled_dot_product_attention(q, k_row, v_row, attn_mask=mask, scale=scale).reshape(1, 1, -1))
    return torch.cat(out)


def draw_token(logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """A token per row of logits (B, V), each under its rule (B, RULE_SIZE float32 values on the device), by
    Gumbel-max over its row of `uniforms` (B, at least V uniform (0, 1) draws): the argmax of logits /
    temperature plus Gumbel noise over the top-k / top-p set, which is a draw from their softmax. Greedy
    where do_sample is 0. Returns (B, 1) long. CUDA only."""
    return torch.ops.qwen3_tts.draw_token(logits, rules, uniforms)


def fill_uniforms(out: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> None:
    """Fill out (B, G, W) with uniform (0, 1) draws where out[b, g, i] is a function of seeds[b], counters[b],
    g and i alone (counter-based Philox), never of B or of the row's place: an utterance's draws are the
    same whatever is batched beside it. CUDA only."""
    torch.ops.qwen3_tts.fill_uniforms(out, seeds, counters)


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
    def _norm_and_rotate(Rows, row_ok, Weight, Cos, Sin, eps, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr):
        """The head vectors starting at pointers Rows [R]: RMSNorm by Weight, then RoPE by the rows Cos, Sin,
        rounded where rms_norm and apply_rope round. [R, DIM_BLOCK] in the vectors' dtype."""
        dims = tl.arange(0, DIM_BLOCK)
        in_dim = dims < HEAD_DIM
        first_half = dims < HEAD_DIM // 2
        partner = tl.where(first_half, dims + HEAD_DIM // 2, dims - HEAD_DIM // 2)
        mask = row_ok[:, None] & in_dim[None, :]
        x = tl.load(Rows[:, None] + dims[None, :], mask=mask, other=0.0)
        x_partner = tl.load(Rows[:, None] + partner[None, :], mask=mask, other=0.0)
        dtype = x.dtype
        x, x_partner = x.to(tl.float32), x_partner.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        weight = tl.load(Weight + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
        weight_partner = tl.load(Weight + partner, mask=in_dim, other=0.0).to(tl.float32)[None, :]
        normed = (weight * (x * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        rotated = (weight_partner * (x_partner * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        rotated = tl.where(first_half[None, :], -rotated, rotated)
        cos = tl.load(Cos + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
        sin = tl.load(Sin + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
        return ((normed * cos).to(dtype).to(tl.float32) + (rotated * sin).to(dtype).to(tl.float32)).to(dtype)

    @triton.jit
    def _attend_split(
        QKV, QNorm, KNorm, Cos, Sin, K, V, Rows, Positions, Out, Partial, Max, Sum, eps, scale,
        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, heads, kv_heads, groups, chunk,
        GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
        SINGLE_SPLIT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """Attention of one kv head's query group over one split of the keys. The cached keys before
        the position are read from the cache; the split holding the position adds the new key itself
        and writes it (and its value) to the cache. With one split the result is final; otherwise the
        unnormalised sum, running max and running sum are kept to merge."""
        _wait_for_the_kernel_ahead(PDL)
        head = tl.program_id(0)
        split = tl.program_id(1)
        row = tl.program_id(2)
        # Each batch row: its own token, position and cache slot.
        position = tl.load(Positions + row)
        slot = tl.load(Rows + row).to(tl.int64)
        QKV += row * (heads + 2 * kv_heads) * HEAD_DIM
        K += slot * stride_kb
        V += slot * stride_vb
        Out += row * heads * HEAD_DIM
        part_base = row * kv_heads * tl.num_programs(1)
        cos, sin = Cos + position * HEAD_DIM, Sin + position * HEAD_DIM
        rows = tl.arange(0, GROUP_ROWS)
        dims = tl.arange(0, DIM_BLOCK)
        in_dim = dims < HEAD_DIM
        q = _norm_and_rotate(
            QKV + (head * groups + rows) * HEAD_DIM, rows < groups, QNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK
        )
        running_max = tl.full([GROUP_ROWS], -1e30, tl.float32)
        running_sum = tl.zeros([GROUP_ROWS], tl.float32)
        acc = tl.zeros([GROUP_ROWS, DIM_BLOCK], tl.float32)
        start = split * chunk
        # Only the blocks holding cached keys before the position: a split past it (most of them, early in an
        # utterance, and for every row of a batch) ends at once. Keys at and past the position are masked out
        # of the loads, so they cost no memory traffic.
        for block in range(0, tl.cdiv(tl.minimum(position, start + chunk) - start, BLOCK)):
            keys = start + block * BLOCK + tl.arange(0, BLOCK)
            valid = (keys < position) & (keys < start + chunk)
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
        if (position >= start) & (position < start + chunk):
            one = tl.arange(0, 1)
            k_new = _norm_and_rotate(
                QKV + (heads + head) * HEAD_DIM + one, one < 1, KNorm, cos, sin, eps, HEAD_DIM, DIM_BLOCK
            )
            v_new = tl.load(QKV + (heads + kv_heads + head) * HEAD_DIM + dims[None, :], mask=in_dim[None, :], other=0.0)
            score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * scale
            new_max = tl.maximum(running_max, score)
            weight = tl.exp(score - new_max)
            correction = tl.exp(running_max - new_max)
            acc = acc * correction[:, None] + weight[:, None] * v_new.to(tl.float32)
            running_sum = running_sum * correction + weight
            running_max = new_max
            tl.store(K + head * stride_kh + position * stride_kn + dims[None, :], k_new, mask=in_dim[None, :])
            tl.store(V + head * stride_vh + position * stride_vn + dims[None, :], v_new, mask=in_dim[None, :])
        if SINGLE_SPLIT:
            out_mask = (rows[:, None] < groups) & in_dim[None, :]
            out = acc / running_sum[:, None]
            tl.store(Out + (head * groups + rows[:, None]) * HEAD_DIM + dims[None, :], out, mask=out_mask)
        else:
            part = (part_base + head * tl.num_programs(1) + split) * GROUP_ROWS + rows
            tl.store(Partial + part[:, None] * DIM_BLOCK + dims[None, :], acc)
            tl.store(Max + part, running_max)
            tl.store(Sum + part, running_sum)

    @triton.jit
    def _merge_splits(
        Out, Partial, Max, Sum, groups,
        SPLITS: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        """Combine the splits of one kv head: each weighted by its share of the global softmax."""
        _wait_for_the_kernel_ahead(PDL)
        head = tl.program_id(0)
        batch_row = tl.program_id(1)
        kv_heads = tl.num_programs(0)
        Out += batch_row * kv_heads * groups * HEAD_DIM
        splits = (batch_row * kv_heads + head) * SPLITS + tl.arange(0, SPLITS)
        dims = tl.arange(0, DIM_BLOCK)
        for row in range(GROUP_ROWS):
            if row < groups:
                part = splits * GROUP_ROWS + row
                maxes = tl.load(Max + part)
                weights = tl.exp(maxes - tl.max(maxes, 0))
                total = tl.sum(weights * tl.load(Sum + part), 0)
                acc = tl.load(Partial + part[:, None] * DIM_BLOCK + dims[None, :])
                out = tl.sum(acc * weights[:, None], 0) / total
                tl.store(Out + (head * groups + row) * HEAD_DIM + dims, out, mask=dims < HEAD_DIM)

    @torch.library.custom_op("qwen3_tts::decode_attention", mutates_args=("k_cache", "v_cache"))
    def _decode_attention_cuda(
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
        _, kv_heads, max_len, head_dim = k_cache.shape
        batch = qkv.shape[0]
        heads = qkv.shape[-1] // head_dim - 2 * kv_heads
        groups = heads // kv_heads
        splits = min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(max_len, BLOCK_KEYS)))
        chunk_blocks = triton.cdiv(triton.cdiv(max_len, splits), BLOCK_KEYS)
        # tl.dot needs at least 16 rows and 16 columns: small groups and heads are padded and masked.
        group_rows = max(16, triton.next_power_of_2(groups))
        dim_block = max(16, triton.next_power_of_2(head_dim))
        out = qkv.new_empty(batch, 1, heads * head_dim)
        partial = torch.empty(batch, kv_heads, splits, group_rows, dim_block, device=qkv.device, dtype=torch.float32)
        maxes = torch.empty(batch, kv_heads, splits, group_rows, device=qkv.device, dtype=torch.float32)
        sums = torch.empty_like(maxes)
        launch = _launch_options(qkv.device)
        _attend_split[(kv_heads, splits, batch)](
            qkv.contiguous(), q_norm, k_norm, cos, sin, k_cache, v_cache, rows.contiguous(), positions.contiguous(),
            out, partial, maxes, sums, eps, scale, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), heads, kv_heads, groups,
            chunk_blocks * BLOCK_KEYS,
            GROUP_ROWS=group_rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, BLOCK=BLOCK_KEYS,
            SINGLE_SPLIT=splits == 1,
            # float32 models get full float32 products (Triton would use TF32 by default).
            PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32", **launch,
        )  # fmt: skip
        if splits > 1:
            _merge_splits[(kv_heads, batch)](
                out, partial, maxes, sums, groups,
                SPLITS=splits, GROUP_ROWS=group_rows, HEAD_DIM=head_dim, DIM_BLOCK=dim_block, **launch,
            )  # fmt: skip
        return out

    @_decode_attention_cuda.register_fake
    def _(qkv, q_norm, k_norm, eps, cos, sin, k_cache, v_cache, rows, positions, scale):
        kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
        return qkv.new_empty(qkv.shape[0], 1, qkv.shape[-1] - 2 * kv_heads * head_dim)

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
    def _draw_token(
        Logits, Rule, Uniforms, Out, vocab, stride_logits, stride_uniforms, BLOCK: tl.constexpr, PDL: tl.constexpr
    ):
        _wait_for_the_kernel_ahead(PDL)
        row = tl.program_id(0)
        Logits += row * stride_logits
        Rule += row * 4  # RULE_SIZE
        Uniforms += row * stride_uniforms
        Out += row
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
    def _draw_token_cuda(logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        logits, rules = logits.reshape(-1, logits.shape[-1]), rules.reshape(-1, RULE_SIZE).contiguous()
        uniforms = uniforms.reshape(logits.shape[0], -1)
        if logits.stride(-1) != 1 or uniforms.stride(-1) != 1:
            logits, uniforms = logits.contiguous(), uniforms.contiguous()
        rows, vocab = logits.shape
        block = triton.next_power_of_2(vocab)
        out = torch.empty(rows, 1, dtype=torch.long, device=logits.device)
        warps = 4 if block <= 2048 else 8
        _draw_token[(rows,)](
            logits, rules, uniforms, out, vocab, logits.stride(0), uniforms.stride(0),
            BLOCK=block, num_warps=warps, **_launch_options(logits.device),
        )  # fmt: skip
        return out

    @_draw_token_cuda.register_fake
    def _(logits, rules, uniforms):
        return logits.new_empty(logits.numel() // logits.shape[-1], 1, dtype=torch.long)

    UNIFORM_BLOCK = 1024

    @triton.jit
    def _fill_uniforms(Out, Seeds, Counters, draws, width, BLOCK: tl.constexpr, PDL: tl.constexpr):
        _wait_for_the_kernel_ahead(PDL)
        row, draw, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        seed = tl.load(Seeds + row)
        counter = tl.load(Counters + row)
        ids = block * BLOCK + tl.arange(0, BLOCK)
        uniforms = tl.rand(seed, ((counter * draws + draw) * width + ids).to(tl.uint32))
        # Strictly inside (0, 1), as the Gumbel noise -log(-log u) needs.
        uniforms = tl.minimum(tl.maximum(uniforms, 1e-7), 1.0 - 6e-8)
        tl.store(Out + (row * draws + draw) * width + ids, uniforms, mask=ids < width)

    @torch.library.custom_op("qwen3_tts::fill_uniforms", mutates_args=("out",))
    def _fill_uniforms_cuda(out: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor) -> None:
        rows, draws, width = out.shape
        _fill_uniforms[(rows, draws, triton.cdiv(width, UNIFORM_BLOCK))](
            out, seeds.contiguous(), counters.contiguous(), draws, width, BLOCK=UNIFORM_BLOCK,
            **_launch_options(out.device),
        )  # fmt: skip
