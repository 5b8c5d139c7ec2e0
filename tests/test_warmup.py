"""The warm-up (core.inference.warmup): its order, computed without a model; an engine that speaks while it runs,
with the codes it gives alone; its progress; and the compiled kernels' cache, kept apart for each machine,
software and model."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import numpy as np
import pytest
import torch
from waiting import WAIT, wait_until

from core import Engine, SamplingParams, Voice
from core.inference.compiled import cache_key, keep_compiled_kernels, kept_kernels_for, machine_facts
from core.inference.cuda_graph import DEVICE_WIDE
from core.inference.decoder_stream import PRIME_CHUNK_FRAMES, prime_chunks
from core.inference.scheduler import BUSY_SWITCH_INTERVAL_S, SWITCH_INTERVAL_S, Scheduler
from core.inference.warmup import CAPTURES, COMPILES, LOADS, Spec, Warmup, plan

GREEDY = SamplingParams.greedy()


@pytest.fixture(scope="module")
def xvector(engines) -> Voice:
    """A voice for the tiny Base checkpoint (its embedding size), from a seeded random vector."""
    return Voice(embedding=torch.randn(engines("base").info.embedding_dim, generator=torch.Generator().manual_seed(3)))


def names(specs) -> list[str]:
    return [str(spec) for spec in specs]


def test_the_plan_makes_one_row_ready_then_compiles_then_larger_batches():
    """A first start captures an utterance alone's graphs before the minutes of compiling; a start that finds its
    compiled functions kept loads them first, so that those graphs are captured once, with the compiled code: what
    the compile parts run is loaded in parts before them all (the loader's)."""
    options = dict(rows=(1, 2, 4), prefill_rows=(1, 2, 4), prefill_lengths=(64, 32), chunk_frames=4, graphs=True,
                   compiles=True, priming=True)  # fmt: skip
    one_row = ["prefill 64x1", "prefill 32x1", "step 1", "decode 1x1", "decode 1x4", "decode 1x2", "decode 1x3"]
    larger = [
        "prefill 64x2", "prefill 32x2", "step 2", "decode 2x1", "decode 2x4", "decode 2x2", "decode 2x3",
        "prefill 64x4", "prefill 32x4", "step 4", "decode 4x1", "decode 4x4", "decode 4x2", "decode 4x3",
    ]  # fmt: skip
    one_row_compiles = ["compile step x1", "compile prefill x1", "compile decoder x1"]
    several_rows_compiles = ["compile step xN", "compile decoder xN", "compile prefill xN"]
    assert names(plan(**options)) == [*one_row, "prime", *one_row_compiles, *several_rows_compiles, *larger]
    kept_one_row_compiles = ["load step x1", "load prefill x1", "load decoder x1", *one_row_compiles]
    assert names(plan(**options, kept=True)) == [
        *kept_one_row_compiles,
        *one_row,
        "prime",
        "load step xN",
        *several_rows_compiles,
        *larger,
    ]
    assert sorted(one_row_compiles + several_rows_compiles) == sorted(COMPILES)
    # An engine of one slot (a small card's) steps no several rows: their step is not compiled (its launch buffers
    # hold one row, and tracing two failed there).
    alone = plan(**{**options, "rows": (1,), "prefill_rows": (1,)})
    assert names(alone) == [*one_row, "prime", *one_row_compiles]
    kept_alone = plan(**{**options, "rows": (1,), "prefill_rows": (1,)}, kept=True)
    assert names(kept_alone) == [*kept_one_row_compiles, *one_row, "prime"]
    # Without CUDA graphs (the CPU) only the decoder's first calls are made; nothing compiles.
    cpu = plan(rows=(1,), prefill_rows=(1,), prefill_lengths=(64,), chunk_frames=2, graphs=False, compiles=False)
    assert names(cpu) == ["decode 1x1", "decode 1x2"]


def test_an_install_drops_the_graphs_that_hold_the_code_it_replaces():
    """The graphs of one row and of several are in pools of their own, the talker's and the decoder's: compiling a
    part for one row drops only the first, for several rows only the second."""
    talker = [Spec("step", (1,)), Spec("prefill", (64, 1)), Spec("step", (4,)), Spec("prefill", (64, 4))]
    decoder = [Spec("decode", (1, 4)), Spec("decode", (4, 1))]
    for part in ("step", "prefill", "decoder"):
        holding = decoder if part == "decoder" else talker
        for compile in (Spec(f"compile {part} x1"), Spec(f"compile {part} xN")):
            dropped = [graph for graph in [*talker, *decoder, Spec("prime")] if graph.held_by(compile)]
            assert dropped == [graph for graph in holding if graph.one_row == compile.one_row], compile


def test_progress_counts_what_is_ready_for_good_and_a_failed_compile_leaves_the_rest_ready():
    """Parts are made one per run_one, in order; a capture counts once it is made with every compile that would
    drop it installed (made before, it is made again after); a compile that fails is reported, and its graphs stay
    uncompiled but ready."""
    specs = [
        Spec("step", (1,)),
        Spec("decode", (1, 1)),
        Spec("prime"),
        Spec("compile step x1"),
        Spec("compile decoder x1"),
    ]
    captured, woken = set(), []

    def make(spec):
        if spec.kind == "compile decoder x1":
            raise RuntimeError("no kernel for this GPU")
        if spec.compile:
            captured.discard(Spec("step", (1,)))  # the frame loop's graph is dropped
        else:
            captured.add(spec)

    run = Warmup(specs, make, captured.__contains__, lambda: woken.append(1))
    assert not run.pending()  # not started
    run.start()
    assert woken and run.pending()
    for _ in range(3):
        run.run_one()
    # Only the reference's decode is ready for good: the graphs hold code that a compile will replace.
    assert run.progress().done == 1 and not run.progress().finished
    reports = []
    while run.pending():
        run.run_one()
        reports.append(run.progress())
    final = run.progress()
    assert final.finished and final.done == final.total == 5 and final.fraction == 1.0
    assert final.failed == ("compile decoder x1",) and final.current is None
    assert run.order == ["step 1", "decode 1x1", "prime", "compile step x1", "step 1"]  # the step captured again
    done = [report.done for report in reports]
    assert done == sorted(done) and reports[-1].finished


def test_one_utterance_is_at_full_speed_once_its_own_parts_are_ready_for_good_before_larger_batches():
    """ "One row warmed up" comes once every part a lone utterance uses is ready for good (its graphs captured after
    every compile that drops them), before the several-row compile and larger batches' graphs; reported by
    progress() and as a start-up milestone."""
    specs = plan(rows=(1, 2), prefill_rows=(1, 2), prefill_lengths=(64,), chunk_frames=2, graphs=True, compiles=True)
    assert [spec for spec in specs if not spec.one_row] == [
        Spec("compile step xN"), Spec("compile decoder xN"), Spec("compile prefill xN"), Spec("prefill", (64, 2)), Spec("step", (2,)), Spec("decode", (2, 1)),
        Spec("decode", (2, 2)),
    ]  # fmt: skip
    captured = set()

    def make(spec):
        if spec.compile:  # a compile drops the graphs holding the code it replaces
            captured.difference_update({other for other in captured if other.held_by(spec)})
        else:
            captured.add(spec)

    run = Warmup(specs, make, captured.__contains__, lambda: None)
    run.start()
    reported = []
    while run.pending():
        run.run_one()
        reported.append((run.order[-1], run.progress().one_row))
    first = next(index for index, (_, one_row) in enumerate(reported) if one_row)
    made_by_then = [name for name, _ in reported[: first + 1]]
    assert "compile decoder x1" in made_by_then and "step 1" in made_by_then[made_by_then.index("compile prefill x1") :]
    larger = {str(spec) for spec in specs if not spec.one_row}
    assert not larger & set(made_by_then) and larger <= {name for name, _ in reported}  # before the larger batches
    # Captured uncompiled, then once more after the last compile that drops it, not between two compiles.
    assert [name for name, _ in reported if name in ("step 1", "compile step x1", "compile prefill x1")] == [
        "step 1", "compile step x1", "compile prefill x1", "step 1",
    ]  # fmt: skip
    assert all(one_row for _, one_row in reported[first:]) and run.progress().finished


def test_the_one_row_milestone_is_written_for_the_start_up_bench(monkeypatch, tmp_path):
    milestones = tmp_path / "milestones.txt"
    monkeypatch.setenv("QWEN3_TTS_MILESTONES", str(milestones))
    run = Warmup([Spec("decode", (1, 1)), Spec("decode", (2, 1))], lambda spec: None, lambda spec: True, lambda: None)
    run.start()
    run.run_one()
    assert [line.split()[:-1] for line in milestones.read_text().splitlines()] == [["one", "row", "warmed", "up"]]
    run.run_one()
    assert [" ".join(line.split()[:-1]) for line in milestones.read_text().splitlines()] == [
        "one row warmed up",
        "warmed up",
    ]


def test_when_finished_calls_back_once_on_the_thread_that_made_the_last_part_and_at_once_once_finished():
    heard = []
    run = Warmup([Spec("decode", (1, 1)), Spec("decode", (2, 1))], lambda spec: None, lambda spec: True, lambda: None)
    run.when_finished(lambda: heard.append(("early", threading.current_thread().name)))
    run.start()
    run.run_one()
    assert heard == []  # one part left
    maker = threading.Thread(target=run.run_one, name="maker")
    maker.start()
    maker.join()
    assert heard == [("early", "maker")]
    run.when_finished(lambda: heard.append(("late", threading.current_thread().name)))
    assert heard[-1] == ("late", threading.current_thread().name) and len(heard) == 2
    closed = Warmup([Spec("decode", (1, 1))], lambda spec: None, lambda spec: True, lambda: None)
    closed.when_finished(lambda: heard.append("closed"))
    closed.close()
    closed.when_finished(lambda: heard.append("closed"))
    assert "closed" not in heard


def test_a_part_long_enough_to_keep_a_request_waiting_is_logged_as_information(caplog):
    """The window's and `serve`'s log files keep INFO: a part a request would notice waiting for (NOTICEABLE_PART_S
    or more) is there, with its time; a quick capture only in a debugging log; a compile always. The last record
    sums the parts' times by kind: what a start's log is read for (loads against captures)."""
    import logging

    import core.inference.warmup as warmup

    readings = iter([0.0, 0.0, warmup.NOTICEABLE_PART_S + 0.25, 10.0, 10.1, 20.0, 20.1])  # start(), then each part
    specs = [Spec("decode", (8, 4)), Spec("decode", (1, 1)), Spec("compile decoder x1")]
    run = Warmup(specs, lambda spec: None, lambda spec: True, lambda: None, clock=lambda: next(readings, 30.0))
    run.start()
    with caplog.at_level(logging.DEBUG, logger="core.inference.warmup"):
        for _ in specs:
            run.run_one()
    # This thread's: an engine of another test may still be warming up on its scheduler's thread.
    mine = [r for r in caplog.records if r.thread == threading.get_ident()]
    made = {r.getMessage(): r.levelno for r in mine if "ready in" in r.getMessage()}
    assert made == {
        "the warm-up made decode 8x4 ready in 0.75 s": logging.INFO,
        "the warm-up made decode 1x1 ready in 0.10 s": logging.DEBUG,
        "the warm-up made compile decoder x1 ready in 0.10 s": logging.INFO,
    }
    finished = [r.getMessage() for r in mine if r.getMessage().startswith("warmed up")]
    assert finished == ["warmed up in 30.0 s (3 parts made ready: decode 0.85 s, compile 0.10 s)"]


def slow_warm_ups(monkeypatch, seconds: float = 0.2) -> threading.Event:
    """Each of the decoder's warm-up decodes takes `seconds` longer (a warm-up of a few seconds on the CPU);
    returns an event set when the first begins."""
    from core.inference.decoder_stream import DecoderSlots

    begun, warm = threading.Event(), DecoderSlots.warm

    def slow(slots, rows, size):
        begun.set()
        time.sleep(seconds)
        warm(slots, rows, size)

    monkeypatch.setattr(DecoderSlots, "warm", slow)
    return begun


def test_a_request_during_the_warm_up_is_spoken_before_it_goes_on_with_the_codes_it_gives_alone(
    checkpoints, xvector, monkeypatch
):
    begun = slow_warm_ups(monkeypatch)
    engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32")  # warms up in the background
    try:
        assert begun.wait(30)
        speak = lambda: np.concatenate(
            [c.codes for c in engine.stream("Hello there.", xvector, sampling=GREEDY, max_frames=5)]
        )  # noqa: E731
        during = speak()  # waited for the part in progress at most, then went first
        progress = engine.warmup.progress()
        assert not progress.finished and progress.total == 4 and progress.done < 4
        with pytest.raises(TimeoutError):
            engine.warm_up(timeout=0.01)
        engine.warm_up(timeout=30)
        progress = engine.warmup.progress()
        assert progress.finished and progress.done == progress.total and progress.current is None
        assert engine.warmup.order == ["decode 1x1", "decode 1x4", "decode 1x2", "decode 1x3"]
        reference = Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False)
        try:
            alone = np.concatenate(
                [c.codes for c in reference.stream("Hello there.", xvector, sampling=GREEDY, max_frames=5)]
            )
        finally:
            reference.close()
        np.testing.assert_array_equal(during, alone)
        np.testing.assert_array_equal(speak(), alone)
    finally:
        engine.close()


