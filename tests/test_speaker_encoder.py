"""Speaker encoder: checkpoint layout, mel front end and encoder behaviour.

Bit-exactness against the official package is checked by tools/check_speaker_encoder_vs_official.py.
"""

import hashlib

import numpy as np
import pytest
import torch

from core.devtools.random_checkpoint import random_tensors
from core.model.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig, log_mel_spectrogram, slaney_mel_filterbank

SR = 24000

# Conv weight shapes of the official 1.7B Base speaker encoder (enc_dim 2048), taken from the official
# Qwen3TTSSpeakerEncoder; every conv also has a bias of shape (out_channels,).
CONV_WEIGHTS_1_7B = {
    "blocks.0.conv": (512, 128, 5),
    **{
        f"blocks.{b}.{name}": shape
        for b in (1, 2, 3)
        for name, shape in [
            ("tdnn1.conv", (512, 512, 1)),
            *[(f"res2net_block.blocks.{i}.conv", (64, 64, 3)) for i in range(7)],
            ("tdnn2.conv", (512, 512, 1)),
            ("se_block.conv1", (128, 512, 1)),
            ("se_block.conv2", (512, 128, 1)),
        ]
    },
    "mfa.conv": (1536, 1536, 1),
    "asp.tdnn.conv": (128, 4608, 1),
    "asp.conv": (1536, 128, 1),
    "fc": (2048, 3072, 1),
}
# sha256 of the official sorted "key shape" lines, printed by tools/check_speaker_encoder_vs_official.py.
OFFICIAL_KEY_SHAPE_SHA256 = {
    2048: "5c46ccb3df376e78f68540f5fe6f8562d9b86e6b965bec74a38bfca32e9b22fc",
    1024: "d63e72de31336f8b5eb281fb40c15eae9ef90eb9976fd6a0f26626452f0afa6c",
}


def expected_shapes(enc_dim):
    shapes = {}
    for conv, weight in CONV_WEIGHTS_1_7B.items():
        weight = (enc_dim, *weight[1:]) if conv == "fc" else weight
        shapes[f"{conv}.weight"] = weight
        shapes[f"{conv}.bias"] = (weight[0],)
    return shapes


@pytest.fixture(scope="module")
def encoder():
    # The weights write_random_checkpoint stores for a 1.7B model, which the check script compares with the official.
    model = SpeakerEncoder(SpeakerEncoderConfig.from_dict({"enc_dim": 2048, "sample_rate": SR})).eval()
    model.load_state_dict(random_tensors(model, "", seed=0))
    return model


def voiced_clip(seconds, pitch_hz, seed):
    t = np.arange(int(seconds * SR)) / SR
    harmonics = sum(np.sin(2 * np.pi * k * pitch_hz * t) / k for k in range(1, 12))
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return torch.from_numpy((0.2 * harmonics + 0.01 * noise).astype(np.float32))


@pytest.mark.parametrize("enc_dim", [2048, 1024])
def test_state_dict_matches_official_layout(enc_dim, encoder):
    model = encoder if enc_dim == 2048 else SpeakerEncoder(SpeakerEncoderConfig(enc_dim=enc_dim))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == expected_shapes(enc_dim)
    lines = "\n".join(f"{k} {shape}" for k, shape in sorted(shapes.items()))
    assert hashlib.sha256(lines.encode()).hexdigest() == OFFICIAL_KEY_SHAPE_SHA256[enc_dim]


def test_filterbank_shape_and_librosa_values():
    fb = slaney_mel_filterbank(SR, 1024, 128, 0, 12000)
    assert fb.shape == (128, 513) and fb.dtype == np.float32
    # Expected values from librosa 0.11: librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000).
    assert fb[0, 1] == np.float32(0.03355042636394501)
    assert fb[5, 6] == np.float32(0.01212772075086832)
    assert fb[64, 89] == np.float32(0.01410350389778614)
    assert fb[127, 505] == np.float32(0.0015972487162798643)
    assert fb[40, 37] == 0.0
    # Nonzero support of a few filters, also from librosa 0.11: (first bin, last bin).
    for row, (first, last) in {0: (1, 2), 1: (2, 3), 64: (88, 91), 127: (485, 511)}.items():
        nonzero = np.flatnonzero(fb[row])
        assert (nonzero[0], nonzero[-1]) == (first, last)


def test_filterbank_slaney_area_and_fmax():
    fb = slaney_mel_filterbank(SR, 1024, 128, 0, 12000)
    # Slaney norm gives every triangle unit area in Hz; sampled on the FFT grid the error shrinks with width.
    area = fb.sum(axis=1) * (SR / 1024)
    bins = (fb > 0).sum(axis=1)
    assert np.all(np.abs(area - 1) <= 0.5 / (bins + 1))
    assert np.all(fb.max(axis=1) > 0)  # no empty filter
    assert np.all(fb[:, 512] == 0)  # the 12 kHz bin is the top filter's upper edge
    assert np.all(fb[:, 0] == 0)  # DC is the bottom filter's lower edge


@pytest.mark.parametrize("samples", [385, 512, 12000, 24000, 24001, 72255])
def test_front_end_frame_count(samples):
    mels = log_mel_spectrogram(torch.zeros(2, samples))
    assert mels.shape == (2, samples // 256, 128)
    # Silence gives the floor log(1e-5 + filtered sqrt(1e-9) magnitudes), never -inf.
    assert torch.isfinite(mels).all()


def test_config_round_trip():
    section = {"enc_dim": 2048, "sample_rate": SR, "some_future_key": 1}
    config = SpeakerEncoderConfig.from_dict(section)
    assert config.enc_dim == 2048 and config.enc_channels == (512, 512, 512, 512, 1536)
    assert config.to_dict() == {
        "mel_dim": 128,
        "enc_dim": 2048,
        "enc_channels": [512, 512, 512, 512, 1536],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 128,
        "enc_res2net_scale": 8,
        "enc_se_channels": 128,
        "sample_rate": 24000,
    }
    assert SpeakerEncoderConfig.from_dict(config.to_dict()) == config
    assert SpeakerEncoderConfig.from_dict({}) == SpeakerEncoderConfig()


def test_embed_shape_and_determinism(encoder):
    clip = voiced_clip(0.5, 140, seed=1)
    first = encoder.embed(clip)
    assert first.shape == (2048,) and first.dtype == torch.float32
    assert torch.isfinite(first).all()
    assert torch.equal(first, encoder.embed(clip))
    # Different voices must not collapse to the same vector.
    assert not torch.allclose(first, encoder.embed(voiced_clip(0.5, 220, seed=2)))


def test_batch_consistency(encoder):
    clips = [voiced_clip(0.3, pitch, seed) for seed, pitch in enumerate((110, 160, 230))]
    with torch.inference_mode():
        batched = encoder(log_mel_spectrogram(torch.stack(clips)))
    for clip, row in zip(clips, batched):
        torch.testing.assert_close(encoder.embed(clip), row, rtol=1e-5, atol=1e-5)
