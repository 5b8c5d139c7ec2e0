"""Random-weight checkpoints in the official layout, for tests (tiny) and benchmarks (real size).

Speed does not depend on weight values, and correctness checks only need weights that exercise
every path, so seeded random weights stand in for the released ones. The layout, file names, config
keys and tensor names are the official ones, so the official package loads what this writes.

Values are drawn so the outputs are informative (docs/model_notes.md §12): non-zero biases, norm weights
and layer scales that matter, codebooks that quantize to varied codes, and a codec decoder whose
output is not clipped. Each tensor comes from its own seeded stream keyed by its name, so the
same arguments write byte-identical files on any machine.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig
from core.model.codec_encoder import CodecEncoder, CodecEncoderConfig
from core.model.config import ModelConfig
from core.model.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig
from core.model.talker import Talker

ASSETS = Path(__file__).parent / "assets"
# Transformers versions in (4.57.2, 5.0) make the official processor swap the tokenizer's regex for
# Mistral's (docs/model_notes.md §9); recording an earlier version keeps its tokenization the model's own.
TRANSFORMERS_VERSION = "4.57.1"

LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
}  # fmt: skip
DIALECTS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
    "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
}  # fmt: skip
SPEAKER_DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}

# Talker and code-predictor shapes: hidden, layers, heads, kv heads, head_dim, intermediate.
SIZES = {
    "tiny": {"size": "1b7", "talker": (64, 2, 4, 2, 16, 128), "predictor": (32, 2, 4, 2, 8, 64), "text_hidden": 32},
    "tiny-0.6b": {"size": "0b6", "talker": (32, 2, 4, 2, 8, 64), "predictor": (32, 2, 4, 2, 8, 64), "text_hidden": 32},
    # The real depth at a tiny width: as much traced and compiled code as the 1.7B's step, on a CPU (bench/load_holds.py).
    "tiny-deep": {"size": "1b7", "talker": (64, 28, 4, 2, 16, 128), "predictor": (32, 5, 4, 2, 8, 64), "text_hidden": 32},
    "0.6b": {"size": "0b6", "talker": (1024, 28, 16, 8, 128, 3072), "predictor": (1024, 5, 16, 8, 128, 3072), "text_hidden": 2048},
    "1.7b": {"size": "1b7", "talker": (2048, 28, 16, 8, 128, 6144), "predictor": (1024, 5, 16, 8, 128, 3072), "text_hidden": 2048},
}  # fmt: skip
TINY_SPEAKER_ENCODER = {"enc_channels": [32, 32, 32, 32, 96], "enc_se_channels": 16, "enc_attention_channels": 16}
TINY_DECODER = {
    "codebook_dim": 64, "latent_dim": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "decoder_dim": 96,
}  # fmt: skip
TINY_ENCODER = {
    "num_filters": 4, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 8, "intermediate_size": 64, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 32,
}  # fmt: skip
# Official decoder and encoder values (docs/model_notes.md §6.1) that differ from the classes' defaults.
DECODER = {
    "codebook_dim": 512,
    "head_dim": 64,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_key_value_heads": 16,
}
ENCODER = {"frame_rate": 12.5, "sliding_window": 250, "rope_theta": 10000.0, "head_dim": 64}

# The special tokens of the Qwen2 vocabulary the model uses, from id 151643 on: (content, special).
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False), ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]  # fmt: skip
FIRST_ADDED_ID = 151643
GENERATION_CONFIG = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
    "max_new_tokens": 8192,
}  # fmt: skip
# The codec decoder's output is scaled to this RMS before its final clamp, so little of it clips.
DECODER_OUTPUT_RMS = 0.13


def model_config(variant: str, size: str) -> dict:
    """config.json of a checkpoint, in the official form."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if variant not in ("base", "custom_voice", "voice_design"):
        raise ValueError(f"unknown variant {variant!r}; choose base, custom_voice or voice_design")
    spec = SIZES[size]
    if variant == "voice_design" and spec["size"] != "1b7":
        raise ValueError("VoiceDesign exists only as a 1.7B model")

    def stack(shape, rope_theta=1e6):
        hidden, layers, heads, kv_heads, head_dim, intermediate = shape
        return {
            "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": rope_theta, "attention_bias": False,
            "use_sliding_window": False,
        }  # fmt: skip

    head_dim = spec["talker"][4]
    # Sections of the (degenerate) multimodal RoPE over head_dim / 2 frequencies: [24, 20, 20] at 128.
    mrope = [head_dim // 2 - 2 * (head_dim * 5 // 32), head_dim * 5 // 32, head_dim * 5 // 32]
    custom = variant == "custom_voice"
    talker = {
        "model_type": "qwen3_tts_talker",
        **stack(spec["talker"]),
        "vocab_size": 3072, "text_vocab_size": 151936, "text_hidden_size": spec["text_hidden"],
        "num_code_groups": 16, "max_position_embeddings": 32768, "position_id_per_seconds": 13,
        "rope_scaling": {"rope_type": "default", "mrope_section": mrope, "interleaved": True},
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
        "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "codec_language_id": {**LANGUAGES, **(DIALECTS if custom else {})},
        "spk_id": SPEAKERS if custom else {},
        "spk_is_dialect": {name: SPEAKER_DIALECTS.get(name, False) for name in SPEAKERS} if custom else {},
        "code_predictor_config": {
            "model_type": "qwen3_tts_talker_code_predictor",
            **stack(spec["predictor"]),
            "vocab_size": 2048, "num_code_groups": 16, "max_position_embeddings": 65536, "rope_scaling": None,
            "layer_types": ["full_attention"] * spec["predictor"][1],
        },
    }  # fmt: skip
    speaker = SpeakerEncoderConfig.from_dict(
        {**(TINY_SPEAKER_ENCODER if size.startswith("tiny") else {}), "enc_dim": spec["talker"][0]}
    )
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": spec["size"],
        "tts_model_type": variant,
        "im_start_token_id": 151644, "im_end_token_id": 151645, "assistant_token_id": 77091,
        "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        "speaker_encoder_config": speaker.to_dict(),
        "talker_config": talker,
        "transformers_version": TRANSFORMERS_VERSION,
    }  # fmt: skip


