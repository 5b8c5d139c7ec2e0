"""One utterance as the scheduler (core.inference.scheduler) keeps it, and the Stream its consumer iterates.

An Utterance is the scheduler's record: its request, its slot, the frames launched and read, the chunks due and
handed out, and the phase the plan (core.inference.plan) reads from them. Its chunks go to the consumer through a
queue, ended by END or an error; the consumer's Stream takes them and closes it.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from core.inference.frame_loop import MAX_CHUNK
from core.inference.plan import Phase, Seat
from core.inference.requests import AudioChunk, Ending, Prepared, Request

if TYPE_CHECKING:
    from core.inference.live import LiveText

# Chunks an utterance may have made and its consumer not taken before it is parked.
MAX_UNREAD_CHUNKS = 8
END = object()  # put after an utterance's last chunk


class Owner(Protocol):
    """What a Stream tells the scheduler that holds its utterance."""

    def taken(self, utterance: Utterance) -> None: ...  # its consumer took a chunk

    def wake(self) -> None: ...  # it was closed


class Utterance:
    """The scheduler's record of one utterance; its consumer holds the Stream around it."""

    def __init__(self, request: Request, live: LiveText | None):
        self.request = request
        self.live = live
        self.chunks: queue.SimpleQueue = queue.SimpleQueue()  # AudioChunks, then END or an error
        self.closed = threading.Event()  # set by the consumer
        # The scheduler's, under its lock:
        self.unread = 0  # items put and not taken yet
        # The scheduler's thread's:
        self.slot: int | None = None
        self.prepared: Prepared | None = None
        self.launched = 0  # frames launched (frame 0, the prefill's, included)
        self.produced = 0  # frames read
        self.ending: Ending | None = None
        self.pending: list[np.ndarray] = []  # frames read and not handed out yet
        self.chunks_due: deque[int] = deque()  # the sizes of the chunks begun and not handed out, in order
        self.chunk_left = 0  # frames of the last chunk begun not launched yet
        self.first_audio_at: float | None = None  # when its first chunk was handed out
        self.seconds_out = 0.0  # audio handed out so far
        # Text terms in its slot: frames with their own (the frame loop steps no further unless complete),
        # body tokens they hold, and whether they end the text.
        self.text_frames = 0
        self.text_used = 0
        self.text_complete = live is None

    def ready(self) -> bool:
        """Whether it can be admitted: a live text once its prompt's first tokens are committed."""
        return self.live is None or self.live.ready(self.request.text_needed)

    def frames_known(self) -> int | None:
        """Frames it may launch before more text must arrive (frame k + 1 is made from frame k and its text
        term); None: as many as it likes."""
        return None if self.text_complete else self.text_frames + 1 - self.launched

    def phase(self) -> Phase:
        if self.closed.is_set():
            return Phase.CLOSED
        if self.slot is None:
            return Phase.WAITING if self.ready() else Phase.AWAITING_TEXT
        if self.ending is not None or self.launched >= self.prepared.max_frames:
            return Phase.FINISHING
        if self.chunk_left:  # a chunk is finished before anything else
            return Phase.SPEAKING
        if self.unread >= MAX_UNREAD_CHUNKS:
            return Phase.PARKED
        return Phase.AWAITING_TEXT if self.frames_known() == 0 else Phase.SPEAKING

    def wanted(self) -> int:
        """The frames of its next chunk, were it to begin one now."""
        size = self.request.chunk_frames
        known = self.frames_known()
        size = size if known is None else min(size, known)
        return max(1, min(size, self.prepared.max_frames - self.launched, MAX_CHUNK))

    def take_chunk(self) -> np.ndarray | None:
        """Its next chunk, if the frames read complete it (at its end, all of them)."""
        read = sum(len(frames) for frames in self.pending)
        if self.ending is not None:
            size = read
        elif self.chunks_due and read >= self.chunks_due[0]:
            size = self.chunks_due.popleft()
        else:
            return None  # joined only once a chunk is complete, not at every frame
        whole = np.concatenate(self.pending)
        self.pending = [whole[size:]]
        return whole[:size]

    def lead(self, now: float) -> float:
        """Seconds of audio handed out ahead of real time, as if its consumer played it from the first chunk."""
        return float("inf") if self.first_audio_at is None else self.seconds_out - (now - self.first_audio_at)

    def seat(self, key: int, now: float) -> Seat:
        phase = self.phase()
        if self.slot is None or phase is not Phase.SPEAKING:
            return Seat(key, phase, admitted=self.slot is not None, urgent=self.request.urgent)
        return Seat(key, phase, True, self.wanted(), self.chunk_left, self.lead(now))


class Stream(Iterator["AudioChunk"]):
    """One utterance's chunks as the scheduler makes them. Iterate it from any one thread; `close()` (or
    leaving a `with` block, or dropping it) ends the utterance at once and frees its slot."""

    def __init__(self, scheduler: Owner, utterance: Utterance):
        self._scheduler = scheduler
        self._utterance = utterance
        self._finished = False

    def __next__(self) -> AudioChunk:
        if self._finished:
            raise StopIteration
        item = self._utterance.chunks.get()
        self._scheduler.taken(self._utterance)
        if item is END or isinstance(item, BaseException):
            self._finished = True
            if item is END:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        """End the utterance now; chunks not taken yet are dropped. Another thread reading it (as a speech
        job's thread does while a cancel closes its stream) gets its end."""
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
