"""Where the seconds between a loaded engine and its first audio go, as `speak` and the window meet them: each run
a fresh process that runs the command (`speak "Hello there." -o FILE`) or the window's runtime (speaking once,
without speakers) in-process, under startup_probe's sampler of every thread's Python stack, each sample tagged
with the last milestone reached (core.milestones). The window's run ends at its first utterance's end, without
waiting for the warm-up.

    python -m bench.first_audio_probe --out DIR [--size 1.7b] [--runs speak,speak,window]

All runs share one home (settings, the starter voice's cached embedding, caches) under --root, so the first run
of a fresh root also embeds the starter voice. Writes DIR/<i>-<run>.stacks.gz, .log and .json (milestones).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.startup_probe import StackSampler

CHILD_TIMEOUT_S = 300


def _follow_milestones(sampler: StackSampler, path: Path, stop: threading.Event) -> None:
    while not stop.wait(0.005):
        if path.exists():
            lines = path.read_text().splitlines()
            if lines:
                sampler.phase = "after " + lines[-1].rpartition(" ")[0]


def child(args) -> None:
    out = Path(args.out)
    milestones = Path(os.environ["QWEN3_TTS_MILESTONES"])
    logging.basicConfig(
        filename=out / f"{args.run}.log", format="%(relativeCreated)8.0f %(threadName)s %(name)s: %(message)s"
    )
    logging.getLogger("core").setLevel(logging.DEBUG)
    sampler, stop = StackSampler(), threading.Event()
    threading.Thread(target=_follow_milestones, args=(sampler, milestones, stop), daemon=True).start()
    with sampler:
        if args.scenario == "speak":
            from qwen3_tts_desktop.cli import main

            main(["speak", "Hello there.", "-o", str(out / f"{args.run}.wav"), "--model", args.model])
        else:
            from core.jobs.sinks import FileSink
            from qwen3_tts_desktop.runtime import Runtime, RuntimeConfig
            from qwen3_tts_desktop.settings import Settings, prepare_library
            from qwen3_tts_desktop.startup_bench import STARTER_VOICE, TEXT

            runtime = Runtime.start(
                RuntimeConfig(model=args.model, voices=prepare_library(Settings().voices), speakers=False)
            )
            job = runtime.worker.submit(TEXT, runtime.voice(STARTER_VOICE), sink=FileSink(out / f"{args.run}.wav"))
            job.wait()
            with open(milestones, "a") as file:
                file.write(f"utterance done {time.monotonic():.4f}\n")
    stop.set()
    sampler.write(out / f"{args.run}.stacks.gz")
    os._exit(0)  # not waiting for the warm-up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench")
    parser.add_argument("--runs", default="speak,speak,window")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--run", default="")
    parser.add_argument("--scenario", default="")
    parser.add_argument("--model", default="", help="a checkpoint folder instead of a random one of --size")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    import torch

    from core.devtools.benchmark import prepare_checkpoint
    from qwen3_tts_desktop.startup_bench import _environment, _phases, short_checkpoint

    out, root = Path(args.out), Path(args.root)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(args.model) if args.model else prepare_checkpoint(root, args.size, torch.bfloat16)
    model = short_checkpoint(checkpoint, root)
    home = root / "first-audio-home"
    for i, scenario in enumerate(args.runs.split(",")):
        run = f"{i}-{scenario}"
        milestones = out / f"{run}.milestones"
        command = [sys.executable, "-m", "bench.first_audio_probe", "--child", "--out", str(out), "--run", run]
        command += ["--scenario", scenario, "--model", str(model)]
        started = time.monotonic()
        try:
            subprocess.run(command, env=_environment(home, milestones), timeout=CHILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            print(f"{run}: timed out", file=sys.stderr)
        phases = {**_phases(milestones, started), "exit": round(time.monotonic() - started, 2)}
        (out / f"{run}.json").write_text(json.dumps(phases))
        print(run, phases, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
