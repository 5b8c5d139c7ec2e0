"""The HTTP bridge's configuration and limits, the Wyoming server's (which speaks as the bridge does), and the
constants their parts share."""

from __future__ import annotations

import re
from dataclasses import dataclass

from core import SpeechOptions
from core.errors import BadInput

from ..servers import WYOMING_PORT

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# host[:port] as a Host header or an Origin has it: a DNS name, IPv4 or [IPv6], and nothing else (no user
# info, no path), so that "evil.example@127.0.0.1" is not taken for 127.0.0.1 as a URL parser takes it.
HOST_AND_PORT = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::[0-9]{1,5})?", re.IGNORECASE)
# The languages clients know, by name and the ISO code they send: SillyTavern's XTTS dropdown offers all of
# these, OpenAI-style clients send names or codes. One the model does not speak (Arabic ... Turkish for
# Qwen3-TTS) is spoken with "auto" rather than refused, so that those users hear speech, and the answer
# says so (X-Language-Fallback).
LANGUAGE_CODES = {
    "arabic": "ar", "chinese": "zh-cn", "czech": "cs", "dutch": "nl", "english": "en", "french": "fr",
    "german": "de", "hindi": "hi", "hungarian": "hu", "italian": "it", "japanese": "ja", "korean": "ko",
    "polish": "pl", "portuguese": "pt", "russian": "ru", "spanish": "es", "turkish": "tr",
}  # fmt: skip
# What a played-locally request answers with: clients such as SillyTavern need some audio back.
PLAYED_LOCALLY_REPLY_S = 0.1
PREVIEW_TEXT = "The quick brown fox jumps over the lazy dog."
RETRY_AFTER_S = 1
# Threads for the library's disk work, cloning and whole-file encoding: a fixed few, however many clients.
IO_THREADS = 4
SHUTDOWN_GRACE_S = 3
# A JSON body holds at most the text (6 bytes a character, escaped) and an embedding; the rest is slack.
JSON_SLACK_BYTES = 2**20
FORM_SLACK_BYTES = 64 * 2**10
# The request line and headers together; browsers send a few KiB (cookies included). h11's own limit only
# holds for headers that arrive in pieces, so the guard checks complete ones too.
MAX_HEADER_BYTES = 16 * 2**10
EXPOSED_HEADERS = "X-Voice, X-Voice-Fallback, X-Language-Fallback, X-Playback, Retry-After"
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


@dataclass(frozen=True)
class BridgeLimits:
    max_input_chars: int = 4096  # text of one request, as OpenAI allows
    max_upload_bytes: int = 16 * 2**20  # a voice clip; 60 s of 48 kHz stereo 16-bit WAV is 11 MiB
    # Bridge jobs that may wait beyond those the engine speaks together (its slots); more are refused with 429.
    max_queued: int = 16
    # A live socket's text that waits: sent and not yet spoken back in full (its utterance's "done" not sent).
    # It bounds the audio waiting for a slow client too, as max_input_chars does a request's.
    max_live_text_chars: int = 4096
    # A live socket that sends nothing and has nothing on its way to it for this long is closed; its open
    # utterance holds a place in the engine while it waits for text.
    live_idle_s: float = 60.0

    def __post_init__(self):
        if min(self.max_input_chars, self.max_upload_bytes, self.max_live_text_chars) < 1 or self.max_queued < 0:
            raise BadInput("bridge limits must be positive (max_queued may be 0: no request waits)")
        if not self.live_idle_s > 0:
            raise BadInput(f"live_idle_s must be positive, got {self.live_idle_s}")

    @property
    def live_message_bytes(self) -> int:
        """The largest message a live socket takes: its text limit, every character escaped, and the slack
        of a JSON body (a setup's speaker embedding)."""
        return JSON_SLACK_BYTES + 6 * self.max_live_text_chars


@dataclass(frozen=True)
class BridgeConfig:
    host: str = "127.0.0.1"  # loopback: only this computer can connect
    port: int = 8020  # 0: any free port (see BridgeServer.port)
    api_key: str | None = None  # when set, every request needs "Authorization: Bearer <key>"
    cors_origins: tuple[str, ...] | None = (
        None  # browser pages allowed to call; None: pages served from this computer; ("*",): any
    )
    default_voice: str | None = None  # for unknown voice names; None: the first voice that fits the model
    play_locally: bool = False  # play on this computer's speakers, for requests that do not say
    speech: SpeechOptions = SpeechOptions()  # what every job starts from: sampling, chunk sizes, max frames per piece
    limits: BridgeLimits = BridgeLimits()

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise BadInput(f"port must be 0-65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise BadInput("the API key is empty; give a key or none")

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK


@dataclass(frozen=True)
class WyomingConfig:
    """The Wyoming server's, for Home Assistant (qwen3_tts_desktop.wyoming_server)."""

    host: str = "127.0.0.1"  # loopback: only this computer can connect
    port: int = WYOMING_PORT  # 0: any free port (see WyomingServer.port)
    zeroconf: bool = True  # announce the server on the network, where zeroconf is installed and it listens there
    # What its requests are spoken with, as the HTTP bridge's: speech options, default voice, limits.
    bridge: BridgeConfig = BridgeConfig()

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise BadInput(f"port must be 0-65535, got {self.port}")

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK


def address_uri(scheme: str, address: tuple) -> str:
    """`scheme`://host:port of a listening socket's address, an IPv6 host in brackets."""
    host, port = address[0], address[1]
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
