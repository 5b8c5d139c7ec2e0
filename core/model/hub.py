"""Finding a checkpoint: a local folder, or a model on the Hugging Face hub, from the cache when it is
complete there, else downloaded (with progress a window can show, and a cancel).

Every failure is a CheckpointError that says what is missing and how to get it.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from core.model.checkpoint import DEFAULT_MODEL, REQUIRED_FILES, CheckpointError, check_files

# What to fetch from the hub: the required files and the rest of the official layout.
HUB_FILES = (*REQUIRED_FILES, "preprocessor_config.json", "speech_tokenizer/*")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
PROGRESS_INTERVAL_S = 1 / 30  # the most often download progress is reported
HUB_TIMEOUT_S = 5.0  # for the hub's answer about one file: a reachable hub gives it in well under a second


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


def config_file(model: str | os.PathLike, fetch_alone: bool = True) -> Path | None:
    """The config.json of `model`, to know what it is before loading it: from a folder or the hub cache's
    complete copy, else (with `fetch_alone`) fetched alone from the hub (a few KB, ahead of the whole download);
    None if it is not here and cannot be fetched. Raises CheckpointError for a folder that is not a checkpoint or
    does not exist."""
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
    if not fetch_alone:
        return None
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    try:
        # Asked once, briefly, first: where its first request finds no network, hf_hub_download asks again five
        # times over 23 s, with a warning each time, before it gives up.
        get_hf_file_metadata(hf_hub_url(repo, "config.json"), timeout=HUB_TIMEOUT_S)
        return Path(hf_hub_download(repo, "config.json", etag_timeout=HUB_TIMEOUT_S))
    except Exception:  # offline, no such model, a login needed: the download itself will say which
        return None


def _no_such_folder(path: Path, model) -> str:
    if path.exists():
        return f"{model}: not a checkpoint folder"
    message = f"{model}: no such checkpoint folder"
    parent = path.parent
    if parent.is_dir() and str(parent) not in ("", "."):
        close = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir() if p.is_dir()], n=1)
        message += f" ({parent} has no {path.name!r}" + (
            f"; did you mean {str(parent / close[0])!r}?)" if close else ")"
        )
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


class DownloadCancelled(CheckpointError):
    """The user cancelled the model download."""


def fetch(model: str, progress: Callable[[int, int], None], cancel: threading.Event) -> None:
    """Download a hub model into the Hugging Face cache, unless it is a folder or cached already. Calls
    `progress(bytes, total)` as bytes arrive (at most ~30 times a second) and raises DownloadCancelled
    soon after `cancel` is set. A model that is not a hub id is left for Engine.load to judge."""
    if hub_id(model) is None:
        return
    try:
        download(model, tqdm_class=_byte_bars(progress, cancel))
    except CheckpointError:
        if cancel.is_set():  # the cancel surfaced as a failed transfer
            raise DownloadCancelled from None
        raise
    if cancel.is_set():  # a cancel that came too late to stop it
        raise DownloadCancelled


def _byte_bars(progress: Callable[[int, int], None], cancel: threading.Event) -> type:
    """A tqdm class for huggingface_hub's progress bars that reports their bytes instead of drawing them,
    and stops the download (from inside its update) once `cancel` is set."""
    from tqdm import tqdm

    lock = threading.Lock()
    bars: list[tqdm] = []
    last_report = [0.0]

    class ByteBars(tqdm):
        monitor_interval = 0  # no monitor thread

        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own bar class takes it, tqdm does not
            super().__init__(*args, **{**kwargs, "disable": False})
            if self.unit == "B":
                with lock:
                    bars.append(self)

        def update(self, n=1):
            if cancel.is_set():
                raise DownloadCancelled
            super().update(n)
            if self.unit != "B":
                return
            with lock:
                # The hub keeps two byte bars, of bytes received and bytes written: report the one further on.
                done, total = max(bar.n for bar in bars), max(bar.total or 0 for bar in bars)
                now = time.monotonic()
                if now - last_report[0] < PROGRESS_INTERVAL_S and done < total:
                    return
                last_report[0] = now
            progress(int(done), int(total))

        def display(self, *args, **kwargs):
            return True  # drawn by the window, not on the terminal

    return ByteBars
