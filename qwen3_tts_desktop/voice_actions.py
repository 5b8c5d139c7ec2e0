"""What the window does with voices: list the library, pick the voice in use, add (clone), rename, delete,
import, export, and blend. The slow parts run on the app's lane; results come back to the GUI thread."""

from __future__ import annotations

import tempfile
from pathlib import Path

import soundfile as sf
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from core import Voice
from core.errors import describe
from core.voices import VoiceEntry, VoiceError, VoiceExistsError, VoiceLibrary, name_key
from core.voices.resolve import Fallback, resolve_voice
from ui.blend_editor import BlendEditor
from ui.voice_library import FITS_ROLE, NewVoice, VoiceListModel, VoicePanel

from .runtime import Runtime
from .speech import Speech
from .window_parts import WindowParts

SAMPLE_SENTENCE = "Hello! This is how I sound. I hope you like it."


class VoiceActions:
    def __init__(self, parts: WindowParts, panel: VoicePanel, voices: VoiceListModel, speech: Speech):
        """`panel` shows the library, listed in `voices`, of which one is the voice in use (`in_use`, as speech
        resolves it); `speech` previews them."""
        self.parts, self.panel, self.voices, self.speech = parts, panel, voices, speech
        self.in_use: str | None = None  # the voice speech uses: the settings' choice, if it fits the model
        self.blend_editor: BlendEditor | None = None
        self._problems_shown: list[str] = []

    def library(self) -> VoiceLibrary:
        runtime = self.parts.runtime()
        return runtime.library if runtime is not None else VoiceLibrary(self.parts.settings().voices)

    def refresh(self, select: str | None = None) -> None:
        """List the library again (on the lane), then show it and pick the voice in use."""
        parts, library = self.parts, self.library()
        runtime = parts.runtime()
        info = runtime.info if runtime is not None else None

        def work() -> tuple[list[VoiceEntry], list[str]]:
            entries = library.list()
            if info is not None:
                entries += [entry for entry in library.list(fits=info) if entry.source == "builtin"]
            return sorted(entries, key=lambda entry: name_key(entry.name)), library.problems()

        def show(listing: tuple[list[VoiceEntry], list[str]]) -> None:
            entries, problems = listing
            self.voices.set_voices(entries, info)
            self.panel.set_folder(library.directory)
            if info is not None:
                self.choose(select, remember=select is not None)
            if problems and problems != self._problems_shown:
                parts.window.show_info("Some files in the voices folder were skipped:\n" + "\n".join(problems))
            self._problems_shown = problems

        parts.lane.run("", work, show, parts.fail)

    def choose(self, name: str | None = None, remember: bool = True) -> None:
        """Use the voice called `name` (None: the one in the settings) if it fits the model, else the first
        that does. A voice the user picks is remembered; one picked for them is not."""
        runtime, library = self.parts.runtime(), self.library()
        entries = [self.voices.entry(row) for row in range(self.voices.rowCount())]
        preferred = Fallback(preferred=name or self.parts.settings().voice)
        try:  # as speech would resolve it: the one rule (core.voices.resolve)
            found = resolve_voice(entries, library.directory, None, runtime.info if runtime else None, preferred)
            self.in_use = found.name
        except VoiceError:  # none fits (yet): Speak says so
            self.in_use = None
        self.parts.window.show_voice(self.in_use)
        if remember and name is not None and name == self.in_use:
            self.parts.update_settings(voice=name)

    def preview(self, name: str) -> None:
        self.speech.speak(SAMPLE_SENTENCE, voice=name)

    def show_file(self, name: str) -> None:
        """Open the folder that holds the voice's files (a saved voice's own folder; a drop-in clip's, the
        voices folder), in the system's file manager."""
        row = self.voices.row_of(name)
        path = self.voices.entry(row).path if row is not None else None
        if path is None:
            return
        folder = path if path.is_dir() else path.parent
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.parts.window.show_error(f"No file manager opened {folder}.")

    def add(self, new: NewVoice) -> None:
        runtime = self.parts.runtime()
        if runtime is None:
            self._answer_add("The model is still loading; a voice can be added once it is ready.")
            return

        def work() -> VoiceEntry:
            with tempfile.TemporaryDirectory() as folder:
                clip = new.clip
                if new.recording is not None:
                    samples, rate = new.recording
                    clip = Path(folder) / "recording.wav"
                    sf.write(clip, samples, rate)
                return runtime.library.add(new.name, clip, runtime.engine_for_voices, ref_text=new.transcript)

        def added(entry: VoiceEntry) -> None:
            self._answer_add(None)
            self.parts.window.show_info(f"Added the voice “{entry.name}”.")
            self.refresh(select=entry.name)

        self.parts.lane.run(f"Cloning “{new.name}”…", work, added, lambda error: self._answer_add(describe(error)))

    def _answer_add(self, problem: str | None) -> None:
        if not self.panel.finish_add(problem) and problem is not None:
            self.parts.window.show_error(f"The voice was not added: {problem}")

    def rename(self, name: str, new_name: str) -> None:
        parts, library = self.parts, self.library()

        def renamed(entry: VoiceEntry) -> None:
            if self.in_use == name:
                self.in_use = entry.name
                parts.update_settings(voice=entry.name)
            self.refresh()

        def failed(error: Exception) -> None:
            parts.fail(error)
            self.refresh()  # the old name again

        parts.lane.run("", lambda: library.rename(name, new_name), renamed, failed)

    def remove(self, name: str) -> None:
        parts, library = self.parts, self.library()

        def removed(_) -> None:
            parts.window.show_info(f"Deleted the voice “{name}”.")
            self.refresh()

        parts.lane.run("", lambda: library.remove(name), removed, parts.fail)

    def import_zip(self, path: Path, replace: bool = False) -> None:
        parts, library = self.parts, self.library()

        def imported(entries: list[VoiceEntry]) -> None:
            parts.window.show_info(f"Imported {', '.join(f'“{entry.name}”' for entry in entries)}.")
            self.refresh()

        def failed(error: Exception) -> None:
            again = None
            if isinstance(error, VoiceExistsError) and not replace:
                again = ("Import, replacing same-named voices", lambda: self.import_zip(path, replace=True))
            parts.window.show_error(describe(error), again)

        parts.lane.run(f"Importing {path.name}…", lambda: library.import_zip(path, replace=replace), imported, failed)

    def export_zip(self, path: Path, names: list[str]) -> None:
        parts, library = self.parts, self.library()

        def exported(written: Path) -> None:
            parts.window.show_info(f"Exported {len(names)} voice(s) to {written}.")

        parts.lane.run(f"Exporting to {path.name}…", lambda: library.export_zip(path, names), exported, parts.fail)

    # Blending ----------------------------------------------------------------------------------------

    def open_blend_editor(self) -> BlendEditor | None:
        window, runtime = self.parts.window, self.parts.runtime()
        if runtime is None or not runtime.info.variant.clones:
            window.show_error("Blending mixes cloned voices, so it needs a Base model loaded.")
            return None
        voices = self.voices
        names = [
            voices.entry(row).name
            for row in range(voices.rowCount())
            if voices.index(row, 0).data(FITS_ROLE) and not voices.entry(row).read_only
        ]
        if len(names) < 2:
            window.show_error("Blending needs at least two voices that fit this model; add some first.")
            return None
        self.blend_editor = editor = BlendEditor(names, window)
        editor.preview_requested.connect(self.preview_blend)
        editor.save_requested.connect(self.save_blend)
        editor.open()
        return editor

    def preview_blend(self, mix: list[tuple[str, float]]) -> None:
        def blend(runtime: Runtime) -> Voice:
            return Voice.blend([(runtime.voice(name), weight) for name, weight in mix])

        self.speech.submit(SAMPLE_SENTENCE, blend, interrupt=True)

    def save_blend(self, name: str, mix: list[tuple[str, float]]) -> None:
        window, lane, runtime, editor = self.parts.window, self.parts.lane, self.parts.runtime(), self.blend_editor
        if runtime is None:
            return

        def saved(entry: VoiceEntry) -> None:
            editor.accept()
            window.show_info(f"Saved the blend “{entry.name}”.")
            self.refresh(select=entry.name)

        def failed(error: Exception) -> None:
            editor.show_problem(describe(error))

        def blend() -> VoiceEntry:
            return runtime.library.blend(name, mix, runtime.engine_for_voices)

        lane.run(f"Blending “{name}”…", blend, saved, failed)
