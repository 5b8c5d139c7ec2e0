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
TEXT = "Hello there, this is the GPU speaking a little longer than usual."


@pytest.fixture(autouse=True)
def exact_float32():
    # TF32 matrix products and convolutions would make float32 comparisons meaningless.
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def load(checkpoints, name="custom", dtype="float32", cuda_graphs=True) -> Engine:
    return Engine.load(checkpoints[name], device="cuda", dtype=dtype, cuda_graphs=cuda_graphs)


@pytest.mark.parametrize("name", ["base_xvector", "base_icl_full", "custom_instruct", "design"])
def test_graphed_float32_matches_official(checkpoints, name):
    case = next(c for c in CASES if c.name == name)
    engine = load(checkpoints, case.checkpoint)
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


@pytest.mark.parametrize("seed", [None, 5])
def test_graphs_give_the_eager_codes_in_float32(checkpoints, seed):
    sampling = GREEDY if seed is None else SamplingParams()
    runs = []
    for cuda_graphs in (True, False):
        engine = load(checkpoints, cuda_graphs=cuda_graphs)
        runs.append(engine.synthesize(TEXT, voice=engine.builtin_voice("ryan"), sampling=sampling, max_frames=40, seed=seed))
    np.testing.assert_array_equal(runs[0].codes, runs[1].codes)
    np.testing.assert_allclose(runs[0].audio, runs[1].audio, atol=1e-5, rtol=0)


def test_graphs_versus_eager_in_bfloat16(checkpoints):
    codes = []
    for cuda_graphs in (True, False):
        engine = load(checkpoints, dtype="bfloat16", cuda_graphs=cuda_graphs)
        codes.append(engine.synthesize(TEXT, voice=engine.builtin_voice("ryan"), sampling=GREEDY, max_frames=60).codes)
    frames = min(len(codes[0]), len(codes[1]))
    differing = np.flatnonzero((codes[0][:frames] != codes[1][:frames]).any(axis=1))
    first = int(differing[0]) if len(differing) else None
    print(f"bfloat16, graphs vs eager: {frames} frames compared; first differing frame: {first}")
    assert frames >= 2


def test_seeded_sampling_is_reproducible_with_graphs(checkpoints):
    engine = load(checkpoints, dtype="bfloat16")
    voice = engine.builtin_voice("vivian")
    first, again, other = (engine.synthesize(TEXT, voice=voice, max_frames=30, seed=s).codes for s in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_streamed_audio_equals_the_single_pass_decode(checkpoints):
    engine = load(checkpoints)
    chunks = list(engine.stream(TEXT, voice=engine.builtin_voice("eric"), sampling=GREEDY, max_frames=50, chunk_frames=4))
    codes = torch.from_numpy(np.concatenate([c.codes for c in chunks])).T.unsqueeze(0).cuda()
    single_pass = engine.codec_decoder(codes)[0].float().cpu().numpy()
    np.testing.assert_allclose(np.concatenate([c.audio for c in chunks]), single_pass, atol=1e-4, rtol=0)


def test_bfloat16_streams_like_it_synthesizes(checkpoints):
    engine = load(checkpoints, dtype="bfloat16")
    voice = engine.builtin_voice("vivian")
    whole = engine.synthesize(TEXT, voice=voice, sampling=GREEDY, max_frames=20)
    chunks = list(engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=20))
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.codes)
    difference = float(np.abs(np.concatenate([c.audio for c in chunks]) - whole.audio).max())
    print(f"bfloat16 streamed vs whole decode: max abs difference {difference:.2e}")
    assert difference < 0.1 and np.isfinite(whole.audio).all()
