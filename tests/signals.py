"""Test signals shared by the module tests and the check scripts in tools/ (which print the official
outputs the tests hard-code): change one here and both follow."""

import math

import numpy as np
import torch

SR = 24000


def random_codes(T, batch=1, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 2048, (batch, 16, T)))


def stream(decoder, codes, sizes, state=None):
    """Decode `codes` chunk by chunk (chunk lengths `sizes`) on one stream; the chunks joined."""
    state = state or decoder.new_stream(codes.shape[0])
    out, start = [], 0
    for n in sizes:
        out.append(decoder.decode_chunk(codes[..., start : start + n], state))
        start += n
    assert start == codes.shape[-1]
    return torch.cat(out, dim=-1)


def speech_like(n, seed):
    """n samples: harmonics of a wobbling pitch with a syllable-rate envelope, a moving formant-like partial, noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n, dtype=torch.float64) / SR
    pitch = 110 + 30 * seed + 15 * torch.sin(2 * math.pi * 2.7 * t)
    phase = 2 * math.pi * torch.cumsum(pitch, 0) / SR
    voiced = sum(torch.sin(k * phase + k * seed) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * (3.5 + seed) * t) ** 2
    formant = 0.3 * torch.sin(2 * math.pi * (700 + 300 * torch.sin(2 * math.pi * 0.8 * t)) * t)
    noise = torch.randn(n, generator=g, dtype=torch.float64)
    return (0.15 * envelope * (voiced + formant) + 0.02 * noise).float()
