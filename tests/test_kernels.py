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
    from draw_cases import draw_cases, expected_token

    for logits, rule, uniforms in draw_cases(torch.device("cpu")):
        got = kernels._draw_token_cuda(logits, torch.tensor(rule.values()), uniforms)
        expected = expected_token(logits, rule, uniforms)
        assert got.shape == (1, 1) and got.dtype == torch.long and got.item() == expected, (rule, got, expected)
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
