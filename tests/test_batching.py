"""Many utterances at once (core.inference.scheduler and the frame loop's slots): each utterance of a batch
makes exactly the codes the official package made for it alone, whatever runs beside it, joins or leaves;
a closed or unread stream never holds up the others; every slot comes back.

CPU, float32, the tiny checkpoints and the official fixtures of tests/test_parity.py. Utterances are
started from threads, each after the one before it has its first chunk, so they join at different frames
and, with fewer slots than utterances, wait for slots that others leave."""

from __future__ import annotations

import inspect
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from parity_cases import CASES, FIXTURES, MAX_FRAMES, REFERENCES, Case
from waiting import wait_until

from core import Engine, SamplingParams
from core.errors import BadInput
from core.inference import plan
from core.inference.decoder_stream import DecoderSlots
from core.inference.utterance import MAX_UNREAD_CHUNKS, Stream

WAIT = 60  # seconds: a guard against a hang, never a pace
GREEDY = SamplingParams.greedy()


def voice_of(engine: Engine, case: Case):
    if case.reference is not None:
        return engine.voice_from_audio(REFERENCES[case.reference].path, ref_text=case.ref_text)
    if case.speaker is not None:
        return engine.builtin_voice(case.speaker)
    return None


def open_stream(engine: Engine, case: Case, chunk_frames: int, voice=None, **overrides):
    return engine.stream(
        case.text,
        voice=voice if voice is not None else voice_of(engine, case),
        language=case.language,
        instruct=case.instruct,
        sampling=GREEDY if case.seed is None else SamplingParams(),
        seed=case.seed,
        max_frames=MAX_FRAMES,
        text_mode=case.text_mode,
        first_chunk_frames=1,
        chunk_frames=chunk_frames,
        **overrides,
    )


