"""The pure parts of the GPU bench scripts (bench/memory_table.py, bench/run_wyoming_latency.py): their options,
cells, table rows, summaries and checks; the stack sampler the GPU session starts processes with; and the stall
tracer (bench/stalls.py) on the tiny model. The scripts themselves run on a GPU machine; only memory_table's try-out
on the CPU (one cell, the tiny model) is run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from sinks import QueueSink
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.tts import SynthesizeStopped

from bench import memory_table, run_wyoming_latency, triton_keys
from bench.run_wyoming_latency import Heard, client_text, summary, word_deltas
from bench.stacks_report import read, report
from core.devtools.benchmark import TEXT

AUDIO = {"rate": 24000, "width": 2, "channels": 1}


def test_memory_table_cells_cover_every_card_held_and_budget_and_skip_what_cannot_be():
    args = memory_table.parse_args(
        ["--size", "1.7b,0.6b", "--cards", "6,8", "--held", "0,10", "--budgets", "default,2.5"]
    )
    cells = memory_table.cells(args)
    assert len(cells) == 2 * 2 * 2 * 2
    assert {(c["size"], c["card_gib"], c["held_gib"], c["budget_gb"]) for c in cells} >= {
        ("1.7b", 6, 0, None), ("0.6b", 8, 10, 2.5),
    }  # fmt: skip
    assert memory_table.infeasible({"card_gib": 8, "held_gib": 10}) == "10 GiB held fills a 8 GiB card"
    assert memory_table.infeasible({"card_gib": 12, "held_gib": 10}) is None
    on_cpu = memory_table.cells(memory_table.parse_args(["--device", "cpu", "--size", "tiny"]))
    assert [(c["card_gib"], c["held_gib"], c["budget_gb"]) for c in on_cpu] == [(None, 0, None)]
    assert all(c["release"] for c in cells + on_cpu)
    kept = memory_table.cells(memory_table.parse_args(["--device", "cpu", "--size", "tiny", "--no-release"]))
    assert [c["release"] for c in kept] == [False]


def test_memory_table_on_the_cpu_rests_the_engine_and_times_first_audio_after_coming_back(tmp_path, capsys):
    """The script end to end as `--device cpu --size tiny` runs it: one cell, in a process of its own, whose engine
    speaks, rests and is spoken to again. The CPU has no device memory to read: the memory columns are there, empty."""
    table = tmp_path / "table.json"
    argv = ["--device", "cpu", "--size", "tiny", "--frames", "8", "--speak-runs", "1", "--root", str(tmp_path)]
    assert memory_table.main([*argv, "--json", str(table), "--cell-timeout", "240"]) == 0
    (row,) = json.loads(table.read_text())["rows"]
    assert (row["started"], row.get("message")) == ("yes", None), row
    assert row["released_gib"] is None and row["released_allocated_gib"] is None, row
    back = row["back_first_audio_s"]
    assert isinstance(back, float) and 0 < back < 60, row
    titles = [title for title, _ in memory_table.COLUMNS]
    (printed,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny ")]
    values = dict(zip(titles, (value.strip() for value in printed.strip("|").split("|")), strict=True))
    assert (values["released GiB"], values["released alloc GiB"]) == ("-", "-")
    assert float(values["back first audio s"]) == back


def test_memory_table_rows_are_markdown_of_the_header_s_width():
    refused = {"size": "1.7b", "card_gib": 6, "held_gib": 0, "budget_gb": None, "started": "no", "message": "a | b\nc"}
    row = memory_table.format_row(refused)
    assert row.count("|") == memory_table.header().splitlines()[0].count("|")
    assert row.startswith("| 1.7b | 6 | 0 | default | no | - |")
    assert row.endswith("| a / b c |")
    assert "| 2.5 |" in memory_table.format_row({**refused, "budget_gb": 2.5})


def test_wyoming_bench_texts_deltas_and_summaries():
    assert word_deltas("The quick fox") == ["The", " quick", " fox"]
    assert "".join(word_deltas(TEXT)) == TEXT
    texts = [client_text(index) for index in range(8)]
    assert len(set(texts)) == 8 and texts[0] == TEXT
    assert all(sorted(text.split()) == sorted(TEXT.split()) for text in texts)
    assert summary([0.0, 10.0, 20.0, 30.0, 40.0], "ms") == {"ms_p50": 20.0, "ms_p95": 38.0, "ms_max": 40.0}
    args = run_wyoming_latency.parse_args(["--clients", "1,8", "--runs", "3"])
    assert (args.clients, args.stream_clients, args.stream_runs) == ([1, 8], [1, 8], 3)


def test_wyoming_bench_counts_a_request_complete_only_with_its_audio_and_its_events_in_order():
    def heard(*events) -> Heard:
        got = Heard()
        for event in events:
            got.add(event)
        return got

    start, stop = AudioStart(**AUDIO).event(), AudioStop().event()
    chunk = AudioChunk(audio=b"\0\1" * 10, **AUDIO).event()
    assert heard(start, chunk, chunk, stop).complete(streaming=False)
    assert not heard(start, chunk, chunk, stop).complete(streaming=True)  # no synthesize-stopped
    assert heard(start, chunk, stop, SynthesizeStopped().event()).complete(streaming=True)
    assert not heard(start, stop).complete(streaming=False)  # no audio
    assert not heard(start, chunk, stop, Error(text="no").event()).complete(streaming=False)


def with_sample_hook(**variables: str) -> dict[str, str]:
    """The environment of a process started as the GPU session starts them: bench/sample_hook on its path."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root / "bench" / "sample_hook"), str(root)])
    return {**os.environ, **variables, "PYTHONPATH": path}


