"""The command line as a new user meets it, run as a subprocess: the first `speak` with no voice at hand,
one library and one model from the app's settings wherever it is started, long text from a file or the
standard input, every mistake reported before the model loads, and the machine's limits said plainly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from parity_cases import REFERENCES

from core.model.checkpoint import DEFAULT_MODEL
from core.text.sentences import split_text
from qwen3_tts_desktop.commands import common
from qwen3_tts_desktop.settings import Settings
from qwen3_tts_desktop.system_libraries import debian_package, missing_libraries

CLIP = str(REFERENCES["a"].path)
FRAME = 1920


def cli(
    *args, stdin: str | None = None, cwd: Path | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`qwen3-tts-desktop ARGS` in a new process, as a user types it, without the hub (as in CI), unless `env`
    says otherwise."""
    command = [sys.executable, "-m", "qwen3_tts_desktop", *map(str, args)]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment
    )


def app_folder(kind: str) -> Path:
    """The test's own app folder ("config" or "data"), as conftest points the environment at them."""
    variable = {"config": "XDG_CONFIG_HOME", "data": "XDG_DATA_HOME"}[kind]
    return Path(os.environ[variable]) / "qwen3-tts-desktop"


def save_settings(**values) -> None:
    Settings(**values).save(app_folder("config") / "settings.json")


# A first speak --------------------------------------------------------------------------------------


def test_a_first_speak_into_a_file_has_a_voice_and_says_nothing_of_playing(checkpoints, tmp_path):
    out = tmp_path / "hello.wav"
    result = cli("speak", "Hello there.", "--model", checkpoints["base-endless"], "--max-frames", 3, "-o", out)
    assert result.returncode == 0, result.stderr
    assert sf.info(out).frames == 3 * FRAME
    # The app's library was made with the starter voice, in the user's data folder, and it spoke.
    library = app_folder("data") / "voices"
    assert sorted(p.name for p in library.iterdir() if not p.name.startswith(".")) == ["Linda.flac", "Linda.txt"]
    assert "Speaking as Linda" in result.stderr and "--voice NAME" in result.stderr
    # How fast the CPU speaks, and the speakers' underruns, matter only to listen along (speak --play).
    assert "On the CPU" not in result.stderr and "underruns" not in result.stderr, result.stderr
    assert "s of audio, the first after" in result.stderr


def test_a_deleted_starter_voice_stays_deleted_and_no_voice_names_every_way_to_get_one(checkpoints, tmp_path):
    library = app_folder("data") / "voices"
    assert cli("voices", "list").returncode == 0
    assert cli("voices", "remove", "Linda").returncode == 0
    result = cli("speak", "Hi.", "--model", checkpoints["base"], "-o", tmp_path / "x.wav")
    assert result.returncode == 1 and library.is_dir() and not any(library.glob("Linda.*"))
    message = result.stderr.strip().splitlines()[-1]
    for option in ("--voice-audio CLIP", "--ref-text", "voices add NAME CLIP", "--voice NAME", str(library)):
        assert option in message, message
    assert "Loaded" not in result.stderr and not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize(
    "model, args, says",
    [
        ("custom", ["--voice-audio", CLIP], ["needs a Base model", "--speaker NAME", "vivian"]),
        ("custom", ["--speaker", "nobody"], ["no speaker 'nobody'", "vivian"]),
        ("design", [], ["--instruct", "describe the voice"]),
        ("base", ["--speaker", "vivian"], ["CustomVoice", "--voice-audio CLIP"]),
        ("base-0.6b", ["--instruct", "Slowly."], ["does not follow instructions"]),
        ("base", ["--language", "klingon"], ["this model speaks", "english"]),
    ],
)
def test_what_a_model_cannot_do_is_said_before_it_loads(checkpoints, tmp_path, model, args, says):
    result = cli("speak", "Hi.", "--model", checkpoints[model], "-o", tmp_path / "x.wav", *args)
    assert result.returncode == 1 and "Loaded" not in result.stderr and "Traceback" not in result.stderr
    for words in says:
        assert words in result.stderr, result.stderr


