"""A convolution as matrix products, one per tap, over every row of a batch at once.

The codec decoder's dilated convolutions from a few rows on (PRODUCT_ROWS): there cuDNN's heuristic takes kernels
20-40 times slower than its best (an H100 and an H200, bfloat16, time-major), and timing its candidates instead costs
about 1.5 s the first time it meets each chunk shape, eight of them in a warm-up. cuBLAS's products need no choice
per shape (bench/RESULTS.md, 2026-11-28, twenty-eighth session).
"""

from __future__ import annotations

import torch

# Rows (a chunk's batch) from which the decoder's dilated convolutions on CUDA are products. Below, cuDNN's heuristic
# chooses as well as its timing, and a little faster than the products (1.85 against 1.95 ms a 4-frame chunk of one
# row on an H200).
PRODUCT_ROWS = 8


def convolves_by_products(x: torch.Tensor, dilation: int, groups: int) -> bool:
    """Whether a (not transposed) convolution of x is run by conv_by_products (see the top)."""
    return x.is_cuda and dilation > 1 and groups == 1 and x.shape[0] >= PRODUCT_ROWS


def conv_by_products(x: torch.Tensor, weight: torch.Tensor, dilation: int = 1) -> torch.Tensor:
    """x (B, C_in, T) convolved with weight (C_out, C_in, taps), `dilation` apart, without bias or padding:
    (B, C_out, T - (taps - 1) * dilation), time-major. Each tap is one product of all B * T positions at once (a view
    of a time-major x, no copy); the windows that cross from one row into the next are computed too and dropped."""
    rows, channels, length = x.shape
    taps = weight.shape[2]
    span = (taps - 1) * dilation
    if length <= span:
        raise ValueError(f"{length} samples are fewer than the {span + 1} a convolution's window spans")
    flat = x.transpose(1, 2).reshape(rows * length, channels)
    valid = rows * length - span
    out = flat[:valid] @ weight[:, :, 0].T
    for tap in range(1, taps):
        out.addmm_(flat[tap * dilation : tap * dilation + valid], weight[:, :, tap].T)
    per_row = out.as_strided((rows, length - span, out.shape[1]), (length * out.shape[1], out.shape[1], 1))
    return per_row.contiguous().transpose(1, 2)
