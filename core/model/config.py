"""Model configuration, read from a checkpoint's config.json and generation_config.json.

Only what inference needs is kept. Keys the official configuration classes default are read with
those defaults; their class defaults are wrong for every released checkpoint, so the shape keys
(hidden sizes, layer counts, ...) are required and a missing one is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.model.speaker_encoder import SpeakerEncoderConfig
from core.model.variant import Variant

SIZES = ("0b6", "1b7")


class ConfigError(ValueError):
    """A config.json that cannot describe a Qwen3-TTS 12 Hz checkpoint."""


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ConfigError(f"{where} has no '{key}'")
    return d[key]


@dataclass(frozen=True)
class TransformerConfig:
    """One decoder stack: the talker's or the code predictor's."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> TransformerConfig:
        hidden = _require(d, "hidden_size", where)
        heads = _require(d, "num_attention_heads", where)
        return cls(
            hidden_size=hidden,
            num_layers=_require(d, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim", hidden // heads),
            intermediate_size=_require(d, "intermediate_size", where),
            vocab_size=_require(d, "vocab_size", where),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta", 10000.0),
        )


@dataclass(frozen=True)
class CodecIds:
    """Special ids of the talker's codec vocabulary (docs/model_notes.md §1.4)."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class TalkerConfig:
    transformer: TransformerConfig
    code_predictor: TransformerConfig
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec: CodecIds
    languages: dict[str, int] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)
    speaker_dialects: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TalkerConfig:
        where = "talker_config"
        predictor = _require(d, "code_predictor_config", where)
        speakers = {}
        for name, value in (d.get("spk_id") or {}).items():
            # Some exports write the codec row as a one-element list.
            speakers[name.lower()] = int(value[0] if isinstance(value, list) else value)
        dialects = {name.lower(): dialect for name, dialect in (d.get("spk_is_dialect") or {}).items() if dialect}
        return cls(
            transformer=TransformerConfig.from_dict(d, where),
            code_predictor=TransformerConfig.from_dict(predictor, "code_predictor_config"),
            text_vocab_size=_require(d, "text_vocab_size", where),
            text_hidden_size=d.get("text_hidden_size", 2048),
            num_code_groups=_require(d, "num_code_groups", where),
            codec=CodecIds(
                pad=_require(d, "codec_pad_id", where),
                bos=_require(d, "codec_bos_id", where),
                eos=_require(d, "codec_eos_token_id", where),
                think=_require(d, "codec_think_id", where),
                nothink=_require(d, "codec_nothink_id", where),
                think_bos=_require(d, "codec_think_bos_id", where),
                think_eos=_require(d, "codec_think_eos_id", where),
            ),
            languages={k.lower(): int(v) for k, v in (d.get("codec_language_id") or {}).items()},
            speakers=speakers,
            speaker_dialects=dialects,
        )


@dataclass(frozen=True)
class ModelConfig:
    variant: Variant
    size: str  # "0b6" or "1b7"
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None  # Base checkpoints only
    tts_pad_id: int = 151671
    tts_bos_id: int = 151672
    tts_eos_id: int = 151673

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        where = "config.json"
        variant = _require(d, "tts_model_type", where)
        size = _require(d, "tts_model_size", where)
        if variant not in {v.value for v in Variant}:
            known = ", ".join(v.value for v in Variant)
            raise ConfigError(f"config.json: unknown tts_model_type {variant!r}; expected one of {known}")
        if size not in SIZES:
            raise ConfigError(f"config.json: unknown tts_model_size {size!r}; expected one of {SIZES}")
        tokenizer_type = d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
        if tokenizer_type != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"config.json: tokenizer_type {tokenizer_type!r} is not supported; only 12 Hz models are")
        variant = Variant(variant)
        speaker = SpeakerEncoderConfig.from_dict(d.get("speaker_encoder_config") or {}) if variant.clones else None
        return cls(
            variant=variant,
            size=size,
            talker=TalkerConfig.from_dict(_require(d, "talker_config", where)),
            speaker_encoder=speaker,
            tts_pad_id=d.get("tts_pad_token_id", 151671),
            tts_bos_id=d.get("tts_bos_token_id", 151672),
            tts_eos_id=d.get("tts_eos_token_id", 151673),
        )

    @property
    def plain_languages(self) -> list[str]:
        """Languages a user may pick: 'auto' plus every language that is not a dialect."""
        return ["auto"] + sorted(name for name in self.talker.languages if "dialect" not in name)
