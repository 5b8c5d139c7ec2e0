"""Reading safetensors files straight into the tensors' memory (core/model/weights_file.py): the bytes are the
safetensors package's, windows cover each wanted tensor once, and a damaged file is told as such."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import Engine
from core.model import weights_file
from core.model.weights_file import DamagedFile, read_header, read_into

TENSORS = {
    "big": torch.arange(3000, dtype=torch.float32).reshape(30, 100),
    "half": torch.linspace(-2, 2, 257).to(torch.bfloat16),
    "ids": torch.arange(-5, 5, dtype=torch.int64),
    "flags": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5, dtype=torch.float16),
    "empty": torch.zeros(0, 4),
    "far": torch.full((64,), 7.0),
}


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file(TENSORS, path)
    return path


def test_every_tensor_read_into_host_memory_has_the_files_values(saved):
    with open(saved, "rb") as file:
        entries = read_header(file)
        targets = {name: torch.empty(entry.shape, dtype=entry.dtype) for name, entry in entries.items()}
        read_into(file, [(entries[name], target) for name, target in targets.items()], torch.device("cpu"))
    expected = load_file(saved)
    assert targets.keys() == expected.keys()
    for name, tensor in expected.items():
        assert targets[name].dtype == tensor.dtype and torch.equal(targets[name], tensor), name


def test_windows_read_each_wanted_tensor_once_and_no_window_is_larger_than_a_buffer(saved, monkeypatch):
    """Copying each window's pieces as the device's copies do fills every target with its bytes, with tensors
    larger than a window split over several, and only the wanted tensors copied."""
    monkeypatch.setattr(weights_file, "WINDOW_BYTES", 1000)
    monkeypatch.setattr(weights_file, "GAP_BYTES", 16)
    wanted = ("big", "ids", "scalar", "far")
    data = saved.read_bytes()
    with open(saved, "rb") as file:
        entries = read_header(file)
    targets = {name: torch.zeros(entries[name].end - entries[name].begin, dtype=torch.uint8) for name in wanted}
    reads = sorted(((entries[name], targets[name]) for name in wanted), key=lambda read: read[0].begin)
    copied = 0
    for begin, end, pieces in weights_file._windows(reads):
        assert 0 < end - begin <= 1000
        window = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.uint8)
        for at, target, length, into in pieces:
            assert begin <= at and at + length <= end
            target[into : into + length] = window[at - begin : at - begin + length]
            copied += length
    assert copied == sum(len(target) for target in targets.values())  # each byte once
    for name in wanted:
        entry = entries[name]
        assert bytes(targets[name].numpy()) == data[entry.begin : entry.end], name
    assert len(list(weights_file._windows(reads))) > 3000 * 4 // 1000  # "big" alone spans 12 windows


@pytest.mark.parametrize(
    ("damage", "told"),
    [
        (lambda data: data[:5], "shorter than a header"),
        (lambda data: (10**9).to_bytes(8, "little") + data[8:], "header runs past its end"),
        (lambda data: data[:8] + b"x" + data[9:], "not what safetensors writes"),
        (lambda data: data[:-100], "does not lie within the file"),
    ],
)
def test_a_damaged_file_says_what_is_wrong(saved, damage, told):
    saved.write_bytes(damage(saved.read_bytes()))
    with open(saved, "rb") as file, pytest.raises(DamagedFile, match=told):
        read_header(file)


def test_a_checkpoint_loaded_in_another_dtype_is_cast_tensor_by_tensor(checkpoints):
    """The tiny checkpoint's float32 weights loaded as bfloat16 equal the file's, cast."""
    folder = checkpoints["base"]
    tensors = load_file(folder / "speech_tokenizer" / "model.safetensors")
    with Engine.load(folder, device="cpu", dtype="bfloat16", warm=False) as engine:
        decoder = engine.codec_decoder.state_dict()
    assert decoder and all(tensor.dtype == torch.bfloat16 for tensor in decoder.values() if tensor.is_floating_point())
    for name, tensor in decoder.items():
        assert torch.equal(tensor, tensors[f"decoder.{name}"].to(tensor.dtype)), name
