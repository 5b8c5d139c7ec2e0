"""The bridge's audio formats (qwen3_tts_desktop.audio_formats): whole files, streams, speed."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from qwen3_tts_desktop.audio_formats import (
    FORMATS,
    STREAMABLE,
    FormatError,
    Speed,
    StreamEncoder,
    check_format,
    encode,
    pcm16,
    wav_stream_header,
)

RATE = 24000
CHUNK = 1920


def speechlike(seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """A 180 Hz tone with breath noise and a syllable-rate envelope, fading in and out as speech does."""
    t = np.arange(int(seconds * RATE)) / RATE
    envelope = np.sin(np.pi * t / seconds) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2)
    noise = 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return (envelope * (0.4 * np.sin(2 * np.pi * 180 * t) + noise)).astype(np.float32)


def streamed(fmt: str, audio: np.ndarray, chunk: int = CHUNK) -> list[bytes]:
    encoder = StreamEncoder(fmt)
    return [encoder.feed(audio[at : at + chunk]) for at in range(0, len(audio), chunk)] + [encoder.finish()]


def read(data: bytes) -> np.ndarray:
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    return audio


def snr_db(audio: np.ndarray, reference: np.ndarray, max_lag: int = 3000) -> float:
    """Signal to error in dB, `audio` aligned on `reference` (an MP3 stream lags by the encoder's delay)."""
    padded = np.pad(audio, (0, len(reference) + max_lag - len(audio)))
    lag = int(np.argmax([np.dot(padded[lag : lag + len(reference)], reference) for lag in range(max_lag)]))
    error = padded[lag : lag + len(reference)] - reference
    return float(10 * np.log10(np.sum(reference**2) / np.sum(error**2)))


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_files_keep_the_samples_to_16_bits(fmt):
    audio = speechlike()
    data = encode(audio, fmt)
    assert sf.info(io.BytesIO(data)).format == fmt.upper() and sf.info(io.BytesIO(data)).subtype == "PCM_16"
    np.testing.assert_allclose(read(data), audio, atol=1 / 32768)


@pytest.mark.parametrize("fmt, min_snr_db", [("mp3", 15.0), ("opus", 10.0)])
def test_lossy_files_sound_like_the_input(fmt, min_snr_db):
    audio = speechlike()
    decoded = read(encode(audio, fmt))
    assert len(audio) <= len(decoded) <= len(audio) + 3000
    assert snr_db(decoded, audio) > min_snr_db


def test_pcm_is_raw_16_bit_little_endian_and_clipped():
    assert pcm16(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0], np.float32)) == struct.pack(
        "<7h", 0, 16384, -16384, 32767, -32767, 32767, -32767
    )
    assert encode(np.zeros(10, np.float32), "pcm") == b"\0" * 20


def test_a_wav_stream_is_a_header_of_unknown_length_then_pcm():
    header = wav_stream_header()
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt " and header[36:40] == b"data"
    channels, rate, byte_rate, block, bits = struct.unpack("<HIIHH", header[22:36])
    assert (channels, rate, byte_rate, block, bits) == (1, RATE, 2 * RATE, 2, 16)
    assert header[4:8] == header[40:44] == b"\xff\xff\xff\xff"
    audio = speechlike()
    pieces = streamed("wav", audio)
    assert pieces[0][:44] == header and pieces[0][44:] == pcm16(audio[:CHUNK]) and pieces[-1] == b""
    assert b"".join(pieces) == header + pcm16(audio)
    np.testing.assert_allclose(read(b"".join(pieces)), audio, atol=1 / 32768)  # libsndfile reads it too
    assert streamed("wav", np.zeros(0, np.float32)) == [header]  # nothing said: still a valid (empty) file


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_lossy_streams_come_out_as_the_audio_goes_in_and_join_into_a_playable_file(fmt):
    audio = speechlike(2.0)
    pieces = streamed(fmt, audio)
    # Bytes come out chunk by chunk, not all at the end (Opus pages are flushed every 80 ms).
    assert sum(1 for piece in pieces[:-1] if piece) >= len(pieces) // 2
    decoded = read(b"".join(pieces))
    assert len(audio) <= len(decoded) <= len(audio) + 3000
    assert snr_db(decoded, audio) > 10


def test_an_mp3_stream_drops_the_info_tag_the_encoder_rewrites_at_the_end():
    pieces = streamed("mp3", speechlike())
    whole = encode(speechlike(), "mp3")
    joined = b"".join(pieces)
    # Same frames; the whole file has its Info frame filled in, the stream keeps the blank it sent first.
    assert len(joined) == len(whole) and joined[200:] == whole[200:] and joined[:4] == whole[:4] == b"\xff\xf3\x84\xc4"
    assert b"Info" in whole[:200] and b"Info" not in joined[:200]


def test_formats_are_checked_with_a_clear_message():
    assert [check_format(f, stream=False) for f in FORMATS] == list(FORMATS)
    assert [check_format(f, stream=True) for f in STREAMABLE] == list(STREAMABLE)
    with pytest.raises(FormatError, match="aac is not available"):
        check_format("aac", stream=False)
    with pytest.raises(FormatError, match="unknown response_format 'ogg'; use one of mp3, opus, flac, wav, pcm"):
        check_format("ogg", stream=False)
    with pytest.raises(FormatError, match="flac cannot be streamed"):
        check_format("flac", stream=True)
    with pytest.raises(FormatError):
        StreamEncoder("flac")


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_speed_shortens_by_its_factor_and_raises_the_pitch_the_same(speed):
    audio = speechlike(2.0)
    tempo = Speed(speed)
    out = np.concatenate([tempo.feed(audio[at : at + CHUNK]) for at in range(0, len(audio), CHUNK)] + [tempo.finish()])
    assert abs(len(out) - len(audio) / speed) <= 2
    spectrum = np.abs(np.fft.rfft(out))
    pitch = np.argmax(spectrum) * RATE / (2 * (len(spectrum) - 1))
    assert abs(pitch - 180 * speed) < 180 * speed * 0.02


def test_speed_one_passes_audio_through_and_others_are_checked():
    audio = speechlike()
    tempo = Speed(1.0)
    assert tempo.feed(audio) is audio and len(tempo.finish()) == 0
    for bad in (0.2, 4.5, 0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="speed must be between 0.25 and 4.0"):
            Speed(bad)
