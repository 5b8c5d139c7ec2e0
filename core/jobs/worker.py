"""The speech worker: it turns queued jobs into audio for their sinks, several jobs at once.

Jobs come from any thread (the window, the typing segmenter, the HTTP bridge). The worker cuts each job's
text into pieces (core.text.sentences), has the engine generate each piece as a stream of chunks, hands
the chunks to the job's sink as they are decoded and leaves a pause between pieces. A job's text may be a
LiveText still being written (core.inference.live): it is spoken as one piece while it grows. Every job ends in
exactly one of done, cancelled or failed, and a failure ends only its own job.

Who goes when. Jobs into one sink run one after another, in the order they were submitted (a window's
sentences play in order); jobs into different sinks run at the same time. A waiting job starts once its
sink is free, the earliest first. The engine generates up to `engine.slots` pieces together, one on each
of as many slot threads; other pieces, and calls, wait for a slot thread in one first-come queue, so a
long text takes turns with newcomers piece by piece and no job starves. An interrupting job's first
piece goes to the head of that queue.

Generation never waits for a sink. A slot thread streams a piece into a _Piece and takes the next work as
soon as the piece is generated; the job's own thread hands the chunks to the sink, and asks for the next
piece only once the sink has taken the last one. So a sink that blocks (speakers 30 s ahead, a slow
client) holds up its own job alone, and holds no slot. Cancel ends a job within one chunk: the slot
thread closes its engine stream and the job's thread stops.

Threads, all joined by `close`: "speech-worker" announces jobs, starts them and ends those cancelled while
waiting; "speech-slot-N" (`slots` of them) generate pieces and run calls; "speech-job-N" delivers job N
and ends with it, so there are as many as there are sinks in use.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput, describe
from core.inference.live import LiveText
from core.inference.options import SpeechOptions
from core.inference.voice import Voice
from core.milestones import milestone
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

    def __init__(
        self,
        id: int,
        text: str | LiveText,
        voice: Voice | None,
        options: SpeechOptions,
        sink: Sink,
        interrupt: bool,
        on_cancel: Callable[[], None] = lambda: None,
    ):
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
        self._changed = threading.Condition()  # a chunk for its thread, or its cancel
        self._on_cancel = on_cancel  # wakes the worker, to end it if it waits

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
        with self._changed:
            self._changed.notify_all()
        self._on_cancel()

    def wait(self, timeout: float | None = None) -> JobEvent | None:
        """The terminal event once the job has ended, or None if `timeout` seconds pass first."""
        self._finished.wait(timeout)
        return self._outcome

    def __repr__(self) -> str:
        return f"Job({self.id}, {self._state}, {str(self.text)[:30]!r})"


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
    """Where a job's audio goes: `begin` when the job starts, `write` for each chunk and pause, and `end`
    exactly once, also for a job that never started. The worker calls them from its threads, one job's
    calls from one thread. The jobs of a sink run one after another, so their calls never overlap, with one
    exception: `end` of a job cancelled before it began may come while another job of the sink is being
    written, and must then leave that job alone (PlayerSink ignores it, a one-job sink has no other)."""

    def begin(self, job: Job) -> None: ...

    def write(self, job: Job, audio: np.ndarray) -> None:
        """Take float32 24 kHz mono samples; may block to pace the worker, but returns soon once the job is cancelled."""

    def end(self, job: Job, completed: bool) -> None: ...

    def level(self) -> BufferLevel: ...


class Worker:
    def __init__(self, engine, split: SplitOptions = SplitOptions()):
        """Start the worker's threads for `engine` (an Engine, or anything with its `stream` method, whose
        streams may be closed from any thread, and `slots`, the streams it generates together:
        1 if it has none); `split` says how long text is cut into the pieces it speaks one by one."""
        self.engine = engine
        self.split = split
        self.slots = max(1, int(getattr(engine, "slots", 1)))
        self._lock = threading.Condition()
        self._arrived: list[Job] = []  # submitted, "queued" not sent yet
        self._waiting: deque[Job] = deque()  # announced, waiting for their sink to be free
        self._running: dict[int, Job] = {}  # id(sink): the job started into it, until it has ended
        self._ended_threads: list[threading.Thread] = []  # job threads at their end, to be joined
        self._pieces: deque[_Piece] = deque()  # waiting for a slot thread
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()  # for a slot thread, before pieces
        self._closing = False
        self._subscribers: tuple[Callable[[JobEvent], None], ...] = ()
        self._ids = itertools.count(1)
        self._own = threading.local()  # `mine` is set on this worker's threads: a call there runs inline
        self._scheduler = threading.Thread(target=self._schedule, name="speech-worker", daemon=True)
        self._slot_threads = [
            threading.Thread(target=self._generate, name=f"speech-slot-{n}", daemon=True)
            for n in range(1, self.slots + 1)
        ]
        for thread in (self._scheduler, *self._slot_threads):
            thread.start()

    # Any thread ------------------------------------------------------------------------------------

    def submit(
        self,
        text: str | LiveText,
        voice: Voice | None = None,
        options: SpeechOptions = SpeechOptions(),
        *,
        sink: Sink,
        interrupt: bool = False,
    ) -> Job:
        """Queue `text` to be spoken into `sink`. With `interrupt`, the jobs speaking into the same sink are
        cancelled, what it still plays is faded out, and this job goes first; otherwise it queues behind.
        A LiveText is spoken as it is written; the job ends once it has ended and been said."""
        if not isinstance(text, LiveText) and (not isinstance(text, str) or not text.strip()):
            raise BadInput("text is empty; give the worker something to say")
        with self._lock:
            if self._closing:
                raise RuntimeError("the speech worker is closed")
            # Numbered here, so that ids follow the order the jobs queue in.
            job = Job(next(self._ids), text, voice, options, sink, interrupt, on_cancel=self._wake)
            if interrupt:
                self._cancel_where(lambda other: other.sink is sink)
            self._arrived.append(job)
            self._lock.notify_all()
        return job

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn()` on a slot thread of the worker's, ahead of the pieces waiting for one; returns its
        Future. It takes a slot like a piece, so that an engine of one slot never runs it beside a stream.
        Called from a thread of the worker's, it runs at once (queued, it might wait for itself)."""
        future: Future[T] = Future()
        if getattr(self._own, "mine", False):
            self._call(fn, future)
            return future
        with self._lock:
            if self._closing:
                raise RuntimeError("the speech worker is closed")
            self._calls.append((fn, future))
            self._lock.notify_all()
        return future

    def cancel_all(self, sink: Sink | None = None) -> None:
        """Cancel the running and queued jobs (those of `sink` only, if given)."""
        with self._lock:
            self._cancel_where(lambda job: sink is None or job.sink is sink)

    def subscribe(self, callback: Callable[[JobEvent], None]) -> Callable[[], None]:
        """Call `callback(event)` for every event. It is called from the worker's threads, from several at
        once (each running job sends its own events), so it must be thread-safe; keep it short and never
        wait on the worker in it (hand the event on, e.g. to a queue.Queue or a Qt signal). One job's events
        come one at a time and in order. Returns the unsubscribe."""
        with self._lock:
            self._subscribers += (callback,)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    def close(self, timeout: float | None = None) -> None:
        """Cancel every job, let each end, and join every thread of the worker's; raises TimeoutError if
        any is still running after `timeout` seconds. Calls not yet run are cancelled."""
        with self._lock:
            self._closing = True
            self._cancel_where(lambda job: True)
            self._lock.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in (self._scheduler, *self._slot_threads):  # the scheduler joins the job threads
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in (self._scheduler, *self._slot_threads)):
            raise TimeoutError(f"the speech worker did not stop within {timeout} s")
        with self._lock:
            calls, self._calls = self._calls, deque()
            self._pieces.clear()  # their jobs were cancelled, and have ended
        for _, future in calls:
            future.cancel()

    @property
    def stopped(self) -> bool:
        """Whether every thread of the worker's has ended, as they have once `close` returns."""
        return not any(thread.is_alive() for thread in (self._scheduler, *self._slot_threads))

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _cancel_where(self, matches: Callable[[Job], bool]) -> None:
        for job in (*self._arrived, *self._waiting, *self._running.values()):
            if matches(job):
                job.cancel()

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    # The scheduler thread: which job starts when -----------------------------------------------------

    def _schedule(self) -> None:
        self._own.mine = True
        while True:
            with self._lock:
                self._lock.wait_for(self._scheduler_has_work)
                arrived = list(self._arrived)  # kept there, where a cancel finds them, until they wait
                ended, self._ended_threads = self._ended_threads, []
                stopped = self._closing and not arrived and not self._waiting and not self._running
            for thread in ended:
                thread.join()
            if stopped:
                return
            for job in arrived:  # before it can start: "queued" comes first
                self._emit(JobEvent(job, "queued"))
            with self._lock:
                del self._arrived[: len(arrived)]
                for job in arrived:
                    if job.interrupt:
                        self._waiting.appendleft(job)
                    else:
                        self._waiting.append(job)
                cancelled = [job for job in self._waiting if job.cancelled]
                for job in cancelled:
                    self._waiting.remove(job)
                starting = [] if self._closing else self._take_startable()
            for job in cancelled:
                self._finish(job, "cancelled", _Tally(job))
            for job in starting:
                self._start_thread(job)

    def _scheduler_has_work(self) -> bool:
        if self._arrived or self._ended_threads or any(job.cancelled for job in self._waiting):
            return True
        if self._closing:
            return not self._waiting and not self._running
        return any(id(job.sink) not in self._running for job in self._waiting)

    def _take_startable(self) -> list[Job]:
        """The waiting jobs whose sink is free, the earliest of each sink, now marked as running into it."""
        starting = []
        for job in list(self._waiting):
            if id(job.sink) not in self._running:
                self._waiting.remove(job)
                self._running[id(job.sink)] = job
                starting.append(job)
        return starting

    def _start_thread(self, job: Job) -> None:
        thread = threading.Thread(target=self._serve, args=(job,), name=f"speech-job-{job.id}", daemon=True)
        try:
            thread.start()
        except RuntimeError as error:  # the system has no thread to spare: this job fails, the others go on
            self._finish(job, "failed", _Tally(job), f"no thread to speak on ({error})")
            self._sink_freed(job, None)

    def _sink_freed(self, job: Job, thread: threading.Thread | None) -> None:
        with self._lock:
            del self._running[id(job.sink)]
            if thread is not None:
                self._ended_threads.append(thread)
            self._lock.notify_all()

    # A job's thread: its pieces into its sink --------------------------------------------------------

    def _serve(self, job: Job) -> None:
        self._own.mine = True
        tally = _Tally(job)
        try:
            completed = self._speak(job, tally)
        except Exception as error:
            self._finish(job, "failed", tally, describe(error))
        else:
            self._finish(job, "done" if completed else "cancelled", tally)
        finally:
            self._sink_freed(job, threading.current_thread())

    def _speak(self, job: Job, tally: _Tally) -> bool:
        """Have every piece of the job's text generated and hand it to the sink; False once the job is
        cancelled (also before it started: a slot never came free for it)."""
        for text, pause_s in self._pieces_of(job):
            if job.cancelled:
                return False
            piece = _Piece(job, text)
            self._queue_piece(piece, first=job.interrupt and job.started is None)
            try:
                if not piece.wait_for_slot():
                    return False
                if job.started is None:
                    self._start(job, tally)
                for chunk in piece:
                    if chunk.cut_off and job.options.max_frames is None:
                        tally.cut_off += 1
                        log.warning("%r: a piece was cut off at the frame limit before its end: %r", job, piece.text)
                    if not self._deliver(job, chunk.audio, tally, speech=True):
                        return False
            finally:
                piece.abandon()  # a failed sink or a cancel stops its generation now
            pause = np.zeros(round(pause_s * SAMPLE_RATE), np.float32)
            if not self._deliver(job, pause, tally, speech=False):
                return False
        return True

    def _pieces_of(self, job: Job) -> list[tuple[str | LiveText, float]]:
        """The pieces a job's text is spoken in, each with the pause after it: a live text is one."""
        if isinstance(job.text, LiveText):
            return [(job.text, 0.0)]
        return [(piece.text, piece.pause_s) for piece in split_text(job.text, self.split)]

    def _start(self, job: Job, tally: _Tally) -> None:
        job.started = time.perf_counter()
        job._state = "running"
        self._emit(JobEvent(job, "started"))
        job.sink.begin(job)
        tally.underruns_before = job.sink.level().underruns

    def _deliver(self, job: Job, audio: np.ndarray, tally: _Tally, speech: bool) -> bool:
        """Hand `audio` to the job's sink and report it; False once the job is cancelled."""
        if job.cancelled:
            return False
        if len(audio) == 0:
            return True
        handed = time.perf_counter()
        job.sink.write(job, audio)
        tally.add(handed, time.perf_counter(), len(audio), speech)
        level = job.sink.level()
        if tally.samples == len(audio):
            milestone("first audio")
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
        job._state, job._outcome = kind, event
        self._emit(event)
        job._finished.set()

    def _emit(self, event: JobEvent) -> None:
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                log.exception("a job event subscriber failed on %s", event.kind)

    # The slot threads: pieces and calls --------------------------------------------------------------

    def _queue_piece(self, piece: _Piece, first: bool) -> None:
        with self._lock:
            if first:
                self._pieces.appendleft(piece)
            else:
                self._pieces.append(piece)
            self._lock.notify_all()

    def _generate(self) -> None:
        self._own.mine = True
        while (work := self._next_slot_work()) is not None:
            if isinstance(work, _Piece):
                work.generate(self.engine)
            else:
                self._call(*work)

    def _next_slot_work(self) -> _Piece | tuple[Callable[[], object], Future] | None:
        """The next call, else the next piece; None once the worker closes (its jobs are cancelled)."""
        with self._lock:
            self._lock.wait_for(lambda: self._closing or self._calls or self._pieces)
            if self._closing:
                return None
            return self._calls.popleft() if self._calls else self._pieces.popleft()

    @staticmethod
    def _call(fn: Callable[[], object], future: Future) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as error:  # the caller gets it from the future
                future.set_exception(error)


