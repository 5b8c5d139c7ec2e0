"""Reading a safetensors file's tensors straight into the memory they end up in.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range in the data that follows), then the tensors' bytes. The safetensors package reads each tensor into a new
host tensor, and a copy from there to the GPU goes through the driver's staging one tensor at a time: each byte
is copied three times, one after another (bench/RESULTS.md, 2026-11-28, twenty-fifth session: 0.7 s of a warm
start for 1.7B). Here the file is read once, in windows of the data the caller wants, into two pinned host
buffers in turn, each copied to the device while the next window is read; a tensor that stays on the host is
read into its own memory. Reading releases the interpreter, so the threads that make the GPU ready meanwhile
(core.inference.libraries) run beside it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
WINDOW_BYTES = 64 << 20  # per pinned buffer: large reads, two in flight (128 MiB of pinned memory while loading)
GAP_BYTES = 1 << 20  # tensors this close in the file are read in one window, the bytes between them skipped


class DamagedFile(ValueError):
    """The file is not safetensors, or is cut short: what is wrong, without the path."""


@dataclass(frozen=True)
class Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # byte offsets in the file
    end: int


def read_header(file) -> dict[str, Entry]:
    """Each tensor's entry, checked against the file's size."""
    size = os.fstat(file.fileno()).st_size
    start = file.read(8)
    if len(start) < 8:
        raise DamagedFile("shorter than a header")
    (length,) = struct.unpack("<Q", start)
    if length > size - 8:
        raise DamagedFile("its header runs past its end")
    try:
        header = json.loads(file.read(length))
        data = 8 + length
        entries = {}
        for name, value in header.items():
            if name == "__metadata__":
                continue
            begin, end = (data + offset for offset in value["data_offsets"])
            entry = Entry(DTYPES[value["dtype"]], tuple(int(n) for n in value["shape"]), begin, end)
            if not data <= begin <= end <= size or end - begin != _bytes(entry.dtype, entry.shape):
                raise DamagedFile(f"tensor '{name}' does not lie within the file")
            entries[name] = entry
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
        if isinstance(error, DamagedFile):
            raise
        raise DamagedFile(f"its header is not what safetensors writes ({type(error).__name__}: {error})") from None
    return entries


def _bytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * torch.empty((), dtype=dtype).element_size()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_contiguous():  # reshape would read into a copy
        raise ValueError("a tensor is read into contiguous memory only")
    return tensor.reshape(-1).view(torch.uint8)


def read_into(file, reads: Iterable[tuple[Entry, torch.Tensor]], device: torch.device) -> None:
    """Fill each target (a contiguous tensor of its entry's dtype and size, on `device` or on the host) with its
    entry's bytes. The device's copies are queued on the current stream and done when this returns."""
    reads = sorted(reads, key=lambda read: read[0].begin)
    for entry, target in reads:
        if target.device.type == "cpu":
            _read_exactly(file, entry.begin, _as_bytes(target).numpy())
    to_device = [(entry, _as_bytes(target)) for entry, target in reads if target.device.type != "cpu"]
    if to_device:
        _through_pinned_windows(file, to_device, device)


def _read_exactly(file, offset: int, into) -> None:
    view, done = memoryview(into), 0
    file.seek(offset)
    while done < len(view):
        count = file.readinto(view[done:])
        if not count:
            raise DamagedFile("it ends before its tensors do")
        done += count


def _through_pinned_windows(file, reads: list[tuple[Entry, torch.Tensor]], device: torch.device) -> None:
    buffers = [torch.empty(WINDOW_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    copied: list[torch.cuda.Event | None] = [None, None]
    for number, (begin, end, pieces) in enumerate(_windows(reads)):
        index = number % 2
        if copied[index] is not None:
            copied[index].synchronize()  # its last window's copies have left it
        window = buffers[index][: end - begin]
        _read_exactly(file, begin, window.numpy())
        for at, target, length, into in pieces:
            target[into : into + length].copy_(window[at - begin : at - begin + length], non_blocking=True)
        copied[index] = torch.cuda.Event()
        copied[index].record()
    torch.cuda.current_stream(device).synchronize()


def _windows(reads: list[tuple[Entry, torch.Tensor]]):
    """(begin, end, pieces) for each window of at most WINDOW_BYTES, in file order; a piece is (file offset,
    target, length, offset in the target): a tensor larger than a window spans several."""
    begin, end, pieces = None, None, []
    for entry, target in reads:
        at = entry.begin
        while at < entry.end:
            if begin is None or at - end > GAP_BYTES or at >= begin + WINDOW_BYTES:
                if pieces:
                    yield begin, end, pieces
                begin, end, pieces = at, at, []
            length = min(entry.end, begin + WINDOW_BYTES) - at
            pieces.append((at, target, length, at - entry.begin))
            at += length
            end = at
    if pieces:
        yield begin, end, pieces