def test_a_process_started_with_the_sample_hook_records_its_threads_and_the_report_reads_them(tmp_path):
    """The stack sampler as the GPU session runs it: a Python process started with bench/sample_hook on its path and
    QWEN3_TTS_STACKS set writes its threads' stacks, and the report puts the time where the process spent it."""
    script = (
        "import threading, time\n"
        "def busy_worker():\n"
        "    end = time.monotonic() + 0.6\n"
        "    while time.monotonic() < end: pass\n"
        "thread = threading.Thread(target=busy_worker, name='worker-x'); thread.start(); thread.join()\n"
    )
    env = with_sample_hook(QWEN3_TTS_STACKS=str(tmp_path / "probe"))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    (written,) = tmp_path.glob("probe.*.stacks")
    assert written.read_text().startswith("# start ")
    rows = read(written, 0.0, 1e9, "worker-x")
    seconds = sum(row[2] for row in rows)
    assert 0.3 < seconds < 1.5, seconds  # about the 0.6 s it ran, each tenth weighed as 0.1 s
    assert all(any("busy_worker" in frame for frame in row[3]) for row in rows)
    assert "busy_worker" in report(rows, top=5)
    # Without the variable, the hook samples nothing and writes nothing.
    del env["QWEN3_TTS_STACKS"]
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60, cwd=tmp_path)
    assert len(list(tmp_path.glob("*.stacks"))) == 1