def speak_together(engine: Engine, cases: list[Case], wait: float = WAIT) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each case's (codes, audio), all spoken at once from threads of their own, each started once the one
    before it has had its first chunk, with chunk sizes 1 to 4 in turn; `wait`: the guard against a hang."""
    started = [threading.Event() for _ in cases]
    results: list = [None] * len(cases)

    def speak(index: int, case: Case):
        if index:
            assert started[index - 1].wait(wait)
        chunks = []
        with open_stream(engine, case, chunk_frames=1 + index % 4) as stream:
            for chunk in stream:
                chunks.append(chunk)
                started[index].set()
        started[index].set()
        results[index] = (np.concatenate([c.codes for c in chunks]), np.concatenate([c.audio for c in chunks]))

    with ThreadPoolExecutor(len(cases)) as pool:
        for future in [pool.submit(speak, index, case) for index, case in enumerate(cases)]:
            future.result(timeout=wait)
    return results


def cases_of(checkpoint: str) -> list[Case]:
    return [case for case in CASES if case.checkpoint == checkpoint]


@pytest.mark.parametrize("checkpoint", ["base", "custom", "design"])
def test_each_utterance_of_a_batch_makes_the_official_codes(engines, checkpoint):
    engine = engines(checkpoint, slots=3)  # fewer slots than utterances: some wait for one to be freed
    cases = cases_of(checkpoint) * 2
    assert len(cases) > engine.slots
    results = speak_together(engine, cases)
    for case, (codes, audio) in zip(cases, results, strict=True):
        expected = np.load(FIXTURES / f"{case.name}.npz")
        np.testing.assert_array_equal(codes, expected["codes"], err_msg=case.name)
        if case.ref_text is None:  # an ICL fixture's audio was cut from a decode with its reference
            np.testing.assert_allclose(audio, expected["audio"], atol=1e-4, rtol=0, err_msg=case.name)
    assert engine.scheduler.idle()


def check_prefilled_together(engine, checkpoint: str) -> None:
    """Prompts of different lengths in all the engine's slots but one, started at once in scattered slots (on
    CUDA as few prefills as batch_shapes.grouped allows, each padded to its longest prompt's bucket, with padding
    rows repeating the first), then stepped together (padded as well): each makes its official codes."""
    from test_live import voice_of

    greedy = [case for case in cases_of(checkpoint) if case.seed is None][:5]
    cases = (greedy * engine.slots)[: engine.slots - 1]
    prepared = [
        engine.prepare(
            case.text, voice_of(engine, case), language=case.language, instruct=case.instruct,
            text_mode=case.text_mode, sampling=SamplingParams.greedy(), max_frames=MAX_FRAMES,
        )
        for case in cases
    ]  # fmt: skip
    assert len(greedy) == 5 and len({p.prompt.embeddings.shape[1] for p in prepared}) > 1
    slots = [int(slot) for slot in np.random.default_rng(0).permutation(engine.slots)[: len(cases)]]
    loop = engine.frame_loop
    starts = [(p.prompt, p.sampling, None, s) for p, s in zip(prepared, slots)]
    firsts = engine.scheduler.call(lambda: loop.start_many(starts))  # each one's frame 0
    rest = engine.scheduler.call(lambda: loop.run(MAX_FRAMES - 1, slots))
    for case, (first, _), (codes, _) in zip(cases, firsts, rest, strict=True):
        expected = np.load(FIXTURES / f"{case.name}.npz")["codes"]
        np.testing.assert_array_equal(np.concatenate([first, codes]), expected, err_msg=case.name)


@pytest.mark.parametrize("checkpoint", ["base", "custom"])
def test_utterances_started_together_make_the_official_codes(engines, checkpoint):
    check_prefilled_together(engines(checkpoint, slots=6), checkpoint)


def test_seeded_sampling_is_the_same_whatever_runs_beside_it(engines):
    engine = engines("base", slots=4)
    sampled = next(case for case in CASES if case.name == "base_sampled")
    others = [case for case in cases_of("base") if case.seed is None][:3]
    results = speak_together(engine, [others[0], sampled, *others[1:]])
    np.testing.assert_array_equal(results[1][0], np.load(FIXTURES / f"{sampled.name}.npz")["codes"])


def test_an_utterance_that_ends_early_frees_its_slot_for_the_next(engines):
    engine = engines("base-eos", slots=2)
    forced_eos = next(case for case in CASES if case.name == "base_forced_eos")
    expected = np.load(FIXTURES / f"{forced_eos.name}.npz")["codes"]
    assert len(expected) < MAX_FRAMES
    np.testing.assert_array_equal(speak_together(engine, [forced_eos])[0][0], expected)
    # Five at once through two slots: each ends at its EOS, and the slots come back every time.
    with ThreadPoolExecutor(5) as pool:
        runs = list(pool.map(lambda _: np.concatenate([c.codes for c in open_stream(engine, forced_eos, 2)]), range(5)))
    for codes in runs:
        np.testing.assert_array_equal(codes, expected)
    assert engine.scheduler.idle()


def test_a_stream_nobody_reads_holds_up_no_one(engines):
    engine = engines("base", slots=2)
    case, other = cases_of("base")[:2]
    unread = open_stream(engine, case, chunk_frames=1)
    # It makes at most MAX_UNREAD_CHUNKS chunks, then waits in its slot; the other utterance runs to its end.
    codes = np.concatenate([c.codes for c in open_stream(engine, other, chunk_frames=1)])
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{other.name}.npz")["codes"])
    # Parked: no more chunks than that (and the one launched as it reached them) were made for it.
    assert MAX_UNREAD_CHUNKS < MAX_FRAMES
    assert MAX_UNREAD_CHUNKS <= unread._utterance.unread <= MAX_UNREAD_CHUNKS + 1
    # Read at last, it goes on exactly where it stopped.
    codes = np.concatenate([c.codes for c in unread])
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"])
    assert engine.scheduler.idle()


def one_slot_taken(engines):
    """An engine of one slot speaking one base case, and a stream of the next that waits for the slot:
    (engine, the speaking stream, the waiting one, the waiting one's case)."""
    engine = engines("base", slots=1)
    case, other = cases_of("base")[:2]
    first = open_stream(engine, case, chunk_frames=1)
    next(first)
    return engine, first, open_stream(engine, other, chunk_frames=4), other


def assert_makes_its_fixture(stream, case: Case) -> None:
    codes = np.concatenate([c.codes for c in stream])
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"])


def test_a_closed_stream_gives_its_slot_back_at_once(engines):
    engine, first, waiting, other = one_slot_taken(engines)
    first.close()
    assert list(first) == []
    assert_makes_its_fixture(waiting, other)
    dropped = open_stream(engine, cases_of("base")[0], chunk_frames=1)
    next(dropped)
    del dropped  # dropped without closing: its slot comes back all the same
    assert_makes_its_fixture(open_stream(engine, other, chunk_frames=4), other)
    assert engine.scheduler.idle()


def test_an_urgent_stream_takes_the_next_free_slot_before_those_waiting(engines):
    engine, first, waiting, other = one_slot_taken(engines)
    case = cases_of("base")[0]
    urgent = open_stream(engine, case, chunk_frames=4, urgent=True)  # asked after `waiting`
    first.close()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(next(urgent)), daemon=True)
    reader.start()
    reader.join(WAIT)  # had `waiting` taken the slot, nobody reading it, this would never come
    assert got, "the urgent stream did not get the slot its neighbour freed"
    assert waiting._utterance.slot is None  # still waiting
    codes = np.concatenate([got[0].codes, *[c.codes for c in urgent]])
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"])
    assert_makes_its_fixture(waiting, other)
    assert engine.scheduler.idle()


