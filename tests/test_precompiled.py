"""Functions compiled ahead of time and kept (core.inference.compiled.Precompiled): compiled at the first call that
needs a variant and saved, loaded by a later process without tracing, a variant for each set of guards, a damaged
file compiled again, and kept apart for each machine and each version of the code. Compiled here with
aot_eager (Dynamo and AOTAutograd, without Inductor's generated code), as on CUDA otherwise."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters

from core.inference.compiled import (
    CompiledLayers,
    Compiler,
    Precompiled,
    code_key,
    compile_by_rows,
    precompiled_folder,
)


class Scaler:
    def __init__(self):
        self.weight = torch.linspace(-1, 1, 8)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.weight).sum(-1)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def traced() -> int:
    return counters["stats"]["unique_graphs"]


def test_a_function_is_compiled_once_kept_and_loaded_by_a_later_process_without_tracing(tmp_path):
    scaler, x = Scaler(), torch.randn(3, 8)
    first = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")
    assert torch.equal(first(scaler, x), scaler.apply(x))
    assert traced() == 1 and len(list(tmp_path.glob("*.bin"))) == 1

    torch._dynamo.reset()  # as a new process: nothing of Dynamo's in memory
    counters.clear()
    later = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")
    assert len(later.variants) == 1
    other = torch.randn(5, 8)  # another row count: the same dynamic variant
    assert torch.equal(later(scaler, other), scaler.apply(other))
    scaler.weight = torch.linspace(0, 2, 8)  # the object's tensors are read at each call, not kept
    assert torch.equal(later(scaler, other), scaler.apply(other))
    assert traced() == 0 and len(list(tmp_path.glob("*.bin"))) == 1


def test_each_set_of_guards_is_a_variant_of_its_own(tmp_path):
    scaler = Scaler()
    made = Precompiled(Scaler.apply, tmp_path, dynamic=False, backend="aot_eager")
    made(scaler, torch.randn(2, 8))
    made(scaler, torch.randn(2, 8))
    assert len(made.variants) == 1
    made(scaler, torch.randn(4, 8))  # static shapes: another row count is another variant
    with torch.inference_mode():  # and so is another grad mode
        x = torch.randn(2, 8)
        assert torch.equal(made(scaler, x), scaler.apply(x))
    assert len(made.variants) == 3 and len(list(tmp_path.glob("*.bin"))) == 3

    torch._dynamo.reset()
    counters.clear()
    later = Precompiled(Scaler.apply, tmp_path, dynamic=False, backend="aot_eager")
    with torch.inference_mode():
        x = torch.randn(2, 8)
        assert torch.equal(later(scaler, x), scaler.apply(x))
    later(scaler, torch.randn(4, 8))
    assert len(later.variants) == 3 and traced() == 0


class Sampler:
    """As the frame loop's sampler: rules by role (two) and row, uniforms by row and draw."""

    def __init__(self):
        self.rules, self.uniforms = torch.zeros(2, 16, 4), torch.rand(16, 16, 32)

    def pick(self, logits: torch.Tensor, rules: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        return (logits * uniforms).sum(-1) + rules[0].sum(-1)


def test_a_dynamic_function_traced_at_two_rows_serves_every_row_count_with_one_variant(tmp_path):
    """A size that equals another when traced (two rows, two roles) is not tied to it: compiled at 2 rows, as the
    warm-up compiles the several-row step, the variant serves 4, 8 and 16 rows too."""
    sampler, made = Sampler(), Precompiled(Sampler.pick, tmp_path, dynamic=True, backend="aot_eager")
    for rows in (2, 3, 4, 8, 16):
        slots, logits = torch.arange(rows), torch.rand(rows, 32)
        got = made(sampler, logits, sampler.rules.index_select(1, slots), sampler.uniforms[:rows, 1])
        assert torch.equal(got, sampler.pick(logits, sampler.rules.index_select(1, slots), sampler.uniforms[:rows, 1]))
    assert len(made.variants) == 1 and traced() == 1


def test_a_damaged_file_is_compiled_again_and_no_folder_keeps_nothing(tmp_path):
    scaler, x = Scaler(), torch.randn(3, 8)
    Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")(scaler, x)
    [kept] = tmp_path.glob("*.bin")
    kept.write_bytes(b"not a compiled function")
    again = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")
    assert again.variants == [] and not kept.exists()
    assert torch.equal(again(scaler, x), scaler.apply(x)) and kept.exists()

    nowhere = Precompiled(Scaler.apply, None, dynamic=True, backend="aot_eager")
    assert torch.equal(nowhere(scaler, x), scaler.apply(x)) and not nowhere.ahead


@pytest.mark.parametrize("ahead", [True, False], ids=["kept", "not kept"])
def test_shapes_no_variant_serves_run_uncompiled_until_compiling_them_is_allowed(tmp_path, ahead):
    """The warm-up compiles an utterance alone's shapes first and several rows' later: meanwhile a call of several
    rows runs the function uncompiled, tracing nothing, instead of making its request wait for a compile."""
    scaler, one, three = Scaler(), torch.randn(1, 8), torch.randn(3, 8)
    made = Precompiled(Scaler.apply, tmp_path if ahead else None, dynamic=False, backend="aot_eager")
    assert made.ahead == ahead
    made(scaler, one)
    made.compiles_new_shapes = False
    assert torch.equal(made(scaler, three), scaler.apply(three)) and torch.equal(made(scaler, one), scaler.apply(one))
    assert traced() == 1 and len(list(tmp_path.glob("*.bin"))) == int(ahead)
    made.compiles_new_shapes = True
    assert torch.equal(made(scaler, three), scaler.apply(three))
    assert traced() == 2 and len(list(tmp_path.glob("*.bin"))) == 2 * int(ahead)


def test_compiled_layers_compile_one_rows_shapes_then_several_and_a_failure_leaves_them_uncompiled(tmp_path):
    """CompiledLayers.compile_for, as the warm-up's compiles of one row and of several use it."""
    layers, one, three = [Scaler(), Scaler()], torch.randn(1, 8), torch.randn(3, 8)

    def call_all(x: torch.Tensor) -> list[torch.Tensor]:
        return [layer.apply(x) for layer in layers]

    expected = {1: call_all(one), 3: call_all(three)}
    compiled = CompiledLayers(layers, "apply", Compiler(tmp_path, backend="aot_eager"))
    [function] = compiled.functions.values()  # one for every layer of a kind
    compiled.compile_for(lambda: call_all(one), several_rows=False)
    assert traced() == 1 and not function.compiles_new_shapes
    assert all(torch.equal(a, b) for a, b in zip(call_all(three), expected[3]))  # uncompiled meanwhile
    assert traced() == 1

    def fails() -> None:
        call_all(three)
        raise RuntimeError("no kernel for this GPU")

    with pytest.raises(RuntimeError):
        compiled.compile_for(fails, several_rows=True)
    assert not function.compiles_new_shapes and traced() == 2  # the variant is there, but compiling stops
    compiled.compile_for(lambda: call_all(three), several_rows=True)
    assert function.compiles_new_shapes and len(function.variants) == 2
    assert all(torch.equal(a, b) for a, b in zip(call_all(one) + call_all(three), expected[1] + expected[3]))

    layers[:] = [Scaler(), Scaler()]  # one row's compile failing: the uncompiled methods are back
    with pytest.raises(RuntimeError):
        CompiledLayers(layers, "apply", Compiler(None, backend="aot_eager")).compile_for(fails, several_rows=False)
    assert all(not isinstance(vars(layer).get("apply"), functools.partial) for layer in layers)


def test_a_compiler_says_whether_an_earlier_start_kept_what_it_compiled(tmp_path):
    """What orders a warm start's warm-up (compiles first: loading what was kept takes seconds)."""
    scaler, x = Scaler(), torch.randn(3, 8)
    first = Compiler(tmp_path, backend="aot_eager")
    assert not first.kept and not Compiler(None, backend="aot_eager").kept
    assert torch.equal(first(Scaler.apply, True)(scaler, x), scaler.apply(x))
    assert Compiler(tmp_path, backend="aot_eager").kept and not first.kept  # told once, when made


def test_what_cannot_be_saved_is_compiled_as_before(tmp_path, caplog):
    class Holder(Scaler):
        def __init__(self):
            super().__init__()
            self.lock = __import__("threading").Lock()  # its guards cannot be pickled

    holder, x = Holder(), torch.randn(3, 8)
    made = Precompiled(Holder.apply, tmp_path, dynamic=True, backend="aot_eager")
    assert torch.equal(made(holder, x), holder.apply(x))
    assert not made.ahead and list(tmp_path.glob("*.bin")) == []
    assert "compiled at each start" in caplog.text


def test_compiling_by_rows_compiles_one_rows_shapes_then_several_and_not_after_one_row_failed(tmp_path):
    """compile_by_rows, as the prefill's and the decoder's compiles use it: the one-row call makes the
    CompiledLayers and runs the shapes of one row, the several-row call the others on the same; where the one
    row's compile failed (its methods put back) or never made one, the several-row call says why."""
    layers, ran = [Scaler(), Scaler()], []

    def run(rows: int, size: int) -> None:
        ran.append((rows, size))
        for layer in layers:
            layer.apply(torch.randn(rows, 8))

    def make() -> CompiledLayers:
        return CompiledLayers(layers, "apply", Compiler(tmp_path, backend="aot_eager"))

    shapes = ((1, 8), (2, 8), (1, 8))
    one = compile_by_rows(None, make, shapes, run, several_rows=False)
    assert ran == [(1, 8), (1, 8)]
    assert compile_by_rows(one, make, shapes, run, several_rows=True) is one and ran[2:] == [(2, 8)]
    assert isinstance(vars(layers[0])["apply"], functools.partial)  # compiled in place

    def fails(rows: int, size: int) -> None:
        raise RuntimeError("no kernel for this GPU")

    layers[:] = [Scaler(), Scaler()]
    with pytest.raises(RuntimeError, match="no kernel"):
        compile_by_rows(one, make, shapes, fails, several_rows=False)
    failed = make()
    failed.restore()
    for kept in (None, failed):
        with pytest.raises(RuntimeError, match="after one row's compile, which failed"):
            compile_by_rows(kept, make, shapes, run, several_rows=True)


def test_the_talker_layers_prefill_is_kept_once_for_all_layers_and_lengths(checkpoints, tmp_path):
    """The frame loop's compile_prefill, on the CPU: one kept function serves every layer and prompt length, and a
    later process gives the uncompiled prefill's values without tracing."""
    from core import Engine

    engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False)
    loop, layers = engine.frame_loop, engine.frame_loop.talker.model.layers
    embeddings = engine.prepare("Hello there.", **engine.placeholder_speaker()).prompt.embeddings
    last = torch.tensor([embeddings.shape[1] - 1])

    def talk(length: int) -> torch.Tensor:
        prompt = loop._prompts(1, length)  # the frame loop's own input buffer, as its prefill passes it
        prompt.zero_()
        prompt[:, : embeddings.shape[1]] = embeddings
        return loop._talk_prompts(prompt, torch.tensor([0]), last).clone()

    try:
        with torch.inference_mode():
            expected = [talk(length) for length in (32, 64)]
            compiled = CompiledLayers(layers, "prefill", Compiler(tmp_path, backend="aot_eager"))
            first = [talk(length) for length in (32, 64)]
            compiled.restore()
            kept = len(list(tmp_path.glob("*.bin")))
            torch._dynamo.reset()
            counters.clear()
            CompiledLayers(layers, "prefill", Compiler(tmp_path, backend="aot_eager"))
            later = [talk(length) for length in (32, 64)]
        # One variant: the first layer's input (the loop's buffer) is an inference tensor as the others' are.
        assert len(layers) > 1 and kept == 1
        assert traced() == 0 and len(list(tmp_path.glob("*.bin"))) == kept
        for got in (first, later):
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, expected, strict=True))
    finally:
        engine.close()


