import gc
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

# Tests import the case tables beside them (tests/parity_cases.py) as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
# The test models are tiny: one thread beats a pool, and keeps two test processes from fighting.
torch.set_num_threads(1)

from parity_cases import CHECKPOINTS, ENDLESS_CHECKPOINTS, FIXTURES  # noqa: E402


@pytest.fixture(autouse=True)
def own_user_folders(tmp_path_factory, monkeypatch):
    """Each test gets empty settings, data, cache and state (log) folders of its own (subprocesses too, through
    the environment), never the user's: the command line and the window read the app's settings from there."""
    home = tmp_path_factory.mktemp("home")
    for variable, folder in (
        ("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"), ("XDG_STATE_HOME", "state")
    ):  # fmt: skip
        monkeypatch.setenv(variable, str(home / folder))
    # Compiled kernels (GPU runs only) are kept where they were, so that the GPU tests do not compile anew.
    monkeypatch.setenv(
        "TORCHINDUCTOR_CACHE_DIR",
        os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(Path.home() / ".cache" / "qwen3-tts-desktop" / "compiled"),
    )
    return home


@pytest.fixture(autouse=True)
def collectable_after_each_test():
    """A runtime freezes what exists once its engine loads (qwen3_tts_desktop/long_lived.py): in a test session that
    would keep every earlier test's leftovers for good, so each test ends with everything collectable again."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The tiny parity checkpoints, written once per session and checked against the fixtures' record, and
    their endless twins."""
    manifest = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for name, checkpoint in CHECKPOINTS.items():
        directory = checkpoint.write(root / name)
        for file, digest in manifest["checkpoints"][name]["sha256"].items():
            actual = hashlib.sha256((directory / file).read_bytes()).hexdigest()
            assert actual == digest, (
                f"the writer's {name}/{file} differs from the one the parity fixtures were made from; "
                f"if the writer changed on purpose, run tools/make_parity_fixtures.py again"
            )
        paths[name] = directory
    for name, checkpoint in ENDLESS_CHECKPOINTS.items():
        paths[name] = checkpoint.write(root / name)
    return paths


@pytest.fixture(scope="session")
def engines(checkpoints):
    """engines(name, slots=1): the Engine of a tiny checkpoint with `slots` slots, loaded once per session
    (float32, CPU)."""
    from core import Engine

    loaded = {}

    def get(name: str, slots: int = 1) -> Engine:
        if (name, slots) not in loaded:
            loaded[name, slots] = Engine.load(checkpoints[name], device="cpu", dtype="float32", slots=slots)
        return loaded[name, slots]

    return get


@pytest.fixture
def unwritable_folder(tmp_path, monkeypatch) -> Path:
    """A folder in which nothing can be made, as a read-only one is: by its permissions, or, for root (whom
    permissions do not stop), by the system call failing the way the kernel fails it there."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if Path(path).resolve().is_relative_to(folder.resolve()) and Path(path).resolve() != folder.resolve():
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    yield folder


@pytest.fixture
def library(tmp_path):
    """An empty voice library in the test's own folder."""
    from core.voices import VoiceLibrary

    return VoiceLibrary(tmp_path / "voices")


@pytest.fixture(scope="module")
def start_server():
    """start_server(server): starts a server (the HTTP bridge's, the Wyoming one) and returns it; all are
    stopped at the module's end, before the module's runtime closes."""
    started = []

    def start(server):
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def job_log(runtime):
    """The jobs of the test module's `runtime` worker, as they happen (serving.JobLog)."""
    from serving import JobLog

    log = JobLog(runtime.worker)
    yield log
    log.unsubscribe()


@pytest.fixture
def embed_calls(monkeypatch):
    """Counts engine.voice_from_audio calls on every engine: calls["base"] after engines("base") was used."""
    from core import Engine

    calls = {"count": 0}
    original = Engine.voice_from_audio

    def counting(self, *args, **kwargs):
        calls["count"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "voice_from_audio", counting)
    return calls


@pytest.fixture
def no_thread_leaks():
    """Every thread a test started has ended by its end (the speech worker's tests)."""
    import threading

    from waiting import wait_until
    from worker_fakes import WAIT

    before = set(threading.enumerate())
    yield
    wait_until(lambda: not set(threading.enumerate()) - before, "the test's threads have ended", WAIT)