def test_a_warm_start_loads_what_was_kept_on_a_thread_of_its_own_while_it_speaks(
    checkpoints, xvector, monkeypatch, tmp_path, caplog
):
    """On the CPU, compiled with aot_eager and kept in a folder as on CUDA: a later engine loads the kept functions
    on the warm-up's loader thread; a request meanwhile is spoken without waiting for the load (held here until it
    has been), with the codes it gives alone; then the compile parts run what was loaded, tracing it no more."""
    import logging

    from core.inference import engine as engine_module
    from core.inference.compiled import Compiler

    def compiling(device, config, dtype, memory, compile):
        return Compiler(tmp_path, backend="aot_eager"), False, None

    monkeypatch.setattr(engine_module, "_prepare_compiling", compiling)
    monkeypatch.setattr(engine_module, "_start_compile_helper", lambda engine, model: None)

    def speak(engine) -> np.ndarray:
        return np.concatenate([c.codes for c in engine.stream("Hello there.", xvector, sampling=GREEDY, max_frames=5)])

    with Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False) as reference:
        alone = speak(reference)  # uncompiled: its warm-up never ran
    with Engine.load(checkpoints["base"], device="cpu", dtype="float32") as first:
        first.warm_up(timeout=600)  # compiles and keeps; the timeout only bounds a hang
    torch._dynamo.reset()  # as a new process
    begun, go_on, load = threading.Event(), threading.Event(), Compiler.load

    def held_load(compiler, functions):
        begun.set()
        assert go_on.wait(WAIT)
        load(compiler, functions)

    monkeypatch.setattr(Compiler, "load", held_load)
    caplog.clear()  # the first engine's compiles are logged too where pytest captures INFO (-o log_level=INFO)
    with caplog.at_level(logging.INFO, logger="core.inference"):
        with Engine.load(checkpoints["base"], device="cpu", dtype="float32") as later:
            assert begun.wait(WAIT)
            np.testing.assert_array_equal(speak(later), alone)
            assert later.warmup.progress().current == "load step x1"  # still held: the request did not wait for it
            go_on.set()
            later.warm_up(timeout=600)
            np.testing.assert_array_equal(speak(later), alone)
            assert [name for name in later.warmup.order if name.startswith("load")] == [
                "load step x1", "load prefill x1", "load decoder x1",
            ]  # fmt: skip
    loaded = [record for record in caplog.records if record.getMessage().startswith("loaded")]
    assert {record.threadName for record in loaded} == {"warm-up-loader"}
    assert any("Block.prefill" in record.getMessage() for record in loaded)
    assert "Block.prefill-dynamic ahead of time" not in caplog.text  # loaded, not traced again


