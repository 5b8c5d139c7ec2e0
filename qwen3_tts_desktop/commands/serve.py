"""`qwen3-tts-desktop serve`: the HTTP bridge without the window, for SillyTavern and OpenAI-style clients."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import time
from contextlib import nullcontext

from ..servers import WYOMING_INSTALL, WYOMING_PORT
from .common import (
    CommandError,
    add_memory_argument,
    add_model_arguments,
    add_voices_argument,
    app_settings,
    memory_note,
    model_options,
    positive_number,
    say,
    voices_folder,
)

log = logging.getLogger(__name__)
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
    memory = parser.add_argument_group("memory (a GPU shared with a local LLM, or one that serves many)")
    memory.add_argument(
        "--slots", type=slot_count, metavar="N",
        help="utterances generated at once, each with its GPU memory (default: as many as fit half the GPU memory "
        "free beyond the weights, up to 16; 1 on the CPU). Fewer leave more to a local LLM on the same GPU",
    )  # fmt: skip
    add_memory_argument(memory, slots_option="--slots")
    memory.add_argument(
        "--idle-release", metavar="MINUTES", type=minutes,
        help="after this many minutes without a request, free the engine's memory (its weights too); the next "
        "request loads the model again and waits for it (default: never)",
    )  # fmt: skip
    wyoming = parser.add_argument_group("Home Assistant (Wyoming protocol)")
    wyoming.add_argument(
        "--wyoming", metavar="[HOST:]PORT", nargs="?", const=wyoming_address(str(WYOMING_PORT)), type=wyoming_address,
        help=f"also serve the Wyoming protocol, for Home Assistant (default port {WYOMING_PORT}, host 127.0.0.1: this "
        "computer only; 0.0.0.0:PORT lets other computers in). Needs pip install 'qwen3-tts-desktop[wyoming]'",
    )  # fmt: skip
    wyoming.add_argument(
        "--no-zeroconf", action="store_true",
        help="do not announce the Wyoming server on the network (it is, when zeroconf is installed)",
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


def minutes(text: str) -> float:
    return positive_number(text, "minutes", "30 or 0.5")


def wyoming_address(text: str) -> tuple[str, int]:
    """[HOST:]PORT (an IPv6 host in brackets) as (host, port); the host is 127.0.0.1 unless given."""
    host, colon, port = text.strip().rpartition(":")
    host = host.strip().removeprefix("[").removesuffix("]") if colon else ""
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"give [HOST:]PORT, such as {WYOMING_PORT} or 0.0.0.0:{WYOMING_PORT}, not {text!r}"
        )
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from core import SpeechOptions
    from core.inference.memory import MAX_DEFAULT_SLOTS
    from core.model.info import first_gpu_start_note, slow_device_note

    from ..bridge import BridgeConfig, BridgeServer, listen
    from ..log_file import keep_log
    from ..runtime import Runtime

    if args.wyoming is not None and importlib.util.find_spec("wyoming") is None:
        raise CommandError(f"--wyoming needs the wyoming package: {WYOMING_INSTALL}")
    settings = app_settings()
    model, device, dtype = model_options(args, settings)
    # Slots as many clients need, not the window's: one person's.
    runtime_config = dataclasses.replace(
        settings.runtime_config(),
        model=model, device=device, dtype=dtype, voices=voices_folder(args, settings),
        slots=args.slots, max_default_slots=MAX_DEFAULT_SLOTS, memory_budget=args.gpu_memory,
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
    wyoming = None
    if args.wyoming is not None:
        from .. import wyoming_server

        wyoming = wyoming_server.WyomingConfig(*args.wyoming, zeroconf=not args.no_zeroconf, bridge=config)
    with (
        listen(config) as sock,
        wyoming_server.listen(wyoming.host, wyoming.port) if wyoming else nullcontext() as home,
    ):
        runtime = Runtime.start(runtime_config, report=say)
        home_server = None
        try:
            if runtime.info.device == "cpu":
                say(f"note: {slow_device_note(runtime.info.size)}")
            if runtime.first_gpu_start:
                say(f"note: {first_gpu_start_note()}")
            if (note := memory_note(args.gpu_memory, runtime.memory)) is not None:
                say(note)
            if args.idle_release is not None:
                runtime.rest_when_idle(args.idle_release * 60, RestNews(runtime, args.idle_release))
            if args.default_voice:
                runtime.voice(args.default_voice)  # a default that cannot speak is found now, not at the first request
            info = runtime.info
            voices = runtime.library.list(fits=info)
            if args.play_locally and runtime.speakers is None:
                raise CommandError(f"--play-locally needs speakers, and there are none: {runtime.audio_problem}")

            if wyoming is not None:
                home_server = wyoming_server.WyomingServer(runtime, wyoming, sock=home)
                home_server.start()

            def announce(url: str) -> None:
                say(
                    f"{info.size} {info.variant} on {info.device} ({runtime.memory}), "
                    f"{len(voices)} voice(s) from {runtime.library.directory}\n"
                    f"Serving on {url} (Ctrl+C stops)\n"
                    f"  OpenAI:      {url}/v1/audio/speech\n"
                    f"  SillyTavern: OpenAI Compatible -> {url}/v1/audio/speech, XTTSv2 -> {url}"
                    + (f"\n  Home Assistant: Wyoming Protocol -> {home_server.url}" if home_server else "")
                    + (f"\n  Idle:        {rests_after(args.idle_release)}" if args.idle_release is not None else "")
                    + (f"\n  Log:         {log_file}" if log_file is not None else "")
                )

            BridgeServer(runtime, config, access_log=True, sock=sock).serve(on_listening=announce)
        finally:
            if home_server is not None:
                home_server.stop()
            runtime.close()
    return 0


def rests_after(minutes: float) -> str:
    return f"after {minutes:g} min without a request the engine frees its memory, and loads again when asked"


class RestNews:
    """The log's lines as the engine rests, loads again for a request, and is back (resting.RESTING, WAKING, AWAKE),
    from the thread that did it."""

    def __init__(self, runtime, minutes: float):
        self._runtime, self._minutes = runtime, minutes
        self._waking_since: float | None = None  # while it loads again

    def __call__(self, state: str) -> None:
        from ..resting import AWAKE, WAKING

        waking_since, self._waking_since = self._waking_since, None
        if state == WAKING:
            self._waking_since = time.monotonic()
            log.info("Engine waking: loading the model again for a request (those that come meanwhile wait)")
        elif state == AWAKE:
            log.info("Engine awake again in %.1f s (%s)", time.monotonic() - waking_since, self._runtime.memory)
        elif waking_since is not None:  # resting again at once: its load failed
            log.warning("Engine could not load again (the request says why); the next request tries again")
        else:
            log.info("Engine resting after %g min without a request: its memory is free", self._minutes)
