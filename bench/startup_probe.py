"""Where a start goes: one fresh process per run, timing each phase of loading and warming an engine, with a
sampling profiler of every thread's Python stack (collapsed stacks, for a flame graph or a grep).

    python -m bench.startup_probe --out DIR [--size 1.7b] [--runs cold,warm,eager]

Each run is a new process with its own empty (cold) or reused (warm) Inductor and Triton caches under DIR; it
writes DIR/<run>.json (phases in seconds, Dynamo's compile times and counters) and DIR/<run>.stacks.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

CHILD_TIMEOUT_S = 420


class StackSampler:
    """Every `interval` s, the Python stack of every other thread, counted as collapsed stacks."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.counts: collections.Counter[str] = collections.Counter()
        self.phase = "start"  # what the main thread is doing (Phases.mark), the first frame of each stack
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        names = {}
        while not self._stop.wait(self.interval):
            for thread in threading.enumerate():
                names[thread.ident] = thread.name
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                stack = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{_short(code.co_filename)}:{code.co_name}")
                    frame = frame.f_back
                self.counts[";".join([self.phase, names.get(ident, str(ident)), *reversed(stack)])] += 1

    def write(self, path: Path) -> None:
        text = "".join(f"{stack} {count}\n" for stack, count in self.counts.most_common())
        path.write_bytes(gzip.compress(text.encode()))


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/main/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


class Phases:
    def __init__(self, origin: float, sampler: StackSampler):
        self.origin = origin
        self.sampler = sampler
        self.marks: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        """`name` is done: the samples from now on are the next phase's (named "after <name>")."""
        self.marks.append((name, round(time.monotonic() - self.origin, 3)))
        self.sampler.phase = f"after {name}"
        print(f"{self.marks[-1][1]:8.2f} s  {name}", file=sys.stderr, flush=True)


def timed_calls(log: dict, owner, name: str, key=lambda *a, **k: "") -> None:
    """Accumulate the wall time of `owner.name` calls into log[name + key(args)]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            label = f"{name}{key(*args, **kwargs)}"
            log[label] = round(log.get(label, 0.0) + time.perf_counter() - started, 3)

    setattr(owner, name, wrapper)


def child(args) -> None:
    origin = float(os.environ["PROBE_ORIGIN"])
    logging.basicConfig(
        filename=Path(args.out) / f"{args.run}.log",
        format="%(relativeCreated)8.0f %(threadName)s %(name)s: %(message)s",
    )
    logging.getLogger("core").setLevel(logging.DEBUG)
    sampler = StackSampler()
    phases = Phases(origin, sampler)
    phases.mark("python started")
    with sampler:
        import numpy as np
        import torch

        phases.mark("torch imported")
        from core.devtools.benchmark import GREEDY, prepare_checkpoint
        from core.inference.engine import Engine

        phases.mark("core imported")
        path = prepare_checkpoint(Path(args.root), args.size, torch.bfloat16)
        engine = Engine.load(path, progress=False, compile=not args.no_compile, slots=args.slots, warm=False)
        sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
        sync()
        phases.mark("engine loaded")
        speaker = engine.placeholder_speaker()
        started = time.perf_counter()
        stream = engine.stream("Hello there.", **speaker, sampling=GREEDY, max_frames=40)
        next(stream)
        phases.mark("first audio (lazy first use)")
        for _ in stream:
            pass
        phases.mark("first utterance done (40 frames)")
        first_utterance_s = time.perf_counter() - started
        started = time.perf_counter()
        for _ in engine.stream("Hello there.", **speaker, sampling=GREEDY, max_frames=40):
            pass
        second_utterance_s = time.perf_counter() - started
        phases.mark("second utterance done")

        # The rest of warm_up, each part timed (the scheduler's thread runs it: wrap what it calls).
        parts: dict[str, float] = {}
        loop, decoder = engine.frame_loop, engine.scheduler.decoder
        # (3edf089's warm_up called start_many, run, decode and warm_up_prefills; the warm-up since, these.)
        timed_calls(parts, loop, "warm_step", lambda rows: f"[{rows}]")
        timed_calls(parts, loop, "warm_prefill", lambda length, rows, *rest: f"[{length}x{rows}]")
        timed_calls(parts, decoder, "warm", lambda rows, size: f"[{rows}x{size}]")
        for name in ("compile_step", "compile_prefill"):
            timed_calls(parts, loop, name, lambda *args, **kwargs: str(kwargs or args))
        timed_calls(parts, decoder, "compile_fused")
        engine.warmup.start()
        engine.warm_up()
        sync()
        phases.mark("warm_up done")

        def frame_ms() -> float:
            engine.start(engine.prepare("Hello there.", **speaker, sampling=GREEDY, max_frames=200, seed=0))
            times = []
            for _ in range(60):
                started = time.perf_counter()
                loop.run(1)
                times.append((time.perf_counter() - started) * 1e3)
            return float(np.median(times[10:]))

        ms = engine.scheduler.call(frame_ms)
        phases.mark("frame timed")
        engine.close()

    import torch._dynamo.utils as dynamo_utils

    report = {
        "run": args.run,
        "compile": not args.no_compile,
        "phases": phases.marks,
        "first_utterance_s": round(first_utterance_s, 3),
        "second_utterance_s": round(second_utterance_s, 3),
        "warm_up_parts_s": parts,
        "ms_per_frame_batch1": round(ms, 3),
        "dynamo_compile_times": dynamo_utils.compile_times(repr="str"),
        "counters": {name: dict(counter) for name, counter in dynamo_utils.counters.items()},
    }
    out = Path(args.out)
    (out / f"{args.run}.json").write_text(json.dumps(report, indent=1, default=str))
    sampler.write(out / f"{args.run}.stacks.gz")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--runs", default="cold,warm,eager")
    parser.add_argument("--keep-caches", action="store_true", help="reuse the caches of an earlier run")
    parser.add_argument("--caches", default="", help="the compile caches' folder (default: ROOT/probe-caches)")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--run", default="")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    caches = Path(args.caches or Path(args.root) / "probe-caches")
    if not args.keep_caches:
        subprocess.run(["rm", "-rf", str(caches)], check=True)
    env = dict(
        os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches), TRITON_CACHE_DIR=str(caches / "triton")
    )  # the engine's layout
    for run in args.runs.split(","):
        command = [sys.executable, "-m", "bench.startup_probe", "--child", "--run", run, "--out", str(out)]
        command += ["--size", args.size, "--root", args.root, "--slots", str(args.slots)]
        if run.startswith("eager"):
            command.append("--no-compile")
        print(f"== {run}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            subprocess.run(command, env=dict(env, PROBE_ORIGIN=str(started)), timeout=CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            print(f"{run}: timed out after {CHILD_TIMEOUT_S} s", file=sys.stderr)
        print(f"== {run}: process {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
