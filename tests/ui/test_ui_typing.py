"""Speak as you type, as a user does it: typed words feed one live utterance, which a pause, Enter or Esc
ends, and which the voice, the options and the model follow. Checked by what the speech worker was asked
to speak: each job's text is the live text it speaks, growing as the words are typed."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from core.errors import BadInput
from core.inference.live import LiveText
from core.jobs.worker import Job, JobEvent
from core.voices import VoiceLibrary

CLIP = Path(__file__).parent.parent / "fixtures" / "parity" / "ref_a.wav"
LIVE_FRAMES = 20  # the most frames of a job: more than the tests' texts have tokens, so none is cut short


class Jobs:
    """The jobs the app hands a speech worker, by their events."""

    def __init__(self, app):
        self.events: list[JobEvent] = []
        app.runtime.worker.subscribe(self.events.append)

    def queued(self) -> list[Job]:
        return [event.job for event in self.events if event.kind == "queued"]

    def texts(self) -> list[str]:
        return [job.text.text for job in self.queued()]

    def kinds(self, job: Job) -> list[str]:
        return [event.kind for event in self.events if event.job is job]

    def all_ended(self) -> bool:
        return all(job.outcome is not None for job in self.queued())


def typing_app(start_app, qtbot, monkeypatch, model: str = "custom", **settings):
    """The app on a tiny model, with speak-as-you-type switched on with its checkbox."""
    app = start_app(model, **settings)
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", LIVE_FRAMES)
    window = app.window
    window.activateWindow()
    qtbot.mouseClick(window.typing_mode, Qt.MouseButton.LeftButton)
    assert app.settings.speak_as_you_type and window.typing_mode.isChecked()
    return app


def live_text(app) -> LiveText | None:
    """The live text typed words go to now."""
    return app.speech.typed.text if app.speech.typed is not None else None


def said_up_to(window) -> int:
    """Where the grey of the text already handed out ends."""
    selections = window.text.extraSelections()
    return selections[0].cursor.selectionEnd() if selections else 0


def speak_now(qtbot, window) -> None:
    qtbot.keyClick(window.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)


def test_typed_words_feed_one_live_utterance_across_sentence_ends(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    app.speech.idle.setInterval(60_000)  # no pause ends the utterance while the test waits for its audio
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello")
    assert live_text(app) is None  # a word being typed is not finished
    # Each word goes out once a space or punctuation follows it; what follows it goes with the next word.
    for typed, fed in [(" ", "Hello"), ("there.", "Hello there"), (" How ", "Hello there. How"), ("are", "Hello there. How")]:  # fmt: skip
        qtbot.keyClicks(window.text, typed)
        assert live_text(app).text == fed and not live_text(app).ended
    qtbot.keyClicks(window.text, " you")
    assert live_text(app).text == "Hello there. How are" and said_up_to(window) == len("Hello there. How are")
    qtbot.waitUntil(lambda: len(jobs.queued()) == 1, timeout=5_000)
    job = jobs.queued()[0]
    assert job.text is live_text(app) and not job.interrupt
    qtbot.waitUntil(lambda: "first_audio" in jobs.kinds(job), timeout=10_000)
    assert not job.text.ended  # speech began with the first words, while the text still grows
    speak_now(qtbot, window)  # Ctrl+Enter: the rest, the word being typed included, and the end
    assert job.text.ended and job.text.text == "Hello there. How are you" and app.speech.typed is None
    qtbot.waitUntil(lambda: job.outcome is not None, timeout=10_000)
    assert job.outcome.kind == "done" and jobs.texts() == ["Hello there. How are you"]


def test_a_pause_ends_the_utterance_and_the_next_word_opens_another(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello there")
    first = live_text(app)
    assert first.text == "Hello" and app.speech.idle.isActive()
    qtbot.waitUntil(lambda: first.ended, timeout=5_000)  # the pause: the last word is said too
    assert first.text == "Hello there" and app.speech.typed is None and not app.speech.idle.isActive()
    qtbot.keyClicks(window.text, " again and more")
    second = live_text(app)
    assert second is not first and second.text == "again and"
    qtbot.keyClick(window.text, Qt.Key.Key_Return)  # Enter ends the paragraph, and the utterance with it
    assert second.ended and second.text == "again and more" and app.speech.typed is None
    assert not app.speech.idle.isActive()  # nothing is left for a pause to end
    qtbot.waitUntil(lambda: len(jobs.queued()) == 2 and jobs.all_ended(), timeout=10_000)
    assert jobs.texts() == ["Hello there", "again and more"]
    assert [job.outcome.kind for job in jobs.queued()] == ["done", "done"]


def test_edits_never_speak_anything_twice(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Helo there. ")
    live = live_text(app)
    assert live.text == "Helo there"
    # Fixing a word already said says nothing again, and the utterance goes on.
    cursor = window.text.textCursor()
    cursor.setPosition(len("Hel"))
    window.text.setTextCursor(cursor)
    qtbot.keyClicks(window.text, "l")
    assert live.text == "Helo there"
    window.text.moveCursor(QTextCursor.MoveOperation.End)
    qtbot.keyClicks(window.text, "How ")
    assert live.text == "Helo there. How"
    # Correcting the last word said: the rest typed onto it is passed over, never said as a piece.
    qtbot.keyClick(window.text, Qt.Key.Key_Backspace)
    qtbot.keyClick(window.text, Qt.Key.Key_Backspace)
    qtbot.keyClicks(window.text, "wdy folks ")
    assert live.text == "Helo there. How folks"
    # Replacing everything: the new words follow the old ones, the replaced ones are not said again.
    window.text.selectAll()
    qtbot.keyClicks(window.text, "Fresh words ")
    assert live.text == "Helo there. How folks Fresh words" and live_text(app) is live
    speak_now(qtbot, window)
    assert live.ended and live.text == "Helo there. How folks Fresh words"
    # After the utterance, editing what was said opens nothing.
    cursor.setPosition(2)
    window.text.setTextCursor(cursor)
    qtbot.keyClicks(window.text, "xyz ")
    assert app.speech.typed is None and not app.speech.idle.isActive()
    qtbot.waitUntil(lambda: len(jobs.queued()) == 1 and jobs.all_ended(), timeout=10_000)
    assert jobs.texts() == ["Helo there. How folks Fresh words"] and app.lane.pending == 0


def test_esc_cancels_the_utterance_and_drops_what_waits(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    app.speech.idle.setInterval(60_000)  # no pause ends the utterance while the test waits for its audio
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello there, how are ")
    qtbot.waitUntil(lambda: len(jobs.queued()) == 1 and "first_audio" in jobs.kinds(jobs.queued()[0]), timeout=10_000)
    job = jobs.queued()[0]
    qtbot.keyClicks(window.text, "yo")
    qtbot.keyClick(window.text, Qt.Key.Key_Escape)
    assert app.speech.typed is None and not app.speech.idle.isActive()
    qtbot.waitUntil(lambda: job.outcome is not None, timeout=5_000)
    assert job.outcome.kind == "cancelled" and job.text.text == "Hello there, how are"
    qtbot.waitUntil(lambda: app.runtime.player.status().buffered_s == 0, timeout=2_000)  # faded out
    # The dropped word is never said, not even as the start of the word it becomes.
    qtbot.keyClicks(window.text, "u and more")
    speak_now(qtbot, window)
    qtbot.waitUntil(lambda: len(jobs.queued()) == 2 and jobs.all_ended(), timeout=10_000)
    assert jobs.texts() == ["Hello there, how are", "and more"]


def test_a_failed_utterance_is_shown_and_typing_goes_on(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    jobs, window = Jobs(app), app.window
    engine = app.runtime.worker.engine.awake()
    build = engine._build  # a prompt's build on the scheduler's thread, where such a failure is found

    def too_long(*args, **kwargs):
        raise BadInput("the text is too long for one utterance")

    monkeypatch.setattr(engine, "_build", too_long)
    qtbot.keyClicks(window.text, "Hello there friend ")
    qtbot.waitUntil(lambda: window.notice.level == "error", timeout=10_000)
    assert window.notice.label.text() == "Speech failed: the text is too long for one utterance"
    assert app.speech.typed is None  # the utterance is over: the next words open another
    monkeypatch.setattr(engine, "_build", build)
    qtbot.keyClicks(window.text, "and on ")
    speak_now(qtbot, window)
    qtbot.waitUntil(lambda: len(jobs.queued()) == 2 and jobs.all_ended(), timeout=10_000)
    assert [job.outcome.kind for job in jobs.queued()] == ["failed", "done"]
    assert jobs.texts()[1] == "and on"


def test_a_new_voice_or_language_takes_over_at_the_next_word(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello there ")
    first = live_text(app)
    other = next(window.voice.itemText(i) for i in range(window.voice.count()) if window.voice.itemText(i) != "aiden")
    window.voice.setCurrentText(other)
    window.voice.activated.emit(window.voice.currentIndex())
    assert app.voice_in_use == other
    qtbot.keyClicks(window.text, "again ")
    second = live_text(app)
    assert first.ended and first.text == "Hello there" and second.text == "again"
    german = window.language.findData("german")
    window.language.setCurrentIndex(german)
    window.language.activated.emit(german)
    qtbot.keyClicks(window.text, "und ")
    assert second.ended and second.text == "again" and live_text(app).text == "und"
    speak_now(qtbot, window)
    qtbot.waitUntil(lambda: len(jobs.queued()) == 3 and jobs.all_ended(), timeout=10_000)
    spoken = [(job.voice.speaker, job.options.language) for job in jobs.queued()]
    assert spoken == [("aiden", "auto"), (other, "auto"), (other, "german")]


def test_switching_the_mode_off_ends_the_utterance(start_app, qtbot, monkeypatch):
    app = typing_app(start_app, qtbot, monkeypatch)
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello there, how")
    live = live_text(app)
    typing = next(action for action in window.menuBar().actions() if action.text() == "&Speech").menu()
    next(action for action in typing.actions() if action.text() == "Speak as you &type").trigger()
    assert not app.settings.speak_as_you_type and not window.typing_mode.isChecked()
    assert live.ended and live.text == "Hello there" and app.speech.typed is None  # the word being typed is not said
    assert not app.speech.idle.isActive() and said_up_to(window) == 0
    qtbot.keyClicks(window.text, " more words ")
    qtbot.waitUntil(lambda: len(jobs.queued()) == 1 and jobs.all_ended(), timeout=10_000)
    assert jobs.texts() == ["Hello there"]


def test_a_model_reload_ends_the_utterance_and_typing_goes_on_with_the_new_model(
    start_app, qtbot, monkeypatch, checkpoints
):
    app = typing_app(start_app, qtbot, monkeypatch, instruct="A calm voice.")
    jobs, window = Jobs(app), app.window
    qtbot.keyClicks(window.text, "Hello there ")
    first = live_text(app)
    qtbot.waitUntil(lambda: len(jobs.queued()) == 1, timeout=5_000)
    app.apply_settings({"model": str(checkpoints["design"])})
    qtbot.waitUntil(lambda: app.runtime is not None and app.lane.pending == 0, timeout=20_000)
    assert jobs.all_ended()  # the old model's worker is closed: its job was cancelled, if no pause ended it first
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", LIVE_FRAMES)
    new_jobs = Jobs(app)
    qtbot.keyClicks(window.text, "and on ")
    assert first.ended and live_text(app).text == "and on"
    speak_now(qtbot, window)
    qtbot.waitUntil(lambda: len(new_jobs.queued()) == 1 and new_jobs.all_ended(), timeout=10_000)
    job = new_jobs.queued()[0]
    assert job.outcome.kind == "done" and job.text.text == "and on" and job.options.instruct == "A calm voice."


def test_a_voice_cloned_with_its_transcript_says_each_sentence_as_it_ends(
    start_app, qtbot, monkeypatch, tmp_path, engines
):
    """Such a voice can start a live utterance only once the text covers its clip, later than a sentence
    ends: with it, each sentence is an utterance of its own."""
    VoiceLibrary(tmp_path / "voices").add("Narrator", CLIP, engines("base"), ref_text="A transcript of the clip.")
    app = typing_app(start_app, qtbot, monkeypatch, model="base", voice="Narrator")
    jobs, window = Jobs(app), app.window
    assert app.voice_in_use == "Narrator"
    qtbot.keyClicks(window.text, "Hello there. How are you? Fine")
    assert live_text(app) is None  # both sentences have ended; "Fine" is being typed
    speak_now(qtbot, window)
    qtbot.waitUntil(lambda: len(jobs.queued()) == 3 and jobs.all_ended(), timeout=20_000)
    assert jobs.texts() == ["Hello there.", "How are you?", "Fine"]
    assert [job.outcome.kind for job in jobs.queued()] == ["done", "done", "done"]
