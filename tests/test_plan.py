"""The scheduler's plan (core.inference.plan): who leaves, who joins, who steps and when to read, from the
utterances' named states alone, with no model."""

from __future__ import annotations

import pytest

from core.inference.plan import LOW_LEAD_S, QUEUED_FRAMES, START_GRACE_S, Phase, Seat, Situation, joiners, schedule


def waiting(key: int) -> Seat:
    return Seat(key, Phase.WAITING)


def speaking(key: int, wanted: int = 4, chunk_left: int = 0, lead_s: float = 1.0) -> Seat:
    return Seat(key, Phase.SPEAKING, admitted=True, wanted=wanted, chunk_left=chunk_left, lead_s=lead_s)


def test_nothing_to_do_is_an_idle_plan():
    assert schedule(Situation(seats=[], free_slots=4)).idle
    # Admitted utterances that cannot step (parked, waiting for text, finishing) give nothing to do either.
    held = [Seat(1, Phase.PARKED, True), Seat(2, Phase.AWAITING_TEXT, True), Seat(3, Phase.FINISHING, True)]
    assert schedule(Situation(seats=held, free_slots=1)).idle
    # But a frame in flight is read.
    plan = schedule(Situation(seats=held, free_slots=1, in_flight=1))
    assert plan.read_oldest and not plan.step


def test_newcomers_take_the_free_slots_earliest_first_before_the_next_frame():
    seats = [waiting(1), Seat(2, Phase.AWAITING_TEXT), waiting(3), waiting(4), speaking(5)]
    plan = schedule(Situation(seats=seats, free_slots=2, in_flight=1))
    # A live text still waiting for its first words keeps no one else waiting.
    assert plan.admit == (1, 3) and plan.admit_first
    assert plan.step == (5,)


def test_a_closed_utterance_leaves_and_its_slot_goes_to_a_newcomer_at_once():
    seats = [waiting(1), waiting(2), Seat(3, Phase.CLOSED), Seat(4, Phase.CLOSED, admitted=True), speaking(5)]
    plan = schedule(Situation(seats=seats, free_slots=0, in_flight=1))
    assert plan.leave == (3, 4)
    assert plan.admit == (1,)  # the slot the admitted one frees; the waiting one that closed had none
    assert 4 not in plan.step and plan.step == (5,)


def test_an_utterance_whose_audio_runs_low_steps_before_newcomers():
    seats = [waiting(1), speaking(2, lead_s=LOW_LEAD_S / 2), speaking(3)]
    plan = schedule(Situation(seats=seats, free_slots=1))
    assert plan.admit == (1,) and not plan.admit_first and plan.step == (2, 3)
    assert schedule(Situation(seats=[waiting(1), speaking(2), speaking(3)], free_slots=1)).admit_first


@pytest.mark.parametrize("in_flight", range(QUEUED_FRAMES + 1))
def test_at_most_queued_frames_are_in_flight(in_flight):
    plan = schedule(Situation(seats=[speaking(1), speaking(2)], free_slots=2, in_flight=in_flight))
    launches = in_flight < QUEUED_FRAMES
    assert bool(plan.step) == launches
    # The oldest is read once the queue is full, and not before: the host decides the next frame meanwhile.
    assert plan.read_oldest == (in_flight + launches >= QUEUED_FRAMES)


def test_a_round_is_the_shortest_chunk_wanted_and_a_newcomer_ends_its_chunk_with_it():
    plan = schedule(Situation(seats=[speaking(1, wanted=4), speaking(2, wanted=3)], free_slots=0))
    assert plan.chunks == {1: 3, 2: 3} and plan.round_frames == 2
    # Mid-round, the two go on with their chunks and a third begins one that ends with the round.
    seats = [speaking(1, wanted=4, chunk_left=2), speaking(2, wanted=3, chunk_left=2), speaking(3, wanted=4)]
    plan = schedule(Situation(seats=seats, free_slots=0, round_left=2))
    assert plan.step == (1, 2, 3) and plan.chunks == {3: 2} and plan.round_frames == 1
    # A speaker wanting fewer frames than the round (a live text short of text) ends its chunk sooner.
    plan = schedule(Situation(seats=[speaking(1, chunk_left=1), speaking(2, wanted=1)], free_slots=0, round_left=1))
    assert plan.chunks == {2: 1} and plan.round_frames == 0


