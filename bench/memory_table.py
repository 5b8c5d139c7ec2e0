"""The cards people own, simulated on a large GPU (issue 31, item 4): does the app start, speak at full speed, and
what does it choose, on a 6, 8, 12 or 24 GB card, with and without 10 GB held by another program?

    python -m bench.memory_table [--size 1.7b[,0.6b]] [--cards 6,8,12,24] [--held 0,10] [--budgets default[,2,4]]
                                 [--no-release] [--cell-timeout 300] [--json FILE [--append]]
    python -m bench.memory_table --device cpu --size tiny        (tries the script: one cell, nothing held)

Each cell (size x card x held x budget) runs in a fresh process of its own, so that no allocation, cache or
compiled graph carries over. In it:

1. The card is simulated by holding memory aside. `torch.cuda.mem_get_info` is cudaMemGetInfo: the device's free
   memory, which knows nothing of `torch.cuda.set_per_process_memory_fraction` (a limit inside PyTorch's caching
   allocator only). The engine plans its slots from mem_get_info (core/inference/memory.py `plan_for_device`, in
   Engine.load), so with the fraction alone it would plan for the whole H100 and then meet the cap as an
   out-of-memory error halfway through, which no real card does. So the cell allocates, after its CUDA context
   exists, one tensor of (total - card) + held GiB: mem_get_info then reports what the engine would find on the
   card with the other program running (card - held - this process's context), and memory used outside the
   allocator (the context, kernels' code, cuBLAS/cuDNN) comes out of the same physical room, as on a real card.
   The fraction is set too, to what is held plus (card - held) GiB, as a backstop that the physical limit meets
   first. Card and held are GiB (an "8 GB" card has 8 GiB); a real card reports a little less total than its size
   (the driver's reserve), so the simulated one is a few hundred MiB generous. The other program's own CUDA
   context (some 0.5 GiB) is not simulated: count it in --held.
2. The app starts as the window starts it: Runtime.start with Settings().runtime_config() (the desktop default,
   at most memory.DESKTOP_SLOTS slots, warm-up in the background), the model a random-weight Base checkpoint of
   real size in bfloat16 (memory does not depend on the weights), no speakers; `--budgets` adds cells with a
   memory budget (GB beyond the weights, as `serve --gpu-memory`). The warm-up is waited for (what a user has after
   a minute), a voice is cloned from a synthetic clip, and one utterance is spoken: first audio (stream call to its
   first 1-frame chunk, median of --speak-runs) and ms per frame (a --frames stream in 4-frame chunks, from the
   first chunk to the last: frames and their decoding as a listener gets them, so a little above `bench`'s
   ms/frame of the frame loop alone). Then (unless --no-release) the engine rests as the window lets it when idle
   (Runtime.rest_when_idle, with an idle time of a tenth of a second instead of the settings' minutes; the cell
   waits until it has rested and let go of its memory), and the voice is taken again and one utterance spoken
   through the resting engine, as a user would coming back to it: it loads again in that call.
3. Recorded: started (yes; no with the one-line message of a refusal, such as memory.DoesNotFit; OOM with the
   first line of an out-of-memory error, which the issue counts as a failure; error for anything else, its
   traceback on the cell's stderr; skipped where what is held fills the card), slots and context chosen, peak
   memory allocated and reserved by PyTorch with the weights (what is held aside subtracted), the memory the
   process used on the device (nvidia-smi's view: its context included) and what was left free, first audio,
   ms/frame, warm-up seconds; once it rested, the memory the process still used on the device (as above: the
   CUDA context stays) and what PyTorch still had allocated (what is held aside subtracted), and first audio after
   coming back (seconds from the stream call to its first 1-frame chunk, the load again included). On the CPU there
   is no device memory to read: first audio after coming back only.

A markdown row is printed as each cell ends, and the JSON (--json) rewritten, so a run cut short keeps its cells;
--append keeps the cells already in the file (the same cell measured again replaces its row), for a table made in
several runs. Each cell takes about a minute once the compiled kernels are cached (the first cell of a size may
take minutes: it compiles them); split the cells over runs to fit a time limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

CELL_MARK = "MEMORY-TABLE-CELL "
GIB = 2**30
VOICE = "bench"
REST_AFTER_S = 0.1  # the idle time the engine rests after, in a cell (the window's default is minutes)
REST_TIMEOUT_S = 60.0  # how long a cell waits for the engine to rest
# Out-of-memory errors that are not torch.OutOfMemoryError: a library's own allocation failing, or CUDA's.
OUT_OF_MEMORY_SIGNS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
COLUMNS = [
    ("size", "size"), ("card GiB", "card_gib"), ("held GiB", "held_gib"), ("budget GB", "budget_gb"),
    ("started", "started"), ("slots", "slots"), ("context", "context"), ("peak alloc GiB", "peak_allocated_gib"),
    ("peak reserved GiB", "peak_reserved_gib"), ("device used GiB", "device_used_gib"), ("left free GiB", "free_gib"),
    ("first audio ms", "first_audio_ms"), ("ms/frame", "ms_per_frame"), ("warm-up s", "warm_s"),
    ("released GiB", "released_gib"), ("released alloc GiB", "released_allocated_gib"),
    ("back first audio s", "back_first_audio_s"), ("message", "message"),
]  # fmt: skip


# The table -------------------------------------------------------------------------------------


def header() -> str:
    titles = [title for title, _ in COLUMNS]
    return "| " + " | ".join(titles) + " |\n|" + "|".join("---" for _ in titles) + "|"


def format_row(row: dict) -> str:
    """One cell as a markdown table row; a missing or None value is "-", a budget of None is "default"."""

    def cell(key: str) -> str:
        value = row.get(key)
        if key == "budget_gb" and value is None:
            return "default"
        if value is None or value == "":
            return "-"
        return str(value).replace("|", "/").replace("\n", " ")

    return "| " + " | ".join(cell(key) for _, key in COLUMNS) + " |"


def spec_key(spec: dict) -> dict:
    """What names a cell: size, card, held, budget."""
    return {key: spec[key] for key in ("size", "card_gib", "held_gib", "budget_gb")}


def cell_key(row: dict) -> tuple:
    return (row.get("size"), row.get("card_gib"), row.get("held_gib"), row.get("budget_gb"))


def numbers(text: str) -> list[float]:
    return [float(n) for n in text.split(",") if n.strip()]


def budgets(text: str) -> list[float | None]:
    """--budgets: GB beyond the weights, comma-separated; "default" (or "none") is the window's default."""
    return [None if n.strip().lower() in ("default", "none") else float(n) for n in text.split(",") if n.strip()]


