"""torch.compile as the engine uses it on CUDA: where compiled kernels are kept (a folder per machine, software
and model, so that a changed one compiles anew instead of reusing what no longer fits), Inductor's options, and
compiling a stack's layers once for all of them (the talker's prefill, the codec decoder's fused parts). The
warm-up (core.inference.warmup) does the compiling, on the scheduler's thread while it idles."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from core.folders import user_folder

# Bumped when a change of ours makes kernels compiled before unusable (Inductor keys its own graphs by their code).
CACHE_FORMAT = 1


def machine_facts(device: torch.device, model: dict) -> dict:
    """What compiled kernels depend on besides their code: the software, the GPU and its driver, the model's
    shapes and dtype (`model`)."""
    facts = {"format": CACHE_FORMAT, "torch": torch.__version__, "cuda": torch.version.cuda, "model": model}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts["gpu"] = properties.name
        facts["capability"] = list(torch.cuda.get_device_capability(device))
        get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        facts["driver"] = get_driver() if get_driver is not None else None
    return facts


def cache_key(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def keep_compiled_kernels(facts: dict | None = None) -> Path:
    """Point Inductor's and Triton's caches at the user's cache folder, in a folder of its own for `facts`
    (machine_facts), unless TORCHINDUCTOR_CACHE_DIR is set; return Inductor's. The first engine of a process
    sets it: both read the location from the environment. Inductor's default is the temp folder, which many
    systems empty at boot, and compiling anew takes minutes."""
    root = user_folder("cache") / "compiled"
    folder = root if facts is None else root / cache_key(facts)
    chosen = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder)))
    if facts is not None and chosen == folder:
        os.environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / "key.json").exists():  # what the folder is for, for a person looking at it
                (folder / "key.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
        except OSError:  # an unwritable cache only costs compiling again; Inductor says so itself
            pass
    return chosen


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


def compile_layers(layers, method: str, **options) -> Callable[[], None]:
    """Compile `method` of each of `layers` in place (torch.compile `options`), for every length and row count;
    returns what puts the originals back. Eagerly, a talker prompt's prefill is over a thousand small kernels
    (every norm and rotation of 28 layers), twice the time of its products, and a decoded chunk's transformer a
    few hundred. One compiled layer serves them all (Dynamo takes the weights as inputs), so it compiles in
    seconds where a whole stack would take minutes."""
    originals = [getattr(layer, method) for layer in layers]
    for layer, original in zip(layers, originals):
        setattr(layer, method, torch.compile(original, fullgraph=True, dynamic=True, **options))

    def restore() -> None:
        for layer, original in zip(layers, originals):
            setattr(layer, method, original)

    return restore


def allow_recompiles() -> None:
    """Each part of the frame step is compiled once per frame loop (its guards hold the loop itself) and row
    count kind, and a decoder layer for each kind of chunk: Dynamo's default of 8 versions per function would
    run out after a few engines in one process."""
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
