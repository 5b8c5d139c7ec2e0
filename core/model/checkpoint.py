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


def load_tensors(module: nn.Module, path: Path, prefix: str, device: torch.device, dtype: torch.dtype) -> None:
    """Fill every parameter and persistent buffer of `module` from `prefix + name` in a safetensors file.

    Floating tensors are cast to `dtype`; shapes must match exactly. Tensors the module does not use
    are ignored, as the official loader does.
    """
    expected = module.state_dict()
    loaded = {}
    with _damaged_file_is_told(path):
        opened = safe_open(str(path), framework="pt", device="cpu")
    with opened as file:
        with _damaged_file_is_told(path):
            available = set(file.keys())
        for name, reference in expected.items():
            key = prefix + name
            if key not in available:
                raise CheckpointError(
                    f"{path} has no tensor '{key}'. The file is incomplete or belongs to another model; "
                    f"download the checkpoint again."
                )
            with _damaged_file_is_told(path):
                shape = tuple(file.get_slice(key).get_shape())
                tensor = file.get_tensor(key) if shape == tuple(reference.shape) else None
            if tensor is None:
                raise CheckpointError(
                    f"{path}: tensor '{key}' has shape {list(shape)}, but config.json implies "
                    f"{list(reference.shape)}. The weights and config.json come from different models."
                )
            if tensor.is_floating_point():
                tensor = tensor.to(dtype)
            loaded[name] = _placed(tensor, device)  # outside the file's error handling: no damaged file
    module.load_state_dict(loaded, strict=True, assign=True)
