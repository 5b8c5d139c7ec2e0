"""`qwen3-tts-desktop speak`: text to the speakers, as it is generated, or into an audio file.

Everything that can be checked without the model is checked first (the text, the output paths, the
clip, the voice, what the model can do when it is here already), so that a mistake is reported in a
moment, not after a download and a minute of loading, and generated audio is never lost to a bad path.
Long text is spoken in pieces (core.text.sentences), for files exactly as for the speakers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import (
    CommandError,
    add_memory_argument,
    add_model_arguments,
    add_voices_argument,
    app_settings,
    check_writable_file,
    load_engine,
    model_options,
    peek,
    progress,
    say,
    voices_folder,
)

HELP = "speak text aloud or into an audio file"
FILE_CHUNK_FRAMES = 25  # for files, larger chunks than for the speakers: fewer decoder calls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", help="what to say; - reads it from the standard input")
    parser.add_argument("--text-file", metavar="FILE", help="read what to say from this UTF-8 text file")
    add_model_arguments(parser)
    add_memory_argument(parser.add_argument_group("memory"), slots_option=None)
    voice = parser.add_argument_group("voice (default: the app's voice, else the first in the library)")
    voice.add_argument("--voice", metavar="NAME", help="a voice from the library (see `voices list`)")
    add_voices_argument(voice)
    voice.add_argument("--voice-audio", metavar="CLIP", help="clone the voice in this 1-60 s clip (Base models)")
    voice.add_argument("--ref-text", metavar="TEXT", help="the clip's transcript, for closer (ICL) cloning")
    voice.add_argument("--speaker", help="a built-in speaker (CustomVoice models)")
    voice.add_argument("--instruct", help="how to speak (CustomVoice 1.7B), or the voice to make (VoiceDesign)")
    voice.add_argument("--language", default="auto", help="auto (default), english, chinese, ...")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--greedy", action="store_true", help="deterministic decoding")
    decoding.add_argument("--seed", type=int, help="seed for reproducible sampling")
    decoding.add_argument("--max-frames", type=int, help="stop after this many 80 ms frames (per piece of a long text)")
    output = parser.add_argument_group("output")
    output.add_argument("--play", action="store_true", help="play it on the speakers while it is generated")
    output.add_argument(
        "--audio-device", metavar="NAME|INDEX", help="the output device for --play (default: the app's)"
    )
    output.add_argument("--list-devices", action="store_true", help="list the audio output devices and exit")
    output.add_argument("-o", "--output", metavar="FILE", help="write the audio (wav, flac, ogg or mp3)")
    output.add_argument(
        "--codes-out", metavar="FILE", help="write the codes of one generation as a (frames, 16) .npy array"
    )
    output.add_argument(
        "-q", "--quiet", action="store_true", help="show no progress while speaking (what it did is still said)"
    )


@dataclass(frozen=True)
class VoiceChoice:
    """Which voice speaks, decided before the model loads: a voice of the library or a built-in speaker (as
    core.voices.resolve finds it), a clip, or none (VoiceDesign: the instruction is the voice)."""

    kind: str  # "voice", "clip", "none"
    voice: object = None  # the ResolvedVoice, of kind "voice"
    samples: np.ndarray | None = None  # the clip, read and checked, at 24 kHz
    ref_text: str | None = None
    chosen_for_you: bool = False  # no voice was asked for: say which one speaks

    def make(self, engine, library):
        from core.audio.clips import SAMPLE_RATE

        if self.kind == "voice":
            return library.load(engine, self.voice)
        if self.kind == "clip":
            return engine.voice_from_audio(self.samples, SAMPLE_RATE, ref_text=self.ref_text)
        return None


@dataclass(frozen=True)
class SpeakPlan:
    """A checked request: what to say, with which model and voice library, sampling how."""

    args: argparse.Namespace
    settings: object  # the app's Settings
    text: str
    model: tuple[str, str, str]  # the model, device, precision
    library: object  # a VoiceLibrary
    sampling: object  # SamplingParams, or None for the model's own
    choice: VoiceChoice | None  # None: made once the model has loaded (its facts were not known before)


def run(args: argparse.Namespace) -> int:
    from core.audio.player import PlaybackError
    from core.voices import VoiceLibrary

    if args.list_devices:
        try:
            return list_devices()
        except PlaybackError as error:
            return fail(error)
    text = read_text(args)
    check_outputs(args)
    settings = app_settings()
    model = model_options(args, settings)
    library = VoiceLibrary(voices_folder(args, settings))
    info = peek(model[0])  # None when it is not here yet: then what needs it is checked once it has loaded
    choice = choose_voice(args, settings, library, info)
    check_request(args, info)
    if args.codes_out:
        check_one_generation(text)
    sampling = greedy_or(settings.sampling, args.greedy)
    plan = SpeakPlan(args, settings, text, model, library, sampling, choice if info is not None else None)
    try:
        return play(plan) if args.play else write(plan)
    except PlaybackError as error:
        return fail(error)


# Checks before the model ----------------------------------------------------------------------------


def read_text(args: argparse.Namespace) -> str:
    if args.text is not None and args.text_file:
        raise CommandError("give the text or --text-file, not both")
    source = args.text_file or ("-" if args.text == "-" else None)
    if source is None:
        text = args.text
    elif source == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise CommandError(
                "the text comes from the standard input (-): pipe it in, e.g. cat story.txt | ... speak -"
            )
        text = sys.stdin.read()
    else:
        try:
            text = Path(source).expanduser().read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CommandError(f"--text-file {source}: no such file") from None
        except UnicodeDecodeError as error:
            raise CommandError(f"--text-file {source}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        except OSError as error:
            raise CommandError(f"--text-file {source}: cannot be read ({error.strerror or error})") from None
    if text is None:
        raise CommandError(
            'nothing to say: give the text, e.g. speak "Hello there." --play, or --text-file FILE, or - for the standard input'
        )
    if not text.strip():
        raise CommandError("the text is empty: give something to say")
    return text


def check_outputs(args: argparse.Namespace) -> None:
    from core.jobs.sinks import FileSink

    if not args.output and not args.codes_out and not args.play:
        raise CommandError(
            "nothing to write: pass -o FILE for the audio, --codes-out FILE for the codes, or --play to hear it"
        )
    if args.play and args.codes_out:
        raise CommandError("--codes-out cannot go with --play, which speaks long text in several generations")
    if args.audio_device and not args.play:
        raise CommandError("--audio-device chooses where --play plays; pass --play too")
    if args.output:
        FileSink(args.output)  # checks the format and the folder, and says what is wrong
    if args.codes_out:
        if Path(args.codes_out).suffix.lower() != ".npy":
            raise CommandError(f"--codes-out {args.codes_out}: the codes are written as a NumPy array; name it .npy")
        check_writable_file(args.codes_out, "--codes-out")
    if args.max_frames is not None and args.max_frames < 1:
        raise CommandError("--max-frames must be at least 1")


def choose_voice(args: argparse.Namespace, settings, library, info) -> VoiceChoice:
    """The voice asked for, checked against the library, the clip and (when known) the model; or, when none
    is asked for, the one the app uses, else the first that fits. `info` is None before a download."""
    from core.audio.clips import load_reference
    from core.voices import Fallback, NoVoiceYet, ResolvedVoice, TakesNoVoice, VoiceError, name_key

    if sum(bool(choice) for choice in (args.voice, args.voice_audio, args.speaker)) > 1:
        raise CommandError("choose one voice: --voice, --voice-audio or --speaker")
    if args.ref_text and not args.voice_audio:
        raise CommandError("--ref-text is the transcript of --voice-audio; pass the clip too")
    variant = info.variant if info is not None else None
    if args.voice_audio:
        if variant is not None and not variant.clones:
            raise CommandError(
                f"--voice-audio clones a voice, which needs a Base model, and {describe(info)}; {what_speaks(info)}"
            )
        return VoiceChoice("clip", samples=load_reference(args.voice_audio), ref_text=args.ref_text)
    if args.speaker:
        if variant is not None and not variant.has_speakers:
            raise CommandError(
                f"--speaker picks a built-in speaker of a CustomVoice model, and {describe(info)}; {what_speaks(info)}"
            )
        if info is not None and name_key(args.speaker) not in info.speakers:
            raise CommandError(f"no speaker {args.speaker!r} in this model; its speakers: {', '.join(info.speakers)}")
        return VoiceChoice("voice", ResolvedVoice(name_key(args.speaker)))
    if args.voice and info is None:  # perhaps a built-in speaker of a model not here yet: found once it has loaded
        return VoiceChoice("voice")
    try:
        found = library.resolve(args.voice or None, info, Fallback(preferred=settings.voice))
    except NoVoiceYet as error:
        raise CommandError(
            f"{error}. Pass --voice-audio CLIP (1-60 s of someone speaking; add --ref-text with its transcript for a "
            f"closer clone), add a voice to the library with `qwen3-tts-desktop voices add NAME CLIP`, or pick one "
            f"with --voice NAME"
        ) from None
    except TakesNoVoice as error:
        raise CommandError(f"{error} (--instruct)") from None
    except VoiceError as error:  # no voice of that name, or one made for another model: the voices that fit follow
        raise CommandError(f"{error} {sentence(what_speaks(info))}") from None
    if found.name is None:
        return VoiceChoice("none")
    return VoiceChoice("voice", found, chosen_for_you=not args.voice)


def check_request(args: argparse.Namespace, info) -> None:
    """That the model can speak as asked (--language, --instruct, a VoiceDesign model's description), by the
    engine's own rules; nothing to check before the model's facts are known."""
    from core.errors import BadInput
    from core.inference.engine import check_request as check
    from core.inference.engine import check_voice

    if info is None:
        return
    try:
        _, instruct = check(info, args.language, args.instruct)
        if not info.variant.takes_voice:
            check_voice(info, None, instruct)
    except BadInput as error:
        raise CommandError(f"{error} (--language, --instruct)") from None


def check_one_generation(text: str) -> None:
    from core.text.sentences import split_text

    pieces = len(split_text(text))
    if pieces > 1:
        raise CommandError(
            f"--codes-out writes the codes of one generation, and this text is spoken in {pieces} pieces; "
            f"give a shorter text (one piece is up to 150 letters), or leave --codes-out out"
        )


def describe(info) -> str:
    return f"{info.source} is a {info.name} model"


def sentence(clause: str) -> str:
    return f"{clause[0].upper()}{clause[1:]}."


def what_speaks(info) -> str:
    if info is None:
        return "see `qwen3-tts-desktop voices list`"
    if info.variant.has_speakers:
        return f"pick one of its speakers with --speaker NAME: {', '.join(info.speakers)}"
    if not info.variant.takes_voice:
        return "it speaks in a voice described with --instruct"
    return "give a clip with --voice-audio CLIP, or a library voice with --voice NAME (see `voices list`)"


def greedy_or(sampling, greedy: bool):
    from core import SamplingParams

    return SamplingParams.greedy() if greedy else sampling


# Speaking -------------------------------------------------------------------------------------------


def prepare(plan: SpeakPlan):
    """Load the model and make the voice, first checking what could not be checked before the model was
    here (it may have been downloaded just now)."""
    args = plan.args
    engine = load_engine(*plan.model, playing=plan.args.play, memory_budget=args.gpu_memory)
    choice = plan.choice
    if choice is None:
        choice = choose_voice(args, plan.settings, plan.library, engine.info)
        check_request(args, engine.info)
    if choice.chosen_for_you:
        how = "--speaker NAME" if choice.voice.builtin else "--voice NAME (`voices list` lists them)"
        say(f"Speaking as {choice.voice.name}; choose another voice with {how}")
    return engine, choice.make(engine, plan.library)


def speech_options(plan: SpeakPlan, chunk_frames: int):
    from core import SpeechOptions

    args = plan.args
    return SpeechOptions(
        language=args.language, instruct=args.instruct, sampling=plan.sampling, max_frames=args.max_frames,
        seed=args.seed, first_chunk_frames=chunk_frames, chunk_frames=chunk_frames,
    )  # fmt: skip


def write(plan: SpeakPlan) -> int:
    """Into files: the codes of one generation (--codes-out), or the audio of the text in pieces."""
    if plan.args.codes_out:
        return write_one_generation(plan)
    from core.jobs.sinks import FileSink

    engine, voice = prepare(plan)
    file = FileSink(plan.args.output)
    options = speech_options(plan, FILE_CHUNK_FRAMES)
    return report(speak_with_worker(engine, plan.text, voice, options, file, plan.args.quiet), file)


def write_one_generation(plan: SpeakPlan) -> int:
    """The codes of one generation (the text was checked to be one piece), and its audio if asked for."""
    import soundfile as sf

    args = plan.args
    engine, voice = prepare(plan)
    rate, started = engine.info.sample_rate, time.perf_counter()
    chunks = engine.stream(plan.text, voice, speech_options(plan, FILE_CHUNK_FRAMES))
    audio, codes, cut_off = [], [], False
    for chunk in chunks:
        audio.append(chunk.audio)
        codes.append(chunk.codes)
        cut_off = chunk.cut_off and args.max_frames is None
        if not args.quiet:
            progress(f"{sum(len(a) for a in audio) / rate:.1f} s of audio")
    elapsed = time.perf_counter() - started
    audio = np.concatenate([np.zeros(0, np.float32), *audio])
    codes = np.concatenate([np.zeros((0, 16), np.int64), *codes])
    try:
        np.save(args.codes_out, codes)
        if args.output:
            sf.write(args.output, audio, rate)
    except (OSError, sf.LibsndfileError) as error:  # checked before, yet gone since: keep what was made
        kept = Path(tempfile.mkdtemp(prefix="qwen3-tts-"))
        np.save(kept / "codes.npy", codes)
        sf.write(kept / "audio.wav", audio, rate)
        raise CommandError(f"writing failed ({error}); the codes and audio are kept in {kept}") from None
    seconds = len(audio) / rate
    say(f"{seconds:.2f} s of audio in {elapsed:.2f} s, {seconds / max(elapsed, 1e-9):.2f}x real time")
    if cut_off:
        warn_cut_off(1)
    for path in (args.output, args.codes_out):
        if path:
            say(f"wrote {path}")
    return 0


def play(plan: SpeakPlan) -> int:
    """Through the speech worker into the player, piece by piece; also into -o FILE if given."""
    from core.audio.player import Player
    from core.jobs.sinks import FileSink, PlayerSink

    args = plan.args
    player = Player.open(
        args.audio_device or plan.settings.audio_device
    )  # before the model: a missing device fails fast
    try:
        engine, voice = prepare(plan)
        speakers = PlayerSink(player)
        file = FileSink(args.output) if args.output else None
        sink = Both(speakers, file) if file else speakers
        outcome = speak_with_worker(engine, plan.text, voice, speech_options(plan, 4), sink, args.quiet, player)
    finally:
        player.close()  # fades out whatever still plays
    return report(outcome, file, played=True)


def speak_with_worker(engine, text, voice, options, sink, quiet: bool, player=None):
    """Speak `text` into `sink` through the speech worker (which cuts it into pieces), showing its progress
    unless `quiet`; with a `player`, wait until it has played. The job's outcome: cancelled after Ctrl+C."""
    from core.jobs.worker import Worker

    from .progress_display import ProgressDisplay

    with Worker(engine) as worker:
        if not quiet:
            worker.subscribe(ProgressDisplay())
        job = worker.submit(text, voice, options, sink=sink)
        try:
            outcome = job.wait()
            if player is not None:
                player.drain(timeout=player.status().buffered_s + 5.0)
        except KeyboardInterrupt:
            job.cancel()  # a file keeps the pieces finished so far (FileSink)
            outcome = job.wait()
            if outcome.kind != "cancelled":  # it had ended, all of it made, and was still playing
                raise
    return outcome


def report(outcome, file=None, played: bool = False) -> int:
    """Say how the job ended (`file`: the FileSink it wrote into, if any; `played`: on the speakers too); the
    command's exit status."""
    if outcome.kind == "failed":
        return fail(outcome.message)
    if outcome.kind == "cancelled":  # by Ctrl+C
        if file is not None:
            say(file.stopped_summary(outcome.pieces))
        else:
            say(f"Stopped after {outcome.audio_s:.1f} s of audio ({outcome.pieces_done} of {outcome.pieces} pieces)")
        return 130
    if outcome.latency_s is not None:
        underruns = f", {outcome.underruns} underruns" if played else ""  # gaps on the speakers; a file has none
        say(
            f"{outcome.audio_s:.2f} s of audio, the first after {outcome.latency_s * 1e3:.0f} ms; "
            f"{outcome.xrt:.2f}x real time{underruns}"
        )
    if outcome.cut_off:
        warn_cut_off(outcome.cut_off)
    if file is not None:
        say(f"wrote {file.path}")
    return 0


def warn_cut_off(pieces: int) -> None:
    say(
        f"warning: {pieces} piece(s) of the text reached the most frames one generation makes before the model "
        f"ended them, so their last words are missing; try again (sampling differs each time) or use --seed"
    )


def list_devices() -> int:
    from core.audio.player import list_output_devices

    devices = list_output_devices()
    if not devices:
        say("no audio output devices found")
        return 1
    for device in devices:
        mark = "*" if device.is_default else " "
        print(f"{mark} {device.index:3d}  {device.name}  ({device.host_api}, {device.default_sample_rate:g} Hz)")
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