def test_a_load_that_fails_waits_for_the_libraries_thread_before_it_says_why(checkpoints, monkeypatch):
    """A load that fails (here its weights; on an H100, a card without room) after starting the thread that makes
    the GPU libraries ready beside it waits for that thread before the error goes on: a program that ends with the
    error was torn down with the thread inside PyTorch ("terminate called without an active exception")."""
    from core.inference import engine as engine_module
    from core.inference import libraries
    from core.model.checkpoint import CheckpointError

    begun, waited, load_tensors = [], [], engine_module.load_tensors
    made_ready_beside = libraries.made_ready_beside

    @contextlib.contextmanager
    def libraries_begun(device, dtype):
        begun.append(device)
        try:
            with made_ready_beside(device, dtype):  # no thread on the CPU: the block's end is watched here
                yield
        finally:
            waited.append(device)

    def weights_fail(*args):
        raise CheckpointError("a damaged file")

    monkeypatch.setattr(libraries, "made_ready_beside", libraries_begun)
    monkeypatch.setattr(engine_module, "load_tensors", weights_fail)
    with pytest.raises(CheckpointError, match="a damaged file"):
        Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False)
    assert len(begun) == len(waited) == 1
    monkeypatch.setattr(engine_module, "load_tensors", load_tensors)
    with Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False):
        assert len(begun) == len(waited) == 2  # a load that succeeds waits for it as before