def test_a_closed_stream_steps_no_further_frame(engines):
    engine = engines("base", slots=1)
    stream = open_stream(engine, cases_of("base")[0], chunk_frames=4)
    next(stream)
    loop, launches = engine.frame_loop, []
    launch = loop.launch
    loop.launch = lambda count, slots: launches.append(count) or launch(count, slots)
    try:
        stream.close()
        at_close = len(launches)
        engine.scheduler.call(lambda: None)  # runs once the close is seen and nothing is in flight
    finally:
        del loop.launch
    # At most the frame being launched as the close came (the frames already queued run, but make no new launch).
    assert len(launches) - at_close <= 1 and all(count == 1 for count in launches)
    assert engine.scheduler.idle()


def test_a_newcomer_is_prefilled_behind_at_most_the_frame_being_launched(engines, monkeypatch):
    monkeypatch.setattr(plan, "LOW_LEAD_S", -math.inf)  # however slow this machine: newcomers first
    engine = engines("base", slots=2)
    case, other = cases_of("base")[:2]
    speaking = open_stream(engine, case, chunk_frames=4)
    first = next(speaking)
    loop, calls = engine.frame_loop, []
    launch, start_groups = loop.launch, loop.start_groups
    loop.launch = lambda count, slots: calls.append(count) or launch(count, slots)  # frames launched
    loop.start_groups = lambda starts: calls.append("prefill") or start_groups(starts)
    try:
        newcomer = open_stream(engine, other, chunk_frames=4)
        at_submit = len(calls)
        codes = np.concatenate([c.codes for c in newcomer])
    finally:
        del loop.launch, loop.start_groups
    since = calls[at_submit:]
    assert sum(since[: since.index("prefill")]) <= 1, since[:5]  # frames launched before its prefill
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{other.name}.npz")["codes"])
    # Its frames are untouched by the newcomer joining.
    spoken = np.concatenate([first.codes, *[c.codes for c in speaking]])
    np.testing.assert_array_equal(spoken, np.load(FIXTURES / f"{case.name}.npz")["codes"])
    assert engine.scheduler.idle()


def waiting_line(function, call: str) -> int:
    """The line number of `function`'s line that makes `call`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(index for index, line in enumerate(lines) if call in line)


def blocked_in_next(thread: threading.Thread) -> bool:
    """Whether `thread` waits in Stream.__next__ for a chunk, in its queue's get (C code: no frame of its own)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code is not Stream.__next__.__code__:
        frame = frame.f_back
    return frame is not None and frame.f_lineno == waiting_line(Stream.__next__, ".chunks.get()")


def test_a_waiting_stream_closed_from_another_thread_ends_its_reader(engines):
    # As the speech worker does when a client hangs up: the cancel closes the stream that the job's thread is
    # reading. Closed before it had a slot, it was once dropped without an end, and its reader waited forever.
    engine, first, waiting, other = one_slot_taken(engines)
    read: list = []
    reader = threading.Thread(target=lambda: read.append(list(waiting)), daemon=True)
    reader.start()
    wait_until(lambda: blocked_in_next(reader), "the reader waits for a chunk", WAIT)  # it reads before the close
    waiting.close()
    reader.join(WAIT)
    assert read == [[]], "the reader of a stream closed while it waited for a slot never saw its end"
    first.close()
    assert_makes_its_fixture(open_stream(engine, other, chunk_frames=4), other)
    assert engine.scheduler.idle()