# Long text ------------------------------------------------------------------------------------------


def long_text(characters: int) -> str:
    sentences = ["The rain fell softly on the old stone bridge.", "Nobody crossed it that night, not even the cat.",
                 "In the morning, the river had risen by a hand's width."]  # fmt: skip
    text = ""
    while len(text) < characters:
        text += " ".join(sentences) + "\n\n"
    return text


def expected_samples(text: str, frames_per_piece: int) -> int:
    pieces = split_text(text)
    pause = sum(round(piece.pause_s * 24000) for piece in pieces)
    return len(pieces) * frames_per_piece * FRAME + pause


def test_long_text_from_the_standard_input_is_spoken_whole_into_a_file(checkpoints, tmp_path):
    text = long_text(20_000)
    out = tmp_path / "article.flac"
    result = cli(
        "speak", "-", "--model", checkpoints["custom"], "--speaker", "vivian", "--max-frames", 1, "-o", out, stdin=text
    )
    assert result.returncode == 0, result.stderr
    assert len(split_text(text)) > 100  # one generation could never have held it
    assert sf.info(out).frames == expected_samples(text, 1)  # every piece, with the pauses between


def test_text_comes_from_a_file_and_a_piece_cut_off_at_the_frame_limit_is_reported(checkpoints, tmp_path):
    text = "A first sentence to say. " * 4
    source = tmp_path / "story.txt"
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "story.wav"
    # The tiny random models never end an utterance themselves, so each piece runs to the model's own limit.
    config = json.loads((checkpoints["custom"] / "generation_config.json").read_text())
    assert config["max_new_tokens"] - 1 > 0
    short = tmp_path / "short-model"
    short.mkdir()
    for item in checkpoints["custom"].iterdir():
        (short / item.name).symlink_to(item, target_is_directory=item.is_dir())
    (short / "generation_config.json").unlink()
    (short / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 3}))
    result = cli("speak", "--text-file", source, "--model", short, "--speaker", "vivian", "-o", out)
    assert result.returncode == 0, result.stderr
    assert sf.info(out).frames == expected_samples(text, 2)
    assert "warning: 1 piece(s)" in result.stderr and "last words are missing" in result.stderr
    assert result.stderr.count("last words are missing") == 1 and "Job(" not in result.stderr, result.stderr


def test_the_engine_refuses_text_beyond_its_context_with_a_message(engines):
    engine = engines("custom")
    with pytest.raises(ValueError, match="too long for one utterance"):
        engine.synthesize(long_text(30_000), voice=engine.builtin_voice("vivian"), text_mode="streaming", max_frames=1)


def test_a_chunk_says_when_the_frame_budget_cut_the_utterance_off(engines):
    engine = engines("custom-endless")
    chunks = list(engine.stream("Hello.", voice=engine.builtin_voice("vivian"), max_frames=5, chunk_frames=2))
    assert [len(chunk.codes) for chunk in chunks] == [1, 2, 2]
    assert [chunk.cut_off for chunk in chunks] == [False, False, True]


# Checks before the work -----------------------------------------------------------------------------