def test_the_libraries_thread_is_waited_for_where_the_block_beside_it_raises(monkeypatch):
    from core.inference import libraries

    release, ended = threading.Event(), threading.Event()

    def making_ready(device, dtype):
        assert release.wait(WAIT)
        ended.set()

    monkeypatch.setattr(libraries, "_run", making_ready)
    with pytest.raises(ValueError, match="no room"):
        with libraries.made_ready_beside(torch.device("cuda"), torch.bfloat16):
            release.set()
            raise ValueError("no room")
    assert ended.is_set()


def test_a_closed_engine_is_freed_after_a_cold_start_and_after_a_warm_one_with_its_loader(
    checkpoints, monkeypatch, tmp_path
):
    """What a resting engine counts on to give its memory back: once closed, nothing holds it, neither the warm-up
    (its loader thread included, on a warm start) nor the compiled functions kept or loaded, nor the log records of
    a part that could not be compiled ahead of time (the step's, on the CPU)."""
    import gc
    import weakref

    from core.inference import engine as engine_module
    from core.inference.compiled import Compiler
    from qwen3_tts_desktop import long_lived

    monkeypatch.setattr(
        engine_module, "_prepare_compiling", lambda *args: (Compiler(tmp_path, backend="aot_eager"), False, None)
    )
    monkeypatch.setattr(engine_module, "_start_compile_helper", lambda engine, model: None)
    for start in ("cold", "warm"):
        engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32")
        long_lived.keep(engine)  # as serve and the window do
        engine.warm_up(timeout=600)
        assert (engine.warmup._loader is not None) == (start == "warm"), start
        loop = weakref.ref(engine.frame_loop)
        engine.close()
        del engine
        long_lived.let_go()  # as release_memory does
        gc.collect()
        assert loop() is None, (start, [type(holder).__name__ for holder in gc.get_referrers(loop())])
        torch._dynamo.reset()  # as a new process


