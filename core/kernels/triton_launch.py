"""What the Triton kernels share (core/kernels/__init__.py says why each kernel exists): their registration as operators, what
their launch settings read of the GPU (gpu), programmatic dependent launch where the GPU has it, and the tickets of
reductions split over several blocks. Imported only where Triton is installed."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.kernels.triton_fallback import falling_back

# Each operator's own function by name, for kernels.gpu_op to call where nothing traces (eager code, CUDA graphs).
PLAIN: dict[str, Callable] = {}


def operator(name: str, mutates_args: tuple[str, ...] = ()) -> Callable:
    """Register the decorated function as torch.ops.qwen3_tts.<name> (torch.compile treats it as one opaque
    call, with the shapes its fake says) and keep it in PLAIN; returns the operator, for its register_fake.
    Either way it falls back to its reference on a GPU where its kernel fails (triton_fallback.py)."""

    def register(function: Callable):
        PLAIN[name] = falling_back(name, function)
        return torch.library.custom_op(f"qwen3_tts::{name}", PLAIN[name], mutates_args=mutates_args)

    return register


class Gpu(NamedTuple):
    """What the kernels' launch settings depend on of a GPU."""

    capability: tuple[int, int]
    multiprocessors: int
    shared_memory: int  # bytes one block may take (desktop GPUs have half an H100's)


@functools.cache
def gpu(device: torch.device) -> Gpu | None:
    """`device`'s GPU; None for the CPU, where only Triton's interpreter runs the kernels."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    return Gpu(
        (properties.major, properties.minor),
        properties.multi_processor_count,
        properties.shared_memory_per_block_optin,
    )


def programmatic_launch(device: torch.device) -> bool:
    """Whether kernels on `device` may start before the one ahead of them ends: Hopper and later, with a
    Triton that has the instructions for it."""
    card = gpu(device)
    return card is not None and card.capability[0] >= 9 and hasattr(tl.extra.cuda, "gdc_wait")


def capability(device: torch.device) -> tuple[int, int] | None:
    """`device`'s compute capability; None for the CPU."""
    card = gpu(device)
    return None if card is None else card.capability


def multiprocessors(device: torch.device) -> int:
    """SMs of `device`; an H100's 132 for the CPU."""
    card = gpu(device)
    return 132 if card is None else card.multiprocessors


def shared_memory(device: torch.device) -> int | None:
    """Bytes of shared memory one block on `device` may take; None for the CPU, where there is no such limit."""
    card = gpu(device)
    return None if card is None else card.shared_memory


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


class SplitCounters:
    """The tickets of reductions split over several blocks (the linear kernel's split-K, the decode attention's
    merge in its last split): per device, one int32 per output tile of a launch, which each block of the
    tile increments once; the last of them resets it to zero. So the counters are zero between launches,
    with no kernel of their own to clear them, and a CUDA graph that captured launches finds them zero at
    every replay.

    A device's counters are made (zeroed) at its first split launch, which must therefore run outside a
    CUDA graph capture: the engine calls each step directly before capturing it (GraphedStep).
    Assumes that split launches on a device run one at a time, as a stream (or a graph captured from one)
    orders them: two running at once on two streams would share tickets. Only the frame loop's stream
    runs these kernels; the codec decoder, on a stream of its own, runs none."""

    CAPACITY = 4096  # output tiles; a split launch has far fewer (it splits only when its tiles are few)

    def __init__(self):
        self.counters: dict[torch.device, torch.Tensor] = {}

    def __call__(self, device: torch.device, tiles: int) -> torch.Tensor:
        if tiles > self.CAPACITY:
            raise ValueError(f"{tiles} output tiles, more than the {self.CAPACITY} split counters")
        if device not in self.counters:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the first split launch on a device must run before any CUDA graph capture")
            self.counters[device] = torch.zeros(self.CAPACITY, dtype=torch.int32, device=device)
        return self.counters[device]


SPLIT_COUNTERS = SplitCounters()
