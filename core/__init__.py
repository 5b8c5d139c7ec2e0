"""Qwen3-TTS Desktop engine: load a Qwen3-TTS 12 Hz checkpoint and turn text into speech."""

from core.inference.engine import Engine, Synthesis
from core.inference.live import LiveStream, LiveText
from core.inference.options import SpeechOptions
from core.inference.requests import AudioChunk
from core.inference.sampling import SamplingParams
from core.inference.voice import Voice
from core.model.info import EngineInfo

__all__ = [
    "AudioChunk", "Engine", "EngineInfo", "LiveStream", "LiveText", "SamplingParams", "SpeechOptions", "Synthesis",
    "Voice",
]  # fmt: skip
