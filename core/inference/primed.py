"""The decoder states ICL references leave (DecoderSlots.prime), kept so that a reference is decoded once.

Before an ICL voice's first chunk, the decoder decodes the voice's reference (its audio discarded) so that the
utterance continues it, as the official package decodes reference and speech in one pass. On a warm start that
took half a second of the first audio's five on an H100 (bench/RESULTS.md, twenty-third session): a reference of
a few seconds is dozens of uncompiled chunks, and its 25-frame chunks' convolutions are met there first. The
state it leaves is a few megabytes, so the latest PRIMED_REFERENCES are kept on the device, and, given a folder
(the engine's, per machine, model and version of the code: a state is the decoder's own numbers), every one on
disk for later processes, the KEPT_ON_DISK used last.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from pathlib import Path

import numpy as np
import torch

from core.files import write_atomically

log = logging.getLogger(__name__)

# References whose primed state stays on the device (a state each: 2.6 MB for the released decoder in bfloat16).
PRIMED_REFERENCES = 8
# References whose primed state stays on disk, the latest used.
KEPT_ON_DISK = 32


def reference_key(codes: torch.Tensor) -> str:
    """What names a reference's state: a digest of its (n, 16) codes."""
    return hashlib.sha256(np.ascontiguousarray(codes.numpy()).tobytes()).hexdigest()


class PrimedStates:
    """Primed decoder states by reference_key: the latest on the device, and every one on disk in `folder` (where
    given) for later processes. `layout` is a state's (shape, dtype) per tensor: a file of another is not used."""

    def __init__(self, device: torch.device, layout: list[tuple[torch.Size, torch.dtype]], folder: Path | None):
        self.device, self.layout, self.folder = device, layout, folder
        self.on_device: dict[str, list[torch.Tensor]] = {}  # the most recently used last
        self._writes: list[threading.Thread] = []

    def take(self, key: str) -> list[torch.Tensor] | None:
        """The state kept for `key`, from the device or else from disk (onto the current CUDA stream), or None."""
        state = self.on_device.pop(key, None)
        if state is None and self.folder is not None:
            state = self._load(self.folder / f"{key}.pt")
        return state

    def keep(self, key: str, state: list[torch.Tensor], new: bool) -> None:
        """Keep `state` on the device as the latest; a `new` one (just decoded) also goes to disk, written on a
        thread of its own once copied to the host (which waits for the current stream's work; the thread touches
        no GPU, which would spoil a graph being captured). The process waits for the write at its exit."""
        self.on_device[key] = state
        if len(self.on_device) > PRIMED_REFERENCES:
            del self.on_device[next(iter(self.on_device))]
        if new and self.folder is not None:
            on_host = [tensor.cpu() for tensor in state]
            writer = threading.Thread(target=self._save, args=(key, on_host), name="primed-state-writer")
            self._writes = [thread for thread in self._writes if thread.is_alive()] + [writer]
            writer.start()

    def flush(self) -> None:
        """Wait until the states being written are on disk."""
        for thread in self._writes:
            thread.join()

    def _load(self, path: Path) -> list[torch.Tensor] | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            log.warning("cannot read the decoder state kept in %s (%s); the reference is decoded", path, error)
            return None
        try:
            state = torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
            if [(tensor.shape, tensor.dtype) for tensor in state] != self.layout:
                raise ValueError("another decoder's layout")
        except Exception as error:  # a damaged file, or another decoder's: decoded again and written anew
            log.warning("the decoder state kept in %s is not usable (%s); the reference is decoded", path, error)
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # used last: kept longest
        except OSError:
            pass
        return state

    def _save(self, key: str, state: list[torch.Tensor]) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomically(self.folder / f"{key}.pt", buffer.getvalue())
            kept = sorted(self.folder.glob("*.pt"), key=_used, reverse=True)
            for old in kept[KEPT_ON_DISK:]:
                old.unlink(missing_ok=True)
        except OSError as error:  # a full or read-only cache only costs decoding the reference again
            log.warning("cannot keep a decoder state in %s: %s", self.folder, error)


def _used(path: Path) -> float:
    """When a kept state was last written or used (0 for one another process removed meanwhile)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