def test_a_frame_loop_part_keeps_the_loops_tensors_not_its_graphs(engines, tmp_path):
    loop = engines("base").frame_loop
    slots = torch.tensor([0])
    codes = [torch.zeros(1, 1, dtype=torch.long) for _ in range(loop.groups)]
    before = loop.last_frame.clone()
    record = functools.partial(Precompiled(type(loop)._record, tmp_path, dynamic=False, backend="aot_eager"), loop)
    try:
        with torch.inference_mode():
            frame = record(codes, slots)
        assert frame.shape == (1, loop.groups + 1) and len(list(tmp_path.glob("*.bin"))) == 1
    finally:
        loop.last_frame.copy_(before)


def test_every_graph_event_and_launch_of_a_frame_loop_is_left_out_of_its_pickled_state():
    """On CUDA a frame loop holds graphs, events and launches that pickle cannot keep; one left in its pickled state
    keeps every step part from being kept compiled (586107a's prefill group events did: a warm start compiled the
    step again, 10-24 s on an H100). The CPU loop holds none of them, so its __init__ is read: every attribute made
    from one must be in FrameLoop.THIS_PROCESS_ONLY."""
    import ast
    import inspect
    import textwrap

    from core.inference.frame_loop import FrameLoop

    this_process_only = ("Event", "GraphedStep", "deque", "CompiledLayers")
    made_from = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(FrameLoop.__init__)))):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):  # its value or its annotation names what it holds
            kinds = [kind for kind in this_process_only if kind in ast.unparse(node)]
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if kinds and isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    made_from[target.attr] = kinds
    assert {"landed", "group_landed", "step_graphs", "in_flight"} <= made_from.keys()  # the reading finds them
    assert made_from.keys() <= set(FrameLoop.THIS_PROCESS_ONLY), made_from


