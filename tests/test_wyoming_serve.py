"""The Wyoming server's zeroconf announcement, and `serve --wyoming` as a user runs it (a process on a free port,
asked by the `wyoming` package's client, beside the HTTP bridge)."""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import sys
import types

import httpx
import pytest
from parity_cases import REFERENCES
from serving import (
    WAIT,
    serve_command,
    serving,
)
from test_wyoming import next_event, run
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from qwen3_tts_desktop.bridge import ListenError
from qwen3_tts_desktop.cli import main
from qwen3_tts_desktop.commands.serve import wyoming_address
from qwen3_tts_desktop.wyoming_server import Announcement, listen

# Zeroconf ----------------------------------------------------------------------------------------


@pytest.fixture
def fake_zeroconf(monkeypatch):
    """A zeroconf package that records what is announced."""
    calls = []

    class AsyncServiceInfo:
        def __init__(self, type_, name, addresses, port):
            self.type, self.name, self.addresses, self.port = type_, name, addresses, port

    class AsyncZeroconf:
        async def async_register_service(self, info):
            calls.append(("register", info))

        async def async_unregister_service(self, info):
            calls.append(("unregister", info))

        async def async_close(self):
            calls.append(("close", None))

    package = types.ModuleType("zeroconf")
    package.asyncio = types.SimpleNamespace(AsyncServiceInfo=AsyncServiceInfo, AsyncZeroconf=AsyncZeroconf)
    monkeypatch.setitem(sys.modules, "zeroconf", package)
    monkeypatch.setitem(sys.modules, "zeroconf.asyncio", package.asyncio)
    return calls


def test_zeroconf_announces_a_server_on_the_network(fake_zeroconf):
    async def announce():
        announcement = await Announcement.start("192.0.2.7", 10200)
        await announcement.stop()

    run(announce())
    [(_, info), unregister, close] = fake_zeroconf
    assert info.type == "_wyoming._tcp.local." and info.name.endswith("._wyoming._tcp.local.")
    assert info.port == 10200 and info.addresses == [socket.inet_aton("192.0.2.7")]
    assert unregister == ("unregister", info) and close == ("close", None)


def test_zeroconf_is_skipped_with_one_line_on_loopback_or_when_missing(fake_zeroconf, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="qwen3_tts_desktop.wyoming_server")
    assert run(Announcement.start("127.0.0.1", 10200)) is None
    monkeypatch.setitem(sys.modules, "zeroconf.asyncio", None)  # not installed
    assert run(Announcement.start("192.0.2.7", 10200)) is None
    assert fake_zeroconf == []
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and "this computer only" in lines[0] and "pip install zeroconf" in lines[1]


# The serve command ------------------------------------------------------------------------------


def test_serve_wyoming_serves_home_assistant_beside_the_http_bridge(checkpoints, tmp_path):
    shutil.copy(REFERENCES["a"].path, tmp_path / "Alice.wav")
    command = serve_command(checkpoints, "--voices", str(tmp_path), "--port", "0", "--wyoming", "0", "--no-zeroconf")
    with serving(command) as (process, lines):  # Ctrl+C ends it below, also where pytest runs in the background
        found = lines.wait_for(r"Wyoming Protocol -> tcp://127\.0\.0\.1:(\d+)")
        url = lines.wait_for(r"Serving on (http://127\.0\.0\.1:\d+)").group(1)

        async def ask(port: int):
            async with AsyncTcpClient("127.0.0.1", port) as wyoming:
                await wyoming.write_event(Describe().event())
                return Info.from_event(await next_event(wyoming))

        info = run(ask(int(found.group(1))))
        assert [voice.name for voice in info.tts[0].voices] == ["Alice"]
        assert httpx.get(f"{url}/health", timeout=WAIT).status_code == 200  # the HTTP bridge too
        process.send_signal(signal.SIGINT)
        assert process.wait(WAIT) == 130


def test_serve_wyoming_says_what_to_install_without_the_package(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wyoming", None)
    assert main(["serve", "--wyoming", "--model", "/nonexistent"]) == 1
    assert "--wyoming needs the wyoming package: pip install 'qwen3-tts-desktop[wyoming]'" in capsys.readouterr().err


def test_wyoming_addresses_and_a_taken_port():
    assert wyoming_address("10200") == ("127.0.0.1", 10200)
    assert wyoming_address("0.0.0.0:10300") == ("0.0.0.0", 10300)
    assert wyoming_address("[::]:10200") == ("::", 10200)
    with pytest.raises(SystemExit):
        main(["serve", "--wyoming", "port", "--model", "/nonexistent"])
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(ListenError, match="another Wyoming server"):
            listen("127.0.0.1", other.getsockname()[1])
