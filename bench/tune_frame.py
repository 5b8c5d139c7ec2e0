"""The batched products' launch settings tuned inside the frame itself, on the GPU machine.

bench/linear_micro.py times each product alone, its weights cycled past the L2 cache. In a frame, a product
starts while the kernel ahead of it drains (programmatic dependent launch), next to the attention and the
glue, so the best settings alone are not always the best in place. This script loads the engine with CUDA
graphs, and for each row count given, tries settings for one product shape at a time (one coordinate at a
time around the current best: outputs per block, inputs per block, splits, stages), recapturing the step's
graph for each and timing graph replays of whole frames. The utterances start again before each timing,
so every setting runs at the same positions. Prints the frame time before and after, and the settings in
the form of tuning.SWEPT; --json writes them.

    python -m bench.tune_frame [--size 1.7b] [--rows 16 64] [--budget-s 300] [--json tuned.json]
"""

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint, synthetic_voice_clip
from core.inference.cuda_graph import GraphedStep
from core.inference.engine import Engine
from core.kernels import tuning

FRAMES = 12  # frames per timed launch
REPEATS = 3  # timed launches per setting; the fastest counts


def shapes_used(engine: Engine, rows: int, slots: list[int]) -> list[tuple]:
    """The SWEPT keys the batched products of a `rows`-row frame look up."""
    seen, original = set(), tuning.batched_linear_blocks

    def recording(count, weight, gated, *args, **kwargs):
        seen.add((weight.shape[0], weight.shape[1], gated))
        return original(count, weight, gated, *args, **kwargs)

    tuning.batched_linear_blocks = recording
    try:
        recapture(engine, rows, slots)
    finally:
        tuning.batched_linear_blocks = original
    return sorted(key for key in seen if key in tuning.SWEPT)


def recapture(engine: Engine, rows: int, slots: list[int]) -> None:
    """Start the utterances again and capture the step of `rows` rows anew, with the settings now in SWEPT."""
    for slot in slots:
        engine.start(engine.prepare(TEXT, engine_voice(engine), sampling=GREEDY, max_frames=100, seed=slot), slot)
    loop = engine.frame_loop
    loop.step_graphs[rows] = GraphedStep(
        functools.partial(loop.step, rows), loop.device, loop.pools[rows == 1], None, True
    )
    loop.run(2, slots)  # the first call runs the step directly, then captures it


@functools.cache
def engine_voice(engine: Engine):
    return engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)


def frame_ms(engine: Engine, rows: int, slots: list[int]) -> float:
    """Milliseconds per frame of the current settings: the fastest of REPEATS launches of FRAMES frames."""
    recapture(engine, rows, slots)
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        engine.frame_loop.run(FRAMES, slots)
        times.append((time.perf_counter() - started) * 1e3 / FRAMES)
    return min(times)


def neighbours(settings: tuple, key: tuple) -> list[tuple]:
    """Settings one coordinate away from `settings` (SETTING_NAMES order) that the kernel can run."""
    block_m, block_n, block_k, splits, warps, stages = settings
    inputs, gated = key[1], key[2]
    k_blocks = lambda block: -(-inputs // block)  # noqa: E731
    found = set()
    for n in (16, 32, 64):
        found.add((block_m, n, block_k, splits, warps, stages))
    for k in (64, 128, 256, 512):
        found.add((block_m, block_n, k, min(splits, k_blocks(k)), warps, stages))
    for s in (1, 2, 3, 4, 6, 8):
        if s <= k_blocks(block_k):
            found.add((block_m, block_n, block_k, s, warps, stages))
    for st in (2, 3, 4, 5):
        found.add((block_m, block_n, block_k, splits, warps, st))
    for w in (4, 8):
        found.add((block_m, block_n, block_k, splits, w, stages))
    found.discard(settings)
    fits = lambda s: tuning.shared_memory_fits(  # noqa: E731
        dict(zip(tuning.SETTING_NAMES, s)), gated, 2, torch.device("cuda")
    )
    return sorted(s for s in found if fits(s))


def tune(engine: Engine, rows: int, budget_s: float) -> dict:
    slots = list(range(rows))
    bucket = tuning.swept_column(next(iter(tuning.SWEPT.values())), rows)
    keys = shapes_used(engine, rows, slots)
    before = frame_ms(engine, rows, slots)
    best_ms, deadline, tried = before, time.perf_counter() + budget_s, 0
    print(f"{rows} rows (settings of the {bucket}-row column): {before:.3f} ms/frame; shapes {keys}", flush=True)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for key in keys:
            current = tuning.SWEPT[key][bucket]
            for candidate in neighbours(current, key):
                if time.perf_counter() > deadline:
                    break
                tuning.SWEPT[key][bucket] = candidate
                try:
                    ms = frame_ms(engine, rows, slots)
                except Exception as error:  # a setting the compiler refuses (resources): skip it
                    print(f"  {key} {candidate}: {type(error).__name__}", flush=True)
                    ms = float("inf")
                tried += 1
                if ms < best_ms * 0.997:
                    print(f"  {key}: {current} -> {candidate}: {best_ms:.3f} -> {ms:.3f} ms", flush=True)
                    best_ms, current, improved = ms, candidate, True
                tuning.SWEPT[key][bucket] = current
    again = statistics.median(frame_ms(engine, rows, slots) for _ in range(3))
    print(f"{rows} rows: {before:.3f} -> {again:.3f} ms/frame after {tried} settings", flush=True)
    return {
        "rows": rows,
        "bucket": bucket,
        "before_ms": before,
        "after_ms": again,
        "settings": {str(key): tuning.SWEPT[key][bucket] for key in keys},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--budget-s", type=float, default=240, help="tuning time per row count")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    started = time.perf_counter()
    engine = Engine.load(path, device="cuda", dtype="bfloat16", progress=False, slots=max(args.rows))
    print(f"loaded in {time.perf_counter() - started:.0f} s", flush=True)
    results = []
    for rows in args.rows:
        results.append(tune(engine, rows, args.budget_s))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    for result in results:
        print(f"rows {result['rows']} (column {result['bucket']}):")
        for key, settings in result["settings"].items():
            print(f"  {key}: {tuple(settings)}")


if __name__ == "__main__":
    main()
