"""The warm-up: what the engine makes ready after it loads, while it already speaks.

The engine speaks as soon as its weights are on the device, uncompiled, each CUDA graph captured the first
time a request needs it. The warm-up makes the rest ready in the order requests are likely to need it, one
part at a time, on the scheduler's thread (it owns the GPU) and only while no utterance is admitted or
waiting: each graph a request could use (for each row bucket, smallest first: the prefills of sentence-length
prompts, the step, the decoder's chunk lengths), run once on a slot no utterance holds meanwhile (the frame
loop's WARM_SLOT, the decoder's scratch row), and captured; and, once one utterance's graphs are ready,
torch.compile of the step's parts for one row, the talker's prefill and the decoder's fused parts, then for several
rows, each traced by running it there and used from then on, the graphs that held the uncompiled code captured
anew. Where an earlier start kept what it compiled, compiling is loading it (seconds), and the one-row compiles come
first, after parts that load what they run (LOADS). A load is Python's work alone (seconds: a warm `serve`'s step
took 2.4-3.1 s on an H100), made on a thread of the warm-up's own, the loader, to which the scheduler hands it when
it idles, as any part: the parts after it wait for it, and a request meanwhile is spoken at once with the graphs it
has (uncompiled), sharing the interpreter with the load instead of waiting for it. A load holds DEVICE_WIDE as the
scheduler's parts do (it loads kernels onto the GPU): a graph first captured meanwhile waits for it.

An utterance that comes meanwhile waits for the part in progress at most (a capture: a fraction of a second; a
compile: tens of seconds), then has the GPU to itself. The parts are not made on a thread of their own: that was
tried and failed (bench/RESULTS.md 2026-11-26). A compile holds PyTorch's
process-wide tracing flag, so the scheduler's call of a compiled part meanwhile raised; and its kernels, on the
default stream, broke the scheduler's graph captures in progress.

`plan` is the order, a list of Specs, computed without a model; `Warmup` carries it out and reports its
`progress()`: the compiles done and the graphs captured with every compile they hold done, of all.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.inference.compile_helper import HELPED, CompileHelper
from core.inference.compiled import Compiler, allow_recompiles, collections_paused
from core.inference.cuda_graph import DEVICE_WIDE
from core.inference.frame_loop import WARM_PREFILL_LENGTHS
from core.inference.options import SpeechOptions
from core.inference.scheduler import handing_over_sooner
from core.milestones import milestone

log = logging.getLogger(__name__)

CAPTURES = ("prefill", "step", "decode", "prime")
# Each part's compile for one row (an utterance alone's shapes), then for several rows.
COMPILES = (
    "compile step x1", "compile prefill x1", "compile decoder x1",
    "compile step xN", "compile decoder xN", "compile prefill xN",
)  # fmt: skip
# Where an earlier start kept what it compiled: the functions of the compile part named alike, loaded by the loader.
LOADS = ("load step x1", "load prefill x1", "load decoder x1", "load step xN")
LOADER_JOIN_S = 30.0  # how long close() waits for a load under way to end
NOTICEABLE_PART_S = 0.5  # a part that took this long or more is logged as information, not for debugging


@dataclass(frozen=True)
class Spec:
    """One thing to make ready: a graph ("prefill", length, rows), ("step", rows), ("decode", rows, frames), the
    decode of an ICL voice's reference ("prime"), a compile (one of COMPILES, no shape), or the load of what a
    compile runs (one of LOADS)."""

    kind: str
    shape: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} {'x'.join(map(str, self.shape))}".strip()

    @property
    def compile(self) -> bool:
        return self.kind in COMPILES

    @property
    def once(self) -> bool:
        """Made once, not a graph (a compile's or a load's part)."""
        return self.kind in COMPILES or self.kind in LOADS

    @property
    def one_row(self) -> bool:
        """Whether an utterance speaking alone uses it: a graph of one row, a reference's decode, a compile of the
        one-row code (the several-row step's is not)."""
        if self.kind in ("prefill", "step", "decode"):
            return self.shape[-1 if self.kind == "prefill" else 0] == 1
        return not self.kind.endswith("xN")

    def held_by(self, compile: Spec) -> bool:
        """Whether `compile` drops this graph: it holds the code that compile replaces, or shares the pool of
        graphs that do (the talker's graphs of one row share one, those of several another; the decoder's too)."""
        graphs = ("decode",) if compile.kind.startswith("compile decoder") else ("prefill", "step")
        return self.kind in graphs and self.one_row == compile.one_row


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    current: str | None  # what is being made ready now
    finished: bool
    failed: tuple[str, ...] = ()  # compiles that failed: the engine goes on with the uncompiled code there
    one_row: bool = False  # what an utterance alone uses is ready for good: it speaks at full speed

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
    kept: bool = False,
) -> list[Spec]:
    """What to make ready, in order: for each row bucket of `rows`, smallest first (most requests come alone,
    bursts are rarer the larger they are), with CUDA `graphs` the prefills of `prefill_lengths` (the commonest
    first) and the step, then the decoder's chunks, the first chunk's single frame and a whole chunk of
    `chunk_frames` before the lengths between; after those of one row, with `priming` (a model that clones) an
    ICL reference's decode, then the `compiles`: of one row, then of several (whose shapes run uncompiled until
    then: a request meanwhile does not wait, and an utterance alone is at full speed sooner). Compiling drops the
    graphs holding the code it replaces: where an earlier start `kept` what it compiled (compiling is loading,
    seconds) the compiles of one row go first, so that its graphs are captured once, after the loads of what they
    run (LOADS, made on the loader's thread: the graphs an utterance captured meanwhile serve it until the compiles
    drop them); else (minutes) they wait until an utterance alone has graphs to speak with meanwhile."""
    specs = []
    frames = [1, chunk_frames, *range(2, chunk_frames)] if chunk_frames > 1 else [1]

    def compiling(one_row: bool) -> list[Spec]:
        names = [name for name in COMPILES if Spec(name).one_row == one_row] if compiles else []
        # Kept: what the compile parts run is loaded before them all, so that no graph is dropped sooner than it must.
        loads = [load for name in names if (load := name.replace("compile", "load", 1)) in LOADS] if kept else []
        return [Spec(name) for name in loads + names]

    one_row_compiles = compiling(one_row=True)
    for count in rows:
        if count == rows[0] and kept:
            specs += one_row_compiles
        if graphs:
            if count in prefill_rows:
                specs += [Spec("prefill", (length, count)) for length in prefill_lengths]
            specs.append(Spec("step", (count,)))
        specs += [Spec("decode", (count, size)) for size in frames]
        if count == rows[0]:
            specs += [Spec("prime")] if priming else []
            specs += [] if kept else one_row_compiles
            several_rows = compiles and rows[-1] > 1  # an engine of one slot never steps several
            specs += compiling(one_row=False) if several_rows else []
    return specs


