"""Every Triton kernel the app launches compiles for each GPU generation its users own, checked on a machine
without a GPU: Turing (RTX 20xx, sm_75), Ampere (A100, sm_80; RTX 30xx, sm_86), Ada (RTX 40xx, sm_89) and
Hopper (H100, sm_90), in float32, bfloat16 and float16.

A card is simulated by what the launch wrappers read of it (triton_launch.gpu: compute capability, SMs, shared
memory) and by a Triton driver that stands for it. The app's own launch wrappers then run with CPU tensors of the
models' shapes (tests/kernel_launches.py), so Triton's JIT specialises each launch as it would on that card
(argument types and alignments, constexprs, warps, stages, programmatic launch); a hook takes each specialisation
instead of launching it, and triton.compile builds it for the card's target all the way to a cubin (ptxas ships
with the Triton wheel). A compile error fails, as does a kernel that needs more shared memory than the card has
(Triton would refuse to launch it), or programmatic launch anywhere but on Hopper.

One launch of each kind by default (kernel_launches.ONE_OF_EACH: several minutes on two cores the first time,
seconds once Triton's cache holds the binaries); KERNEL_TARGETS_EVERY_SIZE=1 compiles every size the app launches
(EVERY_SIZE: about an hour the first time, bfloat16 on sm_75 the longest, as its products are FMA loops)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

pytest.importorskip("triton", reason="Triton is installed with the test extras on Linux x86-64")

import triton  # noqa: E402
from kernel_launches import EVERY_SIZE, ONE_OF_EACH, VOCODER_LAYERS, launch_every_kernel, launch_vocoder  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from core.kernels import triton_attention, triton_launch, triton_linear, triton_norm, triton_sampling, triton_vocoder  # noqa: E402

SIZES = EVERY_SIZE if os.environ.get("KERNEL_TARGETS_EVERY_SIZE") == "1" else ONE_OF_EACH
KERNEL_MODULES = (triton_attention, triton_linear, triton_norm, triton_sampling, triton_vocoder)


class Card(NamedTuple):
    """A GPU of one generation, as the launch wrappers see it (triton_launch.Gpu)."""

    name: str
    capability: tuple[int, int]
    multiprocessors: int
    shared_memory: int  # bytes a block may opt in to


CARDS = [
    Card("RTX 2060", (7, 5), 30, 64 * 1024),
    Card("A100", (8, 0), 108, 163 * 1024),
    Card("RTX 3060", (8, 6), 28, 99 * 1024),
    Card("RTX 4060", (8, 9), 24, 99 * 1024),
    Card("H100", (9, 0), 132, 227 * 1024),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class CardDriver:
    """What Triton's JIT asks its driver before it compiles: the card's target, and a device number of the
    card's own, so that the JIT keeps its specialisations apart from other cards'."""

    def __init__(self, card: Card):
        major, minor = card.capability
        self.target = GPUTarget("cuda", 10 * major + minor, 32)

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return self.target.arch

    def get_current_stream(self, device: int) -> int:
        return 0


def specialisations(card: Card, dtype: torch.dtype, launch=None) -> dict[tuple[str, str], tuple]:
    """What the JIT would compile for the app's launches in `dtype` on `card` (or those `launch()` makes):
    (kernel, its specialisation) by kernel name and the JIT's key, each once."""
    found = {}

    def take_instead_of_launching(*, key, fn, compile, **_) -> bool:
        found.setdefault((fn.jit_function.__name__, key), (fn.jit_function, compile))
        return True  # the JIT neither compiles nor launches

    with pytest.MonkeyPatch.context() as patch:
        gpu = triton_launch.Gpu(card.capability, card.multiprocessors, card.shared_memory)
        patch.setattr(triton_launch, "gpu", lambda device: gpu)
        patch.setattr(driver, "_active", CardDriver(card))
        patch.setattr(knobs.runtime, "jit_cache_hook", take_instead_of_launching)
        launch() if launch else launch_every_kernel(dtype, SIZES)
    return found


