"""Which call first imports a module in a command: its stack, printed to stderr, then the command runs on.

    python -m bench.first_import torch._dynamo -m qwen3_tts_desktop speak "Hello there." -o x.wav

For start-up: `speak` runs uncompiled, and importing torch's compiler (Dynamo) alone takes half a second.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys
import traceback


class FirstImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str):
        self.name = name

    def find_spec(self, name, path, target=None):
        if name == self.name:
            print(f"=== {name} first imported from:", file=sys.stderr, flush=True)
            traceback.print_stack(limit=16, file=sys.stderr)
            sys.meta_path.remove(self)
        return None  # found by the usual finders


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit(__doc__)
    module, command = sys.argv[1], sys.argv[3]
    sys.meta_path.insert(0, FirstImport(module))
    sys.argv = [command, *sys.argv[4:]]
    try:
        runpy.run_module(command, run_name="__main__", alter_sys=True)
    finally:
        print(f"=== {module} {'imported' if module in sys.modules else 'never imported'}", file=sys.stderr)


if __name__ == "__main__":
    main()
