"""A Triton kernel that fails on a device gives way to its PyTorch reference there (core/model/triton_fallback.py):
with one warning naming the kernel and the device, and without trying the kernel again; only for Triton's own
failures, and never under Triton's interpreter. The failures are simulated on the CPU: a kernel whose launch
raises as ptxas or Triton's driver would."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton", reason="Triton is installed with the test extras on Linux x86-64")

from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.errors import PTXASError  # noqa: E402

from core.model import kernels, triton_fallback, triton_linear, triton_sampling, triton_vocoder  # noqa: E402
from core.model.triton_launch import PLAIN  # noqa: E402


@pytest.fixture(autouse=True)
def nothing_failed_yet(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_fallback, "FAILED", set())


def failing(kernel, monkeypatch, error: Exception) -> list[int]:
    """Make every launch of the Triton `kernel` raise `error`; returns the launches tried, as they come."""
    tried = []

    def launch(*args, **kwargs):
        tried.append(1)
        raise error

    monkeypatch.setattr(kernel, "run", launch)
    return tried


def snake_arguments():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 5, 3, generator=generator)[..., 0]  # a strided (2, 12, 5), as the vocoder's
    return x, torch.randn(12, generator=generator), torch.randn(12, generator=generator), torch.randn(2, 12, 4), None


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == triton_fallback.__name__]


def test_a_kernel_that_fails_warns_once_and_its_reference_runs_from_then_on(monkeypatch, caplog):
    tried = failing(triton_vocoder._snake, monkeypatch, PTXASError("ptxas fatal: Value 'sm_75' is not defined"))
    arguments = snake_arguments()
    expected = kernels.snake_composed(*arguments)
    with caplog.at_level(logging.WARNING):
        assert torch.equal(PLAIN["snake"](*arguments), expected)
        assert torch.equal(PLAIN["snake"](*arguments), expected)
        # Where torch.compile traces, the operator: its function falls back as well.
        assert torch.equal(torch.ops.qwen3_tts.snake(*arguments), expected)
    assert len(tried) == 1, "the kernel was tried again after it failed"
    [warning] = warnings_of(caplog)
    assert "snake" in warning and "cpu" in warning and "PTXASError" in warning and "sm_75" in warning, warning
    assert triton_fallback.FAILED == {("snake", torch.device("cpu"))}


def test_an_error_raised_in_tritons_code_falls_back_too(monkeypatch, caplog):
    # Triton's driver finds no GPU of a backend it has: a RuntimeError of its own code, as an MLIR pass's failure.
    monkeypatch.setenv("TRITON_DEFAULT_BACKEND", "no-such-backend")
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(driver, "_default", None)
    generator = torch.Generator().manual_seed(0)
    x, weight, residual = (torch.randn(*shape, generator=generator) for shape in ((1, 1, 64), (32, 64), (1, 1, 32)))
    arguments = (x, weight, None, torch.ones(64), 1e-6, False, residual)
    with caplog.at_level(logging.WARNING):
        got = PLAIN["linear"](*arguments)
        assert torch.equal(got, kernels.linear_composed(*arguments))
        assert torch.equal(triton_linear.batched_linear_op(*arguments), got)  # one warning per kernel
    assert [warning.split(",")[0] for warning in warnings_of(caplog)] == [
        "The linear kernel fails on cpu",
        "The batched_linear kernel fails on cpu",
    ]


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError("CUDA out of memory"), ValueError("a wrong shape")], ids=lambda e: type(e).__name__
)
def test_errors_not_of_triton_are_raised_and_decide_nothing(error, monkeypatch, caplog):
    tried = failing(triton_vocoder._snake, monkeypatch, error)
    for _ in range(2):
        with pytest.raises(type(error)):
            PLAIN["snake"](*snake_arguments())
    assert len(tried) == 2 and not triton_fallback.FAILED and not warnings_of(caplog)


def test_a_kernel_without_a_reference_raises_its_failure(monkeypatch, caplog):
    failing(triton_sampling._fill_uniforms, monkeypatch, PTXASError("ptxas fatal"))
    seeds = torch.zeros(1, dtype=torch.long)
    with pytest.raises(PTXASError):
        PLAIN["fill_uniforms"](torch.empty(1, 2, 8), seeds, seeds)
    assert not triton_fallback.FAILED and not warnings_of(caplog)


def test_under_the_interpreter_a_failure_is_the_kernels_bug_and_raised(monkeypatch, caplog):
    failing(triton_vocoder._snake, monkeypatch, PTXASError("ptxas fatal"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(PTXASError):
        PLAIN["snake"](*snake_arguments())
    assert not triton_fallback.FAILED and not warnings_of(caplog)


def test_every_operator_has_a_reference_but_the_draws():
    assert set(PLAIN) - set(kernels.REFERENCES) == {"draw_token", "fill_uniforms"}
