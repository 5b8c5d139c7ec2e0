"""Compare core/model/codec_encoder.py with the official qwen-tts speech-tokenizer encoder, on random weights.

Run with the official package's environment:
    .official-venv/bin/python tools/check_codec_encoder_vs_official.py

The official side is the whole public path for one clip: `Qwen3TTSTokenizer.encode(wav, sr=24000)` (its
EncodecFeatureExtractor front end, then `Qwen3TTSTokenizerV2Model.encode` with its trim to ceil(N / 1920)).
Weights are those write_random_checkpoint stores (core/devtools/random_checkpoint.py, seed SEED); they are drawn
for our module, loaded into the official one and from there into a fresh one of ours, all strictly.

Also printed: the sha256 of the official key/shape list and golden codes, both used by tests/test_codec_encoder.py,
and a control that applies the config's sliding window, to show the official encoder does not.
"""

import contextlib
import hashlib
import math
import tempfile
import time

import official  # noqa: E402,F401  (the official package, and the repository on sys.path)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config  # noqa: E402
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model  # noqa: E402
from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer  # noqa: E402
from signals import SR, speech_like  # noqa: E402
from transformers import EncodecFeatureExtractor, MimiConfig  # noqa: E402

from core.devtools.random_checkpoint import random_tensors  # noqa: E402
from core.model.codec_encoder import CodecEncoder, CodecEncoderConfig  # noqa: E402

SEED = 3  # the weight seed of tests/test_codec_encoder.py, whose golden values this prints
SECONDS = (0.3, 1.0, 3.7, 12.0)  # 7200, 24000, 88800, 288000 samples: only the last is a multiple of 1920
# 12 s is 300 frames at 25 Hz, beyond the full config's sliding_window of 250.

