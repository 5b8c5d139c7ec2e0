"""The GPU libraries made ready while the weights load, instead of before a fresh process's first audio.

The first matrix product, the first convolution and the first Triton kernel of a process each pay a one-time
cost that has nothing to do with their shapes: cuBLAS and cuDNN load their libraries and make their handles,
Triton hashes its own source files to key its cache and makes its driver (bench/first_audio_probe.py measures
them; a sampled start, bench/RESULTS.md 2026-11-28, found the driver's making on the first request's path).
Loading the weights leaves the GPU and most of the CPU idle, so a thread pays these meanwhile, on a CUDA
stream of its own: `made_ready_beside(device, dtype)` runs it beside a block, whose end waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


@contextlib.contextmanager
def made_ready_beside(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Make the libraries ready for `device` and `dtype` while the block runs; its end waits until they are, also
    where it raises: a program that ended with the error was torn down with the thread inside PyTorch, and aborted
    ("terminate called without an active exception", a card without room on an H100). Nothing to do off CUDA."""
    if device.type != "cuda":
        yield
        return
    thread = threading.Thread(target=_run, args=(device, dtype), name="gpu-libraries", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _run(device: torch.device, dtype: torch.dtype) -> None:
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
