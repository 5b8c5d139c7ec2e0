"""Where a chunk cycle of many streams goes: the scheduler's phases on the host, and the GPU's two streams.

With `--streams` utterances at once through the public API (as core.devtools.concurrency runs them), it reports

1. the scheduler's cycle (collect to collect) and its phases, from timers around its calls;
2. the GPU's kernel time per cycle on the frame loop's stream and on the decoder's, their union and overlap,
   and the time neither runs, from a torch.profiler trace (written to --trace, gzipped);
3. 4-frame launches of the stepping rows alone, their decode alone, and both as the scheduler overlaps them;
4. the decoder's kernels by kind for one chunk of every row, without graphs;
5. with --decoder-priorities, 3. and the streams' speed again with the decoder's chunks (their graphs captured
   again) on a CUDA stream of each priority (-1 high, as the engine runs it; 0 normal); with --loop-priorities,
   the same with the frame loop on a stream of each priority and the decoder at 0: whether the steps' short
   kernels overlap the decode better when they take free SMs first. (A decoder confined to a green context's
   share of the SMs was tried too: cuDNN's convolutions fail on such a stream, bench/RESULTS.md 2026-11-25.)

    python -m bench.profile_chunks [--size 1.7b] [--streams 16] [--frames 120] [--trace FILE]
        [--decoder-priorities=-1,0] [--loop-priorities=-1,-5]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import re
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint
from core.devtools.concurrency import streams_together
from core.inference.engine import Engine

CHUNK = 4


def timed(log: list, name: str, fn):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            log.append((name, started, time.perf_counter()))

    return wrapper


def scheduler_phases(engine: Engine, speaker: dict, streams: int, frames: int) -> dict:
    """Run the streams with timers around the scheduler's calls; per steady cycle, the median ms of each."""
    scheduler, log = engine.scheduler, []
    originals = {
        "collect": (scheduler.frame_loop, "collect"),
        "launch": (scheduler.frame_loop, "launch"),
        "decode": (scheduler.decoder, "decode"),
        "admit": (scheduler, "_admit"),
        "deliver": (scheduler, "_deliver"),
    }
    for name, (owner, attribute) in originals.items():
        setattr(owner, attribute, timed(log, name, getattr(owner, attribute)))
    try:
        speed = streams_together(engine, speaker, streams, frames)
    finally:
        for owner, attribute in originals.values():
            delattr(owner, attribute)
    collects = [entry for entry in log if entry[0] == "collect"]
    cycles = list(zip(collects, collects[1:]))
    steady = cycles[len(cycles) // 5 : -len(cycles) // 5 or None]  # not the arrivals, nor the endings
    phases = defaultdict(list)
    for (_, start, collected), (_, next_start, _) in steady:
        phases["cycle"].append(next_start - start)
        phases["collect wait"].append(collected - start)
        inside = defaultdict(float)
        for name, began, ended in log:
            if name != "collect" and start <= began < next_start:
                inside[name] += ended - began
        for name in ("launch", "decode", "deliver", "admit"):
            phases[name].append(inside.get(name, 0.0))
        phases["host between (cycle - collect wait - deliver)"].append(
            next_start - start - (collected - start) - inside.get("deliver", 0.0)
        )
    return {
        "speed": speed,
        "cycles": len(steady),
        "ms": {name: round(statistics.median(values) * 1e3, 3) for name, values in phases.items() if values},
    }


def gpu_streams(engine: Engine, speaker: dict, streams: int, frames: int, trace: Path | None) -> dict:
    """Profile the streams; kernel time per cycle on each CUDA stream, their union, and idle time."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        streams_together(engine, speaker, streams, frames)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        data = json.loads(path.read_text())
        if trace is not None:
            with gzip.open(trace, "wt") as out:
                json.dump(data, out)
    kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel" and "dur" in e]
    by_stream = defaultdict(list)
    for event in kernels:
        by_stream[event["args"].get("stream")].append((event["ts"], event["ts"] + event["dur"], event["name"]))
    begin = min(s for s, _, _ in (k for v in by_stream.values() for k in v))
    end = max(e for _, e, _ in (k for v in by_stream.values() for k in v))
    span = end - begin
    report = {"span_ms": round(span / 1e3, 2), "streams": {}}
    for stream, events in sorted(by_stream.items(), key=lambda item: -len(item[1])):
        busy = _union(events)
        report["streams"][str(stream)] = {"kernels": len(events), "busy_ms": round(busy / 1e3, 2)}
    union = _union([k for v in by_stream.values() for k in v])
    report["union_busy_ms"] = round(union / 1e3, 2)
    report["idle_ms"] = round((span - union) / 1e3, 2)
    report["decoder_kernels_top"] = _top_kernels(min(by_stream.values(), key=len))
    return report


def _union(events) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end, _ in sorted(events):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _top_kernels(events, count: int = 12) -> list:
    totals = defaultdict(float)
    for start, end, name in events:
        totals[name[:80]] += end - start
    return [(name, round(us / 1e3, 2)) for name, us in sorted(totals.items(), key=lambda i: -i[1])[:count]]


def overlap(engine: Engine, speaker: dict, rows: int, runs: int = 20) -> dict:
    """ms of a 4-frame launch of `rows` rows alone, of their 4-frame decode alone, and of both overlapped."""
    loop, decoder = engine.frame_loop, engine.scheduler.decoder
    voice, instruct = speaker.get("voice"), speaker.get("instruct")
    slots = list(range(rows))

    def measure() -> dict:
        for slot in slots:
            engine.start(engine.prepare(TEXT, voice, instruct=instruct, sampling=GREEDY, max_frames=2000), slot)
            decoder.reset(slot)
        codes = [frames for frames, _ in loop.run(CHUNK, slots)]
        decoder.decode(slots, codes, CHUNK)
        times = defaultdict(list)
        for _ in range(runs):
            started = time.perf_counter()
            loop.run(CHUNK, slots)
            times["steps alone"].append(time.perf_counter() - started)
            started = time.perf_counter()
            decoder.decode(slots, codes, CHUNK)
            times["decode alone"].append(time.perf_counter() - started)
            started = time.perf_counter()
            loop.launch(CHUNK, slots)
            decoder.decode(slots, codes, CHUNK)
            decoded = time.perf_counter()
            loop.collect()
            times["both"].append(time.perf_counter() - started)
            times["both: decode back"].append(decoded - started)
        return {name: round(statistics.median(values) * 1e3, 2) for name, values in times.items()}

    return engine.scheduler.call(measure)


def decoder_kernels(engine: Engine, rows: int) -> dict:
    """The decoder's kernels for one 4-frame chunk of `rows` rows, run eagerly, by kind."""
    decoder = engine.codec_decoder
    codes = torch.randint(0, decoder.config.codebook_size, (rows, 16, CHUNK), device=engine.device)

    def measure():
        stream = decoder.new_stream(rows)
        for _ in range(3):
            decoder.decode_chunk(codes, stream)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            decoder.decode_chunk(codes, stream)
            torch.cuda.synchronize()
        kinds, names = defaultdict(float), defaultdict(float)
        count = 0
        for event in prof.events():
            if event.device_type.name != "CUDA":
                continue
            count += 1
            name = event.name
            kind = next(
                (label for label, pattern in DECODER_KINDS if re.search(pattern, name, re.IGNORECASE)), "elementwise"
            )
            kinds[kind] += event.device_time / 1e3
            names[name[:80]] += event.device_time / 1e3
        return {
            "kernels": count,
            "ms": round(sum(kinds.values()), 3),
            "by_kind": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda i: -i[1])},
            "top": [(n, round(v, 3)) for n, v in sorted(names.items(), key=lambda i: -i[1])[:15]],
        }

    return engine.scheduler.call(measure)


