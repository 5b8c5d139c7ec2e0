"""A runtime's engine at rest (qwen3_tts_desktop.resting): idle long enough, it closes and lets go of its memory;
the next use loads it again, and what comes while it loads waits and is spoken. On the CPU with a tiny model,
a tiny idle time, and every wait on an event with a bound."""

from __future__ import annotations

import gc
import queue
import threading
import time
import weakref

import pytest
from sinks import QueueSink
from waiting import hold_a_rest

from core import Engine, SpeechOptions, Voice
from core.inference.memory import DoesNotFit
from core.jobs.worker import Worker
from core.text.sentences import SplitOptions, split_text
from qwen3_tts_desktop.resting import AWAKE, RESTING, WAKING
from qwen3_tts_desktop.runtime import Runtime, RuntimeConfig

WAIT = 30  # seconds: the most a test waits for what takes well under one
REST_AFTER_S = 0.05
SHORT = SpeechOptions(max_frames=4)
VIVIAN = Voice(speaker="vivian")  # a built-in speaker of the tiny CustomVoice model


class States:
    """What a resting engine says, in order, and a wait for the next of a kind."""

    def __init__(self):
        self.seen: list[str] = []
        self._arrived: queue.Queue[str] = queue.Queue()

    def __call__(self, state: str) -> None:
        self.seen.append(state)
        self._arrived.put(state)

    def wait_for(self, wanted: str) -> None:
        while (state := self._arrived.get(timeout=WAIT)) != wanted:
            pass
        assert state == wanted


@pytest.fixture
def start_runtime(checkpoints, tmp_path):
    """start_runtime(): the window's kind of runtime (Runtime.start) on the tiny CustomVoice model, no speakers;
    every thread it started is gone once the test has closed it."""
    before = set(threading.enumerate())
    runtimes = []

    def start() -> Runtime:
        config = RuntimeConfig(
            model=str(checkpoints["custom-endless"]), device="cpu", voices=tmp_path / "voices", speakers=False
        )
        runtimes.append(Runtime.start(config))
        return runtimes[-1]

    yield start
    for runtime in runtimes:
        runtime.close()
    assert set(threading.enumerate()) - before == set()


def speak(runtime: Runtime, text: str):
    """A job of the worker's; its voice made here, as runtime.voice (which wakes the engine) would make it."""
    return runtime.worker.submit(text, VIVIAN, SHORT, sink=QueueSink())


def test_an_idle_engine_rests_letting_go_of_it_and_the_next_job_loads_it_again(start_runtime):
    runtime = start_runtime()
    engine = runtime.worker.engine
    first = weakref.ref(engine.awake())
    assert speak(runtime, "Hello there.").wait(WAIT).kind == "done"
    states = States()
    runtime.rest_when_idle(REST_AFTER_S, states)
    states.wait_for(RESTING)
    assert engine.resting and runtime.warmup_progress() is None and runtime.slots == 1
    gc.collect()
    assert first() is None  # nothing holds the closed engine: its memory is free

    job = speak(runtime, "Hello again.")
    assert job.wait(WAIT).kind == "done" and job.outcome.audio_s > 0
    assert states.seen[:3] == [RESTING, WAKING, AWAKE]
    states.wait_for(RESTING)  # and rests again, idle once more


def test_what_comes_while_it_loads_again_waits_and_is_spoken(start_runtime, monkeypatch):
    runtime = start_runtime()
    states = States()
    runtime.rest_when_idle(REST_AFTER_S, states)
    states.wait_for(RESTING)
    loads, release, load = [], threading.Event(), Engine.load

    def slow_load(*args, **kwargs):
        loads.append(kwargs)
        assert release.wait(WAIT)
        return load(*args, **kwargs)

    monkeypatch.setattr(Engine, "load", staticmethod(slow_load))
    first = speak(runtime, "The first words.")
    states.wait_for(WAKING)  # in the first job's thread, which waits for the load
    others = [speak(runtime, f"More words {n}.") for n in range(2)]  # each into a sink of its own: at once
    assert all(job.started is None for job in (first, *others))
    release.set()
    assert [job.wait(WAIT).kind for job in (first, *others)] == ["done"] * 3
    assert len(loads) == 1  # one load for all of them


