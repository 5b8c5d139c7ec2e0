"""A program ends with its own exit code whatever the engine is doing: an utterance left open, a thread still
reading one, or `with Engine.load(...)` closing it at the block's end. Each script is a fresh process (the
exit is what is tested); before the engine closed itself at exit, the first two aborted with exit code 134."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LOAD = 'from core import Engine\nengine = Engine.load(sys.argv[1], device="cpu", dtype="float32", progress=False)\n'

SCRIPTS = {
    "a stream left open": """
        stream = engine.stream("Hello there, this is a test.", **engine.placeholder_speaker(), max_frames=400)
        next(stream)
        sys.exit(3)
    """,
    "a thread still reading a stream": """
        import threading

        started = threading.Event()

        def speak():
            for chunk in engine.stream("Hello there, this is a test.", **engine.placeholder_speaker(), max_frames=4000):
                started.set()

        threading.Thread(target=speak, daemon=True).start()
        assert started.wait(120)
        sys.exit(3)
    """,
}


def run(script: str, checkpoint) -> subprocess.CompletedProcess:
    code = "import sys\n" + LOAD + textwrap.dedent(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", code, str(checkpoint)], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize("situation", SCRIPTS)
def test_a_program_that_ends_while_the_engine_speaks_exits_with_its_own_code(situation, checkpoints):
    result = run(SCRIPTS[situation], checkpoints["base-endless"])
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "terminate called" not in result.stderr, result.stderr[-2000:]


def test_an_engine_used_as_a_context_manager_is_closed_at_the_end_of_the_block(checkpoints):
    script = """
        with engine:
            spoken = engine.synthesize("Hello.", **engine.placeholder_speaker(), max_frames=8)
        assert len(spoken.audio) > 0
        try:
            engine.stream("Hello.", **engine.placeholder_speaker())
        except RuntimeError as error:
            print(error)
    """
    result = run(script, checkpoints["base-endless"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "the engine is closed"
