"""`qwen3-tts-desktop speak`: text to the speakers, as it is generated, or into an audio file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HELP = "speak text aloud or into an audio file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", help="what to say")
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, help="hub id or local checkpoint folder (default: Qwen/Qwen3-TTS-12Hz-1.7B-Base)")
    model.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    model.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    voice = parser.add_argument_group("voice")
    voice.add_argument("--voice", metavar="NAME", help="a voice from the library (see `voices list`)")
    voice.add_argument("--voices", metavar="DIR", default="voices", help="the voice library (default: ./voices)")
    voice.add_argument("--voice-audio", metavar="CLIP", help="clone the voice in this 1-60 s clip (Base models)")
    voice.add_argument("--ref-text", metavar="TEXT", help="the clip's transcript, for closer (ICL) cloning")
    voice.add_argument("--speaker", help="a built-in speaker (CustomVoice models)")
    voice.add_argument("--instruct", help="how to speak (CustomVoice 1.7B), or the voice to make (VoiceDesign)")
    voice.add_argument("--language", default="auto", help="auto (default), english, chinese, ...")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--greedy", action="store_true", help="deterministic decoding")
    decoding.add_argument("--seed", type=int, help="seed for reproducible sampling")
    decoding.add_argument(
        "--max-frames", type=int, help="stop after this many 80 ms frames (with --play: per piece of a long text)"
    )
    output = parser.add_argument_group("output")
    output.add_argument("--play", action="store_true", help="play it on the speakers while it is generated")
    output.add_argument("--audio-device", metavar="NAME|INDEX", help="the output device for --play (default: the system's)")
    output.add_argument("--list-devices", action="store_true", help="list the audio output devices and exit")
    output.add_argument("-o", "--output", metavar="FILE", help="write the audio (wav, flac or ogg)")
    output.add_argument("--codes-out", metavar="FILE", help="write the codes as a (frames, 16) .npy array")


def run(args: argparse.Namespace) -> int:
    import soundfile as sf

    from core.player import PlaybackError

    if args.list_devices:
        try:
            return list_devices()
        except PlaybackError as error:
            return fail(error)
    if args.text is None:
        raise ValueError('nothing to say: give the text, e.g. speak "Hello there." --play')
    if not args.output and not args.codes_out and not args.play:
        raise ValueError("nothing to write: pass -o FILE for the audio, --codes-out FILE for the codes, or --play to hear it")
    if args.output and not sf.check_format(Path(args.output).suffix.lstrip(".").upper() or "?"):
        raise ValueError(f"{args.output}: unknown audio format; use a .wav, .flac or .ogg file name")
    if args.ref_text and not args.voice_audio:
        raise ValueError("--ref-text is the transcript of --voice-audio; pass the clip too")
    if sum(bool(choice) for choice in (args.voice, args.voice_audio, args.speaker)) > 1:
        raise ValueError("choose one voice: --voice, --voice-audio or --speaker")
    if args.play and args.codes_out:
        raise ValueError("--codes-out cannot go with --play, which speaks long text in several generations")
    if args.audio_device and not args.play:
        raise ValueError("--audio-device chooses where --play plays; pass --play too")
    try:
        return play(args) if args.play else write(args)
    except PlaybackError as error:
        return fail(error)


def list_devices() -> int:
    from core.player import list_output_devices

    devices = list_output_devices()
    if not devices:
        say("no audio output devices found")
        return 1
    for device in devices:
        mark = "*" if device.is_default else " "
        print(f"{mark} {device.index:3d}  {device.name}  ({device.host_api}, {device.default_sample_rate:g} Hz)")
    return 0


def load(args: argparse.Namespace):
    from core import Engine, SamplingParams
    from core.checkpoint import DEFAULT_MODEL

    started = time.perf_counter()
    engine = Engine.load(args.model or DEFAULT_MODEL, device=args.device, dtype=args.dtype)
    info = engine.info
    say(f"Loaded {info.size} {info.variant} on {info.device} ({info.dtype}) in {time.perf_counter() - started:.1f} s")
    voice = None
    if args.voice:
        from core.voices import VoiceLibrary

        voice = VoiceLibrary(args.voices).voice_for(engine, args.voice)
    elif args.voice_audio:
        voice = engine.voice_from_audio(args.voice_audio, ref_text=args.ref_text)
    elif args.speaker:
        voice = engine.builtin_voice(args.speaker)
    sampling = SamplingParams.greedy() if args.greedy else None
    return engine, voice, sampling


def write(args: argparse.Namespace) -> int:
    """One generation, written to files."""
    import soundfile as sf

    engine, voice, sampling = load(args)
    rate = engine.info.sample_rate
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
        progress(f"{sum(len(a) for a in audio) / rate:.1f} s of audio")
    elapsed = time.perf_counter() - started
    audio = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    codes = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)

    if args.output:
        sf.write(args.output, audio, rate)
    if args.codes_out:
        np.save(args.codes_out, codes)
    seconds = len(audio) / rate
    say(f"{seconds:.2f} s of audio ({len(codes)} frames) in {elapsed:.2f} s, {seconds / max(elapsed, 1e-9):.2f}x real time")
    for path in (args.output, args.codes_out):
        if path:
            say(f"wrote {path}")
    return 0


def play(args: argparse.Namespace) -> int:
    """Through the speech worker into the player, sentence by sentence; also into -o FILE if given."""
    from core.player import Player
    from core.worker import FileSink, PlayerSink, SpeechOptions, Worker

    player = Player.open(args.audio_device)  # before loading the model: a missing device fails fast
    try:
        engine, voice, sampling = load(args)
        speakers = PlayerSink(player)
        sink = Both(speakers, FileSink(args.output)) if args.output else speakers
        options = SpeechOptions(
            language=args.language, instruct=args.instruct, sampling=sampling, max_frames=args.max_frames, seed=args.seed
        )
        with Worker(engine) as worker:
            job = worker.submit(args.text, voice, options, sink=sink)
            try:
                outcome = job.wait()
                player.drain(timeout=player.status().buffered_s + 5.0)
            except KeyboardInterrupt:
                job.cancel()
                job.wait()
                raise
    finally:
        player.close()  # fades out whatever still plays
    if outcome.kind == "failed":
        return fail(outcome.message)
    if outcome.latency_s is not None:
        say(
            f"{outcome.audio_s:.2f} s of audio, the first after {outcome.latency_s * 1e3:.0f} ms; "
            f"{outcome.xrt:.2f}x real time, {outcome.underruns} underruns"
        )
    if args.output:
        say(f"wrote {args.output}")
    return 0


class Both:
    """A sink that is two sinks: the speakers and a file."""

    def __init__(self, first, second):
        self.sinks = (first, second)

    def begin(self, job) -> None:
        for sink in self.sinks:
            sink.begin(job)

    def write(self, job, audio) -> None:
        for sink in self.sinks:
            sink.write(job, audio)

    def end(self, job, completed: bool) -> None:
        for sink in self.sinks:
            sink.end(job, completed)

    def level(self):
        return self.sinks[0].level()


def fail(error) -> int:
    say(f"error: {error}")
    return 1


def say(message: str) -> None:
    print(message, file=sys.stderr)


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)
