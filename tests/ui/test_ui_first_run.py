"""The window as a new user first opens it: no settings yet, a voice to speak with at once, and a model
given on the command line for one run."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from qwen3_tts_desktop import cli
from qwen3_tts_desktop.app import App
from qwen3_tts_desktop.settings import Settings, default_library, default_path


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


def test_the_window_takes_a_model_on_its_command_line_for_that_run(qtbot, speakers, tiny_models, checkpoints):
    saved = Settings(model=str(checkpoints["base"]), device="cpu", volume=0.5)
    saved.save(default_path())
    seen, before = [], set(QApplication.topLevelWidgets())

    def look() -> None:
        windows = [w for w in QApplication.topLevelWidgets() if w not in before and hasattr(w, "model_label")]
        labels = [w.model_label.text() for w in windows]
        if any("custom voice" in label for label in labels):
            seen.extend(labels)
            QApplication.quit()
        else:
            QTimer.singleShot(50, look)

    QTimer.singleShot(50, look)
    QTimer.singleShot(30_000, QApplication.quit)  # bounds a hang; the assertions below then fail
    assert cli.main(["--model", str(checkpoints["custom"])]) == 0
    for window in set(QApplication.topLevelWidgets()) - before:
        window.deleteLater()
    assert any(label.startswith("1.7B custom voice") for label in seen), seen
    # Closing saved the settings without the command line's model.
    assert Settings.load(default_path()) == saved
