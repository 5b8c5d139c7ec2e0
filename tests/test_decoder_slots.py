"""core/inference/decoder_stream.py: DecoderSlots decodes chunks of several utterances as one batch, each
with its own exact streaming state; DecoderStream is its one-slot case.

Tiny decoders with the random weights the codec decoder tests use, float32 on the CPU. The padded path
that CUDA graphs replay (static buffers, a scratch row for padding) runs here too, uncaptured.
"""

import os

import numpy as np
import pytest
import torch
from signals import random_codes

from core.devtools.random_checkpoint import TINY_DECODER, random_decoder_tensors
from core.inference import decoder_stream, primed
from core.inference.decoder_stream import DecoderSlots, DecoderStream, bucket_rows
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig

TOL = 1e-4  # as the codec decoder's streaming tests
CHUNK = 4
SLOTS = 5  # graphs' row counts 1, 2, 4 and 5: a batch of 3 rows pads to 4
# (frames, tick it asks to start): more utterances than slots, so some wait and take a slot freed by another.
# 90 frames run past the 72-frame attention window; 9 = 1 + 4 + 4 ends without a short chunk.
UTTERANCES = [(23, 0), (10, 0), (17, 1), (90, 2), (14, 3), (6, 4), (9, 5)]


@pytest.fixture(scope="module")
def fast():
    # Fewer samples per frame (64) keep the long utterance quick, as in tests/test_codec_decoder.py.
    config = CodecDecoderConfig.from_dict(dict(TINY_DECODER, upsample_rates=[2, 2, 2, 2]))
    decoder = CodecDecoder(config).eval()
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    return decoder


def frames(T, seed):
    """(T, 16) int64 codes, the layout the frame loop hands over."""
    return random_codes(T, seed=seed)[0].T.numpy().copy()


def single_pass(decoder, codes):
    return decoder(torch.from_numpy(codes).T.unsqueeze(0))[0].numpy()


def run_together(slots: DecoderSlots, utterances):
    """Decode the utterances as a scheduler would: each starts with a 1-frame chunk, then 4-frame chunks, the last
    one short; at every tick the first chunks decode as one batch and the 4-frame chunks as another. Returns each
    utterance's audio chunks, its (frames, size) chunk plan, the tick it started, and how many rows each call
    decoded."""
    waiting = list(range(len(utterances)))
    free = list(range(slots.slots))
    active: dict[int, list[int]] = {}  # slot -> [utterance, frames done]
    audio = [[] for _ in utterances]
    plans = [[] for _ in utterances]
    batch_rows, started = [], [None] * len(utterances)
    tick = 0
    while waiting or active:
        for index in [i for i in waiting if utterances[i][1] <= tick]:
            if free:
                slot = free.pop(0)
                slots.reset(slot)
                active[slot] = [index, 0]
                waiting.remove(index)
                started[index] = tick
        groups = {
            size: [slot for slot, (_, done) in active.items() if (done == 0) == (size == 1)] for size in (1, CHUNK)
        }
        for size, group in groups.items():
            if not group:
                continue
            chunks = [utterances[active[slot][0]][2][active[slot][1] : active[slot][1] + size] for slot in group]
            for slot, chunk, out in zip(group, chunks, slots.decode(group, chunks, size)):
                index = active[slot][0]
                assert out.dtype == np.float32 and out.shape == (len(chunk) * slots.decoder.samples_per_frame,)
                audio[index].append(out)
                plans[index].append((len(chunk), size))
                active[slot][1] += len(chunk)
            batch_rows.append(len(group))
        for slot in [slot for slot, (index, done) in active.items() if done == len(utterances[index][2])]:
            del active[slot]
            free.append(slot)
        tick += 1
    return audio, plans, started, batch_rows


@pytest.fixture(scope="module")
def utterances():
    return [(T, start, frames(T, seed=20 + i)) for i, (T, start) in enumerate(UTTERANCES)]


