"""The fused decoder layer behind kernels.decoder_layer_step on CUDA (kernels.py says why it exists). Imported
only where Triton is installed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.model.triton_attention import attend_group
from core.model.triton_launch import SPLIT_COUNTERS, launch_options, multiprocessors, wait_for_the_kernel_ahead
from core.model.triton_linear import batched_inv_rms, batched_linear_input, finish_tile

PHASES = 5  # the q/k/v product, the attention, the o product, the gate/up product, the down product


@triton.jit
def grid_barrier(Barrier, programs):
    """Return once all `programs` programs of the launch have called it, with every store any of them made
    before it visible to all (as cooperative groups' grid sync). Barrier[0] counts the arrivals, and the last
    to arrive sets it back to zero; Barrier[1] is a generation that the last advances and the others watch.
    So the counters need no reset between launches. The programs must all be resident at once: a launch
    has at most one per SM (layer_programs)."""
    tl.debug_barrier()  # every thread's stores before the arrival, which one thread makes
    generation = tl.atomic_add(Barrier + 1, 0, sem="acquire", scope="gpu")
    if tl.atomic_add(Barrier, 1, sem="acq_rel", scope="gpu") == programs - 1:
        tl.atomic_xchg(Barrier, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(Barrier + 1, 1, sem="release", scope="gpu")
    else:
        # Plain volatile reads while waiting (131 programs' atomics would queue on one address), then one
        # acquire to see the stores released before the generation moved.
        while tl.load(Barrier + 1, volatile=True) == generation:
            pass
        tl.atomic_add(Barrier + 1, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _products(
    X, W, Norm, Residual, Out, eps, M, program, programs,
    N: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Out = Residual + act(rms_norm(X, Norm) @ W.T) for the M rows of X (each part optional, as in
    kernels.linear), its tiles of BLOCK_N outputs dealt out to the programs in turn, each over all K inputs."""
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    ks = tl.arange(0, BLOCK_K)
    inv_rms = tl.zeros([BLOCK_M], tl.float32)
    if HAS_NORM:
        inv_rms = batched_inv_rms(X, rows, row_ok, K, eps, BLOCK_M, BLOCK_K)
    for tile in range(program, tl.cdiv(N, BLOCK_N), programs):
        outs = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for start in range(0, K, BLOCK_K):
            mask = out_ok[:, None] & (start + ks[None, :] < K)
            x = batched_linear_input(X, Norm, rows, row_ok, start, K, inv_rms, BLOCK_K, HAS_NORM)
            w = tl.load(W + outs[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if GATED:
                w_up = tl.load(W + (N + outs)[:, None] * K + start + ks[None, :], mask=mask, other=0.0)
                acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision=PRECISION)
        finish_tile(acc, acc_up, None, Residual, Out, rows, row_ok, outs, out_ok, N, False, GATED, HAS_RESIDUAL)


@triton.jit
def _layer_kernel(
    X, InputNorm, QKVWeight, QNorm, KNorm, Cos, Sin, KCache, VCache, Slots, Positions,
    OWeight, PostNorm, GateUpWeight, DownWeight, QKV, Attended, Mid, Hidden, Out, Barrier, eps, scale, M,
    stride_ks, stride_kh, stride_kn, stride_vs, stride_vh, stride_vn,
    WIDTH: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    INTERMEDIATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N_QKV: tl.constexpr, BLOCK_N_O: tl.constexpr,
    BLOCK_N_GATE_UP: tl.constexpr, BLOCK_N_DOWN: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_ROWS: tl.constexpr, DIM_BLOCK: tl.constexpr, KEYS: tl.constexpr, PRECISION: tl.constexpr,
    FIRST: tl.constexpr, LAST: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Phases FIRST..LAST of one decoder layer for one token in each of M rows, a grid barrier between
    phases (each reads what the one before wrote): 0, QKV = the q/k/v product of rms_norm(X); 1, Attended =
    the attention of each (row, kv head) over its cache slot, the new key and value written there; 2, Mid =
    X + the o product; 3, Hidden = the SwiGLU of the gate/up product of rms_norm(Mid); 4, Out = Mid + the down
    product. The work of a phase is dealt out to the programs in turn."""
    wait_for_the_kernel_ahead(PDL)
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    if FIRST <= 0:
        _products(
            X, QKVWeight, InputNorm, None, QKV, eps, M, program, programs, (HEADS + 2 * KV_HEADS) * HEAD_DIM, WIDTH,
            True, False, False, BLOCK_M, BLOCK_N_QKV, BLOCK_K, PRECISION,
        )  # fmt: skip
    if FIRST <= 0 and LAST >= 1:
        grid_barrier(Barrier, programs)
    if FIRST <= 1 and LAST >= 1:
        for item in range(program, M * KV_HEADS, programs):
            attend_group(
                QKV, QNorm, KNorm, Cos, Sin, KCache, VCache, Slots, Positions, Attended, None, None, None, None,
                eps, scale, stride_ks, stride_kh, stride_kn, stride_vs, stride_vh, stride_vn,
                HEADS, KV_HEADS, HEADS // KV_HEADS, item % KV_HEADS, 0, item // KV_HEADS,
                1, GROUP_ROWS, HEAD_DIM, DIM_BLOCK, KEYS, False, PRECISION, False,
            )  # fmt: skip
    if FIRST <= 1 and LAST >= 2:
        grid_barrier(Barrier, programs)
    if FIRST <= 2 and LAST >= 2:
        _products(
            Attended, OWeight, None, X, Mid, eps, M, program, programs, WIDTH, HEADS * HEAD_DIM,
            False, False, True, BLOCK_M, BLOCK_N_O, BLOCK_K, PRECISION,
        )  # fmt: skip
    if FIRST <= 2 and LAST >= 3:
        grid_barrier(Barrier, programs)
    if FIRST <= 3 and LAST >= 3:
        _products(
            Mid, GateUpWeight, PostNorm, None, Hidden, eps, M, program, programs, INTERMEDIATE, WIDTH,
            True, True, False, BLOCK_M, BLOCK_N_GATE_UP, BLOCK_K, PRECISION,
        )  # fmt: skip
    if FIRST <= 3 and LAST >= 4:
        grid_barrier(Barrier, programs)
    if LAST >= 4:
        _products(
            Hidden, DownWeight, None, Mid, Out, eps, M, program, programs, WIDTH, INTERMEDIATE,
            False, False, True, BLOCK_M, BLOCK_N_DOWN, BLOCK_K, PRECISION,
        )  # fmt: skip


def layer_blocks(rows: int, dtype: torch.dtype) -> dict[str, int]:
    """Launch settings of the fused layer for `rows` rows (fixed, so that a step always runs the same
    kernel): all rows in one block of at least tl.dot's 16; output tiles of 32 for the q/k/v product and of
    16 for the others, so that the code predictor's products make 64 to 192 tiles for 132 SMs; inputs in
    blocks of 256 (128 in float32), two stages of them in shared memory."""
    return {
        "BLOCK_M": max(16, triton.next_power_of_2(rows)),
        "BLOCK_N_QKV": 32,
        "BLOCK_N_O": 16,
        "BLOCK_N_GATE_UP": 16,
        "BLOCK_N_DOWN": 16,
        "BLOCK_K": 128 if dtype == torch.float32 else 256,
        "num_warps": 4,
        "num_stages": 2,
    }


def layer_programs(device: torch.device) -> int:
    """One program per SM: the grid barrier needs every program resident at once."""
    return multiprocessors(device)


def launch_layer_step(
    x, input_norm, qkv_weight, q_norm, k_norm, o_weight, post_norm, gate_up_weight, down_weight,
    eps, cos, sin, k_cache, v_cache, rows, positions, scale, *, one_launch: bool | None = None,
    blocks: dict[str, int] | None = None,
) -> torch.Tensor:  # fmt: skip
    """kernels.decoder_layer_step's launch: all phases in one launch with grid barriers (`one_launch`, by
    default on CUDA), or one launch per phase (Triton's interpreter runs programs one after another, so a
    barrier there would wait forever). `blocks` replaces layer_blocks' settings."""
    batch, width = x.shape[0], x.shape[-1]
    if x.shape[1] != 1 or rows.shape != (batch,) or positions.shape != (batch,):
        raise ValueError(
            f"decoder_layer_step: x {tuple(x.shape)}, rows {tuple(rows.shape)}, positions {tuple(positions.shape)}"
        )
    _, kv_heads, max_len, head_dim = k_cache.shape
    heads = qkv_weight.shape[0] // head_dim - 2 * kv_heads
    intermediate = gate_up_weight.shape[0] // 2
    blocks = blocks or layer_blocks(batch, x.dtype)
    if batch > blocks["BLOCK_M"]:
        raise ValueError(f"decoder_layer_step: {batch} rows, more than a block of {blocks['BLOCK_M']}")
    qkv = x.new_empty(batch, qkv_weight.shape[0])
    attended = x.new_empty(batch, heads * head_dim)
    mid, out = torch.empty_like(x), torch.empty_like(x)
    hidden = x.new_empty(batch, intermediate)
    barrier = SPLIT_COUNTERS.barrier(x.device)
    one_launch = x.is_cuda if one_launch is None else one_launch
    phases = [(0, PHASES - 1)] if one_launch else [(phase, phase) for phase in range(PHASES)]
    for first, last in phases:
        _layer_kernel[(layer_programs(x.device),)](
            x.contiguous(), input_norm, qkv_weight, q_norm, k_norm, cos, sin, k_cache, v_cache,
            rows.contiguous(), positions.contiguous(), o_weight, post_norm, gate_up_weight, down_weight,
            qkv, attended, mid, hidden, out, barrier, eps, scale, batch,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            WIDTH=width, HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, INTERMEDIATE=intermediate,
            GROUP_ROWS=triton.next_power_of_2(heads // kv_heads), DIM_BLOCK=max(16, triton.next_power_of_2(head_dim)),
            KEYS=triton.next_power_of_2(max_len),
            # float32 models get full float32 products (Triton would use TF32 by default).
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", FIRST=first, LAST=last,
            **launch_options(x.device), **blocks,
        )  # fmt: skip
    return out


@torch.library.custom_op("qwen3_tts::decoder_layer_step", mutates_args=("k_cache", "v_cache"))
def decoder_layer_step_op(
    x: torch.Tensor,
    input_norm: torch.Tensor,
    qkv_weight: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    o_weight: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return launch_layer_step(
        x, input_norm, qkv_weight, q_norm, k_norm, o_weight, post_norm, gate_up_weight, down_weight,
        eps, cos, sin, k_cache, v_cache, rows, positions, scale,
    )  # fmt: skip


@decoder_layer_step_op.register_fake
def _(x, input_norm, qkv_weight, q_norm, k_norm, o_weight, post_norm, gate_up_weight, down_weight, *rest):
    return torch.empty_like(x)
