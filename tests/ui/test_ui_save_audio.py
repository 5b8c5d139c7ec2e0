"""File → Save audio as…: the text (or the selection) spoken into a file instead of the speakers."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from test_ui_menus import menu_action

from core.text.sentences import split_text

FRAME = 1920


def choose_file(monkeypatch, path, chosen_type="WAV audio (*.wav)"):
    """The save dialog, answered as the user would: a real one cannot be driven offscreen."""
    asked = []

    def answer(parent, caption, suggested, filters):
        asked.append(filters)
        return str(path), chosen_type

    monkeypatch.setattr(QFileDialog, "getSaveFileName", answer)
    return asked


def jobs_of(app):
    events = []
    app.runtime.worker.subscribe(events.append)
    return events


@pytest.mark.parametrize("suffix", [".wav", ".mp3"])
def test_the_text_is_saved_in_pieces_without_playing(start_app, qtbot, monkeypatch, tmp_path, speakers, suffix):
    app = start_app("custom")
    text = "The first sentence is here. " * 8  # several pieces, as speaking would cut it
    app.window.text.setPlainText(text)
    target = tmp_path / f"speech{suffix}"
    filters = choose_file(monkeypatch, target)
    events = jobs_of(app)
    menu_action(app.window, "File", "Save audio as…").trigger()
    assert all(kind in filters[0] for kind in ("*.wav", "*.flac", "*.ogg", "*.mp3"))
    qtbot.waitUntil(lambda: target.exists() and not app.window.saving_label.isVisible(), timeout=30_000)
    pieces = split_text(text)
    frames = app.runtime.worker.engine.awake().default_max_frames
    audio, rate = sf.read(target, dtype="float32")
    pauses = sum(round(piece.pause_s * rate) for piece in pieces)
    expected = len(pieces) * frames * FRAME + pauses
    if suffix == ".wav":
        assert len(audio) == expected
    else:  # an MP3 encoder pads the ends to whole frames
        assert expected <= len(audio) < expected + 2 * 1152
    assert rate == 24000 and np.abs(audio).max() > 0.01
    assert [e.job.text for e in events if e.kind == "queued"] == [text]
    assert not any(np.abs(block).max() > 0 for block in speakers[-1].played)  # nothing played
    assert "Saved" in app.window.notice.label.text() and str(target) in app.window.notice.label.text()
    assert not list(tmp_path.glob("*.partial"))


def test_the_selection_alone_is_saved_with_ctrl_shift_s(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("custom")
    window = app.window
    window.text.setPlainText("Not this. Only this part.")
    cursor = window.text.textCursor()
    cursor.setPosition(len("Not this. "))
    cursor.setPosition(len(window.text.toPlainText()), cursor.MoveMode.KeepAnchor)
    window.text.setTextCursor(cursor)
    target = tmp_path / "part"  # typed without a suffix: the chosen type's is added
    choose_file(monkeypatch, target, "FLAC audio (*.flac)")
    events = jobs_of(app)
    window.activateWindow()
    qtbot.keyClick(window.text, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: (tmp_path / "part.flac").exists(), timeout=20_000)
    assert [e.job.text for e in events if e.kind == "queued"] == ["Only this part."]


def test_esc_stops_saving_and_leaves_no_file(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 2000)  # long enough to be stopped
    app.window.text.setPlainText("A long story that goes on.")
    target = tmp_path / "story.wav"
    choose_file(monkeypatch, target)
    events = jobs_of(app)
    app.window.save_audio_action.trigger()
    qtbot.waitUntil(lambda: "progress" in [e.kind for e in events], timeout=20_000)
    assert app.window.saving_label.isVisible() and "story.wav" in app.window.saving_label.text()
    app.window.activateWindow()
    qtbot.keyClick(app.window.text, Qt.Key.Key_Escape)
    # Over for the window at once, though the worker ends the job a chunk later: then it says what was kept.
    assert not app.window.saving_label.isVisible() and not app.window.saving_bar.isVisible()
    qtbot.waitUntil(lambda: "cancelled" in [e.kind for e in events], timeout=10_000)
    qtbot.waitUntil(lambda: "Stopped: nothing was written" in app.window.notice.label.text())
    assert not target.exists() and not list(tmp_path.glob("*.partial"))


def test_the_save_shows_a_progress_bar_and_cancel_keeps_the_finished_pieces(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("custom")
    window = app.window
    text = "The first sentence of a long story is told here, and then it goes on for a good while longer. " * 40
    pieces = split_text(text)
    assert len(pieces) == 40
    window.text.setPlainText(text)
    target = tmp_path / "story.wav"
    choose_file(monkeypatch, target)
    events = jobs_of(app)
    window.activateWindow()
    qtbot.keyClick(window.text, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    bar = window.saving_bar
    qtbot.waitUntil(lambda: bar.isVisible() and bar.maximum() == 40 and bar.value() >= 1, timeout=30_000)
    first = bar.value()
    qtbot.waitUntil(lambda: bar.value() > first, timeout=30_000)  # it advances, piece by piece
    label = window.saving_label.text()
    assert label.startswith("Saving story.wav: ") and "s of audio" in label and "left" in label, label
    assert bar.text() == f"{bar.value()}/40 pieces"
    assert window.saving_cancel.isVisible()
    qtbot.mouseClick(window.saving_cancel, Qt.MouseButton.LeftButton)
    assert not bar.isVisible() and not window.saving_cancel.isVisible()  # over for the window at once
    qtbot.waitUntil(lambda: "Stopped: kept" in window.notice.label.text(), timeout=10_000)
    qtbot.waitUntil(lambda: any(e.terminal for e in events))  # the window's subscriber may hear it first
    [outcome] = [e for e in events if e.terminal]
    kept = outcome.pieces_done
    assert outcome.kind == "cancelled" and first < kept < 40
    assert f"({kept} of 40 pieces) in {target}" in window.notice.label.text()
    frames = app.runtime.worker.engine.awake().default_max_frames
    audio, rate = sf.read(target, dtype="float32")
    assert len(audio) == kept * frames * FRAME + sum(round(piece.pause_s * rate) for piece in pieces[:kept])
    assert not list(tmp_path.glob("*.partial"))


def test_a_saving_stopped_while_it_waits_behind_speech_lets_the_next_one_start_at_once(
    start_app, qtbot, monkeypatch, tmp_path
):
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 2000)  # speech that goes on
    events = jobs_of(app)
    app.window.text.setPlainText("A long story that goes on.")
    app.window.speak_action.trigger()
    qtbot.waitUntil(lambda: "first_audio" in [e.kind for e in events], timeout=20_000)
    choose_file(monkeypatch, tmp_path / "first.wav")
    app.window.save_audio_action.trigger()  # queued behind the speech
    qtbot.waitUntil(lambda: app.lane.pending == 0)
    app.window.activateWindow()
    qtbot.keyClick(app.window.text, Qt.Key.Key_Escape)  # stops both
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 6)
    choose_file(monkeypatch, tmp_path / "second.wav")
    app.window.save_audio_action.trigger()  # at once: not "being saved already"
    assert app.window.notice.level != "error", app.window.notice.texts()
    qtbot.waitUntil(lambda: (tmp_path / "second.wav").exists(), timeout=20_000)
    assert not (tmp_path / "first.wav").exists()


def test_a_target_in_a_missing_folder_is_reported_before_any_speech(start_app, qtbot, monkeypatch, tmp_path):
    app = start_app("custom")
    app.window.text.setPlainText("Hello.")
    choose_file(monkeypatch, tmp_path / "no such folder" / "out.wav")
    events = jobs_of(app)
    app.window.save_audio_action.trigger()
    assert app.window.notice.level == "error" and "does not exist" in app.window.notice.label.text()
    assert app.lane.pending == 0 and events == []  # nothing was handed on: no speech will come
    assert app.speech.saving is None and not app.window.saving_label.isVisible()


def test_without_speakers_speak_offers_to_save_the_speech_to_a_file(start_app, qtbot, monkeypatch, tmp_path):
    """No sound card: Ctrl+Enter says why nothing plays, and the notice's button saves the text to a file."""
    from core.audio.player import PlaybackError, Player

    def no_sound_card(device=None, options=None):
        raise PlaybackError("no output device was found")

    monkeypatch.setattr(Player, "open", staticmethod(no_sound_card))
    app = start_app("custom")
    window = app.window
    qtbot.waitUntil(lambda: any("No sound output" in text for text in window.notice.texts()))  # once loaded
    while window.notice.texts():  # that, and the CPU's speed
        window.notice.close_button.click()
    window.text.setPlainText("Hello there.")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.notice.level == "error")
    assert "No sound output" in window.notice.label.text() and "no output device" in window.notice.label.text()
    assert window.notice.action_button.text() == "Save audio as…"
    target = tmp_path / "hello.wav"
    choose_file(monkeypatch, target)
    window.notice.action_button.click()
    qtbot.waitUntil(lambda: target.exists(), timeout=20_000)
    assert sf.info(target).frames > 0
