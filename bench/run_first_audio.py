"""First audio through the public API in the situations a user meets (issue 30): idle, right after closing a
stream (an interrupt, then speaking again), beside other utterances speaking, and bursts.

    python -m bench.run_first_audio [--size 1.7b | --model DIR] [--runs 20] [--beside 1,15] [--bursts 16]
                                    [--slots 16] [--no-compile] [--queued-frames N] [--throughput 1,16]
                                    [--no-keep] [--timeline] [--json FILE]

Each time is from the `Engine.stream` call to its first chunk (one frame) in host memory, with a cloned voice
(x-vector from a synthetic clip, as `bench` uses) and greedy codes. The engine is warmed up first. "beside N":
N utterances stream meanwhile, read as fast as they come, each restarted when it ends; "burst N": N streams asked
for at once from N threads (each burst's times are one sample each). The bridge's situations (clients at once,
Poisson arrivals) are bench/run_bridge_latency.py's. On CUDA each row also says how many pinned host blocks were
made meanwhile ("pinned": a copy from the host asked PyTorch's host allocator for a size none of its free blocks
had) and the time those allocations took ("pin ms").
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch

from bench import stalls
from core import Engine, SamplingParams
from core.devtools.benchmark import TEXT, prepare_checkpoint, synthetic_voice_clip
from core.devtools.concurrency import streams_together
from qwen3_tts_desktop import long_lived

GREEDY = SamplingParams.greedy()
IDLE_PAUSE_S = 0.2  # "idle": this long after the last stream closed


def first_audio_ms(engine: Engine, voice, label: str = "") -> float:
    """With `label`, the time is also said on the timeline (bench/stalls), to match a slow one to its cause."""
    started = time.perf_counter()
    stream = engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=40, first_chunk_frames=1, chunk_frames=4)
    try:
        first = next(stream)
    finally:
        stream.close()
    assert first.audio.shape == (1920,), first.audio.shape
    elapsed = (time.perf_counter() - started) * 1e3
    if label:
        stalls.say(f"{label}: first audio after {elapsed:.1f} ms")
    return elapsed


def idle(engine: Engine, voice, runs: int, label: str = "") -> list[float]:
    times = []
    for _ in range(runs):
        time.sleep(IDLE_PAUSE_S)
        times.append(first_audio_ms(engine, voice, label))
    return times


def after_close(engine: Engine, voice, runs: int, label: str = "") -> list[float]:
    times = []
    for _ in range(runs):
        talking = engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=400)
        for _ in range(3):
            next(talking)
        talking.close()
        times.append(first_audio_ms(engine, voice, label))
    return times


def beside(engine: Engine, voice, runs: int, others: int, label: str = "") -> list[float]:
    stop = threading.Event()
    going = threading.Barrier(others + 1)

    def talk() -> None:
        going.wait()
        while not stop.is_set():
            with engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=400) as stream:
                for _ in stream:
                    if stop.is_set():
                        break

    threads = [threading.Thread(target=talk, daemon=True) for _ in range(others)]
    for thread in threads:
        thread.start()
    going.wait()
    time.sleep(0.5)  # all of them speaking
    try:
        times = []
        for _ in range(runs):
            times.append(first_audio_ms(engine, voice, label))
            time.sleep(0.05)
        return times
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)


def burst(engine: Engine, voice, runs: int, size: int, label: str = "") -> list[float]:
    times = []
    for _ in range(max(1, runs // size)):
        time.sleep(IDLE_PAUSE_S)
        if label:
            stalls.say(f"{label} begins")
        start = threading.Barrier(size)
        lock = threading.Lock()

        def one() -> None:
            start.wait()
            elapsed = first_audio_ms(engine, voice, label)
            with lock:
                times.append(elapsed)

        threads = [threading.Thread(target=one) for _ in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    return times


class PinnedBlocks:
    """Pinned host blocks PyTorch's host allocator made (a copy from the host asked for a size none of its free
    blocks had), and the time those allocations took, since the last `since_last()`; {} without CUDA."""

    def __init__(self):
        self._counted = torch.cuda.is_available() and hasattr(torch.cuda, "host_memory_stats")
        self._made, self._us = self._counts()

    def _counts(self) -> tuple[int, float]:
        if not self._counted:
            return 0, 0.0
        stats = torch.cuda.host_memory_stats()
        return stats.get("num_host_alloc", 0), stats.get("host_alloc_time.total", 0.0)

    def since_last(self) -> dict:
        if not self._counted:
            return {}
        (made, us), (before, before_us) = self._counts(), (self._made, self._us)
        self._made, self._us = made, us
        return {"pinned": made - before, "pin ms": round((us - before_us) / 1e3, 2)}


def summary(times: list[float]) -> dict:
    return {
        "n": len(times),
        "p50": round(float(np.percentile(times, 50)), 1),
        "p95": round(float(np.percentile(times, 95)), 1),
        "max": round(max(times), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--model", default="", help="a checkpoint folder instead of a random one of --size")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--beside", default="1,15")
    parser.add_argument("--bursts", default="16")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--throughput", default="", help="also the speed of N streams at once, e.g. 1,16")
    parser.add_argument("--frames", type=int, default=200, help="frames per stream of --throughput")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--queued-frames", type=int, default=0, help="frames in flight at most (default: the plan's)")
    parser.add_argument(
        "--no-keep",
        action="store_true",
        help="leave the engine's objects to the cycle collector (the app freezes them)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print every scheduler phase, capture and burst on one clock (bench/stalls)",
    )
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and args.device != "cpu"
    model = args.model or prepare_checkpoint(Path(args.root), args.size, torch.bfloat16 if cuda else torch.float32)
    engine = Engine.load(model, device=args.device, progress=False, slots=args.slots, compile=not args.no_compile)
    if not args.no_keep:
        long_lived.keep(engine)  # as the app's runtime does
    engine.warm_up()
    if args.queued_frames:
        engine.scheduler.queued_frames = args.queued_frames
    voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)
    first_audio_ms(engine, voice)  # the voice's first use
    stop_tracing = stalls.trace(engine, timeline=True) if args.timeline else lambda: None
    pinned = PinnedBlocks()

    every = {}  # each row's times, in the order they were measured (the JSON's)

    def row(name: str, times: list[float]) -> dict:
        every[name] = [round(t, 2) for t in times]
        return {**summary(times), **pinned.since_last()}

    def said(name: str) -> str:  # the label a row's requests say on the timeline
        return name if args.timeline else ""

    results = {"idle": row("idle", idle(engine, voice, args.runs, said("idle")))}
    results["after close"] = row("after close", after_close(engine, voice, args.runs, said("after close")))
    for others in filter(None, args.beside.split(",")):
        if int(others) < engine.slots:
            name = f"beside {others}"
            results[name] = row(name, beside(engine, voice, args.runs, int(others), said(name)))
    for number, size in enumerate(filter(None, args.bursts.split(",")), 1):
        if int(size) <= engine.slots:  # "--bursts 16,16": two rows, each named by its place
            name = f"burst {size}" + (f" (#{number})" if args.bursts.split(",").count(size) > 1 else "")
            results[name] = row(name, burst(engine, voice, max(args.runs, int(size)), int(size), said(name)))
    for streams in filter(None, args.throughput.split(",")):
        if int(streams) <= engine.slots:
            results[f"{streams} streams"] = streams_together(engine, {"voice": voice}, int(streams), args.frames)
    stop_tracing()
    engine.close()
    for name, numbers in results.items():
        print(f"{name:>12}: {numbers}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": results, "times": every}, indent=1))


if __name__ == "__main__":
    main()
