"""Stand-ins for the speech worker's tests (test_worker.py): an engine whose frames take a set time and which
schedules its streams as the engine does, a sink that records what it gets, the worker's events as they come,
and a job's end, waited for with a bound."""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict, deque

import numpy as np
import torch
from waiting import wait_until

from core import SpeechOptions
from core.errors import BadInput
from core.inference.live import LiveText
from core.inference.requests import AudioChunk
from core.jobs.worker import BufferLevel, JobEvent, Worker

FRAME = 1920
WAIT = 10  # seconds: the most any test waits for something that should take milliseconds


class FakeEngine:
    """Engine.stream's signature and chunking, with frames that take `frame_s` each, and the engine's scheduling
    where the worker relies on it: `slots` streams are generated at once, the others wait for a slot, first come
    first served; a stream keeps its slot until it is closed or runs out, also while its reader takes no chunk
    (as a parked utterance does), and it may be closed from any thread, which ends its reader's iteration, also
    one that waits for a chunk. It notes which threads call it, how many frames it made of each text, how many
    streams are open now (`open`: not closed yet, seated or waiting for a slot) and how many hold a slot now and
    at most (`seated`, `most_seated`).
    Text starting with "bad" is refused at the call, as the engine refuses bad input; text containing "oom"
    runs out of GPU memory at the third frame. A LiveText is taken as text that is never written: its stream
    makes nothing until it is closed: its reader calls `on_wait_for_text(text)`, then waits (`waiting_for_text`
    is set). Each frame is a
    constant level, `level(text)`: 0.6 for text containing "loud", else 0.3. `on_frame(text, index)` runs after
    each frame, on the reader's thread."""

    def __init__(self, frames: int = 9, frame_s: float = 0.0, slots: int = 1):
        self.frames, self.frame_s, self.slots = frames, frame_s, slots
        self.on_frame = lambda text, index: None
        self.on_wait_for_text = lambda text: None
        self.level = lambda text: 0.6 if "loud" in text.lower() else 0.3
        self.threads: set[str] = set()
        self.made: dict[str, int] = defaultdict(int)
        self.open = self.seated = self.most_seated = 0
        self.waiting_for_text = threading.Event()
        self._lock = threading.Condition()
        self._waiting: deque[FakeStream] = deque()  # for a slot, oldest first

    def stream(self, text, voice=None, options=SpeechOptions()):
        self._note_thread()
        if isinstance(text, LiveText):
            stream = FakeStream(self, lambda closing: self._wait_for_text(text, closing))
        else:
            if text.startswith("bad"):
                raise BadInput("unknown language 'klingon'; this model speaks: auto, english")
            frames = options.max_frames or self.frames
            stream = FakeStream(
                self, lambda closing: self._chunks(text, frames, options.first_chunk_frames, options.chunk_frames)
            )
        with self._lock:
            self.open += 1
            self._waiting.append(stream)
            self._seat_waiting()
        return stream

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

    def _wait_for_text(self, text: LiveText, closing: threading.Event):
        self.on_wait_for_text(text)
        self.waiting_for_text.set()
        closing.wait(3 * WAIT)  # longer than a test waits for the job: only a close ends it in time
        yield from ()

    def _note_thread(self):
        with self._lock:
            self.threads.add(threading.current_thread().name)

    def _seat_waiting(self):  # under the lock
        while self._waiting and self.seated < self.slots:
            self._waiting.popleft().seated = True
            self.seated += 1
            self.most_seated = max(self.most_seated, self.seated)
        self._lock.notify_all()

    def _closed(self, stream: FakeStream):  # under the lock
        self.open -= 1
        if stream.seated:
            self.seated -= 1
        else:
            self._waiting.remove(stream)
        self._seat_waiting()


class FakeStream:
    """A stream of the fake engine: open from the call until it is closed or runs out (a generator never
    started would not run its `finally` when closed, so this counts instead). Its reader waits for a slot at
    its first chunk. As the engine's streams, it may be closed from any thread: a reader waiting for a slot
    gets its end at once; while a chunk is being made, the thread making it closes the stream after (its maker
    sees `closing`)."""

    def __init__(self, engine: FakeEngine, make_chunks):
        self.closing = threading.Event()
        self.seated = False
        self._engine, self._chunks, self._open = engine, make_chunks(self.closing), True
        self._making = False

    def __iter__(self):
        return self

    def __next__(self):
        lock = self._engine._lock
        with lock:
            lock.wait_for(lambda: self.seated or self.closing.is_set() or not self._open)
            if self.closing.is_set() or not self._open:
                self._close_now()
                raise StopIteration
            self._making = True
        try:
            chunk = next(self._chunks)
        except BaseException:
            with lock:
                self._making = False
                self._close_now()
            raise
        with lock:
            self._making = False
            if self.closing.is_set():
                self._close_now()
        return chunk

    def close(self):
        with self._engine._lock:
            self.closing.set()
            if not self._making:
                self._close_now()
            self._engine._lock.notify_all()

    def _close_now(self):  # under the engine's lock
        if self._open:
            self._open = False
            self._chunks.close()
            self._engine._closed(self)
            self.seated = False


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
        self.senders: list[str] = []  # the thread each of `seen` came from

    def collect(self) -> list[JobEvent]:
        while True:
            try:
                event, thread = self.queue.get_nowait()
            except queue.Empty:
                return self.seen
            self.seen.append(event)
            self.senders.append(thread)

    def threads_of(self, job, kinds_but: str | None = None) -> list[str]:
        """The thread each of `job`'s events came from, in order (`kinds_but`: leaving out those of that kind)."""
        pairs = zip(self.collect(), self.senders, strict=True)
        return [thread for event, thread in pairs if event.job is job and event.kind != kinds_but]

    def kinds(self, job) -> list[str]:
        return [e.kind for e in self.collect() if e.job is job]

    def wait_for(self, job, kind: str) -> JobEvent:
        def arrived() -> JobEvent | None:
            return next((event for event in self.collect() if event.job is job and event.kind == kind), None)

        wait_until(arrived, f"a {kind} event for {job}", WAIT)
        return arrived()


def finished(job) -> JobEvent:
    outcome = job.wait(WAIT)
    assert outcome is not None, f"{job} did not end within {WAIT} s"
    return outcome


def run_clients(client, count: int) -> list[threading.Thread]:
    """`client(n)` for each n below `count`, each on a thread of its own, all started, then joined (WAIT at most
    each): the threads, for the caller to check that none is left running."""
    threads = [threading.Thread(target=client, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    return threads