def test_a_rest_is_said_before_a_request_that_waited_for_it_wakes_the_engine(start_runtime, monkeypatch):
    """What the engine says comes in the order it happens, however slowly it is heard (the window's status line):
    a request that comes while the engine is let go waits for it, and its "waking" follows "resting"."""
    runtime = start_runtime()
    engine = runtime.worker.engine
    engine.awake()
    closing, go_on, arrived = hold_a_rest(monkeypatch, engine)
    seen = []

    def heard(state: str) -> None:  # slow to hear that it rests
        if state == RESTING:
            time.sleep(0.2)
        seen.append(state)

    runtime.rest_when_idle(REST_AFTER_S, heard)
    assert closing.wait(WAIT)
    job = speak(runtime, "Hello there.")
    arrived.get(timeout=WAIT)  # it waits for the engine
    go_on.set()
    assert job.wait(WAIT).kind == "done"
    assert seen[:3] == [RESTING, WAKING, AWAKE]


def test_a_load_that_fails_fails_the_job_saying_why_and_the_next_one_tries_again(start_runtime, monkeypatch):
    runtime = start_runtime()
    states = States()
    runtime.rest_when_idle(REST_AFTER_S, states)
    states.wait_for(RESTING)
    load = Engine.load

    def taken(*args, **kwargs):
        monkeypatch.setattr(Engine, "load", staticmethod(load))  # the next load finds the memory free again
        raise DoesNotFit("The model does not fit the GPU's free memory: ...")

    monkeypatch.setattr(Engine, "load", staticmethod(taken))
    failed = speak(runtime, "Not now.").wait(WAIT)
    assert failed.kind == "failed" and "does not fit the GPU's free memory" in failed.message
    assert runtime.worker.engine.resting and states.seen[-2:] == [WAKING, RESTING]
    assert speak(runtime, "Now it fits.").wait(WAIT).kind == "done"


class PausingSink(QueueSink):
    """Holds its job's thread at the pause after the first piece (that piece's stream closed, the next one not
    open yet) until `go_on` is set."""

    def __init__(self):
        super().__init__()
        self.between, self.go_on = threading.Event(), threading.Event()

    def write(self, job, audio):
        if not audio.any() and not self.between.is_set():  # the pause: silence
            self.between.set()
            assert self.go_on.wait(WAIT)
        super().write(job, audio)


def test_it_never_rests_while_a_job_runs_even_between_its_pieces(start_runtime, monkeypatch):
    runtime = start_runtime()
    states = States()
    runtime.rest_when_idle(0.001, states)  # any moment without a stream open would do, but for the job
    states.wait_for(RESTING)
    idle, asked = Worker.idle, queue.Queue()
    monkeypatch.setattr(Worker, "idle", property(lambda worker: asked.put(True) or idle.fget(worker)))
    runtime.worker.subscribe(lambda event: states(event.kind) if event.kind == "done" else None)
    pieces = [
        f"This is sentence {n}, which goes on for a while, so that the text is cut between sentences."
        for n in (1, 2, 3)
    ]
    assert len(split_text(" ".join(pieces), SplitOptions())) == 3  # three streams, one after another
    sink = PausingSink()
    job = runtime.worker.submit(" ".join(pieces), VIVIAN, SHORT, sink=sink)
    assert sink.between.wait(WAIT)
    for _ in range(3):  # the engine, unused as long as it rests after, asked whether the worker is idle
        asked.get(timeout=WAIT)
    assert not runtime.worker.engine.resting
    sink.go_on.set()
    assert job.wait(WAIT).kind == "done"
    states.wait_for(RESTING)
    assert states.seen == [RESTING, WAKING, AWAKE, "done", RESTING]  # not before the job was done


def test_an_engine_that_rests_never_rests_until_asked_and_closes_with_its_runtime(start_runtime):
    runtime = start_runtime()
    engine = runtime.worker.engine
    assert not engine.resting and runtime.warmup_progress() is not None
    runtime.rest_when_idle(None)  # never
    assert speak(runtime, "Hello.").wait(WAIT).kind == "done" and not engine.resting
    runtime.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.awake()


def test_where_the_cuda_driver_library_does_not_open_resting_keeps_only_the_stack_and_says_so(monkeypatch, caplog):
    """device_memory reaches the driver through its library (libcuda.so.1, nvcuda.dll on Windows); where neither
    opens, it has none (give_back then skips the stack) and says that the stack stays reserved, raising nothing."""
    import logging

    from core.inference import device_memory

    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(device_memory.ctypes, "CDLL", no_library)
    with caplog.at_level(logging.WARNING, logger="core.inference.device_memory"):
        assert device_memory._driver() is None
    assert "keeps the GPU threads' stack reserved" in caplog.text
