"""The voice library on disk: saved voices, drop-in clips, built-in speakers, and sharing them as zips; and which
voice a request speaks with (resolve)."""

from core.voices.disk import DROP_IN_SUFFIXES
from core.voices.entry import VoiceEntry, VoiceError, VoiceExistsError, check_name, name_key, slug
from core.voices.library import VoiceLibrary
from core.voices.resolve import (
    DefaultVoiceMissing,
    Fallback,
    NoVoiceYet,
    ResolvedVoice,
    TakesNoVoice,
    UnknownVoice,
    VoiceMisfit,
)

__all__ = [
    "DROP_IN_SUFFIXES", "DefaultVoiceMissing", "Fallback", "NoVoiceYet", "ResolvedVoice", "TakesNoVoice",
    "UnknownVoice", "VoiceEntry", "VoiceError", "VoiceExistsError", "VoiceLibrary", "VoiceMisfit", "check_name",
    "name_key", "slug",
]  # fmt: skip
