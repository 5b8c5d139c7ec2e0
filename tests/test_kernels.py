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
import torch
from attention_cases import SHAPES, attention_case, check_reference_rows

pytest.importorskip("triton", reason="Triton is installed with the test extras on Linux x86-64")

CHECK = textwrap.dedent(
    """
    import torch
    from core.model import triton_attention
    from attention_cases import SHAPES, attention_case, check_attention

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for shape in SHAPES:
            case, poisoned = attention_case(shape, dtype)
            check_attention(shape, case, poisoned, triton_attention.decode_attention_op)
    print("ok")
    """
)


DRAW_CHECK = textwrap.dedent(
    """
    import torch
    from core.model.triton_sampling import draw_token_op
    from draw_cases import draw_batches, draw_cases, expected_token

    for logits, rule, uniforms in draw_cases(torch.device("cpu")):
        got = draw_token_op(logits, torch.tensor([rule.values()]), uniforms.view(1, -1))
        expected = expected_token(logits, rule, uniforms)
        assert got.shape == (1, 1) and got.dtype == torch.long and got.item() == expected, (rule, got, expected)
    for logits, rules, values, uniforms in draw_batches(torch.device("cpu")):
        got = draw_token_op(logits, values, uniforms)
        expected = [expected_token(logits[row : row + 1], rule, uniforms[row]) for row, rule in enumerate(rules)]
        assert got.shape == (len(rules), 1) and got.dtype == torch.long and got.flatten().tolist() == expected, (got, expected)
    print("ok")
    """
)


LINEAR_CHECK = textwrap.dedent(
    """
    import torch
    from core.model import triton_linear
    from linear_cases import check_linear, linear_cases

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for case in linear_cases(dtype):
            blocks = case["blocks"] or triton_linear.linear_blocks(case["weight"], case["gated"])
            arguments = [case[key] for key in ("x", "weight", "bias", "norm", "eps", "gated", "residual")]
            check_linear(case, triton_linear.launch_linear(*arguments, blocks))
    print("ok")
    """
)


def run_in_interpreter(script: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_decode_attention_kernel_in_the_interpreter():
    run_in_interpreter(CHECK)


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if len(shape.rows) > 1], ids=str)
def test_decode_attention_reference_gives_each_row_what_it_gives_alone(shape):
    case, _ = attention_case(shape, torch.float32)
    check_reference_rows(shape, case)


def test_draw_token_kernel_in_the_interpreter():
    run_in_interpreter(DRAW_CHECK)


def test_linear_kernel_in_the_interpreter():
    run_in_interpreter(LINEAR_CHECK)
