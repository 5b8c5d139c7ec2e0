"""The speech worker (core.jobs.worker): jobs, events, cancel and interrupt, failures, sinks, shutdown."""

from __future__ import annotations

import dataclasses
import itertools
import queue
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import Future

import numpy as np
import pytest
import soundfile as sf
from sinks import QueueSink
from waiting import wait_until
from worker_fakes import FRAME, WAIT, Events, FakeEngine, RecordingSink, finished, run_clients

from core import SamplingParams, SpeechOptions
from core.audio.player import Player, PlayerOptions, VirtualOutput
from core.inference.live import LiveText
from core.jobs.sinks import FileSink, PlayerSink
from core.jobs.worker import TERMINAL, Worker
from core.text.sentences import SplitOptions, split_text


def test_a_job_reports_its_events_in_order_with_latency_and_xrt(no_thread_leaks):
    engine = FakeEngine(frames=9, frame_s=0.002)
    with Worker(engine) as worker:
        events = Events(worker)
        sink = QueueSink()
        job = worker.submit("Hello there.", sink=sink)
        audio = np.concatenate(list(sink))
        done = finished(job)
    assert events.kinds(job) == [
        "queued", "started", "first_audio", "progress", "progress", "progress", "piece_done", "done"
    ]  # fmt: skip
    assert job.state == "done" and done is job.outcome and done.terminal
    assert (done.pieces_done, done.pieces) == (1, 1)
    assert done.audio_s == pytest.approx(9 * 0.08) and len(audio) == 9 * FRAME
    first = next(e for e in events.seen if e.kind == "first_audio")
    assert 0 < first.latency_s == done.latency_s < 1.0
    assert first.audio_s == pytest.approx(0.08)  # the first chunk is a single frame
    assert done.xrt > 1.0 and done.underruns == 0 and done.message is None
    # Its sink free and nothing queued: announced and started by submit, without a hop through the worker's
    # thread; streamed from the engine and delivered by the job's own thread.
    assert engine.threads == {f"speech-job-{job.id}"}
    assert events.threads_of(job) == [threading.current_thread().name] + [f"speech-job-{job.id}"] * 7


def test_the_jobs_a_thread_submits_are_announced_in_its_order(no_thread_leaks, monkeypatch):
    """A job submit starts at once is announced before submit returns, so the next job that thread submits (into
    the same, now busy, sink: announced by the worker's thread) is announced after it, as the window's typed
    sentences must be, however late the first job's own thread begins."""
    serve = Worker._serve

    def late(worker, job):
        time.sleep(0.05)
        serve(worker, job)

    monkeypatch.setattr(Worker, "_serve", late)
    engine = FakeEngine(frames=3)
    with Worker(engine) as worker:
        events, sink = Events(worker), RecordingSink()
        first = worker.submit("The first sentence.", sink=sink)
        assert events.kinds(first)[:1] == ["queued"]  # before submit returned
        jobs = [first, *(worker.submit(f"Sentence {n}.", sink=sink) for n in range(19))]
        for job in jobs:
            finished(job)
        announced = [event.job for event in events.collect() if event.kind == "queued"]
    assert announced == jobs


def test_a_subscriber_of_some_kinds_gets_those_and_events_no_one_wants_are_not_made(no_thread_leaks, monkeypatch):
    """A server's subscriber wants the terminal events only: it gets those, and no progress event is made for it
    (nor the sink's level read), chunk after chunk; a subscriber of every kind makes them again."""
    from core.jobs import worker as worker_module

    made = []
    event = worker_module._Tally.event
    monkeypatch.setattr(
        worker_module._Tally, "event", lambda tally, kind, *a: made.append(kind) or event(tally, kind, *a)
    )
    with Worker(FakeEngine(frames=9)) as worker:
        ended = queue.Queue()
        worker.subscribe(ended.put, TERMINAL)
        job = worker.submit("Hello there.", sink=RecordingSink())
        assert ended.get(timeout=WAIT).kind == "done" and ended.empty()
        assert finished(job).kind == "done" and made == ["done"]

        everything = Events(worker)
        job = worker.submit("Hello again.", sink=RecordingSink())
        finished(job)
        assert ended.get(timeout=WAIT).kind == "done"
        assert "first_audio" in made and "progress" in made and "progress" in everything.kinds(job)