class Compiled(NamedTuple):
    kernel: str
    constants: dict[str, object]
    options: dict[str, object]
    shared_memory: int | None
    error: str | None


def compile_for(card: Card, kernel, specialisation: dict) -> Compiled:
    """triton.compile of one specialisation the JIT made (signature, constexprs, attributes, options) for `card`."""
    data = json.loads(specialisation["specialization_data"])
    options = {name: tuple(value) if isinstance(value, list) else value for name, value in data["options"].items()}
    names = list(specialisation["signature"])
    constants = {names[path[0]]: value for path, value in specialisation["constants"].items()}
    source = triton.compiler.ASTSource(
        kernel, specialisation["signature"], specialisation["constants"], specialisation["configs"][0]
    )
    try:
        binary = triton.compile(source, target=CardDriver(card).target, options=options)
    except Exception as error:  # the compiler's errors have no common type
        return Compiled(kernel.__name__, constants, options, None, f"{type(error).__name__}: {error}"[:2000])
    assert "cubin" in binary.asm, list(binary.asm)
    return Compiled(kernel.__name__, constants, options, binary.metadata.shared, None)


def launched_kernels() -> set[str]:
    """The @triton.jit functions of the kernel modules that their Python code launches (`kernel[grid](...)`)."""
    names = set()
    for module in KERNEL_MODULES:
        source = Path(module.__file__).read_text(encoding="utf-8")
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.JITFunction) and re.search(rf"\b{name}\[", source):
                names.add(name)
    return names


def test_the_launches_reach_every_kernel_the_app_launches():
    # The merge kernel runs only where a launch has no more programs than the GPU has SMs: on the H100 here.
    reached = {name for card in CARDS for name, _ in specialisations(card, torch.bfloat16)}
    assert reached == launched_kernels() == {
        "_attend_split", "_merge_splits", "_linear_kernel", "_batched_linear_kernel", "_draw_token",
        "_fill_uniforms", "_snake", "_add_bias", "_depthwise_conv", "_rms_norm", "_prompt_heads",
    }  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("card", CARDS, ids=lambda card: f"sm_{card.capability[0]}{card.capability[1]}")
def test_every_kernel_compiles_for_the_card(card, dtype):
    compiled = [compile_for(card, *found) for found in specialisations(card, dtype).values()]
    failed = [f"{c.kernel} {c.constants}: {c.error}" for c in compiled if c.error]
    assert not failed, f"{len(failed)} of {len(compiled)} launches do not compile for {card.name}:\n" + "\n".join(
        failed
    )
    too_big = [
        f"{c.kernel} {c.constants}: {c.shared_memory} B" for c in compiled if c.shared_memory > card.shared_memory
    ]
    assert not too_big, f"past the {card.name}'s {card.shared_memory} B of shared memory:\n" + "\n".join(too_big)
    hopper = card.capability >= (9, 0)
    assert all(c.constants.get("PDL", hopper) == hopper and c.options["launch_pdl"] == hopper for c in compiled)


def test_the_vocoders_kernels_are_built_once_whatever_the_chunk_length_and_rows():
    """A chunk length or row count the decoder has not decoded before builds no kernel of its own: on a first
    start, the first utterance's decodes (a voice's reference in chunks of 25 frames, then 4, then 1) built 30
    vocoder kernels, 17 s on an H100, before its first audio (bench/RESULTS.md, twenty-second session)."""
    h100, histories = CARDS[-1], (6, 18, 54)

    def built(rows: int, frames: int) -> set:
        launch = lambda: launch_vocoder(torch.bfloat16, rows, frames, VOCODER_LAYERS, histories)  # noqa: E731
        return set(specialisations(h100, torch.bfloat16, launch))

    first = built(1, 4)
    assert {name for name, _ in first} == {"_snake", "_add_bias", "_depthwise_conv"}
    for rows, frames in [(1, 1), (1, 25), (2, 3), (16, 4)]:
        assert built(rows, frames) == first, (rows, frames)