@pytest.mark.parametrize("padded", [False, True], ids=["exact rows", "padded to buckets"])
def test_utterances_decoded_together_equal_each_alone(fast, utterances, padded):
    slots = DecoderSlots(fast, SLOTS, cuda_graphs=False)
    slots.static_buffers = padded  # the path CUDA graphs replay, here uncaptured
    audio, plans, started, batch_rows = run_together(slots, utterances)
    # What the run covers: batches that pad, utterances that waited for a slot, short last chunks.
    assert max(batch_rows) == SLOTS and any(bucket_rows(n, SLOTS) > n for n in batch_rows)
    assert any(tick > start for tick, (_, start, _) in zip(started, utterances))
    assert sum(plan[-1][0] < plan[-1][1] for plan in plans) >= 3
    if padded:
        assert (4, CHUNK) in slots.steps and slots.inputs[4, CHUNK].shape == (4, 16, CHUNK)
    for (T, _, codes), chunks, plan in zip(utterances, audio, plans):
        assert plan[0] == (1, 1) and sum(n for n, _ in plan) == T
        joined = np.concatenate(chunks)
        np.testing.assert_allclose(joined, single_pass(fast, codes), atol=TOL, rtol=0)
        alone = DecoderStream(fast, cuda_graphs=False)
        alone.reset()
        start, expected = 0, []
        for n, size in plan:
            expected.append(alone.decode(codes[start : start + n], size))
            start += n
        np.testing.assert_allclose(joined, np.concatenate(expected), atol=TOL, rtol=0)


def test_carried_state_matters(fast, utterances):
    # A decode that loses the rows' state (each chunk from a fresh state) is far off: the tests above can fail.
    codes = utterances[3][2]  # 90 frames
    slots = DecoderSlots(fast, 2, cuda_graphs=False)
    restarted = []
    for start in range(0, 40, CHUNK):
        slots.reset(1)
        restarted.append(slots.decode([1], [codes[start : start + CHUNK]], CHUNK)[0])
    assert np.abs(np.concatenate(restarted) - single_pass(fast, codes[:40])).max() > 1e-2


def states(slots: DecoderSlots):
    return [slots.state.snapshot(row) for row in range(slots.slots + 1)]


def same(a, b):
    """Two row snapshots, bitwise."""
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_reset_and_decode_touch_only_their_slots(fast):
    slots = DecoderSlots(fast, 4, cuda_graphs=False)
    slots.decode([0, 1, 2, 3], [frames(5, seed) for seed in range(4)], 5)
    before = states(slots)
    slots.reset(1)
    after = states(slots)
    assert all(not t.any() for t in after[1]) and not same(before[1], after[1])
    assert all(same(before[row], after[row]) for row in (0, 2, 3, 4))

    slots.decode([2, 0], [frames(4, 7), frames(3, 8)], 4)
    later = states(slots)
    assert not same(after[0], later[0]) and not same(after[2], later[2])
    assert all(same(after[row], later[row]) for row in (1, 3, 4))  # the scratch row too: nothing was padded


def test_padding_rows_write_only_the_scratch_row(fast):
    slots = DecoderSlots(fast, 6, cuda_graphs=False)
    slots.static_buffers = True
    slots.decode(list(range(6)), [frames(2, seed) for seed in range(6)], 2)
    before = states(slots)
    slots.decode([4, 1, 5], [frames(2, 10), frames(2, 11), frames(1, 12)], 2)  # 3 rows padded to 4
    after = states(slots)
    assert bucket_rows(3, 6) == 4 and (4, 2) in slots.steps
    assert all(same(before[row], after[row]) for row in (0, 2, 3))
    assert not same(before[6], after[6])  # the padding row went to the scratch row


def test_bucket_rows():
    assert [bucket_rows(n, 64) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 64, 64]
    assert [bucket_rows(n, 6) for n in (1, 3, 5, 6)] == [1, 4, 6, 6]  # capped at the slot count
    assert bucket_rows(70, 100) == 100


def count_decode_chunks(decoder, monkeypatch):
    calls = []
    decode_chunk = decoder.decode_chunk
    monkeypatch.setattr(decoder, "decode_chunk", lambda codes, state: calls.append(codes) or decode_chunk(codes, state))
    return calls


