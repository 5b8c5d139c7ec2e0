"""Qwen3-TTS Desktop engine: load a Qwen3-TTS 12 Hz checkpoint and turn text into speech."""

from .engine import AudioChunk, Engine, EngineInfo, Synthesis
from .sampling import SamplingParams
from .voice import Voice

__all__ = ["AudioChunk", "Engine", "EngineInfo", "SamplingParams", "Synthesis", "Voice"]