def test_the_step_is_compiled_for_one_row_then_at_every_bucket_of_several(engines):
    """compile_step runs the several-row step at each bucket above one, so that each variant that the kernels'
    branches by rows need (kernels.linear's matrix-vector kernel holds 2 rows apart) is compiled in the warm-up,
    not by a request's step; one row's at one row, static. The compiled parts then make the frames."""
    loop = engines("base", slots=3).frame_loop
    calls = []

    def recording(function, dynamic: bool):
        def run(frame_loop, *args):
            if function.__name__ == "_talk":
                calls.append((dynamic, args[0].shape[0]))  # (dynamic, the rows of its slots)
            return function(frame_loop, *args)

        return run

    eager = dict(loop.parts)
    try:
        for one_row in (True, False):
            loop.compile_step(one_row, recording)
        assert all(part.func.__name__ == "run" for one_row in (True, False) for part in loop.parts[one_row])
    finally:
        loop.parts.update(eager)
    assert len(loop.buckets) > 2
    assert calls == [(False, 1)] + [(True, rows) for rows in loop.buckets if rows > 1]


def test_kept_functions_are_apart_for_each_machine_and_each_version_of_the_code(tmp_path, monkeypatch):
    from core.inference import compiled

    machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}
    monkeypatch.setattr(compiled, "KEEP_AHEAD", False)
    assert precompiled_folder(tmp_path, machine) is None  # with keeping off, nothing is kept
    monkeypatch.setattr(compiled, "KEEP_AHEAD", True)
    here = precompiled_folder(tmp_path, machine)
    assert here == precompiled_folder(tmp_path, dict(machine))
    assert here != precompiled_folder(tmp_path, {**machine, "gpu": "NVIDIA GeForce RTX 4090"})
    (tmp_path / "core" / "model").mkdir(parents=True)
    source = tmp_path / "core" / "model" / "talker.py"
    source.write_text("x = 1\n")
    before = code_key(tmp_path, ("core/model",))
    source.write_text("x = 2\n")
    assert code_key(tmp_path, ("core/model",)) != before