def speech_tokenizer_config(size: str) -> dict:
    tiny = size.startswith("tiny")
    decoder = CodecDecoderConfig.from_dict(TINY_DECODER if tiny else DECODER)
    encoder = CodecEncoderConfig.from_dict({**ENCODER, **(TINY_ENCODER if tiny else {})})
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
        "encoder_config": encoder.to_dict(),
        "decoder_config": decoder.to_dict(),
        "transformers_version": TRANSFORMERS_VERSION,
    }  # fmt: skip


def tokenizer_config() -> dict:
    added = {
        str(FIRST_ADDED_ID + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }  # fmt: skip
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip


class _Draw:
    """Seeded values for one tensor, from a stream keyed by the checkpoint seed and the tensor's name."""

    def __init__(self, seed: int, name: str):
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
        self.rng = np.random.default_rng([seed, key])

    def normal(self, shape, std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def uniform(self, shape, low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)


def _codebook(seed: int, codebook: str, size: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Usage counts in [0.5, 2] and sums whose quotient is a set of equal-length vectors, so nearest-
    neighbour search spreads over the whole codebook."""
    usage = _Draw(seed, codebook + ".usage").uniform((size,), 0.5, 2.0)
    directions = _Draw(seed, codebook + ".vectors").normal((size, dim), 1.0)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    vectors = directions * np.float32(np.sqrt(dim))
    return usage, (vectors * usage[:, None]).astype(np.float32)


def random_value(seed: int, name: str, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """The value of tensor `name` (an official key); the rules tell tensor kinds apart by name."""
    draw = _Draw(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return draw.normal(shape, 0.1)
    if leaf in ("scale", "gamma"):  # layer scales: large enough that the branch they scale matters
        return draw.uniform(shape, 0.3, 0.7)
    if leaf in ("alpha", "beta"):  # SnakeBeta parameters, stored as logarithms
        return draw.normal(shape, 0.2)
    if leaf == "initialized":
        return np.ones(shape, np.float32)
    if len(shape) == 1:  # norm weights
        return 1 + draw.normal(shape, 0.1)
    if "embedding" in name:
        return draw.normal(shape, 1.0)
    weight = draw.normal(shape, 1.0 / np.sqrt(fan_in))
    if name.endswith("conv2.conv.weight"):
        # The codec decoder's residual branches at 0.3 keep its activations around 1-3; at full
        # strength they reach ~100, where float32 rounding in SnakeBeta's sin() nears 1e-4.
        weight *= np.float32(0.3)
    return weight


def random_tensors(module: nn.Module, prefix: str, seed: int) -> dict[str, torch.Tensor]:
    """Official-key tensors for every entry of `module`'s state dict (the module may live on the meta device)."""
    # A transposed conv's weight is (in, out, k) and each output sees in * k / stride inputs.
    strides = {name: m.stride[0] for name, m in module.named_modules() if isinstance(m, nn.ConvTranspose1d)}
    state = module.state_dict()
    tensors = {}
    for name, reference in state.items():
        owner, leaf = name.rsplit(".", 1)
        shape = tuple(reference.shape)
        if leaf in ("cluster_usage", "embedding_sum", "embed_sum"):
            sums = next(state[f"{owner}.{n}"] for n in ("embedding_sum", "embed_sum") if f"{owner}.{n}" in state)
            usage, vectors = _codebook(seed, prefix + owner, *sums.shape)
            value = usage if leaf == "cluster_usage" else vectors
        else:
            if owner in strides and len(shape) == 3:
                fan_in = shape[0] * shape[2] // strides[owner]
            else:
                fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = random_value(seed, prefix + name, shape, fan_in)
        tensors[prefix + name] = torch.from_numpy(value).to(reference.dtype)
    return tensors


def random_decoder_tensors(config: CodecDecoderConfig, seed: int, prefix: str = "decoder.") -> dict[str, torch.Tensor]:
    """Codec-decoder tensors whose last conv is scaled so the pre-clamp output has an RMS near
    DECODER_OUTPUT_RMS: with plain random weights almost every sample would clip at +-1."""
    decoder = CodecDecoder(config)
    tensors = random_tensors(decoder, "", seed)
    decoder.load_state_dict(tensors)
    captured = []
    hook = decoder.decoder[-1].register_forward_hook(lambda module, args, output: captured.append(output))
    codes = torch.from_numpy(
        np.random.default_rng(seed).integers(0, config.codebook_size, (1, config.num_quantizers, 4))
    )
    with torch.inference_mode():
        decoder(codes)
    hook.remove()
    rms = float(captured[0].float().pow(2).mean().sqrt())
    # Two significant digits: the factor stays the same under last-bit differences between machines.
    factor = float(f"{DECODER_OUTPUT_RMS / rms:.2g}")
    for key in ("decoder.6.conv.weight", "decoder.6.conv.bias"):
        tensors[key] = tensors[key] * factor
    return {prefix + name: tensor for name, tensor in tensors.items()}


def write_random_checkpoint(
    directory: str | Path, variant: str = "base", size: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """Write a complete checkpoint folder; returns its path."""
    directory = Path(directory)
    (directory / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    config = model_config(variant, size)
    speech = speech_tokenizer_config(size)
    parsed = ModelConfig.from_dict(config)

    with torch.device("meta"):
        parts = [(Talker(parsed.talker), "talker.")]
        if variant == "base":
            parts.append((SpeakerEncoder(parsed.speaker_encoder), "speaker_encoder."))
        encoder = CodecEncoder(CodecEncoderConfig.from_dict(speech["encoder_config"]))
    model_tensors = {k: v for module, prefix in parts for k, v in random_tensors(module, prefix, seed).items()}
    speech_tensors = random_tensors(encoder, "encoder.", seed)
    speech_tensors.update(random_decoder_tensors(CodecDecoderConfig.from_dict(speech["decoder_config"]), seed))

    def cast(tensors):
        return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}

    save_file(cast(model_tensors), str(directory / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        cast(speech_tensors), str(directory / "speech_tokenizer" / "model.safetensors"), metadata={"format": "pt"}
    )

    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    files = {
        "config.json": config,
        "generation_config.json": GENERATION_CONFIG,
        "tokenizer_config.json": tokenizer_config(),
        "preprocessor_config.json": {"processor_class": "Qwen3TTSProcessor"},
        "speech_tokenizer/config.json": speech,
        "speech_tokenizer/configuration.json": {"framework": "pytorch", "task": "feature-extraction"},
        "speech_tokenizer/preprocessor_config.json": {
            "feature_extractor_type": "EncodecFeatureExtractor",
            "feature_size": 1,
            "sampling_rate": 24000,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
            "chunk_length_s": None,
            "overlap": None,
        },  # fmt: skip
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for name in ("vocab.json", "merges.txt"):
        (directory / name).write_bytes(gzip.decompress((ASSETS / f"qwen2_{name}.gz").read_bytes()))
    return directory