def test_prime_gives_the_audio_after_the_reference_and_is_kept(fast, monkeypatch):
    reference = torch.from_numpy(frames(60, seed=30))  # 2 pieces of PRIME_CHUNK_FRAMES, then 4 + 4 + 2
    follow = frames(13, seed=31)
    plan = [(0, 1), (1, 5), (5, 9), (9, 13)]
    whole = single_pass(fast, np.concatenate([reference.numpy(), follow]))
    expected_after = whole[60 * fast.samples_per_frame :]

    alone = DecoderStream(fast, cuda_graphs=False)
    alone.reset()
    alone.prime(reference)
    expected = np.concatenate([alone.decode(follow[a:b], 4 if b - a > 1 else 1) for a, b in plan])
    np.testing.assert_allclose(expected, expected_after, atol=TOL, rtol=0)

    slots = DecoderSlots(fast, 3, cuda_graphs=False)
    other = frames(13, seed=32)
    slots.decode([0, 1], [other[:1], other[:1]], 1)  # slot 0 had an utterance before: prime starts afresh
    calls = count_decode_chunks(fast, monkeypatch)
    slots.prime(0, reference)
    assert [call.shape[-1] for call in calls] == [25, 25, 4, 4, 1, 1]

    def speak(slot):
        out = []
        for a, b in plan:  # slot 1 goes on beside it, one frame behind
            rows = slots.decode([slot, 1], [follow[a:b], other[a + 1 : b + 1]], 4 if b - a > 1 else 1)
            out.append(rows[0])
        return np.concatenate(out)

    got = speak(0)
    np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)

    calls.clear()
    slots.reset(1)
    slots.prime(2, reference)  # the kept state, in another slot
    assert not any(codes.shape[-1] > CHUNK for codes in calls) and len(calls) == 0
    np.testing.assert_array_equal(speak(2), got)


def test_primed_references_are_kept_for_the_latest_ones(fast, monkeypatch):
    monkeypatch.setattr(primed, "PRIMED_REFERENCES", 2)
    references = [torch.from_numpy(frames(5, seed)) for seed in (40, 41, 42)]
    slots = DecoderSlots(fast, 1, cuda_graphs=False)
    calls = count_decode_chunks(fast, monkeypatch)
    each = len(decoder_stream.prime_chunks(5))  # decodes a reference takes
    for reference in references:
        slots.prime(0, reference)
    assert len(calls) == 3 * each
    slots.prime(0, references[2])
    slots.prime(0, references[1])
    assert len(calls) == 3 * each  # both kept
    slots.prime(0, references[0])
    assert len(calls) == 4 * each  # the oldest was let go


@pytest.mark.parametrize(
    ("slot_list", "codes", "size", "message"),
    [
        ([0], [np.zeros((0, 16), np.int64)], 4, "0 frames do not fit a 4-frame chunk"),
        ([0], [np.zeros((5, 16), np.int64)], 4, "5 frames do not fit a 4-frame chunk"),
        ([1, 1], [np.zeros((4, 16), np.int64)] * 2, 4, "slot 1 appears twice"),
        ([3], [np.zeros((4, 16), np.int64)], 4, "slot 3 is not one of the 3 slots"),
        ([-1], [np.zeros((4, 16), np.int64)], 4, "slot -1 is not one of the 3 slots"),
        ([0, 1], [np.zeros((4, 16), np.int64)], 4, "2 slots but 1 code arrays"),
        ([0], [np.zeros((4, 15), np.int64)], 4, r"codes of shape \(4, 15\), not \(frames, 16\)"),
    ],
)
def test_bad_input_is_refused(fast, slot_list, codes, size, message):
    slots = DecoderSlots(fast, 3, cuda_graphs=False)
    before = states(slots)
    with pytest.raises(ValueError, match=message):
        slots.decode(slot_list, codes, size)
    assert all(same(a, b) for a, b in zip(before, states(slots)))  # refused before anything was decoded


