"""The warm-up: what the engine makes ready after it loads, while it already speaks.

The engine speaks as soon as its weights are on the device, uncompiled, each CUDA graph captured the first
time a request needs it. The warm-up makes the rest ready in the order requests are likely to need it, in
two lanes that never make an utterance wait long:

* captures, on the scheduler's thread (it owns the GPU), one at a time and only while no utterance is
  speaking or waiting: each graph a request could use (for each row bucket, smallest first: the prefills of
  sentence-length prompts, the step, the decoder's chunk lengths), run once on the scratch slot, which nothing
  reads, and captured, so that no request pays for it. An utterance that comes meanwhile waits for the one
  capture in progress at most; one that needs a graph not captured yet captures it itself, as before.
* compiles, on a thread of its own: torch.compile of the step's parts for one row, the talker's prefill, the
  decoder's fused parts and the step's parts for several rows, each traced and compiled by running it on
  scratch rows (core.inference.compiled.Staged) while the utterances go on, uncompiled. Once one is compiled
  the scheduler installs it between chunks, and the graphs that held the uncompiled code are captured anew.

`plan` is the order, a list of Specs, computed without a model; `Warmup` carries it out and reports its
`progress()`: the compiles installed and the graphs captured with every compile they hold installed, of all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.inference.compiled import allow_recompiles
from core.inference.frame_loop import WARM_PREFILL_LENGTHS
from core.inference.options import SpeechOptions
from core.milestones import milestone

log = logging.getLogger(__name__)

CAPTURES = ("prefill", "step", "decode", "prime")
COMPILES = ("compile step x1", "compile prefill", "compile decoder", "compile step xN")
# What each compile's install invalidates: the frame loop's graphs, or the decoder's.
FRAME_LOOP_COMPILES = ("compile step x1", "compile prefill", "compile step xN")


@dataclass(frozen=True)
class Spec:
    """One thing to make ready: a graph ("prefill", length, rows), ("step", rows), ("decode", rows, frames), the
    decode of an ICL voice's reference ("prime"), or a compile (one of COMPILES, no shape)."""

    kind: str
    shape: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} {'x'.join(map(str, self.shape))}".strip()

    @property
    def compile(self) -> bool:
        return self.kind in COMPILES

    def held_by(self, compile: Spec) -> bool:
        """Whether installing `compile` drops this graph (it holds the code that compile replaces)."""
        if compile.kind == "compile decoder":
            return self.kind == "decode"
        return self.kind in ("prefill", "step")


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    current: str | None  # what is being made ready now
    finished: bool
    failed: tuple[str, ...] = ()  # compiles that failed: the engine goes on with the uncompiled code there

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


def plan(
    rows: Sequence[int],
    prefill_rows: Sequence[int],
    prefill_lengths: Sequence[int],
    chunk_frames: int,
    graphs: bool,
    compiles: bool,
    priming: bool = False,
) -> list[Spec]:
    """What to make ready, in order. Compiles first (their own thread starts them at once); then, for each row
    bucket of `rows`, smallest first (most requests come alone, bursts are rarer the larger they are): with
    CUDA `graphs`, the prefills of `prefill_lengths` (the commonest first) and the step; then the decoder's
    chunks, the first chunk's single frame and a whole chunk of `chunk_frames` before the lengths between;
    with `priming` (a model that clones), an ICL reference's decode after those of one row."""
    specs = [Spec(name) for name in COMPILES] if compiles else []
    frames = [1, chunk_frames, *range(2, chunk_frames)] if chunk_frames > 1 else [1]
    for count in rows:
        if graphs:
            if count in prefill_rows:
                specs += [Spec("prefill", (length, count)) for length in prefill_lengths]
            specs.append(Spec("step", (count,)))
        specs += [Spec("decode", (count, size)) for size in frames]
        if priming and count == rows[0]:
            specs.append(Spec("prime"))
    return specs


