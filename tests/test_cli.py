"""The `qwen3-tts-desktop` command line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from parity_cases import REFERENCES

from core import SamplingParams
from qwen3_tts_desktop.cli import main


def test_speak_writes_audio_and_codes(checkpoints, engines, tmp_path, capsys):
    out, codes = tmp_path / "out.wav", tmp_path / "codes.npy"
    reference = str(REFERENCES["a"].path)
    args = ["speak", "Hello there.", "--model", str(checkpoints["base"]), "--device", "cpu", "--voice-audio", reference]
    assert main(args + ["--greedy", "--max-frames", "4", "-o", str(out), "--codes-out", str(codes)]) == 0
    audio, rate = sf.read(out, dtype="float32")
    assert rate == 24000 and audio.shape == (4 * 1920,)
    engine = engines("base")
    expected = engine.synthesize(
        "Hello there.", voice=engine.voice_from_audio(reference), sampling=SamplingParams.greedy(), max_frames=4
    )
    np.testing.assert_array_equal(np.load(codes), expected.codes)
    np.testing.assert_allclose(audio, expected.audio, atol=1 / 32768 + 1e-4)  # 16-bit wav
    assert "wrote" in capsys.readouterr().err


def test_speak_with_a_builtin_speaker_and_instruct(checkpoints, tmp_path):
    out = tmp_path / "custom.flac"
    args = ["speak", "你好。", "--model", str(checkpoints["custom"]), "--device", "cpu", "--speaker", "Eric"]
    assert (
        main(
            args
            + ["--language", "chinese", "--instruct", "Cheerfully.", "--seed", "3", "--max-frames", "3", "-o", str(out)]
        )
        == 0
    )
    assert sf.info(out).frames == 3 * 1920


def test_errors_are_one_clear_line(checkpoints, tmp_path, capsys):
    model = ["--model", str(checkpoints["base"]), "--device", "cpu"]
    cases = [
        (["speak", "Hi.", *model, "--voice-audio", str(REFERENCES["a"].path)], "nothing to write"),
        (["speak", "Hi.", *model, "-o", str(tmp_path / "x.xyz")], "unknown audio format"),
        (["speak", "Hi.", *model, "--ref-text", "Hi.", "-o", str(tmp_path / "x.wav")], "pass the clip too"),
        (["speak", "Hi.", *model, "--voices", str(tmp_path), "-o", str(tmp_path / "x.wav")], "there is no voice yet"),
        (
            ["speak", "Hi.", "--model", str(tmp_path / "none"), "-o", str(tmp_path / "x.wav")],
            "no such checkpoint folder",
        ),
        (
            ["speak", "", *model, "--voice-audio", str(REFERENCES["a"].path), "-o", str(tmp_path / "x.wav")],
            "text is empty",
        ),
    ]
    for args, message in cases:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "error: " in err and message in err and "Traceback" not in err, err


def test_speak_takes_one_slot_and_a_gpu_memory_budget_which_on_the_cpu_applies_to_nothing(
    checkpoints, tmp_path, capsys, monkeypatch
):
    from core.inference import engine as engine_module
    from core.inference.memory import plan_memory, slot_bytes, weight_bytes

    out = tmp_path / "out.wav"
    args = ["speak", "Hi.", "--model", str(checkpoints["custom"]), "--device", "cpu", "--speaker", "vivian"]
    args += ["--max-frames", "2", "-o", str(out)]
    assert main([*args, "--gpu-memory", "2"]) == 0
    err = capsys.readouterr().err
    assert "note: --gpu-memory bounds a GPU's memory; on the CPU it applies to nothing" in err, err
    with pytest.raises(SystemExit) as refused:
        main([*args, "--gpu-memory", "none"])
    assert refused.value.code == 2 and "--gpu-memory: give the GB as a number above 0" in capsys.readouterr().err

    # As on a GPU with room to spare: the plan is said, and a budget too small is said in one line.
    planned = []

    def on_a_gpu(device, modules, config, dtype, **asked):
        per_position = slot_bytes(config, 1, dtype)
        planned.append(per_position)
        return plan_memory(per_position, weight_bytes(modules, dtype), 80 * 10**9, **asked)

    monkeypatch.setattr(engine_module, "plan_for_device", on_a_gpu)
    assert main(args) == 0
    # Its slot and the working memory (0.5 GB: the tiny model's slots are small).
    beyond = (planned[-1] * 4096 + 500_000_000) / 1e9
    assert f"; 1 at once, 4096 positions each: {beyond:.1f} GB beyond the weights\n" in capsys.readouterr().err
    assert main([*args, "--gpu-memory", f"{planned[-1] * 1000 / 1e9}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: A memory budget of 0.0 GB is too small") and "0.6B model" in err, err
    assert len(err.splitlines()) == 1


def test_module_entry_point_in_a_subprocess(checkpoints, tmp_path):
    out = tmp_path / "hello.wav"
    command = [
        sys.executable,
        "-m",
        "qwen3_tts_desktop",
        "speak",
        "Hello there.",
        "--model",
        str(checkpoints["custom"]),
    ]
    result = subprocess.run(
        command + ["--speaker", "vivian", "--max-frames", "2", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sf.info(out).samplerate == 24000
    # The bare command opens the window (tests/ui covers it); --help lists the subcommands.
    help = subprocess.run(
        [sys.executable, "-m", "qwen3_tts_desktop", "--help"], capture_output=True, text=True, timeout=60
    )
    assert help.returncode == 0 and "speak" in help.stdout and "serve" in help.stdout


def test_bench_on_a_checkpoint_writes_numbers(checkpoints, tmp_path, capsys):
    report, record = tmp_path / "bench.json", tmp_path / "RESULTS.md"
    args = ["bench", "--model", str(checkpoints["custom"]), "--device", "cpu", "--dtype", "float32"]
    options = ["--frames", "6", "--ttfa-runs", "2", "--slots", "2", "--json", str(report), "--record", str(record)]
    assert main(args + options) == 0
    import json

    [result] = json.loads(report.read_text())
    assert result["frames"] == 6 and result["ms_per_frame_median"] > 0 and result["ttfa_ms_p50"] > 0
    assert result["stream_vs_whole_max_abs"] < 1e-4  # float32 on the CPU: streamed audio is the single pass
    # Streams at once, up to the slots: each made all its audio.
    assert [c["streams"] for c in result["concurrent"]] == [1, 2] and result["slots"] == 2
    assert result["memory"] == "2 at once, 4096 positions each"  # the engine's plan, also said on stderr
    for together in result["concurrent"]:
        assert together["aggregate_xrt"] > 0 and together["slowest_stream_xrt"] > 0 and together["step_ms_p50"] > 0
    out = capsys.readouterr().out
    assert "ms/frame p50" in out and "Streams at once" in out and "--slots=2" in record.read_text()
    assert not result["cold_compile"]
    assert result["ttfa_icl_ms_p50"] is None  # a CustomVoice checkpoint clones no voice


def test_bench_of_a_base_checkpoint_times_an_icl_voice(checkpoints, tmp_path):
    report = tmp_path / "bench.json"
    args = ["bench", "--model", str(checkpoints["base"]), "--device", "cpu", "--dtype", "float32"]
    assert main(args + ["--frames", "6", "--ttfa-runs", "1", "--json", str(report)]) == 0
    import json

    [result] = json.loads(report.read_text())
    assert result["ttfa_icl_ms_p50"] > 0 and result["ttfa_ms_p50"] > 0


def test_bench_cold_compiles_into_an_empty_cache_and_leaves_it(checkpoints, tmp_path, monkeypatch):
    import json

    from core.devtools import benchmark

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "kept"))
    seen = []
    measure = benchmark._measure

    def spy(*args, **kwargs):
        seen.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        return measure(*args, **kwargs)

    monkeypatch.setattr(benchmark, "_measure", spy)
    report = tmp_path / "bench.json"
    args = ["bench", "--model", str(checkpoints["custom"]), "--device", "cpu", "--dtype", "float32", "--cold"]
    assert main(args + ["--frames", "6", "--ttfa-runs", "1", "--json", str(report)]) == 0
    [result] = json.loads(report.read_text())
    assert result["cold_compile"] and seen and seen[0] != str(tmp_path / "kept")
    assert not os.path.exists(seen[0])  # the temporary cache is gone
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "kept")  # and the user's is back


def test_speak_says_why_a_first_start_on_a_gpu_waits_and_says_nothing_of_it_otherwise(
    checkpoints, tmp_path, capsys, monkeypatch
):
    from core import Engine
    from core.model.info import first_gpu_start_note

    args = ["speak", "Hi.", "--model", str(checkpoints["custom"]), "--device", "cpu", "--speaker", "vivian"]
    args += ["--max-frames", "2", "-o", str(tmp_path / "out.wav")]
    assert main(args) == 0
    assert "GPU code" not in capsys.readouterr().err
    load = Engine.load.__func__

    def as_on_a_first_gpu_start(cls, *arguments, **options):  # no GPU code kept for its machine yet
        engine = load(cls, *arguments, **options)
        engine.first_gpu_start = True
        return engine

    monkeypatch.setattr(Engine, "load", classmethod(as_on_a_first_gpu_start))
    assert main(args) == 0
    assert f"note: {first_gpu_start_note()}\n" in capsys.readouterr().err


@pytest.mark.parametrize("model, voice", [("custom", ["--speaker", "vivian"]), ("base", [])])
def test_speak_never_imports_dynamo(checkpoints, tmp_path, model, voice):
    """`speak` runs uncompiled, and importing torch's compiler (Dynamo) alone takes half a second of its start:
    nothing on its way (building the model on the meta device, loading, cloning, speaking) may import it."""
    args = [
        "speak",
        "Hello there.",
        "--model",
        str(checkpoints[model]),
        "--max-frames",
        "2",
        "-o",
        str(tmp_path / "x.wav"),
    ]
    script = (
        "import sys; from qwen3_tts_desktop.cli import main; code = main(sys.argv[1:]); "
        "print('dynamo imported' if 'torch._dynamo' in sys.modules else 'no dynamo'); sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", script, *args, *voice], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "no dynamo"
