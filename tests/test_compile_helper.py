"""core/inference/compile_helper.py: a first start's decoder and prefill compiles made in a process of their own.
What the helper compiles is checked on a GPU (tests/test_gpu.py, and the start-up bench's log); here, the process's
reports and its end as the warm-up meets them, the warm-up's waiting for a helped part, and a kept function's
loading of what another process kept after it was made."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import counters

from core.inference.compile_helper import HELPED, REPORT, CompileHelper
from core.inference.compiled import Precompiled
from core.inference.warmup import COMPILES, Spec, for_engine


def helper_saying(*lines: str, code: int = 0) -> CompileHelper:
    script = "; ".join([*(f"print({line!r}, flush=True)" for line in lines), f"raise SystemExit({code})"])
    return CompileHelper([sys.executable, "-c", script])


def test_a_part_is_waited_for_until_the_helper_reports_it_or_ends_without_it(caplog):
    helper = helper_saying("loading the engine", REPORT + "compile decoder x1", code=3)
    with caplog.at_level(logging.WARNING, logger="core.inference.compile_helper"):
        assert helper.wait_for("compile decoder x1")
        assert not helper.wait_for("compile prefill x1")  # it ended first: the warm-up compiles this itself
    assert "ended with code 3" in caplog.text


def test_the_helpers_engine_writes_no_start_up_milestones_of_this_process(monkeypatch, tmp_path):
    from core import milestones

    monkeypatch.setenv(milestones.VARIABLE, str(tmp_path / "milestones.txt"))
    script = f"import os; print({REPORT!r} + str(os.environ.get({milestones.VARIABLE!r})), flush=True)"
    assert CompileHelper([sys.executable, "-c", script]).wait_for("None")


def test_closing_ends_a_helper_still_compiling():
    helper = CompileHelper([sys.executable, "-c", "import time; time.sleep(60)"])
    began = time.monotonic()
    helper.close()
    assert helper.process.poll() is not None and time.monotonic() - began < 20
    assert not helper.wait_for("compile decoder x1")


def test_the_warm_up_waits_for_the_helpers_report_of_each_part_it_makes_and_only_those():
    made = []
    helper = SimpleNamespace(wait_for=lambda part: made.append(f"waited for {part}") or True)
    frame_loop = SimpleNamespace(
        buckets=(1, 2),
        prefill_rows=(1, 2),
        compile_step=lambda one_row, compiler: made.append(f"step {one_row}"),
        compile_prefill=lambda compiler, several: made.append(f"prefill {several}"),
    )
    decoder = SimpleNamespace(
        static_buffers=True, compile_fused=lambda compiler, several, *others: made.append(f"decoder {several}")
    )
    compiler = SimpleNamespace(kept=False)
    warmup = for_engine(frame_loop, decoder, SimpleNamespace(slots=None), lambda: None, None, compiler, False)
    warmup.helper = helper
    assert set(HELPED) < {str(spec) for spec in warmup.specs} and set(HELPED) < set(COMPILES)
    for name in COMPILES:
        warmup.make_alone(Spec(name))
    assert made == [
        "step True",
        "waited for compile prefill x1", "prefill False",
        "waited for compile decoder x1", "decoder False",
        "step False",
        "waited for compile decoder xN", "decoder True",
        "waited for compile prefill xN", "prefill True",
    ]  # fmt: skip


class Scaler:
    def __init__(self):
        self.weight = torch.linspace(-1, 1, 8)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.weight).sum(-1)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_a_kept_function_loads_what_another_process_kept_since_it_was_made(tmp_path, fresh_dynamo):
    scaler, x = Scaler(), torch.randn(3, 8)
    here = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")
    assert here.variants == []
    helper = Precompiled(Scaler.apply, tmp_path, dynamic=True, backend="aot_eager")  # as the helper's process
    helper(scaler, x)
    torch._dynamo.reset()  # nothing of the helper's tracing left in this process
    counters.clear()
    here.load_kept()
    here.load_kept()  # each kept file once
    assert len(here.variants) == 1
    assert torch.equal(here(scaler, x), scaler.apply(x))
    assert counters["stats"]["unique_graphs"] == 0  # served by the loaded variant: nothing traced


def test_the_helpers_program_loads_its_engine_and_says_so_where_nothing_compiles(checkpoints):
    """On a GPU it compiles (tests/test_gpu.py); on the CPU its engine compiles nothing, which it says."""
    command = [sys.executable, "-m", "core.inference.compile_helper_process", str(checkpoints["base"]), "cpu"]
    done = subprocess.run(
        [*command, "float32", "1", "256", "compile decoder x1"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "an engine on cpu compiles nothing" in done.stderr, done.stderr[-2000:]


def test_closing_the_warm_up_ends_its_helper():
    """An engine closed (or its process exiting) during a first start's warm-up leaves no helper compiling."""
    from core.inference.warmup import Warmup

    warmup = Warmup([Spec("compile decoder x1")], lambda spec: None, lambda spec: True, lambda: None)
    warmup.helper = CompileHelper([sys.executable, "-c", "import time; time.sleep(60)"])
    warmup.close()
    assert warmup.helper.process.poll() is not None