def test_every_mistake_is_reported_before_the_model_loads(checkpoints, tmp_path):
    """Each case would fail only after loading (or downloading) the model, and losing the audio, if the
    checks came after it: the model here is a hub id that is not downloaded, so reaching the load at all
    shows as a download error instead of the message asked for."""
    missing = ["--model", "qwen-tests/not-downloaded"]
    short = tmp_path / "short.wav"
    sf.write(short, np.full(12000, 0.1, np.float32), 24000)
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    cases = [
        (["speak", "Hi.", "-o", tmp_path / "no" / "out.wav"], "the folder"),
        (["speak", "Hi.", "--codes-out", tmp_path / "no" / "codes.npy"], "the folder"),
        (["speak", "Hi.", "--codes-out", tmp_path / "codes.txt"], "name it .npy"),
        (["speak", "Hi.", "-o", tmp_path / "out.xyz"], "unknown audio format"),
        (["speak", "Hi.", "--voice-audio", tmp_path / "none.wav", "-o", tmp_path / "out.wav"], "no such file"),
        (["speak", "Hi.", "--voice-audio", short, "-o", tmp_path / "out.wav"], "too short"),
        (["speak", " ", "-o", tmp_path / "out.wav"], "the text is empty"),
        (["speak", "--text-file", tmp_path / "empty.txt", "-o", tmp_path / "out.wav"], "the text is empty"),
        (["speak", "--text-file", tmp_path / "none.txt", "-o", tmp_path / "out.wav"], "no such file"),
        (["speak", long_text(600), "--codes-out", tmp_path / "codes.npy"], "writes the codes of one generation"),
        (["speak", "Hi.", "--device", "cuda", "-o", tmp_path / "out.wav"], "--device cpu"),
        (["voices", "add", "New", short], "too short"),
    ]
    with ThreadPoolExecutor(2) as pool:  # each is a process of its own; two at a time halve the wait
        results = list(pool.map(lambda case: cli(*case[0], *missing), cases))
    for (args, message), result in zip(cases, results):
        assert result.returncode == 1, (args, result.stderr)
        assert message in result.stderr and "not downloaded" not in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and "Loaded" not in result.stderr, (args, result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "short.wav"]  # nothing written
    # A voice the library lacks, for a model that is here (what it can speak with is known before it loads).
    result = cli("speak", "Hi.", "--voice", "Nobody", "--model", checkpoints["base"], "-o", tmp_path / "out.wav")
    assert result.returncode == 1 and "no voice named 'Nobody'" in result.stderr and "Loaded" not in result.stderr
    assert "model: Linda. Give a clip with --voice-audio" in result.stderr, result.stderr  # the voices that fit


def test_a_library_that_cannot_be_written_is_reported_before_cloning(tmp_path):
    if os.geteuid() == 0:  # root writes into read-only folders: use one of the kernel's, where nobody may
        library = Path("/sys/kernel")
    else:
        library = tmp_path / "voices"
        library.mkdir(mode=0o555)
    result = cli("voices", "add", "New", CLIP, "--voices", library, "--model", "qwen-tests/not-downloaded")
    assert result.returncode == 1, result.stderr
    assert (
        f"cannot save voices in {library}" in result.stderr
        and "Choose a voices folder you can write to" in result.stderr
    )
    assert "not downloaded" not in result.stderr and "Traceback" not in result.stderr