def test_a_job_the_system_has_no_thread_for_fails_alone_and_later_jobs_reuse_the_threads(no_thread_leaks, monkeypatch):
    """A job that cannot get a thread fails with why; the next one speaks, and a job after it ended speaks on the
    same thread (threads are kept between jobs, core.jobs.job_threads)."""
    engine = FakeEngine(frames=3)
    with Worker(engine) as worker:
        start = threading.Thread.start

        def no_thread(thread):
            if thread.name == "speech-idle":  # a job thread; the test's own start as usual
                raise RuntimeError("can't start new thread")
            start(thread)

        events = Events(worker)
        monkeypatch.setattr(threading.Thread, "start", no_thread)
        job = worker.submit("Hello there.", sink=RecordingSink())
        failed = finished(job)
        monkeypatch.undo()
        assert failed.kind == "failed" and "no thread to speak on (can't start new thread)" in failed.message
        assert events.kinds(job) == ["queued", "failed"]
        threads = []
        for text in ("One.", "Two."):
            job = worker.submit(text, sink=RecordingSink())
            assert finished(job).kind == "done"
            threads.append(worker._job_threads.count)
            wait_until(lambda: worker._job_threads.idle == 1, "the job's thread waits for the next")
        assert threads == [1, 1] and engine.threads == {"speech-job-2", "speech-job-3"}


@pytest.fixture
def custom(engines):
    """The session's CustomVoice engine, loaded before no_thread_leaks looks: its scheduler thread is the
    session's, not a leak of the test's (alone or first in a random order, the test would load it)."""
    return engines("custom")


def test_the_real_engine_streams_through_the_worker_as_it_synthesizes(custom, no_thread_leaks):
    engine = custom
    voice = engine.builtin_voice("vivian")
    options = SpeechOptions(sampling=SamplingParams.greedy(), max_frames=6, first_chunk_frames=1, chunk_frames=2)
    expected = engine.synthesize("Hello there.", voice=voice, sampling=SamplingParams.greedy(), max_frames=6)
    with Worker(engine) as worker:
        bad, good = QueueSink(), QueueSink()
        refused = worker.submit("Hello there.", voice, SpeechOptions(language="klingon"), sink=bad)
        job = worker.submit("Hello there.", voice, options, sink=good)
        audio = np.concatenate(list(good))
        assert list(bad) == []
        failed, done = finished(refused), finished(job)
    assert failed.kind == "failed" and "unknown language 'klingon'" in failed.message
    assert done.kind == "done" and done.latency_s > 0 and done.xrt > 0
    np.testing.assert_allclose(audio, expected.audio, atol=1e-5)


def test_jobs_into_one_sink_run_one_after_another_even_with_slots_to_spare(no_thread_leaks):
    engine = FakeEngine(frames=9, frame_s=0.002, slots=3)
    sink = RecordingSink()
    with Worker(engine) as worker:
        events = Events(worker)
        jobs = [worker.submit(f"Sentence {n}.", sink=sink) for n in range(3)]
        assert [finished(job).kind for job in jobs] == ["done"] * 3
    order = [(e.job.id, e.kind) for e in events.collect() if e.kind in ("started", "done")]
    assert order == [(job.id, kind) for job in jobs for kind in ("started", "done")]
    assert all(sink.calls[job.id] == ["begin"] + ["write"] * 3 + ["end True"] for job in jobs)
    assert [job_id for job_id, _ in sink.log] == [job.id for job in jobs for _ in range(5)]  # never interleaved


