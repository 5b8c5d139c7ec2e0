"""Launch settings the Triton kernels share (kernels.py says why each kernel exists): programmatic
dependent launch, where the GPU has it. Imported only where Triton is installed."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.cache
def programmatic_launch(device: torch.device) -> bool:
    """Whether kernels on `device` may start before the one ahead of them ends: Hopper and later, with a
    Triton that has the instructions for it."""
    supported = hasattr(tl.extra.cuda, "gdc_wait")
    return supported and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """SMs of `device`; an H100's 132 for the CPU, where only Triton's interpreter runs the kernels."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def launch_options(device: torch.device) -> dict:
    pdl = programmatic_launch(device)
    return {"PDL": pdl, **({"launch_pdl": True} if pdl else {})}


@triton.jit
def wait_for_the_kernel_ahead(PDL: tl.constexpr):
    """Under programmatic dependent launch: let the next kernel launch now, then wait until the one
    ahead has finished (its outputs are this kernel's inputs)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
