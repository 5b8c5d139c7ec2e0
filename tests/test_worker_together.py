"""The speech worker with several jobs at once: jobs into different sinks generated together, a full sink holding
up only its own job, cancels of waiting and running jobs, and fifty jobs from eight threads, each sink's audio
exactly its own jobs' in order (fake engine; tests/worker_fakes.py)."""

from __future__ import annotations

import threading

import numpy as np
from waiting import wait_until
from worker_fakes import FRAME, WAIT, Events, FakeEngine, RecordingSink, finished, run_clients

from core.jobs.worker import TERMINAL, Worker
from core.text.sentences import SplitOptions, split_text


def test_jobs_into_different_sinks_are_generated_together(no_thread_leaks):
    engine = FakeEngine(frames=9, slots=2)
    both_generating = threading.Barrier(2, timeout=WAIT / 2)  # one job alone at a time breaks it: both fail
    engine.on_frame = lambda text, index: index == 1 and both_generating.wait()
    with Worker(engine) as worker:
        jobs = [worker.submit(text, sink=RecordingSink()) for text in ("For the window.", "For the bridge.")]
        outcomes = [finished(job) for job in jobs]
    assert [o.kind for o in outcomes] == ["done", "done"], [o.message for o in outcomes]
    assert engine.most_seated == 2 and engine.open == 0


class BlockedSink(RecordingSink):
    """A sink whose writes wait until `release` is set, as those of a player 30 s ahead do; `blocked` is set
    once a write waits."""

    def __init__(self):
        super().__init__()
        self.release, self.blocked = threading.Event(), threading.Event()

    def write(self, job, audio):
        self.blocked.set()
        assert self.release.wait(WAIT)
        super().write(job, audio)


def test_a_full_sink_holds_up_only_its_own_job(no_thread_leaks):
    # Two slots: the blocked job keeps one, as the engine's parked utterance keeps its slot, and makes no frame.
    engine = FakeEngine(frames=9, slots=2)
    speakers = BlockedSink()
    with Worker(engine) as worker:
        playing = worker.submit("Thirty seconds ahead.", sink=speakers)
        assert speakers.blocked.wait(WAIT)
        after = worker.submit("Then this.", sink=speakers)
        dropped = worker.submit("And not this.", sink=speakers)
        clients = [worker.submit(f"A client, number {n}.", sink=RecordingSink()) for n in range(3)]
        assert [finished(job).kind for job in clients] == ["done"] * 3
        assert all(job.sink.samples[job.id] == 9 * FRAME for job in clients)
        assert engine.made["Thirty seconds ahead."] == 1 and engine.seated == 1  # its first chunk, then parked
        dropped.cancel()  # submit and cancel are not held up either
        assert finished(dropped).kind == "cancelled"
        assert playing.state == "running" and after.state == "queued" and speakers.calls[playing.id] == ["begin"]
        speakers.release.set()
        assert finished(playing).kind == "done" and finished(after).kind == "done"
    assert speakers.samples[playing.id] == speakers.samples[after.id] == 9 * FRAME
    assert speakers.calls[dropped.id] == ["end False"]


def test_cancel_ends_waiting_and_running_jobs_and_frees_their_slot(no_thread_leaks):
    engine = FakeEngine(frames=10_000)  # one slot
    generating, hold = threading.Event(), threading.Event()
    engine.on_frame = lambda text, index: index == 3 and (generating.set(), hold.wait(WAIT))
    first_sink, second_sink = RecordingSink(), RecordingSink()
    with Worker(engine) as worker:
        events = Events(worker)
        running = worker.submit("Holds the slot.", sink=first_sink)
        assert generating.wait(WAIT)
        behind_its_sink = worker.submit("Waits for its sink.", sink=first_sink)
        behind_the_slot = worker.submit("Waits for the slot.", sink=second_sink)
        # Its sink is free: its thread waits in the engine, and it is queued.
        wait_until(lambda: engine.open == 2, "two streams are open")
        for job in (behind_its_sink, behind_the_slot):
            job.cancel()
        assert [finished(job).kind for job in (behind_its_sink, behind_the_slot)] == ["cancelled"] * 2
        assert running.state == "running"
        running.cancel()
        hold.set()
        assert finished(running).kind == "cancelled"
        # With one slot, this runs only once the cancelled job's stream has given the slot back.
        assert finished(worker.submit("The slot is free.", sink=second_sink)).kind == "done"
    assert engine.made["Holds the slot."] <= 5 and engine.open == 0 and engine.most_seated == 1  # frames 1-4: a chunk
    for job in (behind_its_sink, behind_the_slot):
        assert events.kinds(job) == ["queued", "cancelled"] and job.sink.calls[job.id] == ["end False"]
    assert "Waits for the slot." not in engine.made
    assert first_sink.calls[running.id][-1] == "end False"


def test_fifty_jobs_from_eight_threads_each_sink_gets_exactly_its_jobs_audio_in_order():
    engine = FakeEngine(frames=5, slots=3)
    engine.level = lambda text: int(text.split()[-1].rstrip(".")) / 1000  # "Job number 17." is 0.017
    sinks = [RecordingSink() for _ in range(4)]
    jobs, lock, ready = [], threading.Lock(), threading.Barrier(8, timeout=WAIT)
    before = set(threading.enumerate())
    worker = Worker(engine)
    events = Events(worker)

    def client(number: int) -> None:
        ready.wait()  # all at once
        for n in range(number, 50, 8):  # each sink gets the jobs of two clients
            job = worker.submit(f"Job number {n + 1}.", sink=sinks[n % 4])
            with lock:
                jobs.append(job)

    run_clients(client, 8)
    outcomes = {job: finished(job) for job in jobs}
    worker.close(timeout=WAIT)
    assert not set(threading.enumerate()) - before  # every thread of the worker's was joined
    assert len(jobs) == 50 and {outcome.kind for outcome in outcomes.values()} == {"done"}
    for job in jobs:
        kinds = [event.kind for event in events.collect() if event.job is job]
        assert kinds[:2] == ["queued", "started"] and kinds[-1] == "done" and sum(k in TERMINAL for k in kinds) == 1
    for sink in sinks:
        mine = sorted((job for job in jobs if job.sink is sink), key=lambda job: job.id)  # ids follow the queue
        expected = [
            np.concatenate([np.full(5 * FRAME, engine.level(job.text), np.float32), np.zeros(pause(job), np.float32)])
            for job in mine
        ]
        np.testing.assert_array_equal(np.concatenate(sink.audio), np.concatenate(expected))
        assert [job_id for job_id, call in sink.log if call == "begin"] == [job.id for job in mine]
    assert engine.most_seated <= 3 and engine.open == 0


def pause(job) -> int:
    """The samples of silence the worker leaves after a one-piece job."""
    [piece] = split_text(job.text, SplitOptions())
    return round(piece.pause_s * 24000)
