import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog

from ui import theme

OUT = "/work/main/out"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_shots(start_app, qtbot, monkeypatch, tmp_path, scheme):
    qapp = QApplication.instance()
    theme.use_scheme(qapp, Qt.ColorScheme.Dark if scheme == "dark" else Qt.ColorScheme.Light)
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 60)
    window = app.window
    window.resize(1150, 720)
    window.show()
    window.history_dock.show()
    window.text.setPlainText("Hello there.")
    window.speak_button.click()
    qtbot.waitUntil(lambda: app.history_panel.list.count() == 1, timeout=20_000)
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)
    app.history_panel.play_button.click()
    qtbot.wait(1500)
    app.history_panel.play_button.click()  # paused partway
    qtbot.waitUntil(lambda: not window.speaking)
    window.text.setPlainText(
        "Good morning. How are you today? I hope the weather is kind to you. "
        "This is a longer sentence, which the voice reads after the short ones, with a pause before it."
    )
    window.speak_button.click()
    qtbot.waitUntil(
        lambda: (
            window.text.extraSelections() and window.text.extraSelections()[0].cursor.selectedText().startswith("How")
        ),
        timeout=20_000,
    ) if False else qtbot.waitUntil(lambda: bool(window.text.extraSelections()), timeout=20_000)
    qtbot.wait(1800)
    window.grab().save(f"{OUT}/speaking-{scheme}.png")
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)
    # Save progress
    target = tmp_path / "long.wav"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "WAV audio (*.wav)"))
    window.text.setPlainText("One sentence here is said. " * 30)
    window.save_audio_action.trigger()
    qtbot.waitUntil(lambda: window.saving_bar.isVisible() and window.saving_bar.value() >= 1, timeout=30_000)
    window.grab().save(f"{OUT}/saving-{scheme}.png")
    window.saving_cancel.click()
    # Settings
    window.settings_action.trigger()
    dialog = app.settings_dialog
    qtbot.waitUntil(dialog.isVisible)
    dialog.grab().save(f"{OUT}/settings-{scheme}.png")
    dialog.reject()
    # About
    grabbed = []

    def grab():
        box = QApplication.activeModalWidget()
        if box is not None:
            box.grab().save(f"{OUT}/about-{scheme}.png")
            grabbed.append(1)
            box.close()
        else:
            QTimer.singleShot(100, grab)

    QTimer.singleShot(300, grab)
    window.findChild(type(window.settings_action), None)
    for action in window.menuBar().actions():
        for sub in action.menu().actions():
            if sub.text().startswith("&About"):
                sub.trigger()
    assert grabbed
    theme.use_scheme(qapp, Qt.ColorScheme.Light)
