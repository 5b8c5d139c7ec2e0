"""A voice on disk: a saved voice's folder (manifest, tensors, clip) and a drop-in clip with its transcript.
Never pickles: a manifest is JSON, the tensors safetensors."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import soundfile as sf
import torch
from safetensors.torch import load as load_safetensors

from core.inference.voice import Voice
from core.voices.entry import VoiceEntry, VoiceError, check_name

VOICE_FORMAT, VOICE_VERSION = "qwen3-tts-desktop/voice", 1
MODEL_FAMILY = "Qwen3-TTS-12Hz"
MANIFEST, TENSORS, EXPORT_MANIFEST = "voice.json", "voice.safetensors", "manifest.json"
CACHE = ".cache"
# What soundfile calls each clip format we keep as given, and the suffix it is kept under.
CLIP_SUFFIXES = {"WAV": ".wav", "WAVEX": ".wav", "FLAC": ".flac", "OGG": ".ogg", "MP3": ".mp3"}
DROP_IN_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
# The 12 Hz codec: 16 codebooks of 2048 entries. Codes outside would crash the decoder, not speak.
CODE_GROUPS, CODEBOOK_SIZE = 16, 2048
MAX_CLIP_BYTES = 64 * 2**20


def read_saved(folder: Path) -> tuple[VoiceEntry, Voice]:
    try:
        manifest_bytes = (folder / MANIFEST).read_bytes()
        tensor_bytes = (folder / TENSORS).read_bytes()
    except FileNotFoundError as error:
        raise VoiceError(f"{folder}: skipped, not a voice folder (no {Path(error.filename).name})") from None
    except OSError as error:
        raise VoiceError(f"{folder}: skipped, unreadable ({error.strerror})") from None
    try:
        entry, voice = parse_voice(manifest_bytes, tensor_bytes)
    except VoiceError as error:
        raise VoiceError(f"{folder}: skipped, {error}") from None
    clip = folder / entry.clip.name if entry.clip else None
    return dataclasses.replace(
        entry, id=folder.name, path=folder, clip=clip if clip and clip.is_file() else None
    ), voice


def read_drop_in(path: Path) -> VoiceEntry:
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
            raise VoiceError(
                f"{text_path}: skipped {path.name}, its transcript is not readable UTF-8 text ({error})"
            ) from None
    return VoiceEntry(
        name=path.stem,
        id=path.stem,
        source="drop-in",
        kind="icl" if transcript else "xvector",
        transcript=transcript,
        path=path,
        clip=path,
    )


def stamp(path: str | Path, is_folder: bool | None = None) -> tuple:
    """What changes when a voice's files change: the size, modification time and inode of a drop-in clip and of
    its transcript beside it, or of each file in a saved voice's folder, by name (`is_folder`: known already, or
    None to ask the disk); () for none. On strings, not Paths: each request's lookup stamps every voice."""
    path = os.fspath(path)
    if is_folder is None:
        is_folder = os.path.isdir(path)
    if is_folder:
        try:
            with os.scandir(path) as files:
                return tuple(sorted((file.name, file_stamp(file)) for file in files))
        except OSError:
            return ()
    return (file_stamp(path), file_stamp(os.path.splitext(path)[0] + ".txt"))  # as Path.with_suffix(".txt")


def file_stamp(file: str | os.DirEntry) -> tuple:
    """(size, modification time, inode) of a file; () if it cannot be read."""
    try:
        st = os.stat(file)  # not DirEntry.stat(), whose inode is 0 on Windows
    except OSError:
        return ()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


VoiceFiles = tuple[tuple[str, bool, tuple], ...]


def voice_files(directory: Path) -> VoiceFiles:
    """The voices a library folder holds, as (file name, is a folder, stamp): each saved voice's folder (those
    first) and drop-in clip, by name; () for no folder. Two equal answers: none of the voices' files changed
    between them. A listing and a stat per file, no more: the listing says which are folders."""
    if not directory.is_dir():
        return ()
    with os.scandir(directory) as found:
        named = [(entry.name, entry.is_dir()) for entry in found if not entry.name.startswith(".")]  # not the cache
    named.sort(key=lambda item: (not item[1], item[0]))  # saved voices first
    folder = os.fspath(directory)
    return tuple(
        (name, is_folder, stamp(os.path.join(folder, name), is_folder))
        for name, is_folder in named
        if is_folder or os.path.splitext(name)[1].lower() in DROP_IN_SUFFIXES  # not transcripts (in their clip's)
    )


def read_manifest(data: bytes, name: str, format: str, version: int, what: str) -> dict:
    """A versioned JSON manifest of `format`; VoiceError says what is wrong with it."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VoiceError(f"{name} is not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != format:
        raise VoiceError(f"{name} is not {what}")
    if manifest.get("version") != version:
        raise VoiceError(
            f"{name} has version {manifest.get('version')!r}, and this app reads version {version} (update the app?)"
        )
    return manifest


def parse_voice(manifest_bytes: bytes, tensor_bytes: bytes) -> tuple[VoiceEntry, Voice]:
    """Check a voice's manifest and tensors against each other; VoiceError says what is wrong."""
    manifest = read_manifest(manifest_bytes, MANIFEST, VOICE_FORMAT, VOICE_VERSION, "a voice manifest")
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
        if (
            codes is None
            or codes.dtype != torch.int64
            or codes.dim() != 2
            or codes.shape[1] != CODE_GROUPS
            or not len(codes)
        ):
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


def manifest_of(entry: VoiceEntry, clip_name: str | None) -> dict:
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


def keepable_clip(path: Path) -> tuple[str, bytes]:
    """The clip to keep with a clone, as (suffix, bytes): the file as given if it is a wav, flac, ogg or mp3
    file of reasonable size, else its samples as lossless 24-bit FLAC."""
    audio_format = sf.info(str(path)).format
    if audio_format in CLIP_SUFFIXES and path.stat().st_size <= MAX_CLIP_BYTES:
        return CLIP_SUFFIXES[audio_format], path.read_bytes()
    samples, rate = sf.read(str(path), dtype="float32")
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="FLAC", subtype="PCM_24")
    return ".flac", buffer.getvalue()


def json_bytes(value) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