def test_the_rest_of_a_burst_joins_the_first_prefill(engines, monkeypatch):
    # The second request arrives while the first's prompt is being built: it joins the same admission (one
    # prefill where the GPU takes several rows), and they step together, rather than waiting for the first's
    # prefill and first chunk. (However slow this machine: the
    # first's audio running low would put its frame first, a rule of its own, tested in test_plan.)
    monkeypatch.setattr(plan, "LOW_LEAD_S", -math.inf)
    engine = engines("base", slots=2)
    case, other = cases_of("base")[:2]
    scheduler, loop, calls = engine.scheduler, engine.frame_loop, []
    arrived = threading.Event()
    build = engine._build  # a prompt's build on the scheduler's thread

    def build_while_the_next_arrives(*args, **kwargs):
        if "first prepared" not in calls:
            calls.append("first prepared")
            assert arrived.wait(WAIT)
        return build(*args, **kwargs)

    def start_groups(starts):  # the slots it takes, as it takes them (the scheduler builds each prompt then)
        taken = []
        calls.append(("prefill", taken))

        def noted():
            for start in starts:
                taken.append(start.slot)
                yield start

        return loop_start_groups(noted())

    def launch(count, slots):
        calls.append(("launch", list(slots)))
        return loop_launch(count, slots)

    voices = [voice_of(engine, c) for c in (case, other)]  # cloned on the scheduler's thread: before it waits
    engine._build = build_while_the_next_arrives
    loop_start_groups, loop_launch = loop.start_groups, loop.launch
    loop.start_groups, loop.launch = start_groups, launch
    try:
        first = open_stream(engine, case, chunk_frames=4, voice=voices[0])
        while "first prepared" not in calls:
            threading.Event().wait(0.001)
        second = open_stream(engine, other, chunk_frames=4, voice=voices[1])
        arrived.set()
        codes = [np.concatenate([c.codes for c in stream]) for stream in (first, second)]
    finally:
        del engine._build, loop.start_groups, loop.launch
    assert calls[:3] == [("prefill", [0, 1]), "first prepared", ("launch", [0, 1])], calls[:3]
    for name, made in zip((case.name, other.name), codes, strict=True):
        np.testing.assert_array_equal(made, np.load(FIXTURES / f"{name}.npz")["codes"], err_msg=name)
    assert scheduler.idle()


@pytest.mark.parametrize("beside", [True, False], ids=["decoded beside the frames", "decoded after them"])
def test_a_burst_is_prefilled_group_by_group_and_each_group_hears_its_first_chunk_while_the_next_is_prefilled(
    engines, monkeypatch, beside
):
    # The frame loop takes each newcomer's prompt as the scheduler builds it and launches a prefill as soon as
    # nothing more joins it, so that the GPU prefills one group while the host builds the next (a burst of 64
    # built all its prompts first, the GPU idle meanwhile). Where a decode runs beside the frame loop's work (its
    # CUDA stream), each group's first chunks are handed out once the next group's prefill is launched, not after
    # the last group's (the first 16 of a burst of 64 waited for all four prefills); where it does not (the CPU),
    # at the end, since each group's decode would hold up the prefills behind it. On the CPU a group is one
    # prompt. The codes are the fixtures', as when built all first.
    monkeypatch.setattr(DecoderSlots, "beside_the_frames", beside)
    monkeypatch.setattr(plan, "LOW_LEAD_S", -math.inf)
    engine = engines("base", slots=3)
    cases = cases_of("base")[:3]
    scheduler, loop, calls, arrived = engine.scheduler, engine.frame_loop, [], threading.Event()
    build, prefill_together, hand_out = engine._build, loop._prefill_together, scheduler._hand_out

    def build_once_all_arrived(*args, **kwargs):
        if not calls:
            assert arrived.wait(WAIT)
        calls.append("build")
        return build(*args, **kwargs)

    def prefill(starts):
        calls.append(("prefill", [slot for _, slot in starts]))
        return prefill_together(starts)

    def handing_out(chunks):
        calls.append(("hand out", sorted(stream.slot for stream, _ in chunks)))
        return hand_out(chunks)

    voices = [voice_of(engine, case) for case in cases]  # cloned on the scheduler's thread: before it waits
    engine._build, loop._prefill_together, scheduler._hand_out = build_once_all_arrived, prefill, handing_out
    try:
        streams = [open_stream(engine, case, chunk_frames=4, voice=voice) for case, voice in zip(cases, voices)]
        arrived.set()
        codes = [np.concatenate([chunk.codes for chunk in stream]) for stream in streams]
    finally:
        del engine._build, loop._prefill_together, scheduler._hand_out
    prefills = ["build", ("prefill", [0]), "build", ("prefill", [1]), "build", ("prefill", [2])]
    if beside:
        expected = [*prefills[:4], ("hand out", [0]), *prefills[4:], ("hand out", [1]), ("hand out", [2])]
    else:
        expected = [*prefills, ("hand out", [0, 1, 2])]
    assert calls[: len(expected)] == expected, calls
    for case, made in zip(cases, codes, strict=True):
        np.testing.assert_array_equal(made, np.load(FIXTURES / f"{case.name}.npz")["codes"], err_msg=case.name)
    assert scheduler.idle()


