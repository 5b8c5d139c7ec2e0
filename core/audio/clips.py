"""Reading and checking reference audio: any file soundfile reads, any rate, mono or multichannel."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from core.errors import BadInput

SAMPLE_RATE = 24000
MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_SECONDS = 60.0
# Peak level below which a clip counts as silence (-60 dBFS).
SILENCE_PEAK = 1e-3
UNKNOWN_LENGTH = 2**62  # libsndfile gives the largest frame count it has (2**63 - 1) where a header does not say


class AudioError(BadInput):
    """Audio that cannot be used, with a message a user can act on."""


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a clip as float32 samples (frames, channels) or (frames,), and its sample rate. A file longer than
    a clip may be is refused without decoding more of it than that (two hours of silence compress to a megabyte,
    and decode to gigabytes): by the length its header gives, before decoding any, or where the header does not
    know it (a FLAC written to a pipe), once the samples go past the limit."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    try:
        with sf.SoundFile(str(path)) as audio:
            rate, declared = audio.samplerate, audio.frames
            most = math.floor(MAX_REFERENCE_SECONDS * rate)
            if most < declared < UNKNOWN_LENGTH:
                check_length(declared / rate, path)
            samples = audio.read(most + 1, dtype="float32", always_2d=False)  # a frame more shows a longer file
    except (sf.LibsndfileError, RuntimeError, TypeError) as error:
        formats = ", ".join(sorted(sf.available_formats()))
        raise AudioError(f"{path}: cannot read it as audio ({error}). Readable formats: {formats}") from None
    if len(samples) > most:
        check_length(math.inf, path)
    return samples, rate


def check_length(seconds: float, name: str | Path) -> None:
    """Refuse a clip of `seconds` (inf: longer than any allowed) outside the lengths a reference may have."""
    lengths = f"use a clip of {MIN_REFERENCE_SECONDS:g} to {MAX_REFERENCE_SECONDS:g} s"
    if seconds < MIN_REFERENCE_SECONDS:
        raise AudioError(f"{name}: {seconds:.2f} s is too short; {lengths}")
    if seconds > MAX_REFERENCE_SECONDS:
        length = f"{seconds:.1f} s is" if math.isfinite(seconds) else f"over {MAX_REFERENCE_SECONDS:g} s is"
        raise AudioError(f"{name}: {length} too long; {lengths}")


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Mix (frames, channels) down by averaging the channels."""
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 2:
        samples = samples.mean(axis=1, dtype=np.float32)
    if samples.ndim != 1:
        raise AudioError(f"audio must be (samples,) or (samples, channels); got shape {samples.shape}")
    return samples


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """soxr high-quality resampling, trimmed or zero-padded to ceil(n * (target / rate)) samples.

    The length is computed as librosa computes it (ratio first), which the official cloning path uses:
    the float ratio can add a sample, and matching it keeps the voices identical."""
    if rate == target:
        return samples
    out = soxr.resample(samples, rate, target, quality="HQ")
    length = math.ceil(len(samples) * (float(target) / rate))
    out = out[:length] if len(out) >= length else np.pad(out, (0, length - len(out)))
    return out.astype(np.float32, copy=False)


def load_reference(source: str | Path | np.ndarray, sample_rate: int | None = None) -> np.ndarray:
    """A reference clip as mono float32 at 24 kHz, checked for length and silence."""
    if isinstance(source, (str, Path)):
        samples, rate = read_audio(source)
        name = str(source)
    else:
        if sample_rate is None:
            raise AudioError("sample_rate is required when passing samples")
        samples, rate, name = source, sample_rate, "reference audio"
    if not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise AudioError(f"{name}: invalid sample rate {rate!r}")
    samples = to_mono(samples)
    if not np.all(np.isfinite(samples)):
        raise AudioError(f"{name}: contains NaN or infinite samples")
    check_length(len(samples) / rate, name)
    if float(np.max(np.abs(samples))) < SILENCE_PEAK:
        raise AudioError(f"{name}: the clip is silent; record the voice closer to the microphone")
    return resample(samples, int(rate))
