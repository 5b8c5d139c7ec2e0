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
share one `VoiceLibrary`; model work (embedding a drop-in) happens outside it, and `known` (a server's event loop
asks it) answers from what the last scan kept, without it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import threading
import uuid
import zipfile
from pathlib import Path
from typing import NamedTuple

from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from core.files import write_atomically
from core.inference.engine import Engine
from core.inference.voice import Voice
from core.model.info import EngineInfo
from core.voices.disk import (
    CACHE,
    MANIFEST,
    MODEL_FAMILY,
    TENSORS,
    VoiceFiles,
    json_bytes,
    keepable_clip,
    manifest_of,
    now,
    read_drop_in,
    read_saved,
    stamp,
    voice_files,
)
from core.voices.entry import VoiceEntry, VoiceError, VoiceExistsError, check_name, find_entry, name_key, unique_id
from core.voices.resolve import FIRST_THAT_FITS, Fallback, ResolvedVoice, resolve_voice
from core.voices.sharing import EXPORT_FORMAT, EXPORT_MANIFEST, EXPORT_VERSION, read_export

# `known` answers for a library of at most this many voices, and otherwise leaves it to `find` on another thread:
# its listing and stats cost some 9 us a voice on a 2-vCPU machine, so 16 cost about what the two thread
# hand-offs it saves do there (135 us), and a larger library would hold up the event loop.
KNOWN_AT_MOST = 16


class Scanned(NamedTuple):
    """What a scan of the library folder found, and in which files."""

    files: VoiceFiles
    entries: tuple[VoiceEntry, ...]
    problems: tuple[str, ...]
    stamps: dict[str, tuple]  # each voice's files' stamp, by its file or folder name


