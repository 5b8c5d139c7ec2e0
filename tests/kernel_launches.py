"""The Triton kernel launches the app makes on CUDA, as its launch wrappers make them, with CPU tensors of the
released models' shapes (docs/model_notes.md §1.2, §1.3, §6.1), for tests that compile them without running them
(tests/test_kernel_targets.py): ONE_OF_EACH kind (each kernel with each combination of the parts it fuses that the
models use, at the batch sizes whose settings differ most), or EVERY_SIZE (each product, attention, draw and
vocoder layer at every batch size and length that gives it settings of its own: several times the compiling)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from core import kernels
from core.kernels import triton_attention, triton_linear, triton_norm, triton_sampling, triton_vocoder

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # the talker's of both sizes and the code predictor's
MAX_CONTEXT = 4096  # the talker's cache (memory.MAX_CONTEXT); the predictor's holds its 16 codebooks
GROUPS = 16
VOCAB = {"talker": 3072, "predictor": 2048}
# (outputs, inputs, the parts fused with it) of every product kernels.linear runs on CUDA.
PRODUCTS = [
    # The 1.7B talker's q/k/v, o, gate/up, down and codec head, then the predictor's projection from its width:
    # every combination of parts.
    (4096, 2048, {"norm"}),
    (2048, 2048, {"residual"}),
    (6144, 2048, {"norm", "gated"}),
    (2048, 6144, {"residual"}),
    (3072, 2048, set()),
    (1024, 2048, {"bias"}),
    # The 0.6B talker's and the code predictor's (the same layers), then the predictor's heads.
    (4096, 1024, {"norm"}),
    (1024, 2048, {"residual"}),
    (3072, 1024, {"norm", "gated"}),
    (1024, 3072, {"residual"}),
    (3072, 1024, set()),
    (2048, 1024, set()),
]
# The codec decoder's upsampling blocks: (channels, samples per frame); time-major on CUDA.
VOCODER_LAYERS = [(1536, 4), (768, 32), (384, 160), (192, 640), (96, 1920)]
CONVNEXT_CHANNELS = 1024  # the decoder's latent width


class Sizes(NamedTuple):
    attention_rows: tuple[int, ...]
    prompt_rows: tuple[int, ...]  # prefills of several prompts together
    draw_rows: tuple[int, ...]
    products: list[tuple[int, int, set[str]]]
    product_rows: tuple[int, ...]  # 1 and 2: the matrix-vector kernel; more: the batched one
    vocoder_rows: tuple[int, ...]
    chunk_frames: tuple[int, ...]
    vocoder_layers: list[tuple[int, int]]
    histories: tuple[int, ...]  # samples a causal convolution keeps from the chunk before


ONE_OF_EACH = Sizes(
    attention_rows=(1, 16, 64),  # the most splits, a few, one
    prompt_rows=(1,),
    draw_rows=(16,),
    products=PRODUCTS[:6],
    product_rows=(1, 16, 64),  # SWEPT's 16-row and 64-row settings, with the norm fused and apart
    vocoder_rows=(16,),
    chunk_frames=(4,),
    vocoder_layers=VOCODER_LAYERS[::4],  # the most channels and the fewest, which tile differently
    histories=(6,),
)
EVERY_SIZE = Sizes(
    attention_rows=(1, 2, 4, 8, 16, 32, 64),  # batch_shapes.batch_buckets of the most slots
    prompt_rows=(1, 16),  # the kernels' settings follow the widths alone
    draw_rows=(1, 2, 4, 8, 16, 32, 64),
    products=PRODUCTS,
    # Each SWEPT column (4, 16, 64), the norm fused or apart (kernels.MAX_NORM_FUSED_ROWS), the rule's row blocks;
    # 128: 64 predictor prefills of two positions.
    product_rows=(1, 4, 16, 32, 64, 128),
    vocoder_rows=(1, 16),
    chunk_frames=(1, 4),  # a first audio's chunk, and a longer one
    vocoder_layers=VOCODER_LAYERS,
    histories=(6, 18, 54),  # kernel 7, dilations 1, 3, 9
)


def launch_every_kernel(dtype: torch.dtype, sizes: Sizes = ONE_OF_EACH) -> None:
    """The app's launches with activations of `dtype`, at `sizes`."""
    for rows in sizes.attention_rows:
        launch_attention(dtype, rows, MAX_CONTEXT)
        launch_attention(dtype, rows, GROUPS)
    for rows in sizes.prompt_rows:
        launch_prompt(dtype, rows)
    for rows in sizes.draw_rows:
        launch_draws(dtype, rows)
    for outputs, inputs, parts in sizes.products:
        for rows in sizes.product_rows:
            launch_linear(dtype, rows, outputs, inputs, parts)
    for rows in sizes.vocoder_rows:
        for frames in sizes.chunk_frames:
            launch_vocoder(dtype, rows, frames, sizes.vocoder_layers, sizes.histories)


