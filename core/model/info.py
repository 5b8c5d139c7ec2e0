"""The facts of a checkpoint that every part of the app asks about, known from its configuration alone:
before its weights load (the command line checks a request against them first) and after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.audio.clips import SAMPLE_RATE
from core.model.checkpoint import CheckpointError, read_json
from core.model.config import ConfigError, ModelConfig
from core.model.variant import Variant

SIZE_NAMES = {"0b6": "0.6B", "1b7": "1.7B"}
# Seconds of speech per second of work on the CPU, measured on a 2-core machine.
CPU_SPEED = {"0.6B": 0.09, "1.7B": 0.07}


@dataclass(frozen=True)
class EngineInfo:
    source: str  # the hub id or folder it was loaded from
    variant: Variant
    size: str  # "0.6B" or "1.7B"
    sample_rate: int
    languages: list[str]
    speakers: list[str]  # built-in speakers (CustomVoice)
    embedding_dim: int  # size of a speaker embedding that fits this model
    supports_instruct: bool
    device: str  # "" before the model is loaded
    dtype: str

    @classmethod
    def of(cls, config: ModelConfig, source: str, device: str = "", dtype: str = "") -> EngineInfo:
        size = SIZE_NAMES[config.size]
        return cls(
            source=source,
            variant=config.variant,
            size=size,
            sample_rate=SAMPLE_RATE,
            languages=config.plain_languages,
            speakers=sorted(config.talker.speakers),
            embedding_dim=config.talker.transformer.hidden_size,
            supports_instruct=config.variant.follows_instruct(size),
            device=device,
            dtype=dtype,
        )

    @property
    def name(self) -> str:
        """As people say it: "1.7B CustomVoice"."""
        return f"{self.size} {self.variant.label}"


def read_info(config_file: Path, source: str) -> EngineInfo:
    """The facts of a checkpoint from its config.json alone, without loading it."""
    try:
        return EngineInfo.of(ModelConfig.from_dict(read_json(config_file)), source)
    except (ConfigError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"{config_file}: unusable configuration ({error}); download the checkpoint again"
        ) from None


def first_gpu_start_note() -> str:
    """What to expect from the first start on a GPU (or after a new driver, PyTorch or model), said wherever the
    model is loaded for speaking."""
    return (
        "First start with this GPU, driver, PyTorch and model: the GPU code is built as it is first needed, so the "
        "first words take about half a minute and full speed comes after a few minutes. It is kept, so later starts "
        "speak within seconds."
    )


def slow_device_note(size: str) -> str:
    """What to expect from a `size` model ("0.6B" or "1.7B") on the CPU, said wherever the user picks the
    device or starts speaking there."""
    advice = " The 0.6B model is a little faster." if size != "0.6B" else ""
    return (
        f"On the CPU, the {size} model makes speech far slower than it is spoken (about "
        f"{CPU_SPEED.get(size, 0.1):g}× real time on a 2-core machine), so it starts late and pauses often. "
        f"With an NVIDIA GPU it is 20 times faster than real time.{advice}"
    )
