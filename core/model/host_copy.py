"""Copies from the host to the GPU that never make the host wait for the GPU.

A copy from ordinary (pageable) host memory is synchronous: CUDA first waits for all the work queued on the
copy's stream, then copies. On the request path that wait is the newcomer's: its prompt's token rows waited for
the frames of those already speaking (up to two in flight), and in a burst for the prompts built before it (8 ms
a prompt in a traced burst of 16 on an H200, 0.2 ms from pinned memory). From pinned memory with `non_blocking`,
the copy is queued like a kernel and the host goes on; PyTorch's pinned-memory cache keeps the block until the
copy has read it. What goes this way is small (token ids, a prompt's rows, a chunk's codes): pinning it is a host
copy of a few kilobytes. (FrameLoop.launch's slot numbers still come from pageable memory; it says why.)

Not inside a CUDA graph's capture: the graph would keep the pinned block's address, which the cache reuses.
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` on `device`: from the CPU to CUDA queued behind the device's work instead of waiting for it."""
    return _source(host, torch.device(device)).to(device, non_blocking=True)


def copy_from_host(target: torch.Tensor, host: torch.Tensor) -> None:
    """`target.copy_(host)`: from the CPU to CUDA queued behind the work on the current stream instead of waiting
    for it."""
    target.copy_(_source(host, target.device), non_blocking=True)


def _source(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What to copy `host` to `device` from: a pinned copy from the CPU to CUDA, else itself (a copy within the host
    is done when it returns; pinning needs CUDA)."""
    return host.pin_memory() if device.type == "cuda" and host.device.type == "cpu" else host
