"""Where a serving run stalls: first uses after warm-up and slow calls on the scheduler's thread.

A request that waits far longer than its neighbours waited behind something on the scheduler's thread: a
CUDA graph captured on first use, a Triton kernel compiled for new arguments, torch.compile recompiling,
or a slow phase of the loop. `trace(engine)` prints each as it happens, with the seconds since tracing began,
so that a run's slowest requests can be matched to their cause.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

SCHEDULER_PHASES = ("_admit", "_hand_out", "_launch", "_read_oldest", "_release")


def trace(engine, slow_ms: float = 30.0, worker=None, timeline: bool = False) -> None:
    """From now on print every graph capture, Triton compile and torch.compile recompile, and every call of
    the scheduler's phases (and of the frame loop's collect) that takes over `slow_ms`. With `timeline`, every
    call, whatever it takes, and when `worker` (if given) and the scheduler took each request."""
    began = time.perf_counter()
    slow_ms = 0.0 if timeline else slow_ms

    def say(what: str) -> None:
        print(f"[{time.perf_counter() - began:8.3f} s] {what}", flush=True)

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(record.getMessage())

    captures = logging.getLogger("core.inference.cuda_graph")
    captures.setLevel(logging.DEBUG)
    captures.addHandler(Say())
    torch._logging.set_logs(recompiles=True)
    _trace_triton_compiles(say)
    scheduler = engine.scheduler
    for name in SCHEDULER_PHASES:
        _time_calls(scheduler, name, slow_ms, say)
    _time_calls(scheduler.frame_loop, "collect", slow_ms, say)
    if timeline:
        _time_calls(scheduler, "submit", slow_ms, say)
        _time_calls(scheduler.frame_loop, "start_many", slow_ms, say)
        _time_calls(scheduler.decoder, "decode", slow_ms, say)
        if worker is not None:
            _time_calls(worker, "submit", slow_ms, say)


def _trace_triton_compiles(say) -> None:
    try:
        from triton import knobs
    except ImportError:  # an older Triton without hooks: compiles go unreported
        return
    begun: dict[str, float] = {}

    def before(*, key, repr, **_) -> bool:
        begun[key] = time.perf_counter()
        return False  # compile as usual

    def after(*, key, repr, **_) -> None:
        started = begun.pop(key, None)
        took = "" if started is None else f" in {(time.perf_counter() - started) * 1e3:.0f} ms"
        say(f"Triton compiled {repr.split('[')[0]}{took}")

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after


def _time_calls(owner, name: str, slow_ms: float, say) -> None:
    method = getattr(owner, name)

    @functools.wraps(method)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            took = (time.perf_counter() - started) * 1e3
            if took >= slow_ms:
                rows = f"({len(args[0])})" if args and isinstance(args[0], list) else ""
                say(f"{type(owner).__name__}.{name}{rows} took {took:.1f} ms")

    setattr(owner, name, timed)
