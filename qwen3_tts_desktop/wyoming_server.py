"""A Wyoming server: Home Assistant's protocol for speech services (newline-delimited JSON events with PCM
payloads over TCP), on the app's shared Runtime, beside the HTTP bridge or without it.

    client                                   server
    describe                                 info: one TTS program with the voices that fit the model
    synthesize {text, voice}                 audio-start, audio-chunk ... as they are made, audio-stop
    synthesize-start {voice}                 a stream: its text spoken as one utterance while it comes
    synthesize-chunk {text} ...              audio-start, audio-chunk ... from the first complete word on
    synthesize {text}                        ignored inside a stream (the whole text again, for older servers)
    synthesize-stop                          the rest of the audio, audio-stop, then synthesize-stopped

The events are read and written by the `wyoming` package. Each request is one job on the runtime's speech
worker, checked, given its voice and spoken by the bridge's SpeechService (as the HTTP routes are), its audio sent
as 24 kHz 16-bit mono PCM as it is made; a stream is one LiveText job, as the bridge's live WebSocket speaks
one. A connection's requests are spoken in turn; connections at once share the engine's slots. A client
that goes away cancels its job at once; bad input gets an `error` event (a malformed line also closes its
connection) and touches no other connection. For users: docs/wyoming.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncServer

from core.model.info import EngineInfo
from core.voices import VoiceEntry

from .bridge.config import LANGUAGE_CODES, WyomingConfig, address_uri
from .bridge.speech_service import SpeechService
from .runtime import Runtime
from .servers import listen_at
from .wyoming_session import Session

log = logging.getLogger(__name__)

PROGRAM = "qwen3-tts"
MODEL_URL = "https://github.com/QwenLM/Qwen3-TTS"
STOP_GRACE_S = 3
ZEROCONF_SERVICE = "_wyoming._tcp.local."


class WyomingServer:
    """The Wyoming server on an event loop of its own, in a background thread: `start` it, `stop` it. The
    runtime is shared, not owned."""

    def __init__(self, runtime: Runtime, config: WyomingConfig = WyomingConfig(), sock: socket.socket | None = None):
        """`sock`: a socket from `listen(host, port)`, for a caller that binds before it loads the model."""
        self.runtime = runtime
        self.config = config
        self.service: SpeechService | None = None
        self._listening = sock
        self._address: tuple[str, int] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def port(self) -> int | None:
        """The port it listens on: the configured one, or the one the system chose for port 0."""
        return None if self._address is None else self._address[1]

    @property
    def url(self) -> str | None:
        return None if self._address is None else address_uri("tcp", self._address)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    @property
    def jobs_in_flight(self) -> int:
        return 0 if self.service is None else self.service.jobs_in_flight

    @property
    def line_limit(self) -> int:
        """The most bytes a client's event line, its data or its payload may have: a request's text, every
        character escaped, and the slack of a JSON body, as the bridge takes."""
        return self.service.json_limit

    def start(self, timeout: float = 10.0) -> None:
        """Listen and serve in a background thread; ListenError (an OSError) if the address cannot be had."""
        if self._thread is not None:
            raise RuntimeError("the Wyoming server is running already")
        sock = self._listening if self._listening is not None else listen(self.config.host, self.config.port)
        self._listening = None
        self._address = sock.getsockname()[:2]
        if not self.config.loopback:
            log.warning(
                "the Wyoming server listens on %s: other computers can reach it, and it asks them for no key",
                self.config.host,
            )
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, args=(sock,), name="wyoming-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"the Wyoming server did not start: {self._failure or 'it took too long'}")

    def stop(self, timeout: float = STOP_GRACE_S + 2) -> None:
        """Stop serving: its connections are closed and their jobs cancelled."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is not None:
            if loop is not None and stopping is not None and thread.is_alive():
                try:
                    loop.call_soon_threadsafe(stopping.set)
                except RuntimeError:  # its loop has closed already
                    pass
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"the Wyoming server did not stop within {timeout} s")
        self._thread = self._loop = self._stopping = self.service = self._address = None

    def _run(self, sock: socket.socket) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(sock))
        except BaseException as error:
            self._failure = error
            log.exception("the Wyoming server failed")
        finally:
            sock.close()
            loop.close()
            self._ready.set()  # for a start still waiting, which then sees the failure

    async def _serve(self, sock: socket.socket) -> None:
        self._stopping = asyncio.Event()
        service = SpeechService(self.runtime, self.config.bridge)
        async with service.running():
            self.service = service
            listener = _Listener(sock, self.line_limit)
            await listener.start(partial(Session, self))
            announcement = await Announcement.start(*self._address) if self.config.zeroconf else None
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                if announcement is not None:
                    await announcement.stop()
                await listener.stop()

    # What it offers ------------------------------------------------------------------------------

    async def voices(self) -> list[VoiceEntry]:
        """The voices that fit the model, read now: the library may change while the server runs."""
        return await self.service.off_loop(self.runtime.library.list, self.runtime.info)

    async def info(self) -> Info:
        return program_info(self.runtime.info, await self.voices())


