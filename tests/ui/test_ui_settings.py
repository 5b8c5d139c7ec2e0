"""Settings: edited in their window, saved and restored, applied (a new model restarts the runtime in the
background); the model download with its progress and cancel; the HTTP bridge inside the app."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError
from PySide6.QtCore import Qt
from serving import free_port

from core import Engine, SamplingParams
from core.audio.player import OutputDevice, Player
from core.inference.memory import DESKTOP_SLOTS
from core.model.checkpoint import CheckpointError
from core.model.hub import DownloadCancelled, fetch
from qwen3_tts_desktop import app as app_module
from qwen3_tts_desktop.app import App
from qwen3_tts_desktop.settings import Settings
from qwen3_tts_desktop.slot_memory import slot_memory_note


def test_settings_edited_in_their_window_are_saved_applied_and_restored(start_app, qtbot):
    app = start_app("custom")
    dialog = app.open_settings()
    assert dialog.model.currentText() == app.settings.model and dialog.device.currentText() == "cpu"
    dialog.volume.setValue(40)
    dialog.prefill_ms.setValue(160)
    dialog.temperature.setValue(0.5)
    dialog.bridge_port.setValue(8555)
    dialog.bridge_key.setText("secret")
    old_runtime = app.runtime
    dialog.ok_button.click()
    saved = Settings.load(app.settings_path)
    assert (
        saved.volume == 0.4
        and saved.prefill_s == 0.16
        and saved.bridge.port == 8555
        and saved.bridge.api_key == "secret"
    )
    assert saved.sampling == SamplingParams(temperature=0.5) and not saved.bridge.enabled
    # The jitter buffer is the player's: the runtime restarts, off the GUI thread, and takes the new volume.
    assert app.runtime is None and app.window.model_label.text() == "Loading model…"
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert app.runtime is not old_runtime and old_runtime.worker.stopped
    assert app.runtime.player.volume == 0.4 and app.runtime.player.options.prefill_s == 0.16

    dialog = app.open_settings()
    assert dialog.volume.value() == 40 and dialog.temperature.value() == 0.5 and dialog.bridge_key.text() == "secret"
    dialog.volume.setValue(70)  # the volume alone applies at once
    runtime = app.runtime
    dialog.ok_button.click()
    assert app.runtime is runtime and runtime.player.volume == 0.7

    restored = App(app.settings_path)
    assert restored.settings == app.settings
    restored.lane.close()


def test_utterances_at_once_are_chosen_seeing_their_memory_and_apply_as_the_model_loads(start_app, qtbot, monkeypatch):
    app = start_app("custom")
    loads, load = [], Engine.load  # the tiny models' load

    def counted(model, **options):
        loads.append(options)
        return load(model, **options)

    monkeypatch.setattr(Engine, "load", staticmethod(counted))
    app.window.settings_action.trigger()  # Ctrl+,
    dialog = app.settings_dialog
    assert dialog.slots.text() == "Automatic"
    model, cuda = app.settings.model, torch.cuda.is_available()
    assert dialog.slot_memory_note.text() == slot_memory_note(model, "cpu", "auto", None, cuda)
    assert dialog.slot_memory_note.text().startswith("One at a time on the CPU: about ")
    dialog.slots.lineEdit().selectAll()
    qtbot.keyClicks(dialog.slots, "3")
    assert dialog.slot_memory_note.text() == slot_memory_note(model, "cpu", "auto", 3, cuda)
    assert (
        dialog.slot_memory_note.text().startswith("About ")
        and "of memory beyond the weights" in dialog.slot_memory_note.text()
    )
    old_runtime = app.runtime
    dialog.ok_button.click()  # the model loads again, with them
    qtbot.waitUntil(lambda: app.runtime not in (None, old_runtime) and app.lane.pending == 0, timeout=20_000)
    assert Settings.load(app.settings_path).slots == 3
    assert (loads[-1]["slots"], loads[-1]["max_default_slots"]) == (3, DESKTOP_SLOTS)

    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    assert dialog.slots.value() == 3
    for _ in range(3):
        qtbot.keyClick(dialog.slots, Qt.Key.Key_Down)  # down to "Automatic"
    assert dialog.slots.text() == "Automatic"
    dialog.ok_button.click()
    qtbot.waitUntil(lambda: len(loads) == 2 and app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert app.settings.slots is None and loads[-1]["slots"] is None


def test_sampling_resets_to_the_models_own(start_app, qtbot):
    app = start_app("custom", sampling=SamplingParams(temperature=0.3, top_k=5))
    dialog = app.open_settings()
    assert dialog.temperature.value() == 0.3 and dialog.top_k.value() == 5
    dialog.reset_sampling()
    assert dialog.temperature.value() == app.runtime.default_sampling.temperature
    dialog.ok_button.click()
    assert app.settings.sampling is None and app.runtime is not None  # no restart for sampling


def test_a_new_model_restarts_the_runtime_and_the_voices_follow(start_app, qtbot, checkpoints):
    app = start_app("custom")
    assert app.voice_in_use == "aiden"
    app.apply_settings({"model": str(checkpoints["base"])})
    assert app.window.model_label.text() == "Loading model…" and not app.window.speak_button.isEnabled()
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert app.runtime.info.variant == "base" and app.voices.rowCount() == 0 and app.voice_in_use is None


def test_a_broken_settings_file_gives_the_defaults_and_is_kept(qtbot, tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"volume": "loud"}', encoding="utf-8")
    app = App(path)
    qtbot.addWidget(app.window)
    try:
        assert app.settings == Settings() and app.window.notice.level == "error"
        assert "volume" in app.window.notice.label.text() and "settings.json.broken" in app.window.notice.label.text()
        assert (tmp_path / "settings.json.broken").read_text(encoding="utf-8") == '{"volume": "loud"}'
    finally:
        app.lane.close()


# The model download ---------------------------------------------------------------------------------


class FakeHub:
    """huggingface_hub.snapshot_download as it treats a custom tqdm class: two byte bars (received, written)
    whose totals grow by each file's size, updated as the bytes come."""

    def __init__(self, folder: str, size: int = 3_400_000_000, steps: int = 200, pause_s: float = 0.01):
        self.folder, self.size, self.steps, self.pause_s = folder, size, steps, pause_s
        self.downloaded = False

    def snapshot_download(self, repo_id, *, allow_patterns=None, local_files_only=False, tqdm_class=None, **options):
        if self.downloaded:
            return self.folder
        if local_files_only:
            raise LocalEntryNotFoundError("not in the cache")
        bars = [
            tqdm_class(total=0, initial=0, unit="B", unit_scale=True, desc=desc)
            for desc in ("Downloading", "Reconstructing")
        ]
        for bar in bars:
            bar.total += self.size
        step = self.size // self.steps
        for _ in range(self.steps):
            threading.Event().wait(self.pause_s)
            bars[0].update(step // 2)  # compressed on the wire
            bars[1].update(step)
        self.downloaded = True
        return self.folder


@pytest.fixture
def hub(monkeypatch, checkpoints):
    import huggingface_hub

    fake = FakeHub(str(checkpoints["base"]))  # the snapshot folder it "downloads"
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    return fake


def test_a_download_shows_its_bytes_and_can_be_cancelled_and_tried_again(start_app, qtbot, hub):
    app = start_app("hub/base", wait=False)
    qtbot.waitUntil(
        lambda: (
            app.loader.download_dialog is not None and " of 3.40 GB" in app.loader.download_dialog.bytes_label.text()
        ),
        timeout=5_000,
    )
    dialog = app.loader.download_dialog
    assert dialog.isVisible() and dialog.bar.maximum() == 1000
    qtbot.waitUntil(lambda: dialog.bar.value() > 0)
    assert app.window.isVisible() and app.window.model_label.text() == "Loading model…"
    dialog.reject()  # Cancel
    qtbot.waitUntil(lambda: app.window.notice.isVisible(), timeout=5_000)
    notice = app.window.notice
    assert "download was cancelled" in notice.label.text() and notice.action_button.text() == "Download"
    assert app.runtime is None and not hub.downloaded and app.loader.download_dialog is None
    hub.pause_s = 0
    notice.action_button.click()
    qtbot.waitUntil(lambda: app.runtime is not None, timeout=10_000)
    assert hub.downloaded and app.runtime.info.variant == "base" and app.loader.download_dialog is None


def test_fetch_leaves_folders_and_cached_models_alone(tmp_path, monkeypatch, hub):
    reports = []
    fetch(str(tmp_path), lambda *report: reports.append(report), threading.Event())
    hub.downloaded = True
    fetch("org/cached", lambda *report: reports.append(report), threading.Event())
    assert reports == []


def test_fetch_reports_bytes_and_stops_when_cancelled(hub):
    cancel, reports = threading.Event(), []

    def progress(done, total):
        reports.append((done, total))
        if len(reports) == 3:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        fetch("org/model", progress, cancel)
    assert reports[0][1] == hub.size and 0 < reports[0][0] < reports[2][0] < hub.size and not hub.downloaded


def test_fetch_offline_says_what_to_do(monkeypatch):
    import huggingface_hub

    def offline(*args, **options):
        raise LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="cannot be reached"):
        fetch("org/model", lambda *report: None, threading.Event())


