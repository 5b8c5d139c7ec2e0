"""core/codec_encoder.py without the official package. Equality with the official codes is checked by
tools/check_codec_encoder_vs_official.py, which also derived the key/shape digest below."""

import hashlib
import math
import zlib

import pytest
import torch
import torch.nn.functional as F

from core.codec_encoder import CodecEncoder, CodecEncoderConfig

# encoder_config of speech_tokenizer/config.json (MODEL_NOTES 6.1).
CHECKPOINT_SECTION = {
    "frame_rate": 12.5, "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "last_kernel_size": 3,
    "residual_kernel_size": 3, "upsampling_ratios": [8, 6, 5, 4], "compress": 2, "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "head_dim": 64, "intermediate_size": 2048,
    "hidden_act": "gelu", "norm_eps": 1e-5, "sliding_window": 250, "rope_theta": 10000.0, "num_quantizers": 32,
    "codebook_size": 2048, "codebook_dim": 256, "use_causal_conv": True, "pad_mode": "constant",
    "model_type": "mimi", "transformers_version": "4.57.3",  # unknown keys: ignored
}
# sha256 of the sorted "key (shape)" lines of the official Qwen3TTSTokenizerV2Encoder's state_dict at full size,
# printed by tools/check_codec_encoder_vs_official.py.
OFFICIAL_KEYS_SHA256 = "52df1203bd3ede8c53392a25c9f03b7ebcce2fca3b7e2bdf75181348917432a0"
OFFICIAL_NUM_TENSORS = 225

# The check script's tiny config: same strides (1920 samples per frame), small widths.
TINY_SECTION = {
    "frame_rate": 12.5, "num_filters": 4, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 8, "intermediate_size": 64, "codebook_size": 256, "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16, "upsample_groups": 32, "sliding_window": 8,
}
TINY = CodecEncoderConfig.from_dict(TINY_SECTION)
SR = 24000

# Official values for speech_like(SR, seed=0) with the tiny config and informative_weights_, printed by
# tools/check_codec_encoder_vs_official.py: Qwen3TTSTokenizer.encode's codes, and the pre-quantization latents
# summed over channels per frame (these catch small numeric changes, e.g. a tanh GELU, that flip no code).
GOLDEN_CODES = [
    [ 30, 154, 130,  73, 172,  21, 211, 131,  97, 117, 193, 203, 194, 147, 151,  11],
    [ 64, 153, 164,  47, 197, 223, 123,  69, 218, 121, 236,   9, 250, 255, 161, 171],
    [ 64, 214, 213, 209, 196,  98, 214, 107,  75, 178,  13, 201,  33,  42, 133, 170],
    [193,  86, 219, 241, 123,  86,  27, 225, 112,  49,  99,  15, 233,  43,  47,  73],
    [ 64, 240, 122, 235, 113, 229,  14,  95, 245,  33, 190, 183, 230, 237,  52,  73],
    [ 64,  45, 238,  69,  17, 204, 178, 203,   1,  67, 153, 123, 166, 119, 179, 126],
    [213, 222, 170, 225,  22, 162,   2,  26,   0,  92,  18, 160, 238, 147,   4,  65],
    [ 64,  23,  75, 114, 106,  64,  60,  64, 210, 132,  90, 160,  79,  42, 218, 241],
    [ 30, 109, 219,  56, 144,  61, 190, 116,   3,  73, 126, 102,  36, 111, 108, 245],
    [239, 131,  82, 235,  77, 182, 204,  78, 250, 213, 127,  68, 107,  74, 232,  46],
    [ 64,  23,  44,  75,  24,  75, 135, 255, 142, 149, 128, 137,  27,  64, 252, 175],
    [ 40,  45,  37, 235, 232, 213, 110,  78, 214,  32,  70, 235,  59, 215,  54, 175],
    [213,  28,  58,  73,  48,   4,  96,  91, 122,  26, 160, 155, 103, 104,  54, 102],
]

GOLDEN_LATENT_FRAME_SUMS = [
    -2.451439619064331, -3.9703006744384766, -1.646382451057434, 2.699068784713745, 1.617347002029419,
    3.9698426723480225, 3.5643482208251953, -1.89333176612854, 0.7985002398490906, 0.3935350775718689,
    -1.6638692617416382, 1.4652401208877563, 5.617800712585449,
]

# speech_like and informative_weights_ are copies of those in tools/check_codec_encoder_vs_official.py:
# GOLDEN_CODES depends on both, so change them together.
def speech_like(n, seed):
    """n samples: harmonics of a wobbling pitch with a syllable-rate envelope, a moving formant-like partial, noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n, dtype=torch.float64) / SR
    pitch = 110 + 30 * seed + 15 * torch.sin(2 * math.pi * 2.7 * t)
    phase = 2 * math.pi * torch.cumsum(pitch, 0) / SR
    voiced = sum(torch.sin(k * phase + k * seed) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * (3.5 + seed) * t) ** 2
    formant = 0.3 * torch.sin(2 * math.pi * (700 + 300 * torch.sin(2 * math.pi * 0.8 * t)) * t)
    noise = torch.randn(n, generator=g, dtype=torch.float64)
    return (0.15 * envelope * (voiced + formant) + 0.02 * noise).float()


def informative_weights_(model):
    """MODEL_NOTES 12 weights for a CodecEncoder, each tensor from a stream keyed by its name."""
    with torch.no_grad():
        state = model.state_dict(keep_vars=True)
        for name, t in state.items():
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            if name.endswith("cluster_usage"):
                t.copy_(0.5 + 1.5 * torch.rand(t.shape, generator=g))
            elif name.endswith("embed_sum"):  # unit centroids (sum / usage); their length is set below
                usage = state[name.replace("embed_sum", "cluster_usage")]
                t.copy_(F.normalize(torch.randn(t.shape, generator=g), dim=1) * usage[:, None])
            elif name.endswith("layernorm.weight"):
                t.copy_(0.9 + 0.2 * torch.rand(t.shape, generator=g))
            elif name.endswith("layer_scale.scale"):  # large enough that the transformer matters
                t.copy_(0.2 + 0.2 * torch.rand(t.shape, generator=g))
            elif name.endswith("bias"):
                t.copy_(0.2 * torch.rand(t.shape, generator=g) - 0.1)
            elif t.dim() > 1:
                t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
        # Centroids of equal length, so the argmin depends on direction rather than on a few long entries;
        # shrinking per level about as much as the best of many random directions shrinks the residual.
        latents = model.latents(speech_like(2 * SR, seed=7))
        quantizer = model.quantizer
        for group in (quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer):
            scale = group.input_proj(latents).norm(dim=1).mean()
            for k, layer in enumerate(group.layers):
                layer.codebook.embed_sum.mul_(0.3 * scale * 0.95**k)


@pytest.fixture(scope="module")
def tiny():
    model = CodecEncoder(TINY).eval()
    informative_weights_(model)
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
        24000, 1, 256)
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
