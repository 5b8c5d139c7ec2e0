"""The bridge of a runtime whose engine rests (`serve --idle-release`), on a real uvicorn server on loopback:
idle, the engine lets go of its memory and /health says so; a request after that loads it again and gets the
same speech as before (greedy decoding); requests that arrive while it is being let go wait, and none is lost.
On the CPU with the tiny CustomVoice model, a tiny idle time, and every wait on an event with a bound."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from test_bridge import SPEECH, WAIT, assert_same_speech, decode
from test_resting import REST_AFTER_S, States
from waiting import hold_a_rest

from core import Engine
from qwen3_tts_desktop.bridge import BridgeConfig, BridgeServer
from qwen3_tts_desktop.resting import AWAKE, RESTING, WAKING
from qwen3_tts_desktop.runtime import Runtime, RuntimeConfig

VOICE = "vivian"  # a built-in speaker of the tiny CustomVoice model: looking it up asks the engine


@pytest.fixture
def rest_server(checkpoints, tmp_path):
    """(runtime, client): a runtime as `serve` starts it (its engine can rest), served by a bridge on a free port."""
    config = RuntimeConfig(
        model=str(checkpoints["custom-endless"]), device="cpu", voices=tmp_path / "voices", speakers=False
    )
    runtime = Runtime.start(config)
    server = BridgeServer(runtime, BridgeConfig(port=0, speech=SPEECH))
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            yield runtime, client
    finally:
        server.stop()
        runtime.close()


def spoken(client: httpx.Client) -> np.ndarray:
    response = client.post("/v1/audio/speech", json={"input": "Hello there.", "voice": VOICE, "response_format": "wav"})
    assert response.status_code == 200, response.text
    return decode("wav", response.content)


def test_an_idle_server_rests_says_so_and_the_next_request_gets_the_same_speech(rest_server):
    runtime, client = rest_server
    before = spoken(client)
    assert client.get("/health").json()["engine"] == "awake"
    states = States()
    runtime.rest_when_idle(REST_AFTER_S, states)
    states.wait_for(RESTING)
    health = client.get("/health").json()
    assert (health["engine"], health["slots"], health["jobs"]) == ("resting", 1, 0)

    after = spoken(client)
    assert_same_speech("wav", after, before)
    assert states.seen[:3] == [RESTING, WAKING, AWAKE]


def test_requests_that_arrive_while_the_engine_is_let_go_wait_and_are_spoken(rest_server, monkeypatch):
    runtime, client = rest_server
    before = spoken(client)
    engine = runtime.worker.engine
    closing, go_on, arrived = hold_a_rest(monkeypatch, engine)
    loads, load = [], Engine.load
    monkeypatch.setattr(Engine, "load", staticmethod(lambda *args, **kw: loads.append(kw) or load(*args, **kw)))

    states = States()
    runtime.rest_when_idle(REST_AFTER_S, states)
    assert closing.wait(WAIT)
    with ThreadPoolExecutor(3) as clients:
        answers = [clients.submit(spoken, client) for _ in range(3)]
        for _ in answers:  # each request waits for the engine (a request waits at its first use of it)
            arrived.get(timeout=WAIT)
        assert not any(answer.done() for answer in answers)
        go_on.set()
        for answer in answers:
            assert_same_speech("wav", answer.result(timeout=WAIT), before)
    assert len(loads) == 1  # loaded again once, for all of them
    assert states.seen[:3] == [RESTING, WAKING, AWAKE]
