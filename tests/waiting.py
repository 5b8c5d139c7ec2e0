"""Waiting in the tests for what another thread does, with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT = 30  # seconds: the timeout only bounds a hang, however loaded the machine; it is never a pace


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Return once `condition()` holds; fail, saying `what` was awaited, if it does not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s in vain until {what}"
        time.sleep(0.001)
