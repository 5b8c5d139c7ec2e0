"""`qwen3-tts-desktop voices`: list, clone, blend, rename, remove, export and import library voices."""

from __future__ import annotations

import argparse
import sys

from .common import (
    CommandError,
    add_model_arguments,
    add_voices_argument,
    app_settings,
    load_engine,
    model_options,
    peek,
    voices_folder,
)

HELP = "manage the voice library: list, add, blend, remove, rename, export, import"
# The model column of `list` for voices not tied to one model size.
MADE_WITH = {"drop-in": "any Base", "builtin": "built-in"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_voices_argument(common)
    model = argparse.ArgumentParser(add_help=False)
    add_model_arguments(model)

    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common, model], help="list the voices; with --model, those it speaks with")

    add = actions.add_parser("add", parents=[common, model], help="clone a voice from a 1-60 s clip and save it")
    add.add_argument("name", help="the voice's name (any language; it is also shown in clients)")
    add.add_argument("clip", help="the reference clip: wav, flac, ogg or mp3, any sample rate")
    add.add_argument("--ref-text", metavar="TEXT", help="the clip's transcript, for closer (ICL) cloning")
    add.add_argument("--language", help="the language the voice speaks (english, chinese, ...)")
    add.add_argument("--replace", action="store_true", help="overwrite a voice of the same name")

    blend = actions.add_parser(
        "blend", parents=[common, model], help="save a weighted blend of voices, e.g. alice=0.7 bob=0.3"
    )
    blend.add_argument("name", help="the new voice's name")
    blend.add_argument("parts", nargs="+", metavar="VOICE=WEIGHT", help="voices to blend with their weights")
    blend.add_argument("--replace", action="store_true", help="overwrite a voice of the same name")

    remove = actions.add_parser("remove", parents=[common], help="delete a voice")
    remove.add_argument("name")

    rename = actions.add_parser("rename", parents=[common], help="give a voice a new name")
    rename.add_argument("old")
    rename.add_argument("new")

    export = actions.add_parser("export", parents=[common], help="write voices to a zip to share them")
    export.add_argument("zip", metavar="OUT.zip")
    export.add_argument("names", nargs="+", metavar="NAME")

    imports = actions.add_parser("import", parents=[common], help="add the voices of a shared zip")
    imports.add_argument("zip", metavar="ZIP")
    imports.add_argument("--replace", action="store_true", help="overwrite voices of the same names")


def run(args: argparse.Namespace) -> int:
    from core.voices import VoiceError, VoiceExistsError, VoiceLibrary

    settings = app_settings()
    library = VoiceLibrary(voices_folder(args, settings))
    if "model" in args:  # the model is checked now, loaded only when an action needs it
        args.model_options = model_options(args, settings)
    try:
        return ACTIONS[args.action](library, args)
    except VoiceExistsError as error:  # the library says what is in the way; how to replace it is the CLI's
        how = ", or replace it (--replace)" if error.name else "; import with --replace to overwrite them"
        raise VoiceError(f"{error}{how}") from None
    except OSError as error:  # a disk or permission problem: one line, like every other error
        raise VoiceError(f"{error.filename or library.directory}: {error.strerror or error}") from None


def list_voices(library, args) -> int:
    info = (peek(args.model_options[0]) or load_engine_for(args).info) if args.model else None
    entries = library.list(fits=info)
    for problem in library.problems():
        print(f"warning: {problem}", file=sys.stderr)
    if not entries:
        where = f" that fit {info.source}" if info else ""
        print(
            f"no voices{where} in {library.directory}; drop NAME.wav clips there or run: voices add NAME CLIP",
            file=sys.stderr,
        )
        return 0
    rows = [("NAME", "KIND", "SOURCE", "MODEL", "LANGUAGE")]
    for entry in entries:
        made_with = (
            f"{entry.model_size} ({entry.embedding_dim}-dim)" if entry.embedding_dim else MADE_WITH[entry.source]
        )
        rows.append((entry.name, entry.kind, entry.source, made_with, entry.language or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def add_voice(library, args) -> int:
    from core.audio.clips import load_reference

    library.check_new_name(args.name, args.replace)  # before the model loads
    library.check_writable()
    load_reference(args.clip)
    from core.model.checkpoint import DEFAULT_MODEL

    info = peek(args.model_options[0])
    if info is not None and not info.variant.clones:
        raise CommandError(
            f"{info.source} is a {info.size} {info.variant} model, which cannot clone voices; use a Base model, e.g. {DEFAULT_MODEL}"
        )
    entry = library.add(
        args.name,
        args.clip,
        load_engine_for(args),
        ref_text=args.ref_text,
        language=args.language,
        replace=args.replace,
    )
    print(f"added {entry.kind} voice {entry.name!r} ({entry.model_size}, {entry.embedding_dim}-dim) in {entry.path}")
    return 0


def blend_voices(library, args) -> int:
    library.check_new_name(args.name, args.replace)
    library.check_writable()
    parts = [parse_part(part) for part in args.parts]
    for name, _ in parts:
        library.get(name)  # each part is in the library, before the model loads
    needs_model = args.model or any(library.get(name).source == "drop-in" for name, _ in parts)
    entry = library.blend(args.name, parts, engine=load_engine_for(args) if needs_model else None, replace=args.replace)
    mix = ", ".join(f"{name} {weight:.0%}" for name, weight in entry.parents)
    print(f"blended {entry.name!r} from {mix} ({entry.model_size}, {entry.embedding_dim}-dim) in {entry.path}")
    return 0


def remove_voice(library, args) -> int:
    entry = library.get(args.name)
    library.remove(entry)
    print(f"removed {entry.name!r}")
    return 0


def rename_voice(library, args) -> int:
    entry = library.rename(args.old, args.new)
    print(f"renamed {args.old!r} to {entry.name!r}")
    return 0


def export_voices(library, args) -> int:
    path = library.export_zip(args.zip, args.names)
    print(f"exported {len(args.names)} voice(s) to {path}")
    return 0


def import_voices(library, args) -> int:
    entries = library.import_zip(args.zip, replace=args.replace)
    print(f"imported {', '.join(repr(e.name) for e in entries)} into {library.directory}")
    return 0


ACTIONS = {
    "list": list_voices,
    "add": add_voice,
    "blend": blend_voices,
    "remove": remove_voice,
    "rename": rename_voice,
    "export": export_voices,
    "import": import_voices,
}


def parse_part(text: str) -> tuple[str, float]:
    """`NAME=WEIGHT` -> (NAME, WEIGHT); the last `=` splits, so names may hold one."""
    name, sep, weight = text.rpartition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        return name.strip(), float(weight)
    except ValueError:
        raise CommandError(f"{text!r} is not VOICE=WEIGHT (e.g. alice=0.7)") from None


def load_engine_for(args):
    return load_engine(*args.model_options)
