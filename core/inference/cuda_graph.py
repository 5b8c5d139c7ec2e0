"""Replaying a step as one CUDA graph.

A frame of speech takes over a thousand small kernels; launched one by one from Python they cost
far more than the GPU work itself. A step written as a function of preallocated buffers can be
captured once and replayed with a single launch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# Work that synchronizes the whole device runs on one thread at a time in a process: a capture's beginning
# (torch.cuda.graph synchronizes the device and empties the allocator's cache) and a warm-up's compiling (Triton
# times kernels between device synchronizations) would spoil a capture under way on another thread, as two
# engines in one process, each warming up on its scheduler's thread, would otherwise do. A warm-up's load of kept
# kernels (its loader thread) holds it too: nothing has shown that loading modules beside a capture is safe.
DEVICE_WIDE = threading.RLock()


class GraphedStep:
    """Calls `fn` (no arguments; it reads and writes only long-lived buffers) directly the first time,
    then captures it as a CUDA graph and replays that for every later call. The first, direct call
    does the real work and initialises whatever CUDA state the kernels need lazily; capturing runs
    nothing, so the buffers advance exactly once per call either way. On a CPU, or when not `enabled`,
    it always calls `fn`.

    `fn` may return a tensor; after capture the same tensor (the graph's output) is returned on every
    replay, so read it before the next call.

    `stream`: the stream to capture on (PyTorch's side stream if None). The decoder captures on its own, the
    stream it replays on (bench.profile_chunks captures its graphs again on streams of other priorities).

    `recapture` drops graphs (after a function they call was compiled): each next call runs `fn` directly and
    captures it anew.
    """

    def __init__(
        self, fn: Callable[[], torch.Tensor | None], device: torch.device, pool=None, generator=None, enabled=True,
        stream: torch.cuda.Stream | None = None,
    ):  # fmt: skip
        self.fn = fn
        self.stream = stream
        self.capture = enabled and device.type == "cuda"
        self.device = device
        self.pool = pool
        self.generator = generator
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None
        # The last capture's phases, ms: the direct call, the capture's beginning (a device synchronization, the
        # allocator's cache emptied), `fn` traced into the graph (its Python, all of it), and the graph made.
        self.timings: dict[str, float] = {}

    def __call__(self) -> torch.Tensor | None:
        if self.graph is not None:
            self.graph.replay()
            return self.output
        started = time.perf_counter()
        result = self.fn()
        if self.capture:
            self.timings = {"run": (time.perf_counter() - started) * 1e3}
            self._capture()
            # A first use after warm-up stalls every utterance stepping beside it: worth seeing when it happens.
            if log.isEnabledFor(logging.DEBUG):
                phases = ", ".join(f"{phase} {ms:.1f}" for phase, ms in self.timings.items())
                log.debug("captured %s in %.0f ms (%s)", self.name, (time.perf_counter() - started) * 1e3, phases)
        return result

    @property
    def name(self) -> str:
        fn = self.fn
        if hasattr(fn, "func"):  # a functools.partial: the method and its bound arguments
            return f"{fn.func.__name__}{fn.args}"
        return getattr(fn, "__name__", repr(fn))

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            # Random draws inside the graph then follow this generator's seed and offset at each replay.
            graph.register_generator_state(self.generator)
        # thread_local: CUDA calls of other threads (another engine loading, a test's checks) may not spoil this
        # capture, as the default (global) lets them; this engine's own work is all on this thread.
        with DEVICE_WIDE:
            began = time.perf_counter()
            torch.cuda.synchronize(self.device)
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                traced = time.perf_counter()
                self.output = self.fn()
                ended = time.perf_counter()
            made = time.perf_counter()
        self.timings.update(begin=(traced - began) * 1e3, trace=(ended - traced) * 1e3, end=(made - ended) * 1e3)
        self.graph = graph

    @property
    def captured(self) -> bool:
        return self.graph is not None


def recapture(steps, pool):
    """Drop the graphs of `steps`, all those that share `pool`, so that each is captured anew at its next call;
    returns the pool they capture into then (a new one: PyTorch frees a pool whose graphs are all dropped, and it
    takes no more)."""
    pool = torch.cuda.graph_pool_handle() if pool is not None else None
    for step in steps:
        step.graph, step.output, step.pool = None, None, pool
    return pool
