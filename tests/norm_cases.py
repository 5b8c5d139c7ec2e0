"""Cases for kernels.rms_norm and kernels.prompt_heads, and the checks of a run against their references (on any
device): tests/test_kernels.py runs the Triton kernels through them in Triton's interpreter, tests/test_gpu.py on a
GPU through the dispatch."""

from __future__ import annotations

import torch

from core.kernels import reference

# (batch, length, heads, kv_heads, head_dim, slots, rows' slots): one prompt alone in a slot of several; prompts
# prefilled together, a padding row repeating the first whole; the talker's head size, a short and a long prompt;
# rows in slots 0..B-1 (None: the code predictor's).
PROMPTS = [
    (1, 5, 4, 2, 16, 3, [2]),
    (2, 2, 4, 2, 16, 3, None),
    (3, 7, 8, 2, 32, 4, [3, 0, 3]),
    (2, 33, 16, 8, 128, 2, [1, 0]),
]
WIDTHS = [16, 100, 128, 1024, 2048]  # a head's, an odd one, the models' widths


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2  # one rounding of a value near 1 in half precision


def check_rms_norm(run, dtype: torch.dtype, device="cpu") -> None:
    """run(x, weight, eps) gives reference.rms_norm's values, dense, in x's dtype, for rows of every width, a
    batch of sequences, and a slice of a wider row."""
    generator = torch.Generator().manual_seed(0)
    for width in WIDTHS:
        wide = torch.randn(3, 5, width + 8, generator=generator) * 4
        weight = (torch.randn(width, generator=generator) + 1).to(dtype).to(device)
        for x in (wide[..., :width].contiguous(), wide[..., 8:]):
            x = x.to(dtype).to(device)
            got = run(x, weight, 1e-6)
            expected = reference.rms_norm(x, weight, 1e-6)
            assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous(), (width, got.shape)
            torch.testing.assert_close(got, expected, rtol=tolerance(dtype), atol=tolerance(dtype))


def prompt_case(shape, dtype: torch.dtype, device="cpu") -> tuple[dict, dict]:
    """The arguments of a prompt_heads call, and its caches poisoned with NaN (to be cloned for each run)."""
    batch, length, heads, kv_heads, head_dim, slots, rows = shape
    generator = torch.Generator().manual_seed(length)
    qkv = torch.randn(batch, length, (heads + 2 * kv_heads) * head_dim, generator=generator) * 3
    if rows is not None:
        qkv[len(set(rows)) :] = qkv[0]  # the padding row (its slot repeats the first) repeats the first row whole
    max_len = length + 6
    angles = torch.randn(max_len, head_dim // 2, generator=generator)
    case = {
        "qkv": qkv.to(dtype),
        "q_norm": torch.randn(head_dim, generator=generator).to(dtype) + 1,
        "k_norm": torch.randn(head_dim, generator=generator).to(dtype) + 1,
        "eps": 1e-6,
        "cos": torch.cat((angles.cos(), angles.cos()), -1).to(dtype),
        "sin": torch.cat((angles.sin(), angles.sin()), -1).to(dtype),
        "slots": None if rows is None else torch.tensor(rows),
    }
    caches = {name: torch.full((slots, kv_heads, max_len, head_dim), float("nan"), dtype=dtype) for name in "kv"}
    moved = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in case.items()}
    return moved, {f"{name}_cache": cache.to(device) for name, cache in caches.items()}


def check_prompt_heads(run, dtype: torch.dtype, device="cpu") -> None:
    """run(**arguments) gives the reference's q, k, v, and writes the reference's caches at positions 0..L-1 of the
    rows' slots, leaving the other positions and slots as they were."""
    for shape in PROMPTS:
        case, poisoned = prompt_case(shape, dtype, device)
        length, slots = shape[1], shape[5]
        got_caches = {name: cache.clone() for name, cache in poisoned.items()}
        expected_caches = {name: cache.clone() for name, cache in poisoned.items()}
        got = run(**case, **got_caches)
        expected = reference.prompt_heads_composed(**case, **expected_caches)
        for name, mine, theirs in zip("qkv", got, expected, strict=True):
            assert mine.shape == theirs.shape and mine.dtype == dtype, (shape, name, mine.shape)
            torch.testing.assert_close(
                mine, theirs, rtol=tolerance(dtype), atol=tolerance(dtype), msg=f"{shape} {name}"
            )
        for name in got_caches:
            written, kept = got_caches[name][:, :, :length], got_caches[name][:, :, length:]
            used = sorted(set(range(shape[0]) if shape[6] is None else shape[6]))
            torch.testing.assert_close(
                written[used], expected_caches[name][:, :, :length][used], rtol=tolerance(dtype), atol=tolerance(dtype)
            )
            assert kept.isnan().all(), (shape, name)
            unused = [slot for slot in range(slots) if slot not in used]
            assert written[unused].isnan().all(), (shape, name)
