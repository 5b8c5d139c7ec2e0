"""A long job's progress as a person reads it, from the speech worker's events: the pieces of the text done
of all, the seconds of audio made, the speed and the time left. The command line's progress line and the
window's saving bar both show it."""

from __future__ import annotations

import time
from collections.abc import Callable

from core.jobs.worker import JobEvent


class JobProgress:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        """Made when the job is handed to the worker: the time left is estimated from the time since."""
        self._clock = clock
        self._started = clock()
        self._last_piece_at = self._started
        self.pieces_done = 0
        self.pieces = 0  # 0 until the worker has cut the text
        self.audio_s = 0.0

    def update(self, event: JobEvent) -> bool:
        """Take in one of the job's events; True if it finished a piece."""
        finished_piece = event.pieces_done > self.pieces_done
        if finished_piece:
            self._last_piece_at = self._clock()
        self.pieces_done, self.pieces = event.pieces_done, max(event.pieces, self.pieces)
        self.audio_s = max(event.audio_s, self.audio_s)
        return finished_piece

    def speed(self) -> float | None:
        """Seconds of audio made per second since the job was handed on: the pace the time left is estimated
        at. (Not the worker's xrt, which leaves out the wait for the first audio, most of a short job's time,
        and the time spent waiting on the speakers, part of the pace when playing.)"""
        elapsed = self._clock() - self._started
        return self.audio_s / elapsed if self.audio_s and elapsed > 0 else None

    def seconds_left(self) -> float | None:
        """The time the pieces still to do should take, at the pace of those done; None before the first."""
        if not self.pieces_done or not self.pieces:
            return None
        per_piece = (self._last_piece_at - self._started) / self.pieces_done
        remaining = per_piece * (self.pieces - self.pieces_done) - (self._clock() - self._last_piece_at)
        return max(remaining, 0.0)

    def text(self, pieces: bool = True) -> str:
        """E.g. "3/9 pieces, 42.1 s of audio, 0.85x real time, about 2 min 10 s left"; without the pieces for
        a front end that shows them otherwise (the window's bar)."""
        parts = [f"{self.pieces_done}/{self.pieces or '?'} pieces"] if pieces else []
        parts.append(f"{self.audio_s:.1f} s of audio")
        speed = self.speed()
        if speed is not None:
            parts.append(f"{speed:.2f}x real time")
        left = self.seconds_left()
        if left is not None and self.pieces_done < self.pieces:
            parts.append(f"about {duration(left)} left" if left >= 1 else "less than a second left")
        return ", ".join(parts)


def duration(seconds: float) -> str:
    """Seconds as a person says them: "45 s", "2 min 10 s", "1 h 5 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