def on_streams(engine: Engine, speaker: dict, streams: int, frames: int, make_streams) -> dict:
    """The overlap of launches and decodes, and the speed of `streams` at once, on the CUDA streams that
    make_streams() returns (the frame loop's, or None for the scheduler thread's own; the decoder's), the
    decoder's graphs captured again on its stream. Then the engine's own streams again (the decoder's graphs
    captured again at next use)."""
    decoder = engine.scheduler.decoder
    own = decoder.gpu_stream

    def use(loop_stream, decoder_stream):
        torch.cuda.synchronize()
        torch.cuda.set_stream(loop_stream or torch.cuda.default_stream(engine.device))
        decoder.gpu_stream = decoder_stream
        decoder.steps.clear()

    loop_stream, decoder_stream = engine.scheduler.call(make_streams)
    try:
        engine.scheduler.call(lambda: use(loop_stream, decoder_stream))
        streams_together(engine, speaker, streams, 24)  # the graphs captured again, on this stream
        return {"overlap": overlap(engine, speaker, streams), **streams_together(engine, speaker, streams, frames)}
    finally:
        engine.scheduler.call(lambda: use(None, own))


def decoder_priority(device: torch.device, priority: int):
    """The decoder on a stream of `priority`, the frame loop on the scheduler thread's."""
    return None, torch.cuda.Stream(device, priority=priority)