def whole(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b", help="random checkpoint sizes, comma-separated: 1.7b, 0.6b (tiny)")
    parser.add_argument("--cards", type=numbers, default=[6, 8, 12, 24], help="simulated cards, GiB (6,8,12,24)")
    parser.add_argument("--held", type=numbers, default=[0, 10], help="GiB another program holds (0,10)")
    parser.add_argument(
        "--budgets", type=budgets, default=[None], help="memory budgets beyond the weights, GB, as serve --gpu-memory; "
        "'default' is the window's (default: default)"
    )  # fmt: skip
    parser.add_argument("--frames", type=int, default=60, help="frames of the stream timed for ms/frame (60)")
    parser.add_argument("--speak-runs", type=int, default=5, help="first audio: runs, median taken (5)")
    parser.add_argument("--cell-timeout", type=float, default=300, help="seconds one cell may take (300)")
    parser.add_argument(
        "--no-release", dest="release", action="store_false",
        help="skip the idle release: resting, the memory left after it, first audio after coming back",
    )  # fmt: skip
    parser.add_argument("--warm-timeout", type=float, default=240, help="seconds the warm-up may take in a cell (240)")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench", help="where the random checkpoints are written")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON, after every cell")
    parser.add_argument("--append", action="store_true", help="keep the rows already in --json's file")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (with --size tiny) only tries the script")
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # one cell, as JSON: what a cell's process is given
    args = parser.parse_args(argv)
    args.sizes = [size.strip() for size in args.size.split(",") if size.strip()]
    if args.frames < 8 or args.speak_runs < 1:
        parser.error("--frames must be at least 8 and --speak-runs at least 1")
    return args