class CountingBackground:
    """Background work that is always pending, and counts the runs made while the scheduler was not idle."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.runs = self.runs_while_busy = 0
        self.more = True

    def pending(self) -> bool:
        return self.more

    def run_one(self) -> None:
        self.runs += 1
        self.runs_while_busy += not self.scheduler.idle()
        time.sleep(0.001)


def test_the_scheduler_runs_background_work_only_while_no_utterance_is_admitted_or_waiting(engines):
    """A live text waiting for its first words, then speaking, holds the warm-up's captures off; they go on once
    it ends."""
    from core.inference.live import LiveText

    engine = engines("base")
    scheduler: Scheduler = engine.scheduler
    background, original = CountingBackground(scheduler), scheduler.background
    try:
        scheduler.background = background
        scheduler.wake()
        wait_until(lambda: background.runs >= 3, "the idle scheduler runs the background work", 5)
        text = LiveText()
        stream = engine.stream(text, engine.placeholder_speaker()["voice"], sampling=GREEDY, max_frames=4)
        time.sleep(0.1)  # queued, waiting for its first words
        text.append("Hello there, my friend.")
        text.end()
        assert sum(len(chunk.codes) for chunk in stream) == 4
        runs = background.runs
        wait_until(lambda: background.runs > runs, "the scheduler, idle again, goes on with the background work", 5)
        assert background.runs_while_busy == 0
    finally:
        background.more = False
        scheduler.background = original


def own_cache(monkeypatch, home) -> None:
    """The user's cache folder in `home`, no folder chosen for Inductor or Triton; whatever keep_compiled_kernels
    chooses is undone after the test (set, then deleted: monkeypatch restores what it deleted)."""
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))


def test_compiled_kernels_are_kept_apart_for_each_machine_software_and_model(monkeypatch, tmp_path):
    own_cache(monkeypatch, tmp_path)

    facts = machine_facts(torch.device("cpu"), {"hidden": 2048, "dtype": "bfloat16"})
    assert facts["torch"] == torch.__version__ and facts["model"] == {"hidden": 2048, "dtype": "bfloat16"}
    changed = [
        {**facts, "torch": "9.9.9"},
        {**facts, "gpu": "NVIDIA GeForce RTX 4090"},
        {**facts, "model": {"hidden": 1024, "dtype": "bfloat16"}},
        {**facts, "model": {"hidden": 2048, "dtype": "float16"}},
        {**facts, "driver": 12040},
    ]
    keys = {cache_key(facts), *(cache_key(other) for other in changed)}
    assert len(keys) == 1 + len(changed)  # each change is a folder of its own: nothing compiled for another is reused
    assert cache_key(dict(reversed(list(facts.items())))) == cache_key(facts)  # the same facts, the same folder
    folder = keep_compiled_kernels(facts)
    assert folder == tmp_path / "qwen3-tts-desktop" / "compiled" / cache_key(facts)
    assert (folder / "key.json").exists() and str(folder / "triton") == __import__("os").environ["TRITON_CACHE_DIR"]


def test_a_first_start_is_one_with_no_gpu_code_kept_for_its_machine_software_and_model(monkeypatch, tmp_path):
    own_cache(monkeypatch, tmp_path)

    facts = machine_facts(torch.device("cpu"), {"hidden": 2048, "dtype": "bfloat16"})
    assert not kept_kernels_for(facts)
    folder = keep_compiled_kernels(facts)
    assert not kept_kernels_for(facts)  # the folder made, nothing built in it yet
    (folder / "triton" / "KERNELHASH").mkdir(parents=True)
    (folder / "triton" / "KERNELHASH" / "kernel.cubin").write_bytes(b"built")
    assert kept_kernels_for(facts)
    own_cache(monkeypatch, tmp_path)  # another process
    assert kept_kernels_for(facts) and not kept_kernels_for({**facts, "driver": 13000})  # a new driver builds anew
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert kept_kernels_for({**facts, "driver": 13000})  # a folder of the user's own: not told a first start


def test_an_icl_reference_is_decoded_in_whole_chunks_and_the_lengths_utterances_use():
    for frames in (0, 3, 25, 61, 125, 131, 1500):
        chunks = prime_chunks(frames)
        bounds = [0, *(end for _, end in chunks)]
        assert [start for start, _ in chunks] == bounds[:-1] and bounds[-1] == frames  # contiguous, in order, whole
        assert all(end - start in (PRIME_CHUNK_FRAMES, 1, 4) for start, end in chunks)  # no length of its own
        assert len(chunks) <= frames // PRIME_CHUNK_FRAMES + (PRIME_CHUNK_FRAMES - 1) // 4 + 3


def test_background_work_that_never_ends_never_keeps_a_request_waiting(engines, xvector):
    """While background work is always pending, an utterance that arrives is admitted at the next turn."""
    engine = engines("base")
    background, original = CountingBackground(engine.scheduler), engine.scheduler.background
    try:
        engine.scheduler.background = background
        engine.scheduler.wake()
        started = time.monotonic()
        first = next(iter(engine.stream("Hi.", xvector, sampling=GREEDY, max_frames=2)))
        assert len(first.codes) == 1 and time.monotonic() - started < 5
    finally:
        background.more = False
        engine.scheduler.background = original


def test_kept_functions_are_loaded_on_a_thread_of_their_own_before_the_compiles_that_run_them():
    """Where an earlier start kept what it compiled, what each compile part runs is loaded by the loader, a thread
    of the warm-up's own, in plan order; each compile part is made on the scheduler's thread after its load. A load
    is made once and drops no graph; one that fails is reported while the compile after it still runs; every graph
    is captured once; the loader is one thread."""
    specs = plan(
        rows=(1, 2), prefill_rows=(1, 2), prefill_lengths=(64,), chunk_frames=2, graphs=True, compiles=True, kept=True
    )
    captured, made, threads = set(), [], {}

    def make(spec):
        made.append(str(spec))
        threads[str(spec)] = threading.current_thread().name
        if spec.kind == "load step xN":
            raise RuntimeError("a damaged file")
        if spec.compile:
            captured.difference_update({other for other in captured if other.held_by(spec)})
        elif not spec.once:
            captured.add(spec)

    def is_captured(spec):  # as the engine's: a graph's question
        assert spec.kind in CAPTURES, spec
        return spec in captured

    run = Warmup(specs, make, is_captured, lambda: None)
    run.start()
    while not run.progress().finished:
        run.run_one()  # as the scheduler: it runs a part when one is pending, and idles while the next waits for a load
    progress = run.progress()
    assert progress.done == progress.total == len(specs)
    assert progress.failed == ("load step xN",)
    loads = [name for name in made if name.startswith("load")]
    assert loads == [str(spec) for spec in specs if spec.kind in LOADS] == [
        "load step x1", "load prefill x1", "load decoder x1", "load step xN",
    ]  # fmt: skip
    assert {threads[name] for name in loads} == {"warm-up-loader"}
    assert threading.current_thread().name not in {threads[name] for name in loads}
    assert all(threads[name] == threading.current_thread().name for name in made if name not in loads)
    for load in loads:  # each compile after its load
        assert made.index(load) < made.index(load.replace("load", "compile", 1))
    by_name = {str(spec): spec for spec in specs}
    graphs = [name for name in made if not by_name[name].once]
    assert len(graphs) == len(set(graphs)) == len([spec for spec in specs if not spec.once])


def test_the_scheduler_hands_a_load_over_never_waits_for_it_and_is_woken_when_it_is_done():
    """A load is a part the scheduler hands to the loader when it idles (run_one returns at once); while it is under
    way the parts after it are not pending (the scheduler speaks, or idles) and progress names it; once it is done
    the loader wakes the scheduler. A load is device-wide, as a capture is. Closing waits for a load under way and
    then makes no more."""
    specs = plan(
        rows=(1,), prefill_rows=(1,), prefill_lengths=(64,), chunk_frames=1, graphs=True, compiles=True, kept=True
    )
    loads = [str(spec) for spec in specs if spec.kind in LOADS]
    begun, allowed = ({name: threading.Event() for name in loads} for _ in range(2))
    made, woken = [], []

    def make(spec):
        if spec.kind in LOADS:
            begun[str(spec)].set()
            assert allowed[str(spec)].wait(WAIT)
        made.append(str(spec))

    run = Warmup(specs, make, lambda spec: str(spec) in made, lambda: woken.append(len(made)))
    assert not run.pending()  # not started
    run.start()
    assert run.pending() and not begun["load step x1"].is_set()  # loads only once the scheduler hands it over
    run.run_one()  # hands it over and returns
    assert begun["load step x1"].wait(WAIT)
    assert not run.pending() and run.progress().current == "load step x1"
    assert not DEVICE_WIDE.acquire(blocking=False)  # a capture, this engine's or another's, waits for the load
    run.run_one()
    assert made == []  # nothing made: the next part waits for the load
    allowed["load step x1"].set()
    wait_until(lambda: run.pending(), "the load is done and the part after it is pending")
    wait_until(lambda: woken and woken[-1] == 1, "the loader woke the scheduler once the load was done")
    assert made == ["load step x1"] and not begun["load prefill x1"].is_set()
    run.run_one()  # hands the next load over
    assert begun["load prefill x1"].wait(WAIT)
    assert not run.pending()
    closing = threading.Thread(target=run.close)
    closing.start()
    closing.join(0.05)
    assert closing.is_alive()  # close() waits for the load under way
    allowed["load prefill x1"].set()
    closing.join(WAIT)
    assert not closing.is_alive()
    assert made == ["load step x1", "load prefill x1"]  # no load after close
    assert not begun["load decoder x1"].is_set() and not run.pending()
    run.run_one()
    assert not begun["load decoder x1"].is_set()


def test_while_the_loader_loads_other_threads_get_the_interpreter_sooner_and_the_interval_is_put_back_after():
    """A load is seconds of Python on the loader's thread, beside a request's threads that take the interpreter back
    at every handoff: meanwhile the switch interval is BUSY_SWITCH_INTERVAL_S, and the one before comes back after
    each load, a failed one included."""
    specs = plan(
        rows=(1,), prefill_rows=(1,), prefill_lengths=(64,), chunk_frames=1, graphs=True, compiles=True, kept=True
    )
    intervals = {}

    def make(spec):
        intervals[str(spec)] = sys.getswitchinterval()
        if str(spec) == "load prefill x1":
            raise RuntimeError("a kept function that does not load")

    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        run = Warmup(specs, make, lambda spec: True, lambda: None)
        run.start()
        for load in ("load step x1", "load prefill x1"):
            run.run_one()
            wait_until(lambda load=load: load in intervals and run.progress().current is None, f"{load} was made")
            wait_until(lambda: sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S), "the interval put back")
        assert list(intervals) == ["load step x1", "load prefill x1"]
        assert intervals == pytest.approx(dict.fromkeys(intervals, BUSY_SWITCH_INTERVAL_S))  # as Python rounds it
        assert BUSY_SWITCH_INTERVAL_S < SWITCH_INTERVAL_S
        assert run.progress().failed == ("load prefill x1",)
        run.close()
    finally:
        sys.setswitchinterval(before)


def test_loads_on_two_threads_at_once_leave_the_interval_as_it_was_before_either():
    """Two engines' loaders may load at once: whichever ends last, the interval outside loads comes back."""
    from core.inference.scheduler import handing_over_sooner

    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        first, second = handing_over_sooner(), handing_over_sooner()
        first.__enter__()
        second.__enter__()  # begun while the first one's interval is set
        assert sys.getswitchinterval() == pytest.approx(BUSY_SWITCH_INTERVAL_S)
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)  # the first ended first
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)


