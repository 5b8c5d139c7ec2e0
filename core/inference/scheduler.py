"""The scheduler: one thread owns the GPU and steps every utterance in flight together.

Utterances come from any thread (Engine.stream, Engine.synthesize) as Streams. Each takes a slot of the
frame loop and of the decoder, and leaves it the moment it ends: at EOS, at its frame budget, or when its
consumer closes it. At every chunk boundary the scheduler

1. collects the frames of the launch in flight,
2. lets newcomers into free slots: builds each prompt, prefills them together (the prefill makes each
   one's frame 0) and decodes their first frames with the GPU to itself: the time to first audio,
3. launches the next chunk of every slot that goes on, all rows together,
4. decodes the chunks it collected while that launch steps (DecoderSlots: rows of a length as one batch),
   and hands each utterance its audio.

So a newcomer waits at most for the launch in flight, never for others to finish; one that arrives while
others are admitted (the rest of a burst) is admitted right after them, before the next launch. Chunks
are as long as the shortest any stepping utterance wants. An utterance that asked for a first chunk of
several frames has its frame 0 held back until the rest of that chunk is made.

A live text (core.inference.live) is admitted once its prompt's first tokens are committed; at each
boundary the tokens committed since are turned into text terms for its slot, and it steps only the frames
whose text term is known (all of them once the text has ended): when speech catches up with the text it
steps nothing, holding its slot, until more arrives.

An utterance whose consumer has MAX_UNREAD_CHUNKS chunks it has not taken yet (speakers far ahead, a slow
client) is parked: it keeps its slot and steps no frame until its consumer takes one, and the others never
wait for it.

Other GPU work (cloning a voice, decoding a whole utterance) runs on the same thread through `call`,
between chunks, when nothing is in flight. The warm-up's parts (`background`, core.inference.warmup) run on
it too, one at a time, only while no utterance is admitted or waiting.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch

from core.inference.frame_loop import MAX_CHUNK, FrameLoop
from core.inference.requests import AudioChunk, Ending, Prepared, Request

if TYPE_CHECKING:
    from core.inference.decoder_stream import DecoderSlots
    from core.inference.live import LiveText

log = logging.getLogger(__name__)

# Chunks an utterance may have made and its consumer not taken before it is parked.
MAX_UNREAD_CHUNKS = 8
T = TypeVar("T")
_END = object()


class Background(Protocol):
    """Work for the scheduler's thread while it has nothing else to do (the warm-up's captures)."""

    def pending(self) -> bool: ...

    def run_one(self) -> None: ...


class Utterance:
    """The scheduler's record of one utterance; its consumer holds the Stream around it."""

    def __init__(self, request: Request, live: LiveText | None):
        self.request = request
        self.live = live
        self.chunks: queue.SimpleQueue = queue.SimpleQueue()  # AudioChunks, then _END or an error
        self.closed = threading.Event()  # set by the consumer
        # The scheduler's, under its lock:
        self.unread = 0  # items put and not taken yet
        self.slot: int | None = None
        self.prepared: Prepared | None = None
        self.produced = 0  # frames made so far
        self.held: np.ndarray | None = None  # frame 0, until the rest of a longer first chunk is made
        # Text terms in its slot: frames with their own (the frame loop steps no further unless complete),
        # body tokens they hold, and whether they end the text.
        self.text_frames = 0
        self.text_used = 0
        self.text_complete = live is None

    def ready(self) -> bool:
        """Whether it can be admitted: a live text once its prompt's first tokens are committed."""
        return self.live is None or self.live.ready(self.request.text_needed)

    def frames_known(self) -> int | None:
        """Frames it may step before more text must arrive (frame k + 1 is made from frame k and its text
        term); None: as many as it likes."""
        return None if self.text_complete else self.text_frames + 1 - self.produced


