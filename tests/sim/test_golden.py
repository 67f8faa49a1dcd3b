"""The golden model's own semantics, checked against plain Python integers."""

import math
from fractions import Fraction

import numpy as np
import pytest

from hdl import isa
from sim.models.golden import (
    DOUBLE,
    HALF_EVEN,
    HALF_UP,
    MatrixUnitModel,
    activate,
    exact_matmul,
    from_raw,
    matmul,
    operand_range,
    reciprocals,
    requantise,
    requantise_normalised,
    table_values,
    to_raw,
    wrap,
)

SEED = 20261130


def test_wrap_is_twos_complement():
    assert list(wrap([2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 + 5])) == \
        [2**31 - 1, -2**31, -2**31, 2**31 - 1, 5]


def test_raw_round_trip():
    for signed in (False, True):
        lo, hi = operand_range(signed)
        values = np.arange(lo, hi + 1)
        assert np.array_equal(from_raw(to_raw(values), signed), values)
    assert list(to_raw([-128, -1, 0, 127])) == [128, 255, 0, 127]


@pytest.mark.parametrize("x_signed", [False, True])
@pytest.mark.parametrize("w_signed", [False, True])
def test_matmul_matches_python_integers(x_signed, w_signed):
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    xl, xh = operand_range(x_signed)
    wl, wh = operand_range(w_signed)
    x = rng.integers(xl, xh + 1, (5, 7))
    w = rng.integers(wl, wh + 1, (7, 3))
    got = matmul(x, w, x_signed=x_signed, w_signed=w_signed)
    for i in range(5):
        for j in range(3):
            assert got[i, j] == sum(int(x[i, k]) * int(w[k, j]) for k in range(7))


def test_matmul_extremes():
    k = 8
    assert matmul(np.full((1, k), -128), np.full((k, 1), -128))[0, 0] == k * 16384
    assert matmul(np.full((1, k), 255), np.full((k, 1), 255),
                  x_signed=False, w_signed=False)[0, 0] == k * 65025
    assert matmul(np.full((1, k), -128), np.full((k, 1), 255), w_signed=False)[0, 0] == \
        k * -32640


def test_matmul_wraps_at_int32():
    # 2**16 products of 255 * 255 sum to 4.26e9, past 2**32: the result wraps.
    k = 1 << 16
    x = np.full((1, k), 255)
    w = np.full((k, 1), 255)
    exact = k * 255 * 255
    assert matmul(x, w, x_signed=False, w_signed=False)[0, 0] == \
        ((exact + 2**31) % 2**32) - 2**31


def test_matmul_rejects_out_of_range_operands():
    with pytest.raises(ValueError, match=r"x holds values outside -128\.\.127"):
        matmul([[128]], [[1]])
    with pytest.raises(ValueError, match=r"w holds values outside 0\.\.255"):
        matmul([[1]], [[-1]], w_signed=False)
    with pytest.raises(ValueError, match=r"\(M, K\) @ \(K, N\)"):
        matmul([[1, 2]], [[1, 2]])


def test_matrix_unit_model_switches_tiles_in_order():
    model = MatrixUnitModel(rows=2, cols=2)
    model.push_tile([[1, 0], [0, 1]], signed=True)
    model.push_tile([[2, 0], [0, 2]], signed=True)
    assert list(model.push_act([3, 4], signed=True, switch=True)) == [3, 4]
    assert list(model.push_act([5, 6], signed=True, switch=False)) == [5, 6]
    assert list(model.push_act([5, 6], signed=True, switch=True)) == [10, 12]
    with pytest.raises(ValueError, match="no weight tile queued"):
        model.push_act([1, 1], signed=True, switch=True)


def test_matrix_unit_model_needs_a_switch_first():
    model = MatrixUnitModel(rows=1, cols=1)
    with pytest.raises(ValueError, match="before the first tile switch"):
        model.push_act([1], signed=True, switch=False)