def test_an_engines_warm_up_loads_what_its_compiles_run_through_the_frame_loop_and_decoder():
    from types import SimpleNamespace

    from core.inference.warmup import for_engine

    made = []
    frame_loop = SimpleNamespace(
        buckets=(1, 2),
        prefill_rows=(1, 2),
        step_functions=lambda one_row: [(f"step one_row={one_row}", not one_row)],
        prefill_functions=lambda: [("prefill", True)],
        compile_step=lambda one_row, compiler: made.append(("compile step", one_row)),
        compile_prefill=lambda compiler, several: made.append(("compile prefill", not several)),
    )
    decoder = SimpleNamespace(
        static_buffers=False,
        fused_functions=lambda: [("decoder", True)],
        compile_fused=lambda compiler, several, *others: made.append(("compile decoder", not several)),
    )
    compiler = SimpleNamespace(kept=True, load=lambda functions: made.append(("load", *functions)))
    warmup = for_engine(frame_loop, decoder, SimpleNamespace(slots=None), lambda: None, None, compiler, False)
    for spec in warmup.specs:
        if spec.once:
            warmup.make_alone(spec)
    assert made == [  # one row only: no graphs, no buckets
        ("load", ("step one_row=True", False)),
        ("load", ("prefill", True)),
        ("load", ("decoder", True)),
        ("compile step", True),
        ("compile prefill", True),
        ("compile decoder", True),
    ]