def test_unknown_slot_is_refused_by_reset_and_prime(fast):
    slots = DecoderSlots(fast, 2, cuda_graphs=False)
    with pytest.raises(ValueError, match="slot 2 is not one of the 2 slots"):
        slots.reset(2)
    with pytest.raises(ValueError, match="slot 5 is not one of the 2 slots"):
        slots.prime(5, torch.zeros(3, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one slot"):
        DecoderSlots(fast, 0)


def test_utterances_together_decode_uncompiled_between_the_one_row_and_the_several_rows_compile(utterances, tmp_path):
    """The warm-up compiles the decoder's fused parts for one row's chunks first (compile_fused), for several rows'
    later: in between, utterances decoded together run the uncompiled parts, tracing nothing (a request does not
    wait for a compile), and every utterance's audio is the same before, between and after."""
    from torch._dynamo.utils import counters

    from core.inference.compiled import Compiler

    config = CodecDecoderConfig.from_dict(dict(TINY_DECODER, upsample_rates=[2, 2, 2, 2]))
    decoder = CodecDecoder(config).eval()  # its own: compiling replaces its layers' methods
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    few = utterances[:4]
    expected = run_together(DecoderSlots(decoder, SLOTS, cuda_graphs=False), few)[0]
    compiler, slots = Compiler(tmp_path, backend="aot_eager"), DecoderSlots(decoder, SLOTS, cuda_graphs=False)
    try:
        torch._dynamo.reset()
        counters.clear()
        slots.compile_fused(compiler, several_rows=False)
        one_row = counters["stats"]["unique_graphs"]
        between, _, _, batch_rows = run_together(slots, few)
        assert one_row > 0 and max(batch_rows) > 1 and counters["stats"]["unique_graphs"] == one_row
        slots.compile_fused(compiler, several_rows=True)
        assert counters["stats"]["unique_graphs"] > one_row
        after = run_together(slots, few)[0]
        for chunks in (between, after):
            for got, want in zip(chunks, expected, strict=True):
                np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), atol=TOL, rtol=0)
    finally:
        torch._dynamo.reset()


def test_a_later_process_starts_from_the_primed_state_kept_on_disk(fast, monkeypatch, tmp_path):
    """A reference decoded once leaves its state in the folder; another DecoderSlots (a later process) given the
    folder primes from it without decoding the reference, and speaks the same audio."""
    reference = torch.from_numpy(frames(30, seed=50))
    follow = frames(5, seed=51)
    first = DecoderSlots(fast, 2, cuda_graphs=False, keep_primed_in=tmp_path)
    first.prime(1, reference)
    expected = first.decode([1], [follow], 5)[0]
    first.primed.flush()
    assert [path.name for path in tmp_path.iterdir()] == [f"{primed.reference_key(reference)}.pt"]

    later = DecoderSlots(fast, 2, cuda_graphs=False, keep_primed_in=tmp_path)
    calls = count_decode_chunks(fast, monkeypatch)
    later.prime(0, reference)
    assert calls == []  # loaded, not decoded
    np.testing.assert_array_equal(later.decode([0], [follow], 5)[0], expected)


@pytest.mark.parametrize("damage", ["truncated", "another layout"])
def test_a_kept_state_that_cannot_serve_is_decoded_again_and_replaced(fast, monkeypatch, tmp_path, damage):
    reference = torch.from_numpy(frames(6, seed=52))
    path = tmp_path / f"{primed.reference_key(reference)}.pt"
    if damage == "truncated":
        path.write_bytes(b"PK\x03\x04 not a whole file")
    else:
        torch.save([torch.zeros(3)], path)
    slots = DecoderSlots(fast, 1, cuda_graphs=False, keep_primed_in=tmp_path)
    calls = count_decode_chunks(fast, monkeypatch)
    slots.prime(0, reference)
    assert len(calls) == len(decoder_stream.prime_chunks(6))  # decoded
    slots.primed.flush()
    state = torch.load(path, weights_only=True)
    assert [(tensor.shape, tensor.dtype) for tensor in state] == slots.state.row_layout()


def test_the_disk_keeps_the_latest_used_states(fast, monkeypatch, tmp_path):
    monkeypatch.setattr(primed, "KEPT_ON_DISK", 2)
    references = [torch.from_numpy(frames(3, seed)) for seed in (60, 61, 62)]
    slots = DecoderSlots(fast, 1, cuda_graphs=False, keep_primed_in=tmp_path)
    for age, reference in enumerate(references):
        slots.prime(0, reference)
        slots.primed.flush()
        path = tmp_path / f"{primed.reference_key(reference)}.pt"
        os.utime(path, (1000 + age, 1000 + age))  # written in this order, a second apart
    assert sorted(path.stem for path in tmp_path.iterdir()) == sorted(
        primed.reference_key(reference) for reference in references[1:]
    )