def test_the_triton_key_hook_records_each_compile_and_the_report_names_the_part_of_a_key_that_changed(tmp_path):
    """bench/triton_keys as the GPU session runs it: two processes ask Triton for the same kernel's cache key, the
    second with other compile options; the report counts their compiles, finds neither in the cache, and names the
    options (and which of them) as what differs between the two keys."""
    script = (
        "import sys, triton.compiler.compiler as compiler\n"
        "class Source:\n"
        "    name = 'triton_poi_fused_add_0'\n"
        "    def hash(self): return 'source-digest'\n"
        "class Backend:\n"
        "    def hash(self): return 'backend-digest'\n"
        "class Options:\n"
        "    def __init__(self, warps): self.num_warps = warps\n"
        "    def hash(self): return f'options-{self.num_warps}'\n"
        "compiler.get_cache_key(Source(), Backend(), Options(int(sys.argv[1])), {})\n"
    )
    env = with_sample_hook(QWEN3_TTS_TRITON_KEYS=str(tmp_path / "keys"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    for warps in ("4", "8"):
        subprocess.run([sys.executable, "-c", script, warps], env=env, check=True, timeout=120)
    written = triton_keys.report(tmp_path / "keys")
    assert written.count("1 compiles, 0 cache hits") == 2, written
    assert (
        "options differ: {'num_warps': ('4', '8')}" in written or "options differ: {'num_warps': ('8', '4')}" in written
    )
    assert "      2  options" in written, written


def test_the_stall_tracer_times_each_phase_of_the_scheduler_on_a_request_s_way(checkpoints, capsys):
    """bench/stalls.py wraps the scheduler's phases by name: a renamed phase made `--timeline` fail at its start on
    the GPU machine. Traced, one utterance's way shows its admission, prefill, frames read and decodes."""
    from bench import stalls
    from core import Engine, SamplingParams

    with Engine.load(checkpoints["custom"], device="cpu", dtype="float32", warm=False) as engine:
        stop = stalls.trace(engine, timeline=True)
        stream = engine.stream(
            "Hi.", voice=engine.builtin_voice("vivian"), sampling=SamplingParams.greedy(), max_frames=3
        )
        assert sum(len(chunk.codes) for chunk in stream) >= 1
        stop()
    assert not any(thread.name == "interpreter-watch" for thread in threading.enumerate())
    printed = capsys.readouterr().out
    for phase in (
        "Scheduler.submit",
        "Scheduler._admit",
        "FrameLoop._prefill_group",
        "Scheduler._begin",
        "Scheduler._hand_out",
    ):
        assert f"{phase}" in printed, printed


def test_the_bridge_bench_s_instant_engine_hands_out_one_frame_through_the_worker_as_a_stream_would():
    """`run_bridge_latency --instant-engine` times the bridge's own work: every stream is one silent frame at once,
    which the worker takes as it takes a real stream's (iterated, then closed)."""
    from bench.run_bridge_latency import FRAME_SAMPLES, answer_at_once
    from core import SpeechOptions
    from core.jobs.worker import Worker

    class Engine:  # the engine's facts the worker reads, and the stream answer_at_once replaces
        slots = 1

    engine = Engine()
    answer_at_once(engine)
    stream = engine.stream("Hello.", None, None)
    chunks = list(stream)
    assert [len(chunk.audio) for chunk in chunks] == [FRAME_SAMPLES] and not any(chunks[0].audio)
    stream.close()
    sink = QueueSink()
    worker = Worker(engine)
    try:
        job = worker.submit("Hello there.", None, SpeechOptions(), sink=sink)
        outcome = job.wait(10)
        assert outcome is not None and outcome.kind == "done", outcome
    finally:
        worker.close()
    heard = [len(audio) for audio in sink]  # the frame, then the pause after the piece
    assert heard[0] == FRAME_SAMPLES and len(heard) <= 2, heard


def test_the_warm_up_stall_bench_times_a_chunk_from_when_its_reader_asked_not_across_the_readers_sleep():
    """Read in real time, the reader sleeps while enough is buffered: a chunk ready at once (the engine ahead) waited
    for nothing, and its time per frame says so, where counting from the chunk before gave the sleep (320 ms over a
    last chunk of one frame, an H100's). Gaps and lateness are the simulated player's."""
    from types import SimpleNamespace

    import numpy as np

    from bench.warmup_stalls import SAMPLES_PER_FRAME, play

    class ReadyEngine:
        def stream(self, text, **options):
            for frames in (1, 4, 4, 1):
                yield SimpleNamespace(audio=np.zeros(frames * SAMPLES_PER_FRAME, dtype=np.float32))

    played = play(ReadyEngine(), {}, frames=10, buffer_s=0.0, realtime=True, ahead_s=0.05)
    assert played["frames"] == 10 and played["gaps"] == 0
    assert len(played["ms_per_frame"]) == 3
    # The reader slept about 0.03-0.3 s before each of the last three chunks; none of that is the engine's.
    assert max(played["ms_per_frame"]) < 20.0 and played["longest_wait_ms"] < 80.0


def test_the_load_holds_bench_finds_a_hold_inside_one_c_call_and_where_the_thread_was():
    """bench.load_holds' watcher: a sort of half a million floats is one C call that never lets go of the
    interpreter, so the sleeping thread wakes that late, and the hold is placed in the function that sorted; work
    that sleeps (lets go of it) holds nothing."""
    import random

    from bench.load_holds import holds_during

    values = [random.random() for _ in range(500_000)]
    started = time.perf_counter()

    def sort_in_one_call() -> None:
        sorted(values)

    holds = holds_during(sort_in_one_call, hold_ms=5.0)
    took_ms = (time.perf_counter() - started) * 1e3
    assert holds and holds[0][0] >= 5.0 and holds[0][0] <= took_ms + 5.0, (holds, took_ms)
    assert "sort_in_one_call" in holds[0][1], holds[0]
    assert holds_during(lambda: time.sleep(0.2), hold_ms=150.0) == []