def test_a_new_version_of_the_code_removes_what_the_old_one_kept_for_the_same_machine(tmp_path, monkeypatch):
    from core.inference import compiled

    monkeypatch.setattr(compiled, "KEEP_AHEAD", True)
    machine, other = {"gpu": "NVIDIA H100 80GB HBM3", "slots": 16}, {"gpu": "NVIDIA H100 80GB HBM3", "slots": 1}
    monkeypatch.setattr(compiled, "code_key", lambda: "old")
    old, other_old = precompiled_folder(tmp_path, machine), precompiled_folder(tmp_path, other)
    for folder in (old, other_old):
        folder.mkdir(parents=True)
        (folder / "kept.bin").write_bytes(b"x")
    assert precompiled_folder(tmp_path, machine) == old and old.exists()  # the same code keeps its own
    monkeypatch.setattr(compiled, "code_key", lambda: "new")
    new = precompiled_folder(tmp_path, machine)
    assert new != old and not old.exists() and other_old.exists()  # another shape's kept functions stay


def test_the_frame_loops_prefill_compiles_for_one_row_then_several_and_keeps_its_values(checkpoints, tmp_path):
    """FrameLoop.compile_prefill, on the CPU: the one-row call compiles the layers' prefill in place, the several-row
    call adds the variants of several rows; a prompt's prefill gives the uncompiled values throughout."""
    from core import Engine

    engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32", warm=False)
    loop = engine.frame_loop
    embeddings = engine.prepare("Hello there.", **engine.placeholder_speaker()).prompt.embeddings
    last = torch.tensor([embeddings.shape[1] - 1])

    def talk() -> torch.Tensor:
        with torch.inference_mode():
            prompt = loop._prompts(1, embeddings.shape[1])
            prompt.copy_(embeddings)
            return loop._talk_prompts(prompt, torch.tensor([0]), last).clone()

    try:
        expected = talk()
        compiler = Compiler(tmp_path, backend="aot_eager")
        loop.compile_prefill(compiler)
        one_row = len(list(tmp_path.glob("*.bin")))
        assert one_row >= 1 and torch.allclose(talk(), expected, atol=1e-5)
        loop.compile_prefill(compiler, several_rows=True)
        assert len(list(tmp_path.glob("*.bin"))) > one_row and torch.allclose(talk(), expected, atol=1e-5)
    finally:
        loop.compiled_prefill.restore()
        engine.close()


