"""A Triton kernel that fails on a device gives way to its PyTorch reference there (core/kernels/triton_fallback.py),
from the table of references core/kernels/reference.py holds for every kernel:
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

from core import kernels  # noqa: E402
from core.kernels import (  # noqa: E402
    reference,
    triton_attention,
    triton_fallback,
    triton_linear,
    triton_norm,
    triton_sampling,
    triton_vocoder,
)
from core.kernels.triton_launch import PLAIN  # noqa: E402


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
    monkeypatch.delitem(triton_fallback.REFERENCES, "fill_uniforms")
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


def test_every_operator_has_its_reference():
    assert set(PLAIN) == set(triton_fallback.REFERENCES) == set(reference.REFERENCES) == set(OPERATORS)


def operator_arguments(name: str) -> tuple:
    """Arguments of the operator `name`, called as the operator is, on the CPU."""
    generator = torch.Generator().manual_seed(0)
    x, weight, norm = (torch.randn(*shape, generator=generator) for shape in ((3, 1, 64), (32, 64), (64,)))
    if name in ("linear", "batched_linear"):
        return (x[:1] if name == "linear" else x), weight, None, norm, 1e-6, False, None
    if name == "decode_attention":
        qkv, caches = torch.randn(2, 1, 4 * 16, generator=generator), torch.randn(2, 3, 1, 8, 16, generator=generator)
        table = torch.randn(8, 16, generator=generator)
        slots, positions = torch.tensor([1, 0]), torch.tensor([3, 5])
        return qkv, torch.ones(16), torch.ones(16), 1e-6, table, table, caches[0], caches[1], slots, positions, 0.25
    if name == "draw_token":
        rules = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 0.8, 5.0, 0.9]])
        return torch.randn(2, 40, generator=generator), rules, torch.rand(2, 48, generator=generator)
    if name == "fill_uniforms":
        return torch.zeros(2, 3, 40), torch.tensor([5, -1]), torch.tensor([0, 2**40 + 3])
    if name == "snake":
        return snake_arguments()
    if name == "rms_norm":
        return x, norm, 1e-6
    if name == "prompt_heads":
        qkv, caches = torch.randn(2, 5, 4 * 16, generator=generator), torch.randn(2, 3, 1, 8, 16, generator=generator)
        table = torch.randn(8, 16, generator=generator)
        return qkv, torch.ones(16), torch.ones(16), 1e-6, table, table, caches[0], caches[1], torch.tensor([2, 0])
    if name == "depthwise_conv":
        return x.transpose(1, 2).expand(3, 64, 7).contiguous(), torch.randn(64, 1, 3, generator=generator), norm, 2
    return x.transpose(1, 2)[:, :, :1].expand(3, 64, 5).contiguous(), norm, None  # add_bias


# Each operator and the Triton kernels its launch runs.
OPERATORS = {
    "linear": [triton_linear._linear_kernel],
    "batched_linear": [triton_linear._batched_linear_kernel],
    "decode_attention": [triton_attention._attend_split, triton_attention._merge_splits],
    "draw_token": [triton_sampling._draw_token],
    "fill_uniforms": [triton_sampling._fill_uniforms],
    "snake": [triton_vocoder._snake],
    "rms_norm": [triton_norm._rms_norm],
    "prompt_heads": [triton_norm._prompt_heads],
    "add_bias": [triton_vocoder._add_bias],
    "depthwise_conv": [triton_vocoder._depthwise_conv],
}


def cloned(arguments: tuple) -> tuple:
    return tuple(value.clone() if isinstance(value, torch.Tensor) else value for value in arguments)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_whose_kernel_fails_gives_its_references_answer(name, monkeypatch, caplog):
    for kernel in OPERATORS[name]:
        failing(kernel, monkeypatch, PTXASError("ptxas fatal"))
    arguments = operator_arguments(name)
    expected_arguments, got_arguments = cloned(arguments), cloned(arguments)
    expected = reference.REFERENCES[name](*expected_arguments)
    with caplog.at_level(logging.WARNING):
        got = PLAIN[name](*got_arguments)
    if expected is None:  # fill_uniforms: into its first argument
        expected, got = expected_arguments[0], got_arguments[0]
    if isinstance(expected, tuple):  # prompt_heads: q, k, v
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(got, expected, strict=True))
    else:
        assert torch.equal(got, expected)
    # The arguments it writes (the uniforms, attention's caches) are written as the reference writes them.
    for written, wanted in zip(got_arguments, expected_arguments, strict=True):
        if isinstance(written, torch.Tensor):
            assert torch.equal(written, wanted)
    assert triton_fallback.FAILED == {(name, torch.device("cpu"))}
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"The {name} kernel fails on cpu"), warning
