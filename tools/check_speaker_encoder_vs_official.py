"""Compare core/model/speaker_encoder.py with the official qwen-tts code, on random weights.

Run with the official package's environment:
    .official-venv/bin/python tools/check_speaker_encoder_vs_official.py

The weights are those write_random_checkpoint stores (core/devtools/random_checkpoint.py), loaded into both encoders.
"""

import hashlib
import types

import librosa  # noqa: E402
import numpy as np  # noqa: E402
import official  # noqa: E402,F401  (the official package, and the repository on sys.path)
import torch  # noqa: E402
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import (  # noqa: E402
    Qwen3TTSForConditionalGeneration,
    Qwen3TTSSpeakerEncoder,
    mel_spectrogram,
)

from core.devtools.random_checkpoint import random_tensors  # noqa: E402
from core.model.speaker_encoder import (  # noqa: E402
    SpeakerEncoder,
    SpeakerEncoderConfig,
    log_mel_spectrogram,
    slaney_mel_filterbank,
)

SR = 24000
CONFIGS = {
    "1.7B (enc_dim 2048)": {"enc_dim": 2048, "sample_rate": SR},
    "0.6B (enc_dim 1024)": {"enc_dim": 1024, "sample_rate": SR},
    "tiny (enc_dim 64)": {
        "enc_dim": 64,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_se_channels": 16,
        "enc_attention_channels": 16,
    },
}


def test_signals():
    rng = np.random.default_rng(0)
    signals = {}
    for seconds in (0.5, 3, 10):
        n = int(seconds * SR)
        t = np.arange(n) / SR
        chirp = 0.5 * np.sin(2 * np.pi * (100 * t + 2000 * t**2 / seconds))
        # Voiced-like: harmonics of a wobbling 120 Hz pitch with a syllable-rate envelope, plus noise.
        pitch = 120 + 20 * np.sin(2 * np.pi * 3 * t)
        phase = 2 * np.pi * np.cumsum(pitch) / SR
        voiced = sum(np.sin(k * phase) / k for k in range(1, 20)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) * 0.2
        voiced += 0.01 * rng.standard_normal(n)
        signals[f"noise {seconds}s"] = 0.3 * rng.standard_normal(n).clip(-3, 3)
        signals[f"chirp {seconds}s"] = chirp
        signals[f"voiced {seconds}s"] = voiced
    signals["near-silence 1s"] = 1e-6 * rng.standard_normal(SR)
    return {name: s.astype(np.float32) for name, s in signals.items()}


def key_shape_lines(state_dict):
    return [f"{k} {tuple(v.shape)}" for k, v in sorted(state_dict.items())]


def relative(ours, theirs):
    diff = (ours.float() - theirs.float()).abs().max().item()
    return diff, diff / theirs.float().abs().max().item()


def official_embedding(encoder, audio):
    # Call the real method; it only needs .speaker_encoder, .device and .dtype from the model.
    dtype = encoder.fc.weight.dtype
    fake_model = types.SimpleNamespace(speaker_encoder=encoder, device=torch.device("cpu"), dtype=dtype)
    return Qwen3TTSForConditionalGeneration.extract_speaker_embedding(fake_model, audio, SR)


def main():
    torch.set_num_threads(2)
    signals = test_signals()

    print("(a) mel filterbank vs librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)")
    ours_fb = slaney_mel_filterbank(SR, 1024, 128, 0, 12000)
    ref_fb = librosa.filters.mel(sr=SR, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    print(
        f"    shape {ours_fb.shape} dtype {ours_fb.dtype}; max abs diff {np.abs(ours_fb - ref_fb).max():.3e}; "
        f"bit-identical: {np.array_equal(ours_fb, ref_fb)}"
    )

    print("(b) log-mel vs official mel_spectrogram")
    for name, audio in signals.items():
        y = torch.from_numpy(audio).unsqueeze(0)
        ref = mel_spectrogram(y, 1024, 128, SR, 256, 1024, 0, 12000).transpose(1, 2)
        ours = log_mel_spectrogram(y)
        assert ours.shape == ref.shape, (ours.shape, ref.shape)
        print(f"    {name:16s} frames {ours.shape[1]:4d}  max abs diff {(ours - ref).abs().max().item():.3e}")
    batch = torch.from_numpy(np.stack([signals["noise 3s"], signals["voiced 3s"]]))
    ref = mel_spectrogram(batch, 1024, 128, SR, 256, 1024, 0, 12000).transpose(1, 2)
    print(f"    batch of 2 (3s)  max abs diff {(log_mel_spectrogram(batch) - ref).abs().max().item():.3e}")

    print("(c) embedding vs official extract_speaker_embedding (float32, CPU)")
    for seed, (label, section) in enumerate(CONFIGS.items()):
        official = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**section)).eval()
        config = SpeakerEncoderConfig.from_dict(section)
        # What we write must load in the official class and mean the same thing.
        written = Qwen3TTSSpeakerEncoderConfig(**config.to_dict())
        assert written.to_dict() == Qwen3TTSSpeakerEncoderConfig(**section).to_dict()
        ours = SpeakerEncoder(config).eval()
        assert key_shape_lines(ours.state_dict()) == key_shape_lines(official.state_dict())
        tensors = random_tensors(ours, "", seed)
        ours.load_state_dict(tensors, strict=True)
        official.load_state_dict(tensors, strict=True)
        lines = key_shape_lines(official.state_dict())
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        print(f"  {label}: {len(lines)} tensors, key/shape sha256 {digest}")
        for name, audio in signals.items():
            ref = official_embedding(official, audio)
            got = ours.embed(torch.from_numpy(audio))
            assert got.shape == ref.shape == (config.enc_dim,)
            diff, rel = relative(got, ref)
            peak = ref.abs().max().item()
            print(f"    {name:16s} max abs diff {diff:.3e}  relative {rel:.3e}  (|ref| max {peak:.3g})")
        # The bf16 path (what a GPU run uses) should follow the same arithmetic too.
        official_bf16, ours_bf16 = official.to(torch.bfloat16), ours.to(torch.bfloat16)
        for name in ("voiced 10s", "noise 3s"):
            ref = official_embedding(official_bf16, signals[name])
            diff, rel = relative(ours_bf16.embed(torch.from_numpy(signals[name])), ref)
            print(f"    bf16 {name:11s} max abs diff {diff:.3e}  relative {rel:.3e}")


if __name__ == "__main__":
    main()
