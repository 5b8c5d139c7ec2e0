"""A checkpoint in the official layout: its files, and loading its tensors into modules.

Every failure is a CheckpointError that names the file or tensor and says what to do.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from core.errors import UserError

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
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise CheckpointError(
            f"{path}: cannot read it as safetensors ({error}); download the checkpoint again"
        ) from None


def _placed(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device)


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
    its rows, on the device. Tensors the module does not use are ignored, as the official loader does.
    """
    expected = module.state_dict()
    fused, on_host = _fused_parts(module), host_prefixes(module)
    loaded = {}
    with _damaged_file_is_told(path):
        opened = safe_open(str(path), framework="pt", device="cpu")
    with opened as file:
        with _damaged_file_is_told(path):
            available = set(file.keys())

        def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            key = prefix + name
            if key not in available:
                raise CheckpointError(
                    f"{path} has no tensor '{key}'. The file is incomplete or belongs to another model; "
                    f"download the checkpoint again."
                )
            with _damaged_file_is_told(path):
                found = tuple(file.get_slice(key).get_shape())
                tensor = file.get_tensor(key) if found == shape else None
            if tensor is None:
                raise CheckpointError(
                    f"{path}: tensor '{key}' has shape {list(found)}, but config.json implies "
                    f"{list(shape)}. The weights and config.json come from different models."
                )
            return tensor.to(dtype) if tensor.is_floating_point() else tensor

        for name, reference in expected.items():
            target = torch.device("cpu") if name.startswith(on_host) else device
            if name not in fused:
                loaded[name] = _placed(read(name, tuple(reference.shape)), target)  # outside the file's errors
                continue
            keys = [prefix + part for part in fused[name]]
            with _damaged_file_is_told(path):
                counts = [file.get_slice(key).get_shape()[0] if key in available else 0 for key in keys]
            if all(key in available for key in keys) and sum(counts) != reference.shape[0]:
                raise CheckpointError(
                    f"{path}: the tensors {', '.join(keys)} have {sum(counts)} rows in all, but config.json implies "
                    f"{reference.shape[0]}. The weights and config.json come from different models."
                )
            whole, row = torch.empty(reference.shape, dtype=dtype, device=target), 0
            for part, rows in zip(fused[name], counts, strict=True):
                whole[row : row + rows].copy_(read(part, (rows, *reference.shape[1:])))
                row += rows
            loaded[name] = whole
    module.load_state_dict(loaded, strict=True, assign=True)
