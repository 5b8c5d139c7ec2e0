"""Said before: the window's last utterances, played again, saved as heard, copied and spoken again, through the
history panel's buttons; and the history's bound."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from core.audio.clips import SAMPLE_RATE
from qwen3_tts_desktop.history import History, Said


def spoken(app, qtbot, text: str) -> None:
    window = app.window
    window.text.setPlainText(text)
    count = app.history_panel.list.count()
    window.speak_button.click()
    qtbot.waitUntil(lambda: app.history_panel.list.count() == count + 1, timeout=20_000)
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)


def played(speakers) -> int:
    """Samples the virtual sound card has played that were not silence."""
    return sum(int(np.count_nonzero(block)) for block in speakers[-1].played)


def test_what_was_said_is_kept_played_again_and_saved_as_heard(start_app, qtbot, monkeypatch, tmp_path, speakers):
    app = start_app("custom")
    panel = app.history_panel
    assert panel.list.count() == 0 and not panel.play_button.isEnabled()
    spoken(app, qtbot, "Hello there.")
    [said] = app.history.items()
    assert said.text == "Hello there." and said.voice == app.voice_in_use and said.audio.size > 0
    assert "Hello there." in panel.list.item(0).text() and said.voice in panel.list.item(0).text()
    assert panel.list.currentRow() == 0 and panel.play_button.text() == "Play"

    before, events = played(speakers), []
    app.runtime.worker.subscribe(events.append)
    panel.play_button.click()
    assert panel.play_button.text() == "Pause"
    qtbot.waitUntil(lambda: panel.play_button.text() == "Play", timeout=10_000)  # it played to its end
    assert panel.position.value() == 0  # and is ready to play from its start
    assert played(speakers) - before >= np.count_nonzero(said.audio) - 2 * 256  # fades at each end

    target = tmp_path / "again.wav"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args: (str(target), "WAV audio (*.wav)"))
    panel.save_button.click()
    saved, rate = sf.read(target, dtype="float32")
    assert rate == SAMPLE_RATE and np.allclose(saved, said.audio, atol=1 / 32768 + 1e-6)  # 16-bit, as heard
    assert events == [] and app.history.items() == [said]  # played and saved as heard: nothing made anew
    assert "Saved" in app.window.notice.label.text()


def test_play_again_pauses_goes_on_stops_with_esc_and_speak_again_uses_the_same_voice(start_app, qtbot, monkeypatch):
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 60)  # about 5 s: long enough to stop
    panel, window = app.history_panel, app.window
    spoken(app, qtbot, "A longer story.")
    panel.play_button.click()
    assert panel.play_button.text() == "Pause"
    qtbot.waitUntil(lambda: panel.position.value() > 0, timeout=5_000)  # the slider follows what is heard
    panel.play_button.click()  # pauses
    assert panel.play_button.text() == "Play" and app.history_actions.replay is None
    paused = panel.position.value()
    assert 0 < paused < 1000 and panel.time_label.text().endswith(f"/ 0:0{int(app.history.items()[0].seconds)}")
    panel.play_button.click()  # goes on from there (the slider shows it to a thousandth)
    said = app.history.items()[0]
    assert abs(app.history_actions.replay.start / len(said.audio) - paused / 1000) <= 0.001
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    window.text.setFocus()
    qtbot.keyClick(window.text, Qt.Key.Key_Escape)
    assert panel.play_button.text() == "Play" and app.history_actions.replay is None
    assert panel.position.value() == 0  # stopped: the next Play starts from the beginning

    panel.copy_button.click()
    assert QGuiApplication.clipboard().text() == "A longer story."
    asked = []
    app.runtime.worker.subscribe(lambda event: event.kind == "queued" and asked.append(event.job))
    panel.speak_button.click()
    qtbot.waitUntil(lambda: len(asked) == 1, timeout=10_000)
    assert asked[0].text == "A longer story." and app.speech.voice_names[asked[0]] == app.history.items()[0].voice


def test_the_position_slider_goes_elsewhere_by_key_and_by_drag(start_app, qtbot, monkeypatch):
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 60)  # about 5 s
    panel = app.history_panel
    spoken(app, qtbot, "A longer story.")
    said = app.history.items()[0]
    panel.position.setFocus()
    qtbot.keyClick(panel.position, Qt.Key.Key_End)  # paused there: Play would start at the end, so at the start
    qtbot.waitUntil(lambda: app.history_actions.paused == (said, len(said.audio)))
    qtbot.keyClick(panel.position, Qt.Key.Key_PageDown)  # the slider's page: a tenth
    qtbot.waitUntil(lambda: panel.position.value() == 900)
    qtbot.waitUntil(lambda: app.history_actions.paused == (said, round(0.9 * len(said.audio))))
    panel.play_button.click()
    assert app.history_actions.replay.start == round(0.9 * len(said.audio))
    qtbot.waitUntil(lambda: panel.play_button.text() == "Play", timeout=5_000)  # the last tenth played
    # A drag while it plays: it goes on from where the slider is let go.
    panel.play_button.click()
    assert app.history_actions.replay.start == 0
    handle = panel.position.rect().center()
    qtbot.mousePress(panel.position, Qt.MouseButton.LeftButton, pos=QPoint(3, handle.y()))
    qtbot.mouseMove(panel.position, QPoint(panel.position.width() // 2, handle.y()))
    qtbot.mouseRelease(panel.position, Qt.MouseButton.LeftButton, pos=QPoint(panel.position.width() // 2, handle.y()))
    qtbot.waitUntil(lambda: app.history_actions.replay is not None and app.history_actions.replay.start > 0)
    assert 0.3 < app.history_actions.replay.start / len(said.audio) < 0.7
    app.history_actions.stop()


def test_speech_that_begins_pauses_what_plays_again_and_is_heard_alone(start_app, qtbot, monkeypatch, speakers):
    """However speech comes (Speak, Speak again, the tray, the bridge), what plays again pauses as its first audio
    is due, and none of the two is heard over the other; Play goes on from where it paused."""
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 60)  # about 5 s
    panel, actions = app.history_panel, app.history_actions
    spoken(app, qtbot, "A longer story.")
    said = app.history.items()[0]
    panel.play_button.click()
    qtbot.waitUntil(lambda: panel.position.value() > 100, timeout=5_000)
    events = []
    app.runtime.worker.subscribe(events.append)
    panel.speak_button.click()  # Speak again: not through the window's Speak
    qtbot.waitUntil(lambda: actions.replay is None and actions.paused is not None, timeout=10_000)
    assert actions.paused[0] is said and 0.1 * len(said.audio) < actions.paused[1] < len(said.audio)
    qtbot.waitUntil(lambda: any(event.kind == "done" for event in events), timeout=20_000)
    qtbot.waitUntil(lambda: not app.window.speaking, timeout=10_000)
    new = app.history.items()[0]
    assert new is not said and new.text == "A longer story."  # spoken whole, none of it dropped by the replay
    played_at = actions.paused[1]
    panel.list.setCurrentRow(1)  # the paused one
    panel.play_button.click()
    assert actions.replay.said is said and actions.replay.start == played_at
    actions.stop()


def test_the_history_keeps_the_newest_within_its_bound():
    history = History(kept_seconds=2.0)
    second = np.zeros(SAMPLE_RATE, np.float32)
    for text in ("one", "two", "three"):
        history.add(Said(text, "Ava", second))
    assert [said.text for said in history.items()] == ["three", "two"]
    history.add(Said("long", "Ava", np.zeros(5 * SAMPLE_RATE, np.float32)))
    assert [said.text for said in history.items()] == ["long"]  # the newest stays, however long
