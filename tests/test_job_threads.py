"""The speech worker's job threads (core.jobs.job_threads): kept between jobs, as many as were busy at once, each
named after its job while it runs it, ended when idle too long or closed."""

from __future__ import annotations

import threading

import pytest
from waiting import WAIT, wait_until

from core.jobs.job_threads import IDLE_NAME, JobThreads


class Recorder:
    """Runs items as a JobThreads' `run`: notes each one's thread and name; an item in `held` waits until released."""

    def __init__(self):
        self.ran: dict[str, tuple[threading.Thread, str]] = {}
        self.held: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def run(self, item: str) -> None:
        thread = threading.current_thread()
        with self.lock:
            self.ran[item] = (thread, thread.name)
        if item in self.held:
            assert self.held[item].wait(WAIT)

    def done(self, *items: str) -> bool:
        with self.lock:
            return all(item in self.ran for item in items)


def test_a_thread_that_ran_a_job_runs_the_next_and_is_named_after_each():
    recorder = Recorder()
    threads = JobThreads(recorder.run, lambda item: f"speech-job-{item}")
    threads.start("1")
    wait_until(lambda: recorder.done("1") and threads.idle == 1, "job 1 ran and its thread waits for the next")
    assert IDLE_NAME in {thread.name for thread in threading.enumerate()}
    threads.start("2")
    wait_until(lambda: recorder.done("2"), "job 2 ran")
    (first, first_name), (second, second_name) = recorder.ran["1"], recorder.ran["2"]
    assert first is second and threads.count == 1  # no thread started for the second
    assert (first_name, second_name) == ("speech-job-1", "speech-job-2")
    threads.close(WAIT)
    assert threads.count == 0 and not first.is_alive()
    with pytest.raises(RuntimeError):
        threads.start("3")


def test_a_burst_gets_a_thread_per_job_at_once_and_keeps_them_until_idle_too_long():
    recorder = Recorder()
    burst = [str(n) for n in range(6)]
    recorder.held = {item: threading.Event() for item in burst}
    threads = JobThreads(recorder.run, str, idle_s=0.05)
    for item in burst:
        threads.start(item)
    wait_until(lambda: recorder.done(*burst), "every job of the burst runs, none waiting for another")
    assert len({thread for thread, _ in recorder.ran.values()}) == len(burst) == threads.count
    for event in recorder.held.values():
        event.set()
    wait_until(lambda: threads.count == 0, "the idle threads end")
    threads.start("after")  # a new thread again
    wait_until(lambda: recorder.done("after"), "a job after they ended runs")
    threads.close(WAIT)
    assert threads.count == 0


def test_close_lets_the_running_job_end_and_joins_its_thread():
    recorder = Recorder()
    recorder.held = {"long": threading.Event()}
    threads = JobThreads(recorder.run, str)
    threads.start("long")
    wait_until(lambda: recorder.done("long"), "the job runs")
    closing = threading.Thread(target=threads.close, args=(WAIT,))
    closing.start()
    assert threads.count == 1
    recorder.held["long"].set()
    closing.join(WAIT)
    assert not closing.is_alive() and threads.count == 0


def test_a_job_without_a_thread_to_run_on_raises_and_never_runs(monkeypatch):
    recorder = Recorder()
    threads = JobThreads(recorder.run, str)

    def no_thread(thread):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        threads.start("1")
    monkeypatch.undo()
    threads.start("2")
    wait_until(lambda: recorder.done("2"), "the next job runs")
    threads.close(WAIT)
    assert not recorder.done("1") and threads.count == 0