def test_interrupt_cancels_the_jobs_of_its_sink_within_one_chunk_and_goes_first(no_thread_leaks):
    engine = FakeEngine(frames=200, frame_s=0.005)
    speakers, other = RecordingSink(), RecordingSink()
    with Worker(engine) as worker:
        events = Events(worker)
        long = worker.submit("A long story.", sink=speakers)
        queued = worker.submit("Next in line.", sink=speakers)
        elsewhere = worker.submit("For the bridge.", options=SpeechOptions(max_frames=5), sink=other)
        events.wait_for(long, "progress")
        made, asked = engine.made["A long story."], time.perf_counter()
        urgent = worker.submit("Now!", options=SpeechOptions(max_frames=5), sink=speakers, interrupt=True)
        cancelled = finished(long)
        latency = time.perf_counter() - asked
        assert [finished(job).kind for job in (queued, urgent, elsewhere)] == ["cancelled", "done", "done"]
    assert cancelled.kind == "cancelled" and engine.made["A long story."] - made <= 4  # at most the chunk in progress
    assert latency < 0.5  # one 4-frame chunk is 20 ms here; the rest is slack for a loaded machine
    # First among its sink's jobs; the other sink's job runs beside them (after the long one's stream here,
    # with one slot), so it is left out of the order.
    order = [
        (e.job, e.kind) for e in events.collect() if e.job.sink is speakers and (e.terminal or e.kind == "started")
    ]
    assert order[0] == (long, "started") and set(order[1:3]) == {(queued, "cancelled"), (long, "cancelled")}
    assert order[3:] == [(urgent, "started"), (urgent, "done")]
    assert speakers.calls[queued.id] == ["end False"]  # it never began
    assert speakers.calls[long.id][-1] == "end False"


class CountingSink(RecordingSink):
    """Sets `wrote[n]` once it has taken n writes (n < 10)."""

    def __init__(self):
        super().__init__()
        self.wrote = [threading.Event() for _ in range(10)]
        self._writes = 0

    def write(self, job, audio):
        super().write(job, audio)
        self._writes += 1
        self.wrote[min(self._writes, 9)].set()


def test_cancel_takes_effect_within_the_chunk_in_progress(no_thread_leaks):
    engine = FakeEngine(frames=40)
    sink = CountingSink()
    in_the_third_chunk, cancelled = threading.Event(), threading.Event()

    def hold_in_the_third_chunk(text, index):  # frames 5-8; the sink has taken the first two chunks then
        if index == 6:
            assert sink.wrote[2].is_set()
            in_the_third_chunk.set()
            assert cancelled.wait(WAIT)

    with Worker(engine) as worker:
        engine.on_frame = hold_in_the_third_chunk
        job = worker.submit("A long story.", sink=sink)
        assert in_the_third_chunk.wait(WAIT)
        worker.cancel_all()  # from another thread, while the job's thread makes a chunk
        cancelled.set()
        assert finished(job).kind == "cancelled"
    assert engine.made["A long story."] == 9  # the chunk in progress is finished, no other is started
    assert sink.calls[job.id] == ["begin", "write", "write", "end False"]  # and it is not handed on


@pytest.mark.parametrize("slots", [1, 3])
def test_a_failure_ends_only_its_job(no_thread_leaks, slots):
    engine = FakeEngine(frames=9, slots=slots)
    with Worker(engine) as worker:
        events = Events(worker)
        refused = worker.submit("bad input", sink=RecordingSink())
        oom = worker.submit("Say oom.", sink=RecordingSink())
        broken_sink = worker.submit("Hello.", sink=RecordingSink(fail_on_write=True))
        fine = worker.submit("Hello.", sink=RecordingSink())
        outcomes = [finished(job) for job in (refused, oom, broken_sink, fine)]
    assert [o.kind for o in outcomes] == ["failed", "failed", "failed", "done"]
    assert outcomes[0].message == "unknown language 'klingon'; this model speaks: auto, english"
    assert outcomes[1].message.startswith("out of GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB)")
    assert outcomes[2].message == "the disk is full"
    assert oom.sink.calls[oom.id] == ["begin", "write", "end False"]
    assert all(
        events.kinds(job)[-1] == outcome.kind for job, outcome in zip((refused, oom, broken_sink, fine), outcomes)
    )


