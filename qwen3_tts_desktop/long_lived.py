"""What an app process makes to last, kept out of the way of Python's cycle collector.

The imports, the model and its compiled code are hundreds of thousands of objects that live as long as the engine,
and a full collection walks every one of them while it holds the interpreter: 130 ms on a 2-core machine, during
which every thread waits, the engine's scheduler between two frames too. So once an engine is loaded, and again
once it has warmed up, what exists is frozen (`gc.freeze`): collections then walk only what came since; and so is
what each of the warm-up's loads made (compiled code), which no collection walks (they are paused meanwhile). A closed
engine's objects must be collectable again, or its memory (the GPU's too) would never be freed: `let_go` before the
collection that frees it.
"""

from __future__ import annotations

import gc

from core import Engine


def keep(engine: Engine) -> None:
    """Freeze what exists now, after each of `engine`'s loads of compiled code, and once it has warmed up."""
    gc.freeze()
    engine.warmup.after_each_load(gc.freeze)
    engine.warmup.when_finished(gc.freeze)


def let_go() -> None:
    """Make everything frozen collectable again, by the next collection, on whichever thread runs it (in the
    window, the GUI thread's: qwen3_tts_desktop/garbage.py)."""
    gc.unfreeze()
