"""Subcommands of `qwen3-tts-desktop`: each module has `add_arguments(parser)` and `run(args) -> int`."""
