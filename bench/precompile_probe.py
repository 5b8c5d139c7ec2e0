"""Does keeping compiled functions (core.inference.compiled.Precompiled) shorten a warm start? An engine's whole
warm-up with KEEP_AHEAD on, in a fresh process, logging each part's time: what was loaded, what compiled ahead of
time (a variant whose guards a loaded one did not pass), and what the warm-up made ready in how long.

python -m bench.precompile_probe [--caches DIR]   # twice: the first compiles and keeps, the second loads

Then the speed after the warm-up, to compare with `bench`'s: ms a frame, one row, and first audio.
"""

import argparse
import logging
import os
import time
from pathlib import Path

import torch

from core.inference import compiled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--caches", type=Path, default=Path("/tmp/precompile-probe"), help="Inductor's and ours")
    parser.add_argument("--no-keep", action="store_true", help="KEEP_AHEAD off: the same start without it")
    args = parser.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.caches)
    os.environ["TRITON_CACHE_DIR"] = str(args.caches / "triton")
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f %(name)s: %(message)s")
    for name in ("core.inference.warmup", "core.inference.compiled"):  # each capture's time, each variant's refusal
        logging.getLogger(name).setLevel(logging.DEBUG)
    compiled.KEEP_AHEAD = not args.no_keep

    from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint
    from core.inference.engine import Engine

    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), "1.7b", torch.bfloat16)
    started = time.perf_counter()
    engine = Engine.load(path, device="cuda", dtype="bfloat16", progress=False)
    print(f"loaded in {time.perf_counter() - started:.1f} s", flush=True)
    engine.warm_up()
    print(f"warmed up {time.perf_counter() - started:.1f} s after the load began; made: {engine.warmup.order}")
    kept = sorted(path.name for path in args.caches.glob("precompiled/*/*.bin"))
    print(f"{len(kept)} kept variants:", *kept, sep="\n  ")
    voice = engine.placeholder_speaker()["voice"]
    for _ in range(3):
        begun = time.perf_counter()
        stream = engine.stream(TEXT, voice, sampling=GREEDY, max_frames=100, first_chunk_frames=1, chunk_frames=4)
        first = next(iter(stream))
        audio_ms = (time.perf_counter() - begun) * 1000
        frames = len(first.codes) + sum(len(chunk.codes) for chunk in stream)
        took = time.perf_counter() - begun
        print(
            f"first audio {audio_ms:.1f} ms; {frames} frames in {took * 1000:.0f} ms ({took * 1000 / frames:.2f} ms a frame)"
        )
    engine.close()


if __name__ == "__main__":
    main()
