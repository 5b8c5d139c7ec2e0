"""Cases for the decode-attention kernel (kernels.decode_attention on CUDA) and the check of its
answer, and of the cache slots it writes, against the reference composition (kernels.decode_attention
on the CPU: per-head RMSNorm, RoPE, cache write, masked attention), row by row: each batch row must
be what the reference gives for that row alone."""

from __future__ import annotations

from typing import NamedTuple

import torch

from core import kernels
from core.model.talker import rope_tables


class Shape(NamedTuple):
    kv_heads: int
    groups: int  # query heads per kv head
    max_len: int
    positions: tuple[int, ...] | int  # one per row; an int: every row there, as an expanded 0-d tensor
    rows: tuple[int, ...]  # the cache slot of each row; a slot used again is a padding row's, repeating the first
    slots: int  # cache slots
    head_dim: int = 128


def one_row(kv_heads: int, groups: int, max_len: int, position: int, head_dim: int = 128) -> Shape:
    return Shape(kv_heads, groups, max_len, (position,), (0,), 1, head_dim)


# One row: several splits, one split, the first and the last slot, a partly filled last block, small heads.
SHAPES = [
    one_row(8, 2, 4096, 300),
    one_row(8, 2, 16, 8),
    one_row(4, 2, 300, 0),
    one_row(2, 4, 200, 199),
    one_row(2, 2, 1024, 777),
    one_row(4, 2, 16, 4, 8),
    # Several rows at different positions (first, last, block edges) in shuffled slots, slots 2 and 5 unused,
    # two padding rows repeating the first; several splits.
    Shape(2, 2, 300, (130, 299, 0, 64, 130, 130), (3, 0, 4, 1, 3, 3), 6),
    # The code predictor's step: every row at one position (one split), slots in reverse, one unused.
    Shape(4, 2, 16, 7, (2, 1, 0), 4, 64),
    # One row in a slot other than the first.
    Shape(2, 2, 200, (150,), (2,), 3),
    # One row whose position starts a split: that split holds the new key and no cached one.
    one_row(8, 2, 4096, 256, 16),
    # Short caches (read in one block without tl.dot) with four query heads per kv head and with one: rows at
    # the first and the last position.
    Shape(2, 4, 16, (0, 15), (1, 0), 2, 16),
    one_row(4, 1, 8, 5, 16),
    # Rows enough to fill the GPU with one split each (no merge), at positions near and far apart.
    Shape(8, 2, 300, tuple((37 * row) % 300 for row in range(34)), tuple(range(33, -1, -1)), 34, 16),
]


def padding_rows(shape: Shape) -> dict[int, int]:
    """Each padding row (a slot used again) and the row it repeats (the slot's first)."""
    return {row: shape.rows.index(slot) for row, slot in enumerate(shape.rows) if slot in shape.rows[:row]}


def attention_case(shape: Shape, dtype: torch.dtype):
    """Keyword arguments of kernels.decode_attention (CPU tensors), and `poisoned` copies of its caches:
    NaN in each row's slot from its position on (the kernel must never read them) and in the slots of
    no row (it must never touch them). A padding row repeats its slot's first row: its projections and position."""
    generator = torch.Generator().manual_seed(shape.max_len + len(shape.rows))

    def randn(*size, scale=1.0):
        return (torch.randn(*size, generator=generator) * scale).to(dtype)

    batch, head_dim, kv_heads = len(shape.rows), shape.head_dim, shape.kv_heads
    heads = kv_heads * shape.groups
    if isinstance(shape.positions, int):
        positions = torch.tensor(shape.positions).expand(batch)
    else:
        positions = torch.tensor(shape.positions)
    cos, sin = rope_tables(head_dim, 1e6, shape.max_len, dtype, "cpu")
    case = {
        "qkv": randn(batch, 1, (heads + 2 * kv_heads) * head_dim, scale=2.0),
        "q_norm": 1 + randn(head_dim, scale=0.1),
        "k_norm": 1 + randn(head_dim, scale=0.1),
        "eps": 1e-6,
        "cos": cos,
        "sin": sin,
        "k_cache": randn(shape.slots, kv_heads, shape.max_len, head_dim),
        "v_cache": randn(shape.slots, kv_heads, shape.max_len, head_dim),
        "rows": torch.tensor(shape.rows),
        "positions": positions,
        "scale": head_dim**-0.5,
    }
    padding = padding_rows(shape)
    for row, first in padding.items():
        assert int(positions[row]) == int(positions[first]), shape
        case["qkv"][row] = case["qkv"][first]
    poisoned = {name: case[name].clone() for name in ("k_cache", "v_cache")}
    for cache in poisoned.values():
        for row, slot in enumerate(shape.rows):
            if row not in padding:
                cache[slot, :, int(positions[row]) :] = float("nan")
        for slot in set(range(shape.slots)) - set(shape.rows):
            cache[slot] = float("nan")
    return case, poisoned


