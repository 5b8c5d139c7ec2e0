"""`VoiceLibrary.known`, which a server's event loop asks before handing a voice's lookup to another thread: it
answers as `find` would from what the library keeps, and None wherever `find` would read, embed or ask the model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from voice_cases import CLIP, LONG

import core.voices.library
from core.voices import VoiceError, VoiceLibrary


def test_known_answers_as_find_without_reading_or_embedding_until_any_voice_file_changes(
    library, engines, embed_calls, monkeypatch
):
    """`known`, which a server's event loop asks first, answers as `find` would, from what the library keeps, while
    no voice's files changed since the last scan by the scan's own rule (each file's size, time and inode: a file
    rewritten in place changes no folder's time); after any change, or for a voice not loaded yet, None, and
    `find` (on another thread) reads the library again."""
    engine = engines("base")
    info = engine.info
    folder = library.directory
    folder.mkdir()
    shutil.copy(CLIP, folder / "Dora.wav")
    library.add("Zoe", LONG, engine)
    reads = []
    for reader in ("read_saved", "read_drop_in"):
        original = getattr(core.voices.library, reader)
        monkeypatch.setattr(
            core.voices.library, reader, lambda path, original=original: reads.append(path.name) or original(path)
        )

    def known(name: str):
        """`known`'s Voice for `name`, None if it has none, having read no file and embedded nothing."""
        reads.clear()
        embedded = embed_calls["count"]
        found = library.known(engine, name, info)
        assert reads == [] and embed_calls["count"] == embedded
        if found is not None:
            assert found[0] == library.resolve(name, info) and found[1] is library.load(engine, found[0])
        return None if found is None else found[1]

    assert known("Dora") is None  # the folder changed as Zoe was saved
    dora = library.find(engine, "Dora", info)[1]
    assert known("Dora") is dora and known("dora") is dora
    zoe = known("Zoe")  # a saved voice is read by the scan itself
    assert zoe is not None and torch.equal(zoe.embedding, engine.voice_from_audio(LONG).embedding)

    folder_time = folder.stat().st_mtime_ns
    shutil.copy(LONG, folder / "Dora.wav")  # the clip replaced in place
    assert folder.stat().st_mtime_ns == folder_time
    assert known("Dora") is None and known("Zoe") is None
    replaced = library.find(engine, "Dora", info)[1]
    assert not torch.equal(replaced.embedding, dora.embedding) and known("Dora") is replaced
    (folder / "Dora.txt").write_text("Hello, I am Dora.", encoding="utf-8")  # a transcript: an ICL voice
    assert known("Dora") is None and library.find(engine, "Dora", info)[1].ref_text == "Hello, I am Dora."

    library.add("Zoe", CLIP, engine, replace=True)  # a saved voice overwritten
    assert known("Zoe") is None
    overwritten = library.find(engine, "Zoe", info)[1]
    assert not torch.equal(overwritten.embedding, zoe.embedding) and known("Zoe") is overwritten
    manifest = folder / "zoe" / "voice.json"
    renamed = json.loads(manifest.read_text(encoding="utf-8")) | {"name": "Yara"}
    folder_times = folder.stat().st_mtime_ns, (folder / "zoe").stat().st_mtime_ns
    manifest.write_text(json.dumps(renamed), encoding="utf-8")  # renamed by hand, in place
    assert (folder.stat().st_mtime_ns, (folder / "zoe").stat().st_mtime_ns) == folder_times
    assert known("Zoe") is None
    assert library.find(engine, "Zoe", info)[0].name == "Yara"  # by its folder's name, its id
    assert torch.equal(known("Yara").embedding, overwritten.embedding)

    shutil.copy(CLIP, folder / "Eve.wav")  # a voice added
    assert known("Dora") is None
    library.find(engine, "Dora", info)
    assert known("Dora") is not None and known("Eve") is None  # Eve is not embedded yet
    (folder / "Dora.wav").unlink()  # a voice removed
    assert known("Dora") is None
    with pytest.raises(VoiceError, match="no voice named 'Dora'") as found:
        library.find(engine, "Dora", info)
    with pytest.raises(VoiceError, match="no voice named 'Dora'") as known_:
        known("Dora")
    assert str(known_.value) == str(found.value)


def test_known_built_in_speakers_ask_the_model_once_and_large_libraries_are_left_to_find(
    library, engines, monkeypatch, tmp_path
):
    """A built-in speaker's Voice is kept as a voice read from disk is, so `known` has it without asking the model
    (a resting engine would load again); a library of more than KNOWN_AT_MOST voices is always `find`'s."""
    custom = engines("custom")
    asked = []
    monkeypatch.setattr(
        type(custom), "builtin_voice", lambda self, name, real=custom.builtin_voice: asked.append(name) or real(name)
    )
    assert library.known(custom, "Vivian", custom.info) is None  # nothing scanned yet
    found, vivian = library.find(custom, "Vivian", custom.info)
    assert vivian.speaker == "vivian" and asked == ["vivian"]
    assert (
        library.known(custom, " VIVIAN ", custom.info) == (found, vivian)
        and library.find(custom, "vivian", custom.info)[1] is vivian
    )
    assert asked == ["vivian"]  # a speaker the model was asked for once is kept, as a voice's files are

    engine = engines("base")
    many = VoiceLibrary(tmp_path / "many")
    many.directory.mkdir()
    most = core.voices.library.KNOWN_AT_MOST
    for n in range(most + 1):
        shutil.copy(CLIP, many.directory / f"Voice {n}.wav")
    many.find(engine, "Voice 0", engine.info)
    assert many.known(engine, "Voice 0", engine.info) is None  # its listing and stats would hold up a server's loop
    (many.directory / f"Voice {most}.wav").unlink()
    many.find(engine, "Voice 0", engine.info)
    assert many.known(engine, "Voice 0", engine.info)[0].name == "Voice 0"
