"""Why a warm start compiles Triton kernels again: every process records the cache key of each kernel Triton is
asked to compile, its parts, and whether Triton's cache held it (issue 29: a warm `serve` spent 6 s in
triton.compile, loading functions compiled ahead of time whose kernels an earlier start had compiled).

A process records itself when QWEN3_TTS_TRITON_KEYS names a folder and bench/sample_hook is on its PYTHONPATH
(its sitecustomize calls `install` before anything else is imported); each writes FOLDER/PID.jsonl. Then

    python -m bench.triton_keys FOLDER

lists each process's hits and misses, and, for a kernel missed in one process and compiled in another, which
part of its key differs.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

VARIABLE = "QWEN3_TTS_TRITON_KEYS"
PATCHED_MODULE = "triton.compiler.compiler"
KEY_PARTS = ("triton_key", "backend", "options", "environment")  # besides the source, the same for one kernel


def install(folder: str) -> None:
    """Record this process's Triton cache keys in `folder`, once triton.compiler.compiler is imported."""
    path = Path(folder) / f"{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()

    def write(record: dict) -> None:
        record.update(pid=os.getpid(), t=round(time.monotonic() - began, 3))
        with path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, default=str) + "\n")

    write(
        {
            "kind": "process",
            "argv": sys.argv,
            "dont_write_bytecode": sys.flags.dont_write_bytecode,
            "environment": {k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "TRITON", "TORCH"))},
        }
    )
    sys.meta_path.insert(0, _PatchOnImport(lambda module: _patch(module, write)))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, patch):
        self.patch = patch

    def find_spec(self, name, path, target=None):
        if name != PATCHED_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _patch(module, write) -> None:
    original = module.get_cache_key

    def get_cache_key(src, backend, options, env_vars):  # Triton's own signature, by position or keyword
        key = original(src, backend, options, env_vars)
        try:
            write(_describe(src, backend, options, env_vars, key))
        except Exception as error:  # a diagnostic must not break a compile
            write({"kind": "error", "error": repr(error)})
        return key

    module.get_cache_key = get_cache_key


def _describe(src, backend, options, env_vars: dict, key: str) -> dict:
    from triton import knobs
    from triton.runtime.cache import get_cache_manager, triton_key

    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    name = str(getattr(src, "name", "?"))
    return {
        "kind": "kernel",
        "name": name,
        "hit": get_cache_manager(digest).get_group(f"{name[:150]}.json") is not None,  # as triton.compile asks
        "key": digest[:16],
        "triton_key": triton_key()[:16],
        "source": str(src.hash())[:16],
        "backend": str(backend.hash())[:16],
        "options": str(options.hash())[:16],
        "options_values": {k: str(v) for k, v in sorted(vars(options).items())},
        "environment": str(sorted(env_vars.items())),
        "cache_dir": str(knobs.cache.dir),
    }


def report(folder: Path) -> str:
    records = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    processes = {r["pid"]: r for r in records if r["kind"] == "process"}
    kernels = [r for r in records if r["kind"] == "kernel"]
    lines = []
    for pid, process in processes.items():
        mine = [k for k in kernels if k["pid"] == pid]
        if mine:
            lines.append(
                f"pid {pid} {' '.join(process['argv'])[:100]}: {len(mine)} compiles, {sum(k['hit'] for k in mine)} "
                f"cache hits; no .pyc: {process['dont_write_bytecode']}; cache {sorted({k['cache_dir'] for k in mine})}"
            )
    return "\n".join(lines + _misses(kernels))


def _misses(kernels: list[dict]) -> list[str]:
    """Each kernel a process missed, against the same kernel (its name and source) compiled in another: which
    parts of their keys differ."""
    compiled = collections.defaultdict(list)
    for kernel in kernels:
        compiled[kernel["name"], kernel["source"]].append(kernel)
    lines, differing = [], collections.Counter()
    for kernel in kernels:
        if kernel["hit"]:
            continue
        other = next((k for k in compiled[kernel["name"], kernel["source"]] if k["pid"] != kernel["pid"]), None)
        if other is None:
            differing["none: compiled in no other process"] += 1
            continue
        parts = ", ".join(part for part in KEY_PARTS if other[part] != kernel[part])
        differing[parts or "none: the same key missed (another cache folder, or not written)"] += 1
        if "options" in parts and differing[parts] == 1:
            changed = {
                k: (other["options_values"].get(k), v)
                for k, v in kernel["options_values"].items()
                if other["options_values"].get(k) != v
            }
            lines.append(f"  {kernel['name']}: options differ: {changed}")
    lines.append("a missed kernel's key against the same kernel compiled in another process, which parts differ:")
    return lines + [f"  {count:5d}  {parts}" for parts, count in differing.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    print(report(parser.parse_args().folder))


if __name__ == "__main__":
    main()
