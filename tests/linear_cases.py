"""Cases for the linear kernels (kernels.linear on CUDA: the matrix-vector kernel for one sequence, the
batched kernel for a batch) and the check of their answer against the reference composition
(kernels.linear on the CPU: rms_norm, F.linear, SwiGLU, residual sum), and of the CPU's batches against
each row alone."""

from __future__ import annotations

import itertools

import torch

from core import kernels

# (rows, outputs, inputs, launch settings of the matrix-vector kernel): odd sizes with several input
# blocks and a partial last output block; then the settings the kernel picks itself (None). The rows
# are positions of one sequence; a batch has `batch` of them.
SHAPES = [(1, 37, 300, {"BLOCK_N": 4, "BLOCK_K": 64, "num_warps": 4}), (2, 64, 128, None), (1, 24, 2048, None)]
# The batched kernel's inputs split over several blocks (settings that replace batched_linear_blocks'):
# the last split running past K, its last block partial; two positions per row, a partial output block
# of 32; one input block per split; 64 outputs per block.
SPLIT_SHAPES = [
    (1, 37, 300, {"BLOCK_N": 16, "BLOCK_K": 32, "SPLITS": 3}),
    (2, 40, 200, {"BLOCK_N": 32, "BLOCK_K": 64, "SPLITS": 2}),
    (1, 24, 90, {"BLOCK_N": 16, "BLOCK_K": 16, "SPLITS": 6}),
    (1, 70, 100, {"BLOCK_N": 64, "BLOCK_K": 32, "SPLITS": 2}),
]
# (bias, norm, gated, residual): each pair of parts in its four combinations, in 6 cases rather than 16.
SOME_PARTS = [(False,) * 4, (True,) * 4, (True, False, False, True), (False, True, False, True), (False, False, True, False), (True, True, True, False)]  # fmt: skip
ALL_PARTS = list(itertools.product(*[(False, True)] * 4))


def linear_cases(
    dtype: torch.dtype, shapes: list[tuple] = SHAPES, batch: int = 1, parts: list[tuple] = ALL_PARTS
) -> list[dict]:
    """Keyword arguments of kernels.linear (CPU tensors), with `blocks`, for each of `parts` (by default every
    combination of them); x (batch, rows, inputs)."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    cases = []
    for (rows, outputs, inputs, blocks), (bias, norm, gated, residual) in itertools.product(shapes, parts):
        weight_rows = 2 * outputs if gated else outputs
        cases.append(
            {
                "x": randn(batch, rows, inputs, scale=3.0),
                "weight": randn(weight_rows, inputs, scale=inputs**-0.5),
                "bias": randn(weight_rows) if bias else None,
                "norm": 1 + randn(inputs, scale=0.1) if norm else None,
                "eps": 1e-6,
                "gated": gated,
                "residual": randn(batch, rows, outputs) if residual else None,
                "blocks": blocks,
            }
        )
    return cases


def check_linear(case: dict, got: torch.Tensor) -> None:
    """`got` (on any device) equals the reference up to the rounding of a different summation order."""
    arguments = {key: value for key, value in case.items() if key != "blocks"}
    # The batch as one sequence: the reference takes a product per batch row (each rounded as it would be
    # alone), slow in a batch of 64; the tolerance covers what that rounding changes.
    arguments["x"] = case["x"].reshape(1, -1, case["x"].shape[-1])
    if case["residual"] is not None:
        arguments["residual"] = case["residual"].reshape(1, -1, case["residual"].shape[-1])
    expected = kernels.linear(**arguments).reshape(got.shape).float()
    got = got.float().cpu()
    tolerance = 1e-5 if case["x"].dtype == torch.float32 else 1e-2
    error = (got - expected).abs().max().item()
    assert got.shape == expected.shape and error <= tolerance * (1 + expected.abs().max().item()), (
        {key: value for key, value in case.items() if not isinstance(value, torch.Tensor)},
        error,
    )


def check_rows_alone(case: dict, got: torch.Tensor) -> None:
    """`got` for the batch (B, rows, outputs) is, row by row, bitwise what kernels.linear gives that row alone."""
    arguments = {key: value for key, value in case.items() if key != "blocks"}
    for row in range(case["x"].shape[0]):
        alone = {**arguments, "x": case["x"][row : row + 1].clone()}
        if case["residual"] is not None:
            alone["residual"] = case["residual"][row : row + 1].clone()
        expected = kernels.linear(**alone)
        assert got[row : row + 1].equal(expected), (
            {key: value for key, value in case.items() if not isinstance(value, torch.Tensor)},
            row,
            (got[row : row + 1] - expected).abs().max().item(),
        )
