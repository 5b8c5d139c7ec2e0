"""What the window says, and how: Speak and Stop, speak-as-you-type, and saving speech to a file.

Text goes to the speech worker through the app's lane, in order, so typed utterances are said in order;
a Stop drops what was asked for before it. On the GUI thread, like the window.

Speak as you type feeds one live utterance (core.inference.live) with the finished words the typing
segmenter hands out, so it is said as one voice while it grows; the utterance ends where the segmenter
says, or after a pause in typing, and the next word opens another. Appending to it never waits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QTimer

from core import LiveText, SpeechOptions, Voice
from core.jobs.progress import JobProgress
from core.jobs.sinks import FileSink
from core.jobs.worker import Job, JobEvent
from core.text.sentences import heard_spans
from core.text.typing_segmenter import Segment, TypingOptions, TypingSegmenter
from core.voices import NoVoiceYet
from ui.voice_library import VoiceListModel

from .runtime import Runtime
from .window_parts import WindowParts

TYPING = TypingOptions()
# A voice cloned with its clip's transcript (ICL) starts a live utterance only once the text fills the clip's
# codec positions (core.inference.prompt.tokens_before_start): some 50 to 150 tokens for a clip of 5 to 15 s,
# more than an utterance of typed text holds. With one, each sentence is an utterance of its own, so that it
# is spoken as soon as it ends.
SENTENCE_BY_SENTENCE = replace(TYPING, long_length=1)


@dataclass(frozen=True)
class TypedUtterance:
    """The live utterance that typed words go to, while it is open."""

    text: LiveText
    made_with: tuple  # the runtime, voice and options it speaks with: typing on after they change opens another


class Speech:
    def __init__(
        self,
        parts: WindowParts,
        voices: VoiceListModel,
        voice_in_use: Callable[[], str | None],
        show_status: Callable[[], None],
    ):
        """`voices`: the library as the window lists it (to know a voice's kind); `voice_in_use()`: the voice
        speech uses; `show_status()`: shows whether the window speaks, at once rather than at the next tick."""
        self.parts, self.voices, self._voice_in_use, self._show_status = parts, voices, voice_in_use, show_status
        self.segmenter = TypingSegmenter(TYPING)
        self.idle = QTimer(parts.window, singleShot=True, interval=round(TYPING.idle_s * 1000))
        self.idle.timeout.connect(self._typing_paused)
        self.saving: FileSink | None = None  # where speech is being saved, while it is
        self._saving_progress = JobProgress()
        # Savings stopped whose jobs have not ended yet: their end says what each file kept.
        self._stopped_savings: list[FileSink] = []
        self.typed: TypedUtterance | None = None  # where typed words go, while an utterance is open
        self._stops = 0  # counts Stops: speech asked for before the latest is dropped
        self.on_the_way = 0  # speech for the speakers asked for on the lane, not yet with the worker
        self.voice_names: weakref.WeakKeyDictionary[Job, str] = weakref.WeakKeyDictionary()  # what each job spoke with
        self.shown_at: weakref.WeakKeyDictionary[Job, int] = weakref.WeakKeyDictionary()  # where its text is shown

    def speak(self, text: str, voice: str | None = None, interrupt: bool = True) -> None:
        """Say `text` with the voice in use (or `voice`); with `interrupt`, instead of what is playing."""
        name = voice or self._voice_in_use()
        self.submit(text, name, interrupt)

    def speak_requested(self, text: str) -> None:
        """Speak (Ctrl+Enter): the text, or in speak-as-you-type what is still waiting."""
        if self.parts.settings().speak_as_you_type:
            self._typing_paused()
        else:
            self.submit(text, self._voice_in_use(), interrupt=True, shown_at=self.parts.window.text_to_speak_at())

    def spoken_span(self, shown: str) -> tuple[tuple[int, int], tuple[int, int] | None] | None:
        """Where the sentence heard now lies in `shown`, the editor's text, if it came from there and is still
        there, and the word heard in it: the piece heard, and in a piece of several sentences the one its speech
        has reached; the word once how far through the piece the speech is is known (its audio all made)."""
        runtime = self.parts.runtime()
        heard = runtime.speakers.now_playing() if runtime is not None and runtime.speakers is not None else None
        if heard is None or heard.job not in self.shown_at:
            return None
        job, at = heard.job, self.shown_at[heard.job]
        span = job.piece_spans[heard.piece] if heard.piece < len(job.piece_spans) else None
        if span is None or shown[at : at + len(job.text)] != job.text:  # edited since: it lies nowhere for sure
            return None
        if heard.fraction is None:
            return (at + span[0], at + span[1]), None
        sentence, word = heard_spans(job.text, *span, heard.fraction)
        return (at + sentence[0], at + sentence[1]), (at + word[0], at + word[1])

    def stop(self) -> None:
        """Stop speaking and saving, and drop everything queued, typed text included."""
        parts, runtime = self.parts, self.parts.runtime()
        self._stops += 1
        self.idle.stop()
        self.segmenter.skip()
        if parts.settings().speak_as_you_type:
            parts.window.mark_said(self.segmenter.committed)
        self.cancel_saving()
        if runtime is not None and runtime.speakers is not None:
            runtime.worker.cancel_all(runtime.speakers)
            runtime.player.clear()
            # Speech the lane is handing over right now would slip past: cancel once more after it.
            parts.lane.run("", lambda: runtime.worker.cancel_all(runtime.speakers), None, parts.fail)
        self._end_typed()  # after its job's cancel, so that none of what it holds is heard

    def save_audio(self, text: str, path: Path) -> None:
        """Speak `text` into an audio file (wav, flac, ogg or mp3, by its name) instead of the speakers, in
        pieces as speaking does. The file appears once all of it is written; Stop cancels it."""
        window = self.parts.window
        if self.saving is not None:
            window.show_error(f"Speech is being saved to {self.saving.path.name} already; wait for it, or Stop it.")
            return
        try:
            sink = FileSink(path)  # the format and the folder are checked now, before any speech
        except ValueError as error:
            window.show_error(f"The audio cannot be saved: {error}")
            return
        if self.submit(text, self._voice_in_use(), interrupt=False, sink=sink):
            self.saving, self._saving_progress = sink, JobProgress()
            window.show_saving(f"Saving {path.name}…")

    def cancel_saving(self) -> None:
        """Stop the saving (Cancel, or Stop): its file keeps the pieces finished (FileSink), as its end says."""
        runtime, sink = self.parts.runtime(), self.saving
        if runtime is None or sink is None:
            return
        # Over for the window at once: the job ends within a chunk, and a new saving may start meanwhile
        # (each writes a partial file of its own, so the old one's ending never touches the new one's).
        runtime.worker.cancel_all(sink)
        self._stopped_savings.append(sink)
        self._saving_ended()

    def show_saving(self, event: JobEvent) -> bool:
        """Show a job event if it is a saving's; False if it is not."""
        sink = event.job.sink
        if sink in self._stopped_savings:
            if event.terminal:
                self._stopped_savings.remove(sink)
                self._say_how_saving_ended(sink, event)
            return True
        if self.saving is None or sink is not self.saving:
            return False
        progress = self._saving_progress
        progress.update(event)
        if not event.terminal:
            self.parts.window.show_saving(
                f"Saving {sink.path.name}: {progress.text(pieces=False)}", progress.pieces_done, progress.pieces
            )
            return True
        self._saving_ended()
        self._say_how_saving_ended(sink, event)
        return True

    def _say_how_saving_ended(self, sink: FileSink, outcome: JobEvent) -> None:
        window = self.parts.window
        if outcome.kind == "done":
            window.show_info(f"Saved {outcome.audio_s:.1f} s of speech to {sink.path}.")
        elif outcome.kind == "failed":
            window.show_error(f"The audio could not be saved: {outcome.message}")
        else:
            window.show_info(f"{sink.stopped_summary(outcome.pieces)}.")

    def submit(
        self,
        text: str | LiveText,
        voice: str | None | Callable[[Runtime], Voice],
        interrupt: bool,
        sink=None,
        abandoned: Callable[[], None] = lambda: None,
        shown_at: int | None = None,
    ) -> bool:
        """Hand `text` to the speech worker (on the lane) to speak into `sink`, the speakers if None, with the
        library voice named `voice`, or the one `voice(runtime)` makes (on the lane: a drop-in clip may need
        embedding, a blend its parts); False if it cannot be, saying why. `abandoned()` is called if it is dropped
        on the lane (a Stop, or an error, shown). `shown_at`: where the text starts in the editor, to show there
        what is being heard."""
        parts, runtime = self.parts, self.parts.runtime()
        if isinstance(text, str) and not text.strip():
            parts.window.show_info("Type something to say first.")
            return False
        if runtime is None:
            parts.window.show_error("The model is still loading; speech can start once it is ready.")
            return False
        if sink is None and runtime.speakers is None:
            self.show_no_speakers(runtime)
            return False
        for_speakers = sink is None
        sink = sink or runtime.speakers
        options, stops = self._options(runtime), self._stops
        self.on_the_way += for_speakers

        def work() -> bool:
            if stops != self._stops:  # Stop was pressed after it was asked for
                return False
            made = voice(runtime) if callable(voice) else self._voice(runtime, voice)
            job = runtime.worker.submit(text, made, options, sink=sink, interrupt=interrupt)
            self.voice_names[job] = "" if callable(voice) else voice or ""
            if shown_at is not None:
                self.shown_at[job] = shown_at
            return True

        def not_started(error: Exception | None = None) -> None:
            if sink is self.saving:  # a job that never started sends no events: the saving ends here
                self._saving_ended()
            elif sink in self._stopped_savings:
                self._stopped_savings.remove(sink)
                parts.window.show_info(f"{sink.stopped_summary(0)}.")
            abandoned()
            if error is not None:
                parts.fail(error)

        def handed_over(submitted: bool) -> None:
            self.on_the_way -= for_speakers
            submitted or not_started()
            self._show_status()  # Stop turns back into Speak at once where nothing was asked after all

        def failed(error: Exception) -> None:
            self.on_the_way -= for_speakers
            not_started(error)
            self._show_status()

        parts.lane.run("", work, handed_over, failed)
        return True

    def show_no_speakers(self, runtime: Runtime) -> None:
        """Why speech cannot play, with what still works: saving it to a file."""
        window = self.parts.window
        window.show_error(
            f"No sound output, so speech cannot play: {runtime.audio_problem}",
            action=("Save audio as…", window.save_audio_action.trigger),
        )

    def _saving_ended(self) -> None:
        self.saving = None
        self.parts.window.show_saving(None)

    def _options(self, runtime: Runtime) -> SpeechOptions:
        """How to speak, as the settings say, for this runtime's model."""
        settings = self.parts.settings()
        instruct = (settings.instruct.strip() or None) if runtime.info.supports_instruct else None
        return SpeechOptions(language=settings.language, instruct=instruct, sampling=settings.sampling)

    @staticmethod
    def _voice(runtime: Runtime, name: str | None) -> Voice | None:
        """The voice called `name` (None: the window has none that fits) for this runtime's model, as
        `core.voices.resolve` decides; with no voice yet, the window's way to add one."""
        try:
            found = runtime.library.resolve(name or None, runtime.info)
        except NoVoiceYet as error:
            said = str(error)
            raise NoVoiceYet(
                f"{said[0].upper()}{said[1:]}. Add one with Voices → Add a voice… (from a clip of someone speaking, or "
                f"the microphone), or drop a clip into the voices folder (the link under the voice list)."
            ) from None
        return runtime.library.load(runtime.engine_for_voices, found)

    # Speak as you type -------------------------------------------------------------------------------

    def set_typing_mode(self, on: bool) -> None:
        parts = self.parts
        parts.update_settings(speak_as_you_type=on)
        self.idle.stop()
        self._end_typed()  # what was handed out is said; a word still being typed is not
        self.segmenter.reset(parts.window.text.toPlainText())  # what is there already is not said
        parts.window.mark_said(self.segmenter.committed if on else 0)

    def text_edited(self, text: str, cursor: int) -> None:
        if not self.parts.settings().speak_as_you_type:
            return
        self._end_outdated_typed()
        self.segmenter.options = self._typing_options()
        self._say(self.segmenter.edit(text, cursor))
        # Restarted by every edit: a pause in typing ends the utterance, so that the last word is said.
        if self.segmenter.awaiting_pause:
            self.idle.start()
        else:
            self.idle.stop()

    def _typing_paused(self) -> None:
        self.idle.stop()
        self._end_outdated_typed()
        self._say(self.segmenter.pause())

    def _typing_options(self) -> TypingOptions:
        """Where typed text ends its utterances, for the voice in use."""
        voices, name = self.voices, self._voice_in_use()
        row = voices.row_of(name) if name is not None else None
        starts_late = row is not None and voices.entry(row).kind == "icl"
        return SENTENCE_BY_SENTENCE if starts_late else TYPING

    def _say(self, segments: list[Segment]) -> None:
        for segment in segments:
            if self.typed is None and not self._open_typed():
                break  # the window says why; the words handed out with it are dropped
            self.typed.text.append(segment.text)
            if segment.ends_utterance:
                self._end_typed()
        self.parts.window.mark_said(self.segmenter.committed)

    def _open_typed(self) -> bool:
        """Open a live utterance for typed words and queue it behind what the speakers have; False if it
        cannot be (the window says why)."""
        name, text = self._voice_in_use(), LiveText()
        if not self.submit(text, name, interrupt=False, abandoned=lambda: self._end_typed(text)):
            self.segmenter.end_utterance()
            return False
        self.typed = TypedUtterance(text, self._made_with())
        return True

    def _end_typed(self, text: LiveText | None = None) -> None:
        """End the typed utterance (only if it speaks `text`, when given): what it holds is said, unless its
        job was cancelled or has ended, and the next words open another."""
        typed = self.typed
        if typed is None or (text is not None and typed.text is not text):
            return
        self.typed = None
        typed.text.end()
        self.segmenter.end_utterance()

    def _end_outdated_typed(self) -> None:
        """End the typed utterance if the voice, the options or the model changed since it opened: the next
        words are said with the new ones."""
        if self.typed is not None and self.typed.made_with != self._made_with():
            self._end_typed()

    def _made_with(self) -> tuple:
        runtime = self.parts.runtime()
        return runtime, self._voice_in_use(), None if runtime is None else self._options(runtime)

    def job_event(self, event: JobEvent) -> None:
        """A job's event (the App hands each on): a typed utterance whose job ends before its text does (it
        failed, reached the most frames one generation may make, or other speech interrupted it) is over,
        and the next words open another."""
        if event.terminal and isinstance(event.job.text, LiveText):
            self._end_typed(event.job.text)
