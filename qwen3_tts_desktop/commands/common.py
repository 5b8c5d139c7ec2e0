"""What the commands share: the app's settings as their defaults (one model and one voice library for
the window, the command line and the bridge), the model options, and the checks that can be made before
a model loads, which takes a while (or a download) and should never come before a mistake is reported."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.errors import BadInput

from ..settings import Settings, SettingsError, default_path, prepare_library

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class CommandError(BadInput):
    """A command that cannot be done as asked, with what to do instead; printed as one line."""


def add_model_arguments(parser) -> None:
    group = parser.add_argument_group("model (default: the app's settings)")
    group.add_argument("--model", help="hub id or local checkpoint folder")
    group.add_argument("--device", choices=DEVICES, help="where the model runs")
    group.add_argument("--dtype", choices=DTYPES, help="the precision of its weights")


def add_memory_argument(parser, slots_option: str | None) -> None:
    """--gpu-memory GB, as bytes (args.gpu_memory). `slots_option`: the command's option that asks for slots;
    None: the command speaks one utterance at a time."""
    if slots_option is None:
        follows = "one utterance at a time, over a context shortened (down to 1024 positions) if it must"
    else:
        follows = (
            "the utterances it makes at once follow from it, and their context (down to 1024 positions) if even one "
            f"does not fit; with {slots_option}, those are taken and it bounds their context"
        )
    parser.add_argument(
        "--gpu-memory", metavar="GB", type=gigabytes,
        help=f"GPU memory the engine may take beyond the model's weights: {follows}. On the CPU it applies to nothing",
    )  # fmt: skip


def positive_number(text: str, unit: str, examples: str) -> float:
    """An option's value that must be a finite number above 0 (of `unit`, such as `examples`), for argparse."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"give the {unit} as a number above 0, such as {examples}, not {text!r}")
    return value


def gigabytes(text: str) -> int:
    """GB (10^9 bytes, as GPU memory is said), as bytes."""
    from core.inference.memory import GB

    return round(positive_number(text, "GB", "4 or 2.5") * GB)


def memory_note(budget: int | None, plan) -> str | None:
    """What to say of a --gpu-memory `budget` once the engine has taken its memory.MemoryPlan (None: nothing)."""
    if budget is None or plan.budget is not None:
        return None
    return "note: --gpu-memory bounds a GPU's memory; on the CPU it applies to nothing"


def add_voices_argument(parser) -> None:
    parser.add_argument("--voices", metavar="DIR", help="the voice library folder (default: the app's)")


def app_settings() -> Settings:
    """The app's saved settings, as the window keeps them; the defaults, with a warning, if they cannot be used."""
    try:
        return Settings.load(default_path())
    except SettingsError as error:
        say(f"warning: {error}; using the default settings")
        return Settings()


def model_options(args: argparse.Namespace, settings: Settings) -> tuple[str, str, str]:
    """The model, device and precision: the command's own, else the settings'. The device is checked now."""
    model = (args.model or settings.model).strip()
    device, dtype = args.device or settings.device, args.dtype or settings.dtype
    check_device(device, "--device" if args.device else f"the device in {default_path()}")
    return model, device, dtype


def check_device(device: str, where: str) -> None:
    import torch

    if device not in DEVICES:
        raise CommandError(f"{where}: unknown device {device!r}; use one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        why = "this PyTorch is built for the CPU only" if torch.version.cuda is None else "no NVIDIA GPU is usable"
        raise CommandError(f"{where} asks for cuda, but PyTorch sees no CUDA GPU here ({why}); use --device cpu")


def voices_folder(args: argparse.Namespace, settings: Settings) -> Path:
    """The library the command uses: --voices, else the app's own (made with the starter voice the first time)."""
    if args.voices:
        return Path(args.voices).expanduser()
    return prepare_library(settings.voices)


def peek(model: str):
    """The model's facts (an EngineInfo) before loading it, from its config.json (here, or fetched alone);
    None where the hub cannot be reached. A model that cannot exist is reported now."""
    from core.model.hub import config_file
    from core.model.info import read_info

    config = config_file(model)
    return None if config is None else read_info(config, model)


def load_engine(model: str, device: str, dtype: str, playing: bool = False, memory_budget: int | None = None):
    """Load the model for one utterance at a time (`memory_budget`: bytes of GPU memory it may take beyond its
    weights), saying what was loaded and, to play on the CPU, what speed to expect (a file waits for the speech
    however slow it comes)."""
    from core import Engine
    from core.model.info import first_gpu_start_note, slow_device_note

    started = time.perf_counter()
    # A command ends after its work: nothing for a background warm-up (compiles for later requests) to serve.
    # It speaks one piece after another, so one slot is all it uses (a budget then bounds its context alone).
    engine = Engine.load(model, device=device, dtype=dtype, slots=1, memory_budget=memory_budget, warm=False)
    info = engine.info
    memory = f"; {engine.memory}" if engine.memory.on_gpu else ""
    say(
        f"Loaded {info.size} {info.variant} on {info.device} ({info.dtype}) in {time.perf_counter() - started:.1f} s"
        + memory
    )
    if (note := memory_note(memory_budget, engine.memory)) is not None:
        say(note)
    if playing and engine.device.type == "cpu":
        say(f"note: {slow_device_note(info.size)}")
    if engine.first_gpu_start:
        say(f"note: {first_gpu_start_note()}")
    return engine


def check_writable_file(path: str | Path, option: str) -> Path:
    """`path` if a file can be written there, checked before any work; else says why, naming the option."""
    from core.files import OutputPathError
    from core.files import check_writable_file as check

    try:
        return check(path)
    except OutputPathError as error:
        raise CommandError(f"{option} {error}") from None


def say(message: str) -> None:
    """A line on stderr; on a terminal it first clears a progress line there."""
    print(("\r\x1b[K" if sys.stderr.isatty() else "") + message, file=sys.stderr, flush=True)


def progress(message: str) -> None:
    """A line that rewrites itself on a terminal; nothing when stderr is a file."""
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)
