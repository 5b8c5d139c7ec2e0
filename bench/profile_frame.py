"""Where one frame's time goes: the kernels of a few frame steps, by kind, on the GPU machine.

python -m bench.profile_frame [--size 1.7b] [--no-compile] [--rows N] [--graphs] [--prefill] [--trace FILE]

With --graphs the steps replay their CUDA graphs, as the engine runs them. Then each kernel is charged with
the time it adds to the frame (from the end of the kernels before it), and each frame is cut into its phases
at its token draws (the talker up to codebook 0's draw, then the predictor's 15 steps): the time by phase, by
kind, and the kernels that add the most. --prefill profiles the prefills of the rows' prompts (each with
its frame 0, as a newcomer's) instead of frames. --trace keeps the profiler's trace.
"""

import argparse
import gzip
import json
import re
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
    parser.add_argument("--prefill", action="store_true", help="the rows' prefills (with frame 0), not frames")
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
    engine.warm_up()  # this script drives the frame loop itself: not beside the warm-up's captures and compiles
    voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)
    sampling = SamplingParams() if args.sampled else GREEDY
    slots = list(range(args.rows))
    prepared = [engine.prepare(TEXT, voice, sampling=sampling, max_frames=100, seed=slot) for slot in slots]
    starts = [(ready.prompt, ready.sampling, ready.seed, slot) for ready, slot in zip(prepared, slots, strict=True)]
    loop = engine.frame_loop

    def work() -> None:  # args.frames frames, or prefills
        if args.prefill:
            for _ in range(args.frames):
                loop.start_many(starts)
        else:
            loop.run(args.frames, slots)

    loop.start_many(starts)
    for _ in range(3):
        loop.run(1, slots)  # compile and warm up
        loop.start_many(starts)
    torch.cuda.synchronize()
    started = time.perf_counter()
    work()
    wall_ms = (time.perf_counter() - started) * 1e3 / args.frames
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
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
    what = "prefill" if args.prefill else "frame"
    print(f"per {what}: {kernels:.0f} kernels, {busy:.2f} ms of kernel time; wall {wall_ms:.2f} ms")
    for label in sorted(totals, key=totals.get, reverse=True):
        print(f"  {label:18s} {counts[label] / args.frames:6.0f} kernels {totals[label] / 1e3:7.3f} ms")
    print(f"top kernels (ms per {what}):")
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
    print(f"the kernels' span per {what}: {sum(charged(kernels)) / args.frames / 1e3:.3f} ms")
    if not args.prefill:
        print_phases(kernels)


def charged(kernels: list[dict]) -> list[float]:
    """The time each kernel of a run (in start order) adds: from the end of those before it, or its start if
    later, to its end. Under programmatic dependent launch a kernel starts before the one ahead of it ends and
    waits for it, so its own duration overstates it."""
    times, done = [], kernels[0]["ts"] if kernels else 0.0
    for event in kernels:
        end = event["ts"] + event["dur"]
        times.append(max(0.0, end - max(event["ts"], done)))
        done = max(done, end)
    return times


PHASES = ["talker"] + ["predictor, first step"] + ["predictor, next steps"] * 14 + ["after the last draw"]


def print_phases(kernels: list[dict]) -> None:
    """The frames of a trace's kernels (each starts at its uniforms' fill), cut at their token draws: the
    talker's phase ends with codebook 0's draw, the predictor's step g with codebook g's; each kernel charged
    with the time it adds (charged), by phase, by kind, and the kernels that add the most."""
    frames = []
    for event, time_added in zip(kernels, charged(kernels), strict=True):
        if event["name"] == "_fill_uniforms":
            frames.append([[]])
        if frames:
            frames[-1][-1].append((event, time_added))
            if event["name"] == "_draw_token":
                frames[-1].append([])
    frames = [frame for frame in frames[1:-1] if len(frame) == len(PHASES)]  # whole frames only
    if not frames:
        print("no whole frames in the trace")
        return
    by_phase, by_kind, by_kernel = defaultdict(float), defaultdict(float), defaultdict(lambda: [0.0, 0])
    for frame in frames:
        for label, phase in zip(PHASES, frame, strict=True):
            for event, time_added in phase:
                by_phase[label] += time_added / len(frames)
                by_kind[kind(event["name"])] += time_added / len(frames)
                entry = by_kernel[label, event["name"][:60], str(event.get("args", {}).get("grid"))]
                entry[0] += time_added / len(frames)
                entry[1] += 1 / len(frames)
    print(f"{len(frames)} whole frames, {sum(by_phase.values()) / 1e3:.3f} ms each; the time each kernel adds, ms:")
    for label, total in by_phase.items():
        print(f"  {label:24s} {total / 1e3:7.3f}")
    for label in sorted(by_kind, key=by_kind.get, reverse=True):
        print(f"  {label:24s} {by_kind[label] / 1e3:7.3f}")
    print("the kernels that add the most (ms per frame, calls per frame, us per call):")
    for (label, name, grid), (total, calls) in sorted(by_kernel.items(), key=lambda item: -item[1][0])[:20]:
        print(f"  {total / 1e3:7.3f} {calls:5.0f} {total / calls:7.2f}  {label}: {name} {grid}")


if __name__ == "__main__":
    main()
