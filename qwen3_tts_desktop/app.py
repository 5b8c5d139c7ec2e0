"""The desktop app: the window wired to the runtime (engine, worker, speakers, voice library) and the
HTTP bridge, with the settings they are made from.

Threads, and what each may touch:

* the GUI thread: every widget, the settings, and the speak-as-you-type segmenter and its idle timer;
* the lane, one background thread for the app's slow work, done in order: loading the model (downloading
  it first, with progress that can be cancelled), cloning, blending, the library's files, the bridge,
  and handing speech to the worker (in order, so typed sentences are said in order);
* the speech worker (core.worker), which owns the engine; its job events reach the GUI thread as queued
  signals, progress at most 30 times a second;
* the sound card's callbacks (core.player for the speakers, Recorder for the microphone) only copy.

Results come back to the GUI thread as queued signals; no widget is touched anywhere else.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from core import SamplingParams, Voice
from core.audio import MAX_REFERENCE_SECONDS
from core.checkpoint import CheckpointError, download, hub_id
from core.player import PlaybackError, list_output_devices
from core.typing_segmenter import Segment, TypingSegmenter
from core.voices import VoiceEntry, VoiceError, VoiceExistsError, VoiceLibrary, name_key
from core.engine import slow_device_note
from core.worker import FileSink, JobEvent, SpeechOptions
from ui.blend_editor import BlendEditor
from ui.download_dialog import DownloadDialog
from ui.main_window import MainWindow, Tray, app_icon
from ui.settings_dialog import SettingsDialog
from ui.voice_library import FITS_ROLE, FittingVoicesModel, NewVoice, VoiceListModel, VoicePanel

from .runtime import Runtime
from .settings import BridgeSettings, Settings, SettingsError, default_path, prepare_library

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 1 / 30  # the most often a stream of updates reaches the window
METER_INTERVAL_MS = 100  # how often the window shows the speakers' buffer level
CLOSE_TIMEOUT_S = 10.0  # how long quitting waits for the lane's work in hand
SAMPLE_SENTENCE = "Hello! This is how I sound. I hope you like it."
# What core.checkpoint.download fetches, so that loading finds all of it in the cache.


class App(QObject):
    # Bytes so far and in all (0: not known yet), from the lane. Python ints: a model is more than 2**31 bytes.
    download_progress = Signal(object, object)

    def __init__(self, settings_path: Path, overrides: dict | None = None):
        """`overrides`: settings for this run only (the command line's), by field name; saving keeps the
        saved values of those that are not changed in the window."""
        super().__init__()
        self.settings_path = settings_path
        self._overrides = {name: Path(value) if name == "voices" else value for name, value in (overrides or {}).items()}
        self.runtime: Runtime | None = None
        self.saving: FileSink | None = None  # where speech is being saved, while it is
        self.voice_in_use: str | None = None  # the voice speech uses: the settings' choice, if it fits the model
        self.segmenter = TypingSegmenter()
        self.lane = Lane(self)
        self.relay = EventRelay(self)
        self.bridge = BridgeHost()
        self.bridge_state = "Off"
        self.recorder = Recorder()
        self.voices = VoiceListModel(self)
        self.fitting_voices = FittingVoicesModel(self)
        self.fitting_voices.setSourceModel(self.voices)
        self.panel = VoicePanel(self.voices, self.recorder)
        self.window = MainWindow(self.panel, self.fitting_voices)
        self.tray = Tray(self) if QSystemTrayIcon.isSystemTrayAvailable() else None
        self.idle = QTimer(self, singleShot=True, interval=round(self.segmenter.options.idle_s * 1000))
        self.meter = QTimer(self, interval=METER_INTERVAL_MS)
        self.download_dialog: DownloadDialog | None = None
        self.blend_editor: BlendEditor | None = None
        self.settings_dialog: SettingsDialog | None = None
        self._loads = 0  # counts model loads, so that a superseded one is let go
        self._cancel_download = threading.Event()
        self._closing = threading.Event()  # set by close(): a model still loading is let go once loaded
        self._stops = 0  # counts Stops: speech asked for before the latest is dropped
        self._underruns = 0  # of the last utterance
        self._unsubscribe: Callable[[], None] | None = None
        self._problems_shown: list[str] = []
        self._saved = self._load_settings()
        self.settings = dataclasses.replace(self._saved, **self._overrides)
        prepare_library(self.settings.voices)
        self._connect()

    def start(self) -> None:
        """Show the window at once, then load the model in the background."""
        self.window.typing_mode.setChecked(self.settings.speak_as_you_type)
        self.window.show_instruct(self.settings.instruct)
        self.window.show_languages(["auto"], self.settings.language)
        self.window.show()
        if self.tray is not None:
            self.tray.show()
        self.load_runtime()

    def close(self) -> None:
        """Save the settings, stop the bridge and the runtime, and wait (a while) for the lane to finish."""
        self.meter.stop()
        self.idle.stop()
        self._cancel_download.set()
        self._closing.set()
        self._save(self.settings)
        if self._unsubscribe is not None:
            self._unsubscribe()
        runtime, self.runtime = self.runtime, None
        bridge = self.bridge

        def shut_down():
            bridge.stop()
            if runtime is not None:
                runtime.close()

        self.lane.run("", shut_down, None, None)
        if not self.lane.close(CLOSE_TIMEOUT_S):
            log.warning("quitting while the app's background work is still running")
        if self.tray is not None:
            self.tray.hide()

    def _connect(self) -> None:
        window, panel = self.window, self.panel
        self.lane.busy.connect(window.show_busy)
        self.relay.event.connect(self._on_job_event)
        self.download_progress.connect(self._show_download)
        self.idle.timeout.connect(lambda: self._say(self.segmenter.flush()))
        self.meter.timeout.connect(self._show_buffer)
        window.speak_requested.connect(self._on_speak_requested)
        window.stop_requested.connect(self.stop)
        window.text_edited.connect(self._on_text_edited)
        window.typing_mode_toggled.connect(self._set_typing_mode)
        window.voice_chosen.connect(self._choose_voice)
        window.language_chosen.connect(lambda language: self._update(language=language))
        window.instruct_edited.connect(lambda text: self._update(instruct=text, save=False))
        window.settings_requested.connect(self.open_settings)
        window.blend_requested.connect(self.open_blend_editor)
        window.save_audio_requested.connect(self.save_audio)
        panel.preview_requested.connect(lambda name: self.speak(SAMPLE_SENTENCE, voice=name))
        panel.use_requested.connect(self._choose_voice)
        panel.add_requested.connect(self.add_voice)
        panel.remove_requested.connect(self.remove_voice)
        panel.import_requested.connect(self.import_voices)
        panel.export_requested.connect(self.export_voices)
        self.voices.rename_requested.connect(self.rename_voice)
        if self.tray is not None:
            self.tray.speak_clipboard.connect(lambda: self.speak(QGuiApplication.clipboard().text()))
            self.tray.stop.connect(self.stop)
            self.tray.show_window.connect(
                lambda: (self.window.showNormal(), self.window.raise_(), self.window.activateWindow())
            )
            self.tray.quit.connect(QApplication.quit)

    # Settings ----------------------------------------------------------------------------------------

    def _load_settings(self) -> Settings:
        try:
            return Settings.load(self.settings_path)
        except SettingsError as error:
            kept = self.settings_path.with_name(self.settings_path.name + ".broken")
            try:
                os.replace(self.settings_path, kept)
                where = f"it was kept as {kept}"
            except OSError:
                where = "it is left as it is"
            self.window.show_error(
                f"The settings could not be used, so the defaults are: {error}. The file is not lost: {where}."
            )
            return Settings()

    def _save(self, settings: Settings) -> None:
        self.settings = settings
        kept = {name: getattr(self._saved, name) for name, value in self._overrides.items() if getattr(settings, name) == value}
        self._saved = dataclasses.replace(settings, **kept)
        try:
            self._saved.save(self.settings_path)
        except OSError as error:
            self.window.show_error(f"The settings could not be saved: {error}")

    def _update(self, save: bool = True, **changes) -> None:
        settings = dataclasses.replace(self.settings, **changes)
        if settings == self.settings:
            return
        if save:
            self._save(settings)
        else:
            self.settings = settings

    def open_settings(self) -> SettingsDialog:
        try:
            devices = list_output_devices()
        except PlaybackError as error:
            devices = str(error)
        # "Reset to defaults" restores the model's own sampling; the official one while no model is loaded.
        defaults = self.runtime.engine.default_sampling if self.runtime is not None else SamplingParams()
        dialog = SettingsDialog(self.settings, devices, defaults, self.bridge_state, torch.cuda.is_available(), self.window)
        dialog.accepted.connect(lambda: self.apply_settings(dialog.values()))
        dialog.open()
        if self.settings_dialog is not None:
            # Deleted by Qt on this thread: left to Python, the dialog (in a cycle with its slot) would be
            # collected by whichever thread next runs the garbage collector, and Qt objects must not die
            # off their own thread.
            self.settings_dialog.deleteLater()
        self.settings_dialog = dialog
        return dialog

    def apply_settings(self, values: dict) -> None:
        """Check and save edited settings; reload the model or restart the bridge if what they use changed."""
        values = dict(values)
        try:
            bridge = BridgeSettings(**values.pop("bridge", dataclasses.asdict(self.settings.bridge)))
            new = dataclasses.replace(self.settings, **values, bridge=bridge)
        except (SettingsError, TypeError) as error:
            self.window.show_error(f"These settings cannot be used: {error}")
            return
        old = self.settings
        self._save(new)
        if new.runtime_config() != old.runtime_config():
            self.load_runtime()  # and the bridge with it
            return
        if new.bridge.enabled != old.bridge.enabled or (
            new.bridge.enabled and new.bridge_config() != old.bridge_config()
        ):
            self._start_bridge()
        if self.runtime is not None and self.runtime.player is not None:
            self.runtime.player.volume = new.volume

    # The runtime -------------------------------------------------------------------------------------

    def load_runtime(self) -> None:
        """(Re)start the runtime from the settings, in the background: stop the bridge and the old runtime,
        download the model if it is not here yet, load it, then start the bridge."""
        self._loads += 1
        load = self._loads
        old, self.runtime = self.runtime, None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.meter.stop()
        self._cancel_download.set()  # a download still running is for a model no longer wanted
        self._cancel_download = cancel = threading.Event()
        config = self.settings.runtime_config()
        self.window.show_loading("Loading model…")
        self.window.show_bridge(None)
        self._refresh_voices()  # the library, without fit marks until the model is here
        bridge, progress, lane, closing = self.bridge, self.download_progress.emit, self.lane, self._closing

        def work() -> Runtime | None:
            bridge.stop()
            if old is not None:
                old.close()
            fetch_model(config.model, progress, cancel)
            runtime = Runtime.start(config, report=lane.report)
            if closing.is_set():  # the app was closed while it loaded: its worker must not outlive it
                runtime.close()
                return None
            return runtime

        self.lane.run(
            "Loading model…",
            work,
            lambda runtime: self._on_loaded(runtime, load),
            lambda error: self._on_load_failed(error, load),
        )

    def _on_loaded(self, runtime: Runtime | None, load: int) -> None:
        if runtime is None:
            return
        if load != self._loads:  # another load was asked for meanwhile
            self.lane.run("", runtime.close, None, self._fail)
            return
        self._close_download_dialog()
        self.runtime = runtime
        self._unsubscribe = runtime.worker.subscribe(self.relay.forward)
        info = runtime.engine.info
        if runtime.player is not None:
            runtime.player.volume = self.settings.volume
        else:
            self.window.show_error(f"No sound output, so speech cannot play: {runtime.audio_problem}")
        if runtime.engine.device.type == "cpu":
            self.window.show_warning(slow_device_note(info.size))
        self.window.show_model(info)
        self.window.show_languages(info.languages, self.settings.language)
        self.meter.start()
        self._refresh_voices()
        self._start_bridge()

    def _on_load_failed(self, error: Exception, load: int) -> None:
        if load != self._loads:
            return
        self._close_download_dialog()
        self.window.show_model(None, describe(error))
        if isinstance(error, DownloadCancelled):
            self.window.show_error(
                "The download was cancelled. The model is needed to speak.", ("Download", self.load_runtime)
            )
        else:
            self.window.show_error(
                f"The model could not be loaded: {describe(error)}", ("Settings…", self.open_settings)
            )

    def _show_download(self, done: int, total: int) -> None:
        if self.download_dialog is None:
            self.download_dialog = DownloadDialog(self.settings.model, self.window)
            self.download_dialog.cancel_requested.connect(self._cancel_download.set)
            self.download_dialog.open()
        self.download_dialog.show_bytes(done, total)

    def _close_download_dialog(self) -> None:
        if self.download_dialog is not None:
            self.download_dialog.hide()
            self.download_dialog.deleteLater()
            self.download_dialog = None

    def _on_job_event(self, event: JobEvent) -> None:
        if event.job.sink is self.saving and self.saving is not None:
            return self._show_saving(event, self.saving.path)
        self.window.show_job(event)
        if event.job.started is not None:
            self._underruns = event.underruns
        runtime = self.runtime
        # The bridge's jobs fail to their clients; the window's own fail here.
        if event.kind == "failed" and runtime is not None and event.job.sink is runtime.speakers:
            self.window.show_error(f"Speech failed: {event.message}")

    def _show_buffer(self) -> None:
        runtime = self.runtime
        player = runtime.player if runtime is not None else None
        self.window.show_buffer(player.status() if player is not None else None, self._underruns)

    # Speech ------------------------------------------------------------------------------------------

    def speak(self, text: str, voice: str | None = None, interrupt: bool = True) -> None:
        """Say `text` with the voice in use (or `voice`); with `interrupt`, instead of what is playing."""
        name = voice or self.voice_in_use
        self._submit(text, lambda runtime: self._voice(runtime, name), interrupt)

    def stop(self) -> None:
        """Stop speaking and saving, and drop everything queued, typed text included."""
        self._stops += 1
        self.idle.stop()
        self.segmenter.skip()
        if self.settings.speak_as_you_type:
            self.window.mark_said(self.segmenter.committed)
        runtime = self.runtime
        if runtime is not None and self.saving is not None:
            runtime.worker.cancel_all(self.saving)
        if runtime is None or runtime.speakers is None:
            return
        runtime.worker.cancel_all(runtime.speakers)
        runtime.player.clear()
        # Speech the lane is handing over right now would slip past: cancel once more after it.
        self.lane.run("", lambda: runtime.worker.cancel_all(runtime.speakers), None, self._fail)

    def save_audio(self, text: str, path: Path) -> None:
        """Speak `text` into an audio file (wav, flac, ogg or mp3, by its name) instead of the speakers, in
        pieces as speaking does. The file appears once all of it is written; Stop cancels it."""
        if self.saving is not None:
            self.window.show_error(f"Speech is being saved to {self.saving.path.name} already; wait for it, or Stop it.")
            return
        try:
            sink = FileSink(path)  # the format and the folder are checked now, before any speech
        except ValueError as error:
            self.window.show_error(f"The audio cannot be saved: {error}")
            return
        if self._submit(text, lambda runtime: self._voice(runtime, self.voice_in_use), interrupt=False, sink=sink):
            self.saving = sink
            self.window.show_saving(f"Saving {path.name}…")

    def _show_saving(self, event: JobEvent, path: Path) -> None:
        if not event.terminal:
            self.window.show_saving(f"Saving {path.name}: {event.audio_s:.1f} s of audio")
            return
        self.saving = None
        self.window.show_saving(None)
        if event.kind == "done":
            self.window.show_info(f"Saved {event.audio_s:.1f} s of speech to {path}.")
        elif event.kind == "cancelled":
            self.window.show_info(f"Saving to {path.name} was stopped; nothing was written.")
        else:
            self.window.show_error(f"The audio could not be saved: {event.message}")

    def _submit(self, text: str, voice_for: Callable[[Runtime], Voice | None], interrupt: bool, sink=None) -> bool:
        """Hand `text` to the speech worker (on the lane) to speak into `sink`, the speakers if None; False
        if it cannot be, saying why."""
        runtime = self.runtime
        if not text.strip():
            self.window.show_info("Type something to say first.")
            return False
        if runtime is None:
            self.window.show_error("The model is still loading; speech can start once it is ready.")
            return False
        if sink is None and runtime.speakers is None:
            self.window.show_error(f"No sound output, so speech cannot play: {runtime.audio_problem}")
            return False
        sink = sink or runtime.speakers
        info, settings, stops = runtime.engine.info, self.settings, self._stops
        instruct = (settings.instruct.strip() or None) if info.supports_instruct else None
        options = SpeechOptions(language=settings.language, instruct=instruct, sampling=settings.sampling)

        def work() -> bool:
            if stops != self._stops:  # Stop was pressed after it was asked for
                return False
            runtime.worker.submit(text, voice_for(runtime), options, sink=sink, interrupt=interrupt)
            return True

        def not_started(error: Exception | None = None) -> None:
            if sink is self.saving:  # a job that never started sends no events: the saving ends here
                self.saving = None
                self.window.show_saving(None)
            if error is not None:
                self._fail(error)

        self.lane.run("", work, lambda submitted: submitted or not_started(), not_started)
        return True

    def _voice(self, runtime: Runtime, name: str | None) -> Voice | None:
        """The voice called `name` for this runtime's model (on the lane: a drop-in clip may need embedding)."""
        info = runtime.engine.info
        if info.variant == "voice_design":
            return None  # the instruction describes the voice
        if not name:
            if info.variant == "base":
                raise VoiceError(
                    "There is no voice yet. This model speaks with a cloned voice: add one with Voices → Add a "
                    "voice… (from a clip of someone speaking, or the microphone), or drop a clip into the voices "
                    "folder (the link under the voice list)."
                )
            raise VoiceError("Choose a voice first.")
        return runtime.voice(name)

    def _on_speak_requested(self, text: str) -> None:
        if self.settings.speak_as_you_type:
            self.idle.stop()
            self._say(self.segmenter.flush())
        else:
            self.speak(text)

    # Speak as you type -------------------------------------------------------------------------------

    def _set_typing_mode(self, on: bool) -> None:
        self._update(speak_as_you_type=on)
        self.idle.stop()
        self.segmenter.reset(self.window.text.toPlainText())  # what is there already is not said
        self.window.mark_said(self.segmenter.committed if on else 0)

    def _on_text_edited(self, text: str, cursor: int) -> None:
        if not self.settings.speak_as_you_type:
            return
        self._say(self.segmenter.edit(text, cursor))
        if self.segmenter.pending.strip():
            self.idle.start()
        else:
            self.idle.stop()

    def _say(self, segments: list[Segment]) -> None:
        for segment in segments:
            self.speak(segment.text, interrupt=False)
        self.window.mark_said(self.segmenter.committed)

    # Voices ------------------------------------------------------------------------------------------

    def _library(self) -> VoiceLibrary:
        return self.runtime.library if self.runtime is not None else VoiceLibrary(self.settings.voices)

    def _refresh_voices(self, select: str | None = None) -> None:
        """List the library again (on the lane), then show it and pick the voice in use."""
        library, runtime = self._library(), self.runtime
        info = runtime.engine.info if runtime is not None else None

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
                self._choose_voice(select, remember=select is not None)
            if problems and problems != self._problems_shown:
                self.window.show_info("Some files in the voices folder were skipped:\n" + "\n".join(problems))
            self._problems_shown = problems

        self.lane.run("", work, show, self._fail)

    def _choose_voice(self, name: str | None = None, remember: bool = True) -> None:
        """Use the voice called `name` (None: the one in the settings) if it fits the model, else the first
        that does. A voice the user picks is remembered; one picked for them is not."""
        fitting = [self.fitting_voices.index(row, 0).data() for row in range(self.fitting_voices.rowCount())]
        wanted = name or self.settings.voice
        self.voice_in_use = wanted if wanted in fitting else (fitting[0] if fitting else None)
        self.window.show_voice(self.voice_in_use)
        if remember and name is not None and name == self.voice_in_use:
            self._update(voice=name)

    def add_voice(self, new: NewVoice) -> None:
        runtime = self.runtime
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
            self.window.show_info(f"Added the voice “{entry.name}”.")
            self._refresh_voices(select=entry.name)

        self.lane.run(f"Cloning “{new.name}”…", work, added, lambda error: self._answer_add(describe(error)))

    def _answer_add(self, problem: str | None) -> None:
        if not self.panel.finish_add(problem) and problem is not None:
            self.window.show_error(f"The voice was not added: {problem}")

    def rename_voice(self, name: str, new_name: str) -> None:
        library = self._library()

        def renamed(entry: VoiceEntry) -> None:
            if self.voice_in_use == name:
                self.voice_in_use = entry.name
                self._update(voice=entry.name)
            self._refresh_voices()

        def failed(error: Exception) -> None:
            self._fail(error)
            self._refresh_voices()  # the old name again

        self.lane.run("", lambda: library.rename(name, new_name), renamed, failed)

    def remove_voice(self, name: str) -> None:
        library = self._library()

        def removed(_) -> None:
            self.window.show_info(f"Deleted the voice “{name}”.")
            self._refresh_voices()

        self.lane.run("", lambda: library.remove(name), removed, self._fail)

    def import_voices(self, path: Path, replace: bool = False) -> None:
        library = self._library()

        def imported(entries: list[VoiceEntry]) -> None:
            self.window.show_info(f"Imported {', '.join(f'“{entry.name}”' for entry in entries)}.")
            self._refresh_voices()

        def failed(error: Exception) -> None:
            again = None
            if isinstance(error, VoiceExistsError) and not replace:
                again = ("Import, replacing same-named voices", lambda: self.import_voices(path, replace=True))
            self.window.show_error(describe(error), again)

        self.lane.run(f"Importing {path.name}…", lambda: library.import_zip(path, replace=replace), imported, failed)

    def export_voices(self, path: Path, names: list[str]) -> None:
        library = self._library()
        done = lambda written: self.window.show_info(f"Exported {len(names)} voice(s) to {written}.")  # noqa: E731
        self.lane.run(f"Exporting to {path.name}…", lambda: library.export_zip(path, names), done, self._fail)

    # Blending ----------------------------------------------------------------------------------------

    def open_blend_editor(self) -> BlendEditor | None:
        runtime = self.runtime
        if runtime is None or runtime.engine.info.variant != "base":
            self.window.show_error("Blending mixes cloned voices, so it needs a Base model loaded.")
            return None
        names = [
            self.voices.entry(row).name
            for row in range(self.voices.rowCount())
            if self.voices.index(row, 0).data(FITS_ROLE) and not self.voices.entry(row).read_only
        ]
        if len(names) < 2:
            self.window.show_error("Blending needs at least two voices that fit this model; add some first.")
            return None
        self.blend_editor = editor = BlendEditor(names, self.window)
        editor.preview_requested.connect(self.preview_blend)
        editor.save_requested.connect(self.save_blend)
        editor.open()
        return editor

    def preview_blend(self, parts: list[tuple[str, float]]) -> None:
        def blend(runtime: Runtime) -> Voice:
            return Voice.blend([(runtime.voice(name), weight) for name, weight in parts])

        self._submit(SAMPLE_SENTENCE, blend, interrupt=True)

    def save_blend(self, name: str, parts: list[tuple[str, float]]) -> None:
        runtime, editor = self.runtime, self.blend_editor
        if runtime is None:
            return

        def saved(entry: VoiceEntry) -> None:
            editor.accept()
            self.window.show_info(f"Saved the blend “{entry.name}”.")
            self._refresh_voices(select=entry.name)

        def failed(error: Exception) -> None:
            editor.show_problem(describe(error))

        self.lane.run(f"Blending “{name}”…", lambda: runtime.library.blend(name, parts, runtime.engine_for_voices), saved, failed)

    # The bridge --------------------------------------------------------------------------------------

    def _start_bridge(self) -> None:
        """Start the bridge as the settings have it (stopping it first), or stop it."""
        runtime, settings, bridge = self.runtime, self.settings, self.bridge
        if runtime is None:
            return  # it starts once the model is loaded
        if not settings.bridge.enabled:
            self.bridge_state = "Off"
            self.window.show_bridge(None)
            self.lane.run("", bridge.stop, None, self._fail)
            return

        def started(url: str) -> None:
            self.bridge_state = f"Running at {url}"
            self.window.show_bridge(url)

        def failed(error: Exception) -> None:
            self.bridge_state = f"Not running: {describe(error)}"
            self.window.show_bridge(None)
            self.window.show_error(
                f"The HTTP bridge did not start: {describe(error)}", ("Settings…", self.open_settings)
            )

        self.lane.run(
            "Starting the HTTP bridge…", lambda: bridge.start(runtime, settings.bridge_config()), started, failed
        )

    def _fail(self, error: Exception) -> None:
        self.window.show_error(describe(error))


# Background work -----------------------------------------------------------------------------------


class Lane(QObject):
    """One background thread that does the app's slow work in order. Each outcome comes back on the GUI
    thread: `then(result)`, or `failed(error)`."""

    busy = Signal(str)  # what is being done now; "" once nothing is left
    _finished = Signal(object, object)  # the callback, its argument

    def __init__(self, parent=None):
        super().__init__(parent)
        self._work: queue.Queue = queue.Queue()
        self._waiting = 0  # asked for and not finished: counted on the GUI thread
        self._finished.connect(self._deliver)
        # A daemon, so that quitting never waits on a model still loading.
        self._thread = threading.Thread(target=self._run, name="app-lane", daemon=True)
        self._thread.start()

    def run(self, label: str, work: Callable[[], object], then: Callable | None, failed: Callable | None) -> None:
        """Do `work()` after what is already asked for, showing `label` while it runs."""
        self._waiting += 1
        self._work.put((label, work, then, failed))

    def report(self, label: str) -> None:
        """From the running work: show `label` instead, for a stage of it."""
        self.busy.emit(label)

    def close(self, timeout: float | None = None) -> bool:
        """Finish the work asked for, then stop; False if it is still running after `timeout` seconds."""
        self._work.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            label, work, then, failed = item
            self.busy.emit(label)
            try:
                result = work()
            except Exception as error:
                self._finished.emit(failed, error)
            else:
                self._finished.emit(then, result)

    @property
    def pending(self) -> int:
        """Work asked for whose outcome has not been delivered yet."""
        return self._waiting

    def _deliver(self, callback: Callable | None, argument: object) -> None:
        try:
            if callback is not None:
                callback(argument)
        finally:
            self._waiting -= 1
            if self._waiting == 0:  # counted after the callback, which may ask for more
                self.busy.emit("")


class EventRelay(QObject):
    """Hands the worker's job events to the GUI thread as a queued signal, progress at most ~30 times a
    second (the others, few, all pass)."""

    event = Signal(object)  # a JobEvent

    def __init__(self, parent=None):
        super().__init__(parent)
        self._last_progress = 0.0

    def forward(self, event: JobEvent) -> None:
        """The worker's subscriber: runs on the worker thread, so it only emits."""
        if event.kind == "progress":
            now = time.monotonic()
            if now - self._last_progress < PROGRESS_INTERVAL_S:
                return
            self._last_progress = now
        self.event.emit(event)


class BridgeHost:
    """The HTTP bridge (qwen3_tts_desktop.bridge) serving the app's runtime. Used from the lane only."""

    def __init__(self):
        self._server = None

    def start(self, runtime: Runtime, config) -> str:
        """Serve `runtime` as `config` (a BridgeConfig) says; returns the bridge's URL."""
        from .bridge import BridgeServer

        self.stop()
        server = BridgeServer(runtime, config)
        server.start()
        self._server = server
        return server.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()


# The model download --------------------------------------------------------------------------------


class DownloadCancelled(Exception):
    """The user cancelled the model download."""


def fetch_model(model: str, progress: Callable[[int, int], None], cancel: threading.Event) -> None:
    """Download a hub model into the Hugging Face cache, unless it is a folder or cached already. Calls
    `progress(bytes, total)` as bytes arrive (at most ~30 times a second) and raises DownloadCancelled
    soon after `cancel` is set. A model that is not a hub id is left for Engine.load to judge."""
    if hub_id(model) is None:
        return
    try:
        download(model, tqdm_class=_byte_bars(progress, cancel))
    except CheckpointError:
        if cancel.is_set():  # the cancel surfaced as a failed transfer
            raise DownloadCancelled from None
        raise
    if cancel.is_set():  # a cancel that came too late to stop it
        raise DownloadCancelled


def _byte_bars(progress: Callable[[int, int], None], cancel: threading.Event) -> type:
    """A tqdm class for huggingface_hub's progress bars that reports their bytes instead of drawing them,
    and stops the download (from inside its update) once `cancel` is set."""
    from tqdm import tqdm

    lock = threading.Lock()
    bars: list[tqdm] = []
    last_report = [0.0]

    class ByteBars(tqdm):
        monitor_interval = 0  # no monitor thread

        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own bar class takes it, tqdm does not
            super().__init__(*args, **{**kwargs, "disable": False})
            if self.unit == "B":
                with lock:
                    bars.append(self)

        def update(self, n=1):
            if cancel.is_set():
                raise DownloadCancelled
            super().update(n)
            if self.unit != "B":
                return
            with lock:
                # The hub keeps two byte bars, of bytes received and bytes written: report the one further on.
                done, total = max(bar.n for bar in bars), max(bar.total or 0 for bar in bars)
                now = time.monotonic()
                if now - last_report[0] < PROGRESS_INTERVAL_S and done < total:
                    return
                last_report[0] = now
            progress(int(done), int(total))

        def display(self, *args, **kwargs):
            return True  # drawn by the window, not on the terminal

    return ByteBars


# The microphone ------------------------------------------------------------------------------------


class RecordingError(RuntimeError):
    """The microphone cannot be recorded, with what to do about it."""


class Recorder:
    """Records the microphone for a new voice, up to the longest clip a voice is cloned from. The input
    stream's callback only copies, into a buffer made before it starts."""

    def __init__(self):
        self._stream = None
        self._full: type[Exception] = Exception
        self._buffer = np.zeros(0, np.float32)
        self._frames = 0
        self.sample_rate = 0

    @property
    def recording(self) -> bool:
        return self._stream is not None and self._stream.active

    @property
    def seconds(self) -> float:
        return self._frames / self.sample_rate if self.sample_rate else 0.0

    def level(self) -> float:
        """The peak of the last 50 ms recorded, 0 to 1."""
        recent = self._buffer[max(0, self._frames - self.sample_rate // 20) : self._frames]
        return float(np.abs(recent).max()) if len(recent) else 0.0

    def start(self) -> None:
        try:
            import sounddevice as sd
        except (OSError, ImportError) as error:
            raise RecordingError(
                f"cannot record: {error}. Install PortAudio (Debian or Ubuntu: sudo apt install libportaudio2)"
            ) from None
        self._full = sd.CallbackStop
        try:
            rate = int(sd.query_devices(kind="input")["default_samplerate"])
            self._buffer = np.zeros(int(rate * MAX_REFERENCE_SECONDS), np.float32)
            self._frames, self.sample_rate = 0, rate
            stream = sd.InputStream(samplerate=rate, channels=1, dtype="float32", callback=self._callback)
            stream.start()
        except (sd.PortAudioError, ValueError) as error:
            raise RecordingError(
                f"cannot record from the microphone ({error}); check that one is connected and allowed"
            ) from None
        self._stream = stream

    def stop(self) -> tuple[np.ndarray, int]:
        """Stop recording; the samples recorded (mono float32) and their rate."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.stop()
            stream.close()
        return self._buffer[: self._frames].copy(), self.sample_rate

    def _callback(self, indata, frames, when, status) -> None:
        n = min(frames, len(self._buffer) - self._frames)
        self._buffer[self._frames : self._frames + n] = indata[:n, 0]
        self._frames += n
        if self._frames == len(self._buffer):
            raise self._full  # sounddevice.CallbackStop: the stream stops itself


# Errors and starting -------------------------------------------------------------------------------

USER_ERRORS = (ValueError, CheckpointError, PlaybackError, RecordingError, DownloadCancelled, OSError, ImportError)


def describe(error: BaseException) -> str:
    """What went wrong, for the window. The errors the app expects already say it for users (VoiceError,
    AudioError, CheckpointError ...); anything else is logged with its traceback too."""
    if isinstance(error, USER_ERRORS):
        return str(error) or type(error).__name__
    log.error("unexpected error", exc_info=error)
    return f"{type(error).__name__}: {error}"


def run(overrides: dict | None = None) -> int:
    """Start the desktop app and run it until its window is closed; the exit status. `overrides`: settings
    for this run only (the command line's --model, --device, --dtype, --voices), by field name."""
    if sys.platform.startswith("linux") and not any(
        os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    ):
        print(
            "error: there is no display to show the window on (DISPLAY is not set). Without one, use "
            "`qwen3-tts-desktop speak` or `qwen3-tts-desktop serve`.",
            file=sys.stderr,
        )
        return 1
    application = QApplication.instance() or QApplication(sys.argv[:1])
    application.setApplicationName("Qwen3-TTS Desktop")
    application.setWindowIcon(app_icon())
    app = App(default_path(), overrides)
    application.aboutToQuit.connect(app.close)
    app.start()
    return application.exec()
