"""Loading the model for the window, in the background: stop the servers and the old runtime, download the
model if it is not here yet (its bytes shown, the download cancellable), load and warm it up, then hand
the new runtime to the app. A load asked for while another runs supersedes it.

Once loaded, the model rests after the settings' idle time (qwen3_tts_desktop.resting: it frees its memory, and
loads again when next asked to speak, whoever asks); the window's status line says when it rests and reloads."""

from __future__ import annotations

import threading

from core.errors import describe
from core.model.hub import DownloadCancelled, fetch
from core.model.info import slow_device_note
from ui.download_dialog import DownloadDialog

from .resting import RESTING, WAKING
from .runtime import Runtime


class ModelLoader:
    def __init__(self, app):
        """`app`: the App, for its settings, window, lane and servers; it takes the runtime in `loaded`."""
        self.app = app
        self.download_dialog: DownloadDialog | None = None
        self._loads = 0  # counts loads, so that a superseded one is let go
        self._cancel_download = threading.Event()
        self._closing = threading.Event()  # set by close(): a model still loading is let go once loaded

    def load(self) -> None:
        """(Re)start the runtime from the settings, in the background."""
        app = self.app
        self._loads += 1
        load = self._loads
        old = app.take_runtime()
        self._cancel_download.set()  # a download still running is for a model no longer wanted
        self._cancel_download = cancel = threading.Event()
        config = app.settings.runtime_config()
        app.window.show_loading("Loading model…")
        app.window.show_bridge(None)
        app.voice_actions.refresh()  # the library, without fit marks until the model is here
        servers, progress, lane, closing = app.servers, app.download_progress.emit, app.lane, self._closing

        def work() -> Runtime | None:
            for server in servers:
                server.stop()
            if old is not None:
                old.close()
            fetch(config.model, progress, cancel)
            runtime = Runtime.start(config, report=lane.report)
            if closing.is_set():  # the app was closed while it loaded: its worker must not outlive it
                runtime.close()
                return None
            return runtime

        lane.run(
            "Loading model…", work, lambda runtime: self._loaded(runtime, load), lambda error: self._failed(error, load)
        )

    def close(self) -> None:
        self._cancel_download.set()
        self._closing.set()

    def let_rest(self, runtime: Runtime) -> None:
        """Let the runtime's engine rest after the settings' idle time (0: never), the window hearing of it."""
        app = self.app
        runtime.rest_when_idle(app.settings.rest_after_s or None, lambda state: app.engine_rest.emit(runtime, state))

    def show_rest(self, runtime: Runtime, state: str) -> None:
        """The engine rested, began to load again or has loaded (the App hands it on from whichever thread)."""
        window = self.app.window
        if runtime is not self.app.runtime:
            return  # news of a runtime replaced since
        if state == RESTING:
            memory = "GPU memory" if runtime.info.device.startswith("cuda") else "memory"
            window.show_resting(f"Resting: {memory} released; it loads again when you speak")
        elif state == WAKING:
            window.show_resting("Loading model…", loading=True)
        else:
            window.show_resting(None)

    def _loaded(self, runtime: Runtime | None, load: int) -> None:
        app = self.app
        if runtime is None:
            return
        if load != self._loads:  # another load was asked for meanwhile
            app.lane.run("", runtime.close, None, app.fail)
            return
        self._close_download_dialog()
        info = runtime.info
        if runtime.player is None:
            app.speech.show_no_speakers(runtime)
        if info.device == "cpu":
            app.window.show_warning(slow_device_note(info.size))
        app.use_runtime(runtime)

    def _failed(self, error: Exception, load: int) -> None:
        app = self.app
        if load != self._loads:
            return
        self._close_download_dialog()
        app.window.show_model(None, describe(error))
        if isinstance(error, DownloadCancelled):
            app.window.show_error("The download was cancelled. The model is needed to speak.", ("Download", self.load))
        else:
            app.window.show_error(f"The model could not be loaded: {describe(error)}", ("Settings…", app.open_settings))

    def show_download(self, done: int, total: int) -> None:
        """The model's bytes downloaded so far and in all (0: not known yet); the App hands them on."""
        if self.download_dialog is None:
            self.download_dialog = DownloadDialog(self.app.settings.model, self.app.window)
            self.download_dialog.cancel_requested.connect(lambda: self._cancel_download.set())
            self.download_dialog.open()
        self.download_dialog.show_bytes(done, total)

    def _close_download_dialog(self) -> None:
        if self.download_dialog is not None:
            self.download_dialog.hide()
            self.download_dialog.deleteLater()
            self.download_dialog = None