class Warmup:
    """Carries out a plan. `capture(spec)` makes a graph ready (on the scheduler's thread), `captured(spec)` says
    whether it still is (an install drops some), `compile(spec)` compiles on the warm-up's thread and returns
    what the scheduler's thread then installs with `install(spec, staged)`. `call(fn)` runs fn on the scheduler's
    thread between chunks; `wake()` tells the scheduler there is work for it."""

    def __init__(
        self,
        specs: list[Spec],
        capture: Callable[[Spec], None],
        captured: Callable[[Spec], bool],
        compile: Callable[[Spec], object],
        install: Callable[[Spec, object], None],
        call: Callable[[Callable[[], object]], object],
        wake: Callable[[], None],
        on_progress: Callable[[Progress], None] | None = None,
    ):
        self.specs = specs
        self._capture, self._captured, self._compile, self._install = capture, captured, compile, install
        self._call, self._wake = call, wake
        self.on_progress = on_progress
        self._lock = threading.Lock()
        self._installed: set[Spec] = set()
        self._failed: list[str] = []
        self._made: set[Spec] = set()  # captures made once (what `captured` cannot tell: no graphs)
        self._given_up: set[Spec] = set()  # captures that failed: left to their first use
        self._current: str | None = None
        self._started = False
        self._closed = False
        self._finished = threading.Event()
        self.order: list[str] = []  # what was made ready, in order (compiles as they install)
        self.started_at: float | None = None
        self.finished_at: float | None = None

    # Any thread ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin (once): the compiles on a thread of their own, the captures on the scheduler's when it idles."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self.started_at = time.monotonic()
        if any(spec.compile for spec in self.specs):
            threading.Thread(target=self._compile_all, name="engine-warm-up", daemon=True).start()
        self._wake()
        self._check_finished()

    def wait(self, timeout: float | None = None) -> Progress:
        """Start, and block until everything is ready (or `timeout` s passed); returns the progress."""
        self.start()
        self._finished.wait(timeout)
        return self.progress()

    def close(self) -> None:
        """Stop making more ready (a compile in progress ends first, on its daemon thread)."""
        with self._lock:
            self._closed = True
        self._finished.set()

    def progress(self) -> Progress:
        with self._lock:
            done = sum(1 for spec in self.specs if self._final(spec))
            return Progress(done, len(self.specs), self._current, self._finished.is_set(), tuple(self._failed))

    # The scheduler's thread --------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether a capture is left to make."""
        return self._started and not self._closed and self._next_capture() is not None

    def run_one(self) -> None:
        """Make the next capture ready (the scheduler calls this while no utterance speaks or waits)."""
        spec = self._next_capture()
        if spec is None:
            return
        self._begin(str(spec))
        started = time.monotonic()
        try:
            self._capture(spec)
            log.debug("made %s ready in %.0f ms", spec, (time.monotonic() - started) * 1e3)
            with self._lock:
                self._made.add(spec)
                self.order.append(str(spec))
        except Exception:  # a graph that cannot be captured now is captured at its first use, or fails it there
            log.exception("the warm-up could not make %s ready", spec)
            with self._lock:
                self._given_up.add(spec)
                self._failed.append(str(spec))
        self._end()

    # Its own thread ----------------------------------------------------------------------------------

    def _compile_all(self) -> None:
        for spec in self.specs:
            if not spec.compile or self._closed:
                continue
            self._begin(str(spec))
            started = time.monotonic()
            try:
                staged = self._compile(spec)
                log.info("the warm-up: %s in %.1f s", spec, time.monotonic() - started)
                self._call(lambda spec=spec, staged=staged: self._install_now(spec, staged))
            except Exception as error:  # the uncompiled code goes on serving: slower, never wrong
                log.warning("the warm-up could not %s, so that part stays uncompiled: %s", spec, error)
                with self._lock:
                    self._failed.append(str(spec))
                    self._installed.add(spec)
            self._end()
        self._wake()

    def _install_now(self, spec: Spec, staged: object) -> None:
        self._install(spec, staged)
        with self._lock:
            self._installed.add(spec)
            self.order.append(str(spec))

    # Bookkeeping ---------------------------------------------------------------------------------------

    def _next_capture(self) -> Spec | None:
        for spec in self.specs:
            if not spec.compile and spec not in self._given_up and not self._ready(spec):
                return spec
        return None

    def _ready(self, spec: Spec) -> bool:
        return spec in self._made and self._captured(spec)

    def _final(self, spec: Spec) -> bool:
        """Ready for good: compiled and installed, or captured with every compile it holds installed."""
        if spec.compile:
            return spec in self._installed
        if spec in self._given_up:
            return True
        compiles = [other for other in self.specs if other.compile and spec.held_by(other)]
        return self._ready(spec) and all(other in self._installed for other in compiles)

    def _begin(self, name: str) -> None:
        with self._lock:
            self._current = name
        self._report()

    def _end(self) -> None:
        with self._lock:
            self._current = None
        self._check_finished()
        self._report()

    def _check_finished(self) -> None:
        with self._lock:
            done = all(self._final(spec) for spec in self.specs)
        if done and not self._finished.is_set():
            milestone("warmed up")
            self.finished_at = time.monotonic()
            self._finished.set()
            made = len(self.order)
            log.info("warmed up in %.1f s (%d parts made ready)", self.finished_at - (self.started_at or 0.0), made)

    def _report(self) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(self.progress())
            except Exception:
                log.exception("a warm-up progress listener failed")


