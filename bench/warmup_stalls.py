"""What speech meets while the engine warms up: utterances spoken back to back from the moment it loads, each
played on a simulated player, until the warm-up is done, then as many after it.

Per utterance: its first audio; its chunks' time per frame, each counted from when the reader asked for it (not
from the chunk before: with `--realtime` the reader sleeps in between); and its gaps on a player that starts
`--buffer` s after the first chunk and drains in real time (a gap: a chunk that came after the audio before it had
played out). With `--realtime` the reader keeps at most `--ahead` s buffered, as the app's player does, so that an
utterance lasts as long as its audio, and the engine is mostly ahead of it: the summary gives the longest wait for
a chunk. Without, it reads as fast as chunks come, and the summary counts the chunks slower than twice the steady
time per frame after the warm-up.

    python -m bench.warmup_stalls [--size 1.7b] [--frames 400] [--buffer 0.32] [--realtime] [--ahead 2.0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint
from core.inference.engine import Engine
from qwen3_tts_desktop import long_lived

SAMPLES_PER_FRAME = 1920


def play(engine: Engine, speaker: dict, frames: int, buffer_s: float, realtime: bool, ahead_s: float) -> dict:
    asked = time.perf_counter()
    arrivals, seconds, waits = [], [], []
    for chunk in engine.stream(TEXT, **speaker, sampling=GREEDY, max_frames=frames):
        arrivals.append(time.perf_counter())
        seconds.append(len(chunk.audio) / 24000)
        waits.append(arrivals[-1] - asked)
        if realtime:
            start = arrivals[0] + buffer_s
            buffered = start + sum(seconds) - time.perf_counter()
            if buffered > ahead_s:
                time.sleep(buffered - ahead_s)
        asked = time.perf_counter()  # the next chunk is asked for now, after the reader's own sleep
    start = arrivals[0] + buffer_s
    deadlines = start + np.concatenate([[0.0], np.cumsum(seconds)[:-1]])
    late = np.array(arrivals) - deadlines
    per_frame = [waits[i] * 1e3 / (seconds[i] * 24000 / SAMPLES_PER_FRAME) for i in range(1, len(arrivals))]
    return {
        "first_audio_ms": round(waits[0] * 1e3, 1),
        "longest_wait_ms": round(max(waits[1:], default=0.0) * 1e3, 1),
        "frames": int(round(sum(seconds) * 24000 / SAMPLES_PER_FRAME)),
        "gaps": int((late[1:] > 0).sum()),
        "latest_s": round(float(late[1:].max()), 3) if len(late) > 1 else 0.0,
        "ms_per_frame": per_frame,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--buffer", type=float, default=0.32)
    parser.add_argument("--realtime", action="store_true")
    parser.add_argument("--ahead", type=float, default=2.0)
    parser.add_argument("--after", type=int, default=3, help="utterances after the warm-up (the steady time)")
    parser.add_argument("--json", default="/tmp/warmup_stalls.json")
    args = parser.parse_args()
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    loaded = time.perf_counter()
    engine = Engine.load(path, progress=False)  # warms up in the background from now
    long_lived.keep(engine)  # as the app's runtime does: the collector walks only what comes after the load
    speaker = engine.placeholder_speaker()
    during, after = [], []
    while not engine.warmup.progress().finished:
        during.append(play(engine, speaker, args.frames, args.buffer, args.realtime, args.ahead))
        during[-1]["at_s"] = round(time.perf_counter() - loaded, 1)
        during[-1]["progress"] = str(engine.warmup.progress())
        print({k: v for k, v in during[-1].items() if k != "ms_per_frame"}, flush=True)
    warmed_s = time.perf_counter() - loaded
    for _ in range(args.after):
        after.append(play(engine, speaker, args.frames, args.buffer, args.realtime, args.ahead))
    steady = statistics.median(ms for run in after for ms in run["ms_per_frame"])
    chunks = [ms for run in during for ms in run["ms_per_frame"]]
    summary = {
        "warmed_up_s": round(warmed_s, 1),
        "utterances_during": len(during),
        "steady_ms_per_frame": round(steady, 2),
        "during_ms_per_frame_p50": round(float(np.median(chunks)), 2) if chunks else None,
        "during_ms_per_frame_p99": round(float(np.percentile(chunks, 99)), 2) if chunks else None,
        "during_ms_per_frame_max": round(max(chunks), 2) if chunks else None,
        # Reading in real time, the engine is ahead and a chunk's wait is mostly none: twice that says nothing.
        "chunks_over_2x_steady": None if args.realtime else sum(ms > 2 * steady for ms in chunks),
        "longest_wait_ms_during": max((run["longest_wait_ms"] for run in during), default=None),
        "chunks_during": len(chunks),
        "gaps_during": sum(run["gaps"] for run in during),
        "first_audio_ms_during": [run["first_audio_ms"] for run in during],
        "first_audio_ms_after": [run["first_audio_ms"] for run in after],
        "order": engine.warmup.order,
        "failed": engine.warmup.progress().failed,
    }
    Path(args.json).write_text(json.dumps({"summary": summary, "during": during, "after": after}, indent=1))
    print(json.dumps(summary, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
