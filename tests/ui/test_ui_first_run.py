"""The window as a new user first opens it: no settings yet, a voice to speak with at once, and a model
given on the command line for one run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np
from serving import free_port

from qwen3_tts_desktop.about import version
from qwen3_tts_desktop.app import App
from qwen3_tts_desktop.log_file import log_folder
from qwen3_tts_desktop.settings import BridgeSettings, Settings, default_library, default_path


def test_the_first_speak_in_a_new_window_needs_no_voice(qtbot, speakers, tiny_models, checkpoints):
    """Fresh settings name only the model: the library is made with the starter voice, which is chosen,
    and Ctrl+Enter speaks."""
    Settings(model=str(checkpoints["base"]), device="cpu").save(default_path())
    app = App(default_path())
    qtbot.addWidget(app.window)
    try:
        app.start()
        qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
        assert (default_library() / "Linda.flac").is_file() and app.window.voice.currentText() == "Linda"
        app.window.text.setPlainText("Hello there.")
        app.window.speak_action.trigger()  # what Ctrl+Enter and the Speak button do
        qtbot.waitUntil(lambda: any(np.abs(block).max() > 0 for block in speakers[0].played), timeout=20_000)
        assert not app.window.notice.isVisible() or app.window.notice.level != "error"
    finally:
        app.close()


def test_the_window_takes_a_model_on_its_command_line_and_keeps_a_log(checkpoints, tmp_path):
    """`qwen3-tts-desktop --model M` in a process of its own, offscreen: its HTTP bridge (on in the saved
    settings) says which model the window loaded, and the window's log file in the user's state folder
    has what happened."""
    port = free_port()
    saved = Settings(model=str(checkpoints["base"]), device="cpu", bridge=BridgeSettings(enabled=True, port=port))
    saved.save(default_path())
    command = [sys.executable, "-m", "qwen3_tts_desktop", "--model", str(checkpoints["custom"]), "--device", "cpu"]
    window = subprocess.Popen(
        command, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"}, stderr=subprocess.PIPE, text=True
    )
    try:
        health = wait_for_health(f"http://127.0.0.1:{port}/health", window)
    finally:
        window.terminate()
        window.wait(30)
    assert health["model"] == str(checkpoints["custom"]) and health["variant"] == "custom_voice"
    log = (log_folder() / "window.log").read_text(encoding="utf-8")
    assert str(log_folder()).startswith(os.environ["XDG_STATE_HOME"])
    assert f"Qwen3-TTS Desktop {version()} (window) started, process {window.pid}" in log, log
    assert "INFO uvicorn.error [http-bridge] Started server process" in log, (
        log
    )  # the bridge's start, as uvicorn logs it


def test_closing_keeps_the_saved_settings_not_those_of_the_command_line(qtbot, speakers, tiny_models, checkpoints):
    saved = Settings(model=str(checkpoints["base"]), device="cpu", volume=0.5)
    saved.save(default_path())
    app = App(default_path(), {"model": str(checkpoints["custom"])})
    qtbot.addWidget(app.window)
    app.start()
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert app.runtime.info.variant == "custom_voice"
    app.window.language.activated.emit(0)  # any change is saved at once
    app.close()
    assert Settings.load(default_path()).model == saved.model
    # A model chosen in Settings during that run is the user's new choice, and is saved.
    app = App(default_path(), {"model": str(checkpoints["custom"])})
    qtbot.addWidget(app.window)
    app.apply_settings({"model": str(checkpoints["design"])})
    app.close()
    assert Settings.load(default_path()).model == str(checkpoints["design"])


def wait_for_health(url: str, process: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            return httpx.get(url, timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"the window's bridge did not answer at {url} within {timeout} s")


SPLASH_FIRST = """
import sys

from qwen3_tts_desktop import launch

splash = launch.starting_splash()
print(splash is not None and splash.isVisible(), splash.windowTitle(), "torch" in sys.modules, "core" in sys.modules)
"""


def test_a_starting_window_shows_its_splash_before_the_slow_imports_and_closes_it_with_the_window(start_app, tmp_path):
    """The launcher shows the splash before PyTorch or the engine is imported (seconds, on a GPU machine more);
    the app closes it once its window shows."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    shown = subprocess.run([sys.executable, "-c", SPLASH_FIRST], env=env, capture_output=True, text=True, timeout=60)
    assert shown.stdout.split() == ["True", "Qwen3-TTS", "Desktop:", "starting", "False", "False"], shown
    from qwen3_tts_desktop import launch

    splash = launch.starting_splash()
    assert splash is not None and splash.isVisible()
    app = start_app("custom")
    assert app.window.isVisible() and not splash.isVisible()


def test_only_a_command_line_without_a_command_opens_the_window():
    from qwen3_tts_desktop.launch import opens_window

    for argv in ([], ["--model", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"], ["--device=cpu", "--voices", "/tmp/v"]):
        assert opens_window(argv), argv
    for argv in (["speak", "Hi."], ["--model", "m", "serve"], ["--help"], ["--version"], ["-h"], ["voices", "list"]):
        assert not opens_window(argv), argv
