"""The requantiser's rounding modes (sim.models.golden.rounding_shift) against exact rational
arithmetic and against TFLite's reference-kernel arithmetic written out in Python integers."""

import math
from fractions import Fraction

import numpy as np
import pytest

from sim.models import golden
from sim.models.golden import DOUBLE, HALF_EVEN, HALF_UP

SEED = 3601
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _edges(rng, n):
    """Products ``t * m`` of int32 values, the extremes included, and exact ties."""
    t = np.concatenate([rng.integers(INT32_MIN, INT32_MAX + 1, n),
                        [INT32_MIN, INT32_MAX, -1, 0, 1, INT32_MIN, INT32_MAX]])
    m = np.concatenate([rng.integers(INT32_MIN, INT32_MAX + 1, n),
                        [INT32_MIN, INT32_MIN, 1, 7, -1, INT32_MAX, INT32_MAX]])
    p = [int(a) * int(b) for a, b in zip(t, m, strict=True)]
    return p


def _ties(s):
    """Values exactly halfway, and one either side, at shift ``s``."""
    out = []
    for k in (-3, -2, -1, 0, 1, 2, 5):
        half = (2 * k + 1) << (s - 1) if s else 0
        out += [half - 1, half, half + 1]
    return [v for v in out if -(1 << 62) <= v <= 1 << 62]


def _round(x: Fraction, mode: str) -> int:
    f = math.floor(x)
    r = x - f
    if r != Fraction(1, 2):
        return f + (r > Fraction(1, 2))
    return {"up": f + 1, "even": f + (f & 1), "away": f + 1 if x > 0 else f}[mode]


@pytest.mark.parametrize("s", [0, 1, 2, 7, 8, 15, 16, 30, 31, 32, 33, 40, 47, 55, 62, 63])
def test_half_up_and_half_even_are_exact(s):
    rng = np.random.default_rng(SEED + s)
    print(f"seed {SEED + s}")
    values = _edges(rng, 400) + _ties(s)
    up = golden.rounding_shift(values, s, HALF_UP)
    even = golden.rounding_shift(values, s, HALF_EVEN)
    for v, u, e in zip(values, up, even, strict=True):
        x = Fraction(v, 1 << s)
        assert u == _round(x, "up"), (v, s)
        assert e == _round(x, "even"), (v, s)


def _srdhm(a: int, b: int) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul, as TFLite's reference kernels run it."""
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    q = abs(ab + nudge) >> 31                       # C++ division truncates towards zero
    return q if ab + nudge >= 0 else -q


def _rdbpot(x: int, e: int) -> int:
    """gemmlowp's RoundingDivideByPOT."""
    mask = (1 << e) - 1
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if (x & mask) > threshold else 0)


def _mbqm(x: int, multiplier: int, shift: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier (double rounding): ``shift`` > 0 is a left
    shift of ``x`` (int32, so only without overflow), < 0 a rounding right shift."""
    left, right = max(shift, 0), max(-shift, 0)
    return _rdbpot(_srdhm(x << left, multiplier), right)


@pytest.mark.parametrize("tfl_shift", [-31, -30, -20, -12, -8, -5, -2, -1, 0, 1, 3, 8])
def test_double_is_tflite_multiply_by_quantized_multiplier(tfl_shift):
    """``DOUBLE`` at ``shift = 31 - tflite_shift`` is TFLite's arithmetic, for every int32
    value whose left shift (a positive TFLite shift) does not overflow int32."""
    seed = SEED + 100 + tfl_shift
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    s = 31 - tfl_shift
    limit = INT32_MAX >> max(tfl_shift, 0)
    xs = list(rng.integers(-limit - 1, limit + 1, 600)) + [-limit - 1, limit, 0, 1, -1]
    ms = list(rng.integers(1 << 30, 1 << 31, 600)) + [1 << 30, INT32_MAX, INT32_MAX,
                                                        1 << 30, (1 << 31) - 2]
    # Ties of either rounding: with m = 2**30, p / 2**31 = x / 2.
    rs = max(-tfl_shift, 0)
    for k in range(-20, 20):
        for d in (-1, 0, 1):
            x = ((2 * k + 1) << rs) + d
            if -limit - 1 <= x <= limit:
                xs.append(x)
                ms.append(1 << 30)
    got = golden.rounding_shift([int(x) * int(m) for x, m in zip(xs, ms, strict=True)], s, DOUBLE)
    for x, m, g in zip(xs, ms, got, strict=True):
        assert g == _mbqm(int(x), int(m), tfl_shift), (x, m, tfl_shift)


def test_double_rounds_twice():
    """A value just below a tie of the second rounding that the first rounding lifts onto it:
    DOUBLE and a single rounding differ, as TFLite's kernels do."""
    p = 5 << 30                         # p / 2**31 = 2.5 -> 3 (ties up) -> 1.5 -> 2 (away)
    assert golden.rounding_shift([p], 32, DOUBLE)[0] == _mbqm(5, 1 << 30, -1) == 2
    assert golden.rounding_shift([p], 32, HALF_UP)[0] == 1      # p / 2**32 = 1.25
    # -2.5 -> -2 (ties up) -> -1 exactly; a single rounding of -1.25 gives -1 too.
    assert golden.rounding_shift([-p], 32, DOUBLE)[0] == _mbqm(-5, 1 << 30, -1) == -1


def test_per_column_shift_broadcasts():
    p = np.array([[5, 5, 5], [-6, -6, -6]])
    assert (golden.rounding_shift(p, [0, 1, 2], HALF_EVEN) == [[5, 2, 1], [-6, -3, -2]]).all()
    q = golden.requantise(np.array([[8, 8]]), [0, 0], [1, 1], [1, 3], 0, HALF_EVEN)
    assert (q == [[4, 1]]).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="shift.*allowed: 0 to 63"):
        golden.rounding_shift([1], [0, 64])
    with pytest.raises(ValueError, match="rounding=3 is not a rounding mode"):
        golden.rounding_shift([1], 1, 3)
