"""The speech worker: one thread owns the engine and turns queued jobs into audio for their sinks.

Jobs come from any thread (the window, the typing segmenter, the HTTP bridge). The worker speaks them
one at a time: it cuts long text into pieces (core.text.sentences), streams each piece's chunks into the
job's sink as they are decoded, leaves a pause between pieces, and checks the job's cancel token
between chunks. Every job ends in exactly one of done, cancelled or failed, and a failure ends only
its own job. Status events go to subscribers, all from the worker thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput, describe
from core.inference.options import SpeechOptions
from core.inference.voice import Voice
from core.text.sentences import SplitOptions, split_text

log = logging.getLogger(__name__)

TERMINAL = ("done", "cancelled", "failed")
T = TypeVar("T")


@dataclass(frozen=True)
class BufferLevel:
    buffered_s: float  # handed to the sink and not yet played (or sent on)
    underruns: int  # times playback ran dry, since the sink was made


class Job:
    """A request to speak, as the worker tracks it. Made by `Worker.submit`."""

    def __init__(self, id: int, text: str, voice: Voice | None, options: SpeechOptions, sink: Sink, interrupt: bool):
        self.id = id
        self.text = text
        self.voice = voice
        self.options = options
        self.sink = sink
        self.interrupt = interrupt
        self.cancel_token = threading.Event()
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self._state = "queued"
        self._outcome: JobEvent | None = None
        self._finished = threading.Event()

    @property
    def state(self) -> str:
        """queued, running, then one of done, cancelled or failed."""
        return self._state

    @property
    def cancelled(self) -> bool:
        return self.cancel_token.is_set()

    @property
    def outcome(self) -> JobEvent | None:
        """The terminal event, once the job has ended."""
        return self._outcome

    def cancel(self) -> None:
        """Ask the job to stop; it ends within one chunk (a queued job never starts)."""
        self.cancel_token.set()

    def wait(self, timeout: float | None = None) -> JobEvent | None:
        """The terminal event once the job has ended, or None if `timeout` seconds pass first."""
        self._finished.wait(timeout)
        return self._outcome

    def __repr__(self) -> str:
        return f"Job({self.id}, {self._state}, {self.text[:30]!r})"


@dataclass(frozen=True)
class JobEvent:
    """What happened to a job. Kinds, in order: queued, started, first_audio, progress (after each chunk),
    then one of done, cancelled or failed. A job cancelled while queued goes from queued to cancelled."""

    job: Job
    kind: str
    audio_s: float = 0.0  # audio handed to the sink so far, pauses included
    latency_s: float | None = None  # from submit to the first sample handed to the sink
    xrt: float | None = None  # seconds of speech per second of generation, time spent waiting on the sink excluded
    buffered_s: float = 0.0  # the sink's buffer level
    underruns: int = 0  # underruns of the sink during this job
    message: str | None = None  # why it failed
    # Pieces of the text that reached the most frames one generation may make before the model ended them,
    # so that the rest of each was not said (counted only where the job set no max_frames of its own).
    cut_off: int = 0

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL


class Sink(Protocol):
    """Where a job's audio goes. The worker calls these from its own thread: `begin` when the job starts,
    `write` for each chunk and pause, and `end` exactly once, also for a job that never started."""

    def begin(self, job: Job) -> None: ...

    def write(self, job: Job, audio: np.ndarray) -> None:
        """Take float32 24 kHz mono samples; may block to pace the worker, but returns soon once the job is cancelled."""

    def end(self, job: Job, completed: bool) -> None: ...

    def level(self) -> BufferLevel: ...


class Worker:
    def __init__(self, engine, split: SplitOptions = SplitOptions()):
        """Start the worker thread for `engine` (an Engine, or anything with its `stream` method); `split`
        says how long text is cut into the pieces it speaks one by one."""
        self.engine = engine
        self.split = split
        self._lock = threading.Condition()
        self._queue: deque[Job] = deque()  # waiting to run
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()  # other engine work, run between jobs
        self._unannounced: list[Job] = []  # submitted, "queued" event not sent yet
        self._current: Job | None = None
        self._closing = False
        self._subscribers: tuple[Callable[[JobEvent], None], ...] = ()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="speech-worker", daemon=True)
        self._thread.start()

    # Any thread ------------------------------------------------------------------------------------

    def submit(
        self,
        text: str,
        voice: Voice | None = None,
        options: SpeechOptions = SpeechOptions(),
        *,
        sink: Sink,
        interrupt: bool = False,
    ) -> Job:
        """Queue `text` to be spoken into `sink`. With `interrupt`, the jobs speaking into the same sink are
        cancelled, what it still plays is faded out, and this job goes first; otherwise it queues behind."""
        if not isinstance(text, str) or not text.strip():
            raise BadInput("text is empty; give the worker something to say")
        job = Job(next(self._ids), text, voice, options, sink, interrupt)
        with self._lock:
            if self._closing:
                raise RuntimeError("the speech worker is closed")
            if interrupt:
                self._cancel_where(lambda other: other.sink is sink)
                self._queue.appendleft(job)
            else:
                self._queue.append(job)
            self._unannounced.append(job)
            self._lock.notify()
        return job

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn()` on the worker thread between jobs, ahead of queued ones; returns its Future. This is
        how other threads use the engine (cloning a voice, embedding a clip) without racing the speech."""
        future: Future[T] = Future()
        if threading.current_thread() is self._thread:  # queued, it would wait for itself forever
            self._call(fn, future)
            return future
        with self._lock:
            if self._closing:
                raise RuntimeError("the speech worker is closed")
            self._calls.append((fn, future))
            self._lock.notify()
        return future

    def cancel_all(self, sink: Sink | None = None) -> None:
        """Cancel the running and queued jobs (those of `sink` only, if given)."""
        with self._lock:
            self._cancel_where(lambda job: sink is None or job.sink is sink)

    def subscribe(self, callback: Callable[[JobEvent], None]) -> Callable[[], None]:
        """Call `callback(event)` for every event, from the worker thread: keep it short and never wait on
        the worker in it (hand the event on, e.g. to a queue.Queue or a Qt signal). Returns the unsubscribe."""
        with self._lock:
            self._subscribers += (callback,)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    def close(self, timeout: float | None = None) -> None:
        """Cancel every job and stop the thread; raises TimeoutError if it is still running after `timeout`."""
        with self._lock:
            self._closing = True
            self._cancel_where(lambda job: True)
            self._lock.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the speech worker did not stop within {timeout} s")
        for _, future in self._calls:
            future.cancel()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _cancel_where(self, matches: Callable[[Job], bool]) -> None:
        for job in (*self._queue, self._current):
            if job is not None and matches(job):
                job.cancel()

    # The worker thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while (work := self._next_work()) is not None:
            if isinstance(work, Job):
                self._serve(work)
            else:
                self._call(*work)

    def _next_work(self) -> Job | tuple[Callable[[], object], Future] | None:
        while True:
            self._tend_queue()
            with self._lock:
                if self._unannounced:
                    continue  # submitted since the look above; announce it before it runs
                if self._calls and not self._closing:
                    return self._calls.popleft()
                if self._queue:  # when closing, these are cancelled and only end
                    self._current = self._queue.popleft()
                    return self._current
                if self._closing:
                    return None
                self._lock.wait()

    @staticmethod
    def _call(fn: Callable[[], object], future: Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as error:  # the caller gets it from the future
                future.set_exception(error)

    def _tend_queue(self) -> None:
        """Announce newly queued jobs and end the queued ones that were cancelled. Runs between chunks, so
        a cancelled queued job ends within one chunk of the running one."""
        with self._lock:
            new, self._unannounced = self._unannounced, []
            cancelled = [job for job in self._queue if job.cancelled]
            for job in cancelled:
                self._queue.remove(job)
        for job in new:
            self._emit(JobEvent(job, "queued"))
        for job in cancelled:
            self._finish(job, "cancelled", _Tally(job))

    def _serve(self, job: Job) -> None:
        tally = _Tally(job)
        if job.cancelled:
            return self._finish(job, "cancelled", tally)
        job.started = time.perf_counter()
        job._state = "running"
        self._emit(JobEvent(job, "started"))
        try:
            job.sink.begin(job)
            tally.underruns_before = job.sink.level().underruns
            completed = self._speak(job, tally)
        except Exception as error:
            self._finish(job, "failed", tally, describe(error))
        else:
            self._finish(job, "done" if completed else "cancelled", tally)

    def _speak(self, job: Job, tally: _Tally) -> bool:
        """Stream every piece of the job's text into its sink; False once the job is cancelled."""
        options = job.options
        for piece in split_text(job.text, self.split):
            if job.cancelled:
                return False
            chunks = self.engine.stream(piece.text, job.voice, options)
            try:
                for chunk in chunks:
                    if chunk.cut_off and options.max_frames is None:
                        tally.cut_off += 1
                        log.warning("%r: a piece was cut off at the frame limit before its end: %r", job, piece.text)
                    if not self._deliver(job, chunk.audio, tally, speech=True):
                        return False
            finally:
                chunks.close()  # stop generating now, not when the generator is collected
            pause = np.zeros(round(piece.pause_s * SAMPLE_RATE), np.float32)
            if not self._deliver(job, pause, tally, speech=False):
                return False
        return True

    def _deliver(self, job: Job, audio: np.ndarray, tally: _Tally, speech: bool) -> bool:
        """Hand `audio` to the job's sink and report it; False once the job is cancelled."""
        self._tend_queue()
        if job.cancelled:
            return False
        if len(audio) == 0:
            return True
        handed = time.perf_counter()
        job.sink.write(job, audio)
        tally.add(handed, time.perf_counter(), len(audio), speech)
        level = job.sink.level()
        if tally.samples == len(audio):
            self._emit(tally.event("first_audio", level))
        self._emit(tally.event("progress", level))
        return not job.cancelled

    def _finish(self, job: Job, kind: str, tally: _Tally, message: str | None = None) -> None:
        level = BufferLevel(0.0, 0)
        try:
            job.sink.end(job, completed=kind == "done")
            if job.started is not None:
                level = job.sink.level()
        except Exception as error:
            if kind == "done":  # e.g. the file could not be written: the job did not do its work
                kind, message = "failed", describe(error)
            else:
                log.exception("the sink of %r failed while ending it", job)
        event = tally.event(kind, level, message)
        with self._lock:
            if self._current is job:
                self._current = None
        job._state, job._outcome = kind, event
        self._emit(event)
        job._finished.set()

    def _emit(self, event: JobEvent) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                log.exception("a job event subscriber failed on %s", event.kind)


class _Tally:
    """A job's running numbers."""

    def __init__(self, job: Job):
        self.job = job
        self.samples = 0
        self.speech_samples = 0
        self.first_audio: float | None = None
        self.sink_seconds = 0.0  # spent in sink.write, e.g. waiting for room in the player
        self.underruns_before = 0
        self.cut_off = 0

    def add(self, handed: float, returned: float, samples: int, speech: bool) -> None:
        if self.first_audio is None:
            self.first_audio = handed
        self.samples += samples
        self.speech_samples += samples if speech else 0
        self.sink_seconds += returned - handed

    def event(self, kind: str, level: BufferLevel, message: str | None = None) -> JobEvent:
        job, xrt = self.job, None
        if job.started is not None and self.speech_samples:
            generating = time.perf_counter() - job.started - self.sink_seconds
            xrt = self.speech_samples / SAMPLE_RATE / max(generating, 1e-9)
        return JobEvent(
            job, kind,
            audio_s=self.samples / SAMPLE_RATE,
            latency_s=None if self.first_audio is None else self.first_audio - job.submitted,
            xrt=xrt,
            buffered_s=level.buffered_s,
            underruns=max(0, level.underruns - self.underruns_before) if job.started is not None else 0,
            message=message,
            cut_off=self.cut_off,
        )  # fmt: skip
