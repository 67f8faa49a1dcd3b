"""gemmlowp's fixed-point arithmetic, as TFLite's reference kernels use it, on numpy arrays.

Every function takes and returns int64 arrays holding int32 values and computes exactly what
the C++ computes on int32 (C's truncating division written out where the C++ divides). A
``FixedPoint<int32_t, I>`` is its raw int32 here; the comments give ``I``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["srdhm", "rdbpot", "mbqm", "sat_mul_pot", "exp_on_negative_values",
           "one_over_one_plus_x", "softmax_params", "softmax_int8"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _trunc_div(x: np.ndarray, d: int) -> np.ndarray:
    """C's integer division (towards zero) by a positive ``d``."""
    return np.where(x >= 0, x // d, -((-x) // d))


def srdhm(a, b) -> np.ndarray:
    """``SaturatingRoundingDoublingHighMul``: ``round(a * b / 2**31)``, ties away from
    zero in gemmlowp's nudge form, saturating the one overflow (``a == b == INT32_MIN``)."""
    a, b = np.broadcast_arrays(_i64(a), _i64(b))
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = _trunc_div(ab + nudge, 1 << 31)
    return np.where((a == b) & (a == INT32_MIN), INT32_MAX, high)


def rdbpot(x, exponent) -> np.ndarray:
    """``RoundingDivideByPOT``: ``x / 2**exponent``, ties away from zero."""
    x = _i64(x)
    e = _i64(exponent)
    mask = (np.int64(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (remainder > threshold)


def mbqm(x, multiplier: int, shift: int, *, single: bool = True) -> np.ndarray:
    """TFLite's ``MultiplyByQuantizedMultiplier``.

    ``single`` (a build with ``TFLITE_SINGLE_ROUNDING``, as LiteRT's Python wheels are):
    ``(x * M + 2**(30 - shift)) >> (31 - shift)`` in int64, one rounding half up. Otherwise
    gemmlowp's double rounding: ``x * 2**max(shift, 0)`` (int32, wrapping), the doubling high
    multiply, then the rounding divide by ``2**max(-shift, 0)``."""
    if single:
        total = 31 - shift
        return (_i64(x) * multiplier + (1 << (total - 1))) >> total
    left, right = max(shift, 0), max(-shift, 0)
    x = _i64(x) << left
    x = ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    return rdbpot(srdhm(x, multiplier), right)


def sat_mul_pot(x, exponent: int) -> np.ndarray:
    """``SaturatingRoundingMultiplyByPOT<exponent>``: a saturating left shift, or a rounding
    right shift for a negative exponent."""
    x = _i64(x)
    if exponent <= 0:
        return rdbpot(x, -exponent) if exponent else x
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, INT32_MAX,
                    np.where(x < -threshold, INT32_MIN, x << exponent))


def _exp_quarter(a: np.ndarray) -> np.ndarray:
    """``exp_on_interval_between_negative_one_quarter_and_0_excl`` (I = 0 in and out)."""
    constant_term = 1895147668                  # exp(-1/8)
    one_third = 715827883
    x = a + (1 << 28)                           # + 1/8
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = sat_mul_pot(x4, -2)
    poly = sat_mul_pot(srdhm(x4_over_4 + x3, one_third) + x2, -1)
    return constant_term + srdhm(constant_term, x + poly)


#: The barrel shifter of exp_on_negative_values: exp(-2**k) in Q0.31 for k = -2 .. 4.
_EXP_STEPS = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
              (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int = 5) -> np.ndarray:
    """``exp(a)`` for ``a <= 0`` in Q(integer_bits), result Q0.31 (gemmlowp)."""
    a = _i64(a)
    fractional = 31 - integer_bits
    quarter = 1 << (fractional - 2)
    a_mod = (a & (quarter - 1)) - quarter
    result = _exp_quarter(sat_mul_pot(a_mod, integer_bits))
    remainder = a_mod - a
    for exponent, multiplier in _EXP_STEPS:
        if integer_bits > exponent:
            bit = np.int64(1) << (fractional + exponent)
            result = np.where(remainder & bit, srdhm(result, multiplier), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x(a) -> np.ndarray:
    """``one_over_one_plus_x_for_x_in_0_1`` (I = 0), by Newton-Raphson as gemmlowp does."""
    a = _i64(a)
    total = a + INT32_MAX                       # RoundingHalfSum(a, One())
    half_denominator = _trunc_div(total + np.where(total >= 0, 1, -1), 2)
    x = 1515870810 + srdhm(half_denominator, -1010580540)     # 48/17 - 32/17 * d (I = 2)
    for _ in range(3):
        one_minus = (1 << 29) - srdhm(half_denominator, x)
        x = x + sat_mul_pot(srdhm(x, one_minus), 2)
    return sat_mul_pot(x, 1)                    # ExactMulByPot<-1>, then Rescale<0>


def softmax_params(beta: float, input_scale: float, *,
                   single: bool = True) -> tuple[int, int, int]:
    """TFLite's ``PreprocessSoftmaxScaling`` and ``CalculateInputRadius`` for 5 integer bits:
    ``(input_multiplier, input_left_shift, diff_min)``."""
    from firmware.graph import quantize_multiplier
    top = (1 << 30) - 1.0 if single else (1 << 31) - 1.0
    real = min(float(beta) * float(np.float32(input_scale)) * (1 << 26), top)
    multiplier, left_shift = quantize_multiplier(real, single=single)
    radius = math.floor(31.0 * (1 << 26) / (1 << left_shift))
    return multiplier, left_shift, -radius


def softmax_int8(x, beta: float, input_scale: float, *, single: bool = True) -> np.ndarray:
    """TFLite's reference int8 softmax over the last axis (output scale 1/256, zero point
    -128); ``single``: the input scaling of a ``TFLITE_SINGLE_ROUNDING`` build."""
    x = _i64(x)
    multiplier, left_shift, diff_min = softmax_params(beta, input_scale, single=single)
    diff = x - x.max(axis=-1, keepdims=True)
    use = diff >= diff_min
    if single:                                                # Q5.26
        scaled = mbqm(diff, multiplier, left_shift, single=True)
    else:
        scaled = srdhm(diff << left_shift, multiplier)
    exps = exp_on_negative_values(scaled)                     # Q0.31
    total = np.where(use, rdbpot(exps, 12), 0).sum(axis=-1, keepdims=True)   # Q12.19
    out = np.empty_like(x)
    flat_total = total.reshape(-1)
    flat_exps = exps.reshape(-1, x.shape[-1])
    flat_use = use.reshape(-1, x.shape[-1])
    flat_out = out.reshape(-1, x.shape[-1])
    for i, s in enumerate(flat_total):
        s = int(s)
        headroom = 32 - s.bit_length()           # count leading zeros of a positive int32
        bits_over_unit = 12 - headroom
        shifted = ((s << headroom) & 0xFFFFFFFF) - (1 << 31)
        scale = one_over_one_plus_x(shifted)
        unsat = rdbpot(srdhm(scale, flat_exps[i]), bits_over_unit + 31 - 8)
        q = np.clip(unsat - 128, -128, 127)
        flat_out[i] = np.where(flat_use[i], q, -128)
    return out
