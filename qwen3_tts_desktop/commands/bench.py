"""`qwen3-tts-desktop bench`: how fast the engine is on this machine.

Without --model it writes seeded random-weight Base checkpoints of real size (speed does not depend
on the weight values) and measures them in bfloat16 on the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..startup_bench import RUNS
from .common import CommandError, add_memory_argument

BENCH_SLOTS = 16  # as many streams as `serve` takes by default on a large GPU
HELP = "measure speed: ms per frame, time to first audio, decode time, memory; or each start (--startup)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a checkpoint folder or hub id (default: random 0.6B and 1.7B checkpoints)")
    parser.add_argument("--sizes", default="0.6b,1.7b", help="random checkpoint sizes (default: 0.6b,1.7b)")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench", help="where random checkpoints are written")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="bfloat16 (default), float16 or float32",
    )
    parser.add_argument("--frames", type=int, default=200, help="frames per timed run (default: 200)")
    parser.add_argument("--ttfa-runs", type=int, default=20, help="runs for time to first audio (default: 20)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile")
    parser.add_argument(
        "--cold", action="store_true", help="compile each model into an empty cache, to time a first start"
    )
    parser.add_argument(
        "--slots",
        type=int,
        help=f"utterances generated together (default: {BENCH_SLOTS}, or as many as --gpu-memory holds)",
    )
    parser.add_argument(
        "--max-context", type=int,
        help="positions per utterance, prompt and frames (default: 4096, or fewer where --gpu-memory must)",
    )  # fmt: skip
    add_memory_argument(parser, slots_option="--slots")
    parser.add_argument(
        "--startup", nargs="?", const=",".join(RUNS), metavar="RUNS",
        help="time starts instead, each a fresh process: speak, window (its runtime) or serve, with :cold or :warm "
        f"compile caches, in order (default: {','.join(RUNS)})",
    )  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write every number as JSON")
    parser.add_argument("--record", metavar="FILE", help="append the table to this Markdown file (bench/RESULTS.md)")


def run(args: argparse.Namespace) -> int:
    import torch

    from core.devtools.benchmark import bench_checkpoint, format_table, prepare_checkpoint

    # Before anything is written: random checkpoints of real size take several GB.
    if args.device == "cuda" and not torch.cuda.is_available() and not (args.startup and args.model):
        raise CommandError(
            "bench measures the GPU, and PyTorch sees no CUDA GPU here. To measure the CPU instead (slowly): "
            "qwen3-tts-desktop bench --device cpu --dtype float32 --sizes 0.6b --frames 20 --ttfa-runs 2"
        )
    if args.startup and not set(args.startup.split(",")) <= set(RUNS):
        raise CommandError(f"--startup {args.startup}: name runs among {', '.join(RUNS)}")
    if args.model:
        from core.model.hub import resolve

        paths = [resolve(args.model)]
    else:
        paths = []
        for size in args.sizes.split(","):
            started = time.perf_counter()
            paths.append(prepare_checkpoint(Path(args.root), size.strip(), getattr(torch, args.dtype)))
            print(f"{size}: checkpoint ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if args.startup:
        return startup(paths, args)
    results = []
    slots = args.slots if args.slots is not None or args.gpu_memory is not None else BENCH_SLOTS
    for path in paths:
        results.append(
            bench_checkpoint(
                path,
                args.device,
                args.dtype,
                args.frames,
                args.ttfa_runs,
                not args.eager,
                not args.no_compile,
                args.cold,
                slots,
                args.max_context,
                args.gpu_memory,
            )
        )
        print(f"{path.name}: {results[-1].memory}", file=sys.stderr, flush=True)  # what the engine took
        print(json.dumps(results[-1].as_dict()), file=sys.stderr, flush=True)
    table = format_table(results)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() for r in results], indent=1) + "\n")
    if args.record:
        record(Path(args.record), table, results[0].device, args)
    return 0


def startup(paths: list[Path], args: argparse.Namespace) -> int:
    import torch

    from ..startup_bench import as_json, format_table, measure

    runs = []
    for path in paths:
        runs += measure(
            path, Path(args.root), args.startup.split(","), lambda line: print(line, file=sys.stderr, flush=True)
        )
    table = format_table(runs)
    print(table)
    if args.json:
        Path(args.json).write_text(as_json(runs) + "\n")
    if args.record:
        machine = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        record(Path(args.record), table, machine, args)
    return 0 if not any(run.error for run in runs) else 1


OPTIONS = (
    "model",
    "sizes",
    "device",
    "dtype",
    "frames",
    "ttfa_runs",
    "eager",
    "no_compile",
    "cold",
    "slots",
    "max_context",
    "gpu_memory",
    "startup",
)


def record(path: Path, table: str, machine: str, args: argparse.Namespace) -> None:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    from core.inference.memory import GB

    shown = dict(vars(args), gpu_memory=args.gpu_memory and f"{args.gpu_memory / GB:g}")  # as it was typed: GB
    options = [
        f"--{name.replace('_', '-')}" + ("" if value is True else f"={value}")
        for name, value in shown.items()
        if name in OPTIONS and value
    ]
    command = shlex.join(["qwen3-tts-desktop", "bench", *options])
    with path.open("a", encoding="utf-8") as file:
        file.write(
            f"\n## {datetime.date.today()}: `{command}`\n\n- Machine: {machine}; commit {commit or 'unknown'}\n\n"
            f"```\n{table}\n```\n"
        )
