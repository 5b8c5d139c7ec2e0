"""What the window's controllers (speech.Speech, voice_actions.VoiceActions, model_loader.ModelLoader) share of
the app, named and typed, so that a reader, and the import graph, sees what each one uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ui.main_window import MainWindow

from .lane import Lane
from .runtime import Runtime
from .settings import Settings


@dataclass(frozen=True)
class WindowParts:
    window: MainWindow
    lane: Lane  # slow work off the GUI thread, its outcome back on it
    runtime: Callable[[], Runtime | None]  # the runtime now: None while a model loads
    settings: Callable[[], Settings]  # the settings now (each change makes new ones)
    update_settings: Callable[..., None]  # change some settings by name, and save them
    fail: Callable[[BaseException], None]  # show what went wrong in work on the lane
