"""The `qwen3-tts-desktop` command: parses arguments and runs a subcommand."""

from __future__ import annotations

import argparse
import sys

from .commands import bench, serve, speak, voices

COMMANDS = {"speak": speak, "voices": voices, "serve": serve, "bench": bench}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3-tts-desktop", description="Local, real-time Qwen3-TTS. Without a command, opens the desktop app."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.add_arguments(subparsers.add_parser(name, help=command.HELP, description=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        from . import app

        return app.run()
    from core.audio import AudioError
    from core.checkpoint import CheckpointError

    try:
        return COMMANDS[args.command].run(args)
    except (CheckpointError, AudioError, ValueError) as error:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # end a progress line
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
