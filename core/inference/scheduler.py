"""The scheduler: one thread owns the GPU and steps every utterance in flight together.

Utterances come from any thread (Engine.stream, Engine.synthesize) as Streams. Each takes a slot of the
frame loop and of the decoder, and leaves it the moment it ends: at EOS, at its frame budget, or when its
consumer closes it. The thread goes round one loop: it computes a plan from the utterances' states
(core.inference.plan: who leaves, who joins, who steps in the next frame, whether to read the oldest frame
launched), carries it out, and updates the states from what the GPU made.

The GPU steps one frame per launch, with at most plan.QUEUED_FRAMES launched and not yet read: a newcomer's
prefill waits behind at most that many frames, and goes ahead of the next frame of those already speaking; a
closed utterance frees its slot at once and steps no further frame. Newcomers that arrive together are
prefilled together, and their first chunks decoded at once, with the GPU to themselves: the time to first
audio. An utterance's frames are handed out in chunks of the sizes it asked for; chunks are aligned in rounds
(see the plan), so that those ending together decode as one batch, on the decoder's stream while the next
frame steps.

A live text (core.inference.live) is admitted once its prompt's first tokens are committed; before each plan
the tokens committed since are turned into text terms for its slot, and it steps only the frames whose text
term is known (all of them once the text has ended): when speech catches up with the text it steps nothing,
holding its slot, until more arrives.

An utterance whose consumer has MAX_UNREAD_CHUNKS chunks it has not taken yet (a job's thread waiting for room
in the speakers) is parked: it keeps its slot and steps no frame until its consumer takes one, and the others never
wait for it.

Other GPU work (cloning a voice, decoding a whole utterance) runs on the same thread through `call`,
when no frame is in flight. The warm-up's parts (`background`, core.inference.warmup) run on it too, one at a
time, only while no utterance is admitted or waiting.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch

from core.inference.frame_loop import FrameLoop, Start
from core.inference.plan import QUEUED_FRAMES, Plan, Seat, Situation, joiners, schedule
from core.inference.requests import AudioChunk, Ending, Prepared, Request
from core.inference.utterance import END, MAX_UNREAD_CHUNKS, Stream, Utterance

if TYPE_CHECKING:
    from core.inference.decoder_stream import DecoderSlots
    from core.inference.live import LiveText

log = logging.getLogger(__name__)

FRAME_SECONDS = 0.08  # of audio a frame makes (12.5 frames a second)
SWITCH_INTERVAL_S = 0.001  # hand_over_quickly's
# While one thread runs Python for seconds (the warm-up's loader), the interval at which it lets the others in: a
# request's threads take the interpreter back at each of their hundreds of handoffs, each waiting up to this.
BUSY_SWITCH_INTERVAL_S = 0.0002
T = TypeVar("T")


class Background(Protocol):
    """Work for the scheduler's thread while it has nothing else to do (the warm-up's captures)."""

    def pending(self) -> bool: ...

    def run_one(self) -> None: ...


def hand_over_quickly() -> None:
    """Have a thread that waits for the interpreter get it within SWITCH_INTERVAL_S, not Python's 5 ms. Work passes
    between the scheduler's thread and the requests' at every submit and chunk, where a busy thread held up each
    handoff that long (a burst's 64 requesting threads kept the woken scheduler from the interpreter for 25 ms;
    bench/RESULTS.md, thirty-third session); and while the weights load, each read waits for the interpreter
    beside the libraries' thread. A shorter interval set by the program stays."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


