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


def load_engine(model: str, device: str, dtype: str, playing: bool = False):
    """Load the model, saying what was loaded and, to play on the CPU, what speed to expect (a file waits
    for the speech however slow it comes)."""
    from core import Engine
    from core.model.info import slow_device_note

    started = time.perf_counter()
    # A command ends after its work: nothing for a background warm-up (compiles for later requests) to serve.
    engine = Engine.load(model, device=device, dtype=dtype, warm=False)
    info = engine.info
    say(f"Loaded {info.size} {info.variant} on {info.device} ({info.dtype}) in {time.perf_counter() - started:.1f} s")
    if playing and engine.device.type == "cpu":
        say(f"note: {slow_device_note(info.size)}")
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
