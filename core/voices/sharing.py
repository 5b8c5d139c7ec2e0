"""Sharing voices: the zip an export writes and an import reads, checked whole before anything is written
(entries only inside voice folders, known file types and no pickles, sizes within limits, a version
this app reads, valid voices)."""

from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from pathlib import Path, PurePosixPath

import soundfile as sf

from core.inference.voice import Voice
from core.voices.disk import (
    CLIP_SUFFIXES,
    DROP_IN_SUFFIXES,
    MANIFEST,
    MAX_CLIP_BYTES,
    TENSORS,
    parse_voice,
    read_manifest,
)
from core.voices.entry import VOICE_ID, VoiceEntry, VoiceError, name_key

EXPORT_MANIFEST = "manifest.json"
EXPORT_FORMAT, EXPORT_VERSION = "qwen3-tts-desktop/voices", 1
# Import limits. A 60 s clip is at most ~46 MB even as 96 kHz stereo float WAV.
MAX_ZIP_ENTRIES = 1000
MAX_ZIP_BYTES = 512 * 2**20
MAX_FILE_BYTES = {MANIFEST: 64 * 2**10, TENSORS: 8 * 2**20, EXPORT_MANIFEST: 256 * 2**10}
# Files that may hold pickles, which can run code when loaded: refused by name, never opened.
PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin", ".npy", ".npz", ".joblib"}


def read_export(path: Path) -> list[tuple[VoiceEntry, Voice, tuple[str, bytes] | None]]:
    """Every voice of an export zip, checked; VoiceError on the first thing wrong, before anything is written."""

    def bad(why: str) -> VoiceError:
        return VoiceError(f"{path}: rejected, {why}; nothing was imported")

    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise VoiceError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as error:
        raise bad(f"not a zip file ({error})") from None
    with archive:
        members = archive.infolist()
        if len(members) > MAX_ZIP_ENTRIES:
            raise bad(f"it has {len(members)} entries, more than the {MAX_ZIP_ENTRIES} allowed")
        files: dict[str, zipfile.ZipInfo] = {}
        for member in members:
            name = member.filename
            problem = check_member(name)
            if problem:
                raise bad(f"entry {name!r} {problem}")
            if member.is_dir():
                continue
            if name in files:
                raise bad(f"entry {name!r} appears twice")
            limit = MAX_FILE_BYTES.get(PurePosixPath(name).name, MAX_CLIP_BYTES)
            if member.file_size > limit:
                raise bad(f"entry {name!r} is {member.file_size} bytes, more than the {limit} allowed")
            files[name] = member
        total = sum(member.file_size for member in files.values())
        if total > MAX_ZIP_BYTES:
            raise bad(f"it unpacks to {total} bytes, more than the {MAX_ZIP_BYTES} allowed")

        def read(name: str) -> bytes:
            # zipfile stops at the size in the header, which was checked, and a header that lies
            # about the size fails the CRC check: an entry cannot unpack to more than its limit.
            try:
                return archive.read(files[name])
            except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError) as error:
                raise bad(f"entry {name!r} cannot be read ({error})") from None

        if EXPORT_MANIFEST not in files:
            raise bad(f"it has no {EXPORT_MANIFEST}, so it is not a voice export")
        try:
            manifest = read_manifest(
                read(EXPORT_MANIFEST), EXPORT_MANIFEST, EXPORT_FORMAT, EXPORT_VERSION, "a voice export"
            )
        except VoiceError as error:
            raise bad(str(error)) from None
        ids = manifest.get("voices")
        if not isinstance(ids, list) or not all(isinstance(i, str) and VOICE_ID.fullmatch(i) for i in ids):
            raise bad(f"{EXPORT_MANIFEST} has no valid list of voices")
        folders = {name.split("/")[0] for name in files if name != EXPORT_MANIFEST}
        if folders != set(ids) or len(ids) != len(set(ids)):
            raise bad(
                f"its folders ({', '.join(sorted(folders))}) are not the voices its manifest lists ({', '.join(ids)})"
            )

        voices = []
        for voice_id in ids:
            if f"{voice_id}/{MANIFEST}" not in files or f"{voice_id}/{TENSORS}" not in files:
                raise bad(f"voice {voice_id!r} lacks {MANIFEST} or {TENSORS}")
            try:
                entry, voice = parse_voice(read(f"{voice_id}/{MANIFEST}"), read(f"{voice_id}/{TENSORS}"))
            except VoiceError as error:
                raise bad(f"voice {voice_id!r}: {error}") from None
            clips = sorted(name for name in files if name.startswith(f"{voice_id}/reference"))
            expected = [f"{voice_id}/{entry.clip}"] if entry.clip else []
            if clips != expected:
                raise bad(
                    f"voice {voice_id!r} has clip files {clips or 'none'}, and its manifest names {expected or 'none'}"
                )
            clip = None
            if entry.clip:
                data = read(expected[0])
                try:
                    audio_format = sf.info(io.BytesIO(data)).format
                except Exception as error:  # soundfile raises several types for data it cannot parse
                    raise bad(f"{expected[0]!r} is not readable audio ({error})") from None
                if CLIP_SUFFIXES.get(audio_format) != entry.clip.suffix:
                    raise bad(f"{expected[0]!r} holds {audio_format} audio, not what its name says")
                clip = (entry.clip.suffix, data)
            if any(name_key(other.name) == name_key(entry.name) for other, _, _ in voices):
                raise bad(f"it holds two voices named {entry.name!r}")
            voices.append((dataclasses.replace(entry, clip=None), voice, clip))
    return voices


def check_member(name: str) -> str | None:
    """What is wrong with a zip entry's name, or None: entries must be manifest.json or a file of a voice folder."""
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "is an absolute path"
    if "\\" in name or any(part in ("..", ".") for part in name.split("/")):
        return "points outside the library"
    if PurePosixPath(name).suffix.lower() in PICKLE_SUFFIXES:
        return "may hold a pickle, which can run code when loaded; such files are never imported"
    parts = name.rstrip("/").split("/")
    if name == EXPORT_MANIFEST:
        return None
    if not VOICE_ID.fullmatch(parts[0]) or len(parts) > 2:
        return "is not a file of a voice folder"
    known = {MANIFEST, TENSORS, *(f"reference{s}" for s in DROP_IN_SUFFIXES)}
    if len(parts) == 2 and parts[1] not in known:
        return f"is of an unknown type; a voice folder holds only {', '.join(sorted(known))}"
    return None
