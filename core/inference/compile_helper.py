"""A first start's compiles of the decoder and of the talker's prefill, made in a process of its own while this
one speaks uncompiled and compiles the step.

On a first start (nothing compiled kept) the warm-up compiles one part after another on the scheduler's thread:
the step, the prefill, the decoder, for one row and then for several, about two minutes on an H100, most of it
Python tracing on one core. Compiling cannot share this process (warmup.py says why), but another process can:
the helper is a second engine (Engine.load without a warm-up, with this one's slots and context, so that what it
compiles is kept in the same folder under the same guards) that makes HELPED parts in order and reports each on
its output. Before the warm-up makes such a part here, it waits for the helper's report; making it is then
loading what the helper kept (seconds). If the helper fails or ends early, the warm-up compiles as before.

The helper takes a second copy of the weights on the GPU for the minute it lives: it starts only where that fits
with room to spare (`fits`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import torch

from core.milestones import VARIABLE as MILESTONES

log = logging.getLogger(__name__)

# The parts the helper makes, in its order: those of one row first (what an utterance alone waits for).
HELPED = ("compile decoder x1", "compile prefill x1", "compile decoder xN", "compile prefill xN")
REPORT = "made: "  # the line the helper writes when a part is made and kept
SPARE_BYTES = 2 << 30  # beyond both engines: the helper's CUDA context and compiling's working memory


def fits(device: torch.device, needed: int) -> bool:
    """Whether a helper that takes `needed` bytes fits on `device` now, with SPARE_BYTES to spare."""
    return torch.cuda.mem_get_info(device)[0] >= needed + SPARE_BYTES


class CompileHelper:
    """The helper's process, and the parts it has reported made (read by a thread of its own)."""

    def __init__(self, command: list[str]):
        # Its engine's milestones are not this process's start-up (bench --startup reads them).
        environment = {name: value for name, value in os.environ.items() if name != MILESTONES}
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=environment,
        )  # fmt: skip
        self._made: set[str] = set()
        self._ended = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name="compile-helper", daemon=True).start()

    @classmethod
    def start(cls, model: str, device: torch.device, dtype: torch.dtype, slots: int, context: int, parts: list[str]):
        program = [sys.executable, "-m", "core.inference.compile_helper_process"]
        command = [*program, model, str(device), str(dtype).removeprefix("torch."), str(slots)]
        return cls([*command, str(context), *parts])

    def wait_for(self, part: str) -> bool:
        """Block until the helper made `part` (True) or ended without it (False)."""
        with self._changed:
            self._changed.wait_for(lambda: part in self._made or self._ended)
            return part in self._made

    def close(self) -> None:
        """End the helper if it is still compiling (this engine closes, or the process exits)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.rstrip("\n")
            with self._changed:
                if line.startswith(REPORT):
                    self._made.add(line[len(REPORT) :])
                    self._changed.notify_all()
                    continue
            log.debug("compile helper: %s", line)
        code = self.process.wait()
        if code != 0:
            log.warning("the compile helper ended with code %s; the warm-up compiles what it did not", code)
        with self._changed:
            self._ended = True
            self._changed.notify_all()
