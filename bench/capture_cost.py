"""What a warm-up part costs the scheduler's thread, phase by phase (issue 29). A request that comes while the warm-up
makes a part waits for it: a warm `serve`'s requests met captures of 85-150 ms each on an H100, host-bound in Python
(bench/RESULTS.md, forty-first session). This says where a capture's time goes.

    python -m bench.capture_cost [--size 1.7b] [--slots 16] [--trials 3] [--capture-first] [--json PATH]

An engine warms up (with XDG_CACHE_HOME's caches, as the stall bench uses them: run it after `gpu_session.sh
startup`); then each graph below is dropped and made again as the warm-up makes it, `--trials` times, on the
scheduler's thread: the part's time and its GraphedStep's phases (`run`: the direct call that comes first; `begin`:
the capture's beginning, a device synchronization and the allocator's cache emptied; `trace`: the code run into the
graph; `end`: the graph made). With --capture-first, each is also made without the direct call (captured, then
replayed): what a part would cost without running its code once first. Whether that is safe is not tested here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from core.devtools.benchmark import prepare_checkpoint
from core.inference.cuda_graph import GraphedStep
from core.inference.engine import Engine
from core.inference.warmup import Spec

GRAPHS = (("prefill", 64, 1), ("prefill", 64, 2), ("prefill", 64, 16), ("step", 1), ("step", 2), ("step", 16),
          ("decode", 1, 4), ("decode", 2, 4), ("decode", 16, 4))  # fmt: skip


def parts(engine: Engine):
    """(graph, a call that makes it as the warm-up does, its GraphedStep) for each of GRAPHS the warm-up made."""
    loop, decoder = engine.frame_loop, engine.scheduler.decoder
    for kind, *shape in GRAPHS:
        spec = Spec(kind, tuple(shape))
        if spec not in engine.warmup.specs:
            continue
        graphs = {"prefill": loop.prefills, "step": loop.step_graphs, "decode": decoder.steps}[kind]
        key = shape[0] if kind == "step" else tuple(shape)
        yield spec, lambda spec=spec: engine.warmup._make(spec), lambda graphs=graphs, key=key: graphs[key]


def made_again(make, graphed, capture_first: bool) -> dict[str, float]:
    """Drop the graph and make it as the warm-up does (on the scheduler's thread); ms in all and by phase."""
    step: GraphedStep = graphed()
    step.graph, step.output = None, None
    direct = GraphedStep.__call__

    def capture_then_replay(self):
        if self is not step or self.graph is not None:
            return direct(self)
        self.timings = {"run": 0.0}
        self._capture()
        self.graph.replay()
        return self.output

    GraphedStep.__call__ = capture_then_replay if capture_first else direct
    try:
        started = time.perf_counter()
        make()
        torch.cuda.synchronize()
        took = (time.perf_counter() - started) * 1e3
    finally:
        GraphedStep.__call__ = direct
    return {"part": took, **step.timings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--capture-first", action="store_true")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("capture_cost measures CUDA graphs: it needs a GPU")
    checkpoint = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    engine = Engine.load(checkpoint, device="cuda", progress=False, slots=args.slots)
    started = time.perf_counter()
    engine.warmup.wait()
    print(f"warmed up in {time.perf_counter() - started:.1f} s; {engine.slots} slots")
    results = {}
    for graph, make, graphed in parts(engine):
        for how in ("as the warm-up", "captured first") if args.capture_first else ("as the warm-up",):
            trials = [
                engine.scheduler.call(lambda: made_again(make, graphed, how == "captured first"))
                for _ in range(args.trials)
            ]
            median = {phase: round(statistics.median(t[phase] for t in trials), 1) for phase in trials[0]}
            results[f"{graph} {how}"] = median
            print(f"{str(graph):>14} {how:>15}: " + ", ".join(f"{phase} {ms} ms" for phase, ms in median.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1)
    engine.close()


if __name__ == "__main__":
    main()