def test_activate_table_takes_bytes_or_int8():
    """Function 5 (TABLE) reads ``table[q + 128]`` as an int8, the table given as raw bytes
    (a list, an array or ``bytes``) or as int8 values; the extremes of both ends."""
    raw = (np.arange(256) * 37 + 11) % 256
    raw[[0, 255, 128]] = [0x80, 0xFF, 0x7F]
    int8 = np.where(raw >= 128, raw - 256, raw)
    q = np.array([[-128, 127], [0, -1]])
    want = [[-128, -1], [127, int8[127]]]
    for table in (raw, raw.tolist(), bytes(raw.tolist()), int8, int8.astype(np.int8)):
        assert activate(q, 5, table=table).tolist() == want
    assert activate(np.arange(-128, 128), 5, table=raw).tolist() == int8.tolist()
    assert table_values(raw).tolist() == int8.tolist()


@pytest.mark.parametrize("table, message", [
    (None, r"func=5 \(TABLE\) needs the table"),
    (np.zeros(255), r"the table has shape \(255,\); allowed: 256 entries"),
    (np.zeros((2, 128)), r"the table has shape \(2, 128\)"),
    (np.full(256, 0.5), r"the table holds float64 values; allowed: integers -128 to 255"),
    (np.full(256, 256), r"the table holds values outside -128..255 \(int8 or uint8\): "
                        r"min 256, max 256"),
    (np.full(256, -129), r"outside -128..255"),
])
def test_activate_table_errors(table, message):
    with pytest.raises(ValueError, match=message):
        activate([0], 5, table=table)


def test_activate_function_6_needs_the_accumulators_and_7_is_not_a_function():
    with pytest.raises(ValueError, match=r"func=6 \(NORMALISE\) is not a function of q: .* "
                                         r"use requantise_normalised\(acc, bias, shift, "
                                         r"zero_point, rounding\)"):
        activate([0], 6, table=np.zeros(256, dtype=np.int64))
    with pytest.raises(ValueError, match=r"func=7 is not an activation function; allowed: "
                                         r"0 to 5 \(and 6, NORMALISE, through "
                                         r"requantise_normalised\)"):
        activate([0], 7, table=np.zeros(256, dtype=np.int64))


# NORMALISE ----------------------------------------------------------------------------------

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
B, S = isa.RECIPROCAL_BITS, isa.RECIPROCAL_SCALE


def divisors(rng) -> list[int]:
    """int32 divisors: the named edges, every power of two and its neighbours (both signs),
    every value below 2**12, and random ones of every bit length."""
    values = [1, 255, 256, 511, 512, 513, INT32_MAX, 0, -1, INT32_MIN]
    for k in range(32):
        for v in (1 << k) - 1, 1 << k, (1 << k) + 1:
            values += [v, -v]
    values += list(range(-16, 1 << 12))
    for bits in range(1, 32):
        values += [int(v) for v in rng.integers(1 << (bits - 1), 1 << bits, 50)]
    values += [int(v) for v in rng.integers(INT32_MIN, INT32_MAX + 1, 2000)]
    return sorted({v for v in values if INT32_MIN <= v <= INT32_MAX})


def test_reciprocals_equal_hdl_isa_reciprocal():
    """golden.reciprocals is hdl.isa.reciprocal element by element, and keeps the shape."""
    rng = np.random.default_rng(SEED)
    d = divisors(rng)
    recip, e = reciprocals(d)
    for value, r, x in zip(d, recip.tolist(), e.tolist(), strict=True):
        assert (r, x) == isa.reciprocal(value), value
    assert reciprocals(1) == (1 << S, 0)
    assert [int(v) for v in reciprocals(INT32_MAX)] == [65664, 31 - B]
    r2, e2 = reciprocals(np.array([[1, 0], [-5, 512]]))
    assert r2.shape == e2.shape == (2, 2)
    assert r2.tolist() == [[1 << S, 0], [0, isa.reciprocal(512)[0]]]
    assert e2.tolist() == [[0, 0], [0, 1]]


