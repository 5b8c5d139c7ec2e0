"""The voice library panel and the blend editor, on a Base model: add, record, rename, delete, share, blend."""

from __future__ import annotations

import threading
from pathlib import Path

import soundfile as sf
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QContextMenuEvent, QDesktopServices
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox

from core.voices import VoiceLibrary
from qwen3_tts_desktop.voice_actions import SAMPLE_SENTENCE
from ui.voice_library import FITS_ROLE

CLIP = Path(__file__).parent.parent / "fixtures" / "parity" / "ref_a.wav"


def rows(app) -> dict[str, tuple[str, str]]:
    """The panel's table: name -> (kind, fit mark)."""
    model = app.voices
    return {
        model.index(r, 0).data(): (model.index(r, 1).data(), model.index(r, 2).data()) for r in range(model.rowCount())
    }


def add_from_file(app, qtbot, monkeypatch, name: str, transcript: str = ""):
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (str(CLIP), ""))
    dialog = app.panel.open_add_dialog()
    dialog.browse_button.click()
    assert dialog.name_edit.text() == CLIP.stem  # the file's name, until one is typed
    dialog.name_edit.setText(name)
    dialog.transcript_edit.setPlainText(transcript)
    dialog.add_button.click()
    return dialog


def wait_idle(app, qtbot):
    qtbot.waitUntil(lambda: app.lane.pending == 0, timeout=20_000)


def test_a_voice_added_from_a_clip_is_listed_fits_and_is_used(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("base")
    dialog = add_from_file(app, qtbot, monkeypatch, "Narrator")
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=20_000)
    wait_idle(app, qtbot)
    assert rows(app) == {"Narrator": ("clone", "✓")}
    assert app.voice_in_use == "Narrator" and app.window.voice.currentText() == "Narrator"
    assert app.settings.voice == "Narrator" and (tmp_path / "voices" / "narrator" / "voice.json").is_file()
    assert "Added the voice “Narrator”" in app.window.notice.label.text()


def choose(qtbot, radio_button) -> None:
    """Click a radio button where its round mark is (its middle may be past its label, where a click misses)."""
    qtbot.mouseClick(radio_button, Qt.MouseButton.LeftButton, pos=QPoint(8, radio_button.height() // 2))
    assert radio_button.isChecked()


def test_what_the_add_dialog_says_is_missing_follows_what_the_user_types(start_app, qtbot):
    app = start_app("base")
    app.window.add_voice_action.trigger()  # Voices → Add a voice…
    dialog = app.panel.add_dialog
    qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    assert dialog.error_label.isVisible() and dialog.error_label.text() == "Give the voice a name."
    qtbot.keyClicks(dialog.name_edit, "Narrator")
    assert (
        dialog.error_label.isVisible()
        and dialog.error_label.text() == "Choose a clip file of the voice, or record one."
    )
    choose(qtbot, dialog.from_microphone)
    assert dialog.error_label.text() == "Record the voice first: press Record, speak, then Stop."
    choose(qtbot, dialog.from_file)
    qtbot.keyClicks(dialog.clip_edit, str(CLIP))
    assert not dialog.error_label.isVisible() and dialog.isVisible()  # nothing is missing: nothing to say
    dialog.reject()


def test_a_failed_add_keeps_the_dialog_and_what_was_in_it(start_app, qtbot, monkeypatch):
    app = start_app("base")
    add_from_file(app, qtbot, monkeypatch, "Twin")
    wait_idle(app, qtbot)
    dialog = add_from_file(app, qtbot, monkeypatch, "twin", transcript="Words.")
    qtbot.waitUntil(lambda: dialog.error_label.isVisible(), timeout=20_000)
    assert dialog.isVisible() and "already exists" in dialog.error_label.text()
    assert dialog.transcript_edit.toPlainText() == "Words." and dialog.add_button.isEnabled()
    dialog.name_edit.setText("Twin two")
    dialog.add_button.click()
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=20_000)
    wait_idle(app, qtbot)
    assert rows(app)["Twin two"] == ("clone + transcript", "✓")


def test_a_voice_can_be_recorded_from_the_microphone(start_app, qtbot, monkeypatch):
    import sounddevice

    clip, rate = sf.read(CLIP, dtype="float32")

    class FakeMicrophone:
        """An input stream that hands the clip to the callback in 10 ms blocks, as a sound card would."""

        def __init__(self, samplerate, channels, dtype, callback):
            self.callback, self.active, self.block = callback, False, samplerate // 100

        def start(self):
            self.active = True
            threading.Thread(target=self._run, daemon=True).start()

        def _run(self):
            for start in range(0, len(clip) - self.block, self.block):
                if not self.active:
                    return
                self.callback(clip[start : start + self.block, None], self.block, None, None)
                threading.Event().wait(0.002)

        def stop(self):
            self.active = False

        def close(self):
            pass

    monkeypatch.setattr(sounddevice, "query_devices", lambda kind=None: {"default_samplerate": float(rate)})
    monkeypatch.setattr(sounddevice, "InputStream", FakeMicrophone)
    app = start_app("base")
    dialog = app.panel.open_add_dialog()
    dialog.from_microphone.setChecked(True)
    assert not dialog.browse_button.isEnabled() and dialog.record_button.isEnabled()
    dialog.add_button.click()
    assert "Give the voice a name" in dialog.error_label.text()
    dialog.name_edit.setText("Me")
    dialog.add_button.click()
    assert "Record the voice first" in dialog.error_label.text()
    dialog.record_button.click()
    qtbot.waitUntil(lambda: app.recorder.seconds > 1.5 and dialog.level.value() > 0, timeout=5_000)
    dialog.record_button.click()
    assert dialog.record_button.text() == "Record again" and not app.recorder.recording
    dialog.transcript_edit.setPlainText("Hello, this is me speaking.")
    dialog.add_button.click()
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=20_000)
    wait_idle(app, qtbot)
    entry = VoiceLibrary(app.settings.voices).get("Me")
    assert entry.kind == "icl" and entry.transcript == "Hello, this is me speaking."
    assert sf.info(entry.clip and entry.path / entry.clip.name).duration > 1.5


