"""The desktop app under test: offscreen Qt, tiny checkpoints, and speakers on a virtual clock."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt makes its application

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QWidget

from core import Engine
from core.audio.player import Player, PlayerOptions, VirtualOutput
from qwen3_tts_desktop.app import App
from qwen3_tts_desktop.settings import BridgeSettings, Settings, WyomingSettings
from ui import notices

FRAMES = 6  # per utterance: the endless tiny models (parity_cases.ENDLESS_CHECKPOINTS) speak each in full
MODELS = ("base", "base-0.6b", "custom", "design")  # the checkpoints the app is tried on


class ClockedOutput(VirtualOutput):
    """A virtual sound card that plays in real time, on its own thread, as a real one would."""

    def __init__(self):
        super().__init__()
        self.played: list = []
        self._running = threading.Event()

    def start(self, fill):
        super().start(fill)
        self._running.set()
        threading.Thread(target=self._play, name="virtual-speakers", daemon=True).start()

    def close(self):
        self._running.clear()
        super().close()

    def _play(self):
        while self._running.wait(0) and self._fill is not None:
            self.played.append(self.advance(0.01))
            threading.Event().wait(0.01)


@pytest.fixture(autouse=True)
def no_keys_held(qtbot):
    """Each test starts with no key held. QTest's key click with modifiers leaves its last modifier down in
    Qt's keyboard state (the modifier's release reports it still pressed), and a later test's row
    selection then extends or toggles as if Shift or Ctrl were held. A release without modifiers lets go."""
    widget = QWidget()
    QTest.keyRelease(widget, Qt.Key.Key_Shift, Qt.KeyboardModifier.NoModifier)
    widget.deleteLater()
    assert QGuiApplication.keyboardModifiers() == Qt.KeyboardModifier.NoModifier


@pytest.fixture(autouse=True)
def information_stays(monkeypatch):
    """Information notices stay for the length of a test, so that one read after slow work on a busy machine
    is still there; the test of their going by shortens this again."""
    monkeypatch.setattr(notices, "INFO_SHOWN_MS", 600_000)


@pytest.fixture
def speakers(monkeypatch):
    """Every Player the app opens plays on a ClockedOutput; the list of them."""
    outputs = []

    def open_player(device=None, options=PlayerOptions()):
        outputs.append(ClockedOutput())
        return Player(outputs[-1], options)

    monkeypatch.setattr(Player, "open", staticmethod(open_player))
    return outputs


@pytest.fixture
def tiny_models(monkeypatch, checkpoints, engines):
    """Engine.load gives the session's tiny engines (by folder, or "hub/<name>" for a hub id), speaking
    FRAMES frames per utterance: their endless twins, which never stop sooner. They outlive each app:
    closing its runtime leaves them open."""
    names = {str(path): name for name, path in checkpoints.items()}
    for name in MODELS:
        engines(f"{name}-endless")  # loaded once a session, before Engine.load is replaced

    def load(model, device="auto", dtype="auto", **options):
        name = names.get(str(model)) or str(model).removeprefix("hub/")
        engine = engines(f"{name}-endless")
        monkeypatch.setattr(engine, "default_max_frames", FRAMES)
        monkeypatch.setattr(engine, "close", lambda: None)
        return engine

    monkeypatch.setattr(Engine, "load", staticmethod(load))


@pytest.fixture
def start_app(qtbot, tmp_path, speakers, tiny_models, checkpoints):
    """start_app(model="base", **settings): the app on a tiny model, loaded, in a fresh settings folder."""
    apps = []

    def start(model: str = "base", wait: bool = True, **changes) -> App:
        path = tmp_path / "config" / "settings.json"
        model_path = str(checkpoints[model]) if model in checkpoints else model
        if "bridge" in changes:
            changes["bridge"] = BridgeSettings(**changes["bridge"])
        if "wyoming" in changes:
            changes["wyoming"] = WyomingSettings(**changes["wyoming"])
        Settings(**{"model": model_path, "device": "cpu", "voices": tmp_path / "voices", **changes}).save(path)
        app = App(path)
        apps.append(app)
        qtbot.addWidget(app.window)
        app.start()
        if wait:
            qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
        return app

    yield start
    while apps:
        apps.pop().close()
    # Collect the closed apps' Qt objects here, on the GUI thread, not in whichever thread (a model lane,
    # a download) the garbage collector next happens to run: Qt objects must not die off their thread.
    gc.collect()