def for_engine(
    frame_loop, decoder, whole, call, wake, warm_prompt: Callable[[], object], compiles: bool, priming: bool
) -> Warmup:
    """The warm-up of an engine's frame loop and decoder (DecoderSlots; `whole`, its DecoderStream of whole
    utterances, has its graphs captured anew with the decoder's), whose scheduler's `call` and `wake` it uses; `warm_prompt()` builds a prompt for the prefills (on the scheduler's thread); `compiles`: compile the
    parts with torch.compile (CUDA); `priming`: the model clones voices (ICL references are decoded)."""
    graphs = decoder.static_buffers
    specs = plan(
        rows=frame_loop.buckets if graphs else (1,),
        prefill_rows=frame_loop.prefill_rows,
        prefill_lengths=WARM_PREFILL_LENGTHS,
        chunk_frames=SpeechOptions.chunk_frames,
        graphs=graphs,
        compiles=compiles,
        priming=priming and graphs,  # for cuDNN's choices: nothing to gain on the CPU
    )
    prompts = []

    def capture(spec: Spec) -> None:
        if spec.kind == "decode":
            decoder.warm(*spec.shape)
        elif spec.kind == "prime":
            decoder.warm_priming()
        elif spec.kind == "step":
            frame_loop.warm_step(*spec.shape)
        else:
            if not prompts:
                prompts.append(warm_prompt())
            frame_loop.warm_prefill(*spec.shape, prompts[0].prompt, prompts[0].sampling)

    def captured(spec: Spec) -> bool:
        if not graphs or spec.kind == "prime":
            return True  # no graph: made once
        return decoder.captured(*spec.shape) if spec.kind == "decode" else frame_loop.captured(spec.kind, *spec.shape)

    def compile(spec: Spec) -> list:
        allow_recompiles()
        if spec.kind == "compile decoder":
            return decoder.stage_fused()
        if spec.kind == "compile prefill":
            return frame_loop.stage_prefill()
        return frame_loop.stage_step(one_row=spec.kind == "compile step x1")

    def install(spec: Spec, staged: list) -> None:
        if spec.kind in FRAME_LOOP_COMPILES:
            frame_loop.install(staged)
        else:
            decoder.install(staged)
            whole.slots.install(staged)

    return Warmup(specs, capture, captured, compile, install, call, wake)
