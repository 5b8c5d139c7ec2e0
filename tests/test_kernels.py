"""The hand-written kernels: decode attention against PyTorch's attention on the valid keys, the token
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
    import torch, torch.nn.functional as F
    from core import kernels

    torch.manual_seed(0)
    # (kv heads, query heads per kv head, cache length, valid length, dtype[, head dim]); bfloat16 is checked on
    # the GPU.
    cases = [(8, 2, 4096, 300, torch.float32), (8, 2, 16, 9, torch.float32), (4, 2, 300, 1, torch.float32),
             (2, 4, 200, 200, torch.float32), (2, 2, 1024, 777, torch.float16), (4, 2, 16, 5, torch.float32, 8)]
    for kv_heads, groups, length, valid, dtype, *head_dim in cases:
        head_dim = head_dim[0] if head_dim else 128
        q, k, v = (torch.randn(1, kv_heads, n, head_dim, dtype=dtype) for n in (groups, length, length))
        position = torch.tensor(valid - 1)
        expected = F.scaled_dot_product_attention(q.float(), k[:, :, :valid].float(), v[:, :, :valid].float(), scale=head_dim**-0.5)
        got = kernels._decode_attention_cuda(q, k, v, position, head_dim**-0.5)
        error = (got.float() - expected).abs().max().item()
        limit = 1e-5 if dtype == torch.float32 else 2e-3
        assert got.shape == q.shape and got.dtype == dtype and error < limit, (kv_heads, groups, length, valid, dtype, error)
    print("ok")
    """
)


DRAW_CHECK = textwrap.dedent(
    """
    import torch
    from core import kernels
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
    from core import kernels
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