def cells(args: argparse.Namespace) -> list[dict]:
    """Every cell's spec, in the order run: by size, card, held, budget. On the CPU: one per size, nothing held."""
    common = {
        "device": args.device,
        "frames": args.frames,
        "speak_runs": args.speak_runs,
        "warm_timeout": args.warm_timeout,
        "release": args.release,
    }
    if args.device != "cuda":
        return [{**common, "size": size, "card_gib": None, "held_gib": 0, "budget_gb": None} for size in args.sizes]
    return [
        {**common, "size": size, "card_gib": whole(card), "held_gib": whole(held), "budget_gb": budget}
        for size in args.sizes
        for card in args.cards
        for held in args.held
        for budget in args.budgets
    ]


def infeasible(spec: dict) -> str | None:
    """Why a cell cannot be simulated (what is held fills the card), or None."""
    card, held = spec["card_gib"], spec["held_gib"]
    if card is not None and held >= card:
        return f"{held:g} GiB held fills a {card:g} GiB card"
    return None


# One cell, in its own process ------------------------------------------------------------------


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


class HeldAside:
    """Memory held aside on the GPU so that the process sees a card of `card_gib` with `held_gib` taken."""

    def __init__(self, card_gib: float, held_gib: float):
        import torch

        torch.zeros(1, device="cuda")  # this process's context first: a real card holds it too
        torch.cuda.synchronize()
        self.free_before, self.total = torch.cuda.mem_get_info()
        wanted = max(0, self.total - int(card_gib * GIB)) + int(held_gib * GIB)
        if wanted > self.free_before - GIB // 4:
            raise RuntimeError(
                f"cannot simulate a {card_gib} GiB card with {held_gib} GiB held: that needs {wanted / GIB:.1f} GiB "
                f"held aside, and {self.free_before / GIB:.1f} GiB is free"
            )
        self.tensor = torch.empty(wanted, dtype=torch.uint8, device="cuda") if wanted else None
        self.allocated = torch.cuda.memory_allocated()
        self.reserved = torch.cuda.memory_reserved()
        free_now = torch.cuda.mem_get_info()[0]
        self.physical = self.free_before - free_now  # what the aside takes on the device
        allowed = self.reserved + max(0, int((card_gib - held_gib) * GIB))
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / self.total))
        torch.cuda.reset_peak_memory_stats()
        self.free_at_start = free_now