def test_reciprocal_precision_is_as_documented():
    """docs/isa.md: ``recip / 2**e`` is ``2**S / d`` rounded to the nearest integer (ties
    up) for ``0 < d < 2**B``, and within a relative ``2**(1 - B)`` of it above (every cut
    value ``m`` at every ``e``, both ends of its range ``m * 2**e .. (m + 1) * 2**e - 1``,
    and every ``d`` below 2**17); the bound is nearly reached."""
    d = np.arange(1, 1 << B)
    recip, e = reciprocals(d)
    assert not e.any()
    # No 9-bit m puts 2**S / m on a half, so "ties up" never has to decide.
    assert not any((1 << S) % m * 2 == m for m in range(1, 1 << B))
    assert recip.tolist() == [((1 << (S + 1)) + int(v)) // (2 * int(v)) for v in d]
    assert recip.tolist() == [math.floor(Fraction(1 << S, int(v)) + Fraction(1, 2)) for v in d]
    m = np.arange(1 << (B - 1), 1 << B)
    big = [np.arange(1 << B, 1 << 17)]
    for cut in range(1, 32 - B + 1):
        big += [m << cut, ((m + 1) << cut) - 1]
    d = np.concatenate(big)
    d = d[d <= INT32_MAX]
    recip, e = reciprocals(d)
    assert e.max() == 31 - B
    # |recip * d / 2**(S + e) - 1| < 2**(1 - B), in integers (recip * d < 2**48).
    error = np.abs(recip * d - (np.int64(1) << (S + e)))
    assert (error << (B - 1) < (np.int64(1) << (S + e))).all()
    assert (error << B >= (np.int64(1) << (S + e))).any(), "the bound has no slack to hide"


def _round(x: Fraction, ties: str) -> int:
    f = math.floor(x)
    if x - f != Fraction(1, 2):
        return f + (x - f > Fraction(1, 2))
    return {"up": f + 1, "even": f + (f & 1), "away": f + 1 if x > 0 else f}[ties]


def _rounded(p: int, s: int, rounding: int) -> int:
    """``p / 2**s`` rounded by the mode, in rationals (docs/isa.md, Rounding modes)."""
    if rounding == HALF_EVEN:
        return _round(Fraction(p, 1 << s), "even")
    if rounding == DOUBLE and s > 31:
        h = _round(Fraction(p, 1 << 31), "up")
        return _round(Fraction(h, 1 << (s - 31)), "away")
    return _round(Fraction(p, 1 << s), "up")


def normalise_reference(acc, bias, shift, zero_point: int, rounding: int) -> list[list[int]]:
    """NORMALISE in Python integers, row by row: the divisor the raw last column,
    hdl.isa.reciprocal, the shift grown by the cut and clamped to 63."""
    out = []
    for row in np.asarray(acc).tolist():
        recip, e = isa.reciprocal(row[-1])
        q = []
        for j, a in enumerate(row):
            t = (a + int(bias[j]) - INT32_MIN) % (1 << 32) + INT32_MIN
            s = min(63, int(np.broadcast_to(shift, len(row))[j]) + e)
            r = max(INT32_MIN, min(INT32_MAX, _rounded(t * recip, s, rounding)))
            q.append(max(-128, min(127, r + zero_point)))
        out.append(q)
    return out


ROUNDINGS = {"half_up": HALF_UP, "half_even": HALF_EVEN, "double": DOUBLE}


@pytest.mark.parametrize("rounding", list(ROUNDINGS))
@pytest.mark.parametrize("cols", [1, 2, 5])
@pytest.mark.parametrize("per_column", [False, True], ids=["scalar", "per-column"])
def test_requantise_normalised_matches_python_integers(rounding, cols, per_column):
    """Random rows with the divisors of :func:`divisors` (0, negative, 1, 2**31 - 1 ...),
    the int32 extremes among the other columns and the biases (t = -2**31 and 2**31 - 1,
    wrapped sums), shifts from 0 to 63 (shift + e past 63 too, and DOUBLE's second rounding
    from 32 up), and planted exact ties: equal to the row-by-row reference."""
    mode = ROUNDINGS[rounding]
    seed = [SEED, cols, mode, per_column]
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    # The last 16 rows divide by 1, for the ties planted below.
    d = np.array(divisors(rng) + [1] * 16)
    rows = len(d)
    acc = rng.integers(INT32_MIN, INT32_MAX + 1, (rows, cols))
    acc[rng.random((rows, cols)) < 0.1] = INT32_MIN
    acc[rng.random((rows, cols)) < 0.1] = INT32_MAX
    small = rng.random((rows, cols)) < 0.4
    acc[small] = rng.integers(-3000, 3000, small.sum())
    acc[:, -1] = d
    bias = rng.integers(INT32_MIN, INT32_MAX + 1, cols)
    bias[rng.random(cols) < 0.5] = 0
    bias[-1] = rng.choice([0, INT32_MIN, INT32_MAX, 5])
    if per_column:
        shift = rng.choice([0, 1, 17, 25, 31, 32, 33, 40, 41, 42, 50, 62, 63], cols)
        shift[0] = rng.choice([10, 19, 25, 32, 40])        # where the quotients spread
    else:
        shift = [19, 32, 42][(cols + mode) % 3]            # 42: shift + e past 63 clamps
    # Exact ties at d = 1: recip = 2**S, so t = odd * 2**(s - S - 1) lands on a half.
    for j in range(cols - 1):
        sj = int(np.broadcast_to(shift, cols)[j])
        if S < sj <= S + 25:
            acc[-16:, j] = (rng.integers(-20, 20, 16) * 2 + 1) << (sj - S - 1)
            bias[j] = 0
    zp = int(rng.integers(-128, 128))
    got = requantise_normalised(acc, bias, shift, zp, mode)
    assert got.shape == (rows, cols) and got.dtype == np.int64
    assert got.tolist() == normalise_reference(acc, bias, shift, zp, mode)
    assert (got[d <= 0] == zp).all()
    if np.max(shift) >= 42:
        cut = reciprocals(d)[1]
        assert (cut[:, None] + np.broadcast_to(shift, cols) > 63).any(), "the clamp is used"
    if cols > 1:
        assert len(set(got[:, 0].tolist())) > 20, "outputs spread over the int8 range"


def test_requantise_normalised_extremes():
    """Hand-worked rows: the largest multiplier (d = 1) saturates at both ends and is exact
    at shift 56; d = 2**31 - 1 is cut (e = 22); d <= 0 gives the zero point; shift + e past
    63 clamps to 63 (and gives 0 there, as any p does); the divisor is read before the
    bias; the slot's shift is per column."""
    hi, lo = INT32_MAX, INT32_MIN
    # d = 1: recip = 2**25, so p = t * 2**25.
    acc = [[hi, 1], [lo, 1], [1, 1]]
    assert requantise_normalised(acc, [0, 0], 0, 0).tolist() == [[127, 127], [-128, 127],
                                                                  [127, 127]]
    assert requantise_normalised(acc, [0, 0], 56, 0).tolist() == [[1, 0], [-1, 0], [0, 0]]
    assert requantise_normalised(acc, [0, 0], 56, -3).tolist() == [[-2, -3], [-4, -3],
                                                                    [-3, -3]]
    # The bias wraps t: 2**31 - 1 + 1 = -2**31.
    assert requantise_normalised([[hi, 1]], [1, 0], 56, 0).tolist() == [[-1, 0]]
    # d = 2**31 - 1: e = 22, m = 511, recip = 65664; t = d at shift 19 (s = 41) is
    # 65664 * (2**31 - 1) / 2**41 = 64.12..., so 64; t = -2**31 gives -64.125 -> -64.
    assert requantise_normalised([[hi, hi], [lo, hi]], [0, 0], 19, 0).tolist() == \
        [[64, 64], [-64, 64]]
    # d <= 0: the multiplier is 0, every output the zero point, whatever t.
    for d in (0, -1, lo):
        assert requantise_normalised([[hi, d], [lo, d]], [5, 5], [0, 63], 9).tolist() == \
            [[9, 9], [9, 9]]
    # shift + e > 63 is 63: no error, and p / 2**63 is below 1/2 in magnitude.
    for mode in ROUNDINGS.values():
        assert requantise_normalised([[hi, hi], [lo, hi]], [0, 0], [63, 42], 7,
                                     mode).tolist() == [[7, 7], [7, 7]]
    # Before the bias: acc [100, 100] with bias [0, 100] divides by 100, not 200, so at
    # shift 19 column 0 is 100 / 100 * 64 and column 1 (t = 200) saturates.
    assert requantise_normalised([[100, 100]], [0, 100], 19, 0).tolist() == [[64, 127]]
    # Per-column shifts: t = 3 * 2**20 over d = 2**20 (e = 12): 3 * 2**(25 - shift).
    assert requantise_normalised([[3 << 20, 1 << 20]], [0, 0], [20, 25], 0).tolist() == \
        [[96, 1]]
    # The multiplier plays no part: this is requantise with the row's reciprocal.
    acc = np.array([[7, -9, 1000], [123456, 5, 3]])
    recip, e = reciprocals(acc[:, -1])
    for i in range(2):
        assert requantise_normalised(acc, [1, 2, 3], 30, -1)[i].tolist() == requantise(
            acc[i], [1, 2, 3], recip[i], 30 + e[i], -1).tolist()


def test_requantise_normalised_rounding_modes_at_ties():
    """d = 1 and shift 32: ``t / 128`` exactly, so t = +-64, +-192, 320 are ties, which
    HALF_UP rounds up, HALF_EVEN to even and DOUBLE (``h = t / 64`` ties up, then ``h / 2``
    away from zero) away from zero; t = 32 rounds to 1 in DOUBLE alone (0.5, then 0.5)."""
    t = [64, -64, 32, -32, 192, 320, -192]
    acc = [[v, 1] for v in t]
    want = {HALF_UP: [1, 0, 0, 0, 2, 3, -1],
            HALF_EVEN: [0, 0, 0, 0, 2, 2, -2],
            DOUBLE: [1, -1, 1, 0, 2, 3, -2]}
    for mode, column in want.items():
        got = requantise_normalised(acc, [0, 0], 32, 0, mode)
        assert got[:, 0].tolist() == column, mode
        assert got[:, 1].tolist() == [0] * len(t), mode      # 1 / 128


def test_requantise_normalised_errors():
    with pytest.raises(ValueError, match=r"needs accumulator rows \(rows, cols\), the divisor "
                                         r"in the last column; got shape \(3,\)"):
        requantise_normalised([1, 2, 3], [0, 0, 0], 0, 0)
    with pytest.raises(ValueError, match=r"got shape \(2, 0\)"):
        requantise_normalised(np.zeros((2, 0)), [], 0, 0)
    with pytest.raises(ValueError, match=r"shift=64 out of range; allowed: 0 to 63"):
        requantise_normalised([[1, 1]], [0, 0], 64, 0)
    with pytest.raises(ValueError, match=r"shift=\[0, -1\] out of range"):
        requantise_normalised([[1, 1]], [0, 0], [0, -1], 0)


def test_exact_matmul_equals_integer_matmul():
    """Through float64 where every sum fits 2**53 (int8 extremes over a long reduction, a
    batch of them broadcast), in int64 beyond: equal to numpy's int64 product on every
    element, including one just past float64's exact range."""
    seed = SEED + 77
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a = rng.choice([-255, 255, -128, 127, 0, 1], size=(3, 5, 4096))
    b = rng.choice([-128, 127, -1], size=(4096, 7))
    assert np.array_equal(exact_matmul(a, b), a.astype(np.int64) @ b)
    # 2**27 * 2**26 * 2 = 2**54: float64 would round the sum's low bit away.
    big = np.array([[2 ** 27 + 1, 2 ** 27 + 1]])
    other = np.array([[2 ** 26 + 1], [2 ** 26 + 1]])
    want = 2 * (2 ** 27 + 1) * (2 ** 26 + 1)
    assert exact_matmul(big, other)[0, 0] == want
    assert exact_matmul(np.zeros((0, 3), int), np.zeros((3, 2), int)).shape == (0, 2)