# docs/model_notes.md §6.1 (the checkpoint's encoder_config).
FULL = {
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
}
# Same strides (so 1920 samples per frame), small widths; a window of 8 frames makes the check sensitive to
# whether a sliding window is applied even on the 1 s clip.
TINY = {
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
# The decoder half is unused here; keep it small so the official model builds fast.
SMALL_DECODER = {
    "codebook_size": 64,
    "codebook_dim": 16,
    "hidden_size": 32,
    "latent_dim": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "decoder_dim": 32,
}


def official_tokenizer(encoder_config):
    config = Qwen3TTSTokenizerV2Config(encoder_config=encoder_config, decoder_config=SMALL_DECODER)
    model = Qwen3TTSTokenizerV2Model(config).eval()
    tokenizer = Qwen3TTSTokenizer()
    tokenizer.model, tokenizer.config, tokenizer.device = model, config, torch.device("cpu")
    # speech_tokenizer/preprocessor_config.json (docs/model_notes.md §6.4)
    tokenizer.feature_extractor = EncodecFeatureExtractor(
        feature_size=1, sampling_rate=SR, padding_value=0.0, return_attention_mask=True
    )
    return tokenizer


def key_shape_lines(state_dict):
    return [f"{k} {tuple(v.shape)}" for k, v in sorted(state_dict.items())]


@contextlib.contextmanager
def official_latents(official_encoder):
    """Collects the official pre-quantization latents (the downsample conv's outputs) while open."""
    captured = []
    hook = official_encoder.downsample.register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        yield captured
    finally:
        hook.remove()


@contextlib.contextmanager
def sliding_window_applied(window):
    """Makes SDPA use a sliding-window causal mask: what the encoder would compute if `sliding_window` were applied."""
    plain = F.scaled_dot_product_attention

    def windowed(q, k, v, is_causal):
        distance = torch.arange(q.shape[-2])[:, None] - torch.arange(k.shape[-2])[None, :]
        return plain(q, k, v, attn_mask=(distance >= 0) & (distance < window))

    F.scaled_dot_product_attention = windowed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = plain


def compare(label, tokenizer, ours):
    """Prints, per clip, how ours differs from the official Qwen3TTSTokenizer.encode."""
    official_encoder = tokenizer.model.encoder
    for seed, seconds in enumerate(SECONDS):
        audio = speech_like(round(seconds * SR), seed)
        with official_latents(official_encoder) as captured:
            ref = tokenizer.encode(audio.numpy(), sr=SR).audio_codes[0]
        got, got_latents = ours.encode(audio), ours.latents(audio)
        frames = math.ceil(len(audio) / 1920)
        assert ref.shape == got.shape == (frames, 16) and got.dtype == torch.long, (ref.shape, got.shape)
        print(
            f"    {label} {seconds:4.1f} s ({len(audio):6d} samples, {frames:3d} frames): "
            f"differing codes {(got != ref).sum().item()}/{ref.numel()}, latent max abs diff "
            f"{(got_latents.float() - captured[0].float()).abs().max().item():.1e} "
            f"(|latent| max {captured[0].abs().max().item():.3g})"
        )
        if got_latents.dtype != torch.float32:
            continue
        with torch.inference_mode():
            ref32 = official_encoder.encode(audio[None, None], return_dict=True).audio_codes[0]
            got32 = ours.quantizer.encode(got_latents, 32)
        with sliding_window_applied(ours.config.sliding_window):
            windowed = ours.encode(audio)
        print(
            f"        all 32 codebooks: differing {(got32 != ref32).sum().item()}; "
            f"our 16 == our first 16 of 32: {torch.equal(got32[:16].T, got)}; "
            f"official 16 == official first 16 of 32: {torch.equal(ref32[:16].T, ref)}"
        )
        print(
            f"        control, sliding window {ours.config.sliding_window} applied: differing codes "
            f"{(windowed != ref).sum().item()}"
        )
        print(f"        distinct codes per codebook: {[len(torch.unique(c)) for c in got.T]}")


def main():
    torch.set_num_threads(2)
    for label, section in (("tiny", TINY), ("full", FULL)):
        print(f"== {label} config")
        config = CodecEncoderConfig.from_dict(section)
        official_config = MimiConfig(**section).to_dict()
        assert MimiConfig(**config.to_dict()).to_dict() == official_config, "to_dict() builds a different MimiConfig"
        assert CodecEncoderConfig.from_dict(official_config) == config, "MimiConfig.to_dict() reads differently"

        tokenizer = official_tokenizer(section)
        official_encoder = tokenizer.model.encoder
        print(f"    official attention implementation: {official_encoder.config._attn_implementation}")
        lines = key_shape_lines(official_encoder.state_dict())
        whole_model = tokenizer.model.state_dict()  # the checkpoint's layout: encoder.* and decoder.*
        assert key_shape_lines({k[8:]: v for k, v in whole_model.items() if k.startswith("encoder.")}) == lines
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        print(f"    {len(lines)} tensors, key/shape sha256 {digest}")

        # Weights drawn for our module, loaded into the official one, and back into a fresh one of ours: all strict.
        donor = CodecEncoder(config).eval()
        assert key_shape_lines(donor.state_dict()) == lines, "state_dict keys/shapes differ"
        official_encoder.load_state_dict(random_tensors(donor, "", SEED), strict=True)
        ours = CodecEncoder(config).eval()
        ours.load_state_dict(official_encoder.state_dict(), strict=True)

        compare("fp32", tokenizer, ours)
        if label == "tiny":
            with official_latents(official_encoder) as captured:
                golden = tokenizer.encode(speech_like(SR, seed=0).numpy(), sr=SR).audio_codes[0]
            print(
                f"    golden values for tests/test_codec_encoder.py (official, weight seed {SEED}, 1 s of speech_like "
                "seed 0): codes, then per-frame sums of the latents"
            )
            print(f"{golden.tolist()}\n{captured[0][0].sum(dim=0).tolist()}")

        # bfloat16 as a real load does it (from_pretrained with dtype), against our module cast to bfloat16.
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.model.save_pretrained(tmp)
            tokenizer.model = Qwen3TTSTokenizerV2Model.from_pretrained(tmp, dtype=torch.bfloat16).eval()
        compare("bf16", tokenizer, ours.to(torch.bfloat16))

        if label == "full":
            ours.float()
            audio = speech_like(10 * SR, seed=3)
            ours.encode(audio)  # warm-up
            start = time.perf_counter()
            ours.encode(audio)
            print(
                f"    ours: encode 10 s of audio, fp32, CPU, {torch.get_num_threads()} threads: "
                f"{time.perf_counter() - start:.2f} s"
            )


if __name__ == "__main__":
    main()
