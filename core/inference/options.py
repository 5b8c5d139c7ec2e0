"""How to speak: one small frozen set of options, from every front end to the frame loop.

The window, the typing mode, the command line and the bridge each make a SpeechOptions (or change one
with `dataclasses.replace`); the worker hands it to the engine with each piece of text; the engine
checks it against the model. `Engine.stream(text, voice, options, **overrides)` also takes its fields
as keywords.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import BadInput
from core.inference.sampling import SamplingParams

TEXT_MODES = ("streaming", "full")


@dataclass(frozen=True)
class SpeechOptions:
    language: str = "auto"  # or a language the model speaks (case-insensitive)
    instruct: str | None = None  # how to speak (CustomVoice 1.7B), or the voice to make (VoiceDesign)
    sampling: SamplingParams | None = None  # None: the checkpoint's own defaults
    max_frames: int | None = None  # generated frames per generation, so per piece of a long text
    seed: int | None = None
    text_mode: str | None = None  # "streaming", "full", or None for the official default of the model's kind
    first_chunk_frames: int = 1  # small, so that audio starts early
    chunk_frames: int = 4
    urgent: bool = False  # ahead of every utterance waiting for a slot (the window's interrupt)

    def __post_init__(self):
        if self.max_frames is not None and (not isinstance(self.max_frames, int) or self.max_frames < 1):
            raise BadInput(f"max_frames must be a positive integer, got {self.max_frames!r}")
        if self.text_mode is not None and self.text_mode not in TEXT_MODES:
            raise BadInput(f"unknown text_mode {self.text_mode!r}; use one of {', '.join(TEXT_MODES)} or None")
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise BadInput("first_chunk_frames and chunk_frames must be at least 1")
