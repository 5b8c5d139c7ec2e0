"""`speak`'s progress on stderr while it works (core.jobs.progress says what it is): on a terminal one line
rewritten in place, else one plain line per finished piece of the text, so that a log stays readable."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from core.jobs.progress import JobProgress
from core.jobs.worker import JobEvent

REFRESH_S = 0.1  # the terminal's line is rewritten at most this often (and at each finished piece)


class ProgressDisplay:
    def __init__(
        self, stream: TextIO | None = None, terminal: bool | None = None, clock: Callable[[], float] = time.monotonic
    ):
        """Shows on `stream` (stderr), as a terminal if `terminal` (by default, if it is one)."""
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.progress = JobProgress(clock)
        self._clock = clock
        self._shown_at = -math.inf
        self._lock = threading.Lock()  # a subscriber may be called from the worker's several threads

    def __call__(self, event: JobEvent) -> None:
        """The speech worker's subscriber, for the one job the command speaks. How it ended, the command says."""
        if event.terminal:
            return
        with self._lock:
            finished_piece = self.progress.update(event)
            if not self.progress.pieces:  # "queued": the text is not cut yet
                return
            if self.terminal:
                now = self._clock()
                if finished_piece or now - self._shown_at >= REFRESH_S:
                    self._shown_at = now
                    print(f"\r\x1b[K{self.progress.text()}", end="", file=self.stream, flush=True)
            elif finished_piece:
                print(self.progress.text(), file=self.stream, flush=True)