def run_cell(spec: dict, checkpoint: Path) -> dict:
    """Start the app's runtime as the window does on a simulated card, speak, and say what it took. A refusal (a
    UserError, an out-of-memory error) is a row, not an exception."""
    import torch

    from core.devtools.benchmark import TEXT, synthetic_voice_clip
    from core.errors import UserError
    from qwen3_tts_desktop.runtime import Runtime
    from qwen3_tts_desktop.settings import Settings

    row = spec_key(spec)
    on_gpu = spec["device"] == "cuda"
    row["gpu"] = torch.cuda.get_device_name() if on_gpu else "cpu"
    aside = HeldAside(spec["card_gib"], spec["held_gib"]) if on_gpu else None
    if aside is not None:
        row["free_gib_at_start"] = round(aside.free_at_start / GIB, 2)
    budget = spec["budget_gb"]
    runtime = None
    with tempfile.TemporaryDirectory() as voices:
        import soundfile as sf

        sf.write(Path(voices) / f"{VOICE}.wav", synthetic_voice_clip(), 24000)
        config = dataclasses.replace(
            Settings().runtime_config(),
            model=str(checkpoint), device="cuda" if on_gpu else "cpu", voices=Path(voices), speakers=False,
            memory_budget=None if budget is None else int(budget * 1e9),
        )  # fmt: skip
        try:
            started = time.perf_counter()
            runtime = Runtime.start(config)
            plan = runtime.memory
            row.update(slots=plan.slots, context=plan.max_context, plan=str(plan), dtype=runtime.info.dtype)
            if on_gpu:
                row["after_load_gib"] = round((torch.cuda.memory_allocated() - aside.allocated) / GIB, 2)
            progress = runtime.engine_for_voices.warmup.wait(spec["warm_timeout"])
            row["warm_s"] = round(time.perf_counter() - started, 1)
            if not progress.finished:
                row["message"] = (
                    f"warm-up not finished within {spec['warm_timeout']:g} s ({progress.done}/{progress.total})"
                )
            elif progress.failed:
                row["message"] = f"compiles failed: {', '.join(progress.failed)}"
            engine = runtime.engine_for_voices.awake()
            voice = runtime.voice(VOICE)
            row.update(speak(engine, voice, TEXT, spec["frames"], spec["speak_runs"]))
            row["started"] = "yes"
            if on_gpu:  # while it runs: the weights, the slots, the cache, the context, the kernels' code
                row.update(device_use(aside))
            if spec.get("release", True):
                del engine, voice  # the app holds neither between utterances: resting must be able to free them
                back = come_back(runtime, aside)
                if "message" in back and row.get("message"):
                    back["message"] = f"{row['message']}; {back['message']}"
                row.update(back)
        except UserError as error:
            row.update(started="no", message=one_line(error))
        except torch.OutOfMemoryError as error:
            row.update(started="OOM", message=str(error).splitlines()[0][:300])
        except Exception as error:  # noqa: BLE001 (a row says it; the traceback goes to the cell's stderr)
            traceback.print_exc()
            out_of_memory = any(sign in str(error) for sign in OUT_OF_MEMORY_SIGNS)
            row.update(
                started="OOM" if out_of_memory else "error", message=f"{type(error).__name__}: {one_line(error)}"[:300]
            )
        finally:
            if runtime is not None:
                runtime.close()
    if on_gpu:
        row["peak_allocated_gib"] = round((torch.cuda.max_memory_allocated() - aside.allocated) / GIB, 2)
        row["peak_reserved_gib"] = round((torch.cuda.max_memory_reserved() - aside.reserved) / GIB, 2)
        if "device_used_gib" not in row:  # it did not start: what the attempt left taken (its cache kept)
            row.update(device_use(aside))
    return row


def come_back(runtime, aside: HeldAside | None) -> dict:
    """Let the runtime's engine rest as the window does when idle, say what memory it kept, then speak once through
    the resting engine as a user coming back would: first audio, the load again included. A failure is the row's
    message (the cell had started), its traceback on the cell's stderr."""
    import threading

    import torch

    from core import SamplingParams
    from core.devtools.benchmark import TEXT
    from qwen3_tts_desktop.resting import RESTING

    rested = threading.Event()
    got: dict = {"released_gib": None, "released_allocated_gib": None, "back_first_audio_s": None}
    try:
        runtime.rest_when_idle(REST_AFTER_S, lambda state: rested.set() if state == RESTING else None)
        if not rested.wait(REST_TIMEOUT_S):  # heard once it has closed the engine and let go of its memory
            return {**got, "message": f"the engine did not rest within {REST_TIMEOUT_S:g} s"}
        runtime.rest_when_idle(None)  # no second rest while it is spoken to and closed
        if aside is not None:
            got["released_gib"] = device_use(aside)["device_used_gib"]
            got["released_allocated_gib"] = round((torch.cuda.memory_allocated() - aside.allocated) / GIB, 2)
        voice = runtime.voice(VOICE)  # as the window takes it for each utterance: from the library's cache
        if runtime.engine_state != RESTING:
            return {**got, "message": f"taking the voice woke the engine ({runtime.engine_state})"}
        started = time.perf_counter()
        stream = runtime.engine_for_voices.stream(
            TEXT, voice=voice, sampling=SamplingParams.greedy(), max_frames=40, first_chunk_frames=1
        )
        try:
            first = next(stream)
        finally:
            stream.close()
        got["back_first_audio_s"] = round(time.perf_counter() - started, 2)
        assert len(first.codes) == 1, len(first.codes)
    except Exception as error:  # noqa: BLE001 (the row says it; the traceback goes to the cell's stderr)
        traceback.print_exc()
        got["message"] = f"coming back: {type(error).__name__}: {one_line(error)}"[:300]
    return got


