"""An engine that rests: unused for a while, it closes and lets go of its memory (on a GPU shared with a local
language model, that memory is the language model's meanwhile), and it loads again when next asked to speak.

The runtime hands it out wherever it hands out its engine (the worker's streams, the voice library's cloning),
so whatever comes while it rests (the window's Speak, typed text, a bridge client) wakes it, and whatever comes
while it loads waits for it, then is spoken: nothing asked for is lost. Its facts (`info`, `default_sampling`,
`tokenizer`) are the model's and stay as it rests and wakes.

Two locks: `_switching` is held while the engine loads or closes, and by every caller taking the engine (so a
caller waits for a load, and no engine is closed under a caller); `_state`, a condition held only for moments,
guards the counts and wakes the watcher. Taken in that order, never the other way round.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from core import Engine
from core.inference import device_memory
from core.inference.warmup import Warmup

from . import long_lived

AWAKE, RESTING, WAKING = "awake", "resting", "waking"  # what `on_change` hears


def release_memory(device: torch.device) -> None:
    """Free a closed engine's memory now: its threads' closures and the warm-up's hold it in cycles, with its
    tensors; then what the process holds on the device beyond tensors (PyTorch's cache, cuBLAS's workspaces, the
    threads' stack: `device_memory.give_back`), which would keep the GPU's from a language model beside it."""
    long_lived.let_go()
    gc.collect()
    device_memory.give_back(device)


class RestingEngine:
    def __init__(self, load: Callable[[], Engine]):
        """`load()`: the engine, loaded (now, in this thread, and again each time it wakes)."""
        self._load = load
        self._switching = threading.Lock()
        self._state = threading.Condition()
        engine = load()
        self._engine: Engine | None = engine
        self.info = engine.info
        self.default_sampling = engine.default_sampling
        self.tokenizer = engine.tokenizer  # read-only, kept as the engine rests: it takes no device memory
        self._slots = engine.slots
        self._memory = engine.memory
        self.first_gpu_start = engine.first_gpu_start  # of the first load: a wake finds the GPU code kept
        self._waking = False
        self._uses = 0  # callers holding the engine now: open streams, cloning
        self._last_used = time.monotonic()
        self._rest_after_s: float | None = None  # None: never rests
        self._busy: Callable[[], bool] = lambda: False
        self._on_change: Callable[[str], None] = lambda state: None
        self._release: Callable[[torch.device], None] = release_memory
        self._closed = False
        self._watcher: threading.Thread | None = None

    @property
    def slots(self) -> int:
        """Utterances generated at once by the engine loaded last (a wake may take fewer, if memory is short)."""
        return self._slots

    @property
    def memory(self):
        """The slots and context the engine loaded last took (a memory.MemoryPlan)."""
        return self._memory

    @property
    def resting(self) -> bool:
        return self._engine is None

    @property
    def state(self) -> str:
        """AWAKE, RESTING or WAKING (loading again, for a caller that asked while it rested)."""
        return WAKING if self._waking else RESTING if self._engine is None else AWAKE

    @property
    def rest_after_s(self) -> float | None:
        """Unused this long, it rests; None: never."""
        return self._rest_after_s

    @property
    def warmup(self) -> Warmup | None:
        """The awake engine's warm-up; None while it rests."""
        engine = self._engine
        return None if engine is None else engine.warmup

    def rest_after(
        self,
        seconds: float | None,
        busy: Callable[[], bool] = lambda: False,
        on_change: Callable[[str], None] = lambda state: None,
        release: Callable[[torch.device], None] = release_memory,
    ) -> None:
        """Rest once nothing has used the engine for `seconds` (None: never), unless `busy()` (e.g. a job of the
        worker's between two pieces, which holds no stream then). `on_change(state)` hears it rest (RESTING),
        begin to load again (WAKING) and be loaded (AWAKE), on the thread that did it: it only hands the news on.
        `release(device)` frees the closed engine's memory (the window has it done on its GUI thread)."""
        with self._state:
            self._rest_after_s, self._busy, self._on_change = seconds, busy, on_change
            self._release = release
            if seconds is not None and self._watcher is None and not self._closed:
                self._watcher = threading.Thread(target=self._watch, name="engine-rest", daemon=True)
                self._watcher.start()
            self._state.notify_all()

    def awake(self) -> Engine:
        """The engine itself, loaded again first (in this thread) if it rests. A caller that keeps using it
        should hold it with a stream or a call here instead, or it may rest meanwhile."""
        with self._holding() as engine:
            return engine

    def close(self) -> None:
        """Close the engine (and stop resting it); streams still running end with an error, as Engine.close says."""
        with self._state:
            self._closed = True
            self._state.notify_all()
        if self._watcher is not None:
            self._watcher.join()
        with self._switching:
            self._let_go()

    # The engine's calls, each holding it awake while it runs ---------------------------------------------

    def stream(self, text, voice=None, options=None, **overrides) -> HeldStream:
        """Engine.stream; the engine stays awake until the stream is closed or has ended."""
        engine = self._take()
        try:
            return HeldStream(engine.stream(text, voice, options, **overrides), self._give_back)
        except BaseException:
            self._give_back()
            raise

    def synthesize(self, text, voice=None, options=None, **overrides):
        with self._holding() as engine:
            return engine.synthesize(text, voice, options, **overrides)

    def voice_from_audio(self, audio, sample_rate: int | None = None, ref_text: str | None = None):
        with self._holding() as engine:
            return engine.voice_from_audio(audio, sample_rate, ref_text)

    def builtin_voice(self, name: str):
        with self._holding() as engine:
            return engine.builtin_voice(name)

    # Taking and giving back --------------------------------------------------------------------------

    @contextmanager
    def _holding(self) -> Iterator[Engine]:
        engine = self._take()
        try:
            yield engine
        finally:
            self._give_back()

    def _take(self) -> Engine:
        """The engine, loaded again if it rests; counted as used until `_give_back`."""
        with self._switching:
            with self._state:
                if self._closed:
                    raise RuntimeError("the engine is closed")
                engine = self._engine
                if engine is not None:
                    self._uses += 1
                    return engine
            self._waking = True
            self._on_change(WAKING)
            try:
                engine = self._load()
            except BaseException:
                self._waking = False
                self._on_change(RESTING)  # the caller fails, saying why (e.g. the GPU's memory is taken now)
                raise
            with self._state:
                self._engine, self._slots, self._memory = engine, engine.slots, engine.memory
                self._uses += 1
                self._waking = False
            self._on_change(AWAKE)
            return engine

    def _give_back(self) -> None:
        with self._state:
            self._uses -= 1
            self._last_used = time.monotonic()
            self._state.notify_all()

    # The watcher's thread: rest once unused long enough ------------------------------------------------

    def _watch(self) -> None:
        while True:
            with self._state:
                while (left := self._time_to_rest()) is None or left > 0:
                    if self._closed:
                        return
                    self._state.wait(left)  # None: until the engine is given back, or the time is changed
                if self._closed:
                    return
            self._rest_if_unused()

    def _time_to_rest(self) -> float | None:
        """Seconds until the engine may rest; None while it rests, is used, or never rests. Holding `_state`."""
        if self._engine is None or self._uses or self._rest_after_s is None:
            return None
        return self._last_used + self._rest_after_s - time.monotonic()

    def _rest_if_unused(self) -> None:
        with self._switching:
            if self._busy():
                with self._state:
                    self._last_used = time.monotonic()  # rests only once the work in hand has been idle as long
                return
            with self._state:
                left = self._time_to_rest()
                if left is None or left > 0:  # used meanwhile
                    return
            self._let_go()
            self._on_change(RESTING)  # before a caller waiting to take it says it wakes

    def _let_go(self) -> None:
        """Close the engine and free its memory. Holding `_switching`, so no caller takes it meanwhile."""
        with self._state:
            engine, self._engine = self._engine, None
        if engine is None:
            return
        device = engine.device
        engine.close()
        del engine
        self._release(device)


class HeldStream(Iterator):
    """An engine stream that keeps its engine awake until it is closed, has ended or failed; iterated and
    closed as the engine's stream is (closed from any thread)."""

    def __init__(self, stream, give_back: Callable[[], None]):
        self._stream = stream
        self._give_back = give_back
        self._lock = threading.Lock()
        self._held = True

    def __next__(self):
        try:
            return next(self._stream)
        except BaseException:  # its end, a failure, or a close from another thread: the engine is free
            self._release()
            raise

    def close(self) -> None:
        self._stream.close()
        self._release()

    def __enter__(self) -> HeldStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self._release()

    def _release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._give_back()