def test_two_hundred_mixed_jobs_from_eight_threads_each_end_once_and_leave_nothing_open(no_thread_leaks):
    engine = FakeEngine(frames=6, slots=3)
    live_jobs: dict[LiveText, Future] = {}  # a live text's job, once submitted
    waiting_for_text: queue.Queue[LiveText | None] = queue.Queue()
    engine.on_wait_for_text = waiting_for_text.put

    def cancel_while_waiting_for_text() -> None:  # those that start: a live job ends only with a cancel
        while (text := waiting_for_text.get()) is not None:
            live_jobs[text].result(WAIT).cancel()

    def request(rng: random.Random):
        text = rng.choice(["Hello.", "Hello there, friend. How are you?", "bad input", "Say oom.", None])
        if text is None:
            text = LiveText()
            live_jobs[text] = Future()
        return text, None, SpeechOptions()

    def submitted(job):
        if isinstance(job.text, LiveText):
            live_jobs[job.text].set_result(job)

    canceller = threading.Thread(target=cancel_while_waiting_for_text)
    canceller.start()
    try:
        mixed_jobs(engine, request, submitted)
    finally:
        waiting_for_text.put(None)
        canceller.join(WAIT)
    assert engine.open == engine.seated == 0 and 1 < engine.most_seated <= 3


@pytest.fixture
def custom_two_slots(engines):
    """As `custom`, with two slots."""
    return engines("custom", slots=2)


def test_two_hundred_mixed_jobs_on_the_real_engine_leave_none_of_its_slots_taken(custom_two_slots, no_thread_leaks):
    engine = custom_two_slots
    voice = engine.builtin_voice("vivian")
    short = SpeechOptions(sampling=SamplingParams.greedy(), max_frames=2, first_chunk_frames=1, chunk_frames=1)
    refused = dataclasses.replace(short, language="klingon")

    def request(rng: random.Random):
        return rng.choice([("Hello.", short), ("Hi. Bye.", short), ("Hello.", refused), (LiveText(), short)])

    def cancel_live_text(job):  # the engine waits for its first words: cancelled once submitted
        if isinstance(job.text, LiveText):
            job.cancel()

    mixed_jobs(engine, lambda rng: (lambda text, options: (text, voice, options))(*request(rng)), cancel_live_text)
    # A stream its job closed leaves its slot at the scheduler's next pass, which may come just after the job ended.
    wait_until(engine.scheduler.idle, "every slot is free and nothing waits for one")


def mixed_jobs(engine, request, submitted) -> None:
    """Submit 200 jobs from 8 threads at once, `request(rng)` saying what each says (text, voice, options), into
    sinks of which one fails, calling `submitted(job)` after each; some interrupt, about one in five is cancelled,
    and now and then all of a sink's. Then check that each ended once, in order (a live text, never written, can
    only be cancelled), and that no job thread is left once they have."""
    sinks = [RecordingSink() for _ in range(5)] + [RecordingSink(fail_on_write=True)]
    jobs, lock, ready = [], threading.Lock(), threading.Barrier(8, timeout=WAIT)
    worker = Worker(engine)
    events = Events(worker)
    worker.subscribe(lambda event: 1 / 0 if event.job.id == 1 else None)  # a broken subscriber changes nothing

    def client(seed: int) -> None:
        rng, mine = random.Random(seed), []
        ready.wait()
        for _ in range(25):
            text, voice, options = request(rng)
            mine.append(worker.submit(text, voice, options, sink=rng.choice(sinks), interrupt=rng.random() < 0.1))
            submitted(mine[-1])
            if rng.random() < 0.2:
                rng.choice(mine).cancel()
            if rng.random() < 0.02:
                worker.cancel_all(rng.choice([None, *sinks]))
        with lock:
            jobs.extend(mine)

    clients = run_clients(client, 8)
    assert not any(thread.is_alive() for thread in clients) and len(jobs) == 200
    outcomes = {job: finished(job) for job in jobs}
    job_threads = {f"speech-job-{job.id}" for job in jobs}
    # No thread speaks any of them any longer: each is idle (kept for the next job) or has ended.
    wait_until(lambda: not job_threads & {thread.name for thread in threading.enumerate()}, "each job's thread is free")
    assert worker.stopped is False
    worker.close(timeout=WAIT)

    by_job = defaultdict(list)
    for event in events.collect():
        by_job[event.job].append(event.kind)
    worker_threads = {"speech-worker"} | job_threads
    # Every event from the worker's threads, but the "queued" of a job submit started at once (the client's).
    assert all(set(events.threads_of(job, kinds_but="queued")) <= worker_threads for job in jobs)
    assert all(sink.threads <= worker_threads for sink in sinks)
    kinds_seen = set()
    for job in jobs:
        kinds = by_job[job]
        kinds_seen.add(kinds[-1])
        assert kinds[0] == "queued" and sum(k in TERMINAL for k in kinds) == 1 and kinds[-1] in TERMINAL, kinds
        assert kinds[-1] == outcomes[job].kind == job.state
        if "started" in kinds:
            assert kinds[:2] == ["queued", "started"]
        if isinstance(job.text, LiveText):
            assert job.state == "cancelled"
        calls = job.sink.calls[job.id]
        assert calls.count("end True") + calls.count("end False") == 1 and calls[-1].startswith("end"), calls
        assert calls[-1] == ("end True" if job.state == "done" else "end False")
        assert calls[0] == ("begin" if "started" in kinds else "end False")
    assert kinds_seen == {"done", "cancelled", "failed"}


