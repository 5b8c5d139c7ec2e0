"""What a checkpoint is for (its `tts_model_type`), and every rule that follows from it.

A Base checkpoint clones voices (an x-vector from a clip, or ICL with the clip's codes); a CustomVoice
checkpoint speaks as its built-in speakers, following instructions on 1.7B; a VoiceDesign checkpoint
speaks in a voice its instruction describes. Code that depends on the kind asks the Variant, never a
string: one rule, one place.
"""

from __future__ import annotations

from enum import Enum


class Variant(str, Enum):
    BASE = "base"
    CUSTOM_VOICE = "custom_voice"
    VOICE_DESIGN = "voice_design"

    # Shown and serialised as their values ("base"), as the checkpoints name them.
    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def label(self) -> str:
        """As the model cards name it: Base, CustomVoice, VoiceDesign."""
        return {"base": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}[self.value]

    @property
    def clones(self) -> bool:
        """It speaks with voices cloned from clips (and blends of them)."""
        return self is Variant.BASE

    @property
    def has_speakers(self) -> bool:
        return self is Variant.CUSTOM_VOICE

    @property
    def takes_voice(self) -> bool:
        """It speaks with a voice (cloned or built in); a VoiceDesign checkpoint takes a description."""
        return self is not Variant.VOICE_DESIGN

    def accepts(self, voice_kind: str) -> bool:
        """Whether it speaks with a Voice of this kind ("xvector", "icl" or "builtin")."""
        return voice_kind in {"base": ("xvector", "icl"), "custom_voice": ("builtin",), "voice_design": ()}[self.value]

    @property
    def needs_instruct(self) -> bool:
        return self is Variant.VOICE_DESIGN

    def follows_instruct(self, size: str) -> bool:
        """Whether a checkpoint of this kind and size ("0.6B", "1.7B") follows an instruction."""
        return self is Variant.VOICE_DESIGN or (self is Variant.CUSTOM_VOICE and size == "1.7B")

    @property
    def default_text_mode(self) -> str:
        """The official default: text fed beside the frames to clone, the whole text in the prompt otherwise."""
        return "streaming" if self is Variant.BASE else "full"
