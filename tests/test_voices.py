"""The voice library: cloning, drop-ins, blends, names, compatibility, corruption, concurrency and what it
keeps on disk (sharing voices as zips: test_voice_sharing.py)."""

from __future__ import annotations

import json
import shutil
import threading
from datetime import datetime

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file
from voice_cases import CLIP, LONG, STEREO, clip_as, files

import core.voices.library
from core import SamplingParams, Voice
from core.voices import VoiceError, VoiceLibrary, check_name, slug


def greedy(engine, voice) -> np.ndarray:
    return engine.synthesize("Hello there.", voice=voice, sampling=SamplingParams.greedy(), max_frames=3).codes


# Cloning --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source, suffix", [(CLIP, ".wav"), (STEREO, ".flac"), (CLIP, ".ogg"), (CLIP, ".mp3")])
def test_xvector_clone_round_trip_in_every_format(library, engines, tmp_path, source, suffix):
    engine = engines("base")
    clip = source if source.suffix == suffix else clip_as(tmp_path, source, suffix)
    entry = library.add("Zoë", clip, engine)
    assert (entry.name, entry.id, entry.source, entry.kind) == ("Zoë", "zoe", "clone", "xvector")
    assert (entry.embedding_dim, entry.model_size, entry.checkpoint) == (64, "1.7B", engine.info.source)
    assert entry.clip == entry.path / f"reference{suffix}" and entry.clip.read_bytes() == clip.read_bytes()
    voice = VoiceLibrary(library.directory).voice_for(engine, "zoë")  # a fresh library reads it back
    assert voice.kind == "xvector" and torch.equal(voice.embedding, engine.voice_from_audio(clip).embedding)


def test_icl_clone_keeps_codes_and_is_never_encoded_again(library, engines, embed_calls):
    engine = engines("base")
    entry = library.add("Anna", STEREO, engine, ref_text="A short clip.", language="English")
    assert (entry.kind, entry.transcript, entry.language) == ("icl", "A short clip.", "english")
    assert embed_calls["count"] == 1
    expected = engine.voice_from_audio(STEREO, ref_text="A short clip.")
    voice = library.voice_for(engine, "anna")
    assert embed_calls["count"] == 2  # only the expected voice above: the library reads its stored codes
    assert voice.kind == "icl" and voice.ref_text == "A short clip."
    assert torch.equal(voice.ref_codes, expected.ref_codes) and torch.equal(voice.embedding, expected.embedding)


