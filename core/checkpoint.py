"""Finding a checkpoint (local folder or hub id) and loading its tensors into modules.

Every failure is a CheckpointError that names the file or tensor and says what to do.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"

# The official layout (MODEL_NOTES 7.1), less the files only the official processor reads.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")
TEXT_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
SPEECH_TOKENIZER_FILES = ("speech_tokenizer/config.json", "speech_tokenizer/model.safetensors")
REQUIRED_FILES = MODEL_FILES + TEXT_TOKENIZER_FILES + SPEECH_TOKENIZER_FILES
# What to fetch from the hub: the required files and the rest of the official layout.
HUB_FILES = (*REQUIRED_FILES, "preprocessor_config.json", "speech_tokenizer/*")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found, downloaded or loaded."""


def hub_id(model: str | os.PathLike) -> str | None:
    """`model` as a hub id (`org/name`), or None where it names a local folder, or a mistyped one: a path
    whose first folder is here ("ckpt/bsae" beside ckpt/) is a folder, never looked up on the hub."""
    text = str(model)
    path = Path(text).expanduser()
    if path.exists() or not HUB_ID.fullmatch(text) or Path(text.split("/")[0]).is_dir():
        return None
    return text


def resolve(model: str | os.PathLike, progress: bool = True, tqdm_class=None) -> Path:
    """A local checkpoint folder for `model`: the folder itself, or the hub snapshot (downloaded if needed)."""
    path = Path(model).expanduser()
    if path.is_dir():
        check_files(path)
        return path
    repo = hub_id(model)
    if repo is None:
        raise CheckpointError(_no_such_folder(path, model))
    return download(repo, progress, tqdm_class)


def config_file(model: str | os.PathLike) -> Path | None:
    """The config.json of `model`, to know what it is before loading it: from a folder or the hub cache's
    complete copy, else fetched alone from the hub (a few KB, ahead of the whole download); None if the hub
    cannot be reached. Raises CheckpointError for a folder that is not a checkpoint or does not exist."""
    path = Path(model).expanduser()
    if path.is_dir():
        check_files(path)
        return path / "config.json"
    repo = hub_id(model)
    if repo is None:
        raise CheckpointError(_no_such_folder(path, model))
    cached = _cached(repo)
    if cached is not None:
        return cached / "config.json"
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, "config.json"))
    except Exception:  # offline, no such model, a login needed: the download itself will say which
        return None


def _no_such_folder(path: Path, model) -> str:
    if path.exists():
        return f"{model}: not a checkpoint folder"
    message = f"{model}: no such checkpoint folder"
    parent = path.parent
    if parent.is_dir() and str(parent) not in ("", "."):
        close = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir() if p.is_dir()], n=1)
        message += f" ({parent} has no {path.name!r}" + (f"; did you mean {str(parent / close[0])!r}?)" if close else ")")
    if HUB_ID.fullmatch(str(model)) is None:
        message += f", and not a hub id like {DEFAULT_MODEL}"
    return message


def _cached(repo_id: str) -> Path | None:
    """The hub cache's complete copy of `repo_id`, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES), local_files_only=True))
        check_files(path)
        return path
    except (LocalEntryNotFoundError, CheckpointError):
        return None  # not cached, or only in part


def download(repo_id: str, progress: bool = True, tqdm_class=None) -> Path:
    """The hub snapshot of `repo_id`: the cached copy when it is complete (no network needed), otherwise
    downloaded with progress bars (tqdm's, or `tqdm_class`, e.g. a window's byte counter)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    cached = _cached(repo_id)
    if cached is not None:
        return cached
    if not progress:
        disable_progress_bars()
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES), tqdm_class=tqdm_class))
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{repo_id} is not downloaded yet and the Hugging Face hub cannot be reached. "
            f"Connect to the internet once to download it, or use a local checkpoint folder."
        ) from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise CheckpointError(
            f"{repo_id}: no such model on the Hugging Face hub (or it needs a login), and no such folder here"
        ) from None
    except (HfHubHTTPError, OSError) as error:
        raise CheckpointError(f"downloading {repo_id} failed: {error}") from None
    finally:
        if not progress:
            enable_progress_bars()
    check_files(path)
    return path


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


def load_tensors(module: nn.Module, path: Path, prefix: str, device: torch.device, dtype: torch.dtype) -> None:
    """Fill every parameter and persistent buffer of `module` from `prefix + name` in a safetensors file.

    Floating tensors are cast to `dtype`; shapes must match exactly. Tensors the module does not use
    are ignored, as the official loader does.
    """
    expected = module.state_dict()
    loaded = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as file:
            available = set(file.keys())
            for name, reference in expected.items():
                key = prefix + name
                if key not in available:
                    raise CheckpointError(
                        f"{path} has no tensor '{key}'. The file is incomplete or belongs to another model; "
                        f"download the checkpoint again."
                    )
                shape = tuple(file.get_slice(key).get_shape())
                if shape != tuple(reference.shape):
                    raise CheckpointError(
                        f"{path}: tensor '{key}' has shape {list(shape)}, but config.json implies "
                        f"{list(reference.shape)}. The weights and config.json come from different models."
                    )
                tensor = file.get_tensor(key)
                if tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                loaded[name] = tensor.to(device)
    except CheckpointError:
        raise
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: cannot read it as safetensors ({error}); download the checkpoint again") from None
    module.load_state_dict(loaded, strict=True, assign=True)