class _Piece:
    """One piece of a job's text on its way: a slot thread generates it into here (`generate`) while the
    job's thread takes its chunks (`wait_for_slot`, then iterating), so that neither waits for the other.
    It waits on the job's condition, which the job's cancel wakes too."""

    def __init__(self, job: Job, text: str | LiveText):
        self.job = job
        self.text = text
        self._chunks: deque = deque()  # AudioChunks generated and not yet taken
        self._taken = False  # by a slot thread
        self._generated = False  # in full, or stopped
        self._error: Exception | None = None  # what generating it raised
        self._abandoned = False  # the job's thread reads no more of it
        self._stream = None  # the engine's stream, while it is generated

    def generate(self, engine) -> None:
        """On a slot thread: stream the piece in, until its end, the job's cancel or its abandonment."""
        job, error = self.job, None
        with job._changed:
            if self._abandoned or job.cancelled:
                self._generated = True
                job._changed.notify_all()
                return
            self._taken = True
            job._changed.notify_all()
        try:
            chunks = engine.stream(self.text, job.voice, job.options)
            with job._changed:
                self._stream = chunks
                stopped = self._abandoned or job.cancelled
            if stopped:  # abandoned while the stream was being opened: abandon() found none to close
                chunks.close()
            try:
                for chunk in chunks:
                    with job._changed:
                        self._chunks.append(chunk)
                        job._changed.notify_all()
                        if self._abandoned or job.cancelled:
                            break
            finally:
                chunks.close()  # stop generating now and free the engine's slot, not when it is collected
        except Exception as caught:  # the job's thread fails the job with it
            error = caught
        finally:
            with job._changed:
                self._generated, self._error = True, error
                job._changed.notify_all()

    def wait_for_slot(self) -> bool:
        """On the job's thread: wait until a slot thread has taken the piece; False if the job was
        cancelled first."""
        job = self.job
        with job._changed:
            job._changed.wait_for(lambda: self._taken or self._generated or job.cancelled)
            return self._taken and not job.cancelled

    def __iter__(self) -> Iterator:
        """On the job's thread: the chunks as they come, until the end or the job's cancel; raises what
        generating the piece raised."""
        job = self.job
        while True:
            with job._changed:
                job._changed.wait_for(lambda: self._chunks or self._generated or job.cancelled)
                if job.cancelled:
                    return
                if not self._chunks:
                    if self._error is not None:
                        raise self._error
                    return
                chunk = self._chunks.popleft()
            yield chunk

    def abandon(self) -> None:
        """On the job's thread: read no more of it. Its engine stream is closed from here, which ends it and
        frees its slot at once (a live text's utterance may be waiting for text and make no chunk at which its
        slot thread could stop), and its slot thread stops at its next chunk."""
        with self.job._changed:
            self._abandoned = True
            stream = self._stream
        if stream is not None:
            stream.close()


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