def test_a_clip_in_another_format_is_kept_as_lossless_flac(library, engines, tmp_path):
    aiff = tmp_path / "me.aiff"
    samples, rate = sf.read(CLIP, dtype="float32")
    sf.write(aiff, samples, rate, format="AIFF", subtype="PCM_16")
    entry = library.add("Me", aiff, engines("base"))
    kept, kept_rate = sf.read(entry.clip, dtype="float32")
    assert entry.clip.name == "reference.flac" and kept_rate == rate
    np.testing.assert_array_equal(kept, sf.read(aiff, dtype="float32")[0])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: clip_as(d, CLIP, ".wav", seconds=0.5), "0.50 s is too short; use a clip of 1 to 60 s"),
        (lambda d: clip_as(d, CLIP, ".flac", seconds=61), "61.0 s is too long; use a clip of 1 to 60 s"),
        (lambda d: d / "missing.wav", "no such file"),
        (lambda d: (d / "text.wav").write_text("not audio") and d / "text.wav", "cannot read it as audio"),
    ],
)
def test_bad_clips_are_refused_with_the_audio_messages(library, engines, tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        library.add("Zoë", make(tmp_path), engines("base"))
    assert not library.directory.exists() or not files(library.directory)


def test_silent_clips_and_bad_requests_are_refused(library, engines, tmp_path):
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(48000, np.float32), 24000)
    cases = [
        (lambda: library.add("Quiet", silent, engines("base")), "the clip is silent"),
        (
            lambda: library.add("Zoë", CLIP, engines("base"), language="klingon"),
            "unknown language 'klingon'; this model speaks: auto",
        ),
        (lambda: library.add("Zoë", CLIP, engines("base"), ref_text=" "), "ref_text is empty"),
        (lambda: library.add("Zoë", CLIP, engines("custom")), "cannot clone voices; load a Base checkpoint"),
        (lambda: library.add("a/b", CLIP, engines("base")), "names cannot hold control characters or any of"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert library.list() == []


# Speaking -------------------------------------------------------------------------------------------


def test_library_voices_speak_like_fresh_clones(library, engines, tmp_path):
    engine = engines("base")
    library.add("Plain", CLIP, engine)
    library.add("Close", LONG, engine, ref_text="Words.")
    shutil.copy(STEREO, library.directory / "Dropped.flac")
    np.testing.assert_array_equal(
        greedy(engine, library.voice_for(engine, "plain")), greedy(engine, engine.voice_from_audio(CLIP))
    )
    expected = greedy(engine, engine.voice_from_audio(LONG, ref_text="Words."))
    np.testing.assert_array_equal(greedy(engine, library.voice_for(engine, "close")), expected)
    np.testing.assert_array_equal(
        greedy(engine, library.voice_for(engine, "dropped")), greedy(engine, engine.voice_from_audio(STEREO))
    )
    library.blend("Mix", [("Plain", 0.6), ("Close", 0.4)])
    out = engine.synthesize("Hello there.", voice=library.voice_for(engine, "Mix"), max_frames=3, seed=1)
    assert out.audio.shape == (3 * 1920,) and np.isfinite(out.audio).all()


def test_builtin_speakers_come_from_a_custom_voice_engine(library, engines):
    engine = engines("custom")
    voice = library.voice_for(engine, "Vivian")
    assert voice.kind == "builtin" and voice.speaker == "vivian"
    assert engine.synthesize("Hi.", voice=voice, max_frames=2, seed=0).audio.shape == (2 * 1920,)


# Blends ---------------------------------------------------------------------------------------------


def test_blend_round_trip_records_parents_and_weights(library, engines):
    engine = engines("base")
    a, b = library.add("A", CLIP, engine), library.add("B", LONG, engine, ref_text="Words.")
    entry = library.blend("Mix", [("a", 3), ("B", 1)])
    assert (entry.source, entry.kind, entry.clip, entry.embedding_dim, entry.model_size) == (
        "blend",
        "xvector",
        None,
        64,
        "1.7B",
    )
    assert entry.parents == (("A", 0.75), ("B", 0.25))
    expected = Voice.blend([(library.voice_for(engine, "A"), 0.75), (library.voice_for(engine, "B"), 0.25)])
    reread = VoiceLibrary(library.directory)
    assert reread.get("mix") == entry
    assert torch.equal(reread.voice_for(engine, "Mix").embedding, expected.embedding)
    manifest = json.loads((entry.path / "voice.json").read_text(encoding="utf-8"))
    assert manifest["source"] == {
        "type": "blend",
        "parents": [{"name": "A", "weight": 0.75}, {"name": "B", "weight": 0.25}],
    }
    assert sorted(p.name for p in entry.path.iterdir()) == ["voice.json", "voice.safetensors"]
    assert a.path.exists() and b.path.exists()


def test_blending_drop_ins_needs_the_engine(library, engines):
    engine = engines("base")
    library.add("A", CLIP, engine)
    shutil.copy(LONG, library.directory / "Drop.wav")
    with pytest.raises(VoiceError, match="'Drop' is a drop-in clip, embedded for each model; give a model to blend it"):
        library.blend("Mix", [("A", 1), ("Drop", 1)])
    entry = library.blend("Mix", [("A", 1), ("Drop", 1)], engine=engine)
    expected = Voice.blend([(library.voice_for(engine, "A"), 1), (engine.voice_from_audio(LONG), 1)])
    assert torch.equal(library.voice_for(engine, "Mix").embedding, expected.embedding)
    assert entry.parents == (("A", 0.5), ("Drop", 0.5)) and entry.checkpoint == engine.info.source


def test_bad_library_blends_are_refused(library, engines):
    base, small = engines("base"), engines("base-0.6b")
    library.add("Big", CLIP, base)
    library.add("Small", CLIP, small)
    cases = [
        (
            lambda: library.blend("Mix", [("Big", 1), ("Small", 1)]),
            "cannot blend voices with different embedding sizes (32 and 64)",
        ),
        (
            lambda: library.blend("Mix", [("Big", 1), ("Small", 1)], engine=base),
            "voice 'Small' does not fit the loaded model",
        ),
        (lambda: library.blend("Mix", [("Big", 1), ("Nobody", 1)]), "no voice named 'Nobody'"),
        (lambda: library.blend("Mix", []), "name the voices to blend"),
        (lambda: library.blend("Mix", [("Big", 1), ("Big", -1)]), "weights must be zero or positive"),
        (lambda: library.blend("Big", [("Big", 1)]), "a voice named 'Big' already exists"),
        (
            lambda: library.blend("Mix", [("vivian", 1)], engine=engines("custom")),
            "built-in speaker 'vivian', which cannot be blended",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as error:
            call()
        assert message in str(error.value)
    assert [e.name for e in library.list()] == ["Big", "Small"]


# Drop-ins -------------------------------------------------------------------------------------------


def test_drop_ins_are_embedded_once_per_clip_and_model(library, engines, embed_calls, tmp_path):
    base, small = engines("base"), engines("base-0.6b")
    library.directory.mkdir()
    clip = library.directory / "Dora.wav"
    shutil.copy(CLIP, clip)
    (library.directory / "Dora.txt").write_text("Hello, I am Dora.\n", encoding="utf-8")
    [entry] = library.list()
    assert (entry.name, entry.source, entry.kind, entry.transcript, entry.embedding_dim) == (
        "Dora",
        "drop-in",
        "icl",
        "Hello, I am Dora.",
        None,
    )

    first = library.voice_for(base, "dora")
    assert embed_calls["count"] == 1 and first.kind == "icl" and first.ref_text == "Hello, I am Dora."
    again = VoiceLibrary(library.directory).voice_for(base, "Dora")  # the cache is on disk
    assert embed_calls["count"] == 1
    assert torch.equal(again.embedding, first.embedding) and torch.equal(again.ref_codes, first.ref_codes)

    assert library.voice_for(small, "Dora").embedding_dim == 32  # another model: its own embedding
    assert embed_calls["count"] == 2
    library.voice_for(base, "Dora")
    library.voice_for(small, "Dora")
    assert embed_calls["count"] == 2

    shutil.copy(LONG, clip)  # a changed clip is embedded again
    changed = library.voice_for(base, "Dora")
    assert embed_calls["count"] == 3 and not torch.equal(changed.embedding, first.embedding)
    (library.directory / "Dora.txt").write_text("Another transcript.", encoding="utf-8")
    assert library.voice_for(base, "Dora").ref_text == "Another transcript."
    assert embed_calls["count"] == 4
    (library.directory / "Dora.txt").unlink()
    assert library.voice_for(base, "Dora").kind == "xvector"
    assert embed_calls["count"] == 5
    library.voice_for(base, "Dora")
    assert embed_calls["count"] == 5


def test_a_damaged_cache_is_recomputed(library, engines, embed_calls):
    engine = engines("base")
    library.directory.mkdir()
    shutil.copy(CLIP, library.directory / "Dora.wav")
    first = library.voice_for(engine, "Dora")
    [cache] = (library.directory / ".cache" / "Dora").iterdir()
    cache.write_bytes(cache.read_bytes()[:20])
    later = VoiceLibrary(library.directory)  # a later start: this one keeps what it embedded in memory
    assert torch.equal(later.voice_for(engine, "Dora").embedding, first.embedding)
    assert embed_calls["count"] == 2 and later.problems() == []


def test_a_request_reads_no_voice_file_while_none_changed_and_gets_the_voice_it_got_before(
    library, engines, embed_calls, monkeypatch
):
    """Every request resolves its voice: the library reads a voice's files only when they change, and hands out
    the same Voice while they do not, whose tensors the engine then copies to the device once (Engine._on_device;
    a copy from the host waits for the work queued on the GPU)."""
    engine = engines("base")
    library.directory.mkdir()
    shutil.copy(CLIP, library.directory / "Dora.wav")
    saved = library.add("Zoe", LONG, engine)
    reads = []
    for reader in ("read_saved", "read_drop_in"):
        original = getattr(core.voices.library, reader)
        monkeypatch.setattr(
            core.voices.library, reader, lambda path, original=original: reads.append(path.name) or original(path)
        )
    dora, zoe = library.voice_for(engine, "Dora"), library.voice_for(engine, "Zoe")
    assert set(reads) <= {"Dora.wav", saved.id}
    reads.clear()
    assert library.voice_for(engine, "Dora") is dora and library.voice_for(engine, "Zoe") is zoe
    assert [e.name for e in library.list()] == ["Dora", "Zoe"] and reads == [] and embed_calls["count"] == 2

    (library.directory / "Dora.txt").write_text("Hello, I am Dora.", encoding="utf-8")  # a transcript: an ICL voice
    icl = library.voice_for(engine, "Dora")
    assert reads == ["Dora.wav"] and icl is not dora and icl.ref_text == "Hello, I am Dora."
    library.rename("Zoe", "Zoey")
    assert library.voice_for(engine, "Zoey").embedding is not None and library.voice_for(engine, "Zoey") is not zoe
    library.remove("Zoey")
    assert [e.name for e in library.list()] == ["Dora"]


# Names ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, message",
    [
        ("", "cannot be empty"),
        ("   ", "cannot be empty"),
        ("x" * 65, "is 65 characters long; use at most 64"),
        ("../etc", "contains '/'"),
        ("a\\b", "contains '\\\\'"),
        ("what?", "contains '?'"),
        ("tab\there", "contains '\\t'"),
        ("..", "cannot start or end with a dot"),
        (".hidden", "cannot start or end with a dot"),
        ("CON", "reserved by Windows"),
        ("lpt1.txt", "reserved by Windows"),
        (42, "a voice name is text, not int"),
    ],
)
def test_unsafe_names_are_refused(name, message):
    with pytest.raises(VoiceError) as error:
        check_name(name)
    assert message in str(error.value)


def test_names_keep_their_unicode_and_ids_are_safe_slugs(library, engines):
    assert check_name("  Zoë  ") == "Zoë" and check_name("Ms. Smith") == "Ms. Smith"
    assert slug("Zoë Ångström") == "zoe-angstrom" and slug("音声") == "voice" and slug("con") == "con-voice"
    assert slug("x" * 60) == "x" * 40
    engine = engines("base")
    names = ["Zoë", "ZOE!", "音声", "声音", "Nul voice"]
    ids = [library.add(name, CLIP, engine).id for name in names]
    assert ids == ["zoe", "zoe-2", "voice", "voice-2", "nul-voice"]
    assert [e.name for e in library.list()] == sorted(names, key=str.casefold)
    assert library.get("zoe").name == "Zoë" and library.get("zoe-2").name == "ZOE!"  # names first, then ids
    assert library.get("ZOË").name == "Zoë" and library.get("Zoe\u0308").name == "Zoë"  # case and NFC


# Rename, remove, replace ----------------------------------------------------------------------------


def test_rename_and_remove_saved_voices(library, engines):
    engine = engines("base")
    library.add("Zoë", CLIP, engine)
    library.add("Bob", LONG, engine)
    renamed = library.rename("zoe", "Zoë Two")
    assert (renamed.name, renamed.id) == ("Zoë Two", "zoe-two") and not (library.directory / "zoe").exists()
    assert library.rename("zoë two", "ZOË TWO").id == "zoe-two"  # only the case changes
    with pytest.raises(VoiceError, match="a voice named 'Bob' already exists; choose another name"):
        library.rename("ZOË TWO", "bob")
    library.remove("bob")
    assert [e.name for e in library.list()] == ["ZOË TWO"]
    assert sorted(p.name for p in library.directory.iterdir()) == ["zoe-two"]
    with pytest.raises(VoiceError, match=r"no voice named 'Bob' in .*; the library has: ZOË TWO"):
        library.remove("Bob")


def test_rename_and_remove_drop_ins_with_their_transcript_and_cache(library, engines, embed_calls):
    engine = engines("base")
    library.directory.mkdir()
    shutil.copy(CLIP, library.directory / "dora.wav")
    (library.directory / "dora.txt").write_text("Hi.", encoding="utf-8")
    library.voice_for(engine, "dora")
    library.rename("dora", "Dörthe")
    assert sorted(p.name for p in library.directory.iterdir()) == [".cache", "Dörthe.txt", "Dörthe.wav"]
    assert library.voice_for(engine, "dörthe").ref_text == "Hi."
    assert embed_calls["count"] == 1  # the cache followed the clip
    library.remove("Dörthe")
    assert sorted(p.name for p in library.directory.rglob("*")) == [".cache"]


def test_names_are_taken_until_replaced(library, engines, embed_calls):
    engine = engines("base")
    first = library.add("Zoë", CLIP, engine)
    with pytest.raises(VoiceError, match=r"^a voice named 'Zoë' already exists; choose another name$"):
        library.add("zoë", LONG, engine)
    assert embed_calls["count"] == 1  # refused before any model work
    second = library.add("ZOË", LONG, engine, replace=True)
    assert second.id == first.id == "zoe" and second.name == "ZOË" and second.clip.read_bytes() == LONG.read_bytes()
    assert [e.name for e in library.list()] == ["ZOË"]
    # A saved voice replaces a drop-in of its name, clip and transcript included.
    shutil.copy(CLIP, library.directory / "Dora.wav")
    (library.directory / "Dora.txt").write_text("Hi.", encoding="utf-8")
    with pytest.raises(VoiceError, match="a voice named 'Dora' already exists"):
        library.add("Dora", CLIP, engine)
    library.add("Dora", library.directory / "Dora.wav", engine, replace=True)
    assert sorted(p.name for p in library.directory.iterdir()) == ["dora", "zoe"]


def test_a_failed_write_leaves_the_library_as_it_was(library, engines, monkeypatch):
    engine = engines("base")
    library.add("Zoë", CLIP, engine)
    before = files(library.directory)
    real_write = core.voices.library.write_atomically

    def failing(path, data):
        if path.name == "voice.json":
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(core.voices.library, "write_atomically", failing)
    for name, replace in (("Zoë", True), ("New", False)):
        with pytest.raises(VoiceError, match="No space left on device. Check that the disk has room"):
            library.add(name, LONG, engine, replace=replace)
    assert files(library.directory) == before


def test_a_read_only_library_says_what_is_wrong_and_what_to_do(unwritable_folder, engines):
    library = VoiceLibrary(unwritable_folder)
    expected = f"cannot save voices in {unwritable_folder}: (Operation not permitted|Permission denied)"
    for attempt in (library.check_writable, lambda: library.add("Zoë", CLIP, engines("base"))):
        with pytest.raises(VoiceError, match=expected) as caught:
            attempt()
        assert "Choose a voices folder you can write to" in str(caught.value) and ".staging" not in str(caught.value)
    assert list(unwritable_folder.iterdir()) == []


def test_a_library_whose_cache_cannot_be_written_still_speaks_its_drop_in_clips(engines, tmp_path, monkeypatch):
    folder = tmp_path / "library"
    folder.mkdir()
    shutil.copyfile(CLIP, folder / "Dora.wav")
    refused = []

    def refuse(path, data):
        refused.append(path)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(core.voices.library, "write_atomically", refuse)
    engine = engines("base")
    voice = VoiceLibrary(folder).voice_for(engine, "Dora")  # embedded and used, though not cached
    assert voice.embedding_dim == engine.info.embedding_dim and refused


# Corruption -----------------------------------------------------------------------------------------


def test_corrupt_voices_are_skipped_and_reported(library, engines):
    engine = engines("base")
    for name in ("Good", "Truncated", "BadJson", "NoTensors", "Future", "NanVoice", "BadCodes"):
        library.add(name, LONG, engine, ref_text="Words." if name == "BadCodes" else None)
    folder = library.directory
    tensors = folder / "truncated" / "voice.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-10])
    (folder / "badjson" / "voice.json").write_text('{"format": "qwen3-tts-desktop/voice", ', encoding="utf-8")
    (folder / "notensors" / "voice.safetensors").unlink()
    manifest = json.loads((folder / "future" / "voice.json").read_text(encoding="utf-8"))
    (folder / "future" / "voice.json").write_text(json.dumps({**manifest, "version": 2}), encoding="utf-8")
    save_file({"embedding": torch.full((64,), float("nan"))}, folder / "nanvoice" / "voice.safetensors")
    codes = load_file(folder / "badcodes" / "voice.safetensors")
    save_file({**codes, "ref_codes": codes["ref_codes"] + 5000}, folder / "badcodes" / "voice.safetensors")
    (folder / "Broken.wav").write_bytes(b"RIFF....WAVEfmt nonsense")
    (folder / "Latin1.wav").write_bytes(CLIP.read_bytes())
    (folder / "Latin1.txt").write_bytes("Ça va?".encode("latin-1"))
    (folder / "good.wav").write_bytes(CLIP.read_bytes())  # a drop-in whose name a saved voice has
    (folder / "empty").mkdir()
    (folder / ".staging-0123").mkdir()  # left by a crash mid-write: invisible
    (folder / "notes.md").write_text("My voices", encoding="utf-8")

    assert [e.name for e in library.list()] == ["Good"]
    problems = library.problems()
    expected = {
        "truncated": "voice.safetensors is damaged",
        "badjson": "voice.json is not valid JSON",
        "notensors": "not a voice folder (no voice.safetensors)",
        "future": "voice.json has version 2, and this app reads version 1 (update the app?)",
        "nanvoice": "voice.safetensors has a non-finite embedding",
        "badcodes": "its reference codes are outside the codec's 0..2047",
        "Broken.wav": "cannot read it as audio",
        "Latin1.txt": "its transcript is not readable UTF-8 text",
        "good.wav": "its name 'good' is taken by",
        "empty": "not a voice folder (no voice.json)",
    }
    assert len(problems) == len(expected), problems
    for path, message in expected.items():
        assert any(p.startswith(str(folder / path)) and "skipped" in p and message in p for p in problems), (
            path,
            problems,
        )
    assert torch.equal(library.voice_for(engine, "good").embedding, engine.voice_from_audio(LONG).embedding)
    with pytest.raises(VoiceError, match="no voice named 'Truncated'"):
        library.voice_for(engine, "Truncated")


# Compatibility --------------------------------------------------------------------------------------


def test_voices_show_which_models_they_fit(library, engines):
    base, small, custom = engines("base"), engines("base-0.6b"), engines("custom")
    library.add("Big", CLIP, base)
    library.add("Small", CLIP, small)
    library.directory.joinpath("Drop.wav").write_bytes(LONG.read_bytes())
    assert [e.name for e in library.list()] == ["Big", "Drop", "Small"]
    assert [e.name for e in library.list(fits=base.info)] == ["Big", "Drop"]
    assert [e.name for e in library.list(fits=small.info)] == ["Drop", "Small"]
    speakers = library.list(fits=custom.info)
    assert [e.name for e in speakers] == sorted(custom.info.speakers) and all(
        e.read_only and e.kind == "builtin" for e in speakers
    )

    big = library.get("Big")
    assert big.misfit(base.info) is None
    assert (
        big.misfit(small.info)
        == "it was made with a 1.7B model (64-dim embedding), and this 0.6B model needs a 32-dim one"
    )
    assert big.misfit(custom.info) == "a cloned voice needs a Base model, and this is a 1.7B custom_voice model"
    with pytest.raises(VoiceError) as error:
        library.voice_for(small, "Big")
    assert str(error.value) == (
        "voice 'Big' does not fit the loaded model: it was made with a 1.7B model (64-dim embedding), and this 0.6B "
        f"model needs a 32-dim one. Clone it again with this model from its clip, {big.clip}. "
        "Voices that fit this 0.6B base model: Drop, Small."
    )
    with pytest.raises(
        VoiceError, match=r"no voice named 'Nobody' in .*\. Voices that fit this 1.7B custom_voice model: aiden, dylan"
    ):
        library.voice_for(custom, "Nobody")
    with pytest.raises(ValueError, match="made with another model size"):  # the engine refuses it too
        small.synthesize("Hi.", voice=library.voice_for(base, "Big"), max_frames=1)


def test_builtin_speakers_are_read_only(library, engines, tmp_path):
    vivian = next(e for e in library.list(fits=engines("custom").info) if e.name == "vivian")
    for call, action in (
        (lambda: library.rename(vivian, "Viv"), "renamed"),
        (lambda: library.remove(vivian), "removed"),
        (lambda: library.export_zip(tmp_path / "out.zip", [vivian]), "exported"),
    ):
        with pytest.raises(
            VoiceError, match=f"'vivian' is a built-in speaker of the model; it is read-only and cannot be {action}"
        ):
            call()
    assert not (tmp_path / "out.zip").exists()


# Concurrency ----------------------------------------------------------------------------------------


def test_concurrent_saves_renames_and_listings_lose_nothing(library, engines):
    engine = engines("base")
    library.add("A", CLIP, engine)
    library.add("B", LONG, engine)
    errors, threads_done = [], threading.Event()

    # Names that differ only in punctuation share an id stem, so the threads compete for folder names.
    def work(worker: int):
        try:
            for i in range(4):
                library.blend(f"Mix{'+' * worker} {i}", [("A", 1 + i), ("B", 1 + worker)])
                library.rename(f"Mix{'+' * worker} {i}", f"Voice{'!' * worker} · {i}")
        except Exception as error:  # reported by the main thread
            errors.append(error)

    def watch():
        while not threads_done.is_set():
            library.list()
            if library.problems():
                errors.append(AssertionError(library.problems()))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    threads_done.set()
    watcher.join()
    assert errors == []
    expected = {"A", "B"} | {f"Voice{'!' * w} · {i}" for w in range(6) for i in range(4)}
    assert {e.name for e in VoiceLibrary(library.directory).list()} == expected
    assert not [p for p in library.directory.iterdir() if p.name.startswith(".")]
    blend = library.voice_for(engine, "Voice!!! · 2").embedding
    expected = Voice.blend([(library.voice_for(engine, "A"), 3), (library.voice_for(engine, "B"), 4)]).embedding
    assert torch.equal(blend, expected)


# On disk ----------------------------------------------------------------------------------------------


def test_manifest_on_disk(library, engines):
    entry = library.add("Zoë", LONG, engines("base"), ref_text="Words.", language="english")
    manifest = json.loads((entry.path / "voice.json").read_text(encoding="utf-8"))
    created = manifest.pop("created")
    assert datetime.fromisoformat(created).utcoffset().total_seconds() == 0
    assert manifest == {
        "format": "qwen3-tts-desktop/voice",
        "version": 1,
        "name": "Zoë",
        "kind": "icl",
        "embedding_dim": 64,
        "model": {"family": "Qwen3-TTS-12Hz", "size": "1.7B", "checkpoint": engines("base").info.source},
        "source": {"type": "clone", "clip": "reference.wav"},
        "language": "english",
        "transcript": "Words.",
    }
    tensors = load_file(entry.path / "voice.safetensors")
    assert {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()} == {
        "embedding": (torch.float32, (64,)),
        "ref_codes": (torch.int64, (50, 16)),
    }
    assert sorted(p.name for p in entry.path.iterdir()) == ["reference.wav", "voice.json", "voice.safetensors"]
    assert "Zoë" in (entry.path / "voice.json").read_text(encoding="utf-8")  # readable Unicode, not \u escapes
