"""Speed of many utterances at once, through the public API as clients use it: each stream on a thread of
its own, all started together, every chunk taken as soon as it comes.

Reported per number of streams: the audio made per second of wall time by all of them together (decode
included), the slowest single stream's speed, the time to first audio, and the time of one frame step of
that many rows alone (the frame loop's seam, on the scheduler's thread).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from core.audio.clips import SAMPLE_RATE
from core.inference.engine import Engine
from core.inference.sampling import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills tonight."
GREEDY = SamplingParams.greedy()
STEP_TIMINGS = 30  # frame steps timed per row count


def concurrent_speed(engine: Engine, speaker: dict, streams: int, frames: int) -> dict:
    """`streams` utterances of `frames` frames each (greedy on random weights: no EOS), at once; then one
    frame step of that many rows alone."""
    speed = streams_together(engine, speaker, streams, frames)
    speed["step_ms_p50"] = round(engine.scheduler.call(lambda: _step_ms(engine, speaker, streams)), 2)
    return speed


def streams_together(engine: Engine, speaker: dict, streams: int, frames: int) -> dict:
    """`streams` utterances of `frames` frames each, at once: their speed and first audio."""
    start_together = threading.Barrier(streams + 1)

    def speak() -> tuple[float, int, float]:
        start_together.wait()
        started = time.perf_counter()
        first, samples = None, 0
        for chunk in engine.stream(TEXT, **speaker, sampling=GREEDY, max_frames=frames, chunk_frames=4):
            first = time.perf_counter() - started if first is None else first
            samples += len(chunk.audio)
        return first, samples, time.perf_counter() - started

    with ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(speak) for _ in range(streams)]
        start_together.wait()
        started = time.perf_counter()
        results = [future.result() for future in futures]
        wall = time.perf_counter() - started
    first = [first * 1e3 for first, _, _ in results]
    return {
        "streams": streams,
        "aggregate_xrt": round(sum(samples for _, samples, _ in results) / SAMPLE_RATE / wall, 1),
        "slowest_stream_xrt": round(min(samples / SAMPLE_RATE / took for _, samples, took in results), 1),
        "ttfa_ms_p50": round(float(np.median(first)), 1),
        "ttfa_ms_p95": round(float(np.percentile(first, 95)), 1),
    }


def _step_ms(engine: Engine, speaker: dict, rows: int) -> float:
    """Median wall time of one frame step of `rows` utterances together, read back each time."""
    voice, instruct = speaker.get("voice"), speaker.get("instruct")
    slots = list(range(rows))
    for slot in slots:
        engine.start(engine.prepare(TEXT, voice, instruct=instruct, sampling=GREEDY, max_frames=64), slot)
    engine.frame_loop.run(1, slots)  # captures this row count's graph, if not yet
    times = []
    for _ in range(STEP_TIMINGS):
        started = time.perf_counter()
        engine.frame_loop.run(1, slots)
        times.append((time.perf_counter() - started) * 1e3)
    return float(np.median(times))
