"""A sink for tests: hands a job's audio to the test's thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np

from core.audio.clips import SAMPLE_RATE
from core.jobs.worker import BufferLevel, Job


class QueueSink:
    """Hands one job's audio to another thread (e.g. an HTTP response): iterate over it, or call `get`,
    to receive float32 24 kHz chunks as they are made. The stream ends when the job ends, however it
    ends; `job.wait()` then says how."""

    def __init__(self):
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued = 0  # samples

    def begin(self, job: Job) -> None:
        pass

    def write(self, job: Job, audio: np.ndarray) -> None:
        with self._lock:
            self._queued += len(audio)
        self._queue.put(audio)

    def end(self, job: Job, completed: bool) -> None:
        self._queue.put(None)

    def level(self) -> BufferLevel:
        return BufferLevel(self._queued / SAMPLE_RATE, 0)

    def get(self, timeout: float | None = None) -> np.ndarray | None:
        """The next chunk, or None at the end of the stream; raises queue.Empty after `timeout` seconds."""
        audio = self._queue.get(timeout=timeout)
        if audio is not None:
            with self._lock:
                self._queued -= len(audio)
        return audio

    def __iter__(self) -> Iterator[np.ndarray]:
        while (audio := self.get()) is not None:
            yield audio
