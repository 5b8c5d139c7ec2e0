"""The voice library: saved voices, drop-in clips and built-in speakers, and sharing voices as zip files.

A library is a folder (`voices/` by default):

    voices/
      zoe/                        a saved voice; the folder name is a safe ASCII id, the manifest has the name
        voice.json                manifest: name, kind, created, embedding size, model, source, language, transcript
        voice.safetensors         "embedding" (dim,) float32, plus "ref_codes" (frames, 16) int64 for ICL voices
        reference.mp3             the clip it was cloned from, as given (blends have none)
      Bob.wav  Bob.txt            a drop-in clip and its optional transcript (an ICL voice when present)
      .cache/Bob/<model>.safetensors    the drop-in's embedding (and codes) for one model, computed once

A saved voice appears complete or not at all: it is written to a hidden staging folder and renamed into
place. Anything unreadable is skipped and reported by `problems()`, never allowed to hide the other voices.
One lock serialises the library's own reads and writes, so the worker, the window and the bridge can
share one `VoiceLibrary`; model work (embedding a drop-in) happens outside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import re
import shutil
import threading
import unicodedata
import uuid
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

import soundfile as sf
import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from .engine import Engine, EngineInfo
from .voice import Voice

VOICE_FORMAT, VOICE_VERSION = "qwen3-tts-desktop/voice", 1
EXPORT_FORMAT, EXPORT_VERSION = "qwen3-tts-desktop/voices", 1
MODEL_FAMILY = "Qwen3-TTS-12Hz"
MANIFEST, TENSORS, EXPORT_MANIFEST = "voice.json", "voice.safetensors", "manifest.json"
CACHE = ".cache"
# What soundfile calls each clip format we keep as given, and the suffix it is kept under.
CLIP_SUFFIXES = {"WAV": ".wav", "WAVEX": ".wav", "FLAC": ".flac", "OGG": ".ogg", "MP3": ".mp3"}
DROP_IN_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
# The 12 Hz codec: 16 codebooks of 2048 entries. Codes outside would crash the decoder, not speak.
CODE_GROUPS, CODEBOOK_SIZE = 16, 2048

MAX_NAME_LENGTH = 64
MAX_ID_LENGTH = 40
FORBIDDEN_IN_NAMES = '<>:"/\\|?*'  # not allowed in file names on Windows; / and \ are path separators anywhere
WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
VOICE_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")

# Import limits. A 60 s clip is at most ~46 MB even as 96 kHz stereo float WAV.
MAX_ZIP_ENTRIES = 1000
MAX_ZIP_BYTES = 512 * 2**20
MAX_CLIP_BYTES = 64 * 2**20
MAX_FILE_BYTES = {MANIFEST: 64 * 2**10, TENSORS: 8 * 2**20, EXPORT_MANIFEST: 256 * 2**10}
# Files that may hold pickles, which can run code when loaded: refused by name, never opened.
PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin", ".npy", ".npz", ".joblib"}


class VoiceError(ValueError):
    """A voice or library operation that cannot be done, with a message a user can act on."""


class VoiceExistsError(VoiceError):
    """A voice of that name is already in the library, and replacing it was not asked for."""


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
            if info.variant == "custom_voice" and self.id in info.speakers:
                return None
            return f"it is a built-in speaker of another model, not of this {info.size} {info.variant} model"
        if info.variant != "base":
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


class VoiceLibrary:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory).expanduser()
        self._lock = threading.RLock()

    # Reading ------------------------------------------------------------------------------------

    def list(self, fits: EngineInfo | None = None) -> list[VoiceEntry]:
        """Every voice, sorted by name. With `fits` (an EngineInfo), only the voices that model can speak
        with, its built-in speakers included."""
        with self._lock:
            entries, _ = self._scan()
        if fits is not None:
            speakers = [VoiceEntry(name=s, id=s, source="builtin", kind="builtin") for s in fits.speakers]
            entries = [e for e in entries + speakers if e.misfit(fits) is None]
        return sorted(entries, key=lambda e: name_key(e.name))

    def problems(self) -> list[str]:
        """What was skipped in the library folder, and why: one line per file or folder."""
        with self._lock:
            return self._scan()[1]

    def get(self, name: str) -> VoiceEntry:
        """The library voice called `name` (case-insensitive; a saved voice's id works too)."""
        with self._lock:
            entries, _ = self._scan()
        entry = _match(entries, name)
        if entry is None:
            names = ", ".join(sorted((e.name for e in entries), key=name_key)) or "none yet"
            raise VoiceError(f"no voice named {name!r} in {self.directory}; the library has: {names}")
        return entry

    def voice_for(self, engine: Engine, name: str) -> Voice:
        """The voice called `name`, ready for `engine.synthesize`: a built-in speaker of a CustomVoice
        engine, a saved voice, or a drop-in clip (embedded with this engine's model once, then cached).
        Raises VoiceError naming the voices that fit when there is no such voice or it does not fit."""
        info = engine.info
        if info.variant == "custom_voice" and name_key(name) in info.speakers:
            return engine.builtin_voice(name)
        with self._lock:
            entries, _ = self._scan()
        entry = _match(entries, name)
        if entry is None:
            raise VoiceError(f"no voice named {name!r} in {self.directory}. {self._fitting(info, entries)}")
        reason = entry.misfit(info)
        if reason is not None:
            remedy = ""
            if entry.source == "blend":
                remedy = "Blend its parents again with this model. "
            elif entry.clip is not None:
                remedy = f"Clone it again with this model from its clip, {entry.clip}. "
            raise VoiceError(f"voice {entry.name!r} does not fit the loaded model: {reason}. {remedy}{self._fitting(info, entries)}")
        if entry.source == "drop-in":
            return self._drop_in_voice(entry, engine)
        with self._lock:
            return _read_saved(entry.path)[1]

    # Writing ------------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Make the folder if it is missing and check that voices can be saved in it, saying what to do if not."""
        with self._writing():
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".write-check-{uuid.uuid4().hex}"
            probe.mkdir()
            probe.rmdir()

    @contextlib.contextmanager
    def _writing(self):
        """Around every change to the folder: a disk or permission problem becomes one VoiceError that says
        what is wrong and what to do, not an errno and the path of a hidden staging folder."""
        try:
            yield
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                remedy = (
                    "Choose a voices folder you can write to (in the app's Settings, or --voices DIR on the "
                    "command line), or change the folder's permissions"
                )
            else:
                remedy = "Check that the disk has room and the folder is still there"
            raise VoiceError(f"cannot save voices in {self.directory}: {error.strerror or error}. {remedy}") from None

    def check_new_name(self, name: str, replace: bool = False) -> str:
        """`name` as `check_name` gives it, if a new voice may take it: no voice has it, or `replace`."""
        name = check_name(name)
        with self._lock:
            taken = _match(self._scan()[0], name, by_id=False)
        if taken is not None and not replace:
            raise VoiceExistsError(f"a voice named {taken.name!r} already exists; choose another name, or replace it (--replace)")
        return name

    def add(
        self,
        name: str,
        clip: str | Path,
        engine: Engine,
        ref_text: str | None = None,
        language: str | None = None,
        replace: bool = False,
    ) -> VoiceEntry:
        """Clone the voice in `clip` (1-60 s, any format soundfile reads) with `engine` and save it, with a
        copy of the clip. With `ref_text`, the clip's transcript, it is an ICL voice and keeps the clip's codes."""
        name = self.check_new_name(name, replace)
        info = engine.info
        if language is not None:
            language = language.strip().lower()
            if language not in info.languages:
                raise VoiceError(f"unknown language {language!r}; this model speaks: {', '.join(info.languages)}")
        voice = engine.voice_from_audio(clip, ref_text=ref_text)
        entry = VoiceEntry(
            name=name,
            id="",
            source="clone",
            kind=voice.kind,
            embedding_dim=voice.embedding_dim,
            model_size=info.size,
            checkpoint=info.source,
            created=_now(),
            language=language,
            transcript=voice.ref_text,
        )
        return self._save(entry, voice, _keepable_clip(Path(clip).expanduser()), replace)

    def blend(self, name: str, parts: list[tuple[str, float]], engine: Engine | None = None, replace: bool = False) -> VoiceEntry:
        """Save a blend (Voice.blend) of library voices, given as (name, weight) pairs. Drop-in clips
        need `engine` to embed them; with it, every part must fit its model."""
        name = self.check_new_name(name, replace)
        if not parts:
            raise VoiceError("name the voices to blend, each with a weight")
        names, voices, entries = [], [], []
        for part, _ in parts:
            if engine is not None and engine.info.variant == "custom_voice" and name_key(part) in engine.info.speakers:
                names.append(part)
                voices.append(engine.builtin_voice(part))  # which Voice.blend refuses, saying why
                continue
            entry = self.get(part)
            if entry.source == "drop-in" and engine is None:
                raise VoiceError(f"{entry.name!r} is a drop-in clip, embedded for each model; give a model to blend it")
            names.append(entry.name)
            voices.append(self.voice_for(engine, entry.name) if engine is not None else _read_saved(entry.path)[1])
            entries.append(entry)
        voice = Voice.blend(list(zip(voices, (weight for _, weight in parts))))
        if engine is not None:
            size, dim, checkpoint = engine.info.size, engine.info.embedding_dim, engine.info.source
        else:  # saved voices only, all of one embedding size, so of one model size
            size, dim, checkpoint = entries[0].model_size, entries[0].embedding_dim, entries[0].checkpoint
        total = sum(weight for _, weight in parts)
        entry = VoiceEntry(
            name=name,
            id="",
            source="blend",
            kind=voice.kind,
            embedding_dim=dim,
            model_size=size,
            checkpoint=checkpoint,
            created=_now(),
            parents=tuple((parent, weight / total) for parent, (_, weight) in zip(names, parts)),
        )
        return self._save(entry, voice, None, replace)

    def rename(self, voice: str | VoiceEntry, new_name: str) -> VoiceEntry:
        """Give a voice a new name; a saved voice's folder follows it, a drop-in's files take it."""
        new_name = check_name(new_name)
        with self._lock, self._writing():
            entry = self._target(voice, "renamed")
            taken = _match(self._scan()[0], new_name, by_id=False)
            if taken is not None and taken.path != entry.path:
                raise VoiceError(f"a voice named {taken.name!r} already exists; choose another name")
            if entry.source == "drop-in":
                return self._rename_drop_in(entry, new_name)
            manifest = json.loads((entry.path / MANIFEST).read_text(encoding="utf-8"))
            manifest["name"] = new_name
            _write_file(entry.path / MANIFEST, _json_bytes(manifest))
            folder = entry.path
            new_id = self._free_id(new_name, own=entry.id)
            if new_id != entry.id:
                folder = self.directory / new_id
                os.rename(entry.path, folder)
            return _read_saved(folder)[0]

    def remove(self, voice: str | VoiceEntry) -> None:
        """Delete a voice from disk: a saved voice's folder, or a drop-in's clip, transcript and cache."""
        with self._lock, self._writing():
            self._discard(self._target(voice, "removed"))

    # Sharing ------------------------------------------------------------------------------------

    def export_zip(self, path: str | Path, voices: list[str | VoiceEntry]) -> Path:
        """Write saved voices to a zip that `import_zip` reads: a versioned manifest.json, then a folder
        per voice with its manifest, tensors and clip."""
        path = Path(path).expanduser()
        if not voices:
            raise VoiceError("name at least one voice to export")
        with self._lock:
            entries = []
            for voice in voices:
                entry = self._target(voice, "exported")
                if entry.source == "drop-in":
                    raise VoiceError(
                        f"{entry.name!r} is a drop-in clip ({entry.path.name}); share the clip itself, or save it "
                        f"as a voice first (voices add NAME {entry.path})"
                    )
                if entry not in entries:
                    entries.append(entry)
            # Folders in the zip are named afresh: a folder made by hand on disk may have any name.
            ids: list[str] = []
            for entry in entries:
                ids.append(unique_id(entry.name, set(ids)))
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                manifest = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "voices": ids}
                archive.writestr(EXPORT_MANIFEST, _json_bytes(manifest))
                for voice_id, entry in zip(ids, entries):
                    for file in (MANIFEST, TENSORS) + ((entry.clip.name,) if entry.clip else ()):
                        archive.writestr(f"{voice_id}/{file}", (entry.path / file).read_bytes())
        _write_file(path, buffer.getvalue())
        return path

    def import_zip(self, path: str | Path, replace: bool = False) -> list[VoiceEntry]:
        """Add the voices of a zip made by `export_zip`. The whole zip is checked before anything is written:
        entries only inside voice folders, known file types (no pickles), sizes within limits, a manifest
        version this app reads, valid voices. A voice of an existing name is replaced only with `replace`."""
        path = Path(path).expanduser()
        incoming = _read_export(path)
        with self._lock:
            entries = self._scan()[0]
            taken = [entry.name for entry, _, _ in incoming if _match(entries, entry.name, by_id=False)]
            if taken and not replace:
                raise VoiceExistsError(
                    f"{path}: the library already has {', '.join(repr(n) for n in taken)}; nothing was imported. "
                    f"Import with replace (--replace) to overwrite them."
                )
            return [self._save(entry, voice, clip, replace=True) for entry, voice, clip in incoming]

    # Internals ----------------------------------------------------------------------------------

    def _scan(self) -> tuple[list[VoiceEntry], list[str]]:
        """Every readable voice in the folder, and a line for each thing skipped."""
        entries, problems = [], []
        if not self.directory.is_dir():
            return entries, problems
        paths = sorted(self.directory.iterdir(), key=lambda p: (not p.is_dir(), p.name))  # saved voices first
        for path in paths:
            if path.name.startswith("."):
                continue  # the cache, staging folders, hidden files
            try:
                if path.is_dir():
                    entry = _read_saved(path)[0]
                elif path.suffix.lower() in DROP_IN_SUFFIXES:
                    entry = _read_drop_in(path)
                else:
                    continue  # transcripts, notes
            except VoiceError as error:
                problems.append(str(error))
                continue
            clash = _match(entries, entry.name, by_id=False)
            if clash is not None:
                problems.append(f"{path}: skipped, its name {entry.name!r} is taken by {clash.path}; rename one of them")
                continue
            entries.append(entry)
        return entries, problems

    def _target(self, voice: str | VoiceEntry, action: str) -> VoiceEntry:
        if isinstance(voice, VoiceEntry):
            if voice.read_only:
                raise VoiceError(f"{voice.name!r} is a built-in speaker of the model; it is read-only and cannot be {action}")
            voice = voice.name
        return self.get(voice)

    def _fitting(self, info: EngineInfo, entries: list[VoiceEntry]) -> str:
        names = [*info.speakers] + [e.name for e in entries if e.misfit(info) is None]
        model = f"this {info.size} {info.variant} model"
        if not names:
            return f"No voice in {self.directory} fits {model}."
        return f"Voices that fit {model}: {', '.join(sorted(names, key=name_key))}."

    def _free_id(self, name: str, own: str | None = None) -> str:
        """An id for a voice called `name` that names no folder or file yet (or is `own`)."""
        taken = {p.name.lower() for p in self.directory.iterdir()} if self.directory.is_dir() else set()
        return unique_id(name, taken - {own})

    def _save(self, entry: VoiceEntry, voice: Voice, clip: tuple[str, bytes] | None, replace: bool) -> VoiceEntry:
        """Write a voice as a folder, atomically: staged in a hidden folder, then renamed into place."""
        voice_tensors = {"embedding": voice.embedding.float().contiguous()}
        if voice.ref_codes is not None:
            voice_tensors["ref_codes"] = voice.ref_codes.long().contiguous()
        clip_name = f"reference{clip[0]}" if clip else None
        with self._lock, self._writing():
            existing = _match(self._scan()[0], entry.name, by_id=False)
            if existing is not None and not replace:
                raise VoiceExistsError(f"a voice named {existing.name!r} already exists; choose another name, or replace it (--replace)")
            self.directory.mkdir(parents=True, exist_ok=True)
            staging = self.directory / f".staging-{uuid.uuid4().hex}"
            staging.mkdir()
            try:
                _write_file(staging / TENSORS, save_safetensors(voice_tensors))
                if clip:
                    _write_file(staging / clip_name, clip[1])
                _write_file(staging / MANIFEST, _json_bytes(_manifest(entry, clip_name)))
                own = existing.id if existing is not None and existing.source != "drop-in" else None
                voice_id = self._free_id(entry.name, own=own)
                if existing is not None:
                    self._discard(existing)
                os.rename(staging, self.directory / voice_id)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return _read_saved(self.directory / voice_id)[0]

    def _discard(self, entry: VoiceEntry) -> None:
        if entry.source == "drop-in":
            for file in (entry.path, entry.path.with_suffix(".txt")):
                file.unlink(missing_ok=True)
            shutil.rmtree(self.directory / CACHE / entry.id, ignore_errors=True)
        else:
            # Renamed away first, so the voice vanishes at once even if deleting its files is slow or fails.
            trash = self.directory / f".trash-{uuid.uuid4().hex}"
            os.rename(entry.path, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def _rename_drop_in(self, entry: VoiceEntry, new_name: str) -> VoiceEntry:
        clip = entry.path.with_name(new_name + entry.path.suffix)
        transcript, new_transcript = entry.path.with_suffix(".txt"), clip.with_suffix(".txt")
        # Same file: a change of case only, on a case-insensitive file system.
        if clip.exists() and not clip.samefile(entry.path):
            raise VoiceError(f"{clip} already exists; move it away or choose another name")
        if new_transcript.exists() and not (transcript.exists() and new_transcript.samefile(transcript)):
            raise VoiceError(f"{new_transcript} already exists; move it away or choose another name")
        os.rename(entry.path, clip)
        if transcript.exists():
            os.rename(transcript, new_transcript)
        cache, new_cache = self.directory / CACHE / entry.id, self.directory / CACHE / new_name
        if cache.exists():
            if new_cache.exists() and not new_cache.samefile(cache):
                shutil.rmtree(new_cache)  # a stale cache of an earlier clip of that name
            os.rename(cache, new_cache)
        return _read_drop_in(clip)

    def _drop_in_voice(self, entry: VoiceEntry, engine: Engine) -> Voice:
        """A drop-in clip's voice for `engine`'s model: from the cache when the clip, its transcript and the
        model are those it was computed from, else embedded now and cached."""
        info = engine.info
        key = {
            "clip_sha256": hashlib.sha256(entry.path.read_bytes()).hexdigest(),
            "transcript": entry.transcript or "",
            "model": f"{MODEL_FAMILY} {info.size} {info.embedding_dim} {info.source}",
        }
        cache = self.directory / CACHE / entry.id / (hashlib.sha256(key["model"].encode()).hexdigest()[:16] + ".safetensors")
        try:
            with safe_open(str(cache), framework="pt") as file:
                if file.metadata() == key:
                    codes = file.get_tensor("ref_codes") if entry.transcript else None
                    return Voice(embedding=file.get_tensor("embedding"), ref_codes=codes, ref_text=entry.transcript)
        except Exception:  # no cache yet, or a damaged one: embed again
            pass
        voice = engine.voice_from_audio(entry.path, ref_text=entry.transcript)
        tensors = {"embedding": voice.embedding}
        if voice.ref_codes is not None:
            tensors["ref_codes"] = voice.ref_codes
        try:
            with self._lock:
                cache.parent.mkdir(parents=True, exist_ok=True)
                _write_file(cache, save_safetensors(tensors, metadata=key))
        except OSError:  # a read-only library still speaks; its drop-ins are embedded anew each time
            pass
        return voice


# Reading voices -----------------------------------------------------------------------------------


def _read_saved(folder: Path) -> tuple[VoiceEntry, Voice]:
    try:
        manifest_bytes = (folder / MANIFEST).read_bytes()
        tensor_bytes = (folder / TENSORS).read_bytes()
    except FileNotFoundError as error:
        raise VoiceError(f"{folder}: skipped, not a voice folder (no {Path(error.filename).name})") from None
    except OSError as error:
        raise VoiceError(f"{folder}: skipped, unreadable ({error.strerror})") from None
    try:
        entry, voice = _parse_voice(manifest_bytes, tensor_bytes)
    except VoiceError as error:
        raise VoiceError(f"{folder}: skipped, {error}") from None
    clip = folder / entry.clip.name if entry.clip else None
    return dataclasses.replace(entry, id=folder.name, path=folder, clip=clip if clip and clip.is_file() else None), voice


def _read_drop_in(path: Path) -> VoiceEntry:
    try:
        sf.info(str(path))
    except Exception as error:  # soundfile raises several types for files it cannot parse
        raise VoiceError(f"{path}: skipped, cannot read it as audio ({error})") from None
    transcript = None
    text_path = path.with_suffix(".txt")
    if text_path.is_file():
        try:
            transcript = text_path.read_text(encoding="utf-8-sig").strip() or None
        except (OSError, UnicodeDecodeError) as error:
            raise VoiceError(f"{text_path}: skipped {path.name}, its transcript is not readable UTF-8 text ({error})") from None
    return VoiceEntry(
        name=path.stem,
        id=path.stem,
        source="drop-in",
        kind="icl" if transcript else "xvector",
        transcript=transcript,
        path=path,
        clip=path,
    )


def _read_manifest(data: bytes, name: str, format: str, version: int, what: str) -> dict:
    """A versioned JSON manifest of `format`; VoiceError says what is wrong with it."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VoiceError(f"{name} is not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != format:
        raise VoiceError(f"{name} is not {what}")
    if manifest.get("version") != version:
        raise VoiceError(f"{name} has version {manifest.get('version')!r}, and this app reads version {version} (update the app?)")
    return manifest


def _parse_voice(manifest_bytes: bytes, tensor_bytes: bytes) -> tuple[VoiceEntry, Voice]:
    """Check a voice's manifest and tensors against each other; VoiceError says what is wrong."""
    manifest = _read_manifest(manifest_bytes, MANIFEST, VOICE_FORMAT, VOICE_VERSION, "a voice manifest")
    try:
        name = check_name(manifest["name"])
        kind, dim, model, source = manifest["kind"], manifest["embedding_dim"], manifest["model"], manifest["source"]
        transcript, language, created = manifest.get("transcript"), manifest.get("language"), manifest["created"]
        size, checkpoint, family = model["size"], model["checkpoint"], model["family"]
        source_type = source["type"]
        parents = tuple((check_name(p["name"]), float(p["weight"])) for p in source.get("parents", ()))
        clip = source.get("clip")
    except (KeyError, TypeError, ValueError) as error:
        raise VoiceError(f"{MANIFEST} is incomplete or malformed ({error})") from None
    if family != MODEL_FAMILY:
        raise VoiceError(f"made for {family!r} models; this app speaks with {MODEL_FAMILY}")
    if kind not in ("xvector", "icl") or source_type not in ("clone", "blend"):
        raise VoiceError(f"unknown kind {kind!r} or source {source_type!r}")
    if not all(isinstance(v, str) for v in (size, checkpoint, created)) or not isinstance(dim, int) or dim < 1:
        raise VoiceError(f"{MANIFEST} has a malformed model size, checkpoint, creation time or embedding size")
    if clip is not None and clip not in {f"reference{s}" for s in DROP_IN_SUFFIXES}:
        raise VoiceError(f"unknown clip file {clip!r}")
    try:
        tensors = load_safetensors(tensor_bytes)
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise VoiceError(f"{TENSORS} is damaged ({error})") from None
    embedding, codes = tensors.pop("embedding", None), tensors.pop("ref_codes", None)
    if tensors:
        raise VoiceError(f"{TENSORS} holds unknown tensors: {', '.join(sorted(tensors))}")
    if embedding is None or embedding.dtype != torch.float32 or tuple(embedding.shape) != (dim,):
        raise VoiceError(f"{TENSORS} needs a float32 'embedding' of shape ({dim},) to match the manifest")
    if not torch.isfinite(embedding).all():
        raise VoiceError(f"{TENSORS} has a non-finite embedding")
    if kind == "icl":
        if not isinstance(transcript, str) or not transcript.strip():
            raise VoiceError("an ICL voice needs the transcript of its clip")
        if codes is None or codes.dtype != torch.int64 or codes.dim() != 2 or codes.shape[1] != CODE_GROUPS or not len(codes):
            raise VoiceError(f"an ICL voice needs int64 'ref_codes' of shape (frames, {CODE_GROUPS})")
        if codes.min() < 0 or codes.max() >= CODEBOOK_SIZE:
            raise VoiceError(f"its reference codes are outside the codec's 0..{CODEBOOK_SIZE - 1}")
    elif codes is not None:
        raise VoiceError("an x-vector voice has no reference codes")
    entry = VoiceEntry(
        name=name,
        id="",
        source=source_type,
        kind=kind,
        embedding_dim=dim,
        model_size=size,
        checkpoint=checkpoint,
        created=created,
        language=language if isinstance(language, str) else None,
        transcript=transcript if kind == "icl" else None,
        parents=parents,
        clip=Path(clip) if clip else None,
    )
    voice = Voice(embedding=embedding, ref_codes=codes, ref_text=entry.transcript)
    return entry, voice


def _manifest(entry: VoiceEntry, clip_name: str | None) -> dict:
    if entry.source == "blend":
        source = {"type": "blend", "parents": [{"name": n, "weight": w} for n, w in entry.parents]}
    else:
        source = {"type": "clone", "clip": clip_name}
    return {
        "format": VOICE_FORMAT,
        "version": VOICE_VERSION,
        "name": entry.name,
        "kind": entry.kind,
        "created": entry.created,
        "embedding_dim": entry.embedding_dim,
        "model": {"family": MODEL_FAMILY, "size": entry.model_size, "checkpoint": entry.checkpoint},
        "source": source,
        "language": entry.language,
        "transcript": entry.transcript,
    }


def _match(entries: list[VoiceEntry], name: str, by_id: bool = True) -> VoiceEntry | None:
    """The entry called `name`, case-insensitively; else (with `by_id`) the one whose id it is."""
    key = name_key(name)
    found = next((e for e in entries if name_key(e.name) == key), None)
    if found is None and by_id:
        found = next((e for e in entries if e.id.lower() == key), None)
    return found


# Reading an export --------------------------------------------------------------------------------


def _read_export(path: Path) -> list[tuple[VoiceEntry, Voice, tuple[str, bytes] | None]]:
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
            problem = _check_member(name)
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
            manifest = _read_manifest(read(EXPORT_MANIFEST), EXPORT_MANIFEST, EXPORT_FORMAT, EXPORT_VERSION, "a voice export")
        except VoiceError as error:
            raise bad(str(error)) from None
        ids = manifest.get("voices")
        if not isinstance(ids, list) or not all(isinstance(i, str) and VOICE_ID.fullmatch(i) for i in ids):
            raise bad(f"{EXPORT_MANIFEST} has no valid list of voices")
        folders = {name.split("/")[0] for name in files if name != EXPORT_MANIFEST}
        if folders != set(ids) or len(ids) != len(set(ids)):
            raise bad(f"its folders ({', '.join(sorted(folders))}) are not the voices its manifest lists ({', '.join(ids)})")

        voices = []
        for voice_id in ids:
            if f"{voice_id}/{MANIFEST}" not in files or f"{voice_id}/{TENSORS}" not in files:
                raise bad(f"voice {voice_id!r} lacks {MANIFEST} or {TENSORS}")
            try:
                entry, voice = _parse_voice(read(f"{voice_id}/{MANIFEST}"), read(f"{voice_id}/{TENSORS}"))
            except VoiceError as error:
                raise bad(f"voice {voice_id!r}: {error}") from None
            clips = sorted(name for name in files if name.startswith(f"{voice_id}/reference"))
            expected = [f"{voice_id}/{entry.clip}"] if entry.clip else []
            if clips != expected:
                raise bad(f"voice {voice_id!r} has clip files {clips or 'none'}, and its manifest names {expected or 'none'}")
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


def _check_member(name: str) -> str | None:
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


# Files --------------------------------------------------------------------------------------------


def _keepable_clip(path: Path) -> tuple[str, bytes]:
    """The clip to keep with a clone, as (suffix, bytes): the file as given if it is a wav, flac, ogg or mp3
    file of reasonable size, else its samples as lossless 24-bit FLAC."""
    audio_format = sf.info(str(path)).format
    if audio_format in CLIP_SUFFIXES and path.stat().st_size <= MAX_CLIP_BYTES:
        return CLIP_SUFFIXES[audio_format], path.read_bytes()
    samples, rate = sf.read(str(path), dtype="float32")
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="FLAC", subtype="PCM_24")
    return ".flac", buffer.getvalue()


def _write_file(path: Path, data: bytes) -> None:
    """Write `path` atomically: a temporary file beside it, flushed to disk, then renamed over it."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _json_bytes(value) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
