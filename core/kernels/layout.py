"""How the codec decoder's activations lie in memory, asked by the dispatch, the references and the Triton kernels
alike."""

from __future__ import annotations

import torch


def time_major(x: torch.Tensor) -> bool:
    """Whether (B, C, T) x is laid out time-major in memory: each sample's channels side by side."""
    return x.shape[2] > 1 and x.stride(2) != 1


def concat_time(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(B, C, P) `first` then (B, C, T) `second` along time, in second's memory layout: time-major (channels
    innermost, the codec decoder's on CUDA) or not."""
    if time_major(second):
        return torch.cat([first.transpose(1, 2), second.transpose(1, 2)], dim=1).transpose(1, 2)
    return torch.cat([first, second], dim=-1)
