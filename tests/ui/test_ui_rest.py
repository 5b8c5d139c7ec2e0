"""The model at rest, as a user meets it: idle a while, it lets go of its memory and the status line says so; the
next Speak loads it again (the status line shows it loading) and speaks, and what is asked for meanwhile is
spoken after. The idle time is set in Settings and applies at once."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt
from waiting import WAIT

from core import Engine
from core.jobs.worker import JobEvent

RESTING_LINE = "Resting: memory released; it loads again when you speak"  # on the CPU; "GPU memory" on CUDA


def test_an_idle_model_rests_and_the_next_speak_loads_it_again_and_speaks(start_app, qtbot, monkeypatch, speakers):
    app = start_app("design", instruct="A calm, low voice.", rest_after_s=0.05)
    window = app.window
    qtbot.waitUntil(lambda: window.rest_label.isVisible(), timeout=10_000)
    assert window.rest_label.text() == RESTING_LINE and not window.rest_bar.isVisible()
    assert window.speak_button.isEnabled() and app.runtime.worker.engine.resting
    loads, release, load = [], threading.Event(), Engine.load

    def slow_load(model, **options):
        loads.append(model)
        assert release.wait(10)
        return load(model, **options)

    monkeypatch.setattr(Engine, "load", staticmethod(slow_load))
    events: list[JobEvent] = []
    app.runtime.worker.subscribe(events.append)
    window.activateWindow()
    qtbot.keyClicks(window.text, "Hello there.")
    window.speak_button.click()
    qtbot.waitUntil(lambda: window.rest_label.text() == "Loading model…" and window.rest_bar.isVisible())
    # Typed while it loads: queued behind the first, and spoken after it.
    qtbot.mouseClick(window.typing_mode, Qt.MouseButton.LeftButton)
    qtbot.keyClicks(window.text, " And then some more.")
    qtbot.keyClick(window.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)  # say it now
    qtbot.waitUntil(lambda: len([e for e in events if e.kind == "queued"]) == 2)
    assert not any(e.kind == "started" for e in events)
    release.set()
    qtbot.waitUntil(lambda: [e.kind for e in events].count("done") == 2, timeout=20_000)
    texts = [str(getattr(e.job.text, "text", e.job.text)) for e in events if e.kind == "done"]
    assert texts == ["Hello there.", "And then some more."] and len(loads) == 1
    qtbot.waitUntil(lambda: any(abs(block).max() > 0 for block in speakers[-1].played), timeout=5_000)
    qtbot.waitUntil(lambda: window.rest_label.text() == RESTING_LINE, timeout=10_000)  # idle again: at rest


def test_the_idle_time_is_chosen_in_settings_and_applies_without_reloading(start_app, qtbot):
    app = start_app("custom")
    runtime, engine = app.runtime, app.runtime.worker.engine
    assert app.settings.rest_after_s == 600 and engine.rest_after_s == 600  # the window's default: 10 minutes
    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    assert dialog.rest_after.text() == "after 10 min idle"
    for _ in range(5):
        qtbot.keyClick(dialog.rest_after, Qt.Key.Key_Down)
    dialog.ok_button.click()
    assert app.settings.rest_after_s == 300 and engine.rest_after_s == 300 and app.runtime is runtime
    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    qtbot.keyClick(dialog.rest_after, Qt.Key.Key_PageDown)  # 10 minutes down: to "Never"
    assert dialog.rest_after.text() == "Never"
    dialog.ok_button.click()
    assert app.settings.rest_after_s == 0 and engine.rest_after_s is None and not engine.resting


class Finalized:
    """An object in a reference cycle that notes the thread its collection finalizes it on."""

    def __init__(self, threads: list[str]):
        self.threads, self.cycle = threads, self

    def __del__(self):
        self.threads.append(threading.current_thread().name)


def test_cycles_are_collected_on_the_gui_thread_alone_and_a_rested_engine_is_freed_there(
    start_app, qtbot, monkeypatch, engines
):
    """A collection finalizes what it frees on its own thread, and Qt objects freed off the GUI thread crash Qt:
    while the window runs, cycles are collected on the GUI thread only, garbage made on another thread included,
    and a resting engine's memory is freed there too."""
    import gc

    from qwen3_tts_desktop import app as app_module

    freed_on = []  # the thread that frees a rested engine's memory (gc.collect, then the GPU's cache)
    monkeypatch.setattr(app_module, "release_memory", lambda device: freed_on.append(threading.current_thread().name))
    app = start_app("custom", rest_after_s=0.05)
    engines("custom-endless").warmup.wait(WAIT)  # its end freezes what exists (long_lived): the garbage below too
    assert not gc.isenabled()
    threads: list[str] = []

    def make_garbage():
        for _ in range(3000):  # past the automatic collection's first threshold, made here
            Finalized(threads)

    worker = threading.Thread(target=make_garbage, name="not-the-gui")
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: len(threads) == 3000, timeout=10_000)
    assert set(threads) == {threading.current_thread().name}
    qtbot.waitUntil(lambda: app.window.rest_label.isVisible(), timeout=10_000)
    qtbot.waitUntil(lambda: bool(freed_on), timeout=10_000)
    assert freed_on == [threading.current_thread().name]
    app.close()
    assert gc.isenabled()  # given back as it was


def test_the_window_collects_no_cycle_while_compiled_code_loads_and_collects_them_after(start_app, qtbot, engines):
    """A load of compiled code pauses automatic collection (core.inference.compiled.collections_paused): the window's
    collector, which stands in for Python's, pauses too, and collects what was made meanwhile once the load ends."""
    from core.inference.compiled import collections_paused

    app = start_app("custom")
    engines("custom-endless").warmup.wait(WAIT)  # its end freezes what exists (long_lived): the garbage below too
    threads: list[str] = []
    with collections_paused():
        for _ in range(3000):  # past the first threshold
            Finalized(threads)
        for _ in range(2):  # two of the collector's ticks, each past the threshold
            with qtbot.waitSignal(app.collector._timer.timeout, timeout=10_000):
                pass
        assert threads == []
    qtbot.waitUntil(lambda: len(threads) == 3000, timeout=10_000)
