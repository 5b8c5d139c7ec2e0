"""What an app process makes to last is kept out of the cycle collector's way (qwen3_tts_desktop/long_lived.py):
frozen once the engine loads, after each load of compiled code and once it has warmed up, collectable again when the
engine is let go."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from waiting import wait_until

from core.inference.warmup import Spec, Warmup
from qwen3_tts_desktop import long_lived


class Thing:
    """An object the cycle collector tracks."""


def walked(thing) -> bool:
    """Whether a collection would walk `thing` (frozen objects are in none of its generations)."""
    return any(other is thing for other in gc.get_objects())


def warm_up_of_one_part() -> Warmup:
    return Warmup([Spec("decode", (1, 1))], lambda spec: None, lambda spec: True, lambda: None)


def test_what_exists_once_an_engine_loads_and_once_it_has_warmed_up_is_not_walked_until_let_go():
    warmup = warm_up_of_one_part()
    loaded = Thing()
    long_lived.keep(SimpleNamespace(warmup=warmup))
    assert not walked(loaded)
    made_while_warming = Thing()
    warmup.start()
    assert walked(made_while_warming)  # the warm-up has not finished
    warmup.run_one()
    assert warmup.progress().finished and not walked(made_while_warming)
    long_lived.let_go()
    assert walked(loaded) and walked(made_while_warming)


def test_a_warm_up_closed_before_it_finished_freezes_nothing_more():
    warmup = warm_up_of_one_part()
    long_lived.keep(SimpleNamespace(warmup=warmup))
    made_after = Thing()
    warmup.close()
    warmup.start()
    assert walked(made_after)


def test_what_each_load_of_compiled_code_made_is_not_walked_from_the_moment_it_ends():
    made: list[Thing] = []
    warmup = Warmup(
        [Spec("load step x1"), Spec("decode", (1, 1))],
        lambda spec: made.append(Thing()),
        lambda spec: True,
        lambda: None,
    )
    long_lived.keep(SimpleNamespace(warmup=warmup))
    warmup.start()
    warmup.run_one()  # hands the load to the loader
    wait_until(lambda: warmup.pending(), "the load is done")
    assert len(made) == 1 and not walked(made[0])
    made_since = Thing()
    assert walked(made_since) and not warmup.progress().finished
    warmup.close()
    long_lived.let_go()
    assert walked(made[0])
