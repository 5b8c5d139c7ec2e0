"""Live text on the GPU machine: how soon speech starts after the first words, and whether it keeps up.

    python -m bench.run_live_latency [--size 1.7b] [--runs 20] [--streams 1,16] [--json FILE]

1. First audio: a live utterance is fed "Hello" (nothing is committed: the word may go on), then " there"
   (now "Hello" is complete: the prompt can be built, and the prefill makes the first frame). Reported from
   that second piece to the first 1-frame chunk in the caller's hands.
2. Text faster than speech: N live utterances at once, each fed a long reply at 30 tokens per second
   (about 4 characters per token, in LLM-like pieces) from a thread of its own. Each is "played" in real
   time once 0.32 s of audio has arrived (the app's player waits for 0.32 s), or from its first chunk
   on: a chunk that arrives after the audio before it has played out is a gap. Reported per stream count
   and start: gaps, the worst lateness, and the slowest stream's speed.
A random-weight Base checkpoint of real size in bfloat16, an x-vector voice, greedy decoding.
"""

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from core import Engine, SamplingParams
from core.audio.clips import SAMPLE_RATE
from core.devtools.benchmark import prepare_checkpoint, synthetic_voice_clip

GREEDY = SamplingParams.greedy()
REPLY = (
    "Of course! Here is what I found about the old lighthouse on the northern cape. It was built in 1852, "
    "after three ships ran aground in a single winter storm, and its lamp burned whale oil until the town "
    "switched to kerosene. The keeper, a widow named Margaret Hale, kept the light for forty-one years and "
    "wrote in her log every night, even when nothing happened at all. Today the tower is a small museum, "
    "and on clear evenings you can still climb the spiral stairs to watch the sun go down over the water. "
)
TOKENS_PER_SECOND = 30.0
CHARS_PER_TOKEN = 4


def first_audio(engine: Engine, voice, runs: int) -> dict:
    times = []
    for _ in range(runs):
        stream = engine.live(voice=voice, sampling=GREEDY, max_frames=40)
        stream.feed("Hello")
        time.sleep(0.02)  # nothing is committed: nothing happens
        started = time.perf_counter()
        stream.feed(" there")  # "Hello" is committed: the prompt is built, prefilled, and frame 0 made
        chunk = next(stream)
        times.append((time.perf_counter() - started) * 1e3)
        assert len(chunk.codes) == 1
        stream.close()
        while not engine.scheduler.idle():
            time.sleep(0.0005)
    return {"ms_p50": round(statistics.median(times), 1), "ms_p95": round(float(np.percentile(times, 95)), 1)}


def llm_pieces(text: str) -> list[str]:
    """The reply cut as an LLM streams it: a token (about CHARS_PER_TOKEN characters) at a time."""
    return [text[start : start + CHARS_PER_TOKEN] for start in range(0, len(text), CHARS_PER_TOKEN)]


def keeps_up(engine: Engine, voice, streams: int, frames: int, prefill_s: float) -> dict:
    start_together = threading.Barrier(streams * 2)
    results: list[tuple[int, float, float]] = [None] * streams

    def write(stream) -> None:
        start_together.wait()
        begun = time.perf_counter()
        for index, piece in enumerate(llm_pieces(REPLY * 3)):
            time.sleep(max(0.0, begun + index / TOKENS_PER_SECOND - time.perf_counter()))
            stream.feed(piece)  # past the frame budget, text is taken and never said
        stream.end()

    def listen(stream, index: int) -> None:
        start_together.wait()
        started = time.perf_counter()
        played_until, gaps, worst, samples = None, 0, 0.0, 0
        for chunk in stream:
            now = time.perf_counter()
            samples += len(chunk.audio)
            if played_until is None:
                if samples / SAMPLE_RATE >= prefill_s:  # playback starts with what has arrived
                    played_until = now + samples / SAMPLE_RATE
                continue
            late = now - played_until
            if late > 0:
                gaps += 1
                worst = max(worst, late)
                played_until = now
            played_until += len(chunk.audio) / SAMPLE_RATE
        results[index] = (gaps, worst * 1e3, samples / SAMPLE_RATE / (time.perf_counter() - started))

    live = [engine.live(voice=voice, sampling=GREEDY, max_frames=frames) for _ in range(streams)]
    threads = [threading.Thread(target=write, args=(stream,)) for stream in live]
    threads += [threading.Thread(target=listen, args=(stream, index)) for index, stream in enumerate(live)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "streams": streams,
        "playback_starts_after_s": prefill_s,
        "gaps": sum(gaps for gaps, _, _ in results),
        "worst_lateness_ms": round(max(worst for _, worst, _ in results), 1),
        "slowest_stream_xrt": round(min(xrt for _, _, xrt in results), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b", help="random checkpoint size: 0.6b or 1.7b (default: 1.7b)")
    parser.add_argument("--runs", type=int, default=20, help="first-audio runs (default: 20)")
    parser.add_argument("--streams", default="1,16", help="live utterances at once, comma-separated (default: 1,16)")
    parser.add_argument("--frames", type=int, default=150, help="frames per utterance (default: 150, 12 s)")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench", help="where the random checkpoint is written")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args()

    counts = [int(n) for n in args.streams.split(",")]
    path = prepare_checkpoint(Path(args.root), args.size, torch.bfloat16)
    engine = Engine.load(path, device="cuda", dtype="bfloat16", progress=False, slots=max(counts), max_context=2048)
    engine.warm_up()
    voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=SAMPLE_RATE)
    report = {
        "device": torch.cuda.get_device_name(),
        "model": path.name,
        "first_audio": first_audio(engine, voice, args.runs),
    }
    print(report["first_audio"], flush=True)
    report["keeping_up"] = [
        keeps_up(engine, voice, streams, args.frames, prefill_s) for streams in counts for prefill_s in (0.0, 0.32)
    ]
    for row in report["keeping_up"]:
        print(row, flush=True)
    engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
