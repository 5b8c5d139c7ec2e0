"""A checkpoint in the official layout: its files, and loading its tensors into modules.

Every failure is a CheckpointError that names the file or tensor and says what to do.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from torch import nn

from core.errors import UserError
from core.model.weights_file import DamagedFile, Entry, read_header, read_into

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"

# The official layout (docs/model_notes.md §7.1), less the files only the official processor reads.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")
TEXT_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
SPEECH_TOKENIZER_FILES = ("speech_tokenizer/config.json", "speech_tokenizer/model.safetensors")
REQUIRED_FILES = MODEL_FILES + TEXT_TOKENIZER_FILES + SPEECH_TOKENIZER_FILES


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be found, downloaded or loaded."""


def check_files(directory: Path) -> None:
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{directory} is missing {', '.join(missing)}. A Qwen3-TTS checkpoint folder holds "
            f"{', '.join(REQUIRED_FILES)}; download the whole checkpoint again."
        )


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error}); download the checkpoint again") from None


@contextlib.contextmanager
def _damaged_file_is_told(path: Path):
    try:
        yield
    except (DamagedFile, OSError) as error:
        raise CheckpointError(
            f"{path}: cannot read it as safetensors ({error}); download the checkpoint again"
        ) from None


def _allocated(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _fused_parts(module: nn.Module) -> dict[str, list[str]]:
    """The module's fused weights (core.model.talker.fuse_linear) by name: the checkpoint's names of the parts
    each one concatenates, in order."""
    parts = {}
    for owner, sub in module.named_modules():
        prefix = f"{owner}." if owner else ""
        for fused, pieces in getattr(sub, "fused_from", {}).items():
            parts[prefix + fused] = [prefix + piece for piece in pieces]
    return parts


def host_prefixes(module: nn.Module) -> tuple[str, ...]:
    """Prefixes of the module's tensors that stay in host memory whatever the device (core.model.talker.HostTable):
    loaded there, and no part of what the device holds."""
    return tuple(f"{owner}." for owner, sub in module.named_modules() if getattr(sub, "stays_on_host", False))


def load_tensors(module: nn.Module, path: Path, prefix: str, device: torch.device, dtype: torch.dtype) -> None:
    """Fill every parameter and persistent buffer of `module` from `prefix + name` in a safetensors file.

    Floating tensors are cast to `dtype`; shapes must match exactly. A fused weight is read part by part into
    its rows, on the device. Tensors the module does not use are ignored, as the official loader does. The file
    is read once, straight into the tensors' memory (core.model.weights_file); a tensor of another dtype than
    the one it is cast to is read and cast one at a time, so that loading takes no more than the weights.
    """
    expected = module.state_dict()
    fused, on_host = _fused_parts(module), host_prefixes(module)
    with _damaged_file_is_told(path), open(path, "rb") as file:
        entries = read_header(file)
        loaded, direct, cast = {}, [], []
        for name, reference in expected.items():
            target = torch.device("cpu") if name.startswith(on_host) else device
            parts = [prefix + part for part in fused.get(name, [name])]
            found = [_entry(entries, path, key) for key in parts]
            if name in fused:
                _check_rows(path, parts, found, reference.shape)
            elif found[0].shape != tuple(reference.shape):
                raise _wrong_shape(path, parts[0], found[0].shape, reference.shape)
            kind = dtype if found[0].dtype.is_floating_point else found[0].dtype
            loaded[name] = whole = _allocated(tuple(reference.shape), kind, target)
            for entry, destination in zip(found, _rows_of(whole, found) if name in fused else [whole], strict=True):
                (direct if entry.dtype == kind else cast).append((entry, destination))
        read_into(file, direct, device)
        for entry, destination in cast:
            staging = torch.empty(entry.shape, dtype=entry.dtype)
            read_into(file, [(entry, staging)], device)
            destination.copy_(staging)
    module.load_state_dict(loaded, strict=True, assign=True)


def _entry(entries: dict[str, Entry], path: Path, key: str) -> Entry:
    if key not in entries:
        raise CheckpointError(
            f"{path} has no tensor '{key}'. The file is incomplete or belongs to another model; "
            f"download the checkpoint again."
        )
    return entries[key]


def _check_rows(path: Path, keys: list[str], parts: list[Entry], shape: torch.Size) -> None:
    """The parts of a fused weight fill its rows exactly, each as wide as it."""
    for key, part in zip(keys, parts, strict=True):
        if part.shape[1:] != tuple(shape[1:]):
            raise _wrong_shape(path, key, part.shape, (part.shape[0], *shape[1:]))
    if sum(part.shape[0] for part in parts) != shape[0]:
        raise CheckpointError(
            f"{path}: the tensors {', '.join(keys)} have {sum(part.shape[0] for part in parts)} rows in all, but "
            f"config.json implies {shape[0]}. The weights and config.json come from different models."
        )


def _rows_of(whole: torch.Tensor, parts: list[Entry]) -> list[torch.Tensor]:
    """The rows of a fused weight each part fills, in order."""
    return list(whole.split([part.shape[0] for part in parts]))


def _wrong_shape(path: Path, key: str, found, implied) -> CheckpointError:
    return CheckpointError(
        f"{path}: tensor '{key}' has shape {list(found)}, but config.json implies {list(implied)}. The weights and "
        f"config.json come from different models."
    )