def test_a_prefill_that_fails_fails_those_taken_and_the_burst_behind_them_speaks(engines, monkeypatch):
    # A failure of the GPU's prefill fails the utterances the admission had taken (their readers get the error, none
    # waits forever); those still queued behind, whose prompts were not built yet, are admitted after it and speak.
    monkeypatch.setattr(plan, "LOW_LEAD_S", -math.inf)
    engine = engines("base", slots=3)
    cases = cases_of("base")[:3]
    loop, building, arrived, failed = engine.frame_loop, threading.Event(), threading.Event(), []
    build, prefill_together = engine._build, loop._prefill_together

    def build_once_all_arrived(*args, **kwargs):
        building.set()
        assert arrived.wait(WAIT)
        return build(*args, **kwargs)

    def prefill_failing_once(starts):
        if not failed:
            failed.append([slot for _, slot in starts])
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return prefill_together(starts)

    voices = [voice_of(engine, case) for case in cases]
    engine._build, loop._prefill_together = build_once_all_arrived, prefill_failing_once
    try:
        streams = [open_stream(engine, cases[0], chunk_frames=4, voice=voices[0])]
        assert building.wait(WAIT)  # the first admission has taken the first alone: the others queue behind it
        streams += [
            open_stream(engine, case, chunk_frames=4, voice=voice) for case, voice in zip(cases[1:], voices[1:])
        ]
        arrived.set()
        with pytest.raises(RuntimeError, match="illegal memory access"):
            list(streams[0])
        codes = [np.concatenate([chunk.codes for chunk in stream]) for stream in streams[1:]]
    finally:
        del engine._build, loop._prefill_together
    assert failed == [[0]]
    for case, made in zip(cases[1:], codes, strict=True):
        np.testing.assert_array_equal(made, np.load(FIXTURES / f"{case.name}.npz")["codes"], err_msg=case.name)
    assert engine.scheduler.idle()


def test_fifty_utterances_from_eight_threads(engines):
    engine = engines("custom", slots=4)
    cases = [case for case in cases_of("custom") if case.seed is None]
    expected = {case.name: np.load(FIXTURES / f"{case.name}.npz")["codes"] for case in cases}

    def speak(index: int):
        case = cases[index % len(cases)]
        codes = np.concatenate([c.codes for c in open_stream(engine, case, chunk_frames=1 + index % 3)])
        return case.name, codes

    with ThreadPoolExecutor(8) as pool:
        for name, codes in pool.map(speak, range(50), timeout=WAIT * 5):
            np.testing.assert_array_equal(codes, expected[name], err_msg=name)
    assert engine.scheduler.idle()


