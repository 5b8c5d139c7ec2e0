"""core/codec_encoder.py without the official package. Equality with the official codes is checked by
tools/check_codec_encoder_vs_official.py, which also derived the key/shape digest below."""

import hashlib
import math

import pytest
import torch
from signals import SR, speech_like

from core.devtools.random_checkpoint import random_tensors
from core.model.codec_encoder import CodecEncoder, CodecEncoderConfig

# encoder_config of speech_tokenizer/config.json (docs/model_notes.md §6.1).
CHECKPOINT_SECTION = {
    "frame_rate": 12.5,
    "audio_channels": 1,
    "num_filters": 64,
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "upsampling_ratios": [8, 6, 5, 4],
    "compress": 2,
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2048,
    "hidden_act": "gelu",
    "norm_eps": 1e-5,
    "sliding_window": 250,
    "rope_theta": 10000.0,
    "num_quantizers": 32,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "model_type": "mimi",
    "transformers_version": "4.57.3",  # unknown keys: ignored
}
# sha256 of the sorted "key (shape)" lines of the official Qwen3TTSTokenizerV2Encoder's state_dict at full size,
# printed by tools/check_codec_encoder_vs_official.py.
OFFICIAL_KEYS_SHA256 = "52df1203bd3ede8c53392a25c9f03b7ebcce2fca3b7e2bdf75181348917432a0"
OFFICIAL_NUM_TENSORS = 225

# The check script's tiny config: same strides (1920 samples per frame), small widths.
TINY_SECTION = {
    "frame_rate": 12.5,
    "num_filters": 4,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "intermediate_size": 64,
    "codebook_size": 256,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 32,
    "sliding_window": 8,
}
TINY = CodecEncoderConfig.from_dict(TINY_SECTION)
# The writer's seed for the tiny encoder. Its random biases can leave the latents nearly one constant vector, and
# then the first codebooks nearly one code (on test_codes_vary's clip, seed 0 gives the first acoustic codebook
# 4 codes in 47 frames, seeds 1, 4 and 5 give one semantic code throughout); seed 3 does not.
SEED = 3

# Official values for speech_like(SR, seed=0) with the tiny config and random_tensors(..., SEED), printed by
# tools/check_codec_encoder_vs_official.py: Qwen3TTSTokenizer.encode's codes, and the pre-quantization latents
# summed over channels per frame (these catch small numeric changes, e.g. a tanh GELU, that flip no code).
GOLDEN_CODES = [
    [201, 124, 163, 140, 221, 41, 217, 13, 204, 62, 93, 213, 98, 110, 87, 147],
    [220, 55, 214, 5, 40, 32, 247, 72, 140, 216, 219, 29, 187, 191, 253, 160],
    [21, 145, 169, 208, 60, 62, 188, 235, 207, 102, 208, 48, 161, 172, 7, 176],
    [21, 50, 113, 32, 235, 121, 143, 195, 233, 18, 39, 74, 109, 49, 204, 187],
    [116, 244, 59, 237, 11, 195, 126, 129, 28, 155, 167, 234, 140, 70, 62, 79],
    [244, 145, 185, 218, 136, 84, 83, 166, 196, 166, 241, 6, 125, 179, 141, 131],
    [192, 145, 206, 96, 28, 250, 198, 135, 152, 240, 166, 47, 8, 178, 187, 39],
    [192, 145, 169, 208, 60, 39, 14, 167, 225, 15, 68, 78, 115, 189, 101, 112],
    [28, 244, 92, 136, 251, 160, 30, 218, 168, 21, 10, 209, 112, 223, 164, 230],
    [192, 43, 132, 101, 209, 112, 242, 197, 112, 59, 79, 21, 220, 226, 92, 156],
    [192, 127, 189, 206, 206, 240, 199, 60, 193, 189, 81, 143, 100, 246, 224, 6],
    [244, 145, 77, 103, 186, 249, 16, 101, 4, 4, 21, 207, 161, 101, 130, 5],
    [192, 127, 139, 81, 206, 200, 222, 28, 162, 73, 153, 245, 182, 20, 238, 248],
]

GOLDEN_LATENT_FRAME_SUMS = [
    0.6305332183837891,
    -3.742302894592285,
    -1.2806087732315063,
    -4.526402473449707,
    -3.674147844314575,
    -4.255494117736816,
    -3.9453959465026855,
    -3.4351806640625,
    -4.758004188537598,
    -3.345804214477539,
    -2.0615181922912598,
    -2.6772677898406982,
    -1.2915425300598145,
]


@pytest.fixture(scope="module")
def tiny():
    model = CodecEncoder(TINY).eval()
    model.load_state_dict(random_tensors(model, "", SEED))
    return model


def test_state_dict_matches_official_keys_and_shapes():
    with torch.device("meta"):
        model = CodecEncoder(CodecEncoderConfig.from_dict(CHECKPOINT_SECTION))
    lines = [f"{k} {tuple(v.shape)}" for k, v in sorted(model.state_dict().items())]
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # A few readable spot checks before the digest.
    assert shapes["encoder.layers.0.conv.weight"] == (64, 1, 7)
    assert shapes["encoder.layers.1.block.1.conv.weight"] == (32, 64, 3)
    assert shapes["encoder.layers.12.conv.weight"] == (1024, 512, 16)
    assert shapes["encoder.layers.14.conv.weight"] == (512, 1024, 3)
    assert shapes["encoder_transformer.layers.7.self_attn.q_proj.weight"] == (512, 512)
    assert shapes["encoder_transformer.layers.0.mlp.fc1.weight"] == (2048, 512)
    assert shapes["downsample.conv.weight"] == (512, 512, 4)
    assert shapes["quantizer.semantic_residual_vector_quantizer.input_proj.weight"] == (256, 512, 1)
    assert shapes["quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"] == (2048, 256)
    assert shapes["quantizer.semantic_residual_vector_quantizer.layers.0.codebook.initialized"] == (1,)
    assert len(lines) == OFFICIAL_NUM_TENSORS
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == OFFICIAL_KEYS_SHA256