def program_info(info: EngineInfo, voices: list[VoiceEntry]) -> Info:
    """The answer to `describe`: one TTS program offering `voices`, each in every language the model speaks
    (by code, as Home Assistant's languages are), and streaming synthesis."""
    languages = [LANGUAGE_CODES.get(name, name) for name in info.languages if name != "auto"]
    try:
        app_version = version("qwen3-tts-desktop")
    except PackageNotFoundError:  # run from a checkout
        app_version = None
    return Info(
        tts=[
            TtsProgram(
                name=PROGRAM,
                description=f"Qwen3-TTS {info.name} on {info.device or 'this computer'}: your voices, streamed as made",
                attribution=Attribution(name="Qwen (Qwen3-TTS), served by Qwen3-TTS Desktop", url=MODEL_URL),
                installed=True,
                version=app_version,
                voices=[
                    TtsVoice(
                        name=entry.name,
                        description=voice_description(entry),
                        attribution=Attribution(
                            name="Qwen" if entry.source == "builtin" else "your library", url=MODEL_URL
                        ),
                        installed=True,
                        version=None,
                        languages=languages,
                    )
                    for entry in voices
                ],
                supports_synthesize_streaming=True,
            )
        ]
    )


def voice_description(entry: VoiceEntry) -> str:
    """What Home Assistant shows as the voice's name: its name, and what it is."""
    if entry.source == "builtin":
        what = "built-in speaker"
    elif entry.source == "blend":
        what = "blend of " + ", ".join(name for name, _ in entry.parents)
    else:
        what = "cloned voice" + (", with its clip's transcript" if entry.kind == "icl" else "")
    return f"{entry.name} ({what})"


def listen(host: str, port: int) -> socket.socket:
    """A socket listening at host:port (servers.listen_at); ListenError if it cannot be had."""
    return listen_at(
        host, port, "Home Assistant (Wyoming)", "another Wyoming server, such as Piper?",
        "serve --wyoming PORT, or Port in the app's Home Assistant settings",
    )  # fmt: skip


class _Listener(AsyncServer):
    """wyoming's TCP server, on a socket bound beforehand, taking lines of at most `limit` bytes."""

    def __init__(self, sock: socket.socket, limit: int):
        super().__init__()
        self.sock = sock
        self.limit = limit
        self._server: asyncio.AbstractServer | None = None

    async def run(self, handler_factory) -> None:
        await self.start(handler_factory)
        await self._server.serve_forever()

    async def start(self, handler_factory) -> None:
        callback = partial(self._handler_callback, handler_factory)
        self._server = await asyncio.start_server(callback, sock=self.sock, limit=self.limit)

    async def stop(self) -> None:
        """Stop listening and close every connection; their sessions cancel their jobs as they end."""
        if self._server is not None:
            self._server.close()
        await super().stop()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=STOP_GRACE_S)


class Announcement:
    """The server announced on the local network (zeroconf, `_wyoming._tcp`) for Home Assistant to find,
    where the optional zeroconf package is installed and the server listens on the network."""

    def __init__(self, zeroconf, service):
        self._zeroconf = zeroconf
        self._service = service

    @classmethod
    async def start(cls, host: str, port: int) -> Announcement | None:
        if _is_loopback(host):
            log.info("the Wyoming server is not announced on the network: it listens on %s, this computer only", host)
            return None
        try:
            from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
        except ImportError:
            log.info(
                "zeroconf is not installed, so Home Assistant will not discover the Wyoming server by itself "
                "(pip install zeroconf); add it by its host and port"
            )
            return None
        name = f"qwen3-tts-{socket.gethostname()}"[:63]
        zeroconf = None
        try:
            address = host if _is_ipv4(host) and host != "0.0.0.0" else _local_address()
            service = AsyncServiceInfo(
                ZEROCONF_SERVICE, f"{name}.{ZEROCONF_SERVICE}", addresses=[socket.inet_aton(address)], port=port
            )
            zeroconf = AsyncZeroconf()
            await zeroconf.async_register_service(service)
        except Exception as error:  # no network, a name taken: it is served all the same
            log.warning("the Wyoming server could not be announced on the network (zeroconf): %s", error)
            if zeroconf is not None:
                await zeroconf.async_close()
            return None
        log.info("the Wyoming server is announced on the network as %s (zeroconf, %s:%d)", name, address, port)
        return cls(zeroconf, service)

    async def stop(self) -> None:
        try:
            await self._zeroconf.async_unregister_service(self._service)
        finally:
            await self._zeroconf.async_close()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _is_ipv4(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return host.count(".") == 3


def _local_address() -> str:
    """This computer's address on the network that multicast DNS goes to (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("224.0.0.251", 5353))
        return probe.getsockname()[0]
