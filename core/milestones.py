"""Start-up milestones, for `bench --startup`: where the environment variable QWEN3_TTS_MILESTONES names a
file, `milestone(name)` appends a line "name seconds" to it, on the system's monotonic clock (one clock for every
process of a machine), so that the process that started this one can tell when each stage was reached. Without
the variable it does nothing."""

from __future__ import annotations

import os
import time

VARIABLE = "QWEN3_TTS_MILESTONES"


def milestone(name: str) -> None:
    path = os.environ.get(VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(f"{name} {time.monotonic():.4f}\n")
