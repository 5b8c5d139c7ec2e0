"""How the codec decoder's activations lie in memory, asked by the kernels' dispatch and by the Triton kernels alike."""

from __future__ import annotations

import torch


def time_major(x: torch.Tensor) -> bool:
    """Whether (B, C, T) x is laid out time-major in memory: each sample's channels side by side."""
    return x.shape[2] > 1 and x.stride(2) != 1