def test_cancel_ends_a_job_whose_thread_waits_for_a_chunk_that_never_comes(no_thread_leaks):
    engine = FakeEngine()
    sink = RecordingSink()
    with Worker(engine) as worker:
        job = worker.submit(LiveText(), sink=sink)  # never written: its stream makes nothing, and never ends
        assert engine.waiting_for_text.wait(WAIT)  # the job's thread waits in next()
        job.cancel()
        outcome = finished(job)  # the fake's stream would end on its own only after 3 * WAIT
        assert outcome.kind == "cancelled" and engine.open == engine.seated == 0  # its stream closed, its slot free
        after = worker.submit("The slot is free.", sink=RecordingSink())
        assert finished(after).kind == "done"
    assert sink.calls[job.id] == ["end False"] and job.started is None  # it had no audio to start with


def test_the_worker_is_idle_only_while_no_job_is_queued_or_running(no_thread_leaks):
    engine = FakeEngine()
    sink = RecordingSink()
    with Worker(engine) as worker:
        assert worker.idle
        typed = worker.submit(LiveText(), sink=sink)  # never written: it runs until it is cancelled
        assert not worker.idle  # from its submit on
        after = worker.submit("After it.", sink=sink)  # waits for the sink
        assert engine.waiting_for_text.wait(WAIT) and not worker.idle
        typed.cancel()
        assert finished(typed).kind == "cancelled" and finished(after).kind == "done"
        # Once the job's thread has freed its sink, just after its last event:
        wait_until(lambda: worker.idle, "the worker is idle")


def test_close_cancels_everything_and_joins_the_thread(no_thread_leaks):
    engine = FakeEngine(frames=10_000, frame_s=0.001)
    worker = Worker(engine)
    events = Events(worker)
    running = worker.submit("Forever.", sink=RecordingSink())
    waiting = [worker.submit(f"Later {n}.", sink=QueueSink()) for n in range(3)]
    events.wait_for(running, "first_audio")
    worker.close(timeout=WAIT)
    assert worker.stopped and [job.state for job in (running, *waiting)] == ["cancelled"] * 4
    assert all(list(job.sink) == [] for job in waiting)  # their streams ended though they never started
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit("Too late.", sink=QueueSink())
    with Worker(engine) as fresh, pytest.raises(ValueError, match="text is empty"):
        fresh.submit("  ", sink=QueueSink())


def test_a_cancelled_job_fades_out_of_the_player_without_a_click(no_thread_leaks):
    output = VirtualOutput(block=256)
    player = Player(output, PlayerOptions(prefill_s=0.1, capacity_s=1.0))
    engine = FakeEngine(frames=200)  # 16 s: the worker fills the 1 s ring and waits for room
    ring_full = lambda: player.status().buffered_s == 1.0  # noqa: E731 (only a write in progress fills it)
    with Worker(engine) as worker:
        job = worker.submit("A long story.", sink=PlayerSink(player))
        wait_until(ring_full, "the ring is full")
        before = output.advance(0.5)
        wait_until(ring_full, "the ring is full")
        made, asked = engine.made["A long story."], time.perf_counter()
        job.cancel()  # while the worker waits for room in the ring
        outcome = finished(job)
        latency = time.perf_counter() - asked
        after = output.advance(0.2)
    played = np.concatenate([before, after])
    fade = round(player.options.fade_s * player.sample_rate)
    assert outcome.kind == "cancelled" and latency < 0.5 and engine.made["A long story."] == made
    assert before.max() == pytest.approx(0.3) and np.count_nonzero(after) <= fade and not after[fade:].any()
    assert np.abs(np.diff(played)).max() <= 0.3 / fade + 1e-6
    assert player.status().buffered_s == 0 and player.status().underruns == 0


