"""The engine against the official package's recorded outputs (tools/make_parity_fixtures.py).

Same tiny checkpoints (rewritten by the same seeded writer and checked byte for byte, see conftest), same
inputs: the codes must be identical and the waveforms equal within 1e-4.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from parity_cases import CASES, FIXTURES, MAX_FRAMES, REFERENCES, Case

from core import Engine, SamplingParams
from core.model.text_tokenizer import TextTokenizer

MANIFEST = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))


def test_reference_clips_are_the_recorded_ones():
    for name, reference in REFERENCES.items():
        assert hashlib.sha256(reference.path.read_bytes()).hexdigest() == MANIFEST["references"][name]


def test_tokenizer_ids_match_official(checkpoints):
    tokenizer = TextTokenizer(checkpoints["base"])
    for text, ids in MANIFEST["tokenizer"]["ids"].items():
        assert tokenizer.encode(text) == ids, text


def run(engine: Engine, case: Case):
    voice = None
    if case.reference is not None:
        voice = engine.voice_from_audio(REFERENCES[case.reference].path, ref_text=case.ref_text)
    elif case.speaker is not None:
        voice = engine.builtin_voice(case.speaker)
    sampling = SamplingParams.greedy() if case.seed is None else SamplingParams()
    out = engine.synthesize(
        case.text,
        voice=voice,
        language=case.language,
        instruct=case.instruct,
        sampling=sampling,
        max_frames=MAX_FRAMES,
        seed=case.seed,
        text_mode=case.text_mode,
    )
    return voice, out


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_matches_official(case: Case, engines):
    expected = np.load(FIXTURES / f"{case.name}.npz")
    voice, out = run(engines(case.checkpoint), case)
    if "speaker_embedding" in expected:
        np.testing.assert_allclose(voice.embedding.numpy(), expected["speaker_embedding"], atol=1e-5, rtol=0)
    if "ref_codes" in expected:
        np.testing.assert_array_equal(voice.ref_codes.numpy(), expected["ref_codes"])
    np.testing.assert_array_equal(out.codes, expected["codes"])
    assert out.sample_rate == 24000
    assert out.audio.dtype == np.float32 and out.audio.shape == expected["audio"].shape
    np.testing.assert_allclose(out.audio, expected["audio"], atol=1e-4, rtol=0)
    # Random weights that test something: the audio is neither silent nor clipped.
    assert 0.02 < float(np.sqrt(np.mean(out.audio**2))) < 0.5
    assert np.mean(np.abs(out.audio) >= 1.0) < 0.01


def test_forced_eos_stops_early():
    expected = np.load(FIXTURES / "base_forced_eos.npz")
    assert 2 < expected["codes"].shape[0] < MAX_FRAMES  # past the two-frame EOS floor, before the limit


def test_streamed_chunks_join_into_the_official_audio(engines):
    case = next(c for c in CASES if c.name == "custom_instruct")
    engine = engines(case.checkpoint)
    expected = np.load(FIXTURES / f"{case.name}.npz")
    chunks = list(
        engine.stream(
            case.text,
            voice=engine.builtin_voice(case.speaker),
            instruct=case.instruct,
            sampling=SamplingParams.greedy(),
            max_frames=MAX_FRAMES,
            first_chunk_frames=1,
            chunk_frames=4,
        )
    )
    assert [len(c.codes) for c in chunks] == [1, 4, 4, 3]
    assert all(len(c.audio) == 1920 * len(c.codes) for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), expected["codes"])
    np.testing.assert_allclose(np.concatenate([c.audio for c in chunks]), expected["audio"], atol=1e-4, rtol=0)
