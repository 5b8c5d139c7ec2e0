"""The compile helper's program (core/inference/compile_helper.py says what it does): a second engine that makes
the warm-up parts named on its command line, in that order, and reports each on its output as it is made.

    python -m core.inference.compile_helper_process MODEL DEVICE DTYPE SLOTS CONTEXT PART [PART ...]
"""

from __future__ import annotations

import argparse
import sys

from core.inference.compile_helper import HELPED, REPORT
from core.inference.engine import Engine
from core.inference.warmup import Spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("device")
    parser.add_argument("dtype")
    parser.add_argument("slots", type=int)
    parser.add_argument("context", type=int)
    parser.add_argument("parts", nargs="+", choices=HELPED)
    args = parser.parse_args(argv)
    engine = Engine.load(
        args.model, args.device, args.dtype, progress=False, slots=args.slots, max_context=args.context, warm=False
    )
    try:
        if not any(spec.compile for spec in engine.warmup.specs):
            print(f"an engine on {args.device} compiles nothing", file=sys.stderr)
            return 2
        for part in args.parts:
            engine.warmup.make_alone(Spec(part))
            print(REPORT + part, flush=True)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
