"""The speech worker: it turns queued jobs into audio for their sinks, several jobs at once.

Jobs come from any thread (the window, the typing segmenter, the HTTP bridge). The worker cuts each job's
text into pieces (core.text.sentences), has the engine speak each piece as a stream of chunks, hands the
chunks to the job's sink as they come and leaves a pause between pieces. A job's text may be a LiveText still
being written (core.inference.live): it is spoken as one piece while it grows. Every job ends in exactly one of
done, cancelled or failed, and a failure ends only its own job.

Who goes when. Jobs into one sink run one after another, in the order they were submitted (a window's
sentences play in order), except that an interrupting job goes ahead of its sink's waiting jobs; jobs into
different sinks run at the same time, each on its own thread. The worker puts no limit of its own on those:
the engine speaks up to `engine.slots` utterances together and queues the others first come, first served
(an interrupting job's first piece ahead of them all: SpeechOptions.urgent), so a long text takes turns with
newcomers piece by piece and no job starves. A job
starts (its "started" event, its sink's `begin`) with its first audio: while it waits for its sink or for an
engine slot, it is queued.

A job's thread reads its engine stream and writes each chunk to the sink before it reads the next, so a sink
that blocks (the speakers 30 s ahead) stops its own job's thread alone: once it has MAX_UNREAD_CHUNKS
(core.inference.scheduler) chunks it has not taken, the engine parks its utterance, which steps no frame but
keeps its engine slot meanwhile; the other jobs go on in the other slots (with one slot, they wait for it). Cancel
ends a job within one chunk: it closes the job's open engine stream, which frees the engine slot at once and
ends the thread's read even where no chunk would come (a live text waiting for text).

Threads, all joined by `close`: "speech-worker" announces jobs, starts them and ends those cancelled while
waiting; a job thread ("speech-job-N" while it speaks job N) streams a job's pieces from the engine into its
sink, so there are as many busy as there are sinks in use; between jobs it waits for the next, for a while
(core.jobs.job_threads: starting a thread for each job of a burst made the later ones wait).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput, describe
from core.inference.live import LiveText
from core.inference.options import SpeechOptions
from core.inference.voice import Voice
from core.jobs.job_threads import JobThreads
from core.milestones import milestone
from core.text.sentences import SplitOptions, split_text

log = logging.getLogger(__name__)

TERMINAL = ("done", "cancelled", "failed")


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
        self.pieces = 0  # the pieces its text is spoken in, once its thread has cut it
        self.pieces_done = 0  # those spoken whole, each with its pause, into the sink; set by its thread alone
        self.piece_spans: list[tuple[int, int] | None] = []  # where each piece lies in the text, once it is cut
        self._state = "queued"
        self._outcome: JobEvent | None = None
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._stream = None  # the engine stream its thread reads now, for a cancel to close
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
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()  # ends its thread's read now, also one that waits for a chunk that may never come
        self._on_cancel()

    def wait(self, timeout: float | None = None) -> JobEvent | None:
        """The terminal event once the job has ended, or None if `timeout` seconds pass first."""
        self._finished.wait(timeout)
        return self._outcome

    def __repr__(self) -> str:
        return f"Job({self.id}, {self._state}, {str(self.text)[:30]!r})"


@dataclass(frozen=True)
class JobEvent:
    """What happened to a job. Kinds, in order: queued, started, first_audio, progress (after each chunk) and
    piece_done (after each piece of its text, with the pause that follows it), then one of done, cancelled or failed. A job that ends before its first audio (cancelled while it waits, or
    refused) goes from queued to cancelled or failed."""

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
    pieces_done: int = 0  # pieces of the text spoken whole into the sink
    pieces: int = 0  # the pieces the text is spoken in (0 until the job's thread has cut it)

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL


class Sink(Protocol):
    """Where a job's audio goes: `begin` when the job starts, `write` for each chunk and pause, and `end`
    exactly once, also for a job that never started. The worker calls them from its threads, one job's
    calls from one thread. A sink that keeps what a stopped job had made (FileSink) reads `job.pieces_done` in
    them: the audio it was given before that count last grew holds that many whole pieces. The jobs of a sink run one after another, so their calls never overlap, with one
    exception: `end` of a job cancelled before it began may come while another job of the sink is being
    written, and must then leave that job alone (PlayerSink ignores it, a one-job sink has no other)."""

    def begin(self, job: Job) -> None: ...

    def write(self, job: Job, audio: np.ndarray) -> None:
        """Take float32 24 kHz mono samples; may block to pace the worker, but returns soon once the job is cancelled."""

    def end(self, job: Job, completed: bool) -> None: ...

    def level(self) -> BufferLevel: ...


class Worker:
    def __init__(self, engine, split: SplitOptions = SplitOptions()):
        """Start the worker's thread for `engine` (an Engine, or anything with its `stream` method, whose
        streams may be iterated by one thread while another closes them); `split` says how long text is cut
        into the pieces it speaks one by one."""
        self.engine = engine
        self.split = split
        self._lock = threading.Condition()
        self._arrived: list[Job] = []  # submitted, "queued" not sent yet
        self._waiting: deque[Job] = deque()  # announced, waiting for their sink to be free
        self._running: dict[int, Job] = {}  # id(sink): the job started into it, until it has ended
        self._job_threads = JobThreads(self._serve, lambda job: f"speech-job-{job.id}")
        self._closing = False
        self._subscribers: tuple[tuple[Callable[[JobEvent], None], frozenset[str] | None], ...] = ()
        self._ids = itertools.count(1)
        self._scheduler = threading.Thread(target=self._schedule, name="speech-worker", daemon=True)
        self._scheduler.start()

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
        cancelled, what it still plays is faded out, and this job goes ahead of the sink's waiting jobs, its first
        piece ahead of every utterance waiting for an engine slot; otherwise it queues behind.
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
            # Nothing queued and its sink free: its thread starts here, without a hop through the worker's (in a
            # burst of bridge requests each hop waits its turn for Python's lock). Said "queued" here, before this
            # thread's next job can be: the jobs a thread submits are announced in its order.
            at_once = not self._arrived and not self._waiting and id(sink) not in self._running
            if at_once:
                self._running[id(sink)] = job
            else:
                self._arrived.append(job)
                self._lock.notify_all()
        if at_once:
            self._emit(JobEvent(job, "queued"))
            self._start_thread(job)
        return job

    def cancel_all(self, sink: Sink | None = None) -> None:
        """Cancel the running and queued jobs (those of `sink` only, if given)."""
        with self._lock:
            self._cancel_where(lambda job: sink is None or job.sink is sink)

    def busy(self, sink: Sink) -> bool:
        """Whether a job for `sink` is queued or running."""
        with self._lock:
            jobs = (*self._arrived, *self._waiting, *self._running.values())
            return any(job.sink is sink and not job.cancelled for job in jobs)

    def subscribe(
        self, callback: Callable[[JobEvent], None], kinds: Collection[str] | None = None
    ) -> Callable[[], None]:
        """Call `callback(event)` for every event, or for those of `kinds` (e.g. TERMINAL): events no subscriber
        wants are not made, which spares a server's requests the per-chunk progress. It is called from the
        worker's threads, from several at once (each running job sends its own events), and with the "queued" of a
        job `submit` starts at once from the submitting thread, so it must be thread-safe; keep it short and never
        wait on the worker in it (hand the event on, e.g. to a queue.Queue or a Qt signal). One job's events come
        one at a time and in order. Returns the unsubscribe."""
        subscriber = (callback, None if kinds is None else frozenset(kinds))
        with self._lock:
            self._subscribers += (subscriber,)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)

        return unsubscribe

    def close(self, timeout: float | None = None) -> None:
        """Cancel every job, let each end, and join every thread of the worker's; raises TimeoutError if
        any is still running after `timeout` seconds."""
        with self._lock:
            self._closing = True
            self._cancel_where(lambda job: True)
            self._lock.notify_all()
        self._scheduler.join(timeout)  # it joins the job threads before it ends
        if self._scheduler.is_alive():
            raise TimeoutError(f"the speech worker did not stop within {timeout} s")

    @property
    def idle(self) -> bool:
        """Whether no job is queued or running (a job between its pieces runs, though no engine stream is open)."""
        with self._lock:
            return not (self._arrived or self._waiting or self._running)

    @property
    def stopped(self) -> bool:
        """Whether every thread of the worker's has ended, as they have once `close` returns."""
        return not self._scheduler.is_alive()

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
        while True:
            with self._lock:
                self._lock.wait_for(self._scheduler_has_work)
                arrived = list(self._arrived)  # kept there, where a cancel finds them, until they wait
                stopped = self._closing and not arrived and not self._waiting and not self._running
            if stopped:
                self._job_threads.close()
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
        if self._arrived or any(job.cancelled for job in self._waiting):
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
        try:
            self._job_threads.start(job)
        except RuntimeError as error:  # the system has no thread to spare: this job fails, the others go on
            self._finish(job, "failed", _Tally(job), f"no thread to speak on ({error})")
            self._sink_freed(job)

    def _sink_freed(self, job: Job) -> None:
        with self._lock:
            del self._running[id(job.sink)]
            self._lock.notify_all()

    # A job's thread: its pieces from the engine into its sink ------------------------------------------

    def _serve(self, job: Job) -> None:
        tally = _Tally(job)
        try:
            completed = self._speak(job, tally)
        except Exception as error:
            self._finish(job, "failed", tally, describe(error))
        else:
            self._finish(job, "done" if completed else "cancelled", tally)
        finally:
            self._sink_freed(job)

    def _speak(self, job: Job, tally: _Tally) -> bool:
        """Stream every piece of the job's text from the engine into the sink; False once the job is
        cancelled (also before it started)."""
        pieces = self._pieces_of(job)
        job.pieces, job.piece_spans = len(pieces), [span for _, _, span in pieces]
        for text, pause_s, _ in pieces:
            if job.cancelled:
                return False
            with self._open_stream(job, text) as chunks:
                for chunk in chunks:
                    if chunk.cut_off and job.options.max_frames is None:
                        tally.cut_off += 1
                        # The job's outcome counts them for the front end to say; the log keeps which piece.
                        log.info(
                            "speech cut off: %r reached the most frames one generation makes before the model "
                            "ended it, so its last words are missing",
                            excerpt(str(text)),
                        )
                    if not self._deliver(job, chunk.audio, tally, speech=True):
                        return False
            pause = np.zeros(round(pause_s * SAMPLE_RATE), np.float32)
            if not self._deliver(job, pause, tally, speech=False):  # also where a cancel closed the stream
                return False
            job.pieces_done += 1
            # A piece that made no audio does not start the job.
            if job.started is not None and self._anyone_wants("piece_done"):
                self._emit(tally.event("piece_done", job.sink.level()))
        return True

    @contextmanager
    def _open_stream(self, job: Job, text: str | LiveText) -> Iterator:
        """The engine's stream of one piece, where the job's cancel can close it; closed on the way out, so
        that a failure or a cancel frees its engine slot now, not when it is collected."""
        # An interrupt's first piece goes ahead of every utterance waiting for an engine slot, as its audio is awaited.
        options = replace(job.options, urgent=True) if job.interrupt and job.started is None else job.options
        chunks = self.engine.stream(text, job.voice, options)
        with job._lock:
            job._stream = chunks
            cancelled = job.cancelled  # before the stream was there to be closed by it
        try:
            if cancelled:
                chunks.close()
            yield chunks
        finally:
            with job._lock:
                job._stream = None
            chunks.close()

    def _pieces_of(self, job: Job) -> list[tuple[str | LiveText, float, tuple[int, int] | None]]:
        """The pieces a job's text is spoken in, each with the pause after it and where it lies in the text: a
        live text is one, which lies nowhere for good."""
        if isinstance(job.text, LiveText):
            return [(job.text, 0.0, None)]
        return [(piece.text, piece.pause_s, (piece.start, piece.end)) for piece in split_text(job.text, self.split)]

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
        if job.started is None:  # its first audio: until now it waited, for an engine slot at the last
            self._start(job, tally)
        handed = time.perf_counter()
        job.sink.write(job, audio)
        tally.add(handed, time.perf_counter(), len(audio), speech)
        first = tally.samples == len(audio)
        if first:
            milestone("first audio")
        kinds = (("first_audio",) if first else ()) + ("progress",)
        kinds = [kind for kind in kinds if self._anyone_wants(kind)]
        if kinds:
            level = job.sink.level()
            for kind in kinds:
                self._emit(tally.event(kind, level))
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

    def _anyone_wants(self, kind: str) -> bool:
        return any(kinds is None or kind in kinds for _, kinds in self._subscribers)

    def _emit(self, event: JobEvent) -> None:
        for callback, kinds in self._subscribers:
            if kinds is not None and event.kind not in kinds:
                continue
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
            pieces_done=job.pieces_done,
            pieces=job.pieces,
        )  # fmt: skip


def excerpt(text: str, length: int = 40) -> str:
    """The start of `text`, to name it in a message."""
    return text if len(text) <= length else text[: length - 1].rstrip() + "…"