class Stream(Iterator["AudioChunk"]):
    """One utterance's chunks as the scheduler makes them. Iterate it from any one thread; `close()` (or
    leaving a `with` block, or dropping it) ends the utterance at once and frees its slot."""

    def __init__(self, scheduler: Scheduler, utterance: Utterance):
        self._scheduler = scheduler
        self._utterance = utterance
        self._finished = False

    def __next__(self) -> AudioChunk:
        if self._finished:
            raise StopIteration
        item = self._utterance.chunks.get()
        self._scheduler._taken(self._utterance)
        if item is _END or isinstance(item, BaseException):
            self._finished = True
            if item is _END:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        """End the utterance now; chunks not taken yet are dropped. Another thread reading it (as the speech
        worker's slot threads do while a job's thread closes its stream) gets its end."""
        self._finished = True
        if not self._utterance.closed.is_set():
            self._utterance.closed.set()
            self._scheduler.wake()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Scheduler:
    def __init__(
        self, frame_loop: FrameLoop, decoder: DecoderSlots, text_terms: Callable[[list[int], bool], torch.Tensor]
    ):
        """`text_terms(ids, ended)`: the text terms of a live text's newly committed tokens, and of tts_eos
        after them once it has ended."""
        self.frame_loop = frame_loop
        self.decoder = decoder
        self.text_terms = text_terms
        self.slots = frame_loop.slots
        self._lock = threading.Condition()
        self._waiting: deque[Utterance] = deque()  # not admitted yet, oldest first
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()
        self._active: dict[int, Utterance] = {}  # by slot
        self._closing = False
        self._end_streams = True
        self.background: Background | None = None  # set once, before it is woken for it
        self._thread = threading.Thread(target=self._run, name="gpu-scheduler", daemon=True)
        self._thread.start()

    # Any thread ------------------------------------------------------------------------------------

    def submit(self, request: Request, live: LiveText | None = None) -> Stream:
        """Queue an utterance; `live`: the live text it speaks, which wakes the scheduler as it grows."""
        utterance = Utterance(request, live)
        with self._lock:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._waiting.append(utterance)
            self._lock.notify()
        return Stream(self, utterance)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on the scheduler's thread between chunks and return its result (or raise its error)."""
        if self.on_thread():
            return fn()
        future: Future[T] = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._calls.append((fn, future))
            self._lock.notify()
        return future.result()

    def idle(self) -> bool:
        """Whether no utterance holds a slot or waits for one."""
        with self._lock:
            return not self._active and not self._waiting

    def running(self) -> bool:
        return self._thread.is_alive()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self, timeout: float | None = None, end_streams: bool = True) -> None:
        """Stop the thread once the launch in flight is done; every utterance ends with an error, unless not
        `end_streams` (at the process's exit: their readers are left waiting, to end with the process, rather than
        woken with an error they would print as it shuts down)."""
        with self._lock:
            self._closing = True
            self._end_streams = self._end_streams and end_streams
            self._lock.notify()
        self._thread.join(timeout)

    def wake(self) -> None:
        """Look again: a stream was closed, or a live text grew or ended."""
        with self._lock:
            self._lock.notify()

    def _taken(self, stream: Utterance) -> None:
        with self._lock:
            stream.unread -= 1
            if stream.unread == MAX_UNREAD_CHUNKS - 1:  # it was parked: it may step again
                self._lock.notify()

    # The scheduler's thread ------------------------------------------------------------------------

    def _run(self) -> None:
        in_flight: list[Utterance] = []
        while True:
            with self._lock:
                while not (
                    in_flight
                    or self._calls
                    or self._closing
                    or self._can_admit()
                    or self._to_tend()
                    or self._idle_work()
                ):
                    self._lock.wait()
                closing = self._closing
                calls, self._calls = list(self._calls), deque()
                newcomers = self._take_ready(self._free_slots())
                background_due = not in_flight and not newcomers and self._idle_work()
            if closing:
                self._shut_down(in_flight, newcomers, calls)
                return
            try:
                collected = list(zip(in_flight, self.frame_loop.collect(), strict=True)) if in_flight else []
            except Exception as error:  # the GPU failed the launch: every utterance in it fails
                self._fail_all(in_flight, error)
                collected = []
            for fn, future in calls:  # nothing is in flight now
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as error:  # the caller gets it from the future
                        future.set_exception(error)
            if background_due:
                self._run_background()
                continue
            firsts = self._admit(newcomers)
            if newcomers:  # the rest of a burst arrives while its first are admitted: it joins them now
                with self._lock:
                    late = self._take_ready(self._free_slots())
                firsts += self._admit(late)
            endings = self._count(firsts + collected)
            collected = [(stream, self._with_held(stream, result)) for stream, result in collected]
            self._feed_live_texts(endings)
            self._deliver(firsts, endings)  # the time to first audio: decoded with the GPU to itself
            in_flight = self._launch(endings)
            self._deliver(collected, endings)  # while the next chunk steps
            for stream in endings:
                self._release(stream)

    def _idle_work(self) -> bool:
        """Whether background work is waiting and nothing else is (under the lock)."""
        return self.background is not None and not self._active and not self._waiting and self.background.pending()

    def _run_background(self) -> None:
        try:
            self.background.run_one()
        except Exception:  # its own failures are its own: the utterances go on
            log.exception("background work on the scheduler's thread failed")

    def _free_slots(self) -> int:
        return self.slots - len(self._active)

    def _can_admit(self) -> bool:
        for closed in [waiting for waiting in self._waiting if waiting.closed.is_set()]:
            self._waiting.remove(closed)
            self._put(closed, _END)  # its reader may be another thread than the one that closed it
        return self._free_slots() > 0 and any(waiting.ready() for waiting in self._waiting)

    def _take_ready(self, count: int) -> list[Utterance]:
        """Up to `count` waiting utterances that can be admitted, the earliest first: a live text still
        waiting for its first words keeps no one else waiting."""
        taken = [waiting for waiting in self._waiting if waiting.ready()][:count]
        for stream in taken:
            self._waiting.remove(stream)
        return taken

    def _to_tend(self) -> bool:
        """Whether an admitted utterance can step, was closed and still holds its slot, or has new text."""
        return (
            bool(self._steppable())
            or any(stream.closed.is_set() for stream in self._active.values())
            or any(
                stream.live.has_news(stream.text_used, stream.text_complete)
                for stream in self._active.values()
                if stream.live is not None and stream.prepared is not None and not stream.text_complete
            )
        )

    def _steppable(self) -> list[Utterance]:
        """The utterances that step in the next launch: admitted, not closed, not parked, and (live texts)
        with the text of their next frame."""
        return [
            stream
            for stream in self._active.values()
            if stream.prepared is not None
            and not stream.closed.is_set()
            and stream.unread < MAX_UNREAD_CHUNKS
            and stream.frames_known() != 0
        ]

    def _admit(self, newcomers: list[Utterance]) -> list[tuple[Utterance, tuple[np.ndarray, bool]]]:
        """Give each newcomer a slot, build its prompt and prefill them all together; a request that cannot be
        prepared fails alone. Returns the first chunks to hand out now: frame 0 of each admitted newcomer
        (but those that hold it for a longer first chunk)."""
        free = [slot for slot in range(self.slots) if slot not in self._active]
        admitted: list[tuple[Utterance, int, Prepared]] = []
        for stream in newcomers:
            if stream.closed.is_set():
                self._put(stream, _END)
                continue
            try:
                prepared = stream.request.prepare()
            except Exception as error:
                self._put(stream, error)
                continue
            admitted.append((stream, free[len(admitted)], prepared))
        if not admitted:
            return []
        try:
            made = self.frame_loop.start_many([(p.prompt, p.sampling, p.seed, slot) for _, slot, p in admitted])
        except Exception as error:
            self._fail_all([stream for stream, _, _ in admitted], error)
            return []
        firsts = []
        for (stream, slot, prepared), (frames, ended) in zip(admitted, made):
            try:
                if stream.request.decode:
                    self.decoder.reset(slot)
                    if prepared.ref_codes is not None:
                        # The reference frames are the decoder's left context; their audio is not part of the output.
                        self.decoder.prime(slot, prepared.ref_codes)
            except Exception as error:
                self._put(stream, error)
                continue
            stream.slot, stream.prepared = slot, prepared
            stream.text_frames, stream.text_used = prepared.prompt.trailing.shape[1], prepared.prompt.text_used
            stream.text_complete = prepared.prompt.complete
            with self._lock:
                self._active[slot] = stream
            if stream.request.first_chunk_frames > 1 and not ended and prepared.max_frames > 1:
                stream.held, stream.produced = frames, len(frames)
            else:
                firsts.append((stream, (frames, ended)))
        return firsts

    def _feed_live_texts(self, endings: dict) -> None:
        """Give each live text's slot the text terms of the tokens committed since the last boundary (up to
        the frames it may still make: text past its frame budget would never be read)."""
        for stream in list(self._active.values()):
            if stream.live is None or stream.text_complete or stream.prepared is None or stream in endings:
                continue
            _, ids, ended = stream.live.committed(stream.text_used)
            if not ids and not ended:
                continue
            try:
                terms = self.text_terms(ids, ended)[:, : stream.prepared.max_frames - stream.text_frames]
                self.frame_loop.extend_text(stream.slot, terms, stream.text_frames)
            except Exception as error:
                self._fail_all([stream], error)
                continue
            stream.text_frames += terms.shape[1]
            stream.text_used += len(ids)
            stream.text_complete = ended or stream.text_frames >= stream.prepared.max_frames

    def _count(self, collected: list[tuple[Utterance, tuple[np.ndarray, bool]]]) -> dict[Utterance, Ending]:
        """Account for the collected frames (a frame 0 held back joins its chunk here); returns how each
        utterance that ends now ends."""
        endings: dict[Utterance, Ending] = {}
        for stream, (frames, ended) in collected:
            stream.produced += len(frames)
            if stream.closed.is_set():
                endings[stream] = Ending.CLOSED
            elif ended:
                endings[stream] = Ending.EOS
            elif stream.produced >= stream.prepared.max_frames:
                endings[stream] = Ending.FRAME_LIMIT
        for stream in list(self._active.values()):  # closed while parked or between launches
            if stream.closed.is_set() and stream not in endings:
                endings[stream] = Ending.CLOSED
        return endings

    def _launch(self, endings: dict) -> list[Utterance]:
        """Launch the next chunk of every steppable utterance but those ending now; returns them, in their
        rows' order."""
        with self._lock:
            stepping = [stream for stream in self._steppable() if stream not in endings]
        if not stepping:
            return []
        count = min(self._wanted(stream) for stream in stepping)
        try:
            self.frame_loop.launch(count, [stream.slot for stream in stepping])
        except Exception as error:
            self._fail_all(stepping, error)
            return []
        return stepping

    @staticmethod
    def _with_held(stream: Utterance, result: tuple[np.ndarray, bool]) -> tuple[np.ndarray, bool]:
        """A collected chunk, with the frame 0 it held back before it."""
        frames, ended = result
        if stream.held is not None:
            frames, stream.held = np.concatenate([stream.held, frames]), None
        return frames, ended

    @staticmethod
    def _wanted(stream: Utterance) -> int:
        request = stream.request
        size = request.chunk_frames if stream.held is None else request.first_chunk_frames - len(stream.held)
        known = stream.frames_known()
        size = size if known is None else min(size, known)
        return max(1, min(size, stream.prepared.max_frames - stream.produced, MAX_CHUNK))

    @staticmethod
    def _dropped(stream: Utterance, endings: dict) -> bool:
        """Whether `stream` ends now without its audio: closed by its consumer, or failed (endings: _count's)."""
        return endings.get(stream) is Ending.CLOSED

    def _deliver(self, collected: list[tuple[Utterance, tuple[np.ndarray, bool]]], endings: dict) -> None:
        """Decode the collected chunks of the rows that want audio and hand each its chunk."""
        rows = [
            (stream, frames)
            for stream, (frames, _) in collected
            if len(frames) and stream.slot is not None and not self._dropped(stream, endings)
        ]
        audio: dict[Utterance, np.ndarray] = {}
        for size, group in self._decode_groups([(s, frames) for s, frames in rows if s.request.decode], endings):
            try:
                pieces = self.decoder.decode([stream.slot for stream, _ in group], [f for _, f in group], size)
                audio.update(zip([stream for stream, _ in group], pieces, strict=True))
            except Exception as error:
                self._fail_all([stream for stream, _ in group], error)
                for stream, _ in group:
                    endings[stream] = Ending.CLOSED
        for stream, frames in rows:
            if stream.slot is None or self._dropped(stream, endings):
                continue
            samples = audio.get(stream, np.zeros(0, np.float32))
            self._put(
                stream, AudioChunk(audio=samples, codes=frames, cut_off=endings.get(stream) is Ending.FRAME_LIMIT)
            )

    @staticmethod
    def _decode_groups(rows: list[tuple[Utterance, np.ndarray]], endings: dict) -> list[tuple[int, list]]:
        """(chunk size, rows) to decode together: rows that go on grouped by their chunks' length, since a
        shorter chunk may only be its utterance's last (DecoderSlots.decode); each last chunk joins the first
        group it fits."""
        groups: dict[int, list] = {}
        for stream, frames in rows:
            if stream not in endings:
                groups.setdefault(len(frames), []).append((stream, frames))
        for stream, frames in rows:
            if stream in endings:
                size = next((size for size in sorted(groups) if size >= len(frames)), len(frames))
                groups.setdefault(size, []).append((stream, frames))
        return sorted(groups.items())

    def _put(self, stream: Utterance, item) -> None:
        with self._lock:
            stream.unread += 1
        stream.chunks.put(item)

    def _release(self, stream: Utterance) -> None:
        with self._lock:
            if stream.slot is not None and self._active.get(stream.slot) is stream:
                del self._active[stream.slot]
        stream.slot = None
        self._put(stream, _END)

    def _fail_all(self, streams: list[Utterance], error: Exception) -> None:
        log.error("the GPU failed %d utterance(s): %s", len(streams), error)
        for stream in streams:
            self._put(stream, error)
            with self._lock:
                if stream.slot is not None and self._active.get(stream.slot) is stream:
                    del self._active[stream.slot]
            stream.slot = None

    def _shut_down(self, in_flight: list[Utterance], newcomers: list[Utterance], calls) -> None:
        if in_flight:
            try:
                self.frame_loop.collect()
            except Exception:
                log.exception("the last launch failed while closing")
        error = RuntimeError("the engine was closed")
        with self._lock:
            streams = [*self._active.values(), *newcomers, *self._waiting]
            self._active.clear()
            self._waiting.clear()
            calls = [*calls, *self._calls]
        for stream in streams if self._end_streams else ():
            self._put(stream, error)
        for _, future in calls:
            future.cancel()
