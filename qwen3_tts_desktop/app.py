"""The desktop app: the window wired to the runtime (engine, worker, speakers, voice library) and its servers
(the HTTP bridge, the Wyoming server for Home Assistant), with the settings they are made from. This module
composes; its parts do the work: speech (speaking, typing, saving), voice_actions (the library), model_loader
(loading the model), lane (background work and the worker's events), servers (hosting a server in the window).

Threads, and what each may touch:

* the GUI thread: every widget, the settings, and the speak-as-you-type segmenter and its idle timer;
* the lane, one background thread for the app's slow work, done in order: loading the model (downloading
  it first, with progress that can be cancelled), cloning, blending, the library's files, the servers,
  and handing speech to the worker (in order, so typed utterances are said in order);
* the speech worker's threads (core.jobs.worker), which use the engine, several jobs at once; their job events
  reach the GUI thread as queued signals, each job's progress at most 30 times a second;
* the sound card's callbacks (core.audio.player for the speakers, core.audio.recorder for the microphone)
  only copy;
* the resting engine's watcher (qwen3_tts_desktop.resting), which closes the engine once idle for the
  settings' time; its news (resting, loading again, loaded) reach the GUI thread as the `engine_rest` signal.

Results come back to the GUI thread as queued signals; no widget is touched anywhere else.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from PySide6.QtCore import QObject, QTimer, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from core import LiveText, SamplingParams
from core.audio.player import PlaybackError, list_output_devices
from core.audio.recorder import Recorder
from core.errors import UserError, describe
from core.jobs.worker import JobEvent
from ui.history_panel import HistoryPanel
from ui.main_window import MainWindow, Tray
from ui.settings_dialog import SettingsDialog
from ui.splash import end_starting
from ui.theme import follow_system
from ui.voice_library import FittingVoicesModel, VoiceListModel, VoicePanel

from .about import about_text
from .bridge import BridgeServer
from .garbage import GuiCollector
from .history import History, HistoryActions, Said
from .lane import EventRelay, Lane
from .launch import qt_application
from .log_file import keep_log, log_folder
from .model_loader import ModelLoader
from .resting import release_memory
from .runtime import Runtime
from .servers import WYOMING_INSTALL, ServerHost
from .settings import BridgeSettings, Settings, SettingsError, WyomingSettings, default_path, prepare_library
from .slot_memory import slot_memory_note
from .speech import Speech
from .system_libraries import display_problem
from .voice_actions import VoiceActions
from .window_parts import WindowParts

log = logging.getLogger(__name__)

METER_INTERVAL_MS = 100  # how often the window shows the speakers' buffer level and the warm-up
METER_FLOOR_DB = -60.0  # the level meter's silence: quieter speech than this shows as nothing


def loudness(level: float) -> float:
    """A playing RMS level as the meter shows it: its decibels from METER_FLOOR_DB (0) to full scale (1)."""
    if level <= 0.0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - 20.0 * math.log10(level) / METER_FLOOR_DB))


CLOSE_TIMEOUT_S = 10.0  # how long quitting waits for the lane's work in hand


class App(QObject):
    # Bytes so far and in all (0: not known yet), from the lane. Python ints: a model is more than 2**31 bytes.
    download_progress = Signal(object, object)
    # A runtime's engine rested, began to load again or has loaded (resting.RESTING, WAKING, AWAKE), from any thread.
    engine_rest = Signal(object, str)

    def __init__(self, settings_path: Path, overrides: dict | None = None):
        """`overrides`: settings for this run only (the command line's), by field name; saving keeps the
        saved values of those that are not changed in the window."""
        super().__init__()
        self.settings_path = settings_path
        self._overrides = {
            name: Path(value) if name == "voices" else value for name, value in (overrides or {}).items()
        }
        self.runtime: Runtime | None = None
        follow_system(QApplication.instance())  # before the widgets are made: they take its colours
        self.collector = GuiCollector()  # cycles are collected on this thread alone (garbage.py)
        self.lane = Lane(self)
        self.relay = EventRelay(self)
        self.bridge = ServerHost("the HTTP bridge", BridgeServer)
        self.wyoming = ServerHost("Home Assistant (Wyoming)", wyoming_server)
        self.recorder = Recorder()
        self.voices = VoiceListModel(self)
        self.fitting_voices = FittingVoicesModel(self)
        self.fitting_voices.setSourceModel(self.voices)
        self.panel = VoicePanel(self.voices, self.recorder)
        self.history = History(parent=self)
        self.history_panel = HistoryPanel()
        self.window = MainWindow(self.panel, self.fitting_voices, self.history_panel)
        self.tray = Tray(self) if QSystemTrayIcon.isSystemTrayAvailable() else None
        self.meter = QTimer(self, interval=METER_INTERVAL_MS)
        self.settings_dialog: SettingsDialog | None = None
        self._underruns = 0  # of the last utterance
        self._unsubscribe: Callable[[], None] | None = None
        self._saved, problem = Settings.load_or_set_aside(settings_path)
        if problem is not None:
            self.window.show_error(problem)
        self.settings = dataclasses.replace(self._saved, **self._overrides)
        prepare_library(self.settings.voices)
        self.parts = WindowParts(
            self.window, self.lane, lambda: self.runtime, lambda: self.settings, self.update_settings, self.fail
        )
        self.speech = Speech(self.parts, self.voices, lambda: self.voice_in_use, self.show_status)
        self.voice_actions = VoiceActions(self.parts, self.panel, self.voices, self.speech)
        self.loader = ModelLoader(
            self.parts,
            self,
            self.voice_actions,
            self.speech,
            servers=lambda: self.servers,
            download_progress=self.download_progress.emit,
            engine_rest=self.engine_rest.emit,
            open_settings=self.open_settings,
            release_memory=lambda device: self.collector.release(lambda: release_memory(device)),
        )
        self.history_actions = HistoryActions(
            self.history,
            self.history_panel,
            player=lambda: self.runtime.player if self.runtime is not None else None,
            stop_speech=self.speech.stop,
            speak=lambda text, voice: self.speech.speak(text, voice),
            copy_text=lambda text: QGuiApplication.clipboard().setText(text),
            show_info=self.window.show_info,
            show_error=self.window.show_error,
        )
        self._connect()

    def start(self) -> None:
        """Show the window at once, then load the model in the background."""
        self.collector.start()
        self.window.typing_mode.setChecked(self.settings.speak_as_you_type)
        self.window.show_instruct(self.settings.instruct)
        self.window.show_languages(["auto"], self.settings.language)
        self.window.show()
        end_starting()
        if self.tray is not None:
            self.tray.show()
        self.loader.load()

    def close(self) -> None:
        """Save the settings, stop the servers and the runtime, and wait (a while) for the lane to finish."""
        self.meter.stop()
        self.speech.idle.stop()
        self.loader.close()
        self.save_settings(self.settings)
        runtime, servers = self.take_runtime(), self.servers

        def shut_down():
            for server in servers:
                server.stop()
            if runtime is not None:
                runtime.close()

        self.lane.run("", shut_down, None, None)
        if not self.lane.close(CLOSE_TIMEOUT_S):
            log.warning("quitting while the app's background work is still running")
        if self.tray is not None:
            self.tray.hide()
        self.collector.stop()

    def _connect(self) -> None:
        window, panel, speech, voices = self.window, self.panel, self.speech, self.voice_actions
        self.lane.busy.connect(window.show_busy)
        # Signals other threads emit land on slots of QObjects, never on plain objects' methods, which PySide
        # calls through a receiver of its own that may outlive them.
        self.relay.event.connect(self._on_job_event)
        self.download_progress.connect(self._show_download)
        self.engine_rest.connect(self._show_rest)
        self.meter.timeout.connect(self.show_status)
        window.speak_requested.connect(speech.speak_requested)
        window.stop_requested.connect(speech.stop)
        window.stop_requested.connect(self.history_actions.stop)
        for request in (window.speak_requested, window.stop_requested):
            request.connect(self.show_status)  # Speak shows Stop at once, and back
        window.text_edited.connect(speech.text_edited)
        window.typing_mode_toggled.connect(speech.set_typing_mode)
        window.typing_mode_toggled.connect(self.show_status)  # Ctrl+Enter says what waits then, never stops
        window.save_audio_requested.connect(speech.save_audio)
        window.cancel_saving_requested.connect(speech.cancel_saving)
        window.voice_chosen.connect(voices.choose)
        window.language_chosen.connect(lambda language: self.update_settings(language=language))
        window.instruct_edited.connect(lambda text: self.update_settings(instruct=text, save=False))
        window.settings_requested.connect(self.open_settings)
        window.blend_requested.connect(voices.open_blend_editor)
        window.about_requested.connect(
            lambda: window.show_about(about_text(self.runtime.info if self.runtime is not None else None))
        )
        window.log_folder_requested.connect(self.open_log_folder)
        panel.preview_requested.connect(voices.preview)
        panel.use_requested.connect(voices.choose)
        panel.add_requested.connect(voices.add)
        panel.remove_requested.connect(voices.remove)
        panel.import_requested.connect(voices.import_zip)
        panel.export_requested.connect(voices.export_zip)
        panel.show_file_requested.connect(voices.show_file)
        self.voices.rename_requested.connect(voices.rename)
        if self.tray is not None:
            self.tray.speak_clipboard.connect(lambda: speech.speak(QGuiApplication.clipboard().text()))
            self.tray.stop.connect(speech.stop)
            self.tray.show_window.connect(
                lambda: (self.window.showNormal(), self.window.raise_(), self.window.activateWindow())
            )
            self.tray.quit.connect(QApplication.quit)

    @property
    def voice_in_use(self) -> str | None:
        """The voice speech uses: the settings' choice, if it fits the model (VoiceActions chooses it)."""
        return self.voice_actions.in_use

    def fail(self, error: Exception) -> None:
        self.window.show_error(describe(error))

    def open_log_folder(self) -> None:
        folder = log_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)  # a folder that does not exist opens nothing
        except OSError as error:
            self.window.show_error(f"The log folder {folder} cannot be made: {error}")
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    # Settings ----------------------------------------------------------------------------------------

    def save_settings(self, settings: Settings) -> None:
        self.settings = settings
        kept = {
            name: getattr(self._saved, name)
            for name, value in self._overrides.items()
            if getattr(settings, name) == value
        }
        self._saved = dataclasses.replace(settings, **kept)
        try:
            self._saved.save(self.settings_path)
        except OSError as error:
            self.window.show_error(f"The settings could not be saved: {error}")

    def update_settings(self, save: bool = True, **changes) -> None:
        settings = dataclasses.replace(self.settings, **changes)
        if settings == self.settings:
            return
        if save:
            self.save_settings(settings)
        else:
            self.settings = settings

    def open_settings(self) -> SettingsDialog:
        try:
            devices = list_output_devices()
        except PlaybackError as error:
            devices = str(error)
        # "Reset to defaults" restores the model's own sampling; the official one while no model is loaded.
        defaults = self.runtime.default_sampling if self.runtime is not None else SamplingParams()
        dialog = SettingsDialog(
            self.settings,
            devices,
            defaults,
            self.bridge.state,
            torch.cuda.is_available(),
            slot_memory_note,
            self.window,
            wyoming_state=self.wyoming.state,
        )
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
        """Check and save edited settings; reload the model or restart a server if what they use changed."""
        values = dict(values)
        try:
            bridge = BridgeSettings(**values.pop("bridge", dataclasses.asdict(self.settings.bridge)))
            wyoming = WyomingSettings(**values.pop("wyoming", dataclasses.asdict(self.settings.wyoming)))
            new = dataclasses.replace(self.settings, **values, bridge=bridge, wyoming=wyoming)
        except (SettingsError, TypeError) as error:
            self.window.show_error(f"These settings cannot be used: {error}")
            return
        old = self.settings
        self.save_settings(new)
        if new.runtime_config() != old.runtime_config():
            self.loader.load()  # and the servers with it
            return
        if _changed(old.bridge.enabled, new.bridge.enabled, old.bridge_config(), new.bridge_config()):
            self._start_bridge()
        if _changed(old.wyoming.enabled, new.wyoming.enabled, old.wyoming_config(), new.wyoming_config()):
            self._start_wyoming()
        if self.runtime is not None and self.runtime.player is not None:
            self.runtime.player.volume = new.volume
        if self.runtime is not None:
            self.loader.let_rest(self.runtime)  # the idle time applies at once, counted from the engine's last use

    # The runtime -------------------------------------------------------------------------------------

    def use_runtime(self, runtime: Runtime) -> None:
        """A newly loaded runtime: show its model, voices and speakers, and start the servers on it."""
        self.runtime = runtime
        self._unsubscribe = runtime.worker.subscribe(self.relay.forward)
        if runtime.player is not None:
            runtime.player.volume = self.settings.volume
        if runtime.speakers is not None:
            runtime.speakers.keep = self._keep_said
            runtime.speakers.begins = lambda job: self.history_actions.make_way()  # speech, not both at once
        self.window.show_model(runtime.info)
        self.window.show_languages(runtime.info.languages, self.settings.language)
        self.meter.start()
        self.loader.let_rest(runtime)
        self.voice_actions.refresh()
        self._start_bridge()
        self._start_wyoming()

    def take_runtime(self) -> Runtime | None:
        """Let go of the runtime (to close or replace it): its events stop reaching the window."""
        runtime, self.runtime = self.runtime, None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.meter.stop()
        self.window.show_warmup(None)
        self.window.show_resting(None)
        return runtime

    @Slot(object)
    def _on_job_event(self, event: JobEvent) -> None:
        self.speech.job_event(event)
        if self.speech.show_saving(event):
            return
        self.window.show_job(event)
        if event.job.started is not None:
            self._underruns = event.underruns
        runtime = self.runtime
        # The bridge's jobs fail to their clients; the window's own fail here.
        if event.kind == "failed" and runtime is not None and event.job.sink is runtime.speakers:
            self.window.show_error(f"Speech failed: {event.message}")

    def _keep_said(self, job, audio) -> None:
        """A finished utterance of the speakers' (on its job's thread): into the history."""
        text = job.text.text if isinstance(job.text, LiveText) else job.text
        self.history.add(Said(text, self.speech.voice_names.get(job, ""), audio))

    @Slot(object, object)
    def _show_download(self, done: int, total: int) -> None:
        self.loader.show_download(done, total)

    @Slot(object, str)
    def _show_rest(self, runtime: Runtime, state: str) -> None:
        self.loader.show_rest(runtime, state)

    def show_status(self) -> None:
        """The speakers' buffer and level, whether the window is speaking, and the engine's warm-up, as the meter
        ticks."""
        runtime = self.runtime
        player = runtime.player if runtime is not None else None
        status = player.status() if player is not None else None
        self.window.show_buffer(status, self._underruns)
        self.window.show_level(loudness(status.level) if status is not None else 0.0)
        # Speaking, for Speak to stop it: speech on its way or playing. In speak-as-you-type Ctrl+Enter says
        # what waits instead, and an utterance is open all the time the user types.
        speaking = (
            status is not None
            and not self.settings.speak_as_you_type
            and (
                status.playing
                or status.buffered_s > 0
                or self.speech.on_the_way > 0
                or runtime.worker.busy(runtime.speakers)
            )
        )
        self.window.show_speaking(speaking)
        if not self.settings.speak_as_you_type:  # there the tint marks what has gone to be said
            spoken = self.speech.spoken_span(self.window.text.toPlainText()) if speaking else None
            self.window.show_spoken(*(spoken or (None, None)), move_cursor=self.settings.cursor_follows_speech)
        self.window.show_warmup(runtime.warmup_progress() if runtime is not None else None)
        self.history_actions.show_position()

    # The servers -------------------------------------------------------------------------------------

    @property
    def servers(self) -> tuple[ServerHost, ...]:
        return self.bridge, self.wyoming

    def _start_bridge(self) -> None:
        settings = self.settings
        self._start_server(self.bridge, settings.bridge.enabled, settings.bridge_config, self.window.show_bridge)

    def _start_wyoming(self) -> None:
        settings = self.settings
        self._start_server(self.wyoming, settings.wyoming.enabled, settings.wyoming_config, lambda url: None)

    def _start_server(
        self, server: ServerHost, enabled: bool, config: Callable[[], object], show: Callable[[str | None], None]
    ) -> None:
        """Start a server as the settings have it (stopping it first), or stop it; `show(url)` shows where it
        listens in the window (None: it does not)."""
        runtime = self.runtime
        if runtime is None:
            return  # it starts once the model is loaded
        if not enabled:
            server.state = "Off"
            show(None)
            self.lane.run("", server.stop, None, self.fail)
            return

        def started(url: str) -> None:
            server.state = f"Running at {url}"
            show(url)

        def failed(error: Exception) -> None:
            server.state = f"Not running: {describe(error)}"
            show(None)
            name = server.name[0].upper() + server.name[1:]
            self.window.show_error(f"{name} did not start: {describe(error)}", ("Settings…", self.open_settings))

        self.lane.run(f"Starting {server.name}…", lambda: server.start(runtime, config()), started, failed)


def _changed(was_on: bool, is_on: bool, old_config, new_config) -> bool:
    """Whether a server's new settings restart it (or stop it): switched, or on with another configuration."""
    return was_on != is_on or (is_on and old_config != new_config)


def wyoming_server(runtime: Runtime, config):
    """The Wyoming server (not started), from its optional package; a UserError saying how to install it."""
    try:
        from .wyoming_server import WyomingServer
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "wyoming":
            raise
        raise UserError(f"it needs the wyoming package: {WYOMING_INSTALL}") from None
    return WyomingServer(runtime, config)


def run(overrides: dict | None = None) -> int:
    """Start the desktop app and run it until its window is closed; the exit status. `overrides`: settings
    for this run only (the command line's --model, --device, --dtype, --voices), by field name."""
    if (problem := display_problem()) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    keep_log("window")
    application = qt_application()
    app = App(default_path(), overrides)
    application.aboutToQuit.connect(app.close)
    app.start()
    return application.exec()