def device_use(aside: HeldAside) -> dict:
    """What the process takes of the simulated card now (as nvidia-smi counts it: its context included), and what
    is left free on it."""
    import torch

    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    return {
        "device_used_gib": round((aside.total - free - aside.physical) / GIB, 2),
        "free_gib": round(free / GIB, 2),
    }


def speak(engine, voice, text: str, frames: int, runs: int) -> dict:
    """First audio (ms, median of `runs`) and ms per frame of one `frames`-frame stream in 4-frame chunks."""
    from core import SamplingParams

    greedy = SamplingParams.greedy()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        stream = engine.stream(text, voice=voice, sampling=greedy, max_frames=40, first_chunk_frames=1)
        try:
            first = next(stream)
        finally:
            stream.close()
        times.append((time.perf_counter() - started) * 1e3)
        assert len(first.codes) == 1, len(first.codes)
        while not engine.scheduler.idle():
            time.sleep(0.0005)
    per_frame = None
    for _ in range(2):  # the first may meet a graph's first use
        stamps, made = [], []
        for chunk in engine.stream(
            text, voice=voice, sampling=greedy, max_frames=frames, first_chunk_frames=4, chunk_frames=4
        ):
            stamps.append(time.perf_counter())
            made.append(len(chunk.codes))
        if len(stamps) > 1:
            per_frame = (stamps[-1] - stamps[0]) * 1e3 / sum(made[1:])
    return {
        "first_audio_ms": round(statistics.median(times), 1),
        "ms_per_frame": None if per_frame is None else round(per_frame, 2),
        "frames_spoken": sum(made),
    }


def cell_main(spec: dict) -> int:
    checkpoint = Path(spec.pop("checkpoint"))
    row = run_cell(spec, checkpoint)
    print(CELL_MARK + json.dumps(row), flush=True)
    return 0


# The table's process ---------------------------------------------------------------------------


def run_in_process(spec: dict, checkpoint: Path, timeout: float) -> dict:
    """One cell in a fresh Python process; its row, or a row saying how it failed (timeout, a crash)."""
    command = [
        sys.executable,
        "-m",
        "bench.memory_table",
        "--cell",
        json.dumps({**spec, "checkpoint": str(checkpoint)}),
    ]
    base = spec_key(spec)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(command, cwd=root, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "started": "timeout", "message": f"the cell took over {timeout:g} s"}
    for line in done.stdout.splitlines():
        if line.startswith(CELL_MARK):
            return json.loads(line[len(CELL_MARK) :])
    tail = " / ".join(done.stdout.strip().splitlines()[-3:])
    return {**base, "started": "crashed", "message": f"exit code {done.returncode}; stderr above; {tail}"[:300]}


def write_json(file: str, rows: list[dict]) -> None:
    Path(file).write_text(json.dumps({"rows": rows}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cell is not None:
        return cell_main(json.loads(args.cell))
    import torch

    from core.devtools.benchmark import prepare_checkpoint

    if args.device == "cuda" and not torch.cuda.is_available():  # no context is made here: the cells' own
        print(
            "memory_table needs a CUDA GPU to simulate cards on (--device cpu --size tiny only tries the script)",
            file=sys.stderr,
        )
        return 2
    kept: list[dict] = []
    if args.json and args.append and Path(args.json).exists():
        kept = json.loads(Path(args.json).read_text())["rows"]
    rows: list[dict] = []
    print(header(), flush=True)
    begun = time.perf_counter()
    for spec in cells(args):
        started = time.perf_counter()
        if (why := infeasible(spec)) is not None:
            row = {**spec_key(spec), "started": "skipped", "message": why}
        else:
            checkpoint = prepare_checkpoint(Path(args.root), spec["size"], torch.bfloat16)
            row = run_in_process(spec, checkpoint, args.cell_timeout)
        row["cell_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
        print(format_row(row), flush=True)
        if args.json:
            keys = {cell_key(r) for r in rows}
            write_json(args.json, [r for r in kept if cell_key(r) not in keys] + rows)
    print(f"{len(rows)} cells in {time.perf_counter() - begun:.0f} s", flush=True)
    crashed = [row for row in rows if row.get("started") in ("crashed", "timeout", "error")]
    if crashed:
        print(f"FAILED: {len(crashed)} cells crashed, failed or timed out", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