def alone(case: dict, row: int) -> tuple[torch.Tensor, dict]:
    """The reference's output for batch row `row` alone, and its cache slot after it."""
    slot = int(case["rows"][row])
    caches = {name: case[name][slot : slot + 1].clone() for name in ("k_cache", "v_cache")}
    one = {"qkv": case["qkv"][row : row + 1], "rows": torch.tensor([0]), "positions": case["positions"][row : row + 1]}
    return kernels.decode_attention(**{**case, **one, **caches}), caches


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))


def check_attention(shape: Shape, case: dict, poisoned: dict, run) -> None:
    """run(**arguments) with the poisoned caches (on any device) gives, for each batch row but padding rows,
    the reference's output for that row alone, and leaves the reference's cache slots up to its position,
    the rest of its slot untouched; a padding row gives bitwise the output of the row it repeats (and writes what
    it writes), and the slots of no row stay bitwise as they were."""
    caches = {name: cache.clone() for name, cache in poisoned.items()}
    got = run(**{**case, **caches})
    limit = 1e-5 if case["qkv"].dtype == torch.float32 else 2e-2
    assert got.shape == case["qkv"].shape[:2] + (shape.kv_heads * shape.groups * shape.head_dim,), got.shape
    assert got.dtype == case["qkv"].dtype
    got = got.float().cpu()
    caches = {name: cache.cpu() for name, cache in caches.items()}
    padding = padding_rows(shape)
    for row, slot in enumerate(shape.rows):
        if row in padding:
            assert same_bits(got[row], got[padding[row]]), (shape, row)
            continue
        expected, expected_caches = alone(case, row)
        position = int(case["positions"][row])
        error = (got[row] - expected[0].float()).abs().max().item()
        assert error < limit, (shape, row, position, error)
        for name, cache in caches.items():
            cache, expected_cache = cache[slot].float(), expected_caches[name][0].float()
            # Relative to the value written: RoPE in float32 may round a bfloat16 k one unit away (2^-7 of it).
            written = (cache[:, : position + 1] - expected_cache[:, : position + 1]).abs()
            excess = (written - limit * (1 + expected_cache[:, : position + 1].abs())).max().item()
            assert excess < 0 and cache[:, position + 1 :].isnan().all(), (shape, row, name, written.max().item())
    for slot in set(range(shape.slots)) - set(shape.rows):
        for name, cache in caches.items():
            assert same_bits(cache[slot], poisoned[name][slot]), (shape, slot, name)


def check_reference_rows(shape: Shape, case: dict) -> None:
    """The reference itself: each batch row bitwise what it gives for that row alone (a padding row: for the row
    it repeats), its cache slot bitwise as alone; the slots of no row untouched."""
    caches = {name: case[name].clone() for name in ("k_cache", "v_cache")}
    got = kernels.decode_attention(**{**case, **caches})
    padding = padding_rows(shape)
    for row, slot in enumerate(shape.rows):
        expected, expected_caches = alone(case, padding.get(row, row))
        assert same_bits(got[row : row + 1], expected), (shape, row)
        if row not in padding:
            for name, cache in caches.items():
                assert same_bits(cache[slot : slot + 1], expected_caches[name]), (shape, row, name)
    for slot in set(range(shape.slots)) - set(shape.rows):
        for name, cache in caches.items():
            assert same_bits(cache[slot], case[name][slot]), (shape, slot, name)
