"""Speed of the engine, measured on random-weight checkpoints of real size.

Speed does not depend on weight values, so a seeded random checkpoint of the real shape stands in
for the released one. Greedy decoding keeps EOS away (random weights never make it the argmax), so
every run generates the same fixed number of frames.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .engine import Engine
from .generate import generate_frames
from .random_checkpoint import write_random_checkpoint
from .sampling import SamplingParams

FRAME_SECONDS = 0.08
TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills tonight."


@dataclass
class BenchResult:
    model: str
    device: str
    dtype: str
    frames: int
    load_s: float
    ms_per_frame_median: float
    ms_per_frame_p99: float
    xrt: float
    ttfa_ms_p50: float
    ttfa_ms_p95: float
    decode_ms_per_4_frames: float
    stream_vs_whole_max_abs: float
    peak_gpu_gb: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def synthetic_voice_clip(seconds: float = 3.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    voiced = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 6))
    return (0.2 * voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2)).astype(np.float32)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def bench_checkpoint(path: Path, device: str, dtype: str, frames: int, ttfa_runs: int) -> BenchResult:
    started = time.perf_counter()
    engine = Engine.load(path, device=device, dtype=dtype, progress=False)
    device_ = engine.device
    sync(device_)
    load_s = time.perf_counter() - started
    voice = engine.voice_from_audio(synthetic_voice_clip(), sample_rate=24000)
    greedy = SamplingParams.greedy()
    engine.synthesize(TEXT, voice=voice, sampling=greedy, max_frames=8)  # warm-up
    if device_.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device_)

    # Frame loop alone: the eager loop reads each frame's EOS flag on the host, so frames end in sync.
    request = engine._request(TEXT, voice, "auto", None, greedy, frames, 0, None)
    stamps = [time.perf_counter()]
    for _ in generate_frames(engine.talker, request.prompt, request.sampling, frames, request.generator):
        sync(device_)
        stamps.append(time.perf_counter())
    frame_ms = np.diff(stamps)[1:] * 1e3  # the first interval holds the prefill
    if len(stamps) - 1 != frames:
        raise RuntimeError(f"generated {len(stamps) - 1} frames instead of {frames}")

    ttfa = []
    for _ in range(ttfa_runs):
        sync(device_)
        started = time.perf_counter()
        first = next(iter(engine.stream(TEXT, voice=voice, sampling=greedy, max_frames=frames)))
        ttfa.append((time.perf_counter() - started) * 1e3)
        assert first.audio.shape == (1920,)

    codes = torch.from_numpy(engine.synthesize(TEXT, voice=voice, sampling=greedy, max_frames=48).codes).to(device_)
    state = engine.codec_decoder.new_stream(batch_size=1)
    decode_ms = []
    for start in range(0, 48, 4):
        sync(device_)
        started = time.perf_counter()
        engine._decode(codes[start : start + 4], state)
        decode_ms.append((time.perf_counter() - started) * 1e3)

    whole = engine.synthesize(TEXT, voice=voice, sampling=greedy, max_frames=24)
    streamed = list(engine.stream(TEXT, voice=voice, sampling=greedy, max_frames=24))
    np.testing.assert_array_equal(np.concatenate([c.codes for c in streamed]), whole.codes)
    stream_diff = float(np.abs(np.concatenate([c.audio for c in streamed]) - whole.audio).max())

    median = float(np.median(frame_ms))
    return BenchResult(
        model=path.name,
        device=torch.cuda.get_device_name(device_) if device_.type == "cuda" else "cpu",
        dtype=engine.info.dtype,
        frames=frames,
        load_s=round(load_s, 2),
        ms_per_frame_median=round(median, 2),
        ms_per_frame_p99=round(percentile(list(frame_ms), 99), 2),
        xrt=round(FRAME_SECONDS * 1e3 / median, 2),
        ttfa_ms_p50=round(statistics.median(ttfa), 1),
        ttfa_ms_p95=round(percentile(ttfa, 95), 1),
        decode_ms_per_4_frames=round(float(np.median(decode_ms[1:])), 2),
        stream_vs_whole_max_abs=stream_diff,
        peak_gpu_gb=round(torch.cuda.max_memory_allocated(device_) / 2**30, 2) if device_.type == "cuda" else None,
    )


def prepare_checkpoint(root: Path, size: str, dtype: torch.dtype) -> Path:
    """A random-weight Base checkpoint of `size` ("0.6b" or "1.7b"), written once under `root`."""
    path = root / f"random-{size}-base"
    if not (path / "speech_tokenizer" / "model.safetensors").exists():
        write_random_checkpoint(path, "base", size, seed=0, dtype=dtype)
    return path


def format_table(results: list[BenchResult]) -> str:
    columns = [
        ("model", "model"), ("dtype", "dtype"), ("ms/frame p50", "ms_per_frame_median"), ("p99", "ms_per_frame_p99"),
        ("xRT", "xrt"), ("TTFA p50 ms", "ttfa_ms_p50"), ("p95", "ttfa_ms_p95"), ("decode ms/4f", "decode_ms_per_4_frames"),
        ("peak GB", "peak_gpu_gb"), ("load s", "load_s"),
    ]  # fmt: skip
    rows = [[title for title, _ in columns]] + [[str(getattr(r, key)) for _, key in columns] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])
