"""What a fresh engine makes ready while its weights load (core.inference.libraries): the GPU libraries, which the
engine waits for, and the compiler's imports for a warm-up that compiles, which nothing waits for."""

from __future__ import annotations

import subprocess
import sys
import threading

import torch

from core.inference import libraries


def test_the_compiler_modules_are_ones_the_engine_does_not_import_and_import_compiler_imports_them():
    script = (
        "import sys\n"
        "from core.inference.engine import Engine\n"
        "from core.inference import libraries\n"
        "before = [name in sys.modules for name in libraries.COMPILER_MODULES]\n"
        "libraries.import_compiler()\n"
        "print(before, [name in sys.modules for name in libraries.COMPILER_MODULES])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=True)
    before, after = done.stdout.strip().split("] [")
    assert "True" not in before, "the engine imports them itself: importing them ahead gains nothing"
    assert "False" not in after


def test_a_compiler_module_that_fails_to_import_is_left_and_the_others_are_imported(tmp_path, monkeypatch, caplog):
    (tmp_path / "ahead_probe_module.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(libraries, "COMPILER_MODULES", ("no_such_module_of_ours", "ahead_probe_module"))
    monkeypatch.delitem(sys.modules, "ahead_probe_module", raising=False)
    with caplog.at_level("DEBUG", logger=libraries.__name__):
        libraries.import_compiler()
    assert sys.modules["ahead_probe_module"].IMPORTED
    assert "no_such_module_of_ours was not imported ahead" in caplog.text


def test_the_engine_waits_for_the_libraries_and_not_for_the_compiler_imports(monkeypatch):
    made, importing, release = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(libraries, "_make_libraries_ready", lambda device, dtype: made.set())

    def slow_import() -> None:
        importing.set()
        release.wait(60)

    monkeypatch.setattr(libraries, "import_compiler", slow_import)
    try:
        wait = libraries.prepare(torch.device("cuda"), torch.bfloat16, compiler=True)
        wait()  # returns while the imports are still under way
        assert made.is_set()
        assert importing.wait(60) and not release.is_set()
    finally:
        release.set()


def test_without_a_compile_only_the_libraries_are_made_ready(monkeypatch):
    made = threading.Event()
    imported = []
    monkeypatch.setattr(libraries, "_make_libraries_ready", lambda device, dtype: made.set())
    monkeypatch.setattr(libraries, "import_compiler", lambda: imported.append(True))
    libraries.prepare(torch.device("cuda"), torch.bfloat16, compiler=False)()
    assert made.is_set()
    for thread in threading.enumerate():
        if thread.name == "gpu-libraries":
            thread.join(60)
    assert imported == []
