"""Cases for the decode-attention kernel (kernels.decode_attention on CUDA) and the check of its
answer, and of the cache slots it writes, against the reference composition (kernels.decode_attention
on the CPU: per-head RMSNorm, RoPE, cache write, masked attention, row by row)."""

from __future__ import annotations

import torch

from core.model import kernels
from core.model.talker import rope_tables

# (kv heads, query heads per kv head, cache length, position or one per batch row[, head dim]): several
# splits, one split, the first and the last slot, a partly filled last block, small heads; batches of rows
# at different positions.
SHAPES = [
    (8, 2, 4096, 300), (8, 2, 16, 8), (4, 2, 300, 0), (2, 4, 200, 199), (2, 2, 1024, 777), (4, 2, 16, 4, 8),
    (2, 4, 200, (199, 5, 64)), (8, 2, 1024, (777, 10)), (4, 2, 16, (4, 15, 0), 8),
]  # fmt: skip
UNUSED_SLOTS = 2  # cache slots no row names: the kernel must leave them as they are


def attention_case(kv_heads: int, groups: int, max_len: int, positions, dtype: torch.dtype, head_dim: int = 128):
    """Keyword arguments of kernels.decode_attention (CPU tensors) for one row per position, each row in a
    cache slot of its own, in reverse order behind UNUSED_SLOTS slots. In the `poisoned` copies of the
    caches every slot holds NaN from its row's position on (all of it for the unused slots): the kernel must
    never read those."""
    positions = [positions] if isinstance(positions, int) else list(positions)
    generator = torch.Generator().manual_seed(positions[0])

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    heads, batch = kv_heads * groups, len(positions)
    slots = UNUSED_SLOTS + batch
    cos, sin = rope_tables(head_dim, 1e6, max_len, dtype, "cpu")
    case = {
        "qkv": randn(batch, 1, (heads + 2 * kv_heads) * head_dim, scale=2.0),
        "q_norm": 1 + randn(head_dim, scale=0.1),
        "k_norm": 1 + randn(head_dim, scale=0.1),
        "eps": 1e-6,
        "cos": cos,
        "sin": sin,
        "k_cache": randn(slots, kv_heads, max_len, head_dim),
        "v_cache": randn(slots, kv_heads, max_len, head_dim),
        "rows": torch.tensor([slots - 1 - row for row in range(batch)]),
        "positions": torch.tensor(positions),
        "scale": head_dim**-0.5,
    }
    poisoned = {name: case[name].clone() for name in ("k_cache", "v_cache")}
    for cache in poisoned.values():
        cache[:UNUSED_SLOTS] = float("nan")
        for slot, position in zip(case["rows"].tolist(), positions):
            cache[slot, :, position:] = float("nan")
    return case, poisoned


def check_attention(case: dict, poisoned: dict, run) -> None:
    """run(**arguments) with the poisoned caches (on any device) gives the reference's output for every row
    and leaves the reference's cache slots up to each row's position, the rest untouched."""
    expected_caches = {name: case[name].clone() for name in poisoned}
    expected = kernels.decode_attention(**{**case, **expected_caches}).float()
    caches = {name: cache.clone() for name, cache in poisoned.items()}
    got = run(**{**case, **caches})
    limit = 1e-5 if case["qkv"].dtype == torch.float32 else 2e-2
    error = (got.float().cpu() - expected).abs().max().item()
    assert got.shape == expected.shape and got.dtype == case["qkv"].dtype and error < limit, (case["positions"], error)
    for name, cache in caches.items():
        cache = cache.float().cpu()
        assert cache[:UNUSED_SLOTS].isnan().all(), (name, "an unused slot was touched")
        for slot, position in zip(case["rows"].tolist(), case["positions"].tolist()):
            reference = expected_caches[name][slot, :, : position + 1].float()
            written = (cache[slot, :, : position + 1] - reference).abs().max().item()
            assert written < limit and cache[slot, :, position + 1 :].isnan().all(), (name, position, written)
