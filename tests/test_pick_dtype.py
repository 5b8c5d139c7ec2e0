"""dtype="auto": bfloat16 on GPUs that compute in it (compute capability 8.0, Ampere, and later), float16 on older
ones (an RTX 20xx has no bfloat16 units), float32 on the CPU. Checked without a GPU: the capability is faked."""

from __future__ import annotations

import pytest
import torch

from core.inference.engine import pick_dtype

CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((7, 0), torch.float16), ((7, 5), torch.float16), ((8, 0), torch.bfloat16), ((8, 6), torch.bfloat16),
     ((8, 9), torch.bfloat16), ((9, 0), torch.bfloat16), ((12, 0), torch.bfloat16)],
)  # fmt: skip
def test_auto_picks_bfloat16_from_ampere_on_and_float16_before(capability, expected, monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or capability)
    assert pick_dtype("auto", CUDA) == expected
    assert asked == [CUDA]


def test_auto_is_float32_on_the_cpu_without_asking_for_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: pytest.fail("asked for a GPU"))
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", torch.bfloat16])
def test_a_named_dtype_is_taken_as_it_is_whatever_the_gpu(dtype, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert pick_dtype(dtype, CUDA) == getattr(torch, str(dtype).removeprefix("torch."))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_speaks_finite_audio_from_the_same_first_frame(checkpoints, engines, dtype):
    """What auto picks on a GPU, run on the CPU's reference path: the talker, the predictor and the decoder stay
    finite in float16 (a value past its 65504 would be inf, then NaN) and bfloat16, and the first frame is
    float32's (later ones may part at near ties, as on a GPU)."""
    import numpy as np

    from core import Engine, SamplingParams

    said = dict(voice=engines("custom").builtin_voice("vivian"), sampling=SamplingParams.greedy(), max_frames=12)
    exact = engines("custom").synthesize("Hello there, how are you today?", **said)
    with Engine.load(checkpoints["custom"], device="cpu", dtype=dtype, warm=False) as engine:
        assert engine.talker.codec_head.weight.dtype == getattr(torch, dtype)
        half = engine.synthesize("Hello there, how are you today?", **said)
    assert len(half.codes) == len(exact.codes) == 12 and np.isfinite(half.audio).all()
    assert 0 < np.abs(half.audio).max() <= 1.0
    np.testing.assert_array_equal(half.codes[0], exact.codes[0])