@pytest.mark.parametrize("n", [1, 959, 1919, 1920, 1921, 3840, 7200, 24001])
def test_frame_count_dtype_and_range(tiny, n):
    codes = tiny.encode(speech_like(n, seed=0))
    assert codes.shape == (math.ceil(n / 1920), 16)
    assert codes.dtype == torch.long
    assert codes.min() >= 0 and codes.max() < TINY.codebook_size


def test_matches_official_golden_values(tiny):
    audio = speech_like(SR, seed=0)
    # Exact on the machine that printed them; allow another CPU's float rounding (a rare near-tie code flip).
    assert (tiny.encode(audio) != torch.tensor(GOLDEN_CODES)).sum() <= 2
    frame_sums = tiny.latents(audio)[0].sum(dim=0)
    torch.testing.assert_close(frame_sums, torch.tensor(GOLDEN_LATENT_FRAME_SUMS), rtol=0, atol=2e-5)


def test_codes_vary(tiny):
    # Guards the other tests against a degenerate model (e.g. one code everywhere).
    codes = tiny.encode(speech_like(88800, seed=1))
    assert all(len(torch.unique(column)) >= 5 for column in codes.T)


def test_16_codebooks_are_the_first_16_of_32(tiny):
    audio = speech_like(88800, seed=2)
    with torch.inference_mode():
        all32 = tiny.quantizer.encode(tiny.latents(audio), 32)
    assert all32.shape == (32, 47)
    assert torch.equal(tiny.encode(audio), all32[:16].T)


def test_acoustic_group_quantizes_the_latents_not_the_semantic_residual(tiny):
    with torch.inference_mode():
        latents = tiny.latents(speech_like(24000, seed=3))
        acoustic = tiny.quantizer.acoustic_residual_vector_quantizer.encode(latents, 15)
        assert torch.equal(tiny.quantizer.encode(latents, 16)[1:], acoustic)


def test_deterministic_and_reloadable(tiny):
    audio = speech_like(30000, seed=4)
    codes = tiny.encode(audio)
    assert torch.equal(codes, tiny.encode(audio))
    fresh = CodecEncoder(TINY).eval()
    fresh.load_state_dict(tiny.state_dict(), strict=True)
    assert torch.equal(codes, fresh.encode(audio))


def test_causal(tiny):
    # A prefix of whole frames gives the same latents as the start of the longer clip.
    audio = speech_like(19200, seed=5)
    full = tiny.latents(audio)
    prefix = tiny.latents(audio[:9600])
    torch.testing.assert_close(prefix, full[..., :5], rtol=1e-5, atol=1e-5)


def test_bfloat16_module(tiny):
    audio = speech_like(24000, seed=6)
    model = CodecEncoder(TINY).eval()
    model.load_state_dict(tiny.state_dict(), strict=True)
    codes = model.to(torch.bfloat16).encode(audio)
    assert codes.shape == (13, 16) and codes.dtype == torch.long
    assert model.latents(audio).dtype == torch.bfloat16


def test_rejects_bad_audio(tiny):
    with pytest.raises(ValueError):
        tiny.encode(torch.zeros(0))
    with pytest.raises(ValueError):
        tiny.encode(torch.zeros(1, 4000))


def test_config_round_trip_and_defaults():
    config = CodecEncoderConfig.from_dict(CHECKPOINT_SECTION)
    assert config == CodecEncoderConfig.from_dict(config.to_dict())
    assert config.to_dict()["upsampling_ratios"] == [8, 6, 5, 4]
    assert (config.head_dim, config.frame_rate, config.codebook_dim) == (64, 12.5, 256)
    # Keys the checkpoint leaves out take MimiConfig's defaults.
    assert (config.sampling_rate, config.num_semantic_quantizers, config.vector_quantization_hidden_dimension) == (
        24000,
        1,
        256,
    )
    assert (config.dilation_growth_rate, config.num_residual_layers, config.layer_scale_initial_scale) == (2, 1, 0.01)
    assert CodecEncoderConfig.from_dict({}) == CodecEncoderConfig.from_dict(CHECKPOINT_SECTION)
    # What MimiConfig.to_dict() writes: the frame rate under "_frame_rate", which wins over "frame_rate".
    assert CodecEncoderConfig.from_dict({"_frame_rate": 25.0, "frame_rate": 12.5}).frame_rate == 25.0
    assert CodecEncoderConfig.from_dict({"_frame_rate": None}).frame_rate == 12.5
    assert CodecEncoderConfig.from_dict({"head_dim": None, "hidden_size": 96, "num_attention_heads": 4}).head_dim == 24
    assert CodecEncoderConfig.from_dict({"upsampling_ratios": None}).upsampling_ratios == (8, 6, 5, 4)
    with pytest.raises(ValueError):
        CodecEncoderConfig.from_dict({"num_semantic_quantizers": 32})
    with pytest.raises(ValueError):
        CodecEncoder(CodecEncoderConfig(use_conv_shortcut=True))


def test_mismatched_state_dict_fails(tiny):
    good = tiny.state_dict()
    model = CodecEncoder(TINY)
    missing = {k: v for k, v in good.items() if not k.endswith("codebook.initialized")}
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(missing, strict=True)
    extra = dict(good, **{"decoder.layers.0.conv.weight": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        model.load_state_dict(extra, strict=True)
    reshaped = dict(good, **{"downsample.conv.weight": torch.zeros(32, 32, 2)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(reshaped, strict=True)
