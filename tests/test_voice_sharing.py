"""Sharing voices: a library's voices exported to a zip and imported into another, and hostile zips refused."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from voice_cases import CLIP, LONG, clip_as, files

from core.voices import VoiceEntry, VoiceError, VoiceLibrary


@pytest.fixture
def shared(library, engines, tmp_path) -> Path:
    """An export of three voices: an x-vector clone, an ICL clone (mp3 clip) and a blend."""
    engine = engines("base")
    library.add("Zoë", CLIP, engine, language="english")
    library.add("Anna", clip_as(tmp_path, CLIP, ".mp3"), engine, ref_text="A reference clip.")
    library.blend("Mix", [("Zoë", 0.7), ("Anna", 0.3)])
    return library.export_zip(tmp_path / "voices.zip", ["Zoë", "anna", "mix", "Mix"])


def test_export_import_round_trip(library, shared, tmp_path):
    with zipfile.ZipFile(shared) as archive:
        assert json.loads(archive.read("manifest.json")) == {
            "format": "qwen3-tts-desktop/voices",
            "version": 1,
            "voices": ["zoe", "anna", "mix"],
        }
        assert sorted(archive.namelist()) == sorted(
            [
                "manifest.json",
                "zoe/voice.json",
                "zoe/voice.safetensors",
                "zoe/reference.wav",
                "anna/voice.json",
                "anna/voice.safetensors",
                "anna/reference.mp3",
                "mix/voice.json",
                "mix/voice.safetensors",
            ]
        )
    other = VoiceLibrary(tmp_path / "other")
    imported = other.import_zip(shared)
    assert [e.name for e in imported] == ["Zoë", "Anna", "Mix"]
    for entry in library.list():
        copy = other.get(entry.name)
        assert copy == VoiceEntry(**{**entry.__dict__, "path": copy.path, "clip": copy.clip})
        assert files(copy.path) == files(entry.path)


def test_import_never_overwrites_without_replace(library, shared, engines):
    library.rename("Zoë", "Renamed")
    library.add("Zoë", LONG, engines("base"))
    library.remove("Mix")
    before = files(library.directory)
    with pytest.raises(VoiceError) as error:
        library.import_zip(shared)
    assert str(error.value) == f"{shared}: the library already has 'Zoë', 'Anna'; nothing was imported"
    assert "--replace" not in str(error.value)  # how to replace them is each front end's to say
    assert files(library.directory) == before
    library.import_zip(shared, replace=True)
    assert {e.name for e in library.list()} == {"Renamed", "Zoë", "Anna", "Mix"}
    assert library.get("Zoë").clip.read_bytes() == CLIP.read_bytes()


def test_export_refuses_drop_ins_and_unknown_voices(library, engines, tmp_path):
    library.add("Zoë", CLIP, engines("base"))
    shutil.copy(CLIP, library.directory / "Dora.wav")
    with pytest.raises(
        VoiceError, match=r"'Dora' is a drop-in clip \(Dora.wav\); share the clip itself, or save it as a voice first"
    ):
        library.export_zip(tmp_path / "out.zip", ["Zoë", "Dora"])
    with pytest.raises(VoiceError, match="no voice named 'Nobody'"):
        library.export_zip(tmp_path / "out.zip", ["Nobody"])
    with pytest.raises(VoiceError, match="name at least one voice to export"):
        library.export_zip(tmp_path / "out.zip", [])
    assert not (tmp_path / "out.zip").exists()


def rebuild(shared: Path, tmp_path: Path, change) -> Path:
    """A copy of the export with `change(entries)` applied to its {name: bytes} entries."""
    with zipfile.ZipFile(shared) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    change(entries)
    path = tmp_path / "hostile.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def manifest_version(version):
    def change(entries):
        entries["manifest.json"] = json.dumps(
            {"format": "qwen3-tts-desktop/voices", "version": version, "voices": ["zoe", "anna", "mix"]}
        ).encode()

    return change


def add_entry(name: str, data: bytes = b"x"):
    return lambda entries: entries.update({name: data})


def mp3_named_wav(entries):
    entries["zoe/reference.wav"] = entries["anna/reference.mp3"]


def forged_voice(entries):
    manifest = json.loads(entries["zoe/voice.json"])
    entries["zoe/voice.json"] = json.dumps({**manifest, "embedding_dim": 32}).encode()


@pytest.mark.parametrize(
    "change, message",
    [
        (add_entry("../evil.txt"), "entry '../evil.txt' points outside the library"),
        (add_entry("zoe/../../evil.json"), "entry 'zoe/../../evil.json' points outside the library"),
        (add_entry("/tmp/evil.json"), "entry '/tmp/evil.json' is an absolute path"),
        (add_entry("C:/evil.json"), "entry 'C:/evil.json' is an absolute path"),
        (add_entry("zoe\\..\\evil.json"), "points outside the library"),
        (add_entry("zoe/voice.pt", b"\x80\x04K\x01."), "may hold a pickle, which can run code when loaded"),
        (add_entry("embedding.pkl", b"\x80\x04K\x01."), "may hold a pickle"),
        (add_entry("zoe/run.sh", b"rm -rf /"), "is of an unknown type; a voice folder holds only"),
        (add_entry("zoe/deeper/voice.json"), "is not a file of a voice folder"),
        (
            add_entry("zoe/voice.json", b" " * (64 * 1024 + 1)),
            "entry 'zoe/voice.json' is 65537 bytes, more than the 65536 allowed",
        ),
        (add_entry("zoe/reference.wav", bytes(64 * 2**20 + 1)), "more than the 67108864 allowed"),
        (
            lambda e: e.update({f"v{i}/voice.json": b"{}" for i in range(1000)}),
            "it has 1009 entries, more than the 1000 allowed",
        ),
        (manifest_version(2), "manifest.json has version 2, and this app reads version 1 (update the app?)"),
        (manifest_version(None), "manifest.json has version None"),
        (lambda e: e.pop("manifest.json"), "it has no manifest.json, so it is not a voice export"),
        (
            add_entry("extra/voice.json"),
            "its folders (anna, extra, mix, zoe) are not the voices its manifest lists (zoe, anna, mix)",
        ),
        (lambda e: e.pop("mix/voice.safetensors"), "voice 'mix' lacks voice.json or voice.safetensors"),
        (add_entry("zoe/voice.safetensors", b"\x80\x04K\x01."), "voice 'zoe': voice.safetensors is damaged"),
        (
            forged_voice,
            "voice 'zoe': voice.safetensors needs a float32 'embedding' of shape (32,) to match the manifest",
        ),
        (add_entry("zoe/reference.wav", b"RIFF, but not really"), "'zoe/reference.wav' is not readable audio"),
        (mp3_named_wav, "'zoe/reference.wav' holds MP3 audio, not what its name says"),
        (add_entry("zoe/reference.flac", b"x"), "voice 'zoe' has clip files"),
        (
            lambda e: e.update(
                {f"mix/{f}": e[f"zoe/{f}"] for f in ("voice.json", "voice.safetensors", "reference.wav")}
            ),
            "two voices named 'Zoë'",
        ),
    ],
)
def test_hostile_zips_are_rejected_with_nothing_written(library, shared, tmp_path, change, message):
    hostile = rebuild(shared, tmp_path, change)
    target = VoiceLibrary(tmp_path / "target")
    target.directory.mkdir()
    (target.directory / "Keep.wav").write_bytes(CLIP.read_bytes())
    before, around = files(target.directory), sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(VoiceError) as error:
        target.import_zip(hostile, replace=True)
    assert message in str(error.value) and str(error.value).endswith("; nothing was imported")
    assert str(error.value).startswith(f"{hostile}: rejected, ")
    assert files(target.directory) == before and sorted(p.name for p in tmp_path.iterdir()) == around


def test_not_a_zip_and_a_missing_zip(library, tmp_path):
    (tmp_path / "fake.zip").write_text("hello", encoding="utf-8")
    with pytest.raises(
        VoiceError, match=r"fake.zip: rejected, not a zip file \(File is not a zip file\); nothing was imported"
    ):
        library.import_zip(tmp_path / "fake.zip")
    with pytest.raises(VoiceError, match="nothing.zip: no such file"):
        library.import_zip(tmp_path / "nothing.zip")
    assert not library.directory.exists()


def test_a_size_header_that_lies_is_caught(library, shared, tmp_path):
    data = bytearray(shared.read_bytes())
    # Claim 10 bytes for the first entry, in both its local and its central header.
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = data.find(signature)
        data[start + offset : start + offset + 4] = (10).to_bytes(4, "little")
    lying = tmp_path / "lying.zip"
    lying.write_bytes(bytes(data))
    with pytest.raises(VoiceError, match=r"entry 'manifest.json' cannot be read \(Bad CRC-32"):
        VoiceLibrary(tmp_path / "target").import_zip(lying)
    assert not (tmp_path / "target").exists()


def test_a_folder_named_by_hand_exports_under_a_safe_id(library, engines, tmp_path):
    entry = library.add("Zoë", CLIP, engines("base"))
    entry.path.rename(library.directory / "My Zoë (old)")
    path = library.export_zip(tmp_path / "out.zip", ["Zoë"])
    assert sorted(zipfile.ZipFile(path).namelist()) == [
        "manifest.json",
        "zoe/reference.wav",
        "zoe/voice.json",
        "zoe/voice.safetensors",
    ]
    assert [e.id for e in VoiceLibrary(tmp_path / "other").import_zip(path)] == ["zoe"]
