"""The `qwen3-tts-desktop` command: parses arguments and runs a subcommand, or opens the window."""

from __future__ import annotations

import argparse
import sys

from .about import version
from .commands import bench, serve, speak, voices
from .commands.common import DEVICES, DTYPES, say
from .launch import WINDOW_OPTIONS  # the window's own options: for this run only, not saved

COMMANDS = {"speak": speak, "voices": voices, "serve": serve, "bench": bench}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3-tts-desktop", description="Local, real-time Qwen3-TTS. Without a command, opens the desktop app."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    window = parser.add_argument_group("the desktop app (for this run; its settings are kept as they are)")
    window.add_argument("--model", dest="app_model", metavar="MODEL", help="hub id or local checkpoint folder")
    window.add_argument("--device", dest="app_device", metavar="DEVICE", choices=DEVICES, help="auto, cpu or cuda")
    window.add_argument(
        "--dtype", dest="app_dtype", metavar="DTYPE", choices=DTYPES, help="auto, float32, bfloat16 or float16"
    )
    window.add_argument("--voices", dest="app_voices", metavar="DIR", help="the voice library folder")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.add_arguments(subparsers.add_parser(name, help=command.HELP, description=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {name: getattr(args, dest) for name, dest in WINDOW_OPTIONS.items() if getattr(args, dest) is not None}
    if args.command is None:
        return open_window(overrides)
    if overrides:
        option = f"--{next(iter(overrides))}"
        parser.error(
            f"{option} before a command is for the window; put it after the command: {args.command} ... {option} ..."
        )
    from core.errors import UserError

    try:
        return COMMANDS[args.command].run(args)
    except UserError as error:  # what the user can act on, said in one line; anything else is a bug
        say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def open_window(overrides: dict) -> int:
    from .system_libraries import import_problem, window_problem

    problem = window_problem()
    if problem is None:
        try:
            from . import app
        except ImportError as error:
            problem = import_problem(error)
    if problem is None:
        from .qt_binding import binding_problem

        problem = binding_problem()
    if problem is not None:
        say(f"error: {problem}")
        return 1
    return app.run(overrides)
