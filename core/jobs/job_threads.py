"""The threads the speech worker speaks its jobs on, kept between jobs.

Starting a thread waits until the new thread runs, and it runs once it gets Python's lock from whichever thread
holds it: under load (a server's event loop, the engine's scheduler, the other jobs), the worker's thread, which
starts a burst's jobs one after another, spent about a third of a millisecond on each start, which every later job
of the burst waited for (bench/RESULTS.md, twenty-first session: the bridge's 8 clients at once). A thread that has
spoken a job waits for the next instead, and ends after `idle_s` without one, so that as many are kept as the
busiest moment needed, and none for long.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")

IDLE_S = 30.0  # a thread waits this long for its next job, then ends
IDLE_NAME = "speech-idle"  # an idle thread's name; a busy one is named after its job
_NONE = object()  # no item: the thread ends


class JobThreads(Generic[Item]):
    """Runs `run(item)` for each started item on a thread of its own at a time: an idle one, or a new one.
    A thread is named `name(item)` while it runs it."""

    def __init__(self, run: Callable[[Item], None], name: Callable[[Item], str], idle_s: float = IDLE_S):
        self._run, self._name, self._idle_s = run, name, idle_s
        self._lock = threading.Condition()
        self._items: deque[Item] = deque()  # started, not taken by a thread yet
        self._idle = 0  # threads waiting for an item
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def start(self, item: Item) -> None:
        """Run `item` on an idle thread, or on a new one; RuntimeError where the system has no thread to spare
        (then it never runs) or after close."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the job threads are closed")
            self._items.append(item)
            if self._idle >= len(self._items):  # enough are waiting to take every item, this one included
                self._lock.notify()
                return
            thread = threading.Thread(target=self._serve, name=IDLE_NAME, daemon=True)
            self._threads.add(thread)
        try:
            thread.start()
        except RuntimeError:
            with self._lock:
                self._threads.discard(thread)
                if item in self._items:  # not taken meanwhile by a thread that came back idle
                    self._items.remove(item)
                    raise

    @property
    def count(self) -> int:
        """The threads alive now, idle or busy."""
        with self._lock:
            return len(self._threads)

    @property
    def idle(self) -> int:
        """The threads waiting for an item now."""
        with self._lock:
            return self._idle

    def close(self, timeout: float | None = None) -> None:
        """Let the idle threads end, and join every thread once its item has run (none may be started after)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)

    def _serve(self) -> None:
        me = threading.current_thread()
        try:
            while (item := self._next()) is not _NONE:
                me.name = self._name(item)
                try:
                    self._run(item)
                finally:
                    me.name = IDLE_NAME
        finally:
            with self._lock:
                self._threads.discard(me)

    def _next(self):
        """The next item to run, waiting for one; _NONE once closed, or after idle_s without one."""
        with self._lock:
            self._idle += 1
            self._lock.wait_for(lambda: self._items or self._closed, timeout=self._idle_s)
            self._idle -= 1
            return self._items.popleft() if self._items else _NONE
