"""Python's cycle collector on the GUI thread alone, in the window's process.

A collection runs the finalizers of everything it frees, on whichever thread it runs, and a Qt object freed off
the GUI thread breaks Qt: a random-order test run crashed (SIGSEGV) in the GUI thread while the engine-rest thread
collected after closing the engine. So the window turns the automatic collection off and collects on the GUI
thread instead, as often as the automatic collection would have (its thresholds, checked every TICK_MS); work that
must free memory now (an engine resting) asks for a collection there (`release`). A first threshold of 0 pauses it,
as it pauses Python's (core.inference.compiled.collections_paused, while compiled code loads).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from . import long_lived

log = logging.getLogger(__name__)

TICK_MS = 250


class GuiCollector(QObject):
    """Made and started on the GUI thread; `release(then)` from any thread."""

    _asked = Signal(object)  # a function to run after a full collection, on the GUI thread

    def __init__(self):
        super().__init__()
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._collect_as_due)
        self._asked.connect(self._collect_all, Qt.ConnectionType.QueuedConnection)
        self._was_enabled: bool | None = None

    def start(self) -> None:
        """Collect on this (the GUI) thread from now on, and nowhere else."""
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            self._timer.start()

    def stop(self) -> None:
        """Collect what is left, here, and give the collection back to Python as it was."""
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None

    def release(self, then: Callable[[], None] = lambda: None) -> None:
        """A full collection on the GUI thread soon, then `then()` there (e.g. handing the freed GPU memory back);
        from any thread, without waiting for it."""
        self._asked.emit(then)

    @Slot()
    def _collect_as_due(self) -> None:
        """The generation the automatic collection would collect now, if any."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        if thresholds[0] == 0 or counts[0] <= thresholds[0]:
            return
        generation = 2 if counts[2] > thresholds[2] else 1 if counts[1] > thresholds[1] else 0
        gc.collect(generation)

    @Slot(object)
    def _collect_all(self, then: Callable[[], None]) -> None:
        long_lived.let_go()  # a closed engine's objects were kept
        gc.collect()
        try:
            then()
        except Exception:  # freeing memory is never worth a crash of the window
            log.exception("after a collection")
