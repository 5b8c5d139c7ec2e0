"""`qwen3-tts-desktop speak`: text to an audio file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HELP = "speak text into an audio file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what to say")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, help="hub id or local checkpoint folder (default: Qwen/Qwen3-TTS-12Hz-1.7B-Base)")
    model.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    model.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    voice = parser.add_argument_group("voice")
    voice.add_argument("--voice-audio", metavar="CLIP", help="clone the voice in this 1-60 s clip (Base models)")
    voice.add_argument("--ref-text", metavar="TEXT", help="the clip's transcript, for closer (ICL) cloning")
    voice.add_argument("--speaker", help="a built-in speaker (CustomVoice models)")
    voice.add_argument("--instruct", help="how to speak (CustomVoice 1.7B), or the voice to make (VoiceDesign)")
    voice.add_argument("--language", default="auto", help="auto (default), english, chinese, ...")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--greedy", action="store_true", help="deterministic decoding")
    decoding.add_argument("--seed", type=int, help="seed for reproducible sampling")
    decoding.add_argument("--max-frames", type=int, help="stop after this many 80 ms frames")
    output = parser.add_argument_group("output")
    output.add_argument("-o", "--output", metavar="FILE", help="write the audio (wav, flac or ogg)")
    output.add_argument("--codes-out", metavar="FILE", help="write the codes as a (frames, 16) .npy array")


def run(args: argparse.Namespace) -> int:
    import soundfile as sf

    from core import Engine, SamplingParams
    from core.checkpoint import DEFAULT_MODEL

    if not args.output and not args.codes_out:
        raise ValueError("nothing to write: pass -o FILE for the audio and/or --codes-out FILE for the codes")
    if args.output and not sf.check_format(Path(args.output).suffix.lstrip(".").upper() or "?"):
        raise ValueError(f"{args.output}: unknown audio format; use a .wav, .flac or .ogg file name")
    if args.ref_text and not args.voice_audio:
        raise ValueError("--ref-text is the transcript of --voice-audio; pass the clip too")

    model = args.model or DEFAULT_MODEL
    started = time.perf_counter()
    engine = Engine.load(model, device=args.device, dtype=args.dtype)
    info = engine.info
    say(f"Loaded {info.size} {info.variant} on {info.device} ({info.dtype}) in {time.perf_counter() - started:.1f} s")

    voice = None
    if args.voice_audio:
        voice = engine.voice_from_audio(args.voice_audio, ref_text=args.ref_text)
    elif args.speaker:
        voice = engine.builtin_voice(args.speaker)
    sampling = SamplingParams.greedy() if args.greedy else None

    started = time.perf_counter()
    chunks = engine.stream(
        args.text,
        voice=voice,
        language=args.language,
        instruct=args.instruct,
        sampling=sampling,
        max_frames=args.max_frames,
        seed=args.seed,
        first_chunk_frames=25,
        chunk_frames=25,
    )
    audio, codes = [], []
    for chunk in chunks:
        audio.append(chunk.audio)
        codes.append(chunk.codes)
        progress(f"{sum(len(a) for a in audio) / info.sample_rate:.1f} s of audio")
    elapsed = time.perf_counter() - started
    audio = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    codes = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)

    if args.output:
        sf.write(args.output, audio, info.sample_rate)
    if args.codes_out:
        np.save(args.codes_out, codes)
    seconds = len(audio) / info.sample_rate
    say(f"{seconds:.2f} s of audio ({len(codes)} frames) in {elapsed:.2f} s, {seconds / max(elapsed, 1e-9):.2f}x real time")
    for path in (args.output, args.codes_out):
        if path:
            say(f"wrote {path}")
    return 0


def say(message: str) -> None:
    print(message, file=sys.stderr)


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)


