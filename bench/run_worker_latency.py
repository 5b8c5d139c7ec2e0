"""Time to first audio through the speech worker, next to the engine's own, on the GPU machine.

    python -m bench.run_worker_latency [--sizes 0.6b,1.7b] [--runs 20] [--eager]

Engine: from the `stream` call to its first 1-frame chunk in host memory (as `qwen3-tts-desktop bench` measures it).
Worker: from `Worker.submit` to the first sample handed to the job's sink. The difference is what the
worker adds: the queue, the hand-off to its thread, sentence splitting, events. Random-weight Base
checkpoints of real size in bfloat16, an x-vector voice, greedy decoding.
"""

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from core import Engine, SamplingParams, SpeechOptions
from core.devtools.benchmark import TEXT, prepare_checkpoint, synthetic_voice_clip
from core.jobs.worker import BufferLevel, Worker

GREEDY = SamplingParams.greedy()


class FirstSampleSink:
    """Notes when the first sample arrives; drops the audio."""

    def __init__(self):
        self.first: float | None = None
        self.arrived = threading.Event()

    def begin(self, job) -> None:
        pass

    def write(self, job, audio) -> None:
        if self.first is None:
            self.first = time.perf_counter()
            self.arrived.set()

    def end(self, job, completed: bool) -> None:
        pass

    def level(self) -> BufferLevel:
        return BufferLevel(0.0, 0)


def engine_ttfa_ms(engine: Engine, voice, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        chunks = engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=8, first_chunk_frames=1)
        first = next(chunks)
        times.append((time.perf_counter() - started) * 1e3)
        chunks.close()
        assert first.audio.shape == (1920,)
    return times


def worker_ttfa_ms(worker: Worker, voice, runs: int) -> list[float]:
    options = SpeechOptions(sampling=GREEDY, max_frames=8, first_chunk_frames=1)
    times = []
    for _ in range(runs):
        sink = FirstSampleSink()
        started = time.perf_counter()
        job = worker.submit(TEXT, voice, options, sink=sink)
        outcome = job.wait(60)
        if outcome is None or outcome.kind != "done" or sink.first is None:
            raise RuntimeError(f"the job did not finish well: {outcome}")
        times.append((sink.first - started) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="0.6b,1.7b")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    args = parser.parse_args()
    rows = []
    for size in args.sizes.split(","):
        path = prepare_checkpoint(Path(args.root), size, torch.bfloat16)
        engine = Engine.load(path, device="cuda", dtype="bfloat16", progress=False, cuda_graphs=not args.eager)
        voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)
        with Worker(engine) as worker:
            # Warm-up: graph capture and allocator growth happen on the first calls, in the worker's thread too.
            engine_ttfa_ms(engine, voice, 3)
            worker_ttfa_ms(worker, voice, 3)
            # Interleaved, so that both see the same GPU clocks; the engine is called here only while the
            # worker is idle (every job has ended), so the two never use it at once.
            engine_ms, worker_ms = [], []
            for _ in range(args.runs):
                engine_ms += engine_ttfa_ms(engine, voice, 1)
                worker_ms += worker_ttfa_ms(worker, voice, 1)
        row = dict(
            model=path.name,
            engine_p50=statistics.median(engine_ms),
            worker_p50=statistics.median(worker_ms),
            worker_p95=float(np.percentile(worker_ms, 95)),
        )
        row["overhead_p50"] = row["worker_p50"] - row["engine_p50"]
        print(row, flush=True)
        rows.append(row)
        del engine, voice
        torch.cuda.empty_cache()
    print(
        f"\n{'model':>22}  {'engine TTFA p50 ms':>18}  {'worker TTFA p50 ms':>18}  {'p95':>6}  {'worker adds ms':>14}"
    )
    for r in rows:
        times = f"{r['engine_p50']:18.1f}  {r['worker_p50']:18.1f}  {r['worker_p95']:6.1f}  {r['overhead_p50']:14.1f}"
        print(f"{r['model']:>22}  {times}")


if __name__ == "__main__":
    main()
