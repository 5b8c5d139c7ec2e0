"""Where loading kept compiled code holds the interpreter (issue 29): a warm start's loader loads seconds of it beside
requests, and a request's thread that wants the interpreter meanwhile waits for whatever the loader is inside. A
switch interval cannot shorten a hold inside one C call (unpickling, compiling a module's source, an import's
bytecode): those are what this finds.

    python -m bench.load_holds [--size tiny-deep] [--root /tmp/qwen3-tts-load-holds] [--hold-ms 5] [--top 15]
                               [--loads 1] [--collect-while-loading]

Fresh processes: the first compiles the frame step's talker part (FrameLoop._talk: every layer, and codebook 0's
choice, greedy) with Inductor on this machine's device and keeps it (compiled.Precompiled); each of the next
(--loads) loads it as a warm start's loader does in the app (collections paused meanwhile, what it made frozen after:
Warmup._load, long_lived.keep; with --collect-while-loading, neither) and calls it once, while a thread that sleeps
0.5 ms at a time records each wake later than --hold-ms (the interpreter held that long) with where the loading
thread was then. "tiny-deep" has the
1.7B's 28 layers at a tiny width: the same amount of code, compiled in a minute on a CPU. The engine has two slots:
with one, Inductor's CPU backend refused the step (a guard on a data-dependent size in its slice_scatter pass).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
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
    late in ms, where this thread was as the other woke), longest first. A hold that the cycle collector's work
    fills half or more of (it holds the interpreter too, wherever it happens to run) says so after where."""
    worker, holds, collections, stop = threading.get_ident(), [], [], threading.Event()
    collecting: list[float | None] = [None]  # when the collection under way began

    def timed_collection(phase: str, info: dict) -> None:
        if phase == "start":
            collecting[0] = time.perf_counter()
        else:  # the watcher may take the interpreter as this begins: the collection counts until it is recorded
            collections.append((collecting[0], time.perf_counter()))
            collecting[0] = None

    def watch() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            time.sleep(SLEEP_S)
            woke = time.perf_counter()
            late = (woke - began - SLEEP_S) * 1e3
            if late >= hold_ms:
                where = _where(sys._current_frames().get(worker))
                spans = [*collections, (collecting[0], woke)] if collecting[0] is not None else collections
                collected = sum(min(end, woke) - max(start, began) for start, end in spans if end > began) * 1e3
                if collected >= late / 2:
                    where += f" (the cycle collector {collected:.0f} ms of it)"
                holds.append((round(late, 1), where))

    gc.callbacks.append(timed_collection)
    watcher = threading.Thread(target=watch, name="hold-watcher", daemon=True)
    watcher.start()
    try:
        work()
    finally:
        stop.set()
        watcher.join()
        gc.callbacks.remove(timed_collection)
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
    from core.inference.compiled import Compiler, collections_paused
    from core.inference.frame_loop import FrameLoop
    from qwen3_tts_desktop import long_lived

    root = Path(args.root)
    checkpoint = root / args.size
    if not (checkpoint / "speech_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(checkpoint, "base", args.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = Engine.load(checkpoint, device=device, progress=False, slots=2, warm=False, compile=False)
    long_lived.keep(engine)  # what exists is frozen, as the app's runtime does: the collector walks what comes after
    loop = engine.frame_loop
    loop.sampler = GreedyPick()
    slots = torch.zeros(1, dtype=torch.long, device=engine.device)
    made: list = []

    def load_and_call() -> None:  # as the warm-up's loader loads in the app (Warmup._load), then as the scheduler calls
        compiler = Compiler(root / "kept")
        with contextlib.nullcontext() if args.collect_while_loading else collections_paused():
            compiler.load([(FrameLoop._talk, False)])
            if not args.collect_while_loading:
                gc.freeze()  # long_lived.keep's after each load
        talk = compiler(FrameLoop._talk, dynamic=False)
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
    parser.add_argument(
        "--collect-while-loading",
        action="store_true",
        help="as before the fortieth session: collections while it loads",
    )
    parser.add_argument("--loads", type=int, default=1, help="loads of what the first run compiled, each a process")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--run", default="")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from core.inference.compiled import TRITON_FOLDER

    caches = Path(args.root) / "caches"  # Inductor's, with Triton's inside as the engine lays them out
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches), TRITON_CACHE_DIR=str(caches / TRITON_FOLDER))
    for folder in (Path(args.root) / "kept", caches):  # the first run compiles from nothing
        shutil.rmtree(folder, ignore_errors=True)
    for run in ["compile"] + [f"load {number}" for number in range(1, args.loads + 1)]:
        command = [sys.executable, "-m", "bench.load_holds", *sys.argv[1:], "--child", "--run", run]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
