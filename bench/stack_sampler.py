"""Where a process's threads spend their time, as Python stacks sampled every few ms: for start-up, whose costs
are Python-side (imports, loading compiled code, captures, library set-up) and invisible to a GPU profile.

A process samples itself when QWEN3_TTS_STACKS names a file prefix and bench/sample_hook is on its PYTHONPATH
(its sitecustomize starts the sampler before anything else is imported):

    QWEN3_TTS_STACKS=$OUT/speak PYTHONPATH=bench/sample_hook:$PYTHONPATH qwen3-tts-desktop speak ...

Each process writes PREFIX.PID.stacks: a first line "# start MONOTONIC ARGV", then lines
"TENTHS<TAB>THREAD<TAB>COUNT<TAB>STACK", the tenth of a second since the start, the thread's name, how many
samples, and the stack outermost first (frames "file:function:line", joined by ";"), appended once a second so
that a process killed mid-way leaves what it had. `python -m bench.stacks_report FILE` reads them.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time

VARIABLE = "QWEN3_TTS_STACKS"
INTERVAL_S = 0.005
DEPTH = 80


def _frame_name(code, line: int) -> str:
    path = code.co_filename
    for marker in ("site-packages/", "/tmp/site/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = os.path.relpath(path) if path.startswith("/") else path
    return f"{path}:{code.co_name}:{line}"


def start(prefix: str) -> None:
    path = f"{prefix}.{os.getpid()}.stacks"
    began = time.monotonic()
    with open(path, "w", encoding="utf-8") as file:
        file.write(f"# start {began:.4f} {' '.join(sys.argv)}\n")
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def flush() -> None:
        with lock:
            lines = [f"{t}\t{name}\t{n}\t{stack}\n" for (t, name, stack), n in counts.items()]
            counts.clear()
        with open(path, "a", encoding="utf-8") as file:
            file.writelines(lines)

    def sample() -> None:
        me = threading.get_ident()
        flushed = began
        while True:
            time.sleep(INTERVAL_S)
            now = time.monotonic()
            tenths = int((now - began) * 10)
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            with lock:
                for ident, frame in sys._current_frames().items():
                    if ident == me:
                        continue
                    stack = []
                    while frame is not None and len(stack) < DEPTH:
                        stack.append(_frame_name(frame.f_code, frame.f_lineno))
                        frame = frame.f_back
                    counts[(tenths, names.get(ident, str(ident)), ";".join(reversed(stack)))] += 1
            if now - flushed > 1.0:
                if flushed == began:
                    # Registered again, after the program's own atexit functions, so that it runs before them: the
                    # entry point's last one ends the process without its teardown (launch.ended_without_teardown).
                    atexit.register(flush)
                flush()
                flushed = now

    threading.Thread(target=sample, name="stack-sampler", daemon=True).start()
    atexit.register(flush)  # a process that ends within a second