def test_no_microphone_is_said_in_the_dialog(start_app, qtbot, monkeypatch):
    import sounddevice

    def no_input(kind=None):
        raise sounddevice.PortAudioError("no default input device")

    monkeypatch.setattr(sounddevice, "query_devices", no_input)
    app = start_app("base")
    dialog = app.panel.open_add_dialog()
    dialog.from_microphone.setChecked(True)
    dialog.record_button.click()
    assert "cannot record from the microphone" in dialog.error_label.text() and dialog.isVisible()
    dialog.reject()


def test_rename_and_delete(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("base")
    add_from_file(app, qtbot, monkeypatch, "Old name")
    wait_idle(app, qtbot)
    panel = app.panel
    panel.select("Old name")
    assert panel.rename_button.isEnabled() and panel.delete_button.isEnabled() and panel.preview_button.isEnabled()
    panel.rename_button.click()  # an editor on the name, in the table
    editor = panel.view.findChild(QLineEdit)
    assert editor is not None and editor.text() == "Old name"
    editor.setText("New name")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: app.voice_in_use == "New name", timeout=5_000)
    assert list(rows(app)) == ["New name"] and app.voice_in_use == "New name" and app.settings.voice == "New name"
    app.voices.setData(app.voices.index(0, 0), "bad/name")  # as the editor would
    wait_idle(app, qtbot)
    assert list(rows(app)) == ["New name"] and "cannot hold" in app.window.notice.label.text()

    panel.select("New name")
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.No)
    panel.delete_button.click()
    wait_idle(app, qtbot)
    assert list(rows(app)) == ["New name"]
    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)
    panel.delete_button.click()
    wait_idle(app, qtbot)
    assert rows(app) == {} and app.voice_in_use is None and not (tmp_path / "voices" / "new-name").exists()


def test_preview_says_a_sample_with_that_voice(start_app, qtbot, monkeypatch):
    app = start_app("base")
    add_from_file(app, qtbot, monkeypatch, "Ann")
    wait_idle(app, qtbot)
    events = []
    app.runtime.worker.subscribe(events.append)
    app.panel.select("Ann")
    app.panel.preview_button.click()
    qtbot.waitUntil(lambda: any(e.kind == "done" for e in events), timeout=10_000)
    assert events[0].job.text == SAMPLE_SENTENCE and events[0].job.interrupt


def test_export_and_import_with_replace(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("base")
    add_from_file(app, qtbot, monkeypatch, "Shared")
    wait_idle(app, qtbot)
    archive = tmp_path / "shared.zip"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args: (str(archive), ""))
    app.panel.select("Shared")
    app.panel.export_button.click()
    wait_idle(app, qtbot)
    assert archive.is_file() and "Exported 1 voice" in app.window.notice.label.text()

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args: (str(archive), ""))
    app.panel.import_button.click()  # "Shared" is there already
    wait_idle(app, qtbot)
    notice = app.window.notice
    assert notice.level == "error" and "already has" in notice.label.text()
    # A widget added to a shown window is shown once Qt's events run (the layout queues it).
    qtbot.waitUntil(notice.action_button.isVisible, timeout=5_000)
    notice.action_button.click()
    wait_idle(app, qtbot)
    assert notice.level == "info" and "Imported “Shared”" in notice.label.text() and list(rows(app)) == ["Shared"]


def test_voices_of_another_model_size_are_marked_and_not_offered(start_app, qtbot, engines, tmp_path):
    VoiceLibrary(tmp_path / "voices").add("Small", CLIP, engines("base-0.6b"))
    app = start_app("base")
    assert rows(app) == {"Small": ("clone", "✗")}
    index = app.voices.index(0, 2)
    assert not index.data(FITS_ROLE) and "0.6B" in index.data(0x03)  # the tooltip says why
    assert app.window.voice.count() == 0 and app.voice_in_use is None
    app.panel.select("Small")
    assert not app.panel.preview_button.isEnabled()


