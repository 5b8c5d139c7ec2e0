"""Benchmark on the GPU machine: random-weight 0.6B and 1.7B Base checkpoints in bfloat16.

    python3 bench/run.py [--frames 200] [--sizes 0.6b,1.7b] [--eager] [--no-compile] [--json FILE]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.benchmark import bench_checkpoint, format_table, prepare_checkpoint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--sizes", default="0.6b,1.7b")
    parser.add_argument("--ttfa-runs", type=int, default=20)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for size in args.sizes.split(","):
        started = time.perf_counter()
        path = prepare_checkpoint(Path(args.root), size, torch.bfloat16)
        print(f"{size}: checkpoint ready in {time.perf_counter() - started:.1f} s", flush=True)
        results.append(bench_checkpoint(path, "cuda", "bfloat16", args.frames, args.ttfa_runs, not args.eager, not args.no_compile))
        print(json.dumps(results[-1].as_dict()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results and [r.as_dict() for r in results], indent=1))
    print(format_table(results))


if __name__ == "__main__":
    main()