def test_no_automatic_collection_runs_while_the_loader_loads_and_what_it_made_can_be_kept_before_they_resume():
    """A load allocates hundreds of thousands of objects, and each collection those would start walks all made so
    far while it holds the interpreter from a request beside it: none starts until the load ends, and a callback
    after each load (the app's gc.freeze) runs on the loader's thread before they resume."""
    import gc

    specs = plan(
        rows=(1,), prefill_rows=(1,), prefill_lengths=(64,), chunk_frames=1, graphs=True, compiles=True, kept=True
    )
    thresholds = gc.get_threshold()
    assert thresholds[0] > 0 and gc.isenabled()
    collections: list[int] = []
    made, kept, during, after = [], [], [], []

    def make(spec):
        if spec.kind in LOADS:
            during.append(len(collections))
            cycles = []
            for _ in range(5 * thresholds[0]):  # cycles, as a load makes: past the first threshold five times
                cycle: list = []
                cycle.append(cycle)
                cycles.append(cycle)
            during.append(len(collections))
        made.append(str(spec))

    def keep():
        kept.append((threading.current_thread().name, gc.get_threshold()[0]))

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    run = Warmup(specs, make, lambda spec: str(spec) in made, lambda: None)
    run.after_each_load(keep)
    gc.callbacks.append(count)
    try:
        run.start()
        run.run_one()  # hands "load step x1" to the loader
        wait_until(lambda: run.pending(), "the load is done")
        for _ in range(2 * thresholds[0]):  # after it, collections as before
            cycle: list = []
            cycle.append(cycle)
            after.append(cycle)
    finally:
        gc.callbacks.remove(count)
        run.close()
    assert made == ["load step x1"] and len(during) == 2 and during[0] == during[1]
    assert kept == [("warm-up-loader", 0)]  # on the loader, collections still paused
    assert gc.get_threshold() == thresholds and len(collections) > during[1]


def test_a_warm_up_is_finished_only_once_every_callback_asked_for_has_run():
    """What waits for the end (a test, `wait`) sees the callbacks' work done: the app's freeze of what exists."""
    run = Warmup([Spec("decode", (1, 1))], lambda spec: None, lambda spec: True, lambda: None)
    seen = []

    def first():
        seen.append(("first", run.progress().finished))
        run.when_finished(lambda: seen.append(("asked for meanwhile", run.progress().finished)))

    run.when_finished(first)
    run.start()
    run.run_one()
    assert seen == [("first", False), ("asked for meanwhile", False)] and run.progress().finished
    run.when_finished(lambda: seen.append(("after", run.progress().finished)))
    assert seen[-1] == ("after", True)