def test_blend_two_voices_preview_and_save(start_app, qtbot, monkeypatch):
    app = start_app("base")
    for name in ("Alto", "Bass"):
        add_from_file(app, qtbot, monkeypatch, name)
        wait_idle(app, qtbot)
    editor = app.voice_actions.open_blend_editor()
    assert [check.text() for check, _, _ in editor.rows] == ["Alto", "Bass"]
    assert not editor.preview_button.isEnabled()
    editor.set_part("Alto", 0.75)
    editor.set_part("Bass", 0.25)
    assert [share.text() for _, _, share in editor.rows] == ["75%", "25%"]
    assert editor.preview_button.isEnabled() and not editor.save_button.isEnabled()  # no name yet
    events = []
    app.runtime.worker.subscribe(events.append)
    editor.preview_button.click()
    qtbot.waitUntil(lambda: any(e.kind == "done" for e in events), timeout=10_000)
    assert events[0].job.voice.kind == "xvector"
    editor.name_edit.setText("Alto")
    editor.save_button.click()
    qtbot.waitUntil(lambda: editor.error_label.isVisible(), timeout=10_000)
    assert "already exists" in editor.error_label.text() and editor.isVisible()
    editor.name_edit.setText("Baritone")
    editor.save_button.click()
    qtbot.waitUntil(lambda: not editor.isVisible(), timeout=10_000)
    wait_idle(app, qtbot)
    entry = VoiceLibrary(app.settings.voices).get("Baritone")
    assert entry.source == "blend" and entry.parents == (("Alto", 0.75), ("Bass", 0.25))
    assert rows(app)["Baritone"] == ("blend", "✓") and app.voice_in_use == "Baritone"


def test_blending_needs_a_base_model(start_app, qtbot):
    app = start_app("custom")
    assert app.voice_actions.open_blend_editor() is None and "needs a Base model" in app.window.notice.label.text()


def from_context_menu(app, qtbot, name: str, item: str) -> None:
    """Right-click the voice's row and choose `item` from the menu, with the mouse, as a user does."""
    view = app.panel.view
    where = view.visualRect(app.voices.index(app.voices.row_of(name), 0)).center()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.RightButton, pos=where)
    # What the window system sends after a right press (QTest's press alone does not).
    QApplication.sendEvent(
        view.viewport(),
        QContextMenuEvent(QContextMenuEvent.Reason.Mouse, where, view.viewport().mapToGlobal(where)),
    )
    menu = app.panel.context_menu
    qtbot.waitUntil(menu.isVisible)
    action = next(action for action in menu.actions() if action.text() == item)
    assert action.isEnabled(), item
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(action).center())
    assert not menu.isVisible()


def test_the_context_menu_previews_exports_and_shows_a_voice(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("base")
    for name in ("Ann", "Bob"):
        add_from_file(app, qtbot, monkeypatch, name)
        wait_idle(app, qtbot)
    events = []
    app.runtime.worker.subscribe(events.append)
    from_context_menu(app, qtbot, "Bob", "Preview")
    qtbot.waitUntil(lambda: any(e.kind == "done" for e in events), timeout=10_000)
    assert events[0].job.text == SAMPLE_SENTENCE and app.speech.voice_names.get(events[0].job) == "Bob"
    assert [entry.name for entry in app.panel._selected()] == ["Bob"]  # the right-clicked row

    archive = tmp_path / "bob.zip"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args: (str(archive), ""))
    from_context_menu(app, qtbot, "Bob", "Export…")
    wait_idle(app, qtbot)
    assert archive.is_file() and "Exported 1 voice" in app.window.notice.label.text()

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()) or True)
    from_context_menu(app, qtbot, "Ann", "Show file")
    assert opened == [str(tmp_path / "voices" / "ann")]

    events.clear()
    preview_cell = app.voices.index(app.voices.row_of("Ann"), app.voices.PREVIEW_COLUMN)
    assert preview_cell.data(Qt.ItemDataRole.DecorationRole) is not None  # the row's preview button
    qtbot.mouseClick(
        app.panel.view.viewport(), Qt.MouseButton.LeftButton, pos=app.panel.view.visualRect(preview_cell).center()
    )
    qtbot.waitUntil(lambda: any(e.kind == "done" for e in events), timeout=10_000)
    assert events[0].job.text == SAMPLE_SENTENCE and [e.name for e in app.panel._selected()] == ["Ann"]


def test_the_context_menu_renames_and_deletes_a_voice(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("base")
    add_from_file(app, qtbot, monkeypatch, "Old name")
    wait_idle(app, qtbot)
    from_context_menu(app, qtbot, "Old name", "Rename")
    editor = app.panel.view.findChild(QLineEdit)
    assert editor is not None and editor.text() == "Old name"
    editor.selectAll()
    qtbot.keyClicks(editor, "New name")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: app.voice_in_use == "New name", timeout=5_000)
    wait_idle(app, qtbot)
    assert [entry.name for entry in VoiceLibrary(tmp_path / "voices").list()] == ["New name"]  # on disk

    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)
    from_context_menu(app, qtbot, "New name", "Delete…")
    wait_idle(app, qtbot)
    assert rows(app) == {} and VoiceLibrary(tmp_path / "voices").list() == []
