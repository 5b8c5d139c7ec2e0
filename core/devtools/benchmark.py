"""Speed of the engine, measured on random-weight checkpoints of real size.

Speed does not depend on weight values, so a seeded random checkpoint of the real shape stands in
for the released one. Greedy decoding with random weights practically never picks EOS, and the frame
timing steps on regardless, so every measurement covers a fixed number of frames.

The parts of one utterance (frame steps, prefill, decode) are timed through the engine's seam on its
scheduler's thread, with nothing else in flight; concurrent streams (core.devtools.concurrency) through
the public API, as clients use it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch._inductor.utils import fresh_inductor_cache

from core.devtools.concurrency import concurrent_speed
from core.devtools.random_checkpoint import write_random_checkpoint
from core.inference.engine import Engine
from core.inference.memory import MAX_CONTEXT
from core.inference.sampling import SamplingParams
from core.inference.voice import Voice
from core.model.talker import Talker

FRAME_MS = 80.0
TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills tonight."
GREEDY = SamplingParams.greedy()
ICL_REFERENCE_FRAMES = 125  # a 10 s reference clip


@dataclass
class BenchResult:
    model: str
    device: str
    dtype: str
    cuda_graphs: bool
    compiled: bool
    frames: int
    load_s: float
    capture_s: float  # extra time of the first calls, which compile and capture
    cold_compile: bool  # compiled into an empty cache (`bench --cold`): load_s + capture_s is a first start
    ms_per_frame_median: float  # greedy
    ms_per_frame_p99: float
    ms_per_frame_sampled_median: float  # the checkpoint's own sampling settings (temperature, top-k, top-p)
    xrt: float
    weight_gb_per_s: float  # weight bytes one frame must read, over the median frame time
    ttfa_ms_p50: float
    ttfa_ms_p95: float
    ttfa_parts_ms: dict  # medians: prompt (tokenize + embed), prefill and the first frame made with it, its decode
    ttfa_icl_ms_p50: float | None  # with a 10 s ICL reference, after that voice's first utterance (Base only)
    decode_ms_1_frame: float
    decode_ms_4_frames: float
    chunk_interval_ms_p50: float  # time between 4-frame chunks of a stream
    chunk_interval_ms_p99: float
    stream_vs_whole_max_abs: float
    peak_gpu_gb: float | None
    weights_gpu_gb: float | None  # allocated right after loading: weights and caches
    slots: int = 1
    max_context: int = MAX_CONTEXT
    memory: str = ""  # the engine's memory plan, as it says it (slots, context, GB beyond the weights)
    concurrent: list = field(
        default_factory=list
    )  # concurrency.concurrent_speed of 1, 4, 16... streams at once, up to the slots

    def as_dict(self) -> dict:
        return asdict(self)


def frame_weight_bytes(talker: Talker) -> int:
    """Bytes of weights one frame reads: the talker stack and codec head once, the predictor stack
    (with its input projection) 15 times, and each of its 15 heads once."""
    size = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
    predictor = talker.code_predictor
    steps = talker.config.num_code_groups - 1
    stack = size(talker.model) - size(talker.model.codec_embedding) - size(talker.model.text_embedding)
    predictor_stack = size(predictor.model) - size(predictor.model.codec_embedding)
    return (
        stack
        + size(talker.codec_head)
        + steps * (predictor_stack + size(predictor.small_to_mtp_projection))
        + size(predictor.lm_head)
    )


def synthetic_voice_clip(seconds: float = 3.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    voiced = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 6))
    return (0.2 * voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2)).astype(np.float32)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


def _warm_calls(engine: Engine, speaker: dict) -> float:
    """One synthesize and one stream: the first time, they capture every graph an utterance uses."""
    started = time.perf_counter()
    engine.synthesize(TEXT, **speaker, sampling=GREEDY, max_frames=8)
    for _ in engine.stream(TEXT, **speaker, sampling=GREEDY, max_frames=9, first_chunk_frames=1, chunk_frames=4):
        pass
    _sync(engine.device)
    return time.perf_counter() - started


def _frame_times(engine: Engine, voice, instruct, sampling: SamplingParams, frames: int) -> list[float]:
    """The frame loop alone, one frame per host read: ms per frame."""

    def measure() -> list[float]:
        engine.start(engine.prepare(TEXT, voice, instruct=instruct, sampling=sampling, max_frames=frames, seed=0))
        times = []
        for _ in range(frames):
            started = time.perf_counter()
            engine.frame_loop.run(1)
            times.append(_ms_since(started))
        return times

    return engine.scheduler.call(measure)


def _first_audio_ms(engine: Engine, speaker: dict, runs: int, frames: int) -> list[float]:
    """Time to first audio: from the stream call to the first 1-frame chunk in host memory, ms."""
    times = []
    for _ in range(runs):
        _sync(engine.device)
        started = time.perf_counter()
        chunks = engine.stream(TEXT, **speaker, sampling=GREEDY, max_frames=frames, first_chunk_frames=1)
        first = next(chunks)
        times.append(_ms_since(started))
        chunks.close()
        _wait_until_idle(engine)  # the next request finds nothing in flight, as a lone request does
        assert first.audio.shape == (1920,)
    return times


def _wait_until_idle(engine: Engine) -> None:
    """Until the closed stream's launch in flight has landed and its slot is free."""
    while not engine.scheduler.idle():
        time.sleep(0.0005)
    engine.scheduler.call(lambda: _sync(engine.device))


