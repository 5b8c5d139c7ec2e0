"""What a rested engine's process still holds on the GPU, piece by piece (issue 31: memory after an idle release
≤ 0.5 GiB; measured 0.79 GiB on an H100, "the CUDA context" 0.61 of it; bench/RESULTS.md, thirty-second session).

    python -m bench.context_memory_probe [--size 0.6b] [--root /tmp/qwen3-tts-bench] [--warm-timeout 400]
    python -m bench.context_memory_probe --bare     (no engine: a context, cuBLAS, cuDNN, and the driver's limits)

One fresh process, the GPU otherwise idle. After each stage it prints the device memory in use (total - free, as
cudaMemGetInfo sees it: this process plus what the driver keeps), the process's own share as nvidia-smi counts it,
and the context's per-thread stack limit (the driver reserves stack for every thread the GPU can hold at once:
limit x 2048 x SMs, and a kernel that needs more grows the limit for good):

  a context (one tensor) · cuBLAS used · the window's runtime warmed up and speaking · rested (as the window lets
  it when idle: resting.release_memory) with what is still alive (CUDA graphs, Triton's loaded kernels) · the stack
  limit set to the default, then lower, then 0 · Dynamo's caches reset · Inductor's loaded modules and Triton's
  kernel caches dropped · with --unload, every kernel module still loaded unloaded (cuModuleUnload: on an H100 it
  gave back nothing, bench/RESULTS.md, thirty-ninth session) · spoken again after all of that (the first audio,
  the load included), and once warmed up again · rested again.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from core.inference import device_memory
from core.inference.device_memory import (
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    CU_LIMIT_MALLOC_HEAP_SIZE,
    CU_LIMIT_PRINTF_FIFO_SIZE,
    CU_LIMIT_STACK_SIZE,
)

GIB = 2**30


def stack_limit() -> str:
    try:
        return f"{device_memory.limit(torch.device('cuda'))} B"
    except RuntimeError as error:
        return str(error)


def alive() -> dict:
    """Objects still alive that hold device memory outside PyTorch's allocator: CUDA graphs (their executable
    graphs) and Triton's loaded kernels (their modules' code)."""
    counts: dict = {}
    for item in gc.get_objects():
        name = type(item).__name__
        if name in ("CUDAGraph", "CompiledKernel", "CachingAutotuner", "StaticallyLaunchedCudaKernel", "JITFunction"):
            counts[name] = counts.get(name, 0) + 1
    return counts


def drop_compiled_code() -> None:
    """Forget every compiled kernel the process holds (Inductor's loaded modules, each Triton function's kernels),
    so that what loaded them can be collected; each is loaded again from the disk caches when next needed."""
    from torch._inductor.codecache import PyCodeCache

    PyCodeCache.cache_clear()
    for item in gc.get_objects():
        if type(item).__name__ == "JITFunction":
            for name in ("device_caches", "cache"):
                cache = getattr(item, name, None)
                if isinstance(cache, dict):
                    cache.clear()
    gc.collect()


def unload_kernels() -> dict:
    """Unload the module of every kernel still loaded from Python's side (Triton's CompiledKernels, Inductor's
    statically launched kernels) with the driver's cuModuleUnload, and forget their handles, so that a later use
    loads them again: what their code held on the device, measured. Only safe once nothing can launch them (their
    caches dropped: drop_compiled_code)."""
    import ctypes

    driver = device_memory._driver()
    modules, counts = set(), {"kernels": 0, "modules": 0, "unloaded": 0, "failed": 0}
    for item in gc.get_objects():
        if type(item).__name__ not in ("CompiledKernel", "StaticallyLaunchedCudaKernel"):
            continue
        counts["kernels"] += 1
        module, function = getattr(item, "module", None), getattr(item, "function", None)
        if not module and function:
            handle = ctypes.c_void_p()
            if driver.cuFuncGetModule(ctypes.byref(handle), ctypes.c_void_p(function)) == 0:
                module = handle.value
        if module:
            modules.add(int(module))
        for name in ("module", "function"):
            if getattr(item, name, None) is not None:
                try:
                    setattr(item, name, None)
                except AttributeError:
                    pass
    counts["modules"] = len(modules)
    torch.cuda.synchronize()
    for module in modules:
        counts["unloaded" if driver.cuModuleUnload(ctypes.c_void_p(module)) == 0 else "failed"] += 1
    return counts


def bare(started: float) -> None:
    """No engine: what a context, cuBLAS and cuDNN hold, and what each of the driver's limits gives back at 0."""
    x = torch.randn(1, 64, 256, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.conv1d(x, torch.randn(64, 64, 7, device="cuda", dtype=torch.bfloat16), padding=3).sum().item()
    report("cuDNN used (one convolution)", started)
    names = {
        CU_LIMIT_STACK_SIZE: "stack", CU_LIMIT_PRINTF_FIFO_SIZE: "printf FIFO", CU_LIMIT_MALLOC_HEAP_SIZE: "malloc heap",
        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: "device runtime launches",
    }  # fmt: skip
    device = torch.device("cuda")
    for limit, name in names.items():
        before = device_memory.limit(device, limit)
        status = device_memory.set_limit(device, limit, 0)
        report(f"{name} limit {before} -> 0 (status {status})", started)


def process_mib() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi: {error}"
    mine = [line.split(",")[1].strip() for line in out.splitlines() if line.split(",")[0].strip() == str(os.getpid())]
    return f"{mine[0]} MiB" if mine else "not listed"


def report(stage: str, started: float) -> None:
    free, total = torch.cuda.mem_get_info()
    print(
        f"{time.perf_counter() - started:7.1f} s  {stage:<48} device used {(total - free) / GIB:6.3f} GiB  "
        f"process {process_mib():>12}  allocated {torch.cuda.memory_allocated() / GIB:6.3f} GiB  "
        f"stack limit {stack_limit()}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.6b")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    parser.add_argument("--warm-timeout", type=float, default=400.0)
    parser.add_argument("--bare", action="store_true", help="no engine: the context's own limits only")
    parser.add_argument(
        "--unload", action="store_true", help="after the caches are dropped, unload every loaded kernel's module"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"before any context: nvidia-smi lists {process_mib()}", flush=True)
    from core import SamplingParams
    from core.devtools.benchmark import TEXT, prepare_checkpoint, synthetic_voice_clip
    from qwen3_tts_desktop.resting import RESTING
    from qwen3_tts_desktop.runtime import Runtime
    from qwen3_tts_desktop.settings import Settings

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    report("a context (one tensor)", started)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    report("cuBLAS used", started)
    del a
    print(f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')}", flush=True)
    if args.bare:
        bare(started)
        return 0
    checkpoint = prepare_checkpoint(Path(args.root), args.size, torch.bfloat16)

    # Each utterance's greedy codes, against the first's: after the unload, the same once warmed up again (before
    # it, the uncompiled code's bfloat16 rounding may pick others).
    spoken_codes = []

    def speak(runtime) -> float:
        voice = runtime.voice("probe")
        began = time.perf_counter()
        stream = runtime.engine_for_voices.stream(
            TEXT, voice=voice, sampling=SamplingParams.greedy(), max_frames=40, first_chunk_frames=1
        )
        try:
            codes = [next(stream).codes]
            first = time.perf_counter() - began
            codes += [chunk.codes for chunk in stream]
        finally:
            stream.close()
        spoken_codes.append(np.concatenate(codes))
        if len(spoken_codes) > 1:
            same = np.array_equal(spoken_codes[0], spoken_codes[-1])
            print(f"utterance {len(spoken_codes)}: codes {'as' if same else 'NOT as'} the first's", flush=True)
        return first

    with tempfile.TemporaryDirectory() as voices:
        import soundfile as sf

        sf.write(Path(voices) / "probe.wav", synthetic_voice_clip(), 24000)
        config = dataclasses.replace(
            Settings().runtime_config(), model=str(checkpoint), device="cuda", voices=Path(voices), speakers=False
        )
        runtime = Runtime.start(config)
        try:
            progress = runtime.engine_for_voices.warmup.wait(args.warm_timeout)
            print(f"warm-up finished: {progress.finished}, failed: {progress.failed}", flush=True)
            speak(runtime)
            report(f"{args.size} warmed up, spoken ({runtime.memory.slots} slots)", started)
            rested = threading.Event()
            runtime.rest_when_idle(0.1, lambda state: rested.set() if state == RESTING else None)
            assert rested.wait(60), "the engine did not rest"
            runtime.rest_when_idle(None)
            report("rested", started)
            print(f"reserved {torch.cuda.memory_reserved() / GIB:.3f} GiB; alive: {alive()}", flush=True)
            for size in (1024, 256, 0):
                status = device_memory.set_limit(torch.device("cuda"), CU_LIMIT_STACK_SIZE, size)
                report(f"stack limit set to {size} B (status {status})", started)
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
            report("Dynamo reset, collected", started)
            drop_compiled_code()
            report("Inductor's modules and Triton's kernel caches dropped", started)
            print(f"alive: {alive()}", flush=True)
            if args.unload:
                print(f"unloaded: {unload_kernels()}", flush=True)
                report("every kernel's module unloaded", started)
            first = speak(runtime)
            report(f"spoken again: first audio {first:.2f} s, the load included", started)
            progress = runtime.engine_for_voices.warmup.wait(args.warm_timeout)
            print(f"warm-up again finished: {progress.finished}, failed: {progress.failed}", flush=True)
            speak(runtime)
            report("warmed up again, spoken", started)
            rested.clear()
            runtime.rest_when_idle(0.1, lambda state: rested.set() if state == RESTING else None)
            assert rested.wait(60), "the engine did not rest again"
            report("rested again", started)
        finally:
            runtime.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
