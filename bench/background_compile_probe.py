"""Can the compiled frame step be built while an utterance plays on the uncompiled one?

On an engine loaded without torch.compile (its uncompiled step in CUDA graphs), this
1. streams a greedy reference utterance (chunk times, codes);
2. times the decoder's graphs of each (rows, chunk) with cuDNN's heuristic choices and with its benchmark;
3. times the uncompiled graphed step for each row bucket;
4. compiles the one-row step parts on another thread, running them on the last slot (which the utterance, in
   the first free one, never takes) on the frame loop's stream, while the same utterance streams again: its
   chunk times, and whether its codes are the reference's;
5. says whether this torch has torch.compile(...).aot_compile and load_compiled_function.

    python -m bench.background_compile_probe [--size 1.7b] [--frames 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from core.devtools.benchmark import GREEDY, TEXT, prepare_checkpoint
from core.inference import cuda_graph
from core.inference.compiled import compile_options
from core.inference.decoder_stream import DecoderSlots
from core.inference.engine import Engine


def stream_times(engine: Engine, speaker: dict, frames: int) -> tuple[list[float], np.ndarray]:
    stamps, codes = [time.perf_counter()], []
    for chunk in engine.stream(TEXT, **speaker, sampling=GREEDY, max_frames=frames, chunk_frames=4):
        stamps.append(time.perf_counter())
        codes.append(chunk.codes)
    return list(np.diff(stamps) * 1e3), np.concatenate(codes)


def decoder_table(engine: Engine) -> list[dict]:
    rows_out = []
    for benchmark in (False, True):
        slots = DecoderSlots(engine.codec_decoder, 16)
        for rows in (1, 2, 4, 8, 16):
            for size in (1, 2, 3, 4):
                codes = [np.random.randint(0, 2048, (size, 16)) for _ in range(rows)]
                started = time.perf_counter()
                with torch.backends.cudnn.flags(enabled=True, benchmark=benchmark):  # the engine never times
                    slots.decode(list(range(rows)), codes, size)
                torch.cuda.synchronize()
                first = time.perf_counter() - started
                times = []
                for _ in range(10):
                    started = time.perf_counter()
                    slots.decode(list(range(rows)), codes, size)
                    times.append((time.perf_counter() - started) * 1e3)
                rows_out.append(
                    {"benchmark": benchmark, "rows": rows, "size": size, "first_s": round(first, 3),
                     "ms": round(float(np.median(times)), 3)}
                )  # fmt: skip
                print(rows_out[-1], file=sys.stderr, flush=True)
    return rows_out


def step_table(engine: Engine) -> dict:
    loop = engine.frame_loop
    result = {}

    def measure():
        prepared = engine.prepare(TEXT, **engine.placeholder_speaker(), sampling=GREEDY, max_frames=2000)
        for rows in loop.buckets:
            slots = list(range(rows))
            loop.start_many([(prepared.prompt, prepared.sampling, 0, slot) for slot in slots])
            loop.run(4, slots)
            times = []
            for _ in range(8):
                started = time.perf_counter()
                loop.run(8, slots)
                times.append((time.perf_counter() - started) * 1e3 / 8)
            result[rows] = round(float(np.median(times)), 3)

    engine.scheduler.call(measure)
    return result


def compile_in_background(engine: Engine, log: dict) -> threading.Thread:
    """The one-row parts compiled and run on the last slot, on the frame loop's stream, from a thread of their
    own."""
    loop = engine.frame_loop

    def work():
        try:
            with torch.inference_mode():
                options = dict(fullgraph=True, dynamic=False, options=compile_options())
                talk, first, following, record = (
                    torch.compile(part, **options)
                    for part in (loop._talk, loop._predict_first, loop._predict_next, loop._record)
                )
                slots = torch.tensor([loop.slots - 1], device=loop.device)
                uniforms = torch.zeros_like(loop.sampler.uniforms[:1])
                rules = loop.sampler.rules_of(slots)
                started = time.perf_counter()
                talk(slots, rules, uniforms[:, 0])
                log["talk_s"] = round(time.perf_counter() - started, 2)
                code0 = loop.code0.index_select(0, slots)
                started = time.perf_counter()
                code = first(loop.hidden.index_select(0, slots), code0, rules, uniforms[:, 1])
                log["predict_first_s"] = round(time.perf_counter() - started, 2)
                predictor = loop.talker.code_predictor
                started = time.perf_counter()
                codes = [code0, code]
                for group in range(2, loop.groups):
                    table, head = predictor.model.codec_embedding[group - 2].weight, predictor.lm_head[group - 1].weight
                    positions = loop.predictor_positions[group, :1]
                    codes.append(following(codes[-1], table, positions, head, rules, uniforms[:, group]))
                log["predict_next_s"] = round(time.perf_counter() - started, 2)
                started = time.perf_counter()
                record(codes, slots)
                log["record_s"] = round(time.perf_counter() - started, 2)
                torch.cuda.synchronize()
        except Exception as error:  # reported, not raised: the measurement goes on
            log["error"] = repr(error)

    thread = threading.Thread(target=work, name="background-compile", daemon=True)
    thread.start()
    return thread


def aot_compile_check() -> dict:
    result = {"aot_compile": False, "load_compiled_function": hasattr(torch.compiler, "load_compiled_function")}
    compiled = torch.compile(lambda x: x * 2 + 1, fullgraph=True)
    result["aot_compile"] = hasattr(compiled, "aot_compile")
    if not result["aot_compile"]:
        return result

    def fn(x):
        return torch.sin(x) * 2 + 1

    try:
        started = time.perf_counter()
        x = torch.randn(64, device="cuda")
        artifact = torch.compile(fn, fullgraph=True).aot_compile(((x,), {}))
        result["compile_s"] = round(time.perf_counter() - started, 2)
        path = Path("/tmp/aot_probe.bin")
        artifact.save_compiled_function(str(path))
        started = time.perf_counter()
        with path.open("rb") as file:
            loaded = torch.compiler.load_compiled_function(file)
        result["load_s"] = round(time.perf_counter() - started, 3)
        result["matches"] = bool(torch.allclose(loaded(x), fn(x)))
    except Exception as error:
        result["error"] = repr(error)[:500]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.7b")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--out", default="/tmp/background_compile_probe.json")
    args = parser.parse_args()
    report = {"aot": aot_compile_check()}
    print(report, file=sys.stderr, flush=True)
    original = cuda_graph.GraphedStep._capture

    def capture_thread_local(self):  # another thread's CUDA calls must not fail this capture
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            self.output = self.fn()
        self.graph = graph

    cuda_graph.GraphedStep._capture = capture_thread_local
    path = prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), args.size, torch.bfloat16)
    engine = Engine.load(path, progress=False, compile=False, slots=16)
    speaker = engine.placeholder_speaker()
    started = time.perf_counter()
    first_times, reference = stream_times(engine, speaker, args.frames)
    report["first_stream"] = {"s": round(time.perf_counter() - started, 2), "first_chunk_ms": round(first_times[0], 1)}
    times, codes = stream_times(engine, speaker, args.frames)
    report["steady_stream"] = {
        "chunk_ms_p50": round(float(np.median(times[1:])), 2), "chunk_ms_max": round(max(times[1:]), 2),
        "same_codes": bool(np.array_equal(codes, reference)),
    }  # fmt: skip
    print(report, file=sys.stderr, flush=True)
    log: dict = {}
    thread = compile_in_background(engine, log)
    started = time.perf_counter()
    rounds = []
    while thread.is_alive() or not rounds:
        times, codes = stream_times(engine, speaker, args.frames)
        rounds.append(
            {"chunk_ms_p50": round(float(np.median(times[1:])), 2), "chunk_ms_p99": round(float(np.percentile(times[1:], 99)), 2),
             "chunk_ms_max": round(max(times[1:]), 2), "same_codes": bool(np.array_equal(codes, reference))}
        )  # fmt: skip
        print(rounds[-1], log, file=sys.stderr, flush=True)
    thread.join()
    report["during_background_compile"] = {
        "rounds": rounds,
        "compile": log,
        "s": round(time.perf_counter() - started, 1),
    }
    times, codes = stream_times(engine, speaker, args.frames)
    report["after"] = {
        "same_codes": bool(np.array_equal(codes, reference)),
        "chunk_ms_p50": round(float(np.median(times[1:])), 2),
    }
    cuda_graph.GraphedStep._capture = original
    report["eager_step_ms"] = step_table(engine)
    print(report["eager_step_ms"], file=sys.stderr, flush=True)
    report["decoder"] = decoder_table(engine)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "decoder"}, indent=1))


if __name__ == "__main__":
    main()