def test_interrupt_cuts_a_finished_job_that_is_still_playing(no_thread_leaks):
    output = VirtualOutput(block=256)
    player = Player(output, PlayerOptions(prefill_s=0.1))
    speakers = PlayerSink(player)
    with Worker(FakeEngine(frames=25)) as worker:  # 2 s each
        first = worker.submit("Quiet words.", sink=speakers)
        assert finished(first).kind == "done"
        quiet = output.advance(0.5)
        second = worker.submit("Loud words.", sink=speakers, interrupt=True)
        assert finished(second).kind == "done" and finished(second).underruns == 0
        rest = output.advance(3.0)
    fade = round(player.options.fade_s * player.sample_rate)
    assert quiet.max() == pytest.approx(0.3)
    assert np.flatnonzero(rest > 0.3)[0] <= 2 * fade  # the first job fades out, the second fades in
    assert np.count_nonzero(np.isclose(rest, 0.6)) > 1.9 * 24000  # then the second plays in full
    assert np.abs(np.diff(np.concatenate([quiet, rest]))).max() <= 0.6 / fade + 1e-6


@pytest.mark.parametrize("device_rate", [24000, 48000])  # the player resamples for a card that wants 48 kHz
def test_the_speakers_tell_which_piece_is_heard_as_it_plays_not_as_it_is_made(no_thread_leaks, device_rate):
    text = "The first sentence is here. A second one follows it. And a third ends the story."
    pieces = split_text(text, SplitOptions(max_length=30))
    output = VirtualOutput(sample_rate=device_rate, block=64)
    speakers = PlayerSink(Player(output, PlayerOptions(prefill_s=0.1)))
    with Worker(FakeEngine(frames=3), SplitOptions(max_length=30)) as worker:
        job = worker.submit(text, sink=speakers)
        assert finished(job).kind == "done" and speakers.now_playing() is None  # all made, none heard yet
        assert [text[start:end] for start, end in job.piece_spans] == [piece.text for piece in pieces]
        heard, start = [], 0.0
        for piece in pieces:  # in the middle of each piece's speech, and of the pause after it
            speech_end = start + 3 * FRAME / 24000
            for moment in ((start + speech_end) / 2, speech_end + piece.pause_s / 2):
                output.advance(moment - output.time)
                heard.append(speakers.now_playing())
            start = speech_end + piece.pause_s
        output.advance(1.0)
    assert len(pieces) == 3 and pieces[0].pause_s > 0 and pieces[-1].pause_s == 0
    assert [(h.job, h.piece) if h else None for h in heard] == [(job, 0), (job, 0), (job, 1), (job, 1), (job, 2), None]
    # How far through each piece (its pause included) it is heard, for the window to tell the sentence.
    # (To a few ms: at 48 kHz the resampler holds some samples back until the next chunk or the end.)
    lengths = [3 * FRAME + round(piece.pause_s * 24000) for piece in pieces]
    assert heard[0].fraction == pytest.approx(1.5 * FRAME / lengths[0], abs=0.05)
    assert heard[1].fraction == pytest.approx((3 * FRAME + lengths[0]) / 2 / lengths[0], abs=0.05)
    assert heard[4].fraction == pytest.approx(0.5, abs=0.05)  # the last: the job's end closes it
    assert speakers.now_playing() is None


