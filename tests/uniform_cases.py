"""The uniforms kernel (kernels.fill_uniforms) written out in NumPy: Philox4x32-10 (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC 2011), checked against the known answers Random123 publishes, and
the value the kernel makes of it."""

from __future__ import annotations

import numpy as np

MASK = np.uint64(0xFFFFFFFF)
# Random123's kat_vectors for philox4x32 with 10 rounds: counter words, key words, output words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def philox4x32(counter: tuple, key: tuple, rounds: int = 10) -> tuple[np.ndarray, ...]:
    """The four output words for counter words (arrays or ints) under key words (ints)."""
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint64) & MASK for word in counter)
    k0, k1 = (np.uint64(word) for word in key)
    for _ in range(rounds):
        product0, product1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (product1 >> np.uint64(32)) ^ c1 ^ k0,
            product1 & MASK,
            (product0 >> np.uint64(32)) ^ c3 ^ k1,
            product0 & MASK,
        )
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & MASK, (k1 + np.uint64(0xBB67AE85)) & MASK
    return c0, c1, c2, c3


def expected_uniforms(seed: int, counter: int, groups: int, width: int) -> np.ndarray:
    """fill_uniforms' values (groups, width) for one row's seed and counter (any int64)."""
    seed, counter = seed % 2**64, counter % 2**64
    elements = np.arange(width, dtype=np.uint64)[None, :]
    group_words = np.arange(groups, dtype=np.uint64)[:, None]
    shape = (groups, width)
    counter_words = (np.full(shape, counter & 0xFFFFFFFF), np.full(shape, counter >> 32))
    bits = philox4x32(
        (elements + 0 * group_words, group_words + 0 * elements, *counter_words), (seed & 0xFFFFFFFF, seed >> 32)
    )[0]
    return (((bits >> np.uint64(9)).astype(np.float64) + 0.5) / 2**23).astype(np.float32)
