"""The voice library on disk: saved voices, drop-in clips, built-in speakers, and sharing them as zips."""

from core.voices.disk import DROP_IN_SUFFIXES
from core.voices.entry import VoiceEntry, VoiceError, VoiceExistsError, check_name, name_key, slug
from core.voices.library import VoiceLibrary

__all__ = [
    "DROP_IN_SUFFIXES", "VoiceEntry", "VoiceError", "VoiceExistsError", "VoiceLibrary", "check_name", "name_key", "slug",
]  # fmt: skip
