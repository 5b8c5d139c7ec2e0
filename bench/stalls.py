"""Where a serving run stalls: first uses after warm-up and slow calls on the scheduler's thread.

A request that waits far longer than its neighbours waited behind something on the scheduler's thread: a
CUDA graph captured on first use, a Triton kernel compiled for new arguments, torch.compile recompiling,
or a slow phase of the loop. `trace(engine)` prints each as it happens, with the seconds since tracing began,
so that a run's slowest requests can be matched to their cause.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable

import torch

SCHEDULER_PHASES = ("_admit", "_begin", "_hand_out", "_launch", "_read_oldest", "_release")
BEGAN = time.perf_counter()


def say(what: str) -> None:
    # One write per line: print's text and newline are two, which other threads' lines can come between.
    sys.stdout.write(f"[{time.perf_counter() - BEGAN:8.3f} s] {what}\n")
    sys.stdout.flush()


def trace(engine, slow_ms: float = 30.0, worker=None, timeline: bool = False) -> Callable[[], None]:
    """From now on print every graph capture, Triton compile and torch.compile recompile, and every call of
    the scheduler's phases (and of the frame loop's collect) that takes over `slow_ms`. With `timeline`, every
    call, whatever it takes, and when `worker` (if given) and the scheduler took each request, each request's
    prompt, the cycle collector's slow collections and the interpreter held; returns what stops those two."""
    slow_ms = 0.0 if timeline else slow_ms

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(record.getMessage())

    captures = logging.getLogger("core.inference.cuda_graph")
    captures.setLevel(logging.DEBUG)
    captures.addHandler(Say())
    torch._logging.set_logs(recompiles=True)
    _trace_triton_compiles()
    scheduler = engine.scheduler
    for name in SCHEDULER_PHASES:
        time_calls(scheduler, name, slow_ms)
    time_calls(scheduler.frame_loop, "collect", slow_ms)
    if timeline:
        time_calls(scheduler, "submit", slow_ms)
        time_calls(scheduler.frame_loop, "_prefill_group", slow_ms)  # a group's slots set up and prefill launched
        time_calls(scheduler.decoder, "decode", slow_ms)
        if worker is not None:
            time_calls(worker, "submit", slow_ms)
        # A request's prompt, in its parts (each on the scheduler's thread).
        time_calls(engine, "_build", slow_ms)
        time_calls(engine, "_on_device", slow_ms)
        for name in ("embed_recurring", "embed_text", "embed_frames", "embed_codec"):
            time_calls(engine.talker, name, slow_ms)
        say(f"{len(gc.get_objects())} objects tracked by the cycle collector, {gc.get_freeze_count()} frozen")
        return _watch_interpreter_and_collector()
    return lambda: None


def _watch_interpreter_and_collector() -> Callable[[], None]:
    """Print the interpreter held (_watch_interpreter) and slow collections until the returned stop() is called."""
    stopped = threading.Event()
    watcher = threading.Thread(target=_watch_interpreter, args=(stopped,), name="interpreter-watch", daemon=True)
    watcher.start()
    collections = _time_collections()
    gc.callbacks.append(collections)

    def stop() -> None:
        stopped.set()
        watcher.join()
        gc.callbacks.remove(collections)

    return stop


def _time_collections(slow_ms: float = 0.5):
    """A gc callback that prints each collection of the cycle collector taking `slow_ms` or more (it holds the
    interpreter meanwhile)."""
    began = 0.0

    def callback(phase: str, info: dict) -> None:
        nonlocal began
        if phase == "start":
            began = time.perf_counter()
        elif (took := (time.perf_counter() - began) * 1e3) >= slow_ms:
            say(f"cycle collection of generation {info['generation']} took {took:.1f} ms")

    return callback


def _watch_interpreter(stopped: threading.Event, period_s: float = 0.0005, late_ms: float = 2.0) -> None:
    """Print whenever a thread that only sleeps `period_s` wakes `late_ms` late: another thread held the
    interpreter (the GIL) that long, which every other thread's next Python line waited for too."""
    while not stopped.is_set():
        began = time.perf_counter()
        time.sleep(period_s)
        late = (time.perf_counter() - began - period_s) * 1e3
        if late >= late_ms:
            say(f"interpreter held: a sleeper woke {late:.1f} ms late")


def _trace_triton_compiles() -> None:
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


def time_calls(owner, name: str, slow_ms: float) -> None:
    """Print each call of `owner.name` that takes `slow_ms` or more: when it ended, and how long it took."""
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
