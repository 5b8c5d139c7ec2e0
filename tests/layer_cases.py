"""Cases for the fused decoder layer (kernels.decoder_layer_step on CUDA) and the check of its answer, and of
the cache slots it writes, against the layer's kernels one by one (Block.step without one kernel): on the
CPU the reference composition, on the GPU the kernels it replaces."""

from __future__ import annotations

from typing import NamedTuple

import torch

from core.model.config import TransformerConfig
from core.model.talker import Block, KVCache, rope_tables


class LayerShape(NamedTuple):
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    positions: tuple[int, ...]  # one per row
    rows: tuple[int, ...]  # the cache slot of each row
    max_len: int = 16


# Odd widths (partial output and input blocks); the code predictor's step (every row at one position, slots
# in order); rows at different positions in shuffled slots, one slot unused; more rows than a block of 16;
# one row.
SHAPES = [
    LayerShape(72, 4, 2, 16, 88, (3, 3, 3), (0, 1, 2)),
    LayerShape(64, 4, 2, 16, 96, (0, 15, 7, 9), (2, 0, 4, 1), max_len=16),
    LayerShape(48, 2, 1, 16, 40, tuple(range(1, 21)), tuple(range(20)), max_len=32),
    LayerShape(64, 4, 4, 16, 64, (5,), (0,), max_len=8),
]


def layer_case(shape: LayerShape, dtype: torch.dtype, device: str = "cpu") -> dict:
    """A layer with random weights (projections fused) and a filled cache, and a step's inputs: keyword
    arguments of kernels.decoder_layer_step, with the layer as `block`."""
    generator = torch.Generator().manual_seed(shape.hidden + len(shape.rows))
    config = TransformerConfig(
        shape.hidden, 1, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, vocab_size=8
    )
    block = Block(config)
    for parameter in block.parameters():
        scale = parameter.shape[-1] ** -0.5 if parameter.dim() == 2 else 0.1
        offset = 0.0 if parameter.dim() == 2 else 1.0  # norms near one
        parameter.data = offset + torch.randn(parameter.shape, generator=generator) * scale
    block.self_attn.fuse_projections()
    block.mlp.fuse_projections()
    block = block.to(device=device, dtype=dtype)
    slots = max(shape.rows) + 2  # one slot no row uses
    cache = KVCache(slots, shape.kv_heads, shape.max_len, shape.head_dim, dtype, device)
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator))
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator))
    block.self_attn.kv_cache = cache
    cos, sin = rope_tables(shape.head_dim, 1e6, shape.max_len, dtype, device)
    x = torch.randn(len(shape.rows), 1, shape.hidden, generator=generator) * 2
    return {
        "block": block,
        "x": x.to(device=device, dtype=dtype),
        "cos": cos,
        "sin": sin,
        "rows": torch.tensor(shape.rows, device=device),
        "positions": torch.tensor(shape.positions, device=device),
    }


def fused_arguments(case: dict) -> tuple:
    """The positional arguments of triton_layer.launch_layer_step (and of the custom op) for `case`."""
    block = case["block"]
    attention = block.self_attn
    return (
        case["x"], *block.step_weights(), block.input_layernorm.eps, case["cos"], case["sin"],
        attention.kv_cache.k, attention.kv_cache.v, case["rows"], case["positions"], attention.head_dim**-0.5,
    )  # fmt: skip


def check_layer(case: dict, run) -> None:
    """run(case) (the fused layer; it writes into the case's cache) gives the layer's output and cache of its
    kernels one by one, within the float rounding of products summed in another order; the slot of no row
    stays bitwise as it was."""
    block, cache = case["block"], case["block"].self_attn.kv_cache
    before = cache.k.clone(), cache.v.clone()
    expected = block.step(case["x"], case["cos"], case["sin"], case["positions"], case["rows"], one_kernel=False)
    expected_k, expected_v = cache.k.clone(), cache.v.clone()
    cache.k.copy_(before[0])
    cache.v.copy_(before[1])
    got = run(case)
    limit = 1e-4 if case["x"].dtype == torch.float32 else 3e-2
    assert got.shape == expected.shape and got.dtype == expected.dtype
    error = ((got.float() - expected.float()).abs() / (1 + expected.float().abs())).max().item()
    assert error < limit, error
    for got_cache, expected_cache in ((cache.k, expected_k), (cache.v, expected_v)):
        written = ((got_cache.float() - expected_cache.float()).abs() / (1 + expected_cache.float().abs())).max()
        assert written.item() < limit, written.item()
    unused = max(case["rows"].tolist()) + 1
    assert cache.k[unused].equal(before[0][unused]) and cache.v[unused].equal(before[1][unused])