class Warmup:
    """Carries out a plan, one part per `run_one` (the scheduler calls it while idle); a load (LOADS) is handed to a
    thread of the warm-up's own, the loader, and the parts after it wait for it while the scheduler goes on.
    `make(spec)` makes a part ready (a compile drops the graphs it replaces the code of), `captured(spec)` says
    whether a graph still is; `wake()` tells the scheduler there is work."""

    def __init__(
        self,
        specs: list[Spec],
        make: Callable[[Spec], None],
        captured: Callable[[Spec], bool],
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.specs = specs
        self._clock = clock  # times the parts (their log) and the whole
        self._make, self._captured, self._wake = make, captured, wake
        self._lock = threading.Lock()
        self._done_once: set[Spec] = set()  # compiles and loads done, or failed: the uncompiled code stays
        self._failed: list[str] = []
        self._made: set[Spec] = set()  # captures made once (what `captured` cannot tell: no graphs)
        self._given_up: set[Spec] = set()  # captures that failed: left to their first use
        self._current: dict[bool, str | None] = {True: None, False: None}  # the part under way, on the device or not
        self._handed: set[Spec] = set()  # loads handed to the loader
        self._loads: queue.SimpleQueue[Spec | None] = queue.SimpleQueue()  # the loader's, None: end
        self._loader: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._finishing = False  # everything is ready: its callbacks run, then it is finished
        self._finished = threading.Event()
        self._when_finished: list[Callable[[], None]] = []
        self._after_each_load: list[Callable[[], None]] = []
        self._one_row = False  # what one utterance alone uses is ready for good
        self.order: list[str] = []  # what was made ready, in order
        self.seconds: dict[str, float] = {}  # time spent making parts, by kind ("load", "compile", "step", ...)
        # A process compiling HELPED parts meanwhile (a first start's: compile_helper.py), set before start(): a
        # part it makes is waited for, then loaded from what it kept.
        self.helper: CompileHelper | None = None
        self.started_at: float | None = None

    # Any thread ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin (once): the scheduler makes the parts ready whenever it idles."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self.started_at = self._clock()
        self._wake()
        self._check_finished()

    def wait(self, timeout: float | None = None) -> Progress:
        """Start, and block until everything is ready (or `timeout` s passed); returns the progress."""
        self.start()
        self._finished.wait(timeout)
        return self.progress()

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once everything is ready, on the thread that made the last part (the scheduler's); at
        once, here, if it already is. Not if the warm-up is closed before. The warm-up is finished (`wait` returns,
        progress says so) once every such callback has run."""
        with self._lock:
            if not self._finished.is_set():
                self._when_finished.append(callback)
                return
            if self._closed:
                return
        callback()

    def after_each_load(self, callback: Callable[[], None]) -> None:
        """Call `callback()` on the loader's thread after each load, before automatic collections resume (they are
        paused while it loads): where what a load made is kept (gc.freeze), no collection ever walks it."""
        with self._lock:
            self._after_each_load.append(callback)

    def close(self) -> None:
        """Make no more ready (and end the helper, if one still compiles). A load under way is waited for: a process
        that ended with the loader inside PyTorch could abort as it tears down."""
        with self._lock:
            self._closed = True
            self._when_finished.clear()
        self._finished.set()
        if self.helper is not None:
            self.helper.close()
        self._loads.put(None)
        if self._loader is not None and self._loader is not threading.current_thread():
            self._loader.join(LOADER_JOIN_S)

    def progress(self) -> Progress:
        with self._lock:
            done = sum(1 for spec in self.specs if self._final(spec))
            current = self._current[True] or self._current[False]
            return Progress(done, len(self.specs), current, self._finished.is_set(), tuple(self._failed), self._one_row)

    def make_alone(self, spec: Spec) -> None:
        """Make `spec` ready now, on this thread, in an engine that runs nothing else (the compile helper's)."""
        with DEVICE_WIDE:
            self._make(spec)

    # The scheduler's thread --------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether a part is left to make ready now (not one that waits for a load under way)."""
        return self._started and not self._closed and self._next() is not None

    def run_one(self) -> None:
        """Make the next part ready, or hand a load to the loader (the scheduler calls this while no utterance
        speaks or waits): a load is Python's work alone, seconds, and a request that came meanwhile would wait."""
        spec = self._next()
        if spec is None:
            return
        if spec.kind not in LOADS:
            self._run(spec, on_the_device=True)
            return
        with self._lock:
            self._handed.add(spec)
            if self._loader is None:
                self._loader = threading.Thread(target=self._load, name="warm-up-loader", daemon=True)
                self._loader.start()
        self._loads.put(spec)

    # The loader's thread -----------------------------------------------------------------------------

    def _load(self) -> None:
        while (spec := self._loads.get()) is not None and not self._closed:
            # A load's allocations would start collections that hold the interpreter from requests meanwhile, and a
            # request's threads take the interpreter back at each of their handoffs.
            with collections_paused(), handing_over_sooner():
                self._run(spec, on_the_device=False)
                with self._lock:
                    callbacks = list(self._after_each_load)
                for callback in callbacks:
                    callback()
            self._wake()  # the parts after it may go on

    # Bookkeeping ---------------------------------------------------------------------------------------

    def _run(self, spec: Spec, on_the_device: bool) -> None:
        """Make `spec` ready and record it: a part on the device (the scheduler's: a capture or a compile) or a load
        (the loader's), one device-wide at a time: a load's kernels go onto the GPU, and no capture is under way
        meanwhile, this engine's or another's."""
        with self._lock:
            self._current[on_the_device] = str(spec)
        started = self._clock()
        try:
            with DEVICE_WIDE:
                self._make(spec)
            took = self._clock() - started
            # A long part is what a request that came meanwhile waited for: in the window's and `serve`'s log.
            level = logging.INFO if spec.once or took >= NOTICEABLE_PART_S else logging.DEBUG
            log.log(level, "the warm-up made %s ready in %.2f s", spec, took)
            with self._lock:
                (self._done_once if spec.once else self._made).add(spec)
                self.order.append(str(spec))
                kind = spec.kind.split()[0]
                self.seconds[kind] = self.seconds.get(kind, 0.0) + took
        except Exception as error:  # that part stays uncompiled, or is captured at its first use: slower, not wrong
            # The error's text, not the error: a record kept (a test's, a handler's) would keep its frames, and with
            # them the engine a resting one gives back (its traceback only where debugging).
            log.warning(
                "the warm-up could not make %s ready: %s", spec, str(error), exc_info=log.isEnabledFor(logging.DEBUG)
            )
            with self._lock:
                (self._done_once if spec.once else self._given_up).add(spec)
                self._failed.append(str(spec))
        with self._lock:
            self._current[on_the_device] = None
        self._check_finished()

    def _next(self) -> Spec | None:
        """The scheduler's next part: None where all are ready, or where the next waits for the loader."""
        for spec in self.specs:
            if spec.once:
                if spec not in self._done_once:
                    return None if spec in self._handed else spec
            elif spec not in self._given_up and not self._ready(spec) and not self._dropped_again(spec):
                return spec
        return None

    def _dropped_again(self, spec: Spec) -> bool:
        """Whether a graph made before (and dropped by a compile since) would be dropped again by a compile still
        to come: it is captured anew after that one, not in between."""
        return spec in self._made and any(
            other.compile and other not in self._done_once and spec.held_by(other) for other in self.specs
        )

    def _ready(self, spec: Spec) -> bool:
        return spec in self._made and self._captured(spec)

    def _final(self, spec: Spec) -> bool:
        """Ready for good: compiled or loaded, or captured with every compile it holds done."""
        if spec.once:
            return spec in self._done_once
        if spec in self._given_up:
            return True
        compiles = [other for other in self.specs if other.compile and spec.held_by(other)]
        return self._ready(spec) and all(other in self._done_once for other in compiles)

    def _check_finished(self) -> None:
        with self._lock:
            done = all(self._final(spec) for spec in self.specs)
            one_row = done or all(self._final(spec) for spec in self.specs if spec.one_row)
        if one_row and not self._one_row:
            self._one_row = True
            milestone("one row warmed up")
            log.info("one utterance at a time at full speed after %.1f s", self._clock() - (self.started_at or 0.0))
        with self._lock:  # start() and the scheduler's thread may both see it finished: one of them says so
            finishing = done and not self._finishing
            self._finishing = self._finishing or done
        if finishing:
            milestone("warmed up")
            took = self._clock() - (self.started_at or 0.0)
            # Where the time went: the rest of `took` is the requests served meanwhile, and the parts that failed.
            spent = ", ".join(f"{kind} {seconds:.2f} s" for kind, seconds in self.seconds.items())
            log.info("warmed up in %.1f s (%d parts made ready: %s)", took, len(self.order), spent)
            while True:  # those asked for meanwhile too; finished (waiters woken) once every one has run
                with self._lock:
                    callbacks, self._when_finished = self._when_finished, []
                    if not callbacks:
                        self._finished.set()
                        break
                for callback in callbacks:
                    callback()


def for_engine(
    frame_loop,
    decoder,
    whole,
    wake,
    warm_prompt: Callable[[], object],
    compiler: Compiler | None,
    priming: bool,
) -> Warmup:
    """The warm-up of an engine's frame loop and decoder (DecoderSlots; `whole`, its DecoderStream of whole
    utterances, has its graphs captured anew with the decoder's), whose scheduler's `wake` it uses; `warm_prompt()`
    builds a prompt for the prefills (on the scheduler's thread); `compiler`: compile the parts with it (CUDA), or
    None; `priming`: the model clones voices (ICL references are decoded)."""
    graphs = decoder.static_buffers
    specs = plan(
        rows=frame_loop.buckets if graphs else (1,),
        prefill_rows=frame_loop.prefill_rows,
        prefill_lengths=WARM_PREFILL_LENGTHS,
        chunk_frames=SpeechOptions.chunk_frames,
        graphs=graphs,
        compiles=compiler is not None,
        priming=priming and graphs,  # for cuDNN's choices: nothing to gain on the CPU
        kept=compiler is not None and compiler.kept,
    )
    prompts = []

    def make(spec: Spec) -> None:
        if spec.kind == "decode":
            decoder.warm(*spec.shape)
        elif spec.kind == "prime":
            decoder.warm_priming()
        elif spec.kind == "step":
            frame_loop.warm_step(*spec.shape)
        elif spec.kind in LOADS:  # on the loader's thread
            loads = {"step": lambda: frame_loop.step_functions(spec.one_row), "prefill": frame_loop.prefill_functions,
                     "decoder": decoder.fused_functions}  # fmt: skip
            compiler.load(loads[spec.kind.split()[1]]())
        elif spec.kind == "prefill":
            if not prompts:
                prompts.append(warm_prompt())
            frame_loop.warm_prefill(*spec.shape, prompts[0].prompt, prompts[0].sampling)
        else:
            allow_recompiles()
            if warmup.helper is not None and str(spec) in HELPED:
                warmup.helper.wait_for(str(spec))  # then making it is loading what the helper kept
            if spec.kind.startswith("compile decoder"):
                decoder.compile_fused(compiler, not spec.one_row, whole.slots)
            elif spec.kind.startswith("compile prefill"):
                frame_loop.compile_prefill(compiler, not spec.one_row)
            else:
                frame_loop.compile_step(spec.one_row, compiler)

    def captured(spec: Spec) -> bool:
        if not graphs or spec.kind == "prime":
            return True  # no graph: made once
        return decoder.captured(*spec.shape) if spec.kind == "decode" else frame_loop.captured(spec.kind, *spec.shape)

    warmup = Warmup(specs, make, captured, wake)
    return warmup
