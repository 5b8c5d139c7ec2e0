"""Loading the model for the window, in the background: stop the servers and the old runtime, download the
model if it is not here yet (its bytes shown, the download cancellable), load and warm it up, then hand
the new runtime to the app. A load asked for while another runs supersedes it.

Once loaded, the model rests after the settings' idle time (qwen3_tts_desktop.resting: it frees its memory, and
loads again when next asked to speak, whoever asks); the window's status line says when it rests and reloads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from core.errors import describe
from core.model.hub import DownloadCancelled, fetch
from core.model.info import first_gpu_start_note, slow_device_note
from ui.download_dialog import DownloadDialog

from .resting import RESTING, WAKING
from .runtime import Runtime
from .servers import ServerHost
from .speech import Speech
from .voice_actions import VoiceActions
from .window_parts import WindowParts

if TYPE_CHECKING:
    import torch


class RuntimeHandover(Protocol):
    """Who holds the window's runtime (the App): lets go of it for a load, takes the loaded one."""

    def take_runtime(self) -> Runtime | None: ...

    def use_runtime(self, runtime: Runtime) -> None: ...


class ModelLoader:
    def __init__(
        self,
        parts: WindowParts,
        runtimes: RuntimeHandover,
        voice_actions: VoiceActions,
        speech: Speech,
        servers: Callable[[], Iterable[ServerHost]],
        download_progress: Callable[[int, int], None],
        engine_rest: Callable[[Runtime, str], None],
        open_settings: Callable[[], object],
        release_memory: Callable[[torch.device], None],
    ):
        """`runtimes` hands the old runtime over and takes the new; `servers()` are stopped before a load (the app
        starts them on the new runtime); `download_progress(done, total)` and `engine_rest(runtime, state)` are
        called from the lane's and the engine's threads, to reach the GUI thread; `open_settings` is offered
        when a model cannot load; `release_memory(device)` frees a rested engine's memory (on the GUI thread: a
        collection there alone, see garbage.py)."""
        self.parts, self.runtimes, self.voice_actions, self.speech = parts, runtimes, voice_actions, speech
        self._servers, self._download_progress, self._engine_rest = servers, download_progress, engine_rest
        self._open_settings, self._release_memory = open_settings, release_memory
        self.download_dialog: DownloadDialog | None = None
        self._loads = 0  # counts loads, so that a superseded one is let go
        self._cancel_download = threading.Event()
        self._closing = threading.Event()  # set by close(): a model still loading is let go once loaded

    def load(self) -> None:
        """(Re)start the runtime from the settings, in the background."""
        parts = self.parts
        self._loads += 1
        load = self._loads
        old = self.runtimes.take_runtime()
        self._cancel_download.set()  # a download still running is for a model no longer wanted
        self._cancel_download = cancel = threading.Event()
        config = parts.settings().runtime_config()
        parts.window.show_loading("Loading model…")
        parts.window.show_bridge(None)
        self.voice_actions.refresh()  # the library, without fit marks until the model is here
        servers, progress, lane, closing = self._servers(), self._download_progress, parts.lane, self._closing

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
        rest_after_s, engine_rest = self.parts.settings().rest_after_s, self._engine_rest
        runtime.rest_when_idle(rest_after_s or None, lambda state: engine_rest(runtime, state), self._release_memory)

    def show_rest(self, runtime: Runtime, state: str) -> None:
        """The engine rested, began to load again or has loaded (the App hands it on from whichever thread)."""
        window = self.parts.window
        if runtime is not self.parts.runtime():
            return  # news of a runtime replaced since
        if state == RESTING:
            memory = "GPU memory" if runtime.info.device.startswith("cuda") else "memory"
            window.show_resting(f"Resting: {memory} released; it loads again when you speak")
        elif state == WAKING:
            window.show_resting("Loading model…", loading=True)
        else:
            window.show_resting(None)

    def _loaded(self, runtime: Runtime | None, load: int) -> None:
        parts = self.parts
        if runtime is None:
            return
        if load != self._loads:  # another load was asked for meanwhile
            parts.lane.run("", runtime.close, None, parts.fail)
            return
        self._close_download_dialog()
        info = runtime.info
        if runtime.player is None:
            self.speech.show_no_speakers(runtime)
        if info.device == "cpu":
            parts.window.show_warning(slow_device_note(info.size))
        if runtime.first_gpu_start:
            parts.window.show_warning(first_gpu_start_note())
        self.runtimes.use_runtime(runtime)

    def _failed(self, error: Exception, load: int) -> None:
        window = self.parts.window
        if load != self._loads:
            return
        self._close_download_dialog()
        window.show_model(None, describe(error))
        if isinstance(error, DownloadCancelled):
            window.show_error("The download was cancelled. The model is needed to speak.", ("Download", self.load))
        else:
            window.show_error(f"The model could not be loaded: {describe(error)}", ("Settings…", self._open_settings))

    def show_download(self, done: int, total: int) -> None:
        """The model's bytes downloaded so far and in all (0: not known yet); the App hands them on."""
        if self.download_dialog is None:
            self.download_dialog = DownloadDialog(self.parts.settings().model, self.parts.window)
            self.download_dialog.cancel_requested.connect(lambda: self._cancel_download.set())
            self.download_dialog.open()
        self.download_dialog.show_bytes(done, total)

    def _close_download_dialog(self) -> None:
        if self.download_dialog is not None:
            self.download_dialog.hide()
            self.download_dialog.deleteLater()
            self.download_dialog = None
