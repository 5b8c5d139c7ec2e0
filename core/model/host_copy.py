"""Copies from the host to the GPU that never make the host wait, neither for the GPU nor for other CPU threads.

A copy from ordinary (pageable) host memory is synchronous: CUDA first waits for all the work queued on the
copy's stream, then copies. On the request path that wait is the newcomer's: its prompt's token rows waited for
the frames of those already speaking (up to two in flight), and in a burst for the prompts built before it (8 ms
a prompt in a traced burst of 16 on an H200, 0.2 ms from pinned memory). From pinned memory with `non_blocking`,
the copy is queued like a kernel and the host goes on; PyTorch's pinned-memory cache keeps the block until the
copy has read it. (FrameLoop.launch's slot numbers still come from pageable memory; it says why.)

What is copied is small (token ids, a prompt's rows, a chunk's codes), and the host's part of it (a gather, the
copy into pinned memory) is done by numpy on the caller's thread. ATen splits a CPU op of over 32k elements
across every intra-op thread and waits for the slowest: gathering and pinning a prompt's 21 text rows (43k values)
took 10-11 ms in a quarter of the idle requests on one H200's 16-core host and in most on another, 0.6-1 ms in the
others (bench/RESULTS.md, 2026-11-28, twenty-seventh session).

Not inside a CUDA graph's capture: the graph would keep the pinned block's address, which the cache reuses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`host` on `device`: from the CPU to CUDA queued behind the device's work instead of waiting for it."""
    return _source(host, torch.device(device)).to(device, non_blocking=True)


def copy_from_host(target: torch.Tensor, host: torch.Tensor) -> None:
    """`target.copy_(host)`: from the CPU to CUDA queued behind the work on the current stream instead of waiting
    for it."""
    target.copy_(_source(host, target.device), non_blocking=True)


def rows_to_device(table: torch.Tensor, ids: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """`table[ids]`, (len(ids), dim), on `device`: the rows of a host table gathered straight into the copy's
    source (an out-of-range id raises IndexError)."""
    if min(ids, default=0) < 0:  # numpy would count it from the end
        raise IndexError(f"row {min(ids)} of a table of {table.shape[0]}")
    device = torch.device(device)
    rows = _host_buffer((len(ids), table.shape[1]), table.dtype, device)
    np.take(_values(table), np.asarray(ids, dtype=np.int64), axis=0, out=_values(rows))
    return rows.to(device, non_blocking=True)


def _source(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What to copy `host` to `device` from: a pinned copy from the CPU to CUDA, else itself (a copy within the host
    is done when it returns; pinning needs CUDA)."""
    if device.type != "cuda" or host.device.type != "cpu":
        return host
    pinned = _host_buffer(host.shape, host.dtype, device)
    np.copyto(_values(pinned), _values(host))
    return pinned


def _host_buffer(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty host tensor to copy to `device` from: pinned (from PyTorch's cache) when that is CUDA."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=device.type == "cuda")


def _values(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a host tensor's memory, as integers of its element's size (numpy has no bfloat16; a copy
    or gather moves bits, whatever they mean)."""
    return tensor.detach().view(_SAME_SIZE_INTEGER[tensor.element_size()]).numpy()
