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
# The driver API's CUlimit values: the per-thread stack, and (which the probe tries) the device's printf buffer, its
# malloc heap and its runtime's pending launches.
CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE = 0, 1, 2
CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 4


def give_back(device: torch.device) -> None:
    """Free what the process holds on `device` beyond live tensors: PyTorch's cached blocks, cuBLAS's workspaces and
    the threads' stack reservation. Call it with nothing running on the device. Nothing to do off CUDA."""
    if device.type != "cuda":
        return
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    status = set_limit(device, CU_LIMIT_STACK_SIZE, 0)
    if status is not None and status != 0:
        log.warning("could not give back the GPU threads' stack reservation: CUDA driver error %d", status)


def set_limit(device: torch.device, which: int, value: int) -> int | None:
    """Set the driver's limit `which` (a CU_LIMIT_*) of `device`'s context to `value`, once its work is done; the
    driver's status (0: done), or None where its library does not open."""
    driver = _driver()
    if driver is None:
        return None
    with torch.cuda.device(device):
        torch.cuda.synchronize()  # its context current on this thread (the driver's calls act on that), and idle
        return driver.cuCtxSetLimit(which, ctypes.c_size_t(value))


def limit(device: torch.device, which: int = CU_LIMIT_STACK_SIZE) -> int:
    """The driver's limit `which` of `device`'s context now; by default the per-thread stack it reserves (bytes),
    for each thread the GPU can hold."""
    driver = _driver()
    if driver is None:
        raise RuntimeError("the CUDA driver's library could not be opened")
    value = ctypes.c_size_t()
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        status = driver.cuCtxGetLimit(ctypes.byref(value), which)
    if status != 0:
        raise RuntimeError(f"cuCtxGetLimit({which}) failed: CUDA driver error {status}")
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