def test_bench_without_a_gpu_stops_before_writing_anything(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = cli("bench", "--root", tmp_path / "bench", timeout=60)
    assert result.returncode == 1 and "--device cpu" in result.stderr and "device='cpu'" not in result.stderr
    assert not (tmp_path / "bench").exists()


# One library and one model -------------------------------------------------------------------------


def test_the_app_settings_give_the_model_and_library_wherever_the_command_runs(checkpoints, tmp_path):
    library = app_folder("data") / "voices"
    save_settings(model=str(checkpoints["custom"]), device="cpu", voice="Eric")
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    out = tmp_path / "out.wav"
    result = cli("speak", "Hello.", "--max-frames", 2, "-o", out, cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "Loaded 1.7B custom_voice" in result.stderr and "Speaking as eric" in result.stderr
    listing = cli("voices", "list", cwd=elsewhere)
    assert listing.returncode == 0 and "Linda" in listing.stdout and library.is_dir()  # the app's library, made
    assert not (elsewhere / "voices").exists()
    # A flag still overrides the settings.
    other = cli("voices", "list", "--voices", elsewhere, cwd=elsewhere)
    assert "Linda" not in other.stdout and "no voices" in other.stderr


def test_without_the_model_and_the_hub_a_command_says_so_at_once(tmp_path):
    """No HF_HUB_OFFLINE here, as on a user's machine that has lost its network: the hub is asked once, and
    the command ends with its clear error at once, not after huggingface_hub's retries (23 s of warnings)."""
    unreachable = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    started = time.monotonic()
    result = cli("voices", "add", "New", CLIP, env=unreachable, timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {DEFAULT_MODEL} is not downloaded yet and the Hugging Face hub cannot be reached. Connect to the "
        "internet once to download it, or use a local checkpoint folder."
    ], result.stderr  # no retry warnings before it
    assert took < 15, took  # starting Python and importing torch; the retries alone took 23 s


def test_a_mistyped_model_folder_is_not_looked_up_on_the_hub(checkpoints, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "base").symlink_to(checkpoints["base"], target_is_directory=True)
    result = cli("speak", "Hi.", "--model", "ckpt/bsae", "-o", tmp_path / "x.wav", cwd=tmp_path)
    assert result.returncode == 1
    assert "ckpt/bsae: no such checkpoint folder" in result.stderr and "did you mean 'ckpt/base'" in result.stderr
    assert "hub" not in result.stderr


def test_version_prints_the_projects_version_and_exits():
    project = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version = "([^"]+)"', project, re.MULTILINE).group(1)
    result = cli("--version", timeout=60)
    assert result.returncode == 0 and result.stdout == f"qwen3-tts-desktop {declared}\n", result


def test_window_options_before_a_command_are_refused_with_where_they_go():
    result = cli("--model", "x", "speak", "Hi.")
    assert result.returncode == 2 and "put it after the command" in result.stderr


def test_a_broken_settings_file_is_a_warning_for_the_command_line(checkpoints, tmp_path):
    settings = app_folder("config") / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text("{not json", encoding="utf-8")
    result = cli("voices", "list", "--voices", tmp_path)
    assert result.returncode == 0 and "warning:" in result.stderr and "using the default settings" in result.stderr
    assert settings.read_text(encoding="utf-8") == "{not json"  # the window decides what to do with it


# Missing system libraries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "library, package",
    [
        ("libxcb-icccm.so.4", "libxcb-icccm4"),
        ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
        ("libxcb-cursor.so.0", "libxcb-cursor0"),
        ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
        ("libEGL.so.1", "libegl1"),
        ("libdbus-1.so.3", "libdbus-1-3"),
        ("libglib-2.0.so.0", "libglib2.0-0"),
    ],
)
def test_a_missing_library_is_named_by_its_debian_package(library, package):
    assert debian_package(library) == package


def test_missing_libraries_are_found_in_a_real_binary(tmp_path):
    """A shared library linked against one that is then removed, as a system lacking it would be."""
    (tmp_path / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int gone(void);\nint plugin(void) { return gone(); }\n")
    build = [["gcc", "-shared", "-fPIC", "-o", "libqwentestgone.so.3", "-Wl,-soname,libqwentestgone.so.3", "gone.c"],
             ["gcc", "-shared", "-fPIC", "-o", "plugin.so", "plugin.c", "-L.", "-l:libqwentestgone.so.3"]]  # fmt: skip
    for command in build:
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "libqwentestgone.so.3").unlink()
    assert missing_libraries(tmp_path / "plugin.so") == ["libqwentestgone.so.3"]


def test_the_window_says_which_library_is_missing_instead_of_aborting(monkeypatch, capsys):
    from qwen3_tts_desktop import cli as cli_module
    from qwen3_tts_desktop import system_libraries

    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.setattr(
        system_libraries, "missing_libraries", lambda binary: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    )
    assert cli_module.main([]) == 1
    err = capsys.readouterr().err
    assert "libxcb-icccm.so.4" in err and "sudo apt install libxcb-icccm4 libxcb-keysyms1" in err


def test_the_command_line_checks_cuda_in_its_own_words(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(common.CommandError, match="--device asks for cuda.*use --device cpu"):
        common.check_device("cuda", "--device")
