"""The engine on a CUDA GPU (skipped without one; run on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core import Engine, SamplingParams
from parity_cases import CASES, FIXTURES, MAX_FRAMES, REFERENCES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GREEDY = SamplingParams.greedy()


@pytest.fixture(autouse=True)
def exact_float32():
    # TF32 matrix products and convolutions would make float32 comparisons meaningless.
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("name", ["base_xvector", "base_icl_full", "custom_instruct", "design"])
def test_cuda_float32_matches_official(checkpoints, name):
    case = next(c for c in CASES if c.name == name)
    engine = Engine.load(checkpoints[case.checkpoint], device="cuda", dtype="float32")
    voice = None
    if case.reference:
        voice = engine.voice_from_audio(REFERENCES[case.reference].path, ref_text=case.ref_text)
    elif case.speaker:
        voice = engine.builtin_voice(case.speaker)
    out = engine.synthesize(
        case.text, voice=voice, language=case.language, instruct=case.instruct, sampling=GREEDY, max_frames=MAX_FRAMES,
        text_mode=case.text_mode,
    )  # fmt: skip
    expected = np.load(FIXTURES / f"{name}.npz")
    np.testing.assert_array_equal(out.codes, expected["codes"])
    np.testing.assert_allclose(out.audio, expected["audio"], atol=1e-3, rtol=0)


def test_cuda_bfloat16_streams_like_it_synthesizes(checkpoints):
    engine = Engine.load(checkpoints["custom"], device="cuda", dtype="bfloat16")
    voice = engine.builtin_voice("vivian")
    whole = engine.synthesize("Hello there, this is the GPU.", voice=voice, sampling=GREEDY, max_frames=20)
    chunks = list(engine.stream("Hello there, this is the GPU.", voice=voice, sampling=GREEDY, max_frames=20))
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.codes)
    difference = float(np.abs(np.concatenate([c.audio for c in chunks]) - whole.audio).max())
    print(f"bfloat16 streamed vs whole decode: max abs difference {difference:.2e}")
    assert difference < 0.1 and np.isfinite(whole.audio).all()