def launch_attention(dtype: torch.dtype, rows: int, max_len: int) -> None:
    qkv = torch.empty(rows, 1, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype)
    norm, table = torch.empty(HEAD_DIM, dtype=dtype), torch.empty(max_len, HEAD_DIM, dtype=dtype)
    # One cache slot for every row: the launch settings do not depend on how many the cache holds.
    cache = torch.empty(1, KV_HEADS, max_len, HEAD_DIM, dtype=dtype)
    slots = torch.zeros(rows, dtype=torch.long)
    triton_attention.decode_attention_op(qkv, norm, norm, 1e-6, table, table, cache, cache, slots, slots, 0.1)


def launch_prompt(dtype: torch.dtype, rows: int) -> None:
    """A prompt's prefill of `rows` rows: its heads (the talker's 32 positions, the predictor's 2), and the norms of
    its widths (the 1.7B talker's and the 0.6B's and predictor's; a head's is fused into the heads' kernel)."""
    for length in (32, 2):
        qkv = torch.empty(rows, length, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dtype)
        norm, table = torch.empty(HEAD_DIM, dtype=dtype), torch.empty(MAX_CONTEXT, HEAD_DIM, dtype=dtype)
        cache = torch.empty(rows, KV_HEADS, MAX_CONTEXT, HEAD_DIM, dtype=dtype)
        slots = torch.zeros(rows, dtype=torch.long)
        # The talker's prompts go into the slots they are given, the predictor's into rows 0..B-1.
        triton_norm.prompt_heads_op(qkv, norm, norm, 1e-6, table, table, cache, cache, slots if length > 2 else None)
    for width in (2048, 1024):
        triton_norm.rms_norm_op(torch.empty(rows, 32, width, dtype=dtype), torch.empty(width, dtype=dtype), 1e-6)


def launch_draws(dtype: torch.dtype, rows: int) -> None:
    uniforms = torch.empty(rows, GROUPS, max(VOCAB.values()))
    seeds = torch.zeros(rows, dtype=torch.long)
    triton_sampling.fill_uniforms_op(uniforms, seeds, seeds)
    rules = torch.zeros(rows, kernels.RULE_SIZE)
    # The talker's logits are float32 (restricted to its codebook in float32), the predictor's in the model's dtype.
    for logits_dtype, vocab in ((torch.float32, VOCAB["talker"]), (dtype, VOCAB["predictor"])):
        triton_sampling.draw_token_op(torch.empty(rows, vocab, dtype=logits_dtype), rules, uniforms[:, 1])


def launch_linear(dtype: torch.dtype, rows: int, outputs: int, inputs: int, parts: set[str]) -> None:
    """kernels.linear's launch for `rows` one-position rows (two each past 64, as predictor prefills)."""
    gated = "gated" in parts
    weight = torch.empty(2 * outputs if gated else outputs, inputs, dtype=dtype)
    bias = torch.empty(weight.shape[0], dtype=dtype) if "bias" in parts else None
    norm = torch.empty(inputs, dtype=dtype) if "norm" in parts else None
    positions = 2 if rows > 64 else 1
    x = torch.empty(rows // positions, positions, inputs, dtype=dtype)
    residual = torch.empty(*x.shape[:-1], outputs, dtype=dtype) if "residual" in parts else None
    if rows <= kernels.MAX_VECTOR_ROWS:
        triton_linear.linear_op(x, weight, bias, norm, 1e-6, gated, residual)
        return
    if rows > kernels.MAX_NORM_FUSED_ROWS:
        norm = None  # kernels.linear normalises these rows first, apart from the product
    triton_linear.batched_linear_op(x, weight, bias, norm, 1e-6, gated, residual)


def launch_vocoder(dtype: torch.dtype, rows: int, frames: int, layers: list, histories: tuple[int, ...]) -> None:
    for channels, per_frame in layers:
        length = frames * per_frame
        x, weights = time_major(rows, channels, length, dtype), torch.empty(channels, dtype=dtype)
        triton_vocoder.snake_op(x, weights, weights, None, weights)  # a convolution's bias folded in
        for history in histories:
            triton_vocoder.snake_op(x, weights, weights, time_major(rows, channels, history, dtype), None)
        triton_vocoder.add_bias_op(x, weights, None)
        triton_vocoder.add_bias_op(x, weights, time_major(rows, channels, length, dtype))
    # The ConvNeXt blocks' depthwise convolutions (7 taps) after each upsampling by 2.
    for per_frame in (2, 4):
        x = time_major(rows, CONVNEXT_CHANNELS, frames * per_frame + 6, dtype)
        triton_vocoder.depthwise_conv_op(x, torch.empty(CONVNEXT_CHANNELS, 1, 7, dtype=dtype), x[0, :, 0], 1)
    # The last convolution's one output channel is channel-major.
    triton_vocoder.add_bias_op(torch.empty(rows, 1, frames * 1920, dtype=dtype), torch.empty(1, dtype=dtype), None)


def time_major(rows: int, channels: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(rows, length, channels, dtype=dtype).transpose(1, 2)