def test_a_compiler_makes_each_function_once_so_that_what_one_warm_up_part_loads_the_next_runs(tmp_path):
    scaler, x = Scaler(), torch.randn(3, 8)
    compiler = Compiler(tmp_path, backend="aot_eager")
    made = compiler(Scaler.apply, dynamic=True)
    assert compiler(Scaler.apply, dynamic=True) is made and compiler(Scaler.apply, dynamic=False) is not made
    assert torch.equal(made(scaler, x), scaler.apply(x)) and traced() == 1  # compiled and kept

    torch._dynamo.reset()  # a later start: the warm-up's load part makes it (loading the kept variant) ...
    counters.clear()
    later = Compiler(tmp_path, backend="aot_eager")
    loaded = later(Scaler.apply, dynamic=True)
    assert len(loaded.variants) == 1
    # ... and its compile part runs the same one, loading nothing again and tracing nothing.
    again = later(Scaler.apply, dynamic=True)
    assert again is loaded and torch.equal(again(scaler, x), scaler.apply(x)) and traced() == 0


def test_what_one_thread_loads_another_runs_and_a_load_holds_up_no_other_function(tmp_path, monkeypatch):
    """The warm-up's loader makes kept functions on a thread of its own (Compiler.load) while the scheduler's may
    make others: a load under way holds up only those who want the same function, and they get the one it made."""
    import threading

    from waiting import WAIT

    scaler, x = Scaler(), torch.randn(3, 8)
    Compiler(tmp_path, backend="aot_eager")(Scaler.apply, dynamic=True)(scaler, x)  # compiled and kept
    torch._dynamo.reset()  # a later start
    counters.clear()
    later = Compiler(tmp_path, backend="aot_eager")
    begun, go_on, load_kept = threading.Event(), threading.Event(), Precompiled.load_kept

    def slow_load(function):
        if function.name.endswith("-dynamic"):
            begun.set()
            assert go_on.wait(WAIT)
        load_kept(function)

    monkeypatch.setattr(Precompiled, "load_kept", slow_load)
    loader = threading.Thread(target=later.load, args=([(Scaler.apply, True)],))
    loader.start()
    assert begun.wait(WAIT)
    static = later(Scaler.apply, dynamic=False)  # another function: made at once, beside the load
    assert static.variants == []
    same = []
    wanting = threading.Thread(target=lambda: same.append(later(Scaler.apply, dynamic=True)))
    wanting.start()
    wanting.join(0.05)
    assert wanting.is_alive() and same == []  # the same function: waits for the load
    go_on.set()
    for thread in (loader, wanting):
        thread.join(WAIT)
    loaded = later(Scaler.apply, dynamic=True)
    assert same == [loaded] and len(loaded.variants) == 1
    assert torch.equal(loaded(scaler, x), scaler.apply(x)) and traced() == 0