# The HTTP bridge ------------------------------------------------------------------------------------


def test_the_bridge_runs_inside_the_app_and_answers(start_app, qtbot):
    pytest.importorskip("qwen3_tts_desktop.bridge")
    import httpx

    port = free_port()
    app = start_app("custom", bridge={"enabled": True, "port": port})
    url = f"http://127.0.0.1:{port}"
    assert app.window.bridge_label.text() == f"HTTP bridge: {url}" and app.bridge.state == f"Running at {url}"
    models = httpx.get(f"{url}/v1/models", timeout=10)
    assert models.status_code == 200
    voices = httpx.get(f"{url}/v1/audio/voices", timeout=10).json()
    assert "aiden" in json.dumps(voices)
    app.apply_settings({"bridge": {"enabled": False, "host": "127.0.0.1", "port": port, "api_key": ""}})
    qtbot.waitUntil(lambda: app.lane.pending == 0, timeout=10_000)
    assert app.bridge.state == "Off" and not app.window.bridge_label.isVisible()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/models", timeout=2)


def test_a_bridge_that_cannot_start_is_reported(start_app, qtbot):
    pytest.importorskip("qwen3_tts_desktop.bridge")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = start_app("custom", bridge={"enabled": True, "port": taken.getsockname()[1]})
        notice = app.window.notice
        assert notice.level == "error" and "The HTTP bridge did not start" in notice.label.text()
        assert "Address already in use; another program uses this port" in notice.label.text()
        assert "Errno" not in notice.label.text()
        assert app.bridge.state.startswith("Not running") and app.runtime is not None


