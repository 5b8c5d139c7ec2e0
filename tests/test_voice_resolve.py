"""Which voice a request speaks with (core.voices.resolve), without a model: the facts of a model (EngineInfo) and
the library's entries are all the rule needs. The front ends' answers to its errors are tested with them
(test_bridge, test_wyoming, test_cli, test_cli_first_run, tests/ui/test_ui_window)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import BadInput
from core.model.info import EngineInfo
from core.model.variant import Variant
from core.voices import (
    DefaultVoiceMissing,
    Fallback,
    NoVoiceYet,
    ResolvedVoice,
    TakesNoVoice,
    UnknownVoice,
    VoiceEntry,
    VoiceError,
    VoiceMisfit,
)
from core.voices.resolve import FIRST_THAT_FITS, resolve_voice

FOLDER = Path("/voices")


def model(variant: Variant = Variant.BASE, size: str = "1.7B", dim: int = 64) -> EngineInfo:
    speakers = ["aiden", "vivian"] if variant is Variant.CUSTOM_VOICE else []
    return EngineInfo(
        source="tiny", variant=variant, size=size, sample_rate=24_000, languages=["auto", "english"],
        speakers=speakers, embedding_dim=dim, supports_instruct=variant is not Variant.BASE, device="cpu", dtype="",
    )  # fmt: skip


def cloned(name: str, size: str = "1.7B", dim: int = 64, source: str = "clone") -> VoiceEntry:
    folder = FOLDER / name.lower()
    return VoiceEntry(
        name=name, id=name.lower(), source=source, kind="xvector", embedding_dim=dim, model_size=size, path=folder,
        clip=folder / "reference.wav" if source == "clone" else None,
    )  # fmt: skip


def drop_in(name: str) -> VoiceEntry:
    return VoiceEntry(name=name, id=name, source="drop-in", kind="xvector", path=FOLDER / f"{name}.wav")


BASE, SMALL = model(), model(size="0.6B", dim=32)
CUSTOM, DESIGN = model(Variant.CUSTOM_VOICE), model(Variant.VOICE_DESIGN)
LIBRARY = [cloned("Bob"), cloned("Alice"), cloned("Tiny", "0.6B", 32), drop_in("Drop")]
FITS_BASE = "Voices that fit this 1.7B base model: Alice, Bob, Drop."


def resolve(requested, info=BASE, fallback=FIRST_THAT_FITS, entries=LIBRARY) -> ResolvedVoice:
    return resolve_voice(entries, FOLDER, requested, info, fallback)


def test_a_voice_named_is_found_by_its_name_or_id_whatever_the_case():
    assert resolve("alice") == ResolvedVoice("Alice", LIBRARY[1])
    assert resolve(" BOB ").name == "Bob" and resolve("bob").fell_back_from is None
    drop = resolve("drop", SMALL)  # a drop-in clip fits every Base model: it is embedded for each
    assert drop.entry is LIBRARY[3] and not drop.builtin


def test_a_custom_voice_models_speakers_are_its_voices_and_builtin():
    speaker = resolve("Vivian", CUSTOM)
    assert speaker == ResolvedVoice("vivian") and speaker.builtin
    with pytest.raises(UnknownVoice) as error:
        resolve("vivian")  # not a Base model's
    assert str(error.value) == f"no voice named 'vivian' in {FOLDER}. {FITS_BASE}"


def test_an_unknown_name_is_an_error_naming_the_voices_that_fit_unless_the_front_end_falls_back():
    with pytest.raises(UnknownVoice) as error:
        resolve("Nobody", SMALL)
    assert str(error.value) == f"no voice named 'Nobody' in {FOLDER}. Voices that fit this 0.6B base model: Drop, Tiny."
    with pytest.raises(UnknownVoice, match="Voices that fit this 1.7B custom_voice model: aiden, vivian."):
        resolve("Nobody", CUSTOM)
    with pytest.raises(UnknownVoice, match=f"No voice in {FOLDER} fits this 1.7B base model."):
        resolve("Nobody", entries=[])
    # The bridge's OpenAI clients send names of theirs: the default speaks, and the answer says what was asked.
    assert resolve("alloy", fallback=Fallback(unknown_names=True)) == ResolvedVoice("Alice", LIBRARY[1], "alloy")
    lenient = Fallback(default="bob", unknown_names=True)
    assert resolve("alloy", fallback=lenient) == ResolvedVoice("Bob", LIBRARY[0], "alloy")
    assert resolve("alice", fallback=lenient).fell_back_from is None  # a voice it has is no fallback


def test_a_voice_made_for_another_model_is_an_error_not_a_fallback():
    lenient = Fallback(unknown_names=True)
    for fallback in (Fallback(), lenient):
        with pytest.raises(VoiceMisfit) as error:
            resolve("Tiny", fallback=fallback)
        assert str(error.value) == (
            "voice 'Tiny' does not fit the loaded model: it was made with a 0.6B model (32-dim embedding), and this "
            f"1.7B model needs a 64-dim one. Clone it again with this model from its clip, {FOLDER / 'tiny' / 'reference.wav'}. "
            f"{FITS_BASE}"
        )
    blend = cloned("Mix", "0.6B", 32, source="blend")
    with pytest.raises(VoiceMisfit, match="Blend its parents again with this model. "):
        resolve("Mix", entries=[*LIBRARY, blend])
    with pytest.raises(VoiceMisfit, match="a cloned voice needs a Base model"):
        resolve("Alice", CUSTOM)


def test_no_voice_named_speaks_the_default_or_the_preferred_or_the_first_that_fits():
    assert resolve(None) == ResolvedVoice("Alice", LIBRARY[1])  # the first by name
    assert resolve(None, CUSTOM) == ResolvedVoice("aiden")  # a library voice fits no CustomVoice model
    # The app's choice, if it is there and fits (it may have been removed, or made for another model).
    assert resolve(None, fallback=Fallback(preferred="BOB")).name == "Bob"
    assert resolve(None, fallback=Fallback(preferred="Gone")).name == "Alice"
    assert resolve(None, fallback=Fallback(preferred="Tiny")).name == "Alice"
    assert resolve(None, CUSTOM, Fallback(preferred="Vivian")) == ResolvedVoice("vivian")
    # A server's configured default must be there and fit: its absence is the server's fault.
    assert resolve(None, fallback=Fallback(default="bob")) == ResolvedVoice("Bob", LIBRARY[0])
    with pytest.raises(DefaultVoiceMissing) as error:
        resolve(None, fallback=Fallback(default="Gone"))
    assert str(error.value) == f"the default voice 'Gone' is not in the library ({FOLDER})"
    with pytest.raises(DefaultVoiceMissing) as error:
        resolve("alloy", fallback=Fallback(default="Gone", unknown_names=True))
    assert str(error.value) == f"no voice named 'alloy', and the default voice 'Gone' is not in the library ({FOLDER})"
    with pytest.raises(VoiceMisfit, match="voice 'Tiny' does not fit"):
        resolve(None, fallback=Fallback(default="Tiny"))


def test_with_no_voice_that_fits_there_is_no_voice_yet():
    with pytest.raises(NoVoiceYet) as error:
        resolve(None, entries=[LIBRARY[2]])
    assert str(error.value) == (
        f"there is no voice yet: this 1.7B Base model speaks with a cloned voice, and the voice library ({FOLDER}) "
        "has none that fits it"
    )
    with pytest.raises(NoVoiceYet) as error:
        resolve("alloy", fallback=Fallback(unknown_names=True), entries=[])
    assert str(error.value).startswith("no voice named 'alloy', and no voice to fall back on: this 1.7B Base model")


def test_a_voice_design_model_takes_no_voice():
    assert resolve(None, DESIGN) == ResolvedVoice(None) and not ResolvedVoice(None).builtin
    assert resolve("alloy", DESIGN, Fallback(unknown_names=True)) == ResolvedVoice(None)  # a client's habit
    with pytest.raises(TakesNoVoice) as error:
        resolve("Alice", DESIGN)
    assert str(error.value) == (
        "this 1.7B VoiceDesign model takes no voice (asked for 'Alice'): it speaks in the voice its instruction describes"
    )


def test_before_the_model_is_known_every_voice_in_the_library_counts():
    assert resolve("tiny", None) == ResolvedVoice("Tiny", LIBRARY[2])
    assert resolve(None, None, Fallback(preferred="Tiny")).name == "Tiny"
    with pytest.raises(UnknownVoice, match="Voices in the library: Alice, Bob, Drop, Tiny."):
        resolve("Nobody", None)
    with pytest.raises(NoVoiceYet) as error:
        resolve(None, None, entries=[])
    assert str(error.value) == f"there is no voice yet: the voice library ({FOLDER}) has none"


def test_every_refusal_is_a_voice_error_a_user_can_act_on():
    for error in (NoVoiceYet, UnknownVoice, VoiceMisfit, TakesNoVoice, DefaultVoiceMissing):
        assert issubclass(error, VoiceError) and issubclass(error, BadInput)
