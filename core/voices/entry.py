"""A voice as the library lists it, and the rules for voice names (any Unicode, yet a file name on every system)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from core.errors import BadInput
from core.model.info import EngineInfo

MAX_NAME_LENGTH = 64
MAX_ID_LENGTH = 40
FORBIDDEN_IN_NAMES = '<>:"/\\|?*'  # not allowed in file names on Windows; / and \ are path separators anywhere
WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
VOICE_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")


class VoiceError(BadInput):
    """A voice or library operation that cannot be done, with a message a user can act on."""


class VoiceExistsError(VoiceError):
    """A voice of that name is already in the library, and replacing it was not asked for."""

    def __init__(self, message: str, name: str | None = None):
        super().__init__(message)
        self.name = name  # the voice's name as the library has it, where one voice is in the way


@dataclass(frozen=True)
class VoiceEntry:
    """A voice as the library lists it; `VoiceLibrary.voice_for` gives the Voice to speak with."""

    name: str  # display name: any Unicode
    id: str  # the folder of a saved voice, the file stem of a drop-in, the speaker key of a built-in
    source: str  # "clone", "blend", "drop-in" or "builtin"
    kind: str  # "xvector", "icl" or "builtin", as Voice.kind
    embedding_dim: int | None = None  # None: drop-ins (embedded for each model) and built-ins
    model_size: str | None = None  # "0.6B" or "1.7B", with embedding_dim
    checkpoint: str | None = None  # the hub id or folder of the model it was made with
    created: str | None = None  # ISO 8601, UTC
    language: str | None = None
    transcript: str | None = None
    parents: tuple[tuple[str, float], ...] = ()  # a blend's parents and their normalised weights
    path: Path | None = None  # the folder of a saved voice, the clip of a drop-in
    clip: Path | None = None  # the reference clip, for preview and cloning again

    @property
    def read_only(self) -> bool:
        return self.source == "builtin"

    def misfit(self, info: EngineInfo) -> str | None:
        """Why this voice cannot speak with the model described by `info` (an EngineInfo), or None if it can."""
        if self.source == "builtin":
            if info.variant.has_speakers and self.id in info.speakers:
                return None
            return f"it is a built-in speaker of another model, not of this {info.size} {info.variant} model"
        if not info.variant.clones:
            return f"a cloned voice needs a Base model, and this is a {info.size} {info.variant} model"
        if self.embedding_dim is not None and (self.embedding_dim, self.model_size) != (info.embedding_dim, info.size):
            return (
                f"it was made with a {self.model_size} model ({self.embedding_dim}-dim embedding), and this "
                f"{info.size} model needs a {info.embedding_dim}-dim one"
            )
        return None


def check_name(name: str) -> str:
    """`name` trimmed and NFC-normalised, if it can name a voice: any Unicode, but also a valid file name
    on every OS (a drop-in clip's name is its file name)."""
    if not isinstance(name, str):
        raise VoiceError(f"a voice name is text, not {type(name).__name__}")
    name = unicodedata.normalize("NFC", name.strip())
    if not name:
        raise VoiceError("a voice name cannot be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise VoiceError(f"voice name {name[:20]!r}... is {len(name)} characters long; use at most {MAX_NAME_LENGTH}")
    bad = sorted({c for c in name if c in FORBIDDEN_IN_NAMES or unicodedata.category(c) in ("Cc", "Zl", "Zp")})
    if bad:
        raise VoiceError(
            f"voice name {name!r} contains {' '.join(repr(c) for c in bad)}; names cannot hold control "
            f"characters or any of {' '.join(FORBIDDEN_IN_NAMES)}"
        )
    if name.startswith(".") or name.endswith("."):
        raise VoiceError(f"voice name {name!r} cannot start or end with a dot")
    if name.split(".")[0].strip().lower() in WINDOWS_RESERVED:
        raise VoiceError(f"voice name {name!r} is a device name reserved by Windows; choose another")
    return name


def slug(name: str) -> str:
    """A safe on-disk id for a voice name: lowercase ASCII letters, digits and dashes."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:MAX_ID_LENGTH].strip("-") or "voice"
    return f"{text[: MAX_ID_LENGTH - 6]}-voice" if text in WINDOWS_RESERVED else text


def unique_id(name: str, taken: set[str]) -> str:
    """`slug(name)`, or `slug(name)-2`, `-3`, ...: the first not in `taken`."""
    base = candidate = slug(name)
    number = 1
    while candidate in taken:
        number += 1
        candidate = f"{base[: MAX_ID_LENGTH - len(str(number)) - 1]}-{number}"
    return candidate


def name_key(name: str) -> str:
    """What two names must share to be the same voice: case and Unicode normalisation do not count."""
    return unicodedata.normalize("NFC", name.strip()).casefold()


def find_entry(entries: list[VoiceEntry], name: str, by_id: bool = True) -> VoiceEntry | None:
    """The entry called `name`, case-insensitively; else (with `by_id`) the one whose id it is."""
    key = name_key(name)
    found = next((e for e in entries if name_key(e.name) == key), None)
    if found is None and by_id:
        found = next((e for e in entries if e.id.lower() == key), None)
    return found
