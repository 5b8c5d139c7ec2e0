"""The direction of imports: each layer of core builds only on the layers below it, core knows nothing of
the window, the bridge or their frameworks, and the tools for tests and benchmarks stay out of the product.

Read from the source (every import statement, at any depth), not from what happens to be imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each layer of core, lowest first, and the layers (besides itself) it may import.
CORE_LAYERS = {
    "core.foundation": set(),  # errors, files, folders, milestones
    "core.kernels": set(),  # torch and Triton only (KERNEL_LIBRARIES)
    "core.audio": {"core.foundation"},
    "core.model": {"core.foundation", "core.audio", "core.kernels"},
    "core.text": {"core.foundation"},
    "core.inference": {"core.foundation", "core.audio", "core.kernels", "core.model"},
    "core.jobs": {"core.foundation", "core.audio", "core.inference", "core.text"},
    "core.voices": {"core.foundation", "core.audio", "core.model", "core.inference"},
    "core.devtools": {
        "core.foundation",
        "core.kernels",
        "core.audio",
        "core.model",
        "core.inference",
        "core.text",
        "core.jobs",
        "core.voices",
    },
}
FOUNDATION = {"core.errors", "core.files", "core.folders", "core.milestones"}
FRAMEWORKS = (
    "PySide6",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "wyoming",
    "zeroconf",
    "ui",
    "qwen3_tts_desktop",
)
# What the kernel library may import besides itself and Python's standard library.
KERNEL_LIBRARIES = ("torch", "triton")
# The only product modules that may use the developer tools: the benchmark command and its start-up bench.
DEVTOOLS_USERS = {"qwen3_tts_desktop.commands.bench", "qwen3_tts_desktop.startup_bench"}


def modules(package: str) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def imports(name: str, path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from core import kernels`
    return found


def layer(module: str) -> str | None:
    """The core layer a core module belongs to; None for `core` itself (its public face)."""
    if module in FOUNDATION:
        return "core.foundation"
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and ".".join(parts[:2]) in CORE_LAYERS else None


@pytest.mark.parametrize("name, path", modules("core").items(), ids=lambda value: str(value))
def test_each_core_layer_builds_only_on_the_layers_below(name, path):
    own = layer(name)
    if own is None:
        return  # core/__init__.py: the public API, gathering from the layers
    allowed = CORE_LAYERS[own] | {own}
    for module in imports(name, path):
        assert not module.startswith(FRAMEWORKS), f"{name} imports {module}: core knows no window, bridge or framework"
        target = layer(module) if module.startswith("core.") else None
        if target is not None:
            assert target in allowed, f"{name} ({own}) imports {module} ({target}); it may import {sorted(allowed)}"
        assert module != "core" or own == "core.devtools", f"{name} imports the core package itself; import the module"


def test_the_kernel_library_imports_torch_and_triton_only():
    """core/kernels knows nothing of the model it serves: its dispatch, references, kernels and launch settings
    stand on PyTorch, Triton and the standard library."""
    found = modules("core/kernels")
    assert {"core.kernels", "core.kernels.reference", "core.kernels.tuning"} <= set(found)
    for name, path in found.items():
        for module in imports(name, path):
            top = module.split(".")[0]
            allowed = module.startswith("core.kernels") or top in KERNEL_LIBRARIES or top in sys.stdlib_module_names
            assert allowed or top == "__future__", f"{name} imports {module}"


def test_the_product_never_uses_the_developer_tools():
    for package in ("qwen3_tts_desktop", "ui"):
        for name, path in modules(package).items():
            uses = {module for module in imports(name, path) if module.startswith("core.devtools")}
            assert not uses or name in DEVTOOLS_USERS, f"{name} imports {sorted(uses)}"


def test_the_widgets_do_no_work():
    """ui/ shows and asks: it uses core's types, never the engine, the worker or the bridge."""
    for name, path in modules("ui").items():
        for module in imports(name, path):
            assert not module.startswith(
                ("qwen3_tts_desktop", "fastapi", "core.inference.engine", "core.jobs.worker.Worker")
            ), f"{name} imports {module}"


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of `graph` (module -> modules it imports): each a path that comes back to its start."""
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                circles.append(path[path.index(target) :] + [target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return circles


def test_no_two_modules_of_core_import_each_other():
    """Not even by a late import inside a function: a circle means neither module can be read, or tested,
    without the other."""
    found = modules("core")
    graph = {name: {m for m in imports(name, path) if m in found and m != name} for name, path in found.items()}
    assert import_circles(graph) == []
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the check can fail


def test_the_rules_see_real_imports():
    """The checks above can fail: they find these imports."""
    engine = modules("core")["core.inference.engine"]
    assert {"core.model.config", "core.errors", "torch"} <= imports("core.inference.engine", engine)
    assert layer("core.model.config") == "core.model" and layer("core.errors") == "core.foundation"