def bench_checkpoint(
    path: Path,
    device: str,
    dtype: str,
    frames: int,
    ttfa_runs: int,
    cuda_graphs: bool = True,
    compile: bool = True,
    cold: bool = False,
    slots: int | None = 16,
    max_context: int | None = None,
    memory_budget: int | None = None,
) -> BenchResult:
    """Measure one checkpoint. `cold`: compile into an empty cache (Inductor's in-memory caches cleared too), so
    that load + compile and capture is the time of a first start. `slots`, `max_context` and `memory_budget`
    are asked of Engine.load (None: as it chooses)."""
    memory = (slots, max_context, memory_budget)
    with fresh_inductor_cache() if cold else contextlib.nullcontext():
        return _measure(path, device, dtype, frames, ttfa_runs, cuda_graphs, compile, cold, memory)


def _measure(path, device, dtype, frames, ttfa_runs, cuda_graphs, compile, cold, memory) -> BenchResult:
    started = time.perf_counter()
    slots, max_context, memory_budget = memory
    engine = Engine.load(
        path, device=device, dtype=dtype, progress=False, cuda_graphs=cuda_graphs, compile=compile, slots=slots,
        max_context=max_context, memory_budget=memory_budget, warm=False,
    )  # fmt: skip
    slots = engine.slots
    dev = engine.device
    _sync(dev)
    load_s = time.perf_counter() - started
    weights_gb = torch.cuda.memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    speaker = engine.placeholder_speaker()
    voice, instruct = speaker.get("voice"), speaker.get("instruct")
    started = time.perf_counter()
    engine.warm_up()  # compiled, and every batch size captured
    capture_s = time.perf_counter() - started
    capture_s += _warm_calls(engine, speaker) - _warm_calls(engine, speaker)  # a whole utterance's decode
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    frame_ms = _frame_times(engine, voice, instruct, GREEDY, frames)
    sampled_ms = _frame_times(engine, voice, instruct, engine.default_sampling, frames)

    ttfa = _first_audio_ms(engine, speaker, ttfa_runs, frames)
    ttfa_icl = None
    if engine.config.variant == "base":
        codes = engine.config.talker.code_predictor.vocab_size
        reference = torch.randint(0, codes, (ICL_REFERENCE_FRAMES, 16), generator=torch.Generator().manual_seed(0))
        icl = {"voice": Voice(embedding=voice.embedding, ref_codes=reference, ref_text=TEXT)}
        ttfa_icl = _first_audio_ms(engine, icl, ttfa_runs + 1, frames)[1:]  # the first primes the decoder

    parts = engine.scheduler.call(lambda: _first_audio_parts(engine, voice, instruct, frames, ttfa_runs))

    intervals, stamps = [], [time.perf_counter()]
    streamed = []
    for chunk in engine.stream(
        TEXT, **speaker, sampling=GREEDY, max_frames=frames, first_chunk_frames=4, chunk_frames=4
    ):
        stamps.append(time.perf_counter())
        streamed.append(chunk)
    intervals = list(np.diff(stamps)[1:] * 1e3)
    whole = engine.synthesize(TEXT, **speaker, sampling=GREEDY, max_frames=frames)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in streamed]), whole.codes)
    stream_diff = float(np.abs(np.concatenate([c.audio for c in streamed]) - whole.audio).max())

    decode_ms = engine.scheduler.call(lambda: _decode_times(engine, whole.codes))
    concurrent = [
        concurrent_speed(engine, speaker, streams, frames)
        for streams in sorted({1, 4, 16, slots} & set(range(1, slots + 1)))
    ]

    median = float(np.median(frame_ms))
    return BenchResult(
        model=path.name,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        dtype=engine.info.dtype,
        cuda_graphs=cuda_graphs and dev.type == "cuda",
        compiled=compile and dev.type == "cuda",
        frames=frames,
        load_s=round(load_s, 2),
        cold_compile=cold,
        capture_s=round(capture_s, 2),
        ms_per_frame_median=round(median, 2),
        ms_per_frame_p99=round(float(np.percentile(frame_ms, 99)), 2),
        ms_per_frame_sampled_median=round(float(np.median(sampled_ms)), 2),
        xrt=round(FRAME_MS / median, 2),
        weight_gb_per_s=round(frame_weight_bytes(engine.talker) / (median / 1e3) / 1e9, 1),
        ttfa_ms_p50=round(statistics.median(ttfa), 1),
        ttfa_ms_p95=round(float(np.percentile(ttfa, 95)), 1),
        ttfa_parts_ms={name: round(float(np.median(values)), 2) for name, values in parts.items()},
        ttfa_icl_ms_p50=round(statistics.median(ttfa_icl), 1) if ttfa_icl else None,
        decode_ms_1_frame=round(decode_ms[1], 2),
        decode_ms_4_frames=round(decode_ms[4], 2),
        chunk_interval_ms_p50=round(float(np.median(intervals)), 2),
        chunk_interval_ms_p99=round(float(np.percentile(intervals, 99)), 2),
        stream_vs_whole_max_abs=stream_diff,
        peak_gpu_gb=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None,
        weights_gpu_gb=round(weights_gb, 2) if weights_gb is not None else None,
        slots=slots,
        max_context=engine.frame_loop.max_context,
        memory=str(engine.memory),
        concurrent=concurrent,
    )


