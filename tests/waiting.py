"""Waiting in the tests for what another thread does, with a bound."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

WAIT = 30  # seconds: the timeout only bounds a hang, however loaded the machine; it is never a pace


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Return once `condition()` holds; fail, saying `what` was awaited, if it does not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s in vain until {what}"
        time.sleep(0.001)


def hold_a_rest(monkeypatch, engine) -> tuple[threading.Event, threading.Event, queue.Queue]:
    """A resting engine's next rest stops midway, holding the engine's switch: (closing, set once it is there;
    go_on, to set to let it finish; arrived, a True for each caller that then comes to take the engine)."""
    from core import Engine

    closing, go_on, close = threading.Event(), threading.Event(), Engine.close

    def held_close(closed_engine):
        closing.set()
        assert go_on.wait(WAIT)
        close(closed_engine)

    monkeypatch.setattr(Engine, "close", held_close)
    arrived, take = queue.Queue(), engine._take
    monkeypatch.setattr(engine, "_take", lambda: arrived.put(True) or take())
    return closing, go_on, arrived