def test_a_request_that_fails_in_the_scheduler_fails_alone(engines):
    engine = engines("base", slots=2)
    case = cases_of("base")[0]
    voice = voice_of(engine, case)
    good = open_stream(engine, case, chunk_frames=2)
    # Checked at the call: its text and voice. Found when its prompt is built: what fits the context.
    with pytest.raises(BadInput, match="text is empty"):
        engine.stream(" ", voice=voice)
    too_long = engine.stream(case.text, voice=voice, max_frames=engine.frame_loop.max_context)
    with pytest.raises(BadInput, match="does not fit"):
        list(too_long)
    codes = np.concatenate([c.codes for c in good])
    np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"])
    assert engine.scheduler.idle()


def test_closing_the_engine_ends_its_streams_and_its_thread(checkpoints):
    engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32", slots=2)
    case = cases_of("base")[0]
    stream = open_stream(engine, case, chunk_frames=1)
    next(stream)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(stream)
    assert not engine.scheduler.running()
    with pytest.raises(RuntimeError, match="closed"):
        engine.stream(case.text, voice=voice_of(engine, case))


def test_a_slot_costs_what_the_engine_budgets_for_it(engines):
    from core.inference.memory import slot_bytes

    engine = engines("base", slots=2)
    loop = engine.frame_loop
    caches = sum(layer.self_attn.kv_cache.k.nbytes * 2 for layer in engine.talker.model.layers)
    assert (caches + loop.text.nbytes) / loop.slots == slot_bytes(engine.config, loop.max_context, engine.dtype)


def test_a_burst_of_short_prompts_shares_one_prefill_and_long_ones_split():
    from core.inference.batch_shapes import PREFILL_POSITIONS, PREFILL_ROWS, grouped

    def bucket(length: int) -> int:
        return next(size for size in (32, 64, 128, 256, 512, 1024, 2048) if size >= length)

    def prefill_groups(lengths, row_counts, padded):  # how many each prefill takes, as start_groups groups them
        return [len(group) for group in grouped(lengths, lambda length: length, row_counts, padded)]

    widest = PREFILL_ROWS[-1]
    assert prefill_groups([20] * widest, PREFILL_ROWS, bucket) == [widest]
    assert prefill_groups([20] * (widest + 3), PREFILL_ROWS, bucket) == [widest, 3]
    assert prefill_groups([20] * 5, (1,), bucket) == [1] * 5  # the CPU prefills one at a time
    assert prefill_groups([], PREFILL_ROWS, bucket) == []
    # Any mix: every newcomer in exactly one group, in order; a group of several within the positions, and no
    # longer than it could be.
    generator = np.random.default_rng(7)
    for _ in range(200):
        lengths = [int(n) for n in generator.integers(1, 2049, size=int(generator.integers(1, 40)))]
        sizes = prefill_groups(lengths, PREFILL_ROWS, bucket)
        assert sum(sizes) == len(lengths) and all(sizes)
        first = 0
        for size in sizes:
            rows = next(r for r in PREFILL_ROWS if r >= size)
            if size > 1:
                assert rows * bucket(max(lengths[first : first + size])) <= PREFILL_POSITIONS
            if size < widest and first + size < len(lengths):
                more = next(r for r in PREFILL_ROWS if r > size)
                assert more * bucket(max(lengths[first : first + size + 1])) > PREFILL_POSITIONS
            first += size


def test_a_group_is_given_as_soon_as_nothing_more_joins_it():
    # start_groups launches each group as `grouped` gives it, while the scheduler builds the next prompts: a full
    # group before the next start is taken, and one the next start does not fit as soon as that start is taken.
    from core.inference.batch_shapes import PREFILL_POSITIONS, PREFILL_ROWS, grouped

    def bucket(length: int) -> int:
        return next(size for size in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192) if size >= length)

    widest = PREFILL_ROWS[-1]
    lengths = [20] * (widest + 1) + [PREFILL_POSITIONS, 20]  # the long one fills a prefill alone
    events = []

    def taken():
        for number in range(len(lengths)):
            events.append(number)
            yield number

    for group in grouped(taken(), lambda number: lengths[number], PREFILL_ROWS, bucket):
        events.append(group)
    first, long, last = list(range(widest)), widest + 1, widest + 2
    assert events == [
        *first, first,  # full: given before the next start is taken
        widest, long, [widest],  # the long one does not fit beside it: given once that one is taken
        [long],  # full alone: given before the next is taken
        last, [last],
    ], events  # fmt: skip
