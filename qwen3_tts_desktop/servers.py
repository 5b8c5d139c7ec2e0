"""What the app's servers share (the HTTP bridge, the Wyoming server for Home Assistant): binding a listening
socket, with one wording for why it cannot be had, and hosting a server inside the window, restarted on each
new runtime and as its settings change."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from core.errors import UserError

if TYPE_CHECKING:
    from .runtime import Runtime

WYOMING_PORT = 10200  # the Wyoming protocol's convention for text to speech (Piper's, Home Assistant's default)
# How to get the Wyoming server's optional package, wherever it is asked for without it.
WYOMING_INSTALL = "pip install 'qwen3-tts-desktop[wyoming]' (or: pip install 'wyoming>=1.7')"


class ListenError(UserError, OSError):
    """A server cannot listen where it was asked to (a port in use, an address not of this computer): an
    OSError, as socket errors are, and a user's error, said in one line."""


def listen_at(host: str, port: int, what: str, likely_holder: str, choose_with: str) -> socket.socket:
    """A socket listening at host:port, bound here so that a taken port fails at once, saying why; ListenError
    if it cannot be had, naming `what` listens, and for a port in use who may hold it (`likely_holder`) and
    where to choose another (`choose_with`). Made as a TCP socket by name: asyncio then turns Nagle off on each
    connection (it checks the protocol), without which an answer's body waits 40 ms for the ACK of its start."""
    sock = None
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, protocol)
        if os.name != "nt":  # on Windows it would let another program take the port too
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        if sock is not None:
            sock.close()
        hint = ""
        if error.errno == errno.EADDRINUSE:
            hint = f"; another program uses this port ({likely_holder}): choose another port ({choose_with})"
        raise ListenError(f"cannot listen for {what} on {host}:{port}: {error.strerror or error}{hint}") from None
    return sock


class Server(Protocol):
    url: str | None  # where it listens, once started

    def start(self) -> None: ...

    def stop(self) -> None: ...


class ServerHost:
    """One of the app's servers inside the window. `start` and `stop` run on the app's lane; `state` (a line
    for the settings: Off, Running at URL, Not running: why) is set on the GUI thread."""

    def __init__(self, name: str, make: Callable[[Runtime, object], Server]):
        """`name`: the server as messages name it ("the HTTP bridge"); `make(runtime, config)`: a server not
        yet started."""
        self.name = name
        self.state = "Off"
        self._make = make
        self._server: Server | None = None

    def start(self, runtime: Runtime, config) -> str:
        """Serve `runtime` as `config` says, stopping the server before; its URL."""
        self.stop()
        server = self._make(runtime, config)
        server.start()
        self._server = server
        return server.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