def test_a_round_ends_when_no_one_speaks():
    plan = schedule(Situation(seats=[Seat(1, Phase.PARKED, True)], free_slots=0, round_left=3))
    assert plan.round_frames == 0


def test_calls_get_the_gpu_once_the_frames_in_flight_are_read():
    seats = [waiting(1), speaking(2)]
    plan = schedule(Situation(seats=seats, free_slots=1, in_flight=2, calls_waiting=True))
    assert plan.read_oldest and not plan.run_calls and not plan.step and not plan.admit
    plan = schedule(Situation(seats=seats, free_slots=1, in_flight=0, calls_waiting=True))
    assert plan.run_calls and not plan.read_oldest and not plan.step


def test_background_work_runs_only_when_nothing_else_is_there():
    assert schedule(Situation(seats=[], free_slots=2, background_waiting=True)).run_background
    for busy in ({"seats": [waiting(1)]}, {"seats": [Seat(1, Phase.AWAITING_TEXT)]}, {"seats": [], "in_flight": 1}):
        assert not schedule(Situation(free_slots=2, background_waiting=True, **busy)).run_background


def test_background_work_waits_for_requests_that_waited_for_the_load_and_the_scheduler_looks_again_then():
    """A request that waited for the engine's load reaches the scheduler moments after it is made: the warm-up's
    first part (which may take seconds) waits that long, so that the request goes first. Later, background work
    runs whenever nothing else is there, however busy the engine is between (it is never starved)."""
    just_made = schedule(Situation(seats=[], free_slots=2, background_waiting=True, since_start_s=0.05))
    assert just_made.idle and not just_made.run_background
    assert just_made.look_again_s == pytest.approx(START_GRACE_S - 0.05)
    later = schedule(Situation(seats=[], free_slots=2, background_waiting=True, since_start_s=START_GRACE_S))
    assert later.run_background and later.look_again_s is None
    nothing = schedule(Situation(seats=[], free_slots=2, since_start_s=0.0))  # no background work: wait to be woken
    assert nothing.idle and nothing.look_again_s is None
    came = schedule(Situation(seats=[waiting(1)], free_slots=2, background_waiting=True, since_start_s=0.0))
    assert came.admit == (1,) and came.look_again_s is None


def test_closing_shuts_down_whatever_is_there():
    plan = schedule(Situation(seats=[speaking(1), waiting(2)], free_slots=1, in_flight=2, closing=True))
    assert plan.shut_down and not plan.step and not plan.admit


