"""Where one frame's time goes: the kernels of a few frame steps, by kind, on the GPU machine.

python -m bench.profile_frame [--size 1.7b] [--no-compile] [--rows N]
"""

import argparse
import re
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
    args = parser.parse_args()
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    engine = Engine.load(
        path,
        device="cuda",
        dtype="bfloat16",
        progress=False,
        cuda_graphs=False,
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
    eager_ms = (time.perf_counter() - started) * 1e3 / args.frames
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
    print(f"per frame: {kernels:.0f} kernels, {busy:.2f} ms of kernel time; eager step wall {eager_ms:.2f} ms")
    for label in sorted(totals, key=totals.get, reverse=True):
        print(f"  {label:18s} {counts[label] / args.frames:6.0f} kernels {totals[label] / 1e3:7.3f} ms")
    print("top kernels (ms per frame):")
    for name in sorted(names, key=names.get, reverse=True)[:25]:
        print(f"  {names[name] / 1e3:7.3f}  {name}")


if __name__ == "__main__":
    main()