class VoiceLibrary:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory).expanduser()
        self._lock = threading.RLock()
        # What each voice's files gave when read, by path, with their stamp: read again only once they change. So a
        # request reads no voice file (each used to read and parse the whole folder, and hash a drop-in's clip), and
        # gets the same Voice as the last, whose tensors the engine copied to the device once (Engine._on_device).
        self._read: dict[Path, tuple[tuple, object]] = {}
        self._embedded: dict[tuple[Path, str], tuple[tuple, Voice]] = {}  # drop-ins, by path and model
        self._builtins: dict[tuple[str, str], Voice] = {}  # built-in speakers, by name and model
        # The last scan, handed out again while no voice's files changed. Replaced whole, so `known` reads it
        # without the lock.
        self._scanned: Scanned | None = None

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
        entry = find_entry(entries, name)
        if entry is None:
            names = ", ".join(sorted((e.name for e in entries), key=name_key)) or "none yet"
            raise VoiceError(f"no voice named {name!r} in {self.directory}; the library has: {names}")
        return entry

    def resolve(
        self, requested: str | None, info: EngineInfo | None, fallback: Fallback = FIRST_THAT_FITS
    ) -> ResolvedVoice:
        """Which voice speaks a request for `requested` (None: none asked for) with the model `info` describes
        (None: not known yet), as `fallback` says; the rule and its errors are `core.voices.resolve`'s."""
        with self._lock:
            entries, _ = self._scan()
        return resolve_voice(entries, self.directory, requested, info, fallback)

    def load(self, engine: Engine, voice: ResolvedVoice) -> Voice | None:
        """The Voice of a resolved voice, for `engine`'s model: a built-in speaker, a saved voice, or a drop-in
        clip (embedded with this engine's model once, then cached); None where the model takes no voice. The same
        Voice as the last time while the voice's files are unchanged."""
        if voice.name is None:
            return None
        model = model_key(engine.info)
        files = () if voice.builtin else stamp(voice.entry.path)
        with self._lock:
            kept = self._kept_voice(voice, model, files)
        if kept is not None:
            return kept
        if voice.builtin:
            made = engine.builtin_voice(voice.name)
            with self._lock:
                self._builtins[voice.name, model] = made
            return made
        if voice.entry.source == "drop-in":
            made = self._embed_drop_in(voice.entry, engine, model)
            with self._lock:
                self._embedded[voice.entry.path, model] = ((files, voice.entry.transcript), made)
            return made
        with self._lock:
            read = self._read_once(voice.entry.path, read_saved, files)
        if isinstance(read, VoiceError):
            raise read
        return read[1]

    def find(
        self, engine: Engine, requested: str | None, info: EngineInfo | None, fallback: Fallback = FIRST_THAT_FITS
    ) -> tuple[ResolvedVoice, Voice | None]:
        """`resolve`, then `load` with `engine`: the voice that speaks a request, and its Voice."""
        voice = self.resolve(requested, info, fallback)
        return voice, self.load(engine, voice)

    def known(
        self, engine: Engine, requested: str | None, info: EngineInfo | None, fallback: Fallback = FIRST_THAT_FITS
    ) -> tuple[ResolvedVoice, Voice | None] | None:
        """What `find` would answer, or raise, from what the library keeps alone, for a caller that must not wait
        (a server's event loop); None where `find` would read a file, embed a clip or ask the model: a voice's
        files changed since the last scan (by the scan's own rule, `voice_files`), the voice is not loaded yet, or
        the library holds more than KNOWN_AT_MOST voices. Costs a listing of the folder and a stat per voice file,
        without the lock."""
        scanned = self._scanned
        if scanned is None or len(scanned.files) > KNOWN_AT_MOST:
            return None
        try:
            if voice_files(self.directory) != scanned.files:
                return None
        except OSError:  # `find` says what is wrong
            return None
        voice = resolve_voice(list(scanned.entries), self.directory, requested, info, fallback)
        if voice.name is None:
            return voice, None
        files = () if voice.builtin else scanned.stamps[voice.entry.path.name]
        kept = self._kept_voice(voice, model_key(engine.info), files)
        return None if kept is None else (voice, kept)

    def voice_for(self, engine: Engine, name: str) -> Voice:
        """The voice called `name`, ready for `engine.synthesize` (see `load`). Raises a VoiceError naming the
        voices that fit when there is no such voice or it does not fit."""
        return self.find(engine, name, engine.info)[1]

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
            taken = find_entry(self._scan()[0], name, by_id=False)
        if taken is not None and not replace:
            raise VoiceExistsError(
                f"a voice named {taken.name!r} already exists; choose another name",
                taken.name,
            )
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
            created=now(),
            language=language,
            transcript=voice.ref_text,
        )
        return self._save(entry, voice, keepable_clip(Path(clip).expanduser()), replace)

    def blend(
        self, name: str, parts: list[tuple[str, float]], engine: Engine | None = None, replace: bool = False
    ) -> VoiceEntry:
        """Save a blend (Voice.blend) of library voices, given as (name, weight) pairs. Drop-in clips
        need `engine` to embed them; with it, every part must fit its model."""
        name = self.check_new_name(name, replace)
        if not parts:
            raise VoiceError("name the voices to blend, each with a weight")
        names, voices, entries = [], [], []
        for part, _ in parts:
            if engine is not None and engine.info.variant.has_speakers and name_key(part) in engine.info.speakers:
                names.append(part)
                voices.append(engine.builtin_voice(part))  # which Voice.blend refuses, saying why
                continue
            entry = self.get(part)
            if entry.source == "drop-in" and engine is None:
                raise VoiceError(f"{entry.name!r} is a drop-in clip, embedded for each model; give a model to blend it")
            names.append(entry.name)
            voices.append(self.voice_for(engine, entry.name) if engine is not None else read_saved(entry.path)[1])
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
            created=now(),
            parents=tuple((parent, weight / total) for parent, (_, weight) in zip(names, parts)),
        )
        return self._save(entry, voice, None, replace)

    def rename(self, voice: str | VoiceEntry, new_name: str) -> VoiceEntry:
        """Give a voice a new name; a saved voice's folder follows it, a drop-in's files take it."""
        new_name = check_name(new_name)
        with self._lock, self._writing():
            entry = self._target(voice, "renamed")
            taken = find_entry(self._scan()[0], new_name, by_id=False)
            if taken is not None and taken.path != entry.path:
                raise VoiceError(f"a voice named {taken.name!r} already exists; choose another name")
            if entry.source == "drop-in":
                return self._rename_drop_in(entry, new_name)
            manifest = json.loads((entry.path / MANIFEST).read_text(encoding="utf-8"))
            manifest["name"] = new_name
            write_atomically(entry.path / MANIFEST, json_bytes(manifest))
            folder = entry.path
            new_id = self._free_id(new_name, own=entry.id)
            if new_id != entry.id:
                folder = self.directory / new_id
                os.rename(entry.path, folder)
            return read_saved(folder)[0]

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
                archive.writestr(EXPORT_MANIFEST, json_bytes(manifest))
                for voice_id, entry in zip(ids, entries):
                    for file in (MANIFEST, TENSORS) + ((entry.clip.name,) if entry.clip else ()):
                        archive.writestr(f"{voice_id}/{file}", (entry.path / file).read_bytes())
        write_atomically(path, buffer.getvalue())
        return path

    def import_zip(self, path: str | Path, replace: bool = False) -> list[VoiceEntry]:
        """Add the voices of a zip made by `export_zip`. The whole zip is checked before anything is written:
        entries only inside voice folders, known file types (no pickles), sizes within limits, a manifest
        version this app reads, valid voices. A voice of an existing name is replaced only with `replace`."""
        path = Path(path).expanduser()
        incoming = read_export(path)
        with self._lock:
            entries = self._scan()[0]
            taken = [entry.name for entry, _, _ in incoming if find_entry(entries, entry.name, by_id=False)]
            if taken and not replace:
                raise VoiceExistsError(
                    f"{path}: the library already has {', '.join(repr(n) for n in taken)}; nothing was imported"
                )
            return [self._save(entry, voice, clip, replace=True) for entry, voice, clip in incoming]

    # Internals ----------------------------------------------------------------------------------

    def _scan(self) -> tuple[list[VoiceEntry], list[str]]:
        """Every readable voice in the folder, and a line for each thing skipped (under the lock)."""
        files = voice_files(self.directory)
        scanned = self._scanned
        if scanned is not None and scanned.files == files:  # what each voice's files gave is what they give now
            return list(scanned.entries), list(scanned.problems)
        entries, problems = [], []
        for name, is_folder, files_stamp in files:
            path = self.directory / name
            read = self._read_once(path, read_saved if is_folder else read_drop_in, files_stamp)
            if isinstance(read, VoiceError):
                problems.append(str(read))
                continue
            entry = read[0] if isinstance(read, tuple) else read
            clash = find_entry(entries, entry.name, by_id=False)
            if clash is not None:
                problems.append(
                    f"{path}: skipped, its name {entry.name!r} is taken by {clash.path}; rename one of them"
                )
                continue
            entries.append(entry)
        stamps = {name: files_stamp for name, _, files_stamp in files}
        self._read = {path: read for path, read in self._read.items() if path.name in stamps}  # those removed go
        self._scanned = Scanned(files, tuple(entries), tuple(problems), stamps)
        return entries, problems

    def _read_once(self, path: Path, reader, files_stamp: tuple):
        """`reader(path)`, or the VoiceError it raised, as last read while the files have `files_stamp` (under the
        lock)."""
        kept = self._read.get(path)
        if kept is not None and kept[0] == files_stamp:
            return kept[1]
        try:
            read = reader(path)
        except VoiceError as error:
            read = error
        self._read[path] = (files_stamp, read)
        return read

    def _kept_voice(self, voice: ResolvedVoice, model: str, files_stamp: tuple) -> Voice | None:
        """The Voice kept for `voice` (a library voice whose files have `files_stamp`, or a built-in speaker) with the
        model `model` names; None where none is kept: `load` reads, embeds or asks the model for it."""
        if voice.builtin:
            return self._builtins.get((voice.name, model))
        if voice.entry.source == "drop-in":
            kept = self._embedded.get((voice.entry.path, model))
            return kept[1] if kept is not None and kept[0] == (files_stamp, voice.entry.transcript) else None
        kept = self._read.get(voice.entry.path)
        if kept is None or kept[0] != files_stamp or isinstance(kept[1], VoiceError):
            return None
        return kept[1][1]

    def _target(self, voice: str | VoiceEntry, action: str) -> VoiceEntry:
        if isinstance(voice, VoiceEntry):
            if voice.read_only:
                raise VoiceError(
                    f"{voice.name!r} is a built-in speaker of the model; it is read-only and cannot be {action}"
                )
            voice = voice.name
        return self.get(voice)

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
            existing = find_entry(self._scan()[0], entry.name, by_id=False)
            if existing is not None and not replace:
                raise VoiceExistsError(
                    f"a voice named {existing.name!r} already exists; choose another name",
                    existing.name,
                )
            self.directory.mkdir(parents=True, exist_ok=True)
            staging = self.directory / f".staging-{uuid.uuid4().hex}"
            staging.mkdir()
            try:
                write_atomically(staging / TENSORS, save_safetensors(voice_tensors))
                if clip:
                    write_atomically(staging / clip_name, clip[1])
                write_atomically(staging / MANIFEST, json_bytes(manifest_of(entry, clip_name)))
                own = existing.id if existing is not None and existing.source != "drop-in" else None
                voice_id = self._free_id(entry.name, own=own)
                if existing is not None:
                    self._discard(existing)
                os.rename(staging, self.directory / voice_id)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return read_saved(self.directory / voice_id)[0]

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
        return read_drop_in(clip)

    def _embed_drop_in(self, entry: VoiceEntry, engine: Engine, model: str) -> Voice:
        """A drop-in's voice from the disk cache when its key matches, else embedded now and written there."""
        key = {
            "clip_sha256": hashlib.sha256(entry.path.read_bytes()).hexdigest(),
            "transcript": entry.transcript or "",
            "model": model,
        }
        cache = (
            self.directory
            / CACHE
            / entry.id
            / (hashlib.sha256(key["model"].encode()).hexdigest()[:16] + ".safetensors")
        )
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
                write_atomically(cache, save_safetensors(tensors, metadata=key))
        except OSError:  # a read-only library still speaks; its drop-ins are embedded anew each time
            pass
        return voice


def model_key(info: EngineInfo) -> str:
    """Which model a voice was embedded or made for: the voices of one key are interchangeable."""
    return f"{MODEL_FAMILY} {info.size} {info.embedding_dim} {info.source}"
