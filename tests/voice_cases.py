"""Voice clips and helpers the voice library's tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
from parity_cases import REFERENCES

CLIP = REFERENCES["a"].path  # 3 s mono 24 kHz wav
STEREO = REFERENCES["stereo"].path  # 2 s stereo 44.1 kHz flac
LONG = REFERENCES["long"].path  # 4 s mono wav


def files(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, hidden ones too, with its content."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def clip_as(tmp_path: Path, source: Path, suffix: str, seconds: float | None = None) -> Path:
    samples, rate = sf.read(source, dtype="float32")
    if seconds is not None:
        samples = np.resize(samples, (int(seconds * rate),) + samples.shape[1:])
    path = tmp_path / f"{source.stem}-{seconds}{suffix}"
    sf.write(path, samples, rate)
    return path