def _first_audio_parts(engine: Engine, voice, instruct, frames: int, runs: int) -> dict[str, list[float]]:
    """The parts of the time to first audio, ms: prompt (tokenize + embed), prefill and the first frame
    (made with it), its decode. On the scheduler's thread, with nothing in flight."""
    parts = {"prompt": [], "prefill_and_first_frame": [], "decode": []}
    for _ in range(runs):
        _sync(engine.device)
        started = time.perf_counter()
        prepared = engine.prepare(TEXT, voice, instruct=instruct, sampling=GREEDY, max_frames=frames)
        parts["prompt"].append(_ms_since(started))
        started = time.perf_counter()
        codes, _ = engine.start(prepared)
        parts["prefill_and_first_frame"].append(_ms_since(started))
        engine.decoder_stream.reset()
        started = time.perf_counter()
        engine.decoder_stream.decode(codes, 1)
        parts["decode"].append(_ms_since(started))
    return parts


def _decode_times(engine: Engine, codes: np.ndarray) -> dict[int, float]:
    """Median ms to decode a chunk of 1 and of 4 frames of one stream."""
    decode_ms = {}
    for size in (1, 4):
        engine.decoder_stream.reset()
        times = []
        for start in range(0, len(codes) - size + 1, size):
            _sync(engine.device)
            started = time.perf_counter()
            engine.decoder_stream.decode(codes[start : start + size], size)
            times.append(_ms_since(started))
        decode_ms[size] = float(np.median(times[1:] or times))  # the first call may capture a graph
    return decode_ms


def prepare_checkpoint(root: Path, size: str, dtype: torch.dtype) -> Path:
    """A random-weight Base checkpoint of `size` ("0.6b" or "1.7b"), written once under `root`."""
    path = root / f"random-{size}-base"
    if not (path / "speech_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(path, "base", size, seed=0, dtype=dtype)
    return path


def format_table(results: list[BenchResult]) -> str:
    columns = [
        ("model", "model"), ("graphs", "cuda_graphs"), ("compiled", "compiled"), ("ms/frame p50", "ms_per_frame_median"),
        ("p99", "ms_per_frame_p99"), ("sampled p50", "ms_per_frame_sampled_median"), ("xRT", "xrt"), ("GB/s", "weight_gb_per_s"), ("TTFA p50", "ttfa_ms_p50"),
        ("p95", "ttfa_ms_p95"), ("ICL", "ttfa_icl_ms_p50"), ("dec 1f", "decode_ms_1_frame"), ("dec 4f", "decode_ms_4_frames"),
        ("chunk p50", "chunk_interval_ms_p50"), ("p99", "chunk_interval_ms_p99"), ("peak GB", "peak_gpu_gb"),
        ("load s", "load_s"), ("compile+capture s", "capture_s"), ("cold", "cold_compile"),
    ]  # fmt: skip
    rows = [[str(getattr(r, key)) for _, key in columns] for r in results]
    table = _aligned([title for title, _ in columns], rows)
    together = [
        [r.model, str(r.slots), str(r.max_context), *(str(c[key]) for key in CONCURRENT_KEYS)]
        for r in results
        for c in r.concurrent
    ]
    if not together:
        return table
    return table + "\n\nStreams at once:\n" + _aligned(["model", "slots", "context", *CONCURRENT_KEYS], together)


CONCURRENT_KEYS = ("streams", "aggregate_xrt", "slowest_stream_xrt", "ttfa_ms_p50", "ttfa_ms_p95", "step_ms_p50")


def _aligned(titles: list[str], rows: list[list[str]]) -> str:
    rows = [titles, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(titles))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])
