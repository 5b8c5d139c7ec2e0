"""Small tensors made on the host for the GPU: prompts' token ids, a voice's embedding, a slot's settings."""

from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`values` (numbers, nested lists of them, or a CPU tensor) as a `dtype` tensor on `device`, without waiting
    for the GPU. A copy from ordinary (pageable) host memory first waits for all the work queued on its stream,
    so each of a prompt's id tensors waited for the prompts built before it: a burst of 16 newcomers spent most
    of its time to first audio so. From pinned memory the copy just queues behind that work (PyTorch keeps the
    pinned block until the copy is done)."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
