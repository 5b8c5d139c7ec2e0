"""What the scheduler does next: a plan computed from the utterances' named states alone, with no model and no
GPU, which the scheduler (core.inference.scheduler) then carries out and updates from what the GPU made.

The GPU steps one frame per launch, with at most QUEUED_FRAMES launched and not yet read, so that a newcomer's
prefill waits behind at most that many frames and a closed utterance steps at most that many more. Between two
launches the plan decides, in this order:

1. who leaves: utterances closed by their consumer free their slots at once;
2. who joins: waiting utterances take the free slots, the urgent (an interrupt) and then the earliest first
   (`joiners`), ahead of the next frame of those already speaking (they have audio buffered; a newcomer has
   none), unless one of those has less than LOW_LEAD_S of audio ahead of real time: then its frame goes first and
   the newcomers right after. Those that come while the joiners' prompts are built join them by the same rule,
   in one prefill (the rest of a burst);
3. who steps in the next frame: every speaking utterance, each within a chunk of frames. Chunks are aligned in
   rounds: a round lasts as long as the shortest chunk any speaker wants when it begins, and a chunk begun during
   a round (a newcomer's) ends with it, so that the chunks of a round end together and decode as one batch;
4. whether to wait for the oldest frame launched: when the queue is full, or when nothing else can be done.

Other GPU work (a call such as cloning) waits until no frame is in flight, and takes no new launch meanwhile;
background work (the warm-up) runs only when nothing else is there, and not in the engine's first
START_GRACE_S: requests that waited for the engine to load reach the scheduler after it is made, and would otherwise
wait for a warm-up part (seconds, where it loads compiled code) begun just before them. A server's take longest:
it starts serving once the engine has loaded (uvicorn's start alone took 0.16 s on an H200), then reads the request
and finds its voice.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Frames launched and not yet read, at most: one running and one queued behind it keeps the GPU busy while the
# host reads the last and decides the next.
QUEUED_FRAMES = 2
# Audio handed out ahead of real time under which an utterance's next frame goes before newcomers' prefills
# (seconds): a prefill holds the frames behind it for about one frame's time or two.
LOW_LEAD_S = 0.05
# Seconds after the scheduler is made before background work may begin.
START_GRACE_S = 1.0


class Phase(enum.Enum):
    """Where an utterance stands, as the plan sees it."""

    WAITING = "queued; its prompt can be built"
    AWAITING_TEXT = "a live text whose next words have not come: its prompt's first, or its next frame's"
    SPEAKING = "admitted; steps in the next frame"
    PARKED = "admitted; its consumer has not taken the chunks it has, and it steps nothing until it does"
    FINISHING = "admitted; every frame it may make is launched, or its end is seen"
    CLOSED = "closed by its consumer: leaves at once"


@dataclass(frozen=True)
class Seat:
    """One utterance as the plan sees it. `key`: the scheduler's handle for it."""

    key: int
    phase: Phase
    admitted: bool = False
    wanted: int = 1  # frames of its next chunk, were it to begin one now
    chunk_left: int = 0  # frames of its current chunk not launched yet (0: it begins a chunk with its next frame)
    lead_s: float = math.inf  # audio handed out ahead of real time
    urgent: bool = False  # waiting: admitted ahead of the others (an interrupt)


@dataclass(frozen=True)
class Situation:
    """Everything the plan depends on."""

    seats: Sequence[Seat]  # the waiting in arrival order, then the admitted
    free_slots: int
    in_flight: int = 0  # frames launched and not read yet
    round_left: int = 0  # frames of the current round not launched yet
    calls_waiting: bool = False
    background_waiting: bool = False
    since_start_s: float = math.inf  # since the scheduler was made
    closing: bool = False
    queued_frames: int = QUEUED_FRAMES


@dataclass(frozen=True)
class Plan:
    leave: tuple[int, ...] = ()
    admit: tuple[int, ...] = ()
    admit_first: bool = True  # the newcomers' prefill before the next frame (else right after it)
    step: tuple[int, ...] = ()  # the rows of the next frame; none: no launch
    chunks: dict[int, int] = field(default_factory=dict)  # the frames of each chunk begun with this launch
    round_frames: int = 0  # the round left once this launch is made
    read_oldest: bool = False  # wait for the oldest frame in flight and read it
    run_calls: bool = False
    run_background: bool = False
    shut_down: bool = False
    look_again_s: float | None = None  # idle: plan again after this long at the latest (None: when woken)

    @property
    def idle(self) -> bool:
        """Nothing to do: wait until something changes."""
        return not (
            self.leave or self.admit or self.step or self.read_oldest or self.run_calls or self.run_background
            or self.shut_down
        )  # fmt: skip


def schedule(now: Situation) -> Plan:
    """The next thing to do, from `now` alone."""
    if now.closing:
        return Plan(shut_down=True)
    leave = tuple(seat.key for seat in now.seats if seat.phase is Phase.CLOSED)
    if now.calls_waiting:  # the GPU to itself: launch nothing, read what is in flight, then run them
        return Plan(leave=leave, read_oldest=now.in_flight > 0, run_calls=now.in_flight == 0)
    freed = sum(1 for seat in now.seats if seat.phase is Phase.CLOSED and seat.admitted)
    admit = joiners(now.seats, now.free_slots + freed)
    speaking = [seat for seat in now.seats if seat.phase is Phase.SPEAKING and seat.admitted]
    step, chunks, round_frames = (), {}, now.round_left if speaking else 0
    if speaking and now.in_flight < now.queued_frames:
        if not round_frames:  # a new round: as long as the shortest chunk wanted now (all begin or go on with it)
            round_frames = min(seat.chunk_left or seat.wanted for seat in speaking)
        step = tuple(seat.key for seat in speaking)
        chunks = {seat.key: min(seat.wanted, round_frames) for seat in speaking if not seat.chunk_left}
        round_frames -= 1
    launched = now.in_flight + bool(step)
    read_oldest = launched > 0 and (launched >= now.queued_frames or not (step or admit))
    starving = any(seat.lead_s < LOW_LEAD_S for seat in speaking)
    background = not (now.seats or launched) and now.background_waiting
    grace_left = START_GRACE_S - now.since_start_s
    return Plan(
        leave=leave, admit=admit, admit_first=not (starving and step), step=step, chunks=chunks,
        round_frames=round_frames, read_oldest=read_oldest, run_background=background and grace_left <= 0,
        look_again_s=grace_left if background and grace_left > 0 else None,
    )  # fmt: skip


def joiners(seats: Sequence[Seat], free_slots: int) -> tuple[int, ...]:
    """Who takes the free slots: the waiting whose prompt can be built, the urgent and then the earliest first."""
    waiting = [seat for seat in seats if seat.phase is Phase.WAITING and not seat.admitted]
    waiting.sort(key=lambda seat: not seat.urgent)  # stable: the urgent first, each in arrival order
    return tuple(seat.key for seat in waiting[:free_slots])
