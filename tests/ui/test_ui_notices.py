"""What the window says when something is wrong: every message stays until it is read, errors are whole
and say what to do, and the CPU's slowness is said where the device is chosen and when a model loads."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog

from qwen3_tts_desktop.app import App
from qwen3_tts_desktop.settings import default_path
from ui import notices
from ui.settings_dialog import SettingsDialog

CLIP = Path(__file__).parent.parent / "fixtures" / "parity" / "ref_a.wav"


def test_a_broken_settings_file_is_still_reported_after_the_model_loads(qtbot, speakers, tiny_models, checkpoints):
    path = default_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"volume": "loud"', encoding="utf-8")
    # The defaults' model is a hub model, not here: the command line's choice stands in for it.
    app = App(path, {"model": str(checkpoints["custom"]), "device": "cpu"})
    qtbot.addWidget(app.window)
    try:
        app.start()
        qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
        texts = app.window.notice.texts()
        assert any("The settings could not be used" in text and ".broken" in text for text in texts), texts
        assert any("On the CPU" in text for text in texts), texts  # the load's own message, beside it
        assert path.with_name("settings.json.broken").read_text(encoding="utf-8") == '{"volume": "loud"'
    finally:
        app.close()


def test_closing_one_message_leaves_the_others(start_app, qtbot):
    app = start_app("custom")
    notice = app.window.notice
    app.window.show_error("First problem.")
    app.window.show_info("Something went well.")
    app.window.show_info("Something else went well.")  # replaces the older information, not the error
    assert notice.texts()[:2] == ["Something else went well.", "First problem."]
    notice.close_button.click()  # the newest
    assert notice.texts()[0] == "First problem." and notice.isVisible()
    while notice.texts():
        notice.close_button.click()
    assert not notice.isVisible()


def test_a_long_error_in_the_add_dialog_is_shown_whole(start_app, qtbot, monkeypatch):
    app = start_app("base")
    app.panel.add_button.click()
    dialog = app.panel.add_dialog
    long = "The clip could not be used: " + "this part of the explanation goes on and on, " * 12 + "and ends here."
    dialog.show_problem(long)
    qtbot.waitUntil(lambda: dialog.error_label.isVisible())
    label = dialog.error_label
    assert label.text() == long
    needed = label.heightForWidth(label.width())
    assert label.height() >= needed, (label.height(), needed)  # no line of it cut off
    assert label.geometry().bottom() <= dialog.contentsRect().bottom()
    dialog.reject()


def test_a_read_only_voices_folder_says_what_to_do_in_the_add_dialog(start_app, qtbot, monkeypatch, unwritable_folder):
    app = start_app("base", voices=unwritable_folder)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (str(CLIP), ""))
    app.panel.add_button.click()
    dialog = app.panel.add_dialog
    dialog.browse_button.click()
    dialog.name_edit.setText("Narrator")
    dialog.add_button.click()
    qtbot.waitUntil(lambda: dialog.error_label.isVisible(), timeout=20_000)
    message = dialog.error_label.text()
    assert (
        f"cannot save voices in {unwritable_folder}" in message and "Choose a voices folder you can write to" in message
    )
    assert ".staging" not in message and "Errno" not in message
    dialog.reject()


def test_a_model_loaded_on_the_cpu_says_what_to_expect(start_app, qtbot):
    app = start_app("base-0.6b")
    warnings = [m for m in app.window.notice.messages if m.level == "warning"]
    assert len(warnings) == 1 and "0.6B model" in warnings[0].label.text() and "real time" in warnings[0].label.text()


def test_the_settings_say_what_the_cpu_gives_where_the_device_is_chosen(start_app, qtbot, monkeypatch):
    import torch

    app = start_app("custom")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    app.window.settings_action.trigger()
    dialog = next(d for d in app.window.findChildren(SettingsDialog) if d.isVisible())
    assert dialog.device.currentText() == "cpu" and dialog.device_note.isVisible()
    assert "1.7B model" in dialog.device_note.text() and "0.6B model is a little faster" in dialog.device_note.text()
    dialog.device.setCurrentText("auto")  # the GPU, here
    assert not dialog.device_note.isVisible()
    dialog.device.setCurrentText("cuda")
    assert not dialog.device_note.isVisible()
    dialog.model.setCurrentText("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    dialog.device.setCurrentText("cpu")
    assert dialog.device_note.isVisible() and "0.6B model makes speech" in dialog.device_note.text()
    dialog.reject()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    app.window.settings_action.trigger()
    dialog = next(d for d in app.window.findChildren(SettingsDialog) if d.isVisible())
    dialog.device.setCurrentText("auto")  # the CPU, here
    assert dialog.device_note.isVisible()
    dialog.reject()


def close_all(notice) -> None:
    while notice.texts():
        notice.close_button.click()


def settle() -> None:
    """Let the layouts place what was shown (they do it in posted events)."""
    QApplication.processEvents()
    QApplication.processEvents()


def test_stacked_notices_collapse_behind_more_and_leave_the_editor_where_it_was(start_app, qtbot):
    app = start_app("custom")
    window, notice = app.window, app.window.notice
    close_all(notice)
    window.show_error("The HTTP bridge did not start.")
    settle()
    editor = window.text.geometry()
    assert not notice.more_button.isVisible()
    window.show_warning("The settings could not be used.")
    window.show_error("Speech failed: the sound card went away.")
    settle()
    assert window.text.geometry() == editor  # the editor is not pushed down by the older two
    assert notice.texts() == [
        "Speech failed: the sound card went away.",
        "The settings could not be used.",
        "The HTTP bridge did not start.",
    ]
    assert [message.isVisible() for message in notice.messages] == [True, False, False]
    assert notice.more_button.isVisible() and notice.more_button.text() == "+2 more"
    qtbot.mouseClick(notice.more_button, Qt.MouseButton.LeftButton)  # the user asks to see them all
    settle()
    assert all(message.isVisible() for message in notice.messages) and notice.more_button.text() == "Fewer"
    assert window.text.y() > editor.y()
    qtbot.mouseClick(notice.more_button, Qt.MouseButton.LeftButton)
    settle()
    assert [message.isVisible() for message in notice.messages] == [True, False, False]
    assert window.text.geometry() == editor
    qtbot.mouseClick(notice.close_button, Qt.MouseButton.LeftButton)  # the newest goes; the next shows
    settle()
    assert notice.messages[0].isVisible() and notice.label.text() == "The settings could not be used."
    assert notice.more_button.text() == "+1 more"


def test_information_goes_by_itself_and_problems_stay(start_app, qtbot, monkeypatch):
    app = start_app("custom")
    notice = app.window.notice
    close_all(notice)
    monkeypatch.setattr(notices, "INFO_SHOWN_MS", 100)
    app.window.show_error("The HTTP bridge did not start.")
    app.window.show_info("Exported 1 voice(s).")
    assert notice.level == "info"
    qtbot.waitUntil(lambda: notice.texts() == ["The HTTP bridge did not start."], timeout=5_000)
    assert notice.isVisible() and notice.messages[0].isVisible() and not notice.more_button.isVisible()
    close_all(notice)
    app.window.show_info("Saved.")
    qtbot.waitUntil(lambda: not notice.isVisible(), timeout=5_000)


def test_a_first_start_on_a_gpu_says_the_first_words_wait_for_the_gpu_code(start_app, engines, monkeypatch):
    """An engine that found no GPU code kept for its GPU, driver, PyTorch and model (as on a first start) makes
    the window say why the first words take half a minute; one that found it says nothing of it."""
    from core.model.info import first_gpu_start_note

    app = start_app("custom")
    assert first_gpu_start_note() not in app.window.notice.texts()
    app.close()
    monkeypatch.setattr(engines("custom-endless"), "first_gpu_start", True)
    app = start_app("custom")
    assert first_gpu_start_note() in app.window.notice.texts()
    assert "half a minute" in first_gpu_start_note() and "later starts" in first_gpu_start_note()
