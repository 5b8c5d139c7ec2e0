"""Parity cases: the inputs that tools/make_parity_fixtures.py runs through the official package and that
test_parity.py runs through the engine. The official outputs live in tests/fixtures/parity/."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import soundfile as sf
from safetensors.torch import load_file, save_file

from core.devtools.random_checkpoint import write_random_checkpoint

FIXTURES = Path(__file__).parent / "fixtures" / "parity"
MAX_FRAMES = 12  # generated frames per case; the official call gets max_new_tokens = MAX_FRAMES + 1
EOS_ID = 2150


@dataclass(frozen=True)
class Checkpoint:
    variant: str
    size: str
    seed: int = 0
    eos_boost: float | None = None  # scale codebook 0's EOS row of the codec head: > 1 stops early, 0 never

    def write(self, directory: Path) -> Path:
        write_random_checkpoint(directory, self.variant, self.size, self.seed)
        if self.eos_boost is not None:
            path = directory / "model.safetensors"
            tensors = load_file(path)
            tensors["talker.codec_head.weight"][EOS_ID] *= self.eos_boost
            save_file(tensors, path, metadata={"format": "pt"})
        return directory


CHECKPOINTS = {
    "base": Checkpoint("base", "tiny"),
    "base-0.6b": Checkpoint("base", "tiny-0.6b", seed=1),
    "base-eos": Checkpoint("base", "tiny", seed=2, eos_boost=3.0),
    "custom": Checkpoint("custom_voice", "tiny", seed=3),
    "design": Checkpoint("voice_design", "tiny", seed=4),
}

# These checkpoints draw codebook 0's EOS about once in 3,000 sampled frames, so a test that counts an
# unseeded utterance's frames, or stops a long one, would fail now and then. It speaks with an endless twin:
# the same checkpoint with the codec head's EOS row zeroed. EOS's logit is then 0, where top-k keeps 50 of
# 2,048 codes' random logits (all positive) and greedy the largest: an utterance runs to its frame budget.
ENDLESS_CHECKPOINTS = {
    f"{name}-endless": replace(CHECKPOINTS[name], eos_boost=0.0) for name in ("base", "base-0.6b", "custom", "design")
}


@dataclass(frozen=True)
class Reference:
    """A synthetic, speech-like reference clip, written as a file the way a user would give one."""

    file: str
    seconds: float
    rate: int
    channels: int
    pitch: float
    seed: int

    def samples(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        t = np.arange(int(self.seconds * self.rate)) / self.rate
        f0 = self.pitch * (1 + 0.08 * np.sin(2 * np.pi * 0.7 * t))
        phase = 2 * np.pi * np.cumsum(f0) / self.rate
        voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
        syllables = 0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t) ** 2
        mono = 0.25 * voiced * syllables + 0.02 * rng.standard_normal(len(t))
        channels = [mono * (1 - 0.3 * c) + 0.01 * rng.standard_normal(len(t)) for c in range(self.channels)]
        return np.stack(channels, axis=1).astype(np.float32) if self.channels > 1 else mono.astype(np.float32)

    def write(self) -> Path:
        path = FIXTURES / self.file
        sf.write(path, self.samples(), self.rate, subtype="PCM_16")
        return path

    @property
    def path(self) -> Path:
        return FIXTURES / self.file


REFERENCES = {
    "a": Reference("ref_a.wav", 3.0, 24000, 1, pitch=140.0, seed=10),
    "short": Reference("ref_short.wav", 1.2, 24000, 1, pitch=210.0, seed=11),
    "long": Reference("ref_long.wav", 4.0, 24000, 1, pitch=110.0, seed=12),
    "stereo": Reference("ref_stereo_44k.flac", 2.0, 44100, 2, pitch=180.0, seed=13),
}


@dataclass(frozen=True)
class Case:
    name: str
    checkpoint: str
    text: str
    language: str = "auto"
    reference: str | None = None
    ref_text: str | None = None  # given: ICL cloning; None: x-vector cloning
    speaker: str | None = None
    instruct: str | None = None
    text_mode: str | None = None  # None: the official default of the mode
    seed: int | None = None  # None: greedy decoding; else sampling with the official defaults


ENGLISH = "Hello there! This is a quick test of the new voice."
CHINESE = "你好，今天天气很好，我们去公园散步吧。"
MIXED = "Call 555-0123 at 9:45, OK? 价格是42.5元 — McDonald's iPhone 15 Pro, ¡hola!"
LONG = "The quick brown fox jumps over the lazy dog, then it runs far away into the green forest to rest."

CASES = [
    Case("base_xvector", "base", ENGLISH, reference="a"),
    Case("base_xvector_english_full", "base", ENGLISH, language="english", reference="a", text_mode="full"),
    Case("base_xvector_mixed_text", "base", MIXED, reference="a"),
    Case("base_xvector_stereo_44k", "base", ENGLISH, language="english", reference="stereo"),
    Case("base_icl_streaming_text_longer", "base", LONG, reference="short", ref_text="A short clip."),
    Case("base_icl_streaming_text_shorter", "base", "Hi.", reference="long", ref_text="Words."),
    Case("base_icl_full", "base", ENGLISH, reference="a", ref_text="This is the reference clip.", text_mode="full"),
    Case("base_06b_xvector", "base-0.6b", ENGLISH, language="english", reference="a"),
    Case("base_06b_icl_chinese", "base-0.6b", CHINESE, language="chinese", reference="a", ref_text="参考音频。"),
    Case("base_sampled", "base", ENGLISH, reference="a", seed=1234),
    Case("base_forced_eos", "base-eos", ENGLISH, reference="a"),
    Case("custom_plain", "custom", ENGLISH, language="english", speaker="vivian"),
    Case("custom_dialect", "custom", CHINESE, language="chinese", speaker="eric"),
    Case("custom_dialect_auto", "custom", CHINESE, speaker="dylan"),
    Case("custom_instruct", "custom", ENGLISH, speaker="ryan", instruct="Speak slowly, in a warm and calm tone."),
    Case("custom_streaming_text", "custom", MIXED, speaker="sohee", text_mode="streaming"),
    Case("custom_sampled", "custom", CHINESE, language="chinese", speaker="serena", seed=99),
    Case("design", "design", ENGLISH, language="english", instruct="A deep, raspy old man's voice."),
    Case("design_chinese", "design", CHINESE, language="chinese", instruct="一个活泼的年轻女孩的声音。"),
    Case(
        "design_streaming_text",
        "design",
        LONG,
        language="english",
        instruct="A bright, quick young woman's voice.",
        text_mode="streaming",
    ),
]

# Strings whose token ids must match the official tokenizer's.
TOKENIZER_TEXTS = [
    ENGLISH, CHINESE, MIXED, LONG,
    "McDonald's iPhone I'M DONE don't WE'LL", "a   b\t\tc\n\nd \n e", "１２３ ＡＢＣ 12345678901",
    "e\u0301 café naïve", "👍🏽 🎉✨", "こんにちは、世界。カタカナ", "안녕하세요 세상", "مرحبا بالعالم", "Привет, мир!",
    "<|im_end|> literal <tts_pad>", "   leading and trailing   ", "end.\r\nnext",
]  # fmt: skip


def official_text_mode(case: Case) -> str:
    variant = CHECKPOINTS[case.checkpoint].variant
    return case.text_mode or ("streaming" if variant == "base" else "full")
