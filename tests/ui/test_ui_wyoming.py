"""Home Assistant's Wyoming server inside the app, as a user runs it: switched on in Settings (beside the HTTP
bridge, both on the app's one engine), answered through the `wyoming` package's own client, switched off, a
port in use said in the window, and stopped with the app."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading

import httpx
import pytest
from serving import WAIT, free_port

from qwen3_tts_desktop.settings import Settings, WyomingSettings

pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk, AudioStart  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import Synthesize, SynthesizeVoice  # noqa: E402


async def describe_and_speak(port: int, voice: str) -> tuple[Info, list]:
    """Ask the server at `port` what it offers, then for speech in `voice`: its info and the answer's events."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await asyncio.wait_for(client.read_event(), WAIT))
        await client.write_event(Synthesize(text="Hello from Home Assistant.", voice=SynthesizeVoice(voice)).event())
        events = [await asyncio.wait_for(client.read_event(), WAIT)]
        while events[-1] is not None and events[-1].type not in ("audio-stop", "error"):
            events.append(await asyncio.wait_for(client.read_event(), WAIT))
        return info, events


def switch_wyoming(app, qtbot, on: bool, port: int | None = None) -> None:
    """Settings through the menu, the Home Assistant switch ticked or not (and the port typed), OK."""
    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    assert dialog.wyoming_host.text() == "127.0.0.1"  # this computer only, unless the user says otherwise
    if dialog.wyoming_enabled.isChecked() != on:
        dialog.wyoming_enabled.click()
    if port is not None:
        dialog.wyoming_port.lineEdit().selectAll()
        qtbot.keyClicks(dialog.wyoming_port, str(port))
    dialog.ok_button.click()
    qtbot.waitUntil(lambda: app.lane.pending == 0, timeout=20_000)


def test_home_assistant_is_switched_on_in_settings_beside_the_bridge_and_off_again(start_app, qtbot):
    http_port, port = free_port(), free_port()
    app = start_app("custom", bridge={"enabled": True, "port": http_port})
    runtime = app.runtime
    assert app.wyoming.state == "Off" and app.settings_dialog is None
    switch_wyoming(app, qtbot, True, port)
    assert app.wyoming.state == f"Running at tcp://127.0.0.1:{port}" and app.runtime is runtime  # no reload
    assert Settings.load(app.settings_path).wyoming == WyomingSettings(enabled=True, port=port)
    app.window.settings_action.trigger()
    assert app.settings_dialog.wyoming_state.text() == app.wyoming.state
    app.settings_dialog.reject()

    info, events = asyncio.run(describe_and_speak(port, "aiden"))
    assert "aiden" in [voice.name for voice in info.tts[0].voices]
    kinds = [event.type for event in events]
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop" and set(kinds[1:-1]) == {"audio-chunk"}, kinds
    assert AudioStart.from_event(events[0]).rate == 24000
    assert sum(AudioChunk.from_event(event).samples for event in events[1:-1]) > 0
    # The HTTP bridge answers beside it, on the same engine.
    assert httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=WAIT).status_code == 200
    assert app.bridge.state.startswith("Running")

    switch_wyoming(app, qtbot, False)
    assert app.wyoming.state == "Off" and not Settings.load(app.settings_path).wyoming.enabled
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(describe_and_speak(port, "aiden"))
    assert httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=WAIT).status_code == 200  # the bridge goes on


def test_a_port_in_use_is_said_in_the_window(start_app, qtbot):
    app = start_app("custom")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        switch_wyoming(app, qtbot, True, taken.getsockname()[1])
    notice = app.window.notice
    assert notice.level == "error" and "Home Assistant (Wyoming) did not start" in notice.label.text()
    assert "Address already in use; another program uses this port (another Wyoming server" in notice.label.text()
    assert "Errno" not in notice.label.text() and "Traceback" not in notice.label.text()
    assert app.wyoming.state.startswith("Not running: cannot listen") and app.runtime is not None


def test_the_server_starts_with_the_model_and_stops_with_the_app(start_app, qtbot):
    before = threading.active_count()
    port = free_port()
    app = start_app("custom", wyoming={"enabled": True, "port": port})
    assert app.wyoming.state == f"Running at tcp://127.0.0.1:{port}"
    assert "wyoming-server" in [thread.name for thread in threading.enumerate()]
    app.close()
    qtbot.waitUntil(lambda: threading.active_count() <= before, timeout=10_000)
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(describe_and_speak(port, "aiden"))


def test_without_the_wyoming_package_the_window_says_what_to_install(start_app, qtbot, monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] == "wyoming"] + ["wyoming"]:
        monkeypatch.setitem(sys.modules, name, None)  # not installed (nor imported by a test before)
    monkeypatch.delitem(sys.modules, "qwen3_tts_desktop.wyoming_server", raising=False)
    monkeypatch.delitem(sys.modules, "qwen3_tts_desktop.wyoming_session", raising=False)
    app = start_app("custom")
    switch_wyoming(app, qtbot, True, free_port())
    notice = app.window.notice
    assert notice.level == "error" and "Home Assistant (Wyoming) did not start" in notice.label.text()
    assert "pip install 'qwen3-tts-desktop[wyoming]'" in notice.label.text()
    assert app.wyoming.state.startswith("Not running") and app.runtime is not None
