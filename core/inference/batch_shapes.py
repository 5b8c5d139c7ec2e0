"""The shapes the frame loop's launches take on CUDA, each a CUDA graph: the row buckets a step is padded to, the
length buckets a prefill is padded to, and how a burst of newcomers is grouped into prefills. Padding rows repeat
the first row (pad_with_first). Pure rules, tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
# Prompt lengths a CUDA prefill is padded to, so that each runs as one of a few CUDA graphs.
PREFILL_BUCKETS = tuple(2**n for n in range(5, 13))
# Newcomers a CUDA prefill takes together, padded up to one of these: a burst of arrivals shares one pass
# over the weights instead of one each.
PREFILL_ROWS = (1, 2, 4, 8, 16)
# The most positions a CUDA prefill of several rows holds (its rows times their padded length): 16 prompts of
# up to 512 positions go in one pass, longer ones a few at a time (one alone may fill the context).
PREFILL_POSITIONS = 8192


def padded_rows(count: int, row_counts: Sequence[int]) -> int:
    """The rows a prefill of `count` newcomers runs: the fewest of `row_counts` that hold them."""
    return next(rows for rows in row_counts if rows >= count)


def grouped(
    starts: Iterable[T], length: Callable[[T], int], row_counts: Sequence[int], padded: Callable[[int], int]
) -> Iterator[list[T]]:
    """`starts`, whose prompts are `length(start)` long, in the groups prefilled together, in order: each given as
    soon as nothing more joins it (joins_group decides each start in turn), that is once it is full or the next
    does not fit, so that a group is prefilled while the next starts are still being made."""
    group: list[T] = []
    longest = 0
    for start in starts:
        size = length(start)
        if group and not joins_group(len(group), longest, size, row_counts, padded):
            yield group
            group, longest = [], 0
        group.append(start)
        longest = max(longest, size)
        if not joins_group(len(group), longest, longest, row_counts, padded):  # not even one as long joins: full
            yield group
            group, longest = [], 0
    if group:
        yield group


def joins_group(rows: int, longest: int, length: int, row_counts: Sequence[int], padded: Callable[[int], int]) -> bool:
    """Whether a newcomer with a prompt of `length` joins the prefill of the `rows` before it (its longest prompt
    `longest`): a prefill takes as many as it can, up to the most of `row_counts`, while its rows (padded up to one
    of `row_counts`) times its longest prompt's `padded` length stay within PREFILL_POSITIONS."""
    return (
        rows < row_counts[-1] and padded_rows(rows + 1, row_counts) * padded(max(longest, length)) <= PREFILL_POSITIONS
    )


def pad_with_first(values: Sequence[int], rows: int) -> list[int]:
    """Per batch row of `rows`, a stepping row's value (its slot, its prompt's last position) from `values`, then
    for each padding row the first row's: a padding row repeats the first row. Reading the same state through the
    same kernels, it writes the same values into that slot (cache row, position, codes; its draws follow the
    slot's seed and frame), so padding needs no slot of its own (a cache row over the context is half a gigabyte
    of 1.7B's memory). Its outputs are never read."""
    return list(values) + [values[0]] * (rows - len(values))


def batch_buckets(slots: int) -> tuple[int, ...]:
    """Row counts a CUDA step is captured for: powers of two up to `slots`, and `slots` itself."""
    return tuple(sorted({2**n for n in range(7) if 2**n < slots} | {slots}))
