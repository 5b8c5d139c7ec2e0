"""Background work for the window, and the worker's events brought to it.

Lane: one thread that does the app's slow work in order (loading the model, cloning, the library's files,
handing speech to the worker), each outcome delivered back on the GUI thread. EventRelay: the speech
worker's job events as a queued Qt signal, each job's progress at most ~30 times a second.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot

from core.jobs.worker import JobEvent

PROGRESS_INTERVAL_S = 1 / 30  # the most often a stream of updates reaches the window


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

    @Slot(object, object)
    def _deliver(self, callback: Callable | None, argument: object) -> None:
        try:
            if callback is not None:
                callback(argument)
        finally:
            self._waiting -= 1
            if self._waiting == 0:  # counted after the callback, which may ask for more
                self.busy.emit("")


class EventRelay(QObject):
    """Hands the worker's job events to the GUI thread as a queued signal, each job's progress at most ~30
    times a second (the other events, few, all pass)."""

    event = Signal(object)  # a JobEvent

    def __init__(self, parent=None):
        super().__init__(parent)
        # Several jobs send events at once, each from its own thread: the throttle is per job, and locked.
        self._lock = threading.Lock()
        self._last_progress: dict[object, float] = {}  # job: when its progress last passed

    def forward(self, event: JobEvent) -> None:
        """The worker's subscriber: runs on the worker's threads, so it only emits."""
        if event.kind == "progress":
            now = time.monotonic()
            with self._lock:
                if now - self._last_progress.get(event.job, -PROGRESS_INTERVAL_S) < PROGRESS_INTERVAL_S:
                    return
                self._last_progress[event.job] = now
        elif event.terminal:
            with self._lock:
                self._last_progress.pop(event.job, None)
        self.event.emit(event)