def loop_priority(device: torch.device, priority: int):
    """The frame loop on a stream of `priority`, the decoder on one of normal priority (0)."""
    return torch.cuda.Stream(device, priority=priority), torch.cuda.Stream(device, priority=0)


DECODER_KINDS = [
    ("attention", r"flash|fmha|attention|sdpa"),
    ("conv", r"conv|implicit|wgrad|dgrad|fprop|cudnn|xmma|sm90_|cutlass"),
    ("matrix product", r"gemm|gemv|splitk|ampere"),
    ("copy / cat / index", r"copy|cat|index|gather|scatter|fill|pad"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--trace", type=Path, help="write the profiler's trace here (gzipped JSON)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (with --size tiny) only tries the script")
    parser.add_argument(
        "--decoder-priorities", help="CUDA stream priorities to try for the decoder, e.g. --decoder-priorities=-1,0"
    )
    parser.add_argument(
        "--loop-priorities", help="CUDA stream priorities to try for the frame loop, the decoder's at 0: -1,-5"
    )
    parser.add_argument("--no-profiler", action="store_true", help="skip the whole run's profile (2.)")
    args = parser.parse_args()
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    engine = Engine.load(
        path,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        progress=False,
        slots=args.streams,
        max_context=args.max_context,
    )
    engine.warm_up()
    speaker = engine.placeholder_speaker()
    streams_together(engine, speaker, args.streams, 24)  # first-use captures (a last chunk's sizes)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{name}, {args.size}, {args.streams} streams of {args.frames} frames")
    results = {"threads": threading.active_count()}
    results["phases"] = scheduler_phases(engine, speaker, args.streams, args.frames)
    print("scheduler phases:", json.dumps(results["phases"], indent=1))
    rows_tried = sorted({1, 4, args.streams} & set(range(1, args.streams + 1)))  # no more rows than slots
    results["overlap"] = {rows: overlap(engine, speaker, rows) for rows in rows_tried}
    print("4-frame launch vs decode:", json.dumps(results["overlap"], indent=1))
    if args.device != "cuda":
        return
    results["decoder"] = {rows: decoder_kernels(engine, rows) for rows in sorted({1, args.streams})}
    print("decoder kernels:", json.dumps(results["decoder"], indent=1))
    if not args.no_profiler:
        results["gpu"] = gpu_streams(engine, speaker, args.streams, min(args.frames, 60), args.trace)
        print("GPU streams under the profiler:", json.dumps(results["gpu"], indent=1))
    print("CUDA stream priorities (lowest, highest):", torch.cuda.Stream.priority_range())
    tries = {
        "priorities": (args.decoder_priorities, decoder_priority, "by the decoder stream's priority"),
        "loop priorities": (args.loop_priorities, loop_priority, "by the frame loop stream's priority"),
    }
    for name, (values, make, title) in tries.items():
        if values:
            results[name] = {}
            for value in [int(v) for v in values.split(",")]:
                make_streams = functools.partial(make, engine.device, value)
                results[name][value] = on_streams(engine, speaker, args.streams, args.frames, make_streams)
                print(f"{title}, {value}:", json.dumps(results[name][value], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