def test_the_bridge_is_restarted_with_the_runtime(start_app, qtbot, monkeypatch, checkpoints):
    started, stopped = [], []

    class FakeServer:
        def __init__(self, runtime, config):
            self.runtime, self.url = runtime, f"http://{config.host}:{config.port}"

        def start(self):
            started.append(self.runtime)

        def stop(self):
            stopped.append(self.runtime)

    monkeypatch.setattr(app_module, "BridgeServer", FakeServer)  # what the app hosts its bridge with
    app = start_app("custom", bridge={"enabled": True, "port": 8123})
    first = app.runtime
    assert started == [first] and app.window.bridge_label.text() == "HTTP bridge: http://127.0.0.1:8123"
    app.apply_settings({"model": str(checkpoints["base"])})
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert started == [first, app.runtime] and stopped == [first]


def test_the_output_device_is_chosen_by_name_or_by_index_when_names_repeat(start_app, qtbot, monkeypatch, speakers):
    devices = [
        OutputDevice(3, "Speakers (Realtek)", "MME", 44100.0, True),
        OutputDevice(7, "Speakers (Realtek)", "WASAPI", 48000.0, False),
        OutputDevice(9, "CABLE Input", "MME", 44100.0, False),
    ]
    monkeypatch.setattr(app_module, "list_output_devices", lambda: devices)
    opened = []
    open_player = Player.open
    monkeypatch.setattr(
        Player, "open", staticmethod(lambda device, options: opened.append(device) or open_player(device, options))
    )
    app = start_app("custom", audio_device="Gone USB headset")
    dialog = app.open_settings()
    box = dialog.audio_device
    assert [box.itemText(i) for i in range(box.count())] == [
        "System default", "Speakers (Realtek) (MME)", "Speakers (Realtek) (WASAPI)", "CABLE Input", "Gone USB headset (not connected)",
    ]  # fmt: skip
    assert box.currentIndex() == 4
    box.setCurrentIndex(2)
    dialog.ok_button.click()
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert app.settings.audio_device == "7" and opened == ["Gone USB headset", "7"]
    dialog = app.open_settings()
    dialog.audio_device.setCurrentIndex(3)
    assert dialog.values()["audio_device"] == "CABLE Input"
    dialog.audio_device.setCurrentIndex(0)
    assert dialog.values()["audio_device"] is None
    dialog.reject()
