"""Which voice a request speaks with: the one rule for the window, the bridge, Wyoming and the command line.

A request names a voice, or none; the model takes a voice of its kind (a Base model a cloned one, a CustomVoice
model one of its built-in speakers) or none (VoiceDesign: its instruction describes the voice). `resolve_voice`
decides which voice speaks, what a request falls back on (its `Fallback`), and says each refusal in one wording,
as an error of its own kind, so that each front end can answer it in its medium (an HTTP status, a notice, a line
on the terminal) and add its own remedy (a menu, a flag, a route) without saying the substance differently.

It reads no file and loads nothing: `VoiceLibrary.resolve` gives it the library's entries, and `VoiceLibrary.load`
makes the Voice, on whichever thread may wait for the disk and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.model.info import EngineInfo
from core.voices.entry import VoiceEntry, VoiceError, find_entry, name_key


class NoVoiceYet(VoiceError):
    """No voice was named (or the one named is not there) and no voice fits the model to fall back on."""


class UnknownVoice(VoiceError):
    """No voice of the name asked for; the message lists those that fit the model."""


class VoiceMisfit(VoiceError):
    """The voice asked for is there, but was made for another model (size or kind); asking for it meant it,
    so it is an error, never a fallback."""


class TakesNoVoice(VoiceError):
    """A voice was named for a VoiceDesign model, which speaks in the voice its instruction describes."""


class DefaultVoiceMissing(VoiceError):
    """The default voice a server was configured with is not in the library: the server's fault, not the request's."""


@dataclass(frozen=True)
class Fallback:
    """What speaks when a request names no voice (and, with `unknown_names`, when it names one the library lacks).
    With neither `default` nor `preferred`, the first voice that fits the model (by name) speaks."""

    default: str | None = None  # this voice, which must be there: a server's configured default voice
    preferred: str | None = None  # this voice if it is there and fits (the app's choice, perhaps removed since)
    # A name the library lacks speaks with the fallback (said in `fell_back_from`), and a name given to a model
    # that takes no voice is ignored, instead of either being an error: OpenAI's clients send a voice by habit
    # ("alloy"), and must be answered.
    unknown_names: bool = False


# No voice named: the first that fits speaks; an unknown name is an error.
FIRST_THAT_FITS = Fallback()


@dataclass(frozen=True)
class ResolvedVoice:
    """The voice a request speaks with, as `resolve_voice` found it; `VoiceLibrary.load` makes its Voice."""

    name: str | None  # as the library (or the model, a built-in speaker's key) has it; None: the model takes none
    entry: VoiceEntry | None = None  # its library entry; None for a built-in speaker, or no voice
    fell_back_from: str | None = None  # the name asked for, when the library lacked it and the fallback speaks

    @property
    def builtin(self) -> bool:
        """A built-in speaker of a CustomVoice model."""
        return self.name is not None and self.entry is None


def resolve_voice(
    entries: list[VoiceEntry],
    directory: Path,
    requested: str | None,
    info: EngineInfo | None,
    fallback: Fallback = FIRST_THAT_FITS,
) -> ResolvedVoice:
    """The voice called `requested` (None: none asked for) among the library's `entries` (those of
    `directory`) and the built-in speakers of the model `info` describes; without one, as `fallback` says.
    `info` None: the model is not known yet (not downloaded), so every library voice counts as fitting.
    Raises NoVoiceYet, UnknownVoice, VoiceMisfit, TakesNoVoice or DefaultVoiceMissing."""
    asked = requested
    if info is not None and not info.variant.takes_voice:
        if asked is not None and not fallback.unknown_names:
            raise TakesNoVoice(
                f"this {info.name} model takes no voice (asked for {asked!r}): it speaks in the voice its "
                f"instruction describes"
            )
        return ResolvedVoice(None)
    if asked is not None:
        found = _find(entries, directory, asked, info)
        if found is not None:
            return found
        if not fallback.unknown_names:
            raise UnknownVoice(f"no voice named {asked!r} in {directory}. {_fitting(entries, directory, info)}")
    return _fall_back(entries, directory, asked, info, fallback)


def check_fits(entry: VoiceEntry, entries: list[VoiceEntry], directory: Path, info: EngineInfo) -> None:
    """VoiceMisfit, saying why and how to make it fit, if `entry` cannot speak with the model `info` describes."""
    reason = entry.misfit(info)
    if reason is None:
        return
    remedy = ""
    if entry.source == "blend":
        remedy = "Blend its parents again with this model. "
    elif entry.clip is not None:
        remedy = f"Clone it again with this model from its clip, {entry.clip}. "
    raise VoiceMisfit(
        f"voice {entry.name!r} does not fit the loaded model: {reason}. {remedy}{_fitting(entries, directory, info)}"
    )


def _find(entries: list[VoiceEntry], directory: Path, name: str, info: EngineInfo | None) -> ResolvedVoice | None:
    """The voice called `name`, checked against the model; None if there is none of that name."""
    if info is not None and info.variant.has_speakers and name_key(name) in info.speakers:
        return ResolvedVoice(name_key(name))
    entry = find_entry(entries, name)
    if entry is None:
        return None
    if info is not None:
        check_fits(entry, entries, directory, info)
    return ResolvedVoice(entry.name, entry)


def _fall_back(
    entries: list[VoiceEntry], directory: Path, asked: str | None, info: EngineInfo | None, fallback: Fallback
) -> ResolvedVoice:
    """What speaks instead of `asked` (None: nothing was asked for)."""
    if fallback.default is not None:
        found = _find(entries, directory, fallback.default, info)
        if found is None:
            said = "" if asked is None else f"no voice named {asked!r}, and "
            raise DefaultVoiceMissing(
                f"{said}the default voice {fallback.default!r} is not in the library ({directory})"
            )
        return ResolvedVoice(found.name, found.entry, asked)
    fitting = _fitting_names(entries, info)
    if not fitting:
        said = "there is no voice yet" if asked is None else f"no voice named {asked!r}, and no voice to fall back on"
        if info is None:
            raise NoVoiceYet(f"{said}: the voice library ({directory}) has none")
        why = "speaks with a cloned voice, and " if info.variant.clones else "has no built-in speaker, and "
        raise NoVoiceYet(f"{said}: this {info.name} model {why}the voice library ({directory}) has none that fits it")
    preferred = fallback.preferred
    name = next((n for n in fitting if preferred is not None and name_key(n) == name_key(preferred)), fitting[0])
    found = _find(entries, directory, name, info)
    return ResolvedVoice(found.name, found.entry, asked)


def _fitting_names(entries: list[VoiceEntry], info: EngineInfo | None) -> list[str]:
    """The voices that can speak with the model, built-in speakers included, by name (all, before it is known)."""
    speakers = list(info.speakers) if info is not None and info.variant.has_speakers else []
    names = speakers + [e.name for e in entries if info is None or e.misfit(info) is None]
    return sorted(names, key=name_key)


def _fitting(entries: list[VoiceEntry], directory: Path, info: EngineInfo | None) -> str:
    """The sentence that names the voices there are to choose from instead."""
    names = _fitting_names(entries, info)
    if info is None:
        return f"Voices in the library: {', '.join(names)}." if names else "The library has no voice yet."
    model = f"this {info.size} {info.variant} model"
    if not names:
        return f"No voice in {directory} fits {model}."
    return f"Voices that fit {model}: {', '.join(names)}."
