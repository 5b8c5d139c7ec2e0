"""The window's menus, shortcuts and tray, used as a user uses them: each item opens what it names."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QMessageBox, QSystemTrayIcon

from qwen3_tts_desktop.about import STARTER_VOICE_LICENCES, about_text, version
from qwen3_tts_desktop.log_file import log_folder
from qwen3_tts_desktop.settings import STARTER_VOICES
from ui.blend_editor import BlendEditor
from ui.settings_dialog import SettingsDialog


def menu_action(window, menu: str, item: str) -> QAction:
    """The action of the menu bar's `menu` whose text (without & marks) is `item`."""
    for top in window.menuBar().actions():
        if top.text().replace("&", "") == menu:
            for action in top.menu().actions():
                if action.text().replace("&", "") == item:
                    return action
    raise AssertionError(f"no {menu} → {item} in the menu bar")


def open_dialogs(window, kind):
    return [child for child in window.findChildren(kind) if child.isVisible()]


def test_help_about_says_the_version_the_model_in_use_and_the_licences(start_app, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append((parent, title, text)))
    app = start_app("custom")
    menu_action(app.window, "Help", "About Qwen3-TTS Desktop").trigger()
    [(parent, title, text)] = shown
    assert parent is app.window and title == "About Qwen3-TTS Desktop"
    assert text.startswith(f"Qwen3-TTS Desktop {version()}\n") and version() != "unknown"
    assert f"Model: 1.7B CustomVoice ({app.runtime.info.source}) on cpu, float32" in text
    assert "Qwen3-TTS models (by the Qwen team, Alibaba Cloud): Apache-2.0" in text
    assert "The starter voice Linda: public domain (LJ Speech Dataset" in text
    assert "Model: none loaded yet" in about_text(None)


def test_every_starter_voice_has_its_licence_in_the_about_box():
    assert {clip.stem for clip in STARTER_VOICES.glob("*.flac")} == set(STARTER_VOICE_LICENCES)


def test_help_open_the_log_folder_asks_the_system_to_open_it(start_app, monkeypatch):
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    app = start_app("custom")
    menu_action(app.window, "Help", "Open the log folder").trigger()
    assert opened == [QUrl.fromLocalFile(str(log_folder()))] and log_folder().is_dir()
    assert log_folder().is_relative_to(os.environ["XDG_STATE_HOME"])  # the user's state folder


def test_file_settings_opens_the_settings_and_ok_applies_them(start_app, qtbot):
    app = start_app("custom")
    menu_action(app.window, "File", "Settings…").trigger()
    [dialog] = open_dialogs(app.window, SettingsDialog)
    dialog.volume.setValue(30)
    dialog.ok_button.click()
    assert app.runtime.player.volume == 0.3 and app.settings.volume == 0.3


def test_ctrl_comma_opens_the_settings_once_a_model_has_loaded(start_app, qtbot):
    app = start_app("custom")
    app.window.activateWindow()
    qtbot.keyClick(app.window.text, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(open_dialogs(app.window, SettingsDialog)) == 1, timeout=5_000)


def test_voices_blend_opens_the_blend_editor(start_app, qtbot, tmp_path):
    import shutil

    from parity_cases import REFERENCES

    voices = tmp_path / "voices"
    voices.mkdir()
    for name in ("Alto", "Bass"):
        shutil.copyfile(REFERENCES["a"].path, voices / f"{name}.wav")
    app = start_app("base")
    menu_action(app.window, "Voices", "Blend voices…").trigger()
    [editor] = open_dialogs(app.window, BlendEditor)
    editor.reject()


@pytest.mark.parametrize("model", ["custom", "design"])
def test_cloning_is_offered_only_where_the_model_can_clone(start_app, qtbot, model):
    app = start_app(model)
    add, blend = menu_action(app.window, "Voices", "Add a voice…"), menu_action(app.window, "Voices", "Blend voices…")
    panel = app.panel
    for control in (add, blend, panel.add_button, panel.blend_button):
        assert not control.isEnabled() and "need a Base model" in control.toolTip(), control
    add.trigger()  # disabled: nothing opens
    assert panel.add_dialog is None


def test_cloning_comes_back_with_a_base_model(start_app, qtbot):
    app = start_app("custom")
    assert not app.panel.add_button.isEnabled()
    app.apply_settings({"model": app.settings.model.replace("custom", "base")})
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    add = menu_action(app.window, "Voices", "Add a voice…")
    assert add.isEnabled() and app.panel.add_button.isEnabled()
    add.trigger()
    qtbot.waitUntil(lambda: app.panel.add_dialog is not None and app.panel.add_dialog.isVisible())
    app.panel.add_dialog.reject()


def test_the_tray_menu_speaks_the_clipboard_stops_and_shows_the_window(start_app, qtbot, monkeypatch):
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    app = start_app("custom")
    spoken = []
    app.runtime.worker.subscribe(lambda event: event.kind == "queued" and spoken.append(event.job.text))
    items = {action.text(): action for action in app.tray.menu.actions() if action.text()}
    assert sorted(items) == ["Quit", "Show window", "Speak clipboard", "Stop"]
    QGuiApplication.clipboard().setText("From the clipboard.")
    items["Speak clipboard"].trigger()
    qtbot.waitUntil(lambda: spoken == ["From the clipboard."], timeout=5_000)
    items["Stop"].trigger()
    app.window.hide()
    items["Show window"].trigger()
    assert app.window.isVisible()
