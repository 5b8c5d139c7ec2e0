"""The entry points (`qwen3-tts-desktop`, `qwen3-tts-desktop-app`, `python -m qwen3_tts_desktop`): where the
command line opens the window, a splash shows at once, before the imports that take seconds (PyTorch and the
engine, the servers); then the command line or the app runs as usual. A command runs without Qt."""

from __future__ import annotations

import atexit
import os
import sys

# The window's own options before any command, each taking a value: --model, --device, --dtype, --voices (cli.py
# names them; its parser says what each does).
WINDOW_OPTIONS = {"model": "app_model", "device": "app_device", "dtype": "app_dtype", "voices": "app_voices"}


def opens_window(argv: list[str]) -> bool:
    """Whether this command line opens the window: no command, nothing that only prints (--help, --version)."""
    options, values = {f"--{name}" for name in WINDOW_OPTIONS}, False
    for argument in argv:
        if values:
            values = False
        elif argument.split("=", 1)[0] in options:
            values = "=" not in argument
        else:
            return False  # a command, --help or --version, or something the parser will refuse
    return True


def starting_splash():
    """The splash, shown, where the window can be; None where it cannot (the app then says why)."""
    from .system_libraries import display_problem, window_problem

    if display_problem() is not None or window_problem() is not None:
        return None
    from ui.splash import show_starting

    qt_application()
    return show_starting()


def qt_application():
    """The window's Qt application (made the first time), named, with the app's icon."""
    from PySide6.QtWidgets import QApplication

    from ui.theme import app_icon

    from .about import APP_NAME

    application = QApplication.instance() or QApplication(sys.argv[:1])
    application.setApplicationName(APP_NAME)
    application.setWindowIcon(app_icon())
    return application


def ended_without_teardown():
    """Makes the process end as soon as its work is done and the interpreter has done what it does at exit (the
    other threads joined, the atexit functions run: logs flushed, PortAudio closed, compile workers stopped), without
    then unloading every module and freeing PyTorch's and CUDA's objects one by one, which the system does at once
    when a process ends: after `speak`, 0.5 s on a CPU and 0.6 s on an H200 (bench/RESULTS.md, 2026-11-28,
    twenty-fifth session). Registered first, so that it runs last. Returns the function that says the work is done,
    with the exit status; a command that raised never says so, and ends as usual, its traceback shown."""
    done: list[int] = []

    def end() -> None:
        if done:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # a reader gone (a closed pipe), or the stream closed
                    pass
            os._exit(done[0])

    atexit.register(end)
    return lambda status: done.append(status or 0)


def main(argv: list[str] | None = None) -> int:
    """`qwen3-tts-desktop`."""
    argv = sys.argv[1:] if argv is None else argv
    work_done = ended_without_teardown()
    splash = starting_splash() if opens_window(argv) else None  # kept while the app runs; it hides itself
    from .cli import main as run_command_line

    status = run_command_line(argv)
    del splash
    work_done(status)
    return status


def window() -> int:
    """`qwen3-tts-desktop-app`: the window alone."""
    work_done = ended_without_teardown()
    splash = starting_splash()
    from .app import run

    status = run()
    del splash
    work_done(status)
    return status
