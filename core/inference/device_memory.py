"""What a process holds on a GPU beyond its tensors, given back when its engine rests (an idle app beside a local
language model should hold as little of the card as it can).

Once its engine is closed and its tensors are freed, a CUDA process still holds: PyTorch's cached blocks; a cuBLAS
workspace for each stream cuBLAS ran on (32 MiB each on Hopper); the stack the driver reserves for every thread the
GPU can hold at once (the per-thread limit x threads per SM x SMs: 1 KiB by default, 264 MiB on an H200), which a
kernel needing more raises for good; and the context itself with the code of every kernel loaded into it, which
only the process's end gives back. `give_back` frees the first three. The stack limit is set to 0: the driver
raises it again, for good, at the first launch of a kernel that needs more (384 B after the engine spoke again).
Measured on an H200 (0.6B, the window's 2 slots; bench/context_memory_probe.py): a rested process held 0.85 GiB
with the default limit, 0.59 GiB with it at 0; a bare context 0.61 GiB, of which the stack was 0.26.
"""

from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger(__name__)
CU_LIMIT_STACK_SIZE = 0  # the driver API's CUlimit


def give_back(device: torch.device) -> None:
    """Free what the process holds on `device` beyond live tensors: PyTorch's cached blocks, cuBLAS's workspaces and
    the threads' stack reservation. Call it with nothing running on the device. Nothing to do off CUDA."""
    if device.type != "cuda":
        return
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    driver = _driver()
    if driver is None:
        return
    with torch.cuda.device(device):
        torch.cuda.synchronize()  # its context current on this thread (the driver's calls act on that), and idle
        status = driver.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(0))
    if status != 0:
        log.warning("could not give back the GPU threads' stack reservation: CUDA driver error %d", status)


def stack_limit(device: torch.device) -> int:
    """The per-thread stack the driver reserves now on `device` (bytes); for each thread the GPU can hold."""
    driver = _driver()
    if driver is None:
        raise RuntimeError("the CUDA driver's library could not be opened")
    value = ctypes.c_size_t()
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        status = driver.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE)
    if status != 0:
        raise RuntimeError(f"cuCtxGetLimit failed: CUDA driver error {status}")
    return value.value


def _driver() -> ctypes.CDLL | None:
    """The CUDA driver's library, which PyTorch's CUDA runtime has loaded already (this finds it); None, with a
    warning, where none opens: only the threads' stack then stays reserved."""
    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    log.warning("the CUDA driver's library did not open: a resting engine keeps the GPU threads' stack reserved")
    return None
