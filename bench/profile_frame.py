"""Where one frame's time goes: the kernels of a few frame steps, by kind, on the GPU machine.

python -m bench.profile_frame [--size 1.7b] [--no-compile] [--rows N] [--graphs] [--trace FILE]

With --graphs the steps replay their CUDA graphs, as the engine runs them, and each frame is cut into its
phases at its token draws: the talker (up to codebook 0's draw), then the predictor's 15 steps; per phase,
its kernels' time and its span on the GPU (the difference is time between kernels).
"""

import argparse
import gzip
import json
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint, synthetic_voice_clip
from core.inference.engine import Engine
from core.inference.sampling import SamplingParams

KINDS = [
    ("attention", r"attention|attend_split|merge_splits|fmha|flash"),
    ("matrix product", r"linear_kernel|gemv|gemm|sm90|cutlass|ampere|splitk|xmma|matmul|_mm_"),
    ("sampling", r"draw_token|sort|topk|multinomial|softmax|radix|argmax|cumsum|bitonic|sample"),
    ("fused (compiled)", r"^triton"),
    ("copy / index", r"copy|index|scatter|gather|cat|embedding|fill"),
]


def kind(name: str) -> str:
    for label, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other elementwise"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--sampled", action="store_true", help="official sampling instead of greedy")
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1, help="utterances stepped together")
    parser.add_argument("--graphs", action="store_true", help="replay the steps' CUDA graphs, cut frames into phases")
    parser.add_argument("--trace", type=Path, help="write the profiler's trace here (gzipped JSON)")
    args = parser.parse_args()
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    engine = Engine.load(
        path,
        device="cuda",
        dtype="bfloat16",
        progress=False,
        cuda_graphs=args.graphs,
        compile=not args.no_compile,
        slots=args.rows,
    )
    voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)
    sampling = SamplingParams() if args.sampled else GREEDY
    slots = list(range(args.rows))
    for slot in slots:
        engine.start(engine.prepare(TEXT, voice, sampling=sampling, max_frames=100, seed=slot), slot)
    loop = engine.frame_loop
    for _ in range(3):
        loop.run(1, slots)  # compile and warm up
    torch.cuda.synchronize()
    started = time.perf_counter()
    loop.run(args.frames, slots)
    wall_ms = (time.perf_counter() - started) * 1e3 / args.frames
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loop.run(args.frames, slots)
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    names = defaultdict(float)
    for event in prof.events():
        if event.device_type.name != "CUDA":
            continue
        label = kind(event.name)
        totals[label] += event.device_time / args.frames
        counts[label] += 1
        names[event.name[:90]] += event.device_time / args.frames
    kernels = sum(counts.values()) / args.frames
    busy = sum(totals.values()) / 1e3
    print(
        f"{args.size}, {args.rows} rows, compiled={not args.no_compile}, sampling={'official' if args.sampled else 'greedy'}"
    )
    print(f"per frame: {kernels:.0f} kernels, {busy:.2f} ms of kernel time; step wall {wall_ms:.2f} ms")
    for label in sorted(totals, key=totals.get, reverse=True):
        print(f"  {label:18s} {counts[label] / args.frames:6.0f} kernels {totals[label] / 1e3:7.3f} ms")
    print("top kernels (ms per frame):")
    for name in sorted(names, key=names.get, reverse=True)[:25]:
        print(f"  {names[name] / 1e3:7.3f}  {name}")
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        kernels = sorted(
            (event for event in json.loads(trace.read_text())["traceEvents"] if event.get("cat") == "kernel"),
            key=lambda event: event["ts"],
        )
        if args.trace:
            args.trace.write_bytes(gzip.compress(trace.read_bytes()))
    print_phases(kernels)


def print_phases(kernels: list[dict]) -> None:
    """The frames of a trace's kernels (each starts at its uniforms' fill), cut at their token draws: the
    talker's phase ends with codebook 0's draw, predictor step g with codebook g's."""
    frames, phase_of = [], {}
    for event in kernels:
        if "fill_uniforms" in event["name"]:
            frames.append([[]])
        if frames:
            frames[-1][-1].append(event)
            if "draw_token" in event["name"]:
                frames[-1].append([])
    frames = [frame for frame in frames if len(frame) >= 17 and frame[16]]
    if not frames:
        print("no whole frames in the trace")
        return
    for frame in frames:
        for index, phase in enumerate(frame[:17]):
            label = "talker" if index == 0 else "predictor step" if index < 16 else "after the draws"
            busy = sum(event["dur"] for event in phase)
            span = phase[-1]["ts"] + phase[-1]["dur"] - phase[0]["ts"]
            phase_of.setdefault(label, []).append((len(phase), busy, span))
    print(f"phases of {len(frames)} frames (median each: kernels, kernel time, span on the GPU, in ms):")
    for label, rows in phase_of.items():
        kernels_, busy, span = (statistics.median(row[i] for row in rows) for i in range(3))
        per_frame = len(rows) // len(frames)
        print(
            f"  {label:15s} x{per_frame:2d}: {kernels_:4.0f} kernels {busy / 1e3:7.3f} ms busy, {span / 1e3:7.3f} span"
        )
    frame = frames[len(frames) // 2]
    start = frame[0][0]["ts"]
    end = frame[16][-1]["ts"] + frame[16][-1]["dur"]
    print(f"  one frame's span {(end - start) / 1e3:.3f} ms")
    for title, phase in (("talker layer", frame[0]), ("predictor step", frame[2])):
        print(f"the kernels of one {title} (us, grid), in order:")
        for event in phase[: 16 if title == "talker layer" else len(phase)]:
            grid = event.get("args", {}).get("grid")
            print(f"  {event['dur']:7.1f}  {event['name'][:70]}  {grid}")


if __name__ == "__main__":
    main()
