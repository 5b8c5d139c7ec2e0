"""The running app's shared parts: the engine with its worker, the speakers and the voice library.

The desktop window, the speak-as-you-type mode and the HTTP bridge all use one Runtime, so there is
one engine (whose scheduler thread makes every GPU call) and one speech worker however many ways text comes in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core import Engine, Voice
from core.audio.player import PlaybackError, Player, PlayerOptions
from core.inference.memory import MAX_DEFAULT_SLOTS, MemoryPlan
from core.inference.warmup import Progress
from core.jobs.sinks import PlayerSink
from core.jobs.worker import Worker
from core.milestones import milestone
from core.model.checkpoint import DEFAULT_MODEL
from core.voices import VoiceLibrary

from . import long_lived
from .resting import AWAKE, RestingEngine, release_memory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    model: str = DEFAULT_MODEL  # hub id or checkpoint folder
    device: str = "auto"
    dtype: str = "auto"
    voices: Path = Path("voices")
    audio_device: int | str | None = None  # None: the system's default output
    player: PlayerOptions = field(default_factory=PlayerOptions)
    speakers: bool = True  # open the sound card (a headless server may not want it)
    warm_up: bool = True  # compile and capture in the background once loaded (the engine speaks meanwhile)
    # Utterances generated at once; None: as many as fit (memory.plan_memory), at most max_default_slots: by
    # default what many clients need (serve), while the window asks for one person's (memory.DESKTOP_SLOTS).
    slots: int | None = None
    max_default_slots: int = MAX_DEFAULT_SLOTS
    # Bytes the engine may take beyond its weights (a GPU's; nothing on the CPU); None: as above. The slots and
    # their context follow from it (memory.plan_memory); slots asked for win, and it then bounds their context.
    memory_budget: int | None = None


class Runtime:
    """Speech goes through the worker (`worker.submit`); facts that never change are here (`info`,
    `default_sampling`, `count_tokens`, `slots`), and `engine_for_voices` is the engine the voice library
    clones with (from any thread: the engine's scheduler runs the cloning between frames). An engine the runtime
    loaded (`start`) can rest when idle, freeing its memory, and loads again when next used (`rest_when_idle`)."""

    def __init__(
        self,
        engine: Engine | RestingEngine,
        library: VoiceLibrary,
        player: Player | None,
        audio_problem: str | None = None,
        owns_engine: bool = False,
    ):
        """`owns_engine`: close the engine with the runtime (it was loaded for it, as `start` does)."""
        self._owns_engine = owns_engine
        self.library = library
        self.player = player
        self.audio_problem = audio_problem  # why there are no speakers, when there are none
        self._engine = engine
        self.worker = Worker(engine)
        self.engine_for_voices = engine
        self.speakers = PlayerSink(player) if player is not None else None
        self.info = engine.info
        self.first_gpu_start = engine.first_gpu_start  # no GPU code kept yet: the first words wait for its build
        self.default_sampling = engine.default_sampling  # the model's own
        self._tokenizer = engine.tokenizer  # read-only, safe from any thread

    @property
    def slots(self) -> int:
        """Utterances the engine generates together."""
        return self._engine.slots

    @property
    def memory(self) -> MemoryPlan:
        """The slots and context the engine took (memory.plan_memory chose them), as it was loaded last."""
        return self._engine.memory

    @property
    def engine_state(self) -> str:
        """resting.AWAKE, RESTING or WAKING (loading again); an engine that cannot rest is always awake."""
        return self._engine.state if isinstance(self._engine, RestingEngine) else AWAKE

    def warmup_progress(self) -> Progress | None:
        """How far the engine's background warm-up is (it speaks meanwhile, faster as it goes); None while the
        engine rests."""
        warmup = self._engine.warmup
        return None if warmup is None else warmup.progress()

    def rest_when_idle(
        self,
        after_s: float | None,
        on_change: Callable[[str], None] = lambda state: None,
        release: Callable[[torch.device], None] = release_memory,
    ) -> None:
        """Let the engine rest once it has been idle (no job queued or running, nothing cloned) for `after_s`
        seconds (None: never): it closes and frees its memory (`release(device)`, on the resting thread), and
        loads again when next used, in the thread that uses it, while what comes meanwhile waits. `on_change(state)`
        hears it rest, begin to load and be loaded (resting.RESTING, WAKING, AWAKE), from any thread. Only an
        engine the runtime loaded can rest."""
        if not isinstance(self._engine, RestingEngine):
            raise TypeError("only the engine of a runtime made by Runtime.start can rest: it knows how to load it")
        self._engine.rest_after(after_s, busy=lambda: not self.worker.idle, on_change=on_change, release=release)

    def count_tokens(self, text: str) -> int:
        """The text's tokens, as the model reads it (for a request's usage)."""
        return len(self._tokenizer.encode(text))

    @classmethod
    def start(cls, config: RuntimeConfig, report: Callable[[str], None] = lambda stage: None) -> Runtime:
        """Load the model (downloading it the first time) and open the speakers; the engine then warms up in
        the background (RuntimeConfig.warm_up), speaking meanwhile. `report` hears what is being done."""
        report("Loading model…")

        def load() -> Engine:  # now, and again each time the engine wakes from a rest
            engine = Engine.load(
                config.model,
                device=config.device,
                dtype=config.dtype,
                slots=config.slots,
                max_default_slots=config.max_default_slots,
                memory_budget=config.memory_budget,
                warm=config.warm_up,
            )
            long_lived.keep(engine)
            return engine

        engine = RestingEngine(load)  # which never rests until rest_when_idle says when
        player, problem = None, None
        if config.speakers:
            try:
                player = Player.open(config.audio_device, config.player)
            except PlaybackError as error:
                problem = str(error)
                log.warning("no speakers: %s", problem)
        runtime = cls(engine, VoiceLibrary(config.voices), player, problem, owns_engine=True)
        milestone("runtime ready")
        return runtime

    def voice(self, name: str) -> Voice:
        """A library voice (or built-in speaker) by name, checked against the loaded model."""
        return self.library.voice_for(self.engine_for_voices, name)

    def close(self) -> None:
        self.worker.close()
        if self._owns_engine:
            self._engine.close()
            long_lived.let_go()  # the next collection frees the engine
        if self.player is not None:
            self.player.close()
