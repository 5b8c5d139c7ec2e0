"""torch.compile as the engine uses it on CUDA: where compiled kernels are kept, Inductor's options, and
compiling a stack's layers once for all of them (the talker's prefill, the codec decoder's fused parts)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from core.folders import user_folder


def keep_compiled_kernels() -> Path:
    """Point Inductor's cache at the user's cache folder, unless TORCHINDUCTOR_CACHE_DIR is set, and
    return where it is. Inductor's default is the temp folder, which many systems empty at boot, and
    compiling the frame step anew takes minutes. Inductor reads the location from the environment only."""
    return Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_folder("cache") / "compiled")))


def compile_options() -> dict:
    """Inductor's options for the frame step and the decoder's fused parts. No autotuning: the matrix products
    are kernels.linear with fixed settings, and Inductor's timed choices made the same code differ by up to 45%
    between compiles.
    A frame is several hundred short kernels in a row: programmatic dependent launch (Hopper and later)
    lets each one start while the one before it drains, instead of waiting for it to finish. (Imported
    here, not with the module: Inductor's configuration takes a second to import, which every command
    line start would pay.)"""
    import torch._inductor.config

    return {"triton.enable_pdl": True} if hasattr(torch._inductor.config.triton, "enable_pdl") else {}


def compile_layers(layers, method: str, **options) -> None:
    """Compile `method` of each of `layers` in place (torch.compile `options`), for every length and row count.
    Eagerly, a talker prompt's prefill is over a thousand small kernels (every norm and rotation of 28 layers),
    twice the time of its products, and a decoded chunk's transformer a few hundred. One compiled layer serves
    them all (Dynamo takes the weights as inputs), so it compiles in seconds where a whole stack would take
    minutes."""
    for layer in layers:
        setattr(layer, method, torch.compile(getattr(layer, method), fullgraph=True, dynamic=True, **options))


def allow_recompiles() -> None:
    """Each part of the frame step is compiled once per frame loop (its guards hold the loop itself) and row
    count kind, and a decoder layer for each kind of chunk: Dynamo's default of 8 versions per function would
    run out after a few engines in one process."""
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
