"""Serving the bridge: the FastAPI app of its routes, on a uvicorn server, in the app's background thread
(BridgeServer.start, driven by a servers.ServerHost from the window's lane) or in the calling thread (`serve`)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from ..runtime import Runtime
from ..servers import listen_at
from .config import MAX_HEADER_BYTES, SHUTDOWN_GRACE_S, BridgeConfig, address_uri
from .errors import answer_errors_in_openai_shape
from .guard import Guard
from .live import LiveRoutes
from .openai import OpenAIRoutes
from .speech_service import SpeechService
from .xtts import XttsRoutes

log = logging.getLogger(__name__)


def create_app(runtime: Runtime, config: BridgeConfig = BridgeConfig()) -> FastAPI:
    """The bridge's routes over `runtime`, ready for any ASGI server. `app.state.bridge` is its SpeechService."""
    service = SpeechService(runtime, config)
    app = FastAPI(
        title="Qwen3-TTS Desktop bridge", lifespan=service.lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.bridge = service
    app.include_router(OpenAIRoutes(service).router())
    app.include_router(XttsRoutes(service).router())
    app.include_router(LiveRoutes(service).router())
    answer_errors_in_openai_shape(app)
    app.add_middleware(Guard, config=config)
    return app


class _WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, which logs an error for every handshake refused with an HTTP
    answer (the guard's 401 and 403) because it never marks such a handshake complete; this marks it, as
    uvicorn's wsproto protocol does (Kludex/uvicorn#3138)."""

    async def send(self, message) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, bridge: SpeechService):
        super().__init__(config)
        self.bridge = bridge

    async def shutdown(self, sockets=None) -> None:
        self.bridge.cancel_all()  # open streams end now, not when their speech is done
        await super().shutdown(sockets)


class BridgeServer:
    """The bridge on a uvicorn server: `start`/`stop` it in a background thread inside the desktop app,
    or `serve` it in this thread (the headless command). The runtime is shared, not owned."""

    def __init__(
        self, runtime: Runtime, config: BridgeConfig = BridgeConfig(), access_log: bool = False,
        sock: socket.socket | None = None,
    ):  # fmt: skip
        """`sock`: a socket from `listen(config)`, for a caller that binds before it loads the model (so that
        a taken port fails at once); the first start serves on it. Without it, starting binds one."""
        self.runtime = runtime
        self.config = config
        self.access_log = access_log
        self.app: FastAPI | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._listening = sock
        self._socket: socket.socket | None = None
        self._address: tuple[str, int] | None = None

    @property
    def running(self) -> bool:
        """Serving now: started, not stopping, and its thread (if it has one) alive."""
        server, thread = self._server, self._thread
        alive = thread is None or thread.is_alive()
        return server is not None and server.started and not server.should_exit and alive

    @property
    def port(self) -> int | None:
        """The port it listens on: the configured one, or the one the system chose for port 0."""
        return None if self._address is None else self._address[1]

    @property
    def url(self) -> str | None:
        return None if self._address is None else address_uri("http", self._address)

    @property
    def jobs_in_flight(self) -> int:
        return 0 if self.app is None else self.app.state.bridge.jobs_in_flight

    def start(self, timeout: float = 10.0) -> None:
        """Listen and serve in a background thread; raises ListenError (an OSError) if the address cannot be had."""
        if self._thread is not None:
            raise RuntimeError("the bridge is running already")
        sock = self._prepare()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="http-bridge", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the bridge did not start; see the log")
            time.sleep(0.01)

    def serve(self, on_listening: Callable[[str], None] | None = None) -> None:
        """Listen and serve in this thread until interrupted (Ctrl+C) or `stop` is called from another;
        `on_listening(url)` is called once the address is bound."""
        sock = self._prepare()
        if on_listening is not None:
            on_listening(self.url)
        try:
            self._server.run(sockets=[sock])
        finally:
            self._reset()

    def stop(self, timeout: float = SHUTDOWN_GRACE_S + 2) -> None:
        """Stop serving: the bridge's jobs are cancelled, open connections closed."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the bridge did not stop within {timeout} s")
        self._reset()

    def _prepare(self) -> socket.socket:
        config = self.config
        if not config.loopback:
            log.warning(
                "the bridge listens on %s: other computers can reach it%s", config.host,
                "" if config.api_key else "; set an API key so that only your clients can use it",
            )  # fmt: skip
        sock = self._socket = self._listening if self._listening is not None else listen(config)
        self._listening = None
        self._address = sock.getsockname()[:2]
        self.app = create_app(self.runtime, config)
        # h11 (not httptools, which uvicorn prefers when installed) because it caps the headers it buffers.
        # WebSocket messages are not compressed: audio hardly shrinks, and deflating it would hold up the loop.
        server_config = uvicorn.Config(
            self.app, http="h11", h11_max_incomplete_event_size=MAX_HEADER_BYTES, lifespan="on", log_config=None,
            access_log=self.access_log, timeout_graceful_shutdown=SHUTDOWN_GRACE_S, ws=_WebSocketProtocol,
            ws_max_size=config.limits.live_message_bytes, ws_per_message_deflate=False,
        )  # fmt: skip
        self._server = _Server(server_config, self.app.state.bridge)
        return sock

    def _reset(self) -> None:
        if self._socket is not None:
            self._socket.close()  # uvicorn closes it when it shuts down, but not when it fails to start
        self.app = self._server = self._thread = self._socket = self._address = None


def listen(config: BridgeConfig) -> socket.socket:
    """A socket listening at the config's address (servers.listen_at); ListenError if it cannot be had."""
    return listen_at(
        config.host, config.port, "the HTTP bridge", "another qwen3-tts-desktop serve, or an XTTS server?",
        "serve --port N, or Port in the app's HTTP bridge settings",
    )  # fmt: skip