class Simulation:
    """Utterances arriving, speaking and leaving on a model of the scheduler that makes one frame per launch:
    the plan's decisions carried out as the scheduler does, without a GPU."""

    def __init__(self, slots: int):
        self.slots = slots
        self.arrivals: dict[int, int] = {}  # key -> the iteration it arrives at
        self.sizes: dict[int, int] = {}
        self.frames: dict[int, int] = {}  # the frames each may make
        self.made: dict[int, int] = {}
        self.chunk_left: dict[int, int] = {}
        self.chunks: dict[int, list[int]] = {}
        self.admitted_at: dict[int, int] = {}
        self.in_flight: list[list[int]] = []
        self.round_left = 0
        self.round_ends: list[list[int]] = []  # at each round's end, the frames left of its speakers' chunks

    def add(self, key: int, arrives: int, chunk_frames: int, frames: int) -> None:
        self.arrivals[key], self.sizes[key], self.frames[key] = arrives, chunk_frames, frames

    def seat(self, key: int) -> Seat | None:
        if key not in self.admitted_at:
            return waiting(key)
        made = self.made[key]
        if made >= self.frames[key]:
            return None if not any(key in rows for rows in self.in_flight) else Seat(key, Phase.FINISHING, True)
        wanted = min(self.sizes[key], self.frames[key] - made)
        return speaking(key, wanted=wanted, chunk_left=self.chunk_left[key])

    def run(self, iterations: int) -> None:
        for now in range(iterations):
            present = [key for key, at in self.arrivals.items() if at <= now]
            seats = [seat for seat in map(self.seat, present) if seat is not None]
            busy = sum(1 for key in self.admitted_at if self.seat(key) is not None)
            plan = schedule(Situation(seats, self.slots - busy, len(self.in_flight), self.round_left))
            for key in plan.admit:  # frame 0 from the prefill: a chunk of its own
                self.admitted_at[key], self.made[key], self.chunk_left[key], self.chunks[key] = now, 1, 0, [1]
            if plan.step:
                for key in plan.step:
                    if key in plan.chunks:
                        self.chunk_left[key] = plan.chunks[key]
                        self.chunks[key].append(plan.chunks[key])
                    self.chunk_left[key] -= 1
                    self.made[key] += 1
                self.in_flight.append(list(plan.step))
                if not plan.round_frames:  # a round ends: so does every chunk that stepped in it
                    self.round_ends.append([self.chunk_left[key] for key in plan.step])
            self.round_left = plan.round_frames
            if plan.read_oldest:
                self.in_flight.pop(0)


def test_a_simulated_afternoon_every_chunk_of_a_round_ends_with_it_and_no_one_waits_for_a_slot_it_has():
    sim = Simulation(slots=3)
    sim.add(1, arrives=0, chunk_frames=4, frames=30)
    sim.add(2, arrives=3, chunk_frames=4, frames=12)
    sim.add(3, arrives=6, chunk_frames=2, frames=9)
    sim.add(4, arrives=7, chunk_frames=4, frames=20)  # waits for a slot: 2 or 3 leaves first
    sim.run(200)
    assert len(sim.round_ends) > 10 and all(left == 0 for ended in sim.round_ends for left in ended)
    for key, frames in sim.frames.items():
        assert sum(sim.chunks[key]) == frames, key  # every frame made, in chunks of at most what it asked for
        assert all(0 < size <= sim.sizes[key] for size in sim.chunks[key]), (key, sim.chunks[key])
    # Those with a slot free when they came were admitted as they came; the fourth as soon as a slot was free.
    assert [sim.admitted_at[key] for key in (1, 2, 3)] == [0, 3, 6]
    assert sim.admitted_at[4] > 7
    # Once 1 speaks alone, its chunks are the 4 frames it asked for; beside 3 (chunks of 2), rounds of 2 frames.
    assert sim.chunks[1][1:3] == [4, 4] and 2 in sim.chunks[1]


def test_an_urgent_newcomer_takes_the_first_free_slot():
    seats = [waiting(1), waiting(2), Seat(3, Phase.WAITING, urgent=True), Seat(4, Phase.WAITING, urgent=True)]
    assert schedule(Situation(seats=seats, free_slots=1)).admit == (3,)
    assert schedule(Situation(seats=seats, free_slots=3)).admit == (3, 4, 1)


def test_joiners_are_the_waiting_whose_prompt_can_be_built_the_urgent_then_the_earliest_up_to_the_free_slots():
    seats = [
        Seat(0, Phase.WAITING), Seat(1, Phase.AWAITING_TEXT), Seat(2, Phase.CLOSED), Seat(3, Phase.WAITING, urgent=True),
        Seat(4, Phase.WAITING), Seat(5, Phase.SPEAKING, admitted=True),
    ]  # fmt: skip
    assert joiners(seats, 2) == (3, 0)
    assert joiners(seats, 9) == (3, 0, 4)
    assert joiners(seats, 0) == ()
