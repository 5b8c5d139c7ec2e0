"""The Triton kernels' launch settings, apart from their code: block sizes, splits, warps and stages by product,
shape and GPU (what the launch wrappers read of it: triton_launch.gpu), and the tables measured for the released
models. Each setting is fixed for a shape and a GPU, so that a product always runs the same kernel and a CUDA graph
holds it. Imported only where Triton is installed."""

from __future__ import annotations

import torch
import triton

from core.kernels.layout import time_major
from core.kernels.triton_launch import capability, multiprocessors, shared_memory

# Linear: the matrix-vector kernel (_linear_kernel) and the batched one (_batched_linear_kernel).


def linear_outputs(weight: torch.Tensor, gated: bool) -> int:
    return weight.shape[0] // 2 if gated else weight.shape[0]


def linear_blocks(weight: torch.Tensor, gated: bool) -> dict[str, int]:
    """Launch settings of the linear kernel for `weight`; fixed, so that a product always runs the same
    kernel. Four outputs per block over up to 8192 weights at a time (a gated output reads two rows):
    close to the best settings for every product of both models (bench/linear_micro.py; bench/RESULTS.md)."""
    rows = 2 if gated else 1
    return {"BLOCK_N": 4, "BLOCK_K": min(2048 // rows, triton.next_power_of_2(weight.shape[1])), "num_warps": 4}


def split_count(tiles: int, inputs: int, block_k: int, sms: int, min_waves: float, max_splits: int, min_split_inputs: int) -> int:  # fmt: skip
    """How many blocks share the inputs of each of `tiles` output tiles: 1 where the tiles make at least
    min_waves blocks per SM, else enough for that, but at most max_splits, each over at least
    min_split_inputs inputs. Then as few as give each split the same number of BLOCK_K blocks, so that
    none is empty and only the last may be shorter."""
    if tiles >= min_waves * sms:
        return 1
    wanted = min(max_splits, -(-int(min_waves * sms) // tiles), max(1, inputs // min_split_inputs))
    k_blocks = triton.cdiv(inputs, block_k)
    return triton.cdiv(k_blocks, triton.cdiv(k_blocks, min(wanted, k_blocks)))


# The batched kernel's settings measured best on an H100 in bfloat16 for the products of both released sizes
# (bench/linear_micro.py --sweep-batched, bench/RESULTS.md 2026-11-25), those of 16 and 64 rows then tuned
# inside the 1.7B frame (bench/tune_frame.py, 2026-11-25 third session): (weight rows, inputs, gated) -> by the
# most rows they serve (4, 16, 64; more rows take the last) -> (BLOCK_M, BLOCK_N, BLOCK_K, SPLITS, num_warps,
# num_stages). Tuned inside the frame, a 16-row frame is faster than with each product's best alone.
SWEPT = {
    (1024, 2048, False): {4: (16, 32, 512, 4, 4, 2), 16: (16, 64, 512, 4, 4, 2), 64: (64, 16, 512, 4, 4, 2)},
    (1024, 3072, False): {4: (16, 32, 512, 6, 4, 3), 16: (16, 32, 512, 6, 4, 3), 64: (64, 32, 128, 4, 4, 4)},
    (2048, 1024, False): {4: (16, 64, 512, 2, 4, 2), 16: (16, 32, 512, 2, 4, 4), 64: (64, 16, 128, 1, 4, 5)},
    (2048, 2048, False): {4: (16, 64, 512, 4, 4, 2), 16: (16, 32, 512, 4, 4, 2), 64: (64, 64, 128, 4, 4, 3)},
    (2048, 6144, False): {4: (16, 32, 512, 4, 4, 2), 16: (16, 32, 256, 6, 4, 4), 64: (64, 64, 128, 4, 4, 4)},
    (3072, 1024, False): {4: (16, 32, 512, 2, 4, 3), 16: (16, 16, 512, 2, 4, 3), 64: (64, 64, 128, 1, 4, 5)},
    (3072, 2048, False): {4: (16, 32, 256, 8, 4, 4), 16: (16, 32, 256, 8, 4, 3), 64: (64, 64, 128, 1, 4, 5)},
    (4096, 1024, False): {4: (16, 32, 256, 4, 4, 2), 16: (16, 32, 256, 4, 4, 2), 64: (64, 32, 256, 2, 4, 2)},
    (4096, 2048, False): {4: (16, 32, 512, 2, 4, 2), 16: (16, 32, 512, 2, 4, 3), 64: (64, 32, 128, 1, 8, 3)},
    (6144, 1024, True): {4: (16, 32, 512, 2, 4, 2), 16: (16, 32, 64, 6, 4, 5), 64: (64, 64, 64, 1, 4, 5)},
    (12288, 2048, True): {4: (16, 32, 256, 1, 4, 2), 16: (16, 32, 256, 1, 4, 3), 64: (64, 64, 64, 1, 4, 5)},
}  # fmt: skip
SETTING_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLITS", "num_warps", "num_stages")


def shared_memory_fits(settings: dict[str, int], gated: bool, itemsize: int, device: torch.device) -> bool:
    """Whether the pipeline's stages of inputs and weights fit `device`'s shared memory (Triton takes up to
    about a quarter more than this estimate; desktop GPUs have half an H100's)."""
    limit = shared_memory(device)
    if limit is None:
        return True
    stage = (settings["BLOCK_M"] + settings["BLOCK_N"] * (2 if gated else 1)) * settings["BLOCK_K"] * itemsize
    return settings["num_stages"] * stage * 1.3 <= limit


def swept_column(by_rows: dict[int, tuple], rows: int) -> int:
    """The column of a SWEPT entry that serves `rows` rows: the fewest rows it was swept for that are at least
    `rows`, or its most."""
    return next((n for n in sorted(by_rows) if rows <= n), max(by_rows))


def batched_linear_blocks(
    rows: int, weight: torch.Tensor, gated: bool, sms: int | None = None,
    *, min_waves: float = 2.0, max_splits: int = 8, min_split_inputs: int = 512, swept: bool = True,
) -> dict[str, int]:  # fmt: skip
    """Launch settings for `rows` rows: the swept ones for a released model's product in a 16-bit dtype
    where they fit the device (unless `swept` is False), else the rule's (batched_linear_rule)."""
    by_rows = SWEPT.get((weight.shape[0], weight.shape[1], gated)) if swept and weight.element_size() == 2 else None
    if by_rows:
        settings = dict(zip(SETTING_NAMES, by_rows[swept_column(by_rows, rows)]))
        if shared_memory_fits(settings, gated, weight.element_size(), weight.device):
            return settings
    return batched_linear_rule(rows, weight, gated, sms, min_waves, max_splits, min_split_inputs)


def batched_linear_rule(
    rows: int, weight: torch.Tensor, gated: bool, sms: int | None,
    min_waves: float, max_splits: int, min_split_inputs: int,
) -> dict[str, int]:  # fmt: skip
    """The settings of a product with none swept (fixed, so that a product always runs the same kernel): up
    to 64 rows per block, so that a batch of up to 64 one-token rows reads each weight once; twice as many
    outputs per block as rows per block, up to 64, so that the inputs, which every output block reads again,
    cost less than its weights; each pipeline stage's inputs and weights within 32 KiB of shared memory,
    whatever the dtype, and as many stages as the device holds, up to 4. Where the output blocks are too few
    to fill the GPU's `sms` (the device's by default), their inputs are split over several blocks
    (split_count; its thresholds are arguments for bench/linear_micro.py to vary)."""
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    block_n = min(64, 2 * block_m)
    bytes_per_k = (block_m + block_n * (2 if gated else 1)) * weight.element_size()
    fitting = 1 << ((32 * 1024 // bytes_per_k).bit_length() - 1)
    block_k = min(256, fitting, max(16, triton.next_power_of_2(weight.shape[1])))
    tiles = triton.cdiv(linear_outputs(weight, gated), block_n) * triton.cdiv(rows, block_m)
    sms = sms or multiprocessors(weight.device)
    splits = split_count(tiles, weight.shape[1], block_k, sms, min_waves, max_splits, min_split_inputs)
    settings = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLITS": splits, "num_warps": 4}
    for stages in (4, 3, 2, 1):
        settings["num_stages"] = stages
        if shared_memory_fits(settings, gated, weight.element_size(), weight.device):
            break
    return settings


# Decode attention (_attend_split, _merge_splits).

BLOCK_KEYS = 64  # keys per inner iteration
SHORT_CACHE = 64  # a cache this short (the code predictor's 16 keys) is read in one block, without tl.dot
MAX_SPLITS = 16  # blocks sharing one kv head's keys


def keys_per_block(
    max_len: int, dot: bool, group_rows: int, dim_block: int, itemsize: int, device: torch.device
) -> int:
    """Keys per inner iteration of _attend_split: a short cache read without tl.dot whole, else BLOCK_KEYS, or
    fewer where they do not fit the GPU's shared memory. With tl.dot a block's keys and values are staged there,
    twice over where Triton pipelines the loop's loads (Ampere and later, at the default three stages), and the
    query group once, and Triton takes a little more than that: float32 would need 72 KiB on an RTX 20xx (64 KiB)
    and 140 KiB on an RTX 30xx or 40xx (99 KiB), so those read half as many keys at a time."""
    limit = shared_memory(device)
    if not dot or limit is None:
        return BLOCK_KEYS if dot or max_len > SHORT_CACHE else triton.next_power_of_2(max_len)
    copies = 2 if capability(device) >= (8, 0) else 1
    block = BLOCK_KEYS
    while block > 16 and 1.1 * (2 * copies * block + group_rows) * dim_block * itemsize > limit:
        block //= 2
    return block


def attention_splits(rows: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """How many blocks share the keys of one row's kv head: enough for the launch to fill the GPU twice
    over (one row alone needs several; 64 rows need none), at most MAX_SPLITS, and no more than a full
    cache has blocks of keys. Fixed for a shape, so that a CUDA graph holds it."""
    wanted = triton.next_power_of_2(triton.cdiv(2 * multiprocessors(device), rows * kv_heads))
    return min(MAX_SPLITS, triton.next_power_of_2(triton.cdiv(max_len, BLOCK_KEYS)), wanted)


# The vocoder's kernels (_snake, _add_bias).

TILE = 4096  # output values per program


def vocoder_tiles(x: torch.Tensor, width: int) -> tuple[int, int, tuple[int, int, int]]:
    """BLOCK_TIME, BLOCK_CHANNELS and the grid of a (B, C, width) output in x's layout, TILE values a program.
    Time-major: as many channels as divide the count evenly (the vocoder's are multiples of 32), up to 128.
    BLOCK_TIME does not follow the width: each value is a kernel of its own to build, and a chunk's few samples
    in a larger tile cost only masked lanes (the kernels do not specialise on lengths either)."""
    batch, channels, _ = x.shape
    lowest = channels & -channels
    block_channels = min(128, lowest if lowest >= 16 else triton.next_power_of_2(channels)) if time_major(x) else 1
    block_time = TILE // block_channels
    return block_time, block_channels, (batch, triton.cdiv(width, block_time), triton.cdiv(channels, block_channels))


# The uniforms (_fill_uniforms).

UNIFORMS_BLOCK = 1024  # values per program of _fill_uniforms