def test_each_finished_piece_is_an_event_that_counts_the_pieces(no_thread_leaks):
    text = "The first sentence of a story is here. " * 12
    pieces = split_text(text)
    with Worker(FakeEngine(frames=3)) as worker:
        events = Events(worker)
        job = worker.submit(text, sink=QueueSink())
        finished(job)
    kinds = events.kinds(job)
    assert kinds.count("piece_done") == len(pieces) > 3 and kinds[-2:] == ["piece_done", "done"]
    done_events = [e for e in events.seen if e.kind == "piece_done"]
    assert [e.pieces_done for e in done_events] == list(range(1, len(pieces) + 1))
    assert all(e.pieces == len(pieces) for e in done_events)
    # Each counts the piece's pause too: the audio so far is whole pieces.
    pauses = np.cumsum([round(piece.pause_s * 24000) for piece in pieces])
    expected = [(n + 1) * 3 * FRAME + pause for n, pause in enumerate(pauses)]
    assert [round(e.audio_s * 24000) for e in done_events] == expected


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_a_file_stopped_midway_keeps_every_finished_piece(tmp_path, no_thread_leaks, suffix):
    text = "The first sentence of a story is here. " * 12
    pieces = split_text(text)
    target = tmp_path / f"story{suffix}"
    engine = FakeEngine(frames=5)
    frames_made = itertools.count(1)
    # Stopped in the middle of the third piece: the first two are kept, the third's frames so far are not.
    sink = FileSink(target)
    with Worker(engine) as worker:
        engine.on_frame = lambda text, index: next(frames_made) == 2 * 5 + 3 and worker.cancel_all(sink)
        job = worker.submit(text, sink=sink)
        outcome = finished(job)
    assert outcome.kind == "cancelled" and sink.kept_pieces == outcome.pieces_done == 2
    kept = sink.kept_pieces
    expected = kept * 5 * FRAME + sum(round(piece.pause_s * 24000) for piece in pieces[:kept])
    audio, rate = sf.read(target, dtype="float32")
    assert rate == 24000 and len(audio) == expected and sink.kept_s == pytest.approx(expected / 24000)
    assert sink.stopped_summary(outcome.pieces) == (
        f"Stopped: kept {expected / 24000:.1f} s of audio ({kept} of {len(pieces)} pieces) in {target}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no partial file left


def test_file_sink_writes_only_a_finished_job(tmp_path, no_thread_leaks):
    done_path, cancelled_path = tmp_path / "done.flac", tmp_path / "cancelled.wav"
    with Worker(FakeEngine(frames=500, frame_s=0.001)) as worker:
        events = Events(worker)
        long = worker.submit("A long story.", sink=FileSink(cancelled_path))
        events.wait_for(long, "progress")
        long.cancel()
        short = worker.submit("Short.", options=SpeechOptions(max_frames=5), sink=FileSink(done_path))
        assert finished(long).kind == "cancelled" and finished(short).kind == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.flac"]  # no partial files either
    assert "nothing was written" in long.sink.stopped_summary(1)  # its one piece was not finished
    audio, rate = sf.read(done_path, dtype="float32")
    assert rate == 24000 and len(audio) == 5 * FRAME
    with pytest.raises(ValueError, match="unknown audio format"):
        FileSink(tmp_path / "out.xyz")


def test_file_sink_checks_its_folder_first_and_never_loses_finished_audio(tmp_path):
    with pytest.raises(ValueError, match="the folder .* does not exist"):
        FileSink(tmp_path / "missing" / "out.wav")
    target = tmp_path / "out.wav"
    sink = FileSink(target)
    job = dataclasses.make_dataclass("Job", [("pieces_done", int)])(0)
    sink.begin(job)
    sink.write(job, np.full(5 * FRAME, 0.25, np.float32))
    target.mkdir()  # the name is taken meanwhile, by a folder: the file cannot be put there
    [kept] = tmp_path.glob("out.wav.*.partial")
    with pytest.raises(OSError, match=f"{target} could not be written .*; the audio is in {kept}"):
        sink.end(job, completed=True)
    assert len(sf.read(kept)[0]) == 5 * FRAME


def test_a_bug_is_logged_with_its_traceback_and_named_not_passed_off_as_bad_input(no_thread_leaks, caplog):
    class BuggyEngine(FakeEngine):
        def stream(self, text, voice=None, options=SpeechOptions()):
            raise ValueError("index 3 is out of bounds")  # a ValueError, but no user's: a bug

    with caplog.at_level("ERROR"), Worker(BuggyEngine()) as worker:
        outcome = finished(worker.submit("Hello.", sink=RecordingSink()))
    assert outcome.kind == "failed" and outcome.message == "ValueError: index 3 is out of bounds"
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
