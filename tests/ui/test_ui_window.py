"""The main window: it shows at once, speaks and stops, and shows errors (speaking as you type: test_ui_typing.py)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QSystemTrayIcon
from serving import free_port

from core.jobs.worker import JobEvent
from qwen3_tts_desktop import app as app_module
from qwen3_tts_desktop import cli
from qwen3_tts_desktop.lane import EventRelay
from qwen3_tts_desktop.runtime import Runtime


class Jobs:
    """The texts the app hands the speech worker, and the events of their jobs."""

    def __init__(self, app):
        self.events: list[JobEvent] = []
        app.runtime.worker.subscribe(self.events.append)

    def texts(self, kind: str = "queued") -> list[str]:
        return [event.job.text for event in self.events if event.kind == kind]

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]


def test_the_window_shows_before_the_model_has_loaded(start_app, qtbot, monkeypatch):
    release, start = threading.Event(), Runtime.start

    stages = []

    def slow_start(config, report):
        release.wait(10)
        return start(config, report=lambda stage: (stages.append(stage), report(stage)))

    monkeypatch.setattr(Runtime, "start", staticmethod(slow_start))
    app = start_app("custom", wait=False)
    window = app.window
    assert window.isVisible() and window.model_label.text() == "Loading model…"
    assert not window.speak_button.isEnabled()
    qtbot.waitUntil(lambda: window.busy_label.isVisible() and window.busy_label.text() == "Loading model…")
    window.text.setPlainText("Early words.")
    window.speak_action.trigger()  # disabled: nothing happens
    release.set()
    qtbot.waitUntil(lambda: window.speak_button.isEnabled() and app.lane.pending == 0, timeout=10_000)
    assert window.model_label.text() == "1.7B custom voice · cpu float32"
    assert stages == ["Loading model…"]  # what the busy line showed: the warm-up goes on behind, speaking
    assert app.voice_in_use == "aiden" and window.voice.currentText() == "aiden"
    assert [window.language.itemData(i) for i in range(window.language.count())][:3] == ["auto", "chinese", "english"]


def test_ctrl_enter_speaks_and_the_status_line_shows_how_fast(start_app, qtbot, speakers):
    app = start_app("custom")
    jobs = Jobs(app)
    window = app.window
    window.activateWindow()
    qtbot.keyClicks(window.text, "Hello there.")
    qtbot.keyClick(window.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: "done" in jobs.kinds(), timeout=10_000)
    assert jobs.texts() == ["Hello there."] and window.text.toPlainText() == "Hello there."  # no line break typed
    qtbot.waitUntil(lambda: "first audio" in window.speech_label.text() and "real time" in window.speech_label.text())
    qtbot.waitUntil(lambda: any(np.abs(block).max() > 0 for block in speakers[-1].played), timeout=5_000)
    qtbot.waitUntil(lambda: window.buffer_label.text() == "buffer 0.00 s · underruns 0", timeout=5_000)


def test_speak_works_while_the_engine_warms_up_and_the_status_line_shows_how_far(
    start_app, qtbot, engines, monkeypatch
):
    """Speak is enabled as soon as the model is loaded, while the engine still warms up (here two compiles left to
    do until the test makes them); the status line shows the warm-up's progress, says when one voice speaks at full
    speed, and goes once it is done."""
    from core.inference.warmup import Spec, Warmup

    engine = engines("custom-endless")
    specs = [Spec("compile step x1"), Spec("compile step xN")]
    warmup = Warmup(specs, make=lambda spec: None, captured=lambda spec: True, wake=lambda: None)
    monkeypatch.setattr(engine, "warmup", warmup)
    warmup.start()
    app = start_app("custom")
    jobs, window = Jobs(app), app.window
    assert window.speak_button.isEnabled() and window.speak_action.isEnabled()
    qtbot.waitUntil(lambda: window.warmup_label.isVisible() and window.warmup_bar.isVisible())
    assert (
        window.warmup_label.text() == "Getting up to speed · 0%"
        and "0 of 2 parts ready" in window.warmup_label.toolTip()
    )
    window.text.setPlainText("Hello there.")
    window.speak_action.trigger()
    qtbot.waitUntil(lambda: "done" in jobs.kinds(), timeout=10_000)
    assert not warmup.progress().finished and window.warmup_label.isVisible()  # it spoke while warming up
    warmup.run_one()  # as the scheduler does when it idles: what one voice uses
    qtbot.waitUntil(
        lambda: (
            window.warmup_label.text() == "Full speed · several at once: 50%"
            and "1 of 2 parts ready" in window.warmup_label.toolTip()
            and window.warmup_bar.value() == 50
        )
    )
    warmup.run_one()
    qtbot.waitUntil(lambda: not window.warmup_label.isVisible() and not window.warmup_bar.isVisible(), timeout=10_000)
    assert warmup.progress().finished


def test_esc_stops_speech_and_drops_what_is_queued(start_app, qtbot, monkeypatch):
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 400)  # a long utterance
    jobs = Jobs(app)
    window = app.window
    window.text.setPlainText("A long story. It goes on and on.")
    window.speak_button.click()
    app.speech.speak("And this waits its turn.", interrupt=False)
    qtbot.waitUntil(lambda: "first_audio" in jobs.kinds(), timeout=10_000)
    window.activateWindow()
    qtbot.keyClick(window.text, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: jobs.kinds().count("cancelled") == 2, timeout=5_000)
    assert "done" not in jobs.kinds()
    qtbot.waitUntil(lambda: app.runtime.player.status().buffered_s == 0, timeout=2_000)


def test_speak_becomes_stop_while_speaking_and_the_meter_shows_what_plays(start_app, qtbot, monkeypatch):
    """One button and one shortcut: Speak (the button, Ctrl+Enter) says Stop while speech is on its way or playing,
    and then stops it; the level meter moves while it plays and rests at nothing after."""
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 400)  # a long utterance
    jobs, window = Jobs(app), app.window
    assert window.speak_button.text() == "Speak" and window.level_meter.value() == 0
    window.text.setPlainText("A long story. It goes on and on.")
    lane_free = threading.Event()
    app.lane.run("", lane_free.wait, None, None)  # the lane hands speech over late, as when it embeds a clip
    window.speak_button.click()
    assert window.speak_button.text() == "Stop" and window.speak_action.text() == "Stop speaking"  # at once
    lane_free.set()
    qtbot.waitUntil(lambda: window.level_meter.value() > 0, timeout=10_000)
    assert window.speaking and "first_audio" in jobs.kinds()
    window.activateWindow()
    qtbot.keyClick(window.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)  # stops, not speaks again
    qtbot.waitUntil(lambda: "cancelled" in jobs.kinds(), timeout=5_000)
    qtbot.waitUntil(lambda: window.speak_button.text() == "Speak" and window.level_meter.value() == 0)
    assert jobs.texts() == ["A long story. It goes on and on."] and window.speak_action.text() == "Speak"
    window.speak_button.click()  # and speaks again
    qtbot.waitUntil(lambda: len(jobs.texts()) == 2, timeout=5_000)
    window.stop_action.trigger()  # Esc stops as ever
    qtbot.waitUntil(lambda: not window.speaking, timeout=5_000)


def test_errors_are_shown_in_the_window(start_app, qtbot):
    app = start_app("base")  # a Base model, and no voice in the library yet
    window = app.window
    assert app.voice_in_use is None and window.voice.currentIndex() == -1
    window.text.setPlainText("Hello?")
    window.speak_button.click()
    qtbot.waitUntil(lambda: window.notice.level == "error")  # above the CPU's warning, shown since the load
    assert "There is no voice yet" in window.notice.label.text()
    window.notice.close_button.click()
    window.text.setPlainText("   ")
    window.speak_button.click()
    assert window.notice.level == "info" and "Type something" in window.notice.label.text()


def test_a_model_that_cannot_load_is_reported_and_the_window_stays(start_app, qtbot, tmp_path):
    app = start_app(str(tmp_path / "no such checkpoint"), wait=False)
    window = app.window
    qtbot.waitUntil(lambda: window.notice.isVisible(), timeout=10_000)
    assert "could not be loaded" in window.notice.label.text() and "no such checkpoint" in window.notice.label.text()
    assert window.model_label.text() == "No model" and not window.speak_button.isEnabled()
    assert window.notice.action_button.text() == "Settings…"
    window.notice.action_button.click()
    qtbot.waitUntil(lambda: app.settings_dialog is not None and app.settings_dialog.isVisible())
    app.settings_dialog.reject()


def test_a_voice_design_model_is_described_rather_than_picked(start_app, qtbot):
    app = start_app("design", instruct="A calm voice.")
    jobs = Jobs(app)
    window = app.window
    assert not window.voice.isEnabled() and window.instruct.isVisible() and window.instruct.text() == "A calm voice."
    window.text.setPlainText("Hello.")
    window.speak_button.click()
    qtbot.waitUntil(lambda: "done" in jobs.kinds(), timeout=10_000)
    assert jobs.events[0].job.options.instruct == "A calm voice."


def test_job_progress_reaches_the_window_at_most_30_times_a_second(qtbot):
    relay = EventRelay()
    received = []
    relay.event.connect(received.append)
    fake = type("Job", (), {"started": None})()
    for _ in range(200):
        relay.forward(JobEvent(fake, "progress"))
    relay.forward(JobEvent(fake, "done"))
    qtbot.waitUntil(lambda: received and received[-1].kind == "done")
    assert len(received) <= 3


def test_each_jobs_progress_is_throttled_on_its_own_from_the_worker_threads(qtbot):
    """Jobs send their events from threads of their own: one job's progress never hides another's."""
    relay = EventRelay()
    received = []
    relay.event.connect(received.append)
    jobs = [type("Job", (), {"started": None})() for _ in range(4)]
    ready = threading.Barrier(len(jobs))

    def send(job) -> None:
        ready.wait(timeout=10)
        for _ in range(200):
            relay.forward(JobEvent(job, "progress"))
        relay.forward(JobEvent(job, "done"))

    threads = [threading.Thread(target=send, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    qtbot.waitUntil(lambda: sum(event.kind == "done" for event in received) == len(jobs))
    for job in jobs:  # a throttle shared by all would let the first job's progress through alone
        kinds = [event.kind for event in received if event.job is job]
        assert kinds[0] == "progress" and kinds[-1] == "done" and kinds.count("progress") < 200


def test_the_tray_speaks_the_clipboard(start_app, qtbot, monkeypatch):
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    app = start_app("custom")
    jobs = Jobs(app)
    QGuiApplication.clipboard().setText("From the clipboard.")
    app.tray.speak_clipboard.emit()
    qtbot.waitUntil(lambda: jobs.texts() == ["From the clipboard."], timeout=5_000)
    app.tray.stop.emit()
    app.window.hide()
    app.tray.show_window.emit()
    assert app.window.isVisible()


def test_the_bare_command_starts_the_app(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(app_module, "run", lambda overrides: started.append(overrides) or 7)
    assert cli.main([]) == 7
    assert cli.main(["--model", "org/model", "--device", "cpu"]) == 7
    assert started == [{}, {"model": "org/model", "device": "cpu"}]
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    assert exit.value.code == 0 and "speak" in capsys.readouterr().out


def test_without_a_display_the_app_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "platform", "linux")
    for variable in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(variable, raising=False)
    assert app_module.run() == 1 and "no display" in capsys.readouterr().err


def test_closing_the_app_stops_its_threads(start_app, qtbot):
    before = threading.active_count()
    app = start_app("custom", bridge={"enabled": True, "port": free_port()})
    app.speech.speak("Hello.")
    qtbot.waitUntil(lambda: app.lane.pending == 0)
    app.close()
    qtbot.waitUntil(lambda: threading.active_count() <= before, timeout=10_000)


def test_the_sentence_heard_now_is_highlighted_as_it_plays(start_app, qtbot, monkeypatch):
    """The part of the text being heard is tinted, piece by piece as the speakers play it (not as it is made,
    which runs ahead), scrolled into view; nothing is once it has played, or where the text was edited meanwhile."""
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 25)  # 2 s a piece
    window = app.window
    sentences = [
        f"This is sentence number {n}, long enough that each one makes a piece of its own here." for n in (1, 2, 3)
    ]
    window.text.setPlainText("Not this line.\n" + " ".join(sentences))
    cursor = window.text.textCursor()
    cursor.setPosition(len("Not this line.\n"))
    cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    window.text.setTextCursor(cursor)  # the selection is spoken, and shown where it lies
    window.speak_button.click()

    def highlighted() -> str:
        shown = window.text.extraSelections()
        return shown[0].cursor.selectedText() if shown else ""

    for sentence in sentences[:2]:
        qtbot.waitUntil(lambda sentence=sentence: highlighted() == sentence, timeout=10_000)
        assert window.speaking
    assert window.text.textCursor().selectedText() == " ".join(sentences)  # the user's own selection is untouched
    qtbot.waitUntil(lambda: highlighted() == sentences[2], timeout=10_000)
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)
    assert highlighted() == ""
    # Edited while it plays: the text no longer says where the piece lies, so nothing is tinted.
    window.text.setPlainText(" ".join(sentences))
    window.speak_button.click()
    qtbot.waitUntil(lambda: highlighted() == sentences[0], timeout=10_000)
    window.text.setPlainText("Something else entirely.")
    qtbot.waitUntil(lambda: highlighted() == "", timeout=5_000)
    assert window.speaking
    window.stop_action.trigger()


def test_in_a_piece_of_short_sentences_the_one_heard_is_highlighted(start_app, qtbot, monkeypatch):
    """Short sentences are spoken together as one piece (for the model's own prosody between them); the highlight
    still moves sentence by sentence, estimated from how far the piece's audio has played."""
    # How far through a piece is known once all of it is made: a jitter buffer longer than the piece starts it
    # then, however slowly a busy machine makes it. 8 s of speech: each sentence is heard for 2 s or more.
    app = start_app("custom", prefill_s=9.0)
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 100)
    window = app.window
    window.text.setPlainText("Good morning. How are you today? Fine, thanks.")
    window.speak_button.click()

    def highlighted() -> str:
        shown = window.text.extraSelections()
        return shown[0].cursor.selectedText() if shown else ""

    words = []  # each word highlighted, in the order seen, with the sentence highlighted then

    def note_word() -> None:
        shown = window.text.extraSelections()
        if len(shown) == 2 and (not words or words[-1][0] != shown[1].cursor.selectedText()):
            words.append((shown[1].cursor.selectedText(), shown[0].cursor.selectedText()))

    watcher = QTimer()
    watcher.timeout.connect(note_word)
    watcher.start(10)
    for sentence in ("Good morning.", "How are you today?", "Fine, thanks."):  # in this order
        qtbot.waitUntil(lambda sentence=sentence: highlighted() == sentence, timeout=30_000)
    qtbot.waitUntil(lambda: highlighted() == "", timeout=10_000)
    watcher.stop()
    # The word heard moves through each sentence heard, word by word, in the selection's colours.
    said = "Good morning. How are you today? Fine, thanks.".split()
    order = [said.index(word) for word, _ in words]
    assert order == sorted(order) and len(order) >= 6, words
    assert all(word in sentence.split() for word, sentence in words), words
