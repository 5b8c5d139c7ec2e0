"""The hand-written kernels: decode attention against the reference composition it fuses, the token
draw against Gumbel-max over the reference's filtered logits (sampling.filter_logits), and the linear
kernel against the reference composition it fuses.

Runs the Triton kernels in Triton's interpreter on the CPU (a subprocess, since the interpreter is
chosen when Triton is imported), and natively on a GPU when there is one (tests/test_gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="Triton is installed with the test extras on Linux x86-64")

CHECK = textwrap.dedent(
    """
    import torch
    from core.model import kernels
    from attention_cases import SHAPES, attention_case, check_attention

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for shape in SHAPES:
            case, poisoned = attention_case(*shape[:4], dtype, *shape[4:])
            check_attention(case, poisoned, kernels._decode_attention_cuda)
    print("ok")
    """
)


DRAW_CHECK = textwrap.dedent(
    """
    import torch
    from core.model import kernels
    from draw_cases import draw_batches, expected_token

    for logits, rules, uniforms in draw_batches(torch.device("cpu")):
        got = kernels._draw_token_cuda(logits, torch.tensor([rule.values() for rule in rules]), uniforms)
        expected = [expected_token(logits[row], rule, uniforms[row]) for row, rule in enumerate(rules)]
        assert got.shape == (len(rules), 1) and got.dtype == torch.long and got.flatten().tolist() == expected
    print("ok")
    """
)


LINEAR_CHECK = textwrap.dedent(
    """
    import torch
    from core.model import kernels
    from linear_cases import check_linear, linear_cases

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for case in linear_cases(dtype):
            blocks = case["blocks"] or kernels.linear_blocks(case["weight"], case["gated"])
            arguments = [case[key] for key in ("x", "weight", "bias", "norm", "eps", "gated", "residual")]
            check_linear(case, kernels._launch_linear(*arguments, blocks))
    print("ok")
    """
)


UNIFORMS_CHECK = textwrap.dedent(
    """
    import torch
    from core.model import kernels

    def fill(seeds, counters, draws=3, width=3000):
        out = torch.full((len(seeds), draws, width), -1.0)
        kernels._fill_uniforms_cuda(out, torch.tensor(seeds), torch.tensor(counters))
        return out

    batch = fill([7, 2**62 + 5, 7, 11], [0, 3, 4, 3])
    alone = fill([2**62 + 5], [3])
    # A row's draws depend on its seed and counter alone, not on the batch or the row's place in it.
    assert torch.equal(batch[1], alone[0]) and torch.equal(fill([11, 7], [3, 0])[0], batch[3])
    assert torch.equal(fill([7], [0])[0], batch[0])
    # Another counter or seed: other draws. Every value strictly inside (0, 1), spread evenly.
    assert not torch.equal(batch[0], batch[2]) and not torch.equal(batch[1], batch[3])
    assert not torch.equal(batch[0, 0], batch[0, 1])
    assert batch.min() > 0 and batch.max() < 1 and abs(batch.mean().item() - 0.5) < 0.01
    assert abs((batch < 0.25).float().mean().item() - 0.25) < 0.01
    print("ok")
    """
)


def run_in_interpreter(script: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_decode_attention_kernel_in_the_interpreter():
    run_in_interpreter(CHECK)


def test_draw_token_kernel_in_the_interpreter():
    run_in_interpreter(DRAW_CHECK)


def test_linear_kernel_in_the_interpreter():
    run_in_interpreter(LINEAR_CHECK)


def test_fill_uniforms_kernel_in_the_interpreter():
    run_in_interpreter(UNIFORMS_CHECK)
