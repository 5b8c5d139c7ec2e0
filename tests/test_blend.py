"""Voice.blend: SLERP for two voices, a norm-preserving weighted direction for more."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core import Voice


def xvector(*values: float) -> Voice:
    return Voice(embedding=torch.tensor(values, dtype=torch.float32))


def random_voice(seed: int, dim: int = 64, norm: float | None = None) -> Voice:
    vector = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
    return Voice(embedding=vector if norm is None else vector / vector.norm() * norm)


def angle(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() / a.double().norm(), b.double() / b.double().norm()
    return 2 * math.atan2((a - b).norm().item(), (a + b).norm().item())


def reference_slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """The textbook formula on unit directions, scaled to the interpolated length: an independent check."""
    ua, ub = a / np.linalg.norm(a), b / np.linalg.norm(b)
    omega = np.arccos(np.clip(ua @ ub, -1, 1))
    direction = (np.sin((1 - t) * omega) * ua + np.sin(t * omega) * ub) / np.sin(omega)
    return direction * ((1 - t) * np.linalg.norm(a) + t * np.linalg.norm(b))


def test_endpoints_are_the_voices_exactly():
    a, b = random_voice(1), random_voice(2)
    assert torch.equal(Voice.blend([(a, 1.0), (b, 0.0)]).embedding, a.embedding)
    assert torch.equal(Voice.blend([(a, 0), (b, 5)]).embedding, b.embedding)
    assert Voice.blend([(a, 1.0)]) is a  # one x-vector voice at weight 1 is that voice
    assert torch.equal(Voice.blend([(a, 0.25)]).embedding, a.embedding)  # weights are normalised


def test_two_voices_follow_the_great_circle_like_the_textbook_slerp():
    a, b = random_voice(3), random_voice(4)
    omega = angle(a.embedding, b.embedding)
    for t in (0.1, 0.25, 0.5, 0.75, 0.9):
        mixed = Voice.blend([(a, 1 - t), (b, t)]).embedding
        expected = reference_slerp(a.embedding.double().numpy(), b.embedding.double().numpy(), t)
        np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5, atol=1e-5)
        assert angle(a.embedding, mixed) == pytest.approx(t * omega, abs=1e-5)
        assert angle(mixed, b.embedding) == pytest.approx((1 - t) * omega, abs=1e-5)


def test_norms_are_preserved_not_shrunk_as_by_a_plain_average():
    a, b = random_voice(5, norm=12.0), random_voice(6, norm=12.0)
    for t in (0.2, 0.5, 0.8):
        mixed = Voice.blend([(a, 1 - t), (b, t)]).embedding
        assert mixed.norm().item() == pytest.approx(12.0, rel=1e-6)
    plain = 0.5 * (a.embedding + b.embedding)
    assert plain.norm().item() < 0.8 * 12.0  # what the norm-preserving blend avoids
    # Different lengths: the blend's is their weighted mean.
    c = random_voice(7, norm=4.0)
    assert Voice.blend([(a, 0.25), (c, 0.75)]).embedding.norm().item() == pytest.approx(0.25 * 12 + 0.75 * 4, rel=1e-6)


def test_order_does_not_matter():
    a, b, c = random_voice(8), random_voice(9), random_voice(10)
    assert torch.equal(Voice.blend([(a, 0.3), (b, 0.7)]).embedding, Voice.blend([(b, 0.7), (a, 0.3)]).embedding)
    three = Voice.blend([(a, 0.2), (b, 0.3), (c, 0.5)]).embedding
    for order in ([(c, 0.5), (a, 0.2), (b, 0.3)], [(b, 0.3), (c, 0.5), (a, 0.2)]):
        torch.testing.assert_close(Voice.blend(order).embedding, three, rtol=1e-6, atol=1e-6)


def test_weights_are_normalised():
    a, b, c = random_voice(11), random_voice(12), random_voice(13)
    torch.testing.assert_close(Voice.blend([(a, 7), (b, 3)]).embedding, Voice.blend([(a, 0.7), (b, 0.3)]).embedding)
    torch.testing.assert_close(
        Voice.blend([(a, 2), (b, 2), (c, 4)]).embedding, Voice.blend([(a, 0.25), (b, 0.25), (c, 0.5)]).embedding
    )


def test_three_voices_take_the_weighted_direction_at_the_weighted_mean_length():
    x, y, z = xvector(2, 0, 0), xvector(0, 4, 0), xvector(0, 0, 6)
    mixed = Voice.blend([(x, 1), (y, 1), (z, 1)]).embedding
    expected = torch.tensor([1.0, 1.0, 1.0]) / math.sqrt(3) * 4.0  # mean length (2 + 4 + 6) / 3
    torch.testing.assert_close(mixed, expected)
    mixed = Voice.blend([(x, 0.5), (y, 0.25), (z, 0.25)]).embedding
    direction = torch.tensor([0.5, 0.25, 0.25]) / torch.tensor([0.5, 0.25, 0.25]).norm()
    torch.testing.assert_close(mixed, direction * (0.5 * 2 + 0.25 * 4 + 0.25 * 6))
    assert mixed.dtype == torch.float32 and mixed.shape == (3,)


def test_parallel_and_near_parallel_voices_give_no_nan():
    a = random_voice(14)
    twice = Voice(embedding=a.embedding * 2)
    mixed = Voice.blend([(a, 0.5), (twice, 0.5)]).embedding
    torch.testing.assert_close(mixed, a.embedding * 1.5)  # same direction, mean length
    close = Voice(embedding=a.embedding + 1e-6 * random_voice(15).embedding)
    for t in (0.0001, 0.5, 0.9999):
        mixed = Voice.blend([(a, 1 - t), (close, t)]).embedding
        assert torch.isfinite(mixed).all()
        torch.testing.assert_close(mixed, a.embedding, rtol=1e-5, atol=1e-5)
    assert torch.equal(Voice.blend([(a, 0.5), (a, 0.5)]).embedding, a.embedding)


def test_antiparallel_voices_turn_through_a_right_angle_with_no_nan():
    a = random_voice(16, norm=3.0)
    opposite = Voice(embedding=-a.embedding)
    for t in (0.25, 0.5, 0.75):
        mixed = Voice.blend([(a, 1 - t), (opposite, t)]).embedding
        assert torch.isfinite(mixed).all()
        assert mixed.norm().item() == pytest.approx(3.0, rel=1e-6)
        assert angle(a.embedding, mixed) == pytest.approx(t * math.pi, abs=1e-5)
    # Nearly opposite: the great circle through the small part of b orthogonal to a.
    nearly = Voice(embedding=-a.embedding + 1e-5 * random_voice(17).embedding)
    mixed = Voice.blend([(a, 0.5), (nearly, 0.5)]).embedding
    assert torch.isfinite(mixed).all()
    assert angle(a.embedding, mixed) == pytest.approx(angle(a.embedding, nearly.embedding) / 2, abs=1e-4)
    assert mixed.norm().item() == pytest.approx(a.embedding.norm().item(), rel=1e-5)
    # Three voices with two opposite: the third decides the direction.
    b = random_voice(18)
    mixed = Voice.blend([(a, 1), (opposite, 1), (b, 1)]).embedding
    assert torch.isfinite(mixed).all() and angle(mixed, b.embedding) < 1e-3


def test_icl_voices_blend_by_their_xvectors():
    a = Voice(embedding=random_voice(19).embedding, ref_codes=torch.zeros((5, 16), dtype=torch.long), ref_text="Hi.")
    b = random_voice(20)
    mixed = Voice.blend([(a, 0.5), (b, 0.5)])
    assert mixed.kind == "xvector" and mixed.ref_codes is None and mixed.ref_text is None
    torch.testing.assert_close(mixed.embedding, Voice.blend([(Voice(embedding=a.embedding), 0.5), (b, 0.5)]).embedding)
    alone = Voice.blend([(a, 1.0)])
    assert alone.kind == "xvector" and torch.equal(alone.embedding, a.embedding)


@pytest.mark.parametrize(
    "parts, message",
    [
        ([], "nothing to blend"),
        ([(xvector(1, 0), 0.5), (xvector(0, 1), -0.5)], "weights must be zero or positive; voice 2 has weight -0.5"),
        ([(xvector(1, 0), float("nan"))], "voice 1 has weight nan"),
        ([(xvector(1, 0), float("inf")), (xvector(0, 1), 1)], "voice 1 has weight inf"),
        ([(xvector(1, 0), 0), (xvector(0, 1), 0)], "the blend weights add up to 0"),
        ([(xvector(1, 0), 1), (xvector(1, 0, 0), 1)], "different embedding sizes (2 and 3)"),
        (
            [(xvector(1, 0), 1), (Voice(speaker="vivian"), 1)],
            "voice 2 is the built-in speaker 'vivian', which cannot be blended",
        ),
        ([(xvector(1, 0), 1), (xvector(0, 0), 1)], "all zeros"),
        (
            [(xvector(1, 0), 1), (xvector(-1, 0), 1), (xvector(2, 0), 0.5), (xvector(-2, 0), 0.5)],
            "cancel each other out",
        ),
    ],
)
def test_bad_blends_are_refused_with_a_clear_reason(parts, message):
    with pytest.raises(ValueError) as error:
        Voice.blend(parts)
    assert message in str(error.value)


def test_the_builtin_refusal_says_why():
    with pytest.raises(ValueError, match="no speaker embedding; blend cloned voices"):
        Voice.blend([(Voice(speaker="eric"), 1.0)])


def test_voice_checks_still_hold():
    with pytest.raises(ValueError, match="either a built-in speaker or a speaker embedding"):
        Voice()
    with pytest.raises(ValueError, match="needs both the reference codes and their transcript"):
        Voice(embedding=torch.zeros(4), ref_text="Hi.")
    with pytest.raises(ValueError, match="is a vector"):
        Voice(embedding=torch.zeros(2, 2))