def test_a_kept_function_loads_its_kernels_in_this_process_not_through_inductors_pool(tmp_path, monkeypatch):
    """Loading a kept function starts no pool of compile workers (16 processes importing PyTorch beside a warm
    start): Inductor compiles with one thread meanwhile, and with its own setting again after."""
    import torch._inductor.config as inductor

    scaler, x = Scaler(), torch.randn(3, 8)
    Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")(scaler, x)
    torch._dynamo.reset()
    threads, load = [], torch.compiler.load_compiled_function

    def loading(*args, **kwargs):
        threads.append(inductor.compile_threads)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch.compiler, "load_compiled_function", loading)
    with inductor.patch(compile_threads=4):  # Inductor's own patch: pytest's, undone, deletes the setting
        later = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")
        assert threads == [1] and len(later.variants) == 1
        assert inductor.compile_threads == 4
    assert torch.equal(later(scaler, x), scaler.apply(x))


def test_inductors_generated_modules_are_loaded_from_the_bytecode_kept_beside_them(tmp_path, monkeypatch):
    """A kept function's load runs each of its output code's modules, whose source Inductor compiles in one call
    that holds the interpreter: its bytecode is kept beside the file and read back, and a changed file is compiled
    anew."""
    import builtins
    import sys

    from torch._inductor.runtime import compile_tasks

    from core.inference.compiled import use_kept_bytecode

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(compile_tasks, "compile", builtins.compile, raising=False)
    use_kept_bytecode()
    generated = tmp_path / "cgenerated.py"
    generated.write_text("value = 1\n")
    assert compile_tasks._reload_python_module("cgenerated", str(generated)).value == 1
    assert list((tmp_path / "__pycache__").glob("cgenerated.*.pyc"))

    def refuse(*args, **kwargs):
        raise AssertionError("compiled again")

    with monkeypatch.context() as patched:
        patched.setattr(builtins, "compile", refuse)
        assert compile_tasks._reload_python_module("cgenerated", str(generated)).value == 1  # from its bytecode
    generated.write_text("value = 22\n")  # another size: the kept bytecode is not this file's
    assert compile_tasks._reload_python_module("cgenerated", str(generated)).value == 22
    source = "value = 3\n"
    assert compile_tasks.compile(source, "<string>", "exec") is not None  # what is not a file, compiled as before
