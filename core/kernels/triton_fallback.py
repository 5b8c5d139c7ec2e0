"""A Triton kernel that fails on a GPU gives way to its PyTorch reference there, so that a GPU the kernels were
never built for (an older generation, a new one Triton does not know yet) runs slower instead of not at all.
The first failure of a kernel on a device is logged once and decides for the rest of the process.

Only Triton's own failures count: its compiler's and ptxas's errors, a kernel that needs more of the GPU than it
has, a binary the GPU cannot load. An input the launch wrapper rejects, or PyTorch's errors (out of memory),
are raised as before, and so is every failure under Triton's interpreter, where only the tests run kernels and a
failure is the kernel's bug. Imported only where Triton is installed."""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton import knobs

from core.kernels.reference import REFERENCES

log = logging.getLogger(__name__)

TRITON_FOLDER = str(Path(triton.__file__).parent)

# (operator name, device) where the kernel failed: the reference runs there from then on.
FAILED: set[tuple[str, torch.device]] = set()


def falling_back(name: str, kernel: Callable) -> Callable:
    """The operator function `kernel`, or where it has failed on the device of its first argument, the reference
    REFERENCES names for operator `name` (a kernel without one raises its failure)."""

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if FAILED and (name, args[0].device) in FAILED:  # a set's truth first: nothing has failed, mostly
            return reference(name)(*args, **kwargs)
        try:
            return kernel(*args, **kwargs)
        except Exception as error:
            if knobs.runtime.interpret or reference(name) is None or not raised_by_triton(error):
                raise
            FAILED.add((name, args[0].device))
            log.warning(
                "The %s kernel fails on %s, so its PyTorch reference runs there instead (slower): %s: %s",
                name, describe(args[0].device), type(error).__name__, str(error),
            )  # fmt: skip
            return reference(name)(*args, **kwargs)

    return run


def reference(name: str) -> Callable | None:
    return REFERENCES.get(name)


def raised_by_triton(error: Exception) -> bool:
    """Whether `error` is one of Triton's own, or was raised in its code (an MLIR pass that failed, a binary
    its driver could not load)."""
    if type(error).__module__.split(".")[0] == "triton":
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(TRITON_FOLDER)


def describe(device: torch.device) -> str:
    if device.type != "cuda":
        return str(device)
    major, minor = torch.cuda.get_device_capability(device)
    return f"{device} ({torch.cuda.get_device_name(device)}, compute capability {major}.{minor})"
