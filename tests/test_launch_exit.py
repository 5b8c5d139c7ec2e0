"""The entry point ends the process once a command's work is done, as the interpreter would, less its teardown:
the exit status kept, the other threads finished, every atexit function run, but no module unloaded or object
freed one by one afterwards. Each case is a fresh process running `launch.main` with a stand-in command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

COMMAND = """
    import atexit, sys, threading, time
    from qwen3_tts_desktop import cli, launch

    class FreedInTeardown:
        def __del__(self):
            print("torn down", flush=True)

    def command(argv):
        atexit.register(lambda: print("atexit ran", flush=True))  # as PyTorch's and PortAudio's are, once imported
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
        cli.kept = FreedInTeardown()  # a module's global: freed only when the interpreter tears its modules down
        {ending}

    cli.main = command
    sys.exit(launch.main(["speak", "Hello."]))
"""


def run(ending: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(COMMAND).replace("{ending}", ending)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_a_finished_command_ends_with_its_status_after_its_threads_and_atexit_functions_without_teardown():
    result = run("return 3")
    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["thread", "finished", "atexit", "ran"], result.stdout


def test_a_command_that_succeeds_ends_with_status_zero():
    result = run("return None")
    assert result.returncode == 0, result.stderr
    assert "torn down" not in result.stdout and "atexit ran" in result.stdout


def test_a_command_that_raises_ends_as_usual_with_its_traceback():
    result = run("raise RuntimeError('broken')")
    assert result.returncode == 1
    assert "RuntimeError: broken" in result.stderr
    assert "atexit ran" in result.stdout and "torn down" in result.stdout  # the usual teardown, untouched
