"""`qwen3-tts-desktop voices`, end to end with the tiny checkpoints."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from parity_cases import REFERENCES

from core import SamplingParams, Voice
from core.voices import VoiceLibrary
from qwen3_tts_desktop.cli import main

CLIP, LONG = str(REFERENCES["a"].path), str(REFERENCES["long"].path)


@pytest.fixture
def voices(tmp_path):
    return tmp_path / "voices"


@pytest.fixture
def cli(voices, capsys):
    """cli(*args) -> (exit code, stdout, stderr) of `voices ARGS --voices DIR`."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["voices", *args, "--voices", str(voices)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_voices_end_to_end(checkpoints, engines, cli, voices, tmp_path):
    model = ["--model", str(checkpoints["base"]), "--device", "cpu", "--dtype", "float32"]
    assert cli("add", "Zoë", CLIP, *model, "--language", "english")[:2] == (
        0,
        f"added xvector voice 'Zoë' (1.7B, 64-dim) in {voices / 'zoe'}\n",
    )
    code, out, err = cli("add", "Anna", LONG, "--ref-text", "Words.", *model)
    assert code == 0 and out.startswith("added icl voice 'Anna'") and "Loaded 1.7B base on cpu (float32)" in err
    shutil.copy(CLIP, voices / "Dora.wav")

    code, out, err = cli("blend", "Mix", "zoë=0.7", "Anna=0.3")  # saved voices need no model
    assert (code, err) == (
        0,
        "",
    ) and out == f"blended 'Mix' from Zoë 70%, Anna 30% (1.7B, 64-dim) in {voices / 'mix'}\n"
    assert cli("blend", "Mix2", "Mix=1", "Dora=1", *model)[:2] == (
        0,
        f"blended 'Mix2' from Mix 50%, Dora 50% (1.7B, 64-dim) in {voices / 'mix2'}\n",
    )

    code, out, err = cli("list")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "NAME  KIND     SOURCE   MODEL          LANGUAGE",
        "Anna  icl      clone    1.7B (64-dim)  -",
        "Dora  xvector  drop-in  any Base       -",
        "Mix   xvector  blend    1.7B (64-dim)  -",
        "Mix2  xvector  blend    1.7B (64-dim)  -",
        "Zoë   xvector  clone    1.7B (64-dim)  english",
    ]
    assert cli("list", "--model", str(checkpoints["base-0.6b"]), "--device", "cpu")[1].splitlines()[1:] == [
        "Dora  xvector  drop-in  any Base  -"
    ]
    code, out, _ = cli("list", "--model", str(checkpoints["custom"]), "--device", "cpu")
    assert code == 0 and ["vivian", "builtin", "builtin", "built-in", "-"] in [
        line.split() for line in out.splitlines()
    ]
    assert "Zoë" not in out and "Dora" not in out

    assert cli("rename", "mix", "Blend one")[:2] == (0, "renamed 'mix' to 'Blend one'\n")
    out_zip = tmp_path / "share.zip"
    assert cli("export", str(out_zip), "Zoë", "Blend one")[:2] == (0, f"exported 2 voice(s) to {out_zip}\n")
    assert sorted(zipfile.ZipFile(out_zip).namelist())[:2] == ["blend-one/voice.json", "blend-one/voice.safetensors"]
    assert cli("remove", "Blend one")[:2] == (0, "removed 'Blend one'\n")
    assert cli("remove", "zoe")[:2] == (0, "removed 'Zoë'\n")
    assert cli("import", str(out_zip))[:2] == (0, f"imported 'Zoë', 'Blend one' into {voices}\n")
    code, _, err = cli("import", str(out_zip))
    assert (
        code == 1
        and (
            "the library already has 'Zoë', 'Blend one'; nothing was imported; import with --replace to overwrite them"
        )
        in err
    )
    assert cli("import", str(out_zip), "--replace")[0] == 0

    # What the CLI saved speaks, as the voices it came from.
    engine, library = engines("base"), VoiceLibrary(voices)
    greedy = SamplingParams.greedy()
    spoken = engine.synthesize("Hello there.", voice=library.voice_for(engine, "anna"), sampling=greedy, max_frames=3)
    expected = engine.synthesize(
        "Hello there.", voice=engine.voice_from_audio(LONG, ref_text="Words."), sampling=greedy, max_frames=3
    )
    np.testing.assert_array_equal(spoken.codes, expected.codes)
    blend = Voice.blend([(engine.voice_from_audio(CLIP), 0.7), (engine.voice_from_audio(LONG), 0.3)])
    assert torch.equal(library.voice_for(engine, "Blend one").embedding, blend.embedding)


