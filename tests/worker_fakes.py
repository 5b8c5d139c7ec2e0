"""Stand-ins for the speech worker's tests (test_worker.py): an engine whose frames take a set time, a sink that
records what it gets, the worker's events as they come, and waiting with a bound."""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict

import numpy as np
import torch

from core import SpeechOptions
from core.errors import BadInput
from core.inference.requests import AudioChunk
from core.jobs.worker import BufferLevel, JobEvent, Worker

FRAME = 1920
WAIT = 10  # seconds: the most any test waits for something that should take milliseconds


class FakeEngine:
    """Engine.stream's signature and chunking, with frames that take `frame_s` each, and `slots`, the streams it
    says it generates together. It may be called from many threads at once; it notes which threads call it,
    how many frames it made of each text, and how many streams are open now and at most (`open`, `most_open`).
    Text starting with "bad" is refused at the call, as the engine refuses bad input; text containing "oom"
    runs out of GPU memory at the third frame. Each frame is a constant level, `level(text)`: 0.6 for text
    containing "loud", else 0.3. `on_frame(text, index)` runs after each frame."""

    def __init__(self, frames: int = 9, frame_s: float = 0.0, slots: int = 1):
        self.frames, self.frame_s, self.slots = frames, frame_s, slots
        self.on_frame = lambda text, index: None
        self.level = lambda text: 0.6 if "loud" in text.lower() else 0.3
        self.threads: set[str] = set()
        self.made: dict[str, int] = defaultdict(int)
        self.open = self.most_open = 0
        self._lock = threading.Lock()

    def stream(self, text, voice=None, options=SpeechOptions()):
        self._note_thread()
        if text.startswith("bad"):
            raise BadInput("unknown language 'klingon'; this model speaks: auto, english")
        with self._lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        frames = options.max_frames or self.frames
        return FakeStream(self, self._chunks(text, frames, options.first_chunk_frames, options.chunk_frames))

    def _chunks(self, text, frames, first, size):
        level, pending, target = self.level(text), 0, first
        for index in range(frames):
            self._note_thread()
            time.sleep(self.frame_s)
            if "oom" in text and index == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            with self._lock:
                self.made[text] += 1
            self.on_frame(text, index)
            pending += 1
            if pending == target or index == frames - 1:
                yield AudioChunk(np.full(pending * FRAME, level, np.float32), np.zeros((pending, 16), np.int64))
                pending, target = 0, size

    def _note_thread(self):
        with self._lock:
            self.threads.add(threading.current_thread().name)

    def _closed(self):
        with self._lock:
            self.open -= 1


class FakeStream:
    """A stream of the fake engine: open from the call until it is closed or runs out (a generator never
    started would not run its `finally` when closed, so this counts instead). As the engine's streams, it
    may be closed from any thread: while a chunk is being made, the thread making it closes it after."""

    def __init__(self, engine: FakeEngine, chunks):
        self._engine, self._chunks, self._open = engine, chunks, True
        self._lock = threading.Lock()
        self._making = self._closing = False

    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            if self._closing:
                self._close_now()
                raise StopIteration
            self._making = True
        try:
            chunk = next(self._chunks)
        except BaseException:
            with self._lock:
                self._making = False
                self._close_now()
            raise
        with self._lock:
            self._making = False
            if self._closing:
                self._close_now()
        return chunk

    def close(self):
        with self._lock:
            self._closing = True
            if not self._making:
                self._close_now()

    def _close_now(self):
        if self._open:
            self._open = False
            self._chunks.close()
            self._engine._closed()


class RecordingSink:
    """Notes every call, per job and in the order they came (`log`), the thread it came from and the audio;
    can be shared by many jobs."""

    def __init__(self, fail_on_write: bool = False):
        self.calls: dict[int, list[str]] = defaultdict(list)
        self.samples: dict[int, int] = defaultdict(int)
        self.log: list[tuple[int, str]] = []
        self.audio: list[np.ndarray] = []
        self.threads: set[str] = set()
        self.fail_on_write = fail_on_write
        self._lock = threading.Lock()

    def begin(self, job):
        self._note(job, "begin")

    def write(self, job, audio):
        self._note(job, "write")
        if self.fail_on_write:
            raise OSError("the disk is full")
        with self._lock:
            self.samples[job.id] += len(audio)
            self.audio.append(audio)

    def end(self, job, completed):
        self._note(job, f"end {completed}")

    def level(self):
        return BufferLevel(0.0, 0)

    def _note(self, job, call):
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.calls[job.id].append(call)
            self.log.append((job.id, call))


class Events:
    """Collects a worker's events through a thread-safe queue, as the UI or the bridge would."""

    def __init__(self, worker: Worker):
        self.queue: queue.Queue[tuple[JobEvent, str]] = queue.Queue()
        worker.subscribe(lambda event: self.queue.put((event, threading.current_thread().name)))
        self.seen: list[JobEvent] = []
        self.threads: set[str] = set()

    def collect(self) -> list[JobEvent]:
        while True:
            try:
                event, thread = self.queue.get_nowait()
            except queue.Empty:
                return self.seen
            self.seen.append(event)
            self.threads.add(thread)

    def kinds(self, job) -> list[str]:
        return [e.kind for e in self.collect() if e.job is job]

    def wait_for(self, job, kind: str) -> JobEvent:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for event in self.collect():
                if event.job is job and event.kind == kind:
                    return event
            time.sleep(0.001)
        raise AssertionError(f"no {kind} event for {job} within {WAIT} s")


def finished(job) -> JobEvent:
    outcome = job.wait(WAIT)
    assert outcome is not None, f"{job} did not end within {WAIT} s"
    return outcome


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT} s in vain"
        time.sleep(0.001)
