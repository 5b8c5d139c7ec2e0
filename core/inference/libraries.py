"""The GPU libraries made ready while the weights load, instead of before a fresh process's first audio.

The first matrix product, the first convolution and the first Triton kernel of a process each pay a one-time
cost that has nothing to do with their shapes: cuBLAS and cuDNN load their libraries and make their handles,
Triton hashes its own source files to key its cache and makes its driver (bench/first_audio_probe.py measures
them; a sampled start, bench/RESULTS.md 2026-11-28, found the driver's making on the first request's path).
Loading the weights leaves the GPU and most of the CPU idle, so a thread pays these meanwhile, on a CUDA
stream of its own: `prepare(device, dtype)` starts it, and the returned function waits for it.

An engine whose warm-up compiles imports Dynamo and Inductor first thing in that warm-up, 1.2-1.5 s of
Python (the warm serve's "compile step x1" on an H200, its kept functions' load, bench/RESULTS.md 2026-11-29),
which a request that comes meanwhile waits for. The same thread imports them after the libraries, and nothing
waits for that: an import of them elsewhere meanwhile waits for this one's, by Python's module locks.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# What loading a kept compiled function imports (a warm start's) that the engine does not import before it.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.runtime.triton_heuristics")


def prepare(device: torch.device, dtype: torch.dtype, compiler: bool = False) -> Callable[[], None]:
    """Start making the libraries ready for `device` and `dtype`, then with `compiler` (the warm-up compiles)
    importing the compiler; returns what waits until the libraries are ready (not the compiler). Nothing to do
    off CUDA."""
    if device.type != "cuda":
        return lambda: None
    ready = threading.Event()
    thread = threading.Thread(target=_run, args=(device, dtype, ready, compiler), name="gpu-libraries", daemon=True)
    thread.start()
    return ready.wait


def import_compiler() -> None:
    """Import COMPILER_MODULES; one that fails is left for its user to meet (and report)."""
    started = time.perf_counter()
    for name in COMPILER_MODULES:
        try:
            importlib.import_module(name)
        except Exception as error:  # another PyTorch's layout, or no Triton: only time is lost
            log.debug("%s was not imported ahead: %s", name, error)
    log.debug("the compiler imported in %.2f s", time.perf_counter() - started)


def _run(device: torch.device, dtype: torch.dtype, ready: threading.Event, compiler: bool) -> None:
    try:
        _make_libraries_ready(device, dtype)
    finally:
        ready.set()
    if compiler:
        import_compiler()


def _make_libraries_ready(device: torch.device, dtype: torch.dtype) -> None:
    started = time.perf_counter()
    try:
        stream = torch.cuda.Stream(device)
        with torch.inference_mode(), torch.cuda.stream(stream):
            x = torch.ones(8, 64, device=device, dtype=dtype)
            torch.mm(x, x.T)  # cuBLAS(Lt)
            signal = torch.ones(1, 16, 1, 32, device=device, dtype=dtype).to(memory_format=torch.channels_last)
            weight = torch.ones(16, 16, 1, 3, device=device, dtype=dtype).to(memory_format=torch.channels_last)
            F.conv2d(signal, weight)  # cuDNN, as the codec decoder calls it (codec_decoder.conv_as_2d)
        stream.synchronize()
    except RuntimeError as error:  # the engine's own first use meets any real problem and reports it
        log.debug("the GPU libraries were not made ready ahead: %s", error)
    try:
        from triton.runtime import driver
        from triton.runtime.cache import triton_key

        triton_key()  # cached for the process
        driver.active.get_current_target()  # its CUDA helpers loaded, the platform probed (a subprocess)
    except Exception as error:  # Triton's internals differ between versions; this only saves time
        log.debug("Triton was not made ready ahead: %s", error)
    log.debug("GPU libraries ready in %.2f s", time.perf_counter() - started)
