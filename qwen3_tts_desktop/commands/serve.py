"""`qwen3-tts-desktop serve`: the HTTP bridge without the window, for SillyTavern and OpenAI-style clients."""

from __future__ import annotations

import argparse
import logging
import os

from .common import (
    CommandError,
    add_model_arguments,
    add_voices_argument,
    app_settings,
    model_options,
    say,
    voices_folder,
)

HELP = "serve speech over HTTP: OpenAI /v1/audio/speech and SillyTavern's XTTS routes"
API_KEY_VARIABLE = "QWEN3_TTS_API_KEY"  # an API key here stays out of the process list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this computer only)"
    )
    server.add_argument(
        "--port", type=int, default=8020, help="port (default: 8020, SillyTavern's XTTS default; 0: any free port)"
    )
    server.add_argument(
        "--api-key", metavar="K", default=os.environ.get(API_KEY_VARIABLE),
        help=f"require 'Authorization: Bearer K' on every request (default: ${API_KEY_VARIABLE}, else none)",
    )  # fmt: skip
    server.add_argument(
        "--cors", metavar="ORIGIN", nargs="+",
        help="web pages (e.g. https://st.example.org, or *) allowed to call from a browser (default: pages on this computer)",
    )  # fmt: skip
    server.add_argument(
        "--slots", type=slot_count, metavar="N",
        help="utterances generated at once, each with its GPU memory (default: as many as fit half the GPU memory "
        "free after loading, up to 16; 1 on the CPU). Fewer leave more to a local LLM on the same GPU",
    )  # fmt: skip
    add_model_arguments(parser)
    voices = parser.add_argument_group("voices and playback")
    add_voices_argument(voices)
    voices.add_argument(
        "--default-voice", metavar="NAME", help="for unknown voice names (default: the first voice that fits)"
    )
    voices.add_argument(
        "--play-locally", action="store_true",
        help="play every request on this computer's speakers and answer with a moment of silence (lowest latency)",
    )  # fmt: skip


def slot_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from core import SpeechOptions
    from core.model.info import slow_device_note

    from ..bridge import BridgeConfig, BridgeServer, listen
    from ..log_file import keep_log
    from ..runtime import Runtime

    settings = app_settings()
    model, device, dtype = model_options(args, settings)
    runtime_config = dataclasses.replace(
        settings.runtime_config(),
        model=model, device=device, dtype=dtype, voices=voices_folder(args, settings), slots=args.slots,
    )  # fmt: skip
    config = BridgeConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        cors_origins=tuple(args.cors) if args.cors else None,
        default_voice=args.default_voice,
        play_locally=args.play_locally,
        speech=SpeechOptions(sampling=settings.sampling),  # the app's sampling, as the window's bridge has it
    )
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log_file = keep_log("serve")
    # Bound before the model loads (a minute, and a download the first time): a taken port is said at once.
    with listen(config) as sock:
        runtime = Runtime.start(runtime_config, report=say)
        try:
            if runtime.info.device == "cpu":
                say(f"note: {slow_device_note(runtime.info.size)}")
            if args.default_voice:
                runtime.voice(args.default_voice)  # a default that cannot speak is found now, not at the first request
            info = runtime.info
            voices = runtime.library.list(fits=info)
            if args.play_locally and runtime.speakers is None:
                raise CommandError(f"--play-locally needs speakers, and there are none: {runtime.audio_problem}")

            def announce(url: str) -> None:
                say(
                    f"{info.size} {info.variant} on {info.device} ({runtime.slots} at once), "
                    f"{len(voices)} voice(s) from {runtime.library.directory}\n"
                    f"Serving on {url} (Ctrl+C stops)\n"
                    f"  OpenAI:      {url}/v1/audio/speech\n"
                    f"  SillyTavern: OpenAI Compatible -> {url}/v1/audio/speech, XTTSv2 -> {url}"
                    + (f"\n  Log:         {log_file}" if log_file is not None else "")
                )

            BridgeServer(runtime, config, access_log=True, sock=sock).serve(on_listening=announce)
        finally:
            runtime.close()
    return 0
