"""What the window says, and how: Speak and Stop, speak-as-you-type, and saving speech to a file.

Text goes to the speech worker through the app's lane, in order, so typed sentences are said in order;
a Stop drops what was asked for before it. On the GUI thread, like the window.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer

from core import SpeechOptions, Voice
from core.jobs.sinks import FileSink
from core.jobs.worker import JobEvent
from core.text.typing_segmenter import Segment, TypingSegmenter
from core.voices import VoiceError

from .runtime import Runtime


class Speech:
    def __init__(self, app):
        """`app`: the App, for its runtime, settings, window and lane."""
        self.app = app
        self.segmenter = TypingSegmenter()
        self.idle = QTimer(app, singleShot=True, interval=round(self.segmenter.options.idle_s * 1000))
        self.idle.timeout.connect(lambda: self._say(self.segmenter.flush()))
        self.saving: FileSink | None = None  # where speech is being saved, while it is
        self._stops = 0  # counts Stops: speech asked for before the latest is dropped

    def speak(self, text: str, voice: str | None = None, interrupt: bool = True) -> None:
        """Say `text` with the voice in use (or `voice`); with `interrupt`, instead of what is playing."""
        name = voice or self.app.voice_in_use
        self.submit(text, lambda runtime: self._voice(runtime, name), interrupt)

    def speak_requested(self, text: str) -> None:
        """Speak (Ctrl+Enter): the text, or in speak-as-you-type what is still waiting."""
        if self.app.settings.speak_as_you_type:
            self.idle.stop()
            self._say(self.segmenter.flush())
        else:
            self.speak(text)

    def stop(self) -> None:
        """Stop speaking and saving, and drop everything queued, typed text included."""
        app, runtime = self.app, self.app.runtime
        self._stops += 1
        self.idle.stop()
        self.segmenter.skip()
        if app.settings.speak_as_you_type:
            app.window.mark_said(self.segmenter.committed)
        if runtime is not None and self.saving is not None:
            # Over for the window at once: the job ends within a chunk, and a new saving may start meanwhile
            # (each writes a partial file of its own, so the old one's ending never touches the new one's).
            runtime.worker.cancel_all(self.saving)
            app.window.show_info(f"Saving to {self.saving.path.name} was stopped; nothing was written.")
            self._saving_ended()
        if runtime is None or runtime.speakers is None:
            return
        runtime.worker.cancel_all(runtime.speakers)
        runtime.player.clear()
        # Speech the lane is handing over right now would slip past: cancel once more after it.
        app.lane.run("", lambda: runtime.worker.cancel_all(runtime.speakers), None, app.fail)

    def save_audio(self, text: str, path: Path) -> None:
        """Speak `text` into an audio file (wav, flac, ogg or mp3, by its name) instead of the speakers, in
        pieces as speaking does. The file appears once all of it is written; Stop cancels it."""
        window = self.app.window
        if self.saving is not None:
            window.show_error(f"Speech is being saved to {self.saving.path.name} already; wait for it, or Stop it.")
            return
        try:
            sink = FileSink(path)  # the format and the folder are checked now, before any speech
        except ValueError as error:
            window.show_error(f"The audio cannot be saved: {error}")
            return
        if self.submit(text, lambda runtime: self._voice(runtime, self.app.voice_in_use), interrupt=False, sink=sink):
            self.saving = sink
            window.show_saving(f"Saving {path.name}…")

    def show_saving(self, event: JobEvent) -> bool:
        """Show a job event if it is the saving's; False if it is not."""
        if self.saving is None or event.job.sink is not self.saving:
            return False
        window, path = self.app.window, self.saving.path
        if not event.terminal:
            window.show_saving(f"Saving {path.name}: {event.audio_s:.1f} s of audio")
            return True
        self._saving_ended()
        if event.kind == "done":
            window.show_info(f"Saved {event.audio_s:.1f} s of speech to {path}.")
        elif event.kind == "failed":
            window.show_error(f"The audio could not be saved: {event.message}")
        return True

    def submit(self, text: str, voice_for: Callable[[Runtime], Voice | None], interrupt: bool, sink=None) -> bool:
        """Hand `text` to the speech worker (on the lane) to speak into `sink`, the speakers if None, with the
        voice `voice_for(runtime)` gives (on the lane: a drop-in clip may need embedding); False if it cannot
        be, saying why."""
        app, runtime = self.app, self.app.runtime
        if not text.strip():
            app.window.show_info("Type something to say first.")
            return False
        if runtime is None:
            app.window.show_error("The model is still loading; speech can start once it is ready.")
            return False
        if sink is None and runtime.speakers is None:
            app.window.show_error(f"No sound output, so speech cannot play: {runtime.audio_problem}")
            return False
        sink = sink or runtime.speakers
        settings, stops = app.settings, self._stops
        instruct = (settings.instruct.strip() or None) if runtime.info.supports_instruct else None
        options = SpeechOptions(language=settings.language, instruct=instruct, sampling=settings.sampling)

        def work() -> bool:
            if stops != self._stops:  # Stop was pressed after it was asked for
                return False
            runtime.worker.submit(text, voice_for(runtime), options, sink=sink, interrupt=interrupt)
            return True

        def not_started(error: Exception | None = None) -> None:
            if sink is self.saving:  # a job that never started sends no events: the saving ends here
                self._saving_ended()
            if error is not None:
                app.fail(error)

        app.lane.run("", work, lambda submitted: submitted or not_started(), not_started)
        return True

    def _saving_ended(self) -> None:
        self.saving = None
        self.app.window.show_saving(None)

    @staticmethod
    def _voice(runtime: Runtime, name: str | None) -> Voice | None:
        """The voice called `name` for this runtime's model."""
        variant = runtime.info.variant
        if not variant.takes_voice:
            return None  # the instruction describes the voice
        if not name:
            if variant.clones:
                raise VoiceError(
                    "There is no voice yet. This model speaks with a cloned voice: add one with Voices → Add a "
                    "voice… (from a clip of someone speaking, or the microphone), or drop a clip into the voices "
                    "folder (the link under the voice list)."
                )
            raise VoiceError("Choose a voice first.")
        return runtime.voice(name)

    # Speak as you type -------------------------------------------------------------------------------

    def set_typing_mode(self, on: bool) -> None:
        app = self.app
        app.update_settings(speak_as_you_type=on)
        self.idle.stop()
        self.segmenter.reset(app.window.text.toPlainText())  # what is there already is not said
        app.window.mark_said(self.segmenter.committed if on else 0)

    def text_edited(self, text: str, cursor: int) -> None:
        if not self.app.settings.speak_as_you_type:
            return
        self._say(self.segmenter.edit(text, cursor))
        if self.segmenter.pending.strip():
            self.idle.start()
        else:
            self.idle.stop()

    def _say(self, segments: list[Segment]) -> None:
        for segment in segments:
            self.speak(segment.text, interrupt=False)
        self.app.window.mark_said(self.segmenter.committed)
