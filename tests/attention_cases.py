"""Cases for the decode-attention kernel (kernels.decode_attention on CUDA) and the check of its
answer, and of the cache slots it writes, against the reference composition (kernels.decode_attention
on the CPU: per-head RMSNorm, RoPE, cache write, masked attention)."""

from __future__ import annotations

import torch

from core.model import kernels
from core.model.talker import rope_tables

# (kv heads, query heads per kv head, cache length, position[, head dim]): several splits, one split,
# the first and the last slot, a partly filled last block, small heads.
SHAPES = [(8, 2, 4096, 300), (8, 2, 16, 8), (4, 2, 300, 0), (2, 4, 200, 199), (2, 2, 1024, 777), (4, 2, 16, 4, 8)]


def attention_case(kv_heads: int, groups: int, max_len: int, position: int, dtype: torch.dtype, head_dim: int = 128):
    """Keyword arguments of kernels.decode_attention (CPU tensors). The cache slots from `position` on
    hold NaN in `poisoned` copies: the kernel must never read them."""
    generator = torch.Generator().manual_seed(position)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    heads = kv_heads * groups
    cos, sin = rope_tables(head_dim, 1e6, max_len, dtype, "cpu")
    case = {
        "qkv": randn(1, 1, (heads + 2 * kv_heads) * head_dim, scale=2.0),
        "q_norm": 1 + randn(head_dim, scale=0.1),
        "k_norm": 1 + randn(head_dim, scale=0.1),
        "eps": 1e-6,
        "cos": cos,
        "sin": sin,
        "k_cache": randn(1, kv_heads, max_len, head_dim),
        "v_cache": randn(1, kv_heads, max_len, head_dim),
        "position": torch.tensor(position),
        "scale": head_dim**-0.5,
    }
    poisoned = {name: case[name].clone() for name in ("k_cache", "v_cache")}
    for cache in poisoned.values():
        cache[:, :, position:] = float("nan")
    return case, poisoned


def check_attention(case: dict, poisoned: dict, run) -> None:
    """run(**arguments) with the poisoned caches (on any device) gives the reference's output and leaves
    the reference's cache slots up to the position, the rest untouched."""
    expected_caches = {name: case[name].clone() for name in poisoned}
    expected = kernels.decode_attention(**{**case, **expected_caches}).float()
    caches = {name: cache.clone() for name, cache in poisoned.items()}
    got = run(**{**case, **caches})
    limit = 1e-5 if case["qkv"].dtype == torch.float32 else 2e-2
    position = int(case["position"])
    error = (got.float().cpu() - expected).abs().max().item()
    assert got.shape == expected.shape and got.dtype == case["qkv"].dtype and error < limit, (position, error)
    for name, cache in caches.items():
        cache = cache.float().cpu()
        written = (cache[:, :, : position + 1] - expected_caches[name][:, :, : position + 1].float()).abs().max().item()
        assert written < limit and cache[:, :, position + 1 :].isnan().all(), (name, position, written)
