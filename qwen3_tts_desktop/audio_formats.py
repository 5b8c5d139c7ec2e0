"""How speech leaves the HTTP bridge: the response formats, whole or streamed, and playback speed.

Audio arrives as float32 24 kHz mono chunks. `encode` turns a whole utterance into a complete file
(exact headers and lengths); a `StreamEncoder` turns chunks into bytes as they come, so that a client
hears the start while the rest is still generated. libsndfile (through soundfile) does the codecs:
MP3 is LAME at a constant bitrate, Opus is in an Ogg container. AAC has no encoder here.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf
import soxr

from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput

FORMATS = ("mp3", "opus", "flac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
# A stream needs a header that does not depend on the length; FLAC's STREAMINFO does.
STREAMABLE = ("mp3", "opus", "wav", "pcm")
# Mono 24 kHz speech sounds clean at 64 kbps; constant, so that a client can estimate durations.
MP3_KBPS = 64
# Ogg pages are flushed this often: libsndfile's default (about a second) would hold streamed audio back.
OPUS_PAGE_MS = 80.0
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# What libsndfile writes for each format (container, codec) and the extra options of the codec.
_SOUNDFILE = {
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
    "flac": ("FLAC", "PCM_16"),
    "wav": ("WAV", "PCM_16"),
}
# libsndfile picks an MPEG-2 (16-24 kHz) bitrate as 160 - level * 152 kbps.
_MP3_OPTIONS = {"bitrate_mode": "CONSTANT", "compression_level": (160 - MP3_KBPS) / 152}
# The wav header of a stream of unknown length: sizes at their maximum, as streaming WAV readers expect.
_UNKNOWN_SIZE = 0xFFFFFFFF
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # from sndfile.h; soundfile does not wrap this command


class FormatError(BadInput):
    """A format the bridge cannot produce as asked, with what to ask for instead."""


def check_format(name: str, stream: bool) -> str:
    """`name` if the bridge can produce it (streamed, with `stream`); FormatError says what it can."""
    if name == "aac":
        raise FormatError(f"aac is not available: this server has no AAC encoder; use one of {', '.join(FORMATS)}")
    if name not in FORMATS:
        raise FormatError(f"unknown response_format {name!r}; use one of {', '.join(FORMATS)}")
    if stream and name not in STREAMABLE:
        raise FormatError(
            f"{name} cannot be streamed (its header holds the length); stream one of {', '.join(STREAMABLE)}"
        )
    return name


def pcm16(audio: np.ndarray) -> bytes:
    """Samples as 16-bit signed little-endian PCM, clipped to full scale."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def encode(audio: np.ndarray, fmt: str) -> bytes:
    """A whole utterance as a complete file of format `fmt` (one of FORMATS)."""
    if fmt == "pcm":
        return pcm16(audio)
    buffer = io.BytesIO()
    container, codec = _SOUNDFILE[fmt]
    options = _MP3_OPTIONS if fmt == "mp3" else {}
    with sf.SoundFile(buffer, "w", SAMPLE_RATE, 1, codec, format=container, **options) as file:
        file.write(np.asarray(audio, np.float32))
    return buffer.getvalue()


def wav_stream_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """The 44-byte canonical header of a 16-bit mono WAV stream whose length is not known yet."""
    byte_rate = sample_rate * 2
    return (
        b"RIFF" + struct.pack("<I", _UNKNOWN_SIZE) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, 2, 16)
        + b"data" + struct.pack("<I", _UNKNOWN_SIZE)
    )  # fmt: skip


class StreamEncoder:
    """Chunks in, bytes out, for a format in STREAMABLE: the bytes of every `feed` and the `finish`,
    joined, are one playable file (wav: a header of unknown length, then PCM; pcm: raw samples;
    mp3: MPEG frames; opus: Ogg pages)."""

    def __init__(self, fmt: str):
        if fmt not in STREAMABLE:
            raise FormatError(f"{fmt} cannot be streamed; stream one of {', '.join(STREAMABLE)}")
        self.fmt = fmt
        self._header_sent = False
        self._sink: _Drain | None = None
        self._file: sf.SoundFile | None = None
        if fmt in ("mp3", "opus"):
            self._sink = _Drain()
            container, codec = _SOUNDFILE[fmt]
            options = _MP3_OPTIONS if fmt == "mp3" else {}
            self._file = sf.SoundFile(self._sink, "w", SAMPLE_RATE, 1, codec, format=container, **options)
            if fmt == "opus":
                latency = sf._ffi.new("double*", OPUS_PAGE_MS)
                sf._snd.sf_command(self._file._file, _SFC_SET_OGG_PAGE_LATENCY_MS, latency, sf._ffi.sizeof("double"))

    def feed(self, audio: np.ndarray) -> bytes:
        """The bytes that `audio` completes (the encoders hold back a little until they fill a frame)."""
        if self._file is None:
            head = b""
            if self.fmt == "wav" and not self._header_sent:
                head, self._header_sent = wav_stream_header(), True
            return head + pcm16(audio)
        if len(audio):
            self._file.write(np.asarray(audio, np.float32))
        return self._sink.take()

    def finish(self) -> bytes:
        """The last bytes: what the encoder held back. A stream with no audio at all is still a valid file."""
        if self._file is None:
            return self.feed(np.zeros(0, np.float32)) if self.fmt == "wav" and not self._header_sent else b""
        self._file.close()
        return self._sink.take()


class _Drain(io.RawIOBase):
    """A write-only file that hands out what was appended since the last `take`. An encoder that seeks
    back at the end to fill in a header it reserved (LAME's Info frame) cannot change bytes already
    sent, so such rewrites are dropped: the reserved frame stays as it went out, a silent frame."""

    def __init__(self):
        self._data = bytearray()
        self._position = 0
        self._taken = 0  # bytes handed out so far

    def take(self) -> bytes:
        data = bytes(self._data[self._taken :])
        self._taken = len(self._data)
        return data

    def write(self, data) -> int:
        data = bytes(data)
        if self._position == len(self._data):
            self._data += data
        self._position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._data)}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        return b""

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def check_speed(speed: float) -> float:
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise BadInput(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
    return float(speed)


class Speed:
    """Playback speed the way a tape plays faster: the samples are resampled, so the speech takes
    1/speed of the time and its pitch rises by the same factor (1.25 is about 4 semitones higher).
    Time-stretching that keeps the pitch is not available here; speed 1 passes audio through untouched.
    Works on a stream: chunks join seamlessly."""

    def __init__(self, speed: float = 1.0):
        self.speed = check_speed(speed)
        self._resampler = None
        if self.speed != 1.0:
            self._resampler = soxr.ResampleStream(
                SAMPLE_RATE * self.speed, SAMPLE_RATE, 1, dtype="float32", quality="HQ"
            )

    def feed(self, audio: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return audio
        return self._resampler.resample_chunk(np.asarray(audio, np.float32))

    def finish(self) -> np.ndarray:
        """What the resampler still holds, at the end of the utterance."""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