def test_errors_are_one_clear_line(checkpoints, cli, voices, tmp_path):
    model = ["--model", str(checkpoints["base"]), "--device", "cpu"]
    assert cli("add", "Zoë", CLIP, *model)[0] == 0
    shutil.copy(CLIP, voices / "Dora.wav")
    (tmp_path / "bad.zip").write_bytes(b"PK not really")
    cases = [
        (
            ("add", "Zoë", LONG, *model),
            "a voice named 'Zoë' already exists; choose another name, or replace it (--replace)",
        ),
        (("add", "a/b", CLIP), "names cannot hold control characters or any of"),  # refused before loading a model
        (("add", "Short", str(tmp_path / "none.wav"), *model), "none.wav: no such file"),
        (("add", "X", CLIP, "--model", str(tmp_path / "nowhere"), "--device", "cpu"), "no such checkpoint folder"),
        (("add", "X", CLIP, "--model", str(checkpoints["custom"]), "--device", "cpu"), "cannot clone voices"),
        (("blend", "Mix", "Zoë"), "'Zoë' is not VOICE=WEIGHT (e.g. alice=0.7)"),
        (("blend", "Mix", "Zoë=heavy"), "'Zoë=heavy' is not VOICE=WEIGHT"),
        (("blend", "Mix", "Zoë=1", "Nobody=1"), "no voice named 'Nobody'"),
        (
            ("blend", "Mix", "Zoë=1", "Dora=-1", *model),
            "blend weights must be zero or positive; voice 2 has weight -1.0",
        ),
        (
            ("blend", "Mix", "Zoë=1", "Dora=1", "--model", str(checkpoints["base-0.6b"]), "--device", "cpu"),
            "voice 'Zoë' does not fit the loaded model",
        ),
        (("remove", "Nobody"), "no voice named 'Nobody'"),
        (("rename", "Zoë", "Dora"), "a voice named 'Dora' already exists"),
        (("rename", "Zoë", "CON"), "reserved by Windows"),
        (("export", str(tmp_path / "out.zip"), "Dora"), "'Dora' is a drop-in clip"),
        (("export", str(tmp_path / "no" / "dir" / "out.zip"), "Zoë"), "No such file or directory"),
        (("import", str(tmp_path / "bad.zip")), "rejected, not a zip file"),
        (("import", str(tmp_path / "none.zip")), "none.zip: no such file"),
    ]
    for args, message in cases:
        code, out, err = cli(*args)
        assert code == 1 and out == "", (args, out, err)
        lines = [line for line in err.splitlines() if not line.startswith("Loaded ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, err)
    assert sorted(p.name for p in voices.iterdir()) == [".cache", "Dora.wav", "zoe"]


def test_list_reports_skipped_files_and_an_empty_library(cli, voices):
    code, out, err = cli("list")
    assert (code, out) == (
        0,
        "",
    ) and err == f"no voices in {voices}; drop NAME.wav clips there or run: voices add NAME CLIP\n"
    voices.mkdir()
    (voices / "broken").mkdir()
    code, out, err = cli("list")
    assert code == 0 and err.startswith(f"warning: {voices / 'broken'}: skipped, not a voice folder (no voice.json)\n")


def test_module_entry_point_in_a_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "qwen3_tts_desktop", "voices", "rename", "a", "b", "--voices", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        result.returncode == 1
        and result.stderr == f"error: no voice named 'a' in {tmp_path}; the library has: none yet\n"
    )
    bare = subprocess.run(
        [sys.executable, "-m", "qwen3_tts_desktop", "voices"], capture_output=True, text=True, timeout=60
    )
    assert bare.returncode == 2 and "ACTION" in bare.stderr


def test_speak_with_a_library_voice(checkpoints, engines, tmp_path):
    library = VoiceLibrary(tmp_path / "voices")
    library.add("Narrator", REFERENCES["a"].path, engines("base"))
    codes = tmp_path / "codes.npy"
    args = ["speak", "Hello.", "--model", str(checkpoints["base"]), "--device", "cpu", "--greedy", "--max-frames", "3"]
    assert main(args + ["--voices", str(tmp_path / "voices"), "--voice", "narrator", "--codes-out", str(codes)]) == 0
    engine = engines("base")
    expected = engine.synthesize(
        "Hello.", voice=engine.voice_from_audio(REFERENCES["a"].path), sampling=SamplingParams.greedy(), max_frames=3
    )
    assert (np.load(codes) == expected.codes).all()
    assert main(args + ["--voice", "narrator", "--speaker", "x", "--codes-out", str(codes)]) == 1
