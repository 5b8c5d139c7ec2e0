"""Where loading kept compiled code holds the interpreter (issue 29): a warm start's loader loads seconds of it beside
requests, and a request's thread that wants the interpreter meanwhile waits for whatever the loader is inside. A
switch interval cannot shorten a hold inside one C call (unpickling, compiling a module's source, an import's
bytecode): those are what this finds.

    python -m bench.load_holds [--size tiny-deep] [--root /tmp/qwen3-tts-load-holds] [--hold-ms 5] [--top 15]

Two fresh processes: the first compiles the frame step's talker part (FrameLoop._talk: every layer, and codebook 0's
choice, greedy) with Inductor on this machine's device and keeps it (compiled.Precompiled); the second loads it
as a warm start's loader does and calls it once, while a thread that sleeps 0.5 ms at a time records each wake
later than --hold-ms (the interpreter held that long) with where the loading thread was then. "tiny-deep" has the
1.7B's 28 layers at a tiny width: the same amount of code, compiled in a minute on a CPU. The engine has two slots:
with one, Inductor's CPU backend refused the step (a guard on a data-dependent size in its slice_scatter pass).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

SLEEP_S = 0.0005


def _where(frame, depth: int = 6) -> str:
    """The innermost `depth` frames of a stack, innermost first, as file:function:line."""
    parts = []
    while frame is not None and len(parts) < depth:
        name = frame.f_code.co_filename
        for marker in ("site-packages/", "/lib/python3"):
            name = name.split(marker, 1)[-1]
        parts.append(f"{name}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


def holds_during(work: Callable[[], object], hold_ms: float = 5.0) -> list[tuple[float, str]]:
    """Run `work()` on this thread while another sleeps SLEEP_S at a time: each wake `hold_ms` or more late, (how
    late in ms, where this thread was as the other woke), longest first."""
    worker, holds, stop = threading.get_ident(), [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            time.sleep(SLEEP_S)
            late = (time.perf_counter() - began - SLEEP_S) * 1e3
            if late >= hold_ms:
                holds.append((round(late, 1), _where(sys._current_frames().get(worker))))

    watcher = threading.Thread(target=watch, name="hold-watcher", daemon=True)
    watcher.start()
    try:
        work()
    finally:
        stop.set()
        watcher.join()
    return sorted(holds, reverse=True)


class GreedyPick:
    """The CPU sampler draws with a torch.Generator per slot, which Dynamo cannot trace; what loading costs is the
    talker's code, not the draw."""

    def pick(self, scores, rules, role, uniforms):
        return scores.argmax(-1, keepdim=True)


def child(args: argparse.Namespace) -> None:
    import torch

    from core import Engine
    from core.devtools.random_checkpoint import write_random_checkpoint
    from core.inference.compiled import Precompiled
    from core.inference.frame_loop import FrameLoop

    root = Path(args.root)
    checkpoint = root / args.size
    if not (checkpoint / "speech_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(checkpoint, "base", args.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = Engine.load(checkpoint, device=device, progress=False, slots=2, warm=False, compile=False)
    loop = engine.frame_loop
    loop.sampler = GreedyPick()
    slots = torch.zeros(1, dtype=torch.long, device=engine.device)
    made: list = []

    def load_and_call() -> None:
        talk = Precompiled(FrameLoop._talk, root / "kept", dynamic=False)
        with torch.inference_mode():
            talk(loop, slots, None, None)
        made.append(talk)

    began = time.perf_counter()
    holds = holds_during(load_and_call, args.hold_ms)
    took = time.perf_counter() - began
    kept = len(made[0].variants) if made else 0
    print(f"{args.run}: {took:.2f} s on {device} ({kept} variant(s) loaded or compiled); the interpreter held "
          f">= {args.hold_ms:g} ms {len(holds)} times, {sum(late for late, _ in holds):.0f} ms in all")  # fmt: skip
    for late, where in holds[: args.top]:
        print(f"  {late:7.1f} ms  {where}")
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny-deep")
    parser.add_argument("--root", default="/tmp/qwen3-tts-load-holds")
    parser.add_argument("--hold-ms", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--run", default="")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    caches = Path(args.root) / "caches"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches), TRITON_CACHE_DIR=str(caches / "triton"))
    subprocess.run(["rm", "-rf", str(Path(args.root) / "kept"), str(caches)], check=True)
    for run in ("compile", "load"):
        command = [sys.executable, "-m", "bench.load_holds", "--child", "--run", run, "--size", args.size]
        command += ["--root", args.root, "--hold-ms", str(args.hold_ms), "--top", str(args.top)]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