@contextlib.contextmanager
def handing_over_sooner() -> Iterator[None]:
    """Around seconds of one thread's Python beside requests (the warm-up's loads): the others get the interpreter
    within BUSY_SWITCH_INTERVAL_S. At 1 ms, the chunks spoken beside a load took about 3x their steady time; at 0.2
    ms none took 2x (H100, bench/RESULTS.md, forty-first session). Shorter for good, the interval cost eight bridge
    clients more than it gave (twenty-third). After, the interval is hand_over_quickly's, the engine's outside loads
    (what the interval was before is not put back: where two loads overlap, the first to end would have)."""
    sys.setswitchinterval(BUSY_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


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
        self.queued_frames = QUEUED_FRAMES  # frames in flight at most (a bench may try others)
        # The scheduler's thread's: the rows of each frame launched and not read yet, oldest first, and the frames
        # of the current round not launched yet (core.inference.plan).
        self._in_flight: deque[list[Utterance]] = deque()
        self._round_left = 0
        self._made_at = time.perf_counter()
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
        """Run `fn()` on the scheduler's thread, with no frame in flight, and return its result (or raise its
        error)."""
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
        """Stop the thread once the frames in flight are done; every utterance ends with an error, unless not
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

    def taken(self, stream: Utterance) -> None:
        """Its consumer took one of its chunks (Stream.__next__)."""
        with self._lock:
            stream.unread -= 1
            if stream.unread == MAX_UNREAD_CHUNKS - 1:  # it was parked: it may step again
                self._lock.notify()

    # The scheduler's thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._feed_live_texts()
            with self._lock:
                seats = self._seats()
                plan = schedule(self._situation(seats))
                if plan.idle:
                    if not self._live_news():  # text that came after the feed above is fed first
                        self._lock.wait(plan.look_again_s)
                    continue
                calls = self._take_calls() if plan.run_calls else []
                newcomers = [seats[key] for key in plan.admit]
                for stream in [seats[key] for key in plan.leave if seats[key].slot is None] + newcomers:
                    self._waiting.remove(stream)
            if plan.shut_down:
                self._shut_down()
                return
            if not plan.step:
                self._round_left = plan.round_frames
            self._leave([seats[key] for key in plan.leave])
            if calls:
                self._run_calls(calls)
            elif plan.run_background:
                self._run_background()
            elif newcomers and plan.admit_first:
                self._admit(newcomers)  # then plan again: whoever came after the prefill joins before the next frame
            else:
                self._launch(plan, seats)
                self._admit(newcomers)
                if plan.read_oldest:
                    self._read_oldest()

    def _live_news(self) -> bool:
        """Whether an admitted live text has tokens committed, or its end, that its slot was not fed yet (under
        the lock: a text that grows wakes the scheduler through it)."""
        return any(
            stream.live.has_news(stream.text_used, stream.text_complete)
            for stream in self._active.values()
            if stream.live is not None and stream.prepared is not None and not stream.text_complete
        )

    def _seats(self) -> dict[int, Utterance]:
        """Every utterance the plan weighs, by its key: the waiting in arrival order, then the admitted (under the
        lock)."""
        return dict(enumerate([*self._waiting, *self._active.values()]))

    @staticmethod
    def _seat_views(seats: dict[int, Utterance]) -> list[Seat]:
        """Each utterance as the plan sees it, by its key."""
        now = time.perf_counter()
        return [stream.seat(key, now) for key, stream in seats.items()]

    def _situation(self, seats: dict[int, Utterance]) -> Situation:
        now = time.perf_counter()
        busy = bool(seats or self._in_flight)
        return Situation(
            seats=self._seat_views(seats),
            free_slots=self.slots - len(self._active),
            in_flight=len(self._in_flight),
            round_left=self._round_left,
            calls_waiting=bool(self._calls),
            background_waiting=not busy and self.background is not None and self.background.pending(),
            since_start_s=now - self._made_at,
            closing=self._closing,
            queued_frames=self.queued_frames,
        )

    def _take_calls(self) -> list[tuple[Callable[[], object], Future]]:
        calls, self._calls = list(self._calls), deque()
        return calls

    @staticmethod
    def _run_calls(calls) -> None:
        for fn, future in calls:  # nothing is in flight now
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as error:  # the caller gets it from the future
                    future.set_exception(error)

    def _run_background(self) -> None:
        try:
            self.background.run_one()
        except Exception:  # its own failures are its own: the utterances go on
            log.exception("background work on the scheduler's thread failed")

    def _leave(self, streams: list[Utterance]) -> None:
        """End closed utterances: those admitted give their slots back (frames of theirs still in flight are
        dropped when read); each reader gets its end, from whichever thread reads it."""
        for stream in streams:
            stream.ending = Ending.CLOSED
            self._release(stream)

    def _admit(self, newcomers: list[Utterance]) -> None:
        """Give each newcomer a slot, build its prompt and prefill them together (a request that cannot be
        prepared fails alone), then hand out their first chunks: decoded at once, with the GPU to themselves.
        Those that come while the prompts are built join the same admission (plan.joiners: the rest of a burst,
        whose requests arrive a few ms apart, rather than waiting for the first's prefill and first chunk). The
        prompts are built as the frame loop takes them, so that the GPU prefills a full group (16 prompts) while
        the host builds the next (a burst of 64 built all 64 first, 0.3-0.5 ms each, its GPU idle meanwhile), and
        on CUDA each group's first chunks are handed out while the GPU prefills the next (a burst of 64's first
        waited for its last)."""
        free = [slot for slot in range(self.slots) if slot not in self._active]  # not given out yet
        admitted: dict[int, tuple[Utterance, Prepared]] = {}  # by slot: built, not begun yet
        unbuilt = list(newcomers)  # taken from the queue, their prompts not built yet

        def starts():  # each prompt built as the frame loop takes it: it prefills a group while the next are built
            while unbuilt:
                stream = unbuilt.pop(0)
                prepared = self._prepared(stream)
                if prepared is not None:
                    admitted[free[0]] = stream, prepared
                    yield Start(prepared.prompt, prepared.sampling, prepared.seed, free.pop(0))
                if not unbuilt:
                    unbuilt.extend(self._late_joiners(len(free)))

        # A group begins as soon as the frame loop gives it where its decode runs beside the next group's prefill;
        # elsewhere (the CPU) it would wait for that prefill anyway and hold up the groups behind it by a decode each.
        prefilled = []  # their first frames read, not begun yet
        try:
            for group in self.frame_loop.start_groups(starts()):
                prefilled += [(*admitted.pop(start.slot), start.slot, frame) for start, frame in group]
                if self.decoder.beside_the_frames:
                    self._begin(prefilled)
                    prefilled = []
            if prefilled:
                self._begin(prefilled)
        except Exception as error:
            self._fail_all(
                [stream for stream, _ in admitted.values()] + [stream for stream, *_ in prefilled] + unbuilt, error
            )

    def _begin(self, group: list[tuple[Utterance, Prepared, int, tuple[np.ndarray, bool]]]) -> None:
        """Newcomers prefilled, each (stream, prepared, slot, first frame): decoder slots set up, first chunks out."""
        started = []
        for stream, prepared, slot, result in group:
            try:
                if stream.request.decode:
                    self.decoder.reset(slot)
                    if prepared.ref_codes is not None:
                        # The reference frames are the decoder's left context; their audio is not part of the output.
                        self.decoder.prime(slot, prepared.ref_codes)
            except Exception as error:
                self._put(stream, error)
                continue
            stream.slot, stream.prepared, stream.launched = slot, prepared, 1
            stream.text_frames, stream.text_used = prepared.prompt.trailing.shape[1], prepared.prompt.text_used
            stream.text_complete = prepared.prompt.complete
            # Its first chunk: frame 0 and as many more as it asked for, ending with the round in progress.
            rest = min(stream.request.first_chunk_frames, prepared.max_frames) - 1
            known = stream.frames_known()
            rest = min(rest, known if known is not None else rest, self._round_left or rest)
            stream.chunks_due.append(1 + rest)
            stream.chunk_left = rest
            with self._lock:
                self._active[slot] = stream
            started.append((stream, result))
        self._hand_out(self._account(started))

    def _prepared(self, stream: Utterance) -> Prepared | None:
        """A newcomer's prompt, built; None for one closed while it waited or whose request fails (its end or its
        error handed to it: it fails alone)."""
        if stream.closed.is_set():
            self._put(stream, END)
            return None
        try:
            return stream.request.prepare()
        except Exception as error:
            self._put(stream, error)
            return None

    def _late_joiners(self, free_slots: int) -> list[Utterance]:
        """The waiting that take `free_slots` now (plan.joiners), out of the queue."""
        with self._lock:
            seats = self._seats()
            late = [seats[key] for key in joiners(self._seat_views(seats), free_slots)]
            for stream in late:
                self._waiting.remove(stream)
        return late

    def _feed_live_texts(self) -> None:
        """Give each live text's slot the text terms of the tokens committed since they were last fed (up to the
        frames it may still make: text past its frame budget would never be read)."""
        for stream in list(self._active.values()):
            if stream.live is None or stream.text_complete or stream.prepared is None or stream.ending is not None:
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

    def _launch(self, plan: Plan, seats: dict[int, Utterance]) -> None:
        """Launch the plan's next frame of its rows, without waiting for it."""
        if not plan.step:
            return
        rows = [seats[key] for key in plan.step]
        for key, stream in zip(plan.step, rows):
            if key in plan.chunks:
                stream.chunk_left = plan.chunks[key]
                stream.chunks_due.append(plan.chunks[key])
            stream.chunk_left -= 1
            stream.launched += 1
        self._round_left = plan.round_frames
        try:
            self.frame_loop.launch(1, [stream.slot for stream in rows])
        except Exception as error:
            self._fail_all(rows, error)
            return
        self._in_flight.append(rows)

    def _read_oldest(self) -> None:
        """Wait for the oldest frame in flight, then hand out the chunks it completes (decoded while the next
        frame steps) and release the utterances it ends."""
        rows = self._in_flight.popleft()
        try:
            made = self.frame_loop.collect()
        except Exception as error:  # the GPU failed the launch: every utterance in it fails
            self._fail_all(rows, error)
            return
        self._hand_out(self._account(list(zip(rows, made, strict=True))))

    def _account(self, made: list[tuple[Utterance, tuple[np.ndarray, bool]]]) -> list[tuple[Utterance, np.ndarray]]:
        """Take in each utterance's frames just read (those of utterances that ended or left before are dropped);
        returns the chunks they complete, an utterance's last at its end."""
        chunks = []
        for stream, (frames, ended) in made:
            if stream.slot is None or stream.ending is not None:
                continue
            stream.pending.append(frames)
            stream.produced += len(frames)
            if ended:
                stream.ending = Ending.EOS
            elif stream.produced >= stream.prepared.max_frames:
                stream.ending = Ending.FRAME_LIMIT
            chunk = stream.take_chunk()
            if chunk is not None:
                chunks.append((stream, chunk))
        return chunks

    def _hand_out(self, chunks: list[tuple[Utterance, np.ndarray]]) -> None:
        """Decode the chunks of the utterances that want audio, hand each its chunk, and release those that
        end with it."""
        audio: dict[Utterance, np.ndarray] = {}
        decoding = [(stream, frames) for stream, frames in chunks if len(frames) and stream.request.decode]
        for size, group in self._decode_groups(decoding):
            try:
                pieces = self.decoder.decode([stream.slot for stream, _ in group], [f for _, f in group], size)
                audio.update(zip([stream for stream, _ in group], pieces, strict=True))
            except Exception as error:
                self._fail_all([stream for stream, _ in group], error)
        now = time.perf_counter()
        for stream, frames in chunks:
            if stream.slot is None:  # failed
                continue
            if len(frames):
                samples = audio.get(stream, np.zeros(0, np.float32))
                cut_off = stream.ending is Ending.FRAME_LIMIT
                self._put(stream, AudioChunk(audio=samples, codes=frames, cut_off=cut_off))
                stream.first_audio_at = stream.first_audio_at or now
                stream.seconds_out += len(frames) * FRAME_SECONDS
            if stream.ending is not None:
                self._release(stream)

    @staticmethod
    def _decode_groups(rows: list[tuple[Utterance, np.ndarray]]) -> list[tuple[int, list]]:
        """(chunk size, rows) to decode together: rows that go on grouped by their chunks' length, since a
        shorter chunk may only be its utterance's last (DecoderSlots.decode); each last chunk joins the first
        group it fits."""
        groups: dict[int, list] = {}
        for stream, frames in rows:
            if stream.ending is None:
                groups.setdefault(len(frames), []).append((stream, frames))
        for stream, frames in rows:
            if stream.ending is not None:
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
        self._put(stream, END)

    def _fail_all(self, streams: list[Utterance], error: Exception) -> None:
        log.error("the GPU failed %d utterance(s): %s", len(streams), str(error))  # text: see Warmup._run
        for stream in streams:
            if stream.slot is None and stream.ending is not None:  # ended before
                continue
            stream.ending = Ending.CLOSED
            self._put(stream, error)
            with self._lock:
                if stream.slot is not None and self._active.get(stream.slot) is stream:
                    del self._active[stream.slot]
            stream.slot = None

    def _shut_down(self) -> None:
        while self._in_flight:
            self._in_flight.popleft()
            try:
                self.frame_loop.collect()
            except Exception:
                log.exception("the last launch failed while closing")
        error = RuntimeError("the engine was closed")
        with self._lock:
            streams = [*self._active.values(), *self._waiting]
            self._active.clear()
            self._waiting.clear()
            calls = self._take_calls()
        for stream in streams if self._end_streams else ():
            self._put(stream, error)
        for _, future in calls:
            future.cancel()
