"""Bit-exact numpy golden model of the matrix unit.

Everything the hardware computes is written out here with its exact integer semantics, so
the RTL's results compare with ``==``:

- operands are 8-bit, each stream (activations) or tile (weights) either signed (int8,
  -128..127) or unsigned (uint8, 0..255); on the wire they are the same 8 raw bits;
- products and sums are exact integers reduced modulo 2**32 into int32 (two's complement
  wrap-around, no saturation), which is what a 32-bit adder chain does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hdl.isa import RECIPROCAL_BITS, RECIPROCAL_SCALE

__all__ = ["wrap", "to_raw", "from_raw", "operand_range", "matmul", "exact_matmul",
           "lookup_sums",
           "MatrixUnitModel",
           "matrix_unit_stream",
           "saturate", "rounding_shift", "requantise", "reciprocals", "requantise_normalised",
           "activate", "max_pool_rows", "window_index", "conv_windows",
           "SIGMOID_LUT", "TANH_LUT", "LUT_INPUT_SCALE", "table_values"]


def operand_range(signed: bool, width: int = 8) -> tuple[int, int]:
    """Inclusive range of an operand."""
    return (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)


def _check_operands(name: str, values: np.ndarray, signed: bool, width: int = 8):
    lo, hi = operand_range(signed, width)
    if values.size and (values.min() < lo or values.max() > hi):
        kind = "signed" if signed else "unsigned"
        raise ValueError(f"{name} holds values outside {lo}..{hi} ({kind} {width}-bit): "
                         f"min {values.min()}, max {values.max()}")


def wrap(values, bits: int = 32) -> np.ndarray:
    """Reduce integers modulo ``2**bits`` into the signed range (two's complement)."""
    values = np.asarray(values, dtype=object if bits > 62 else np.int64)
    mask = (1 << bits) - 1
    half = 1 << (bits - 1)
    return (((values + half) & mask) - half).astype(np.int64)


def to_raw(values, width: int = 8) -> np.ndarray:
    """Operands (signed or unsigned) to their raw ``width``-bit patterns."""
    return (np.asarray(values, dtype=np.int64) & ((1 << width) - 1)).astype(np.int64)


def from_raw(raw, signed: bool, width: int = 8) -> np.ndarray:
    """Raw ``width``-bit patterns to operand values."""
    raw = np.asarray(raw, dtype=np.int64) & ((1 << width) - 1)
    if signed:
        raw = np.where(raw >= 1 << (width - 1), raw - (1 << width), raw)
    return raw


def matmul(x, w, *, x_signed: bool = True, w_signed: bool = True,
           acc_width: int = 32) -> np.ndarray:
    """``x @ w`` with ``acc_width``-bit wrap-around, as the systolic array computes it.

    ``x`` is ``(M, K)`` and ``w`` is ``(K, N)``, both holding operand values (not raw bits)
    in the range their signedness allows. Returns ``(M, N)`` int64 holding int32 values.
    """
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N), got {x.shape} @ {w.shape}")
    _check_operands("x", x, x_signed)
    _check_operands("w", w, w_signed)
    # |product| <= 2**16 and K <= 2**16 here, so int64 sums are exact before the wrap.
    return wrap(x @ w, acc_width)


def lookup_sums(psum, table) -> np.ndarray:
    """MATMUL_LOOKUP's step after the array: each int32 sum replaced by the entry of its low
    byte (``s mod 256``) in ``table``, 256 int32 values. With an identity tile the sum is the
    activation, so an int8 ``x`` takes entry ``x & 255``, a uint8 one entry ``x``."""
    table = np.asarray(table, dtype=np.int64)
    if table.shape != (256,):
        raise ValueError(f"a sum table has 256 entries, got shape {table.shape}")
    return wrap(table[np.asarray(psum, dtype=np.int64) & 0xFF])


def exact_matmul(a, b) -> np.ndarray:
    """``a @ b`` of integer arrays (numpy's broadcasting), exact, as int64 (no wrap).

    Through float64 when every partial sum is below 2**53 in magnitude (then each is an
    integer float64 holds exactly, in any order of summation): numpy's integer matmul has no
    BLAS and is some twenty times slower on the reference's large layers. Otherwise in
    int64."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if a.size and b.size:
        bound = int(np.abs(a).max()) * int(np.abs(b).max()) * a.shape[-1]
        if bound < 1 << 53:
            return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)
    return a @ b


def window_index(lane: int, step: int, count: int, rows: int) -> np.ndarray:
    """Element indices (from the first row's element 0) of a window MATMUL's ``count`` rows
    (:class:`hdl.isa.Matmul`): row ``i`` is elements ``lane + i * step .. + rows - 1``."""
    return lane + step * np.arange(count)[:, None] + np.arange(rows)[None, :]


def conv_windows(x, kernel: tuple[int, int], stride: int = 1) -> np.ndarray:
    """The windows of a convolution over ``x`` (height, width, channels), already padded,
    the way window MATMULs form them: ``[ky, oy, ox]`` is the ``kw * C`` elements of kernel
    row ``ky`` at output position ``(oy, ox)``, ``x[s oy + ky, s ox + kx, c]`` in ``(kx, c)``
    order. Independent of the unified buffer: the reference the window mode's tests compare
    the core's windows with (their sum over ``ky`` times the weights is the convolution)."""
    x = np.asarray(x)
    kh, kw = kernel
    h, w, c = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.empty((kh, ho, wo, kw * c), dtype=x.dtype)
    for ky in range(kh):
        for oy in range(ho):
            for ox in range(wo):
                y, xx = stride * oy + ky, stride * ox
                out[ky, oy, ox] = x[y, xx:xx + kw, :].reshape(-1)
    return out


@dataclass
class MatrixUnitModel:
    """Transaction model of the matrix unit (weight FIFO + systolic array).

    Feed it the same weight tiles and activation rows as the hardware; it returns the output
    rows the hardware must produce, in order. A row with ``switch`` set takes the oldest
    queued tile; rows before the first switch have no weights and are rejected.
    """

    rows: int
    cols: int
    acc_width: int = 32
    _tiles: list = field(default_factory=list)
    _active: tuple | None = None

    def push_tile(self, tile, signed: bool):
        tile = np.asarray(tile, dtype=np.int64)
        if tile.shape != (self.rows, self.cols):
            raise ValueError(f"weight tile must be {self.rows}x{self.cols}, got {tile.shape}")
        _check_operands("weight tile", tile, signed)
        self._tiles.append((tile, signed))

    def push_act(self, act_row, signed: bool, switch: bool) -> np.ndarray:
        """Output row for one activation row."""
        if switch:
            if not self._tiles:
                raise ValueError("switch with no weight tile queued")
            self._active = self._tiles.pop(0)
        if self._active is None:
            raise ValueError("activation row before the first tile switch")
        tile, w_signed = self._active
        act_row = np.asarray(act_row, dtype=np.int64).reshape(1, self.rows)
        return matmul(act_row, tile, x_signed=signed, w_signed=w_signed,
                      acc_width=self.acc_width)[0]


def matrix_unit_stream(rows: int, cols: int, tiles: int, rows_per_tile: int,
                       rng: np.random.Generator) -> tuple[list, list, list]:
    """Random signed int8 weight tiles, each followed by ``rows_per_tile`` activation rows
    (the first with ``switch``), as the matrix unit's stream items (raw ``data`` fields),
    and the output rows :class:`MatrixUnitModel` expects: ``(weights, acts, expected)``."""
    model = MatrixUnitModel(rows, cols)
    weights, acts, expected = [], [], []
    for _ in range(tiles):
        w = rng.integers(-128, 128, (rows, cols))
        model.push_tile(w, signed=True)
        weights.extend({"data": to_raw(row).tolist(), "signed": 1} for row in w)
    for _ in range(tiles):
        x = rng.integers(-128, 128, (rows_per_tile, rows))
        for i, row in enumerate(x):
            expected.append(model.push_act(row, signed=True, switch=i == 0))
            acts.append({"data": to_raw(row).tolist(), "signed": 1, "switch": int(i == 0)})
    return weights, acts, expected


# Activation unit -----------------------------------------------------------------------------

#: Fixed-point scales of the lookup-table functions (TPU v1 had fixed sigmoid/tanh hardware).
LUT_INPUT_SCALE = 1 / 16      # table index q (int8) stands for q / 16, i.e. -8.0 .. 7.9375
SIGMOID_OUTPUT = (1 / 256, -128)  # (scale, zero point): 0.0 -> -128, 1.0 -> 127 (saturated)
TANH_OUTPUT = (1 / 128, 0)        # -1.0 -> -128, 1.0 -> 127 (saturated)


def saturate(values, lo: int = -128, hi: int = 127) -> np.ndarray:
    return np.clip(np.asarray(values, dtype=np.int64), lo, hi)


#: Rounding modes of the requantiser (values of :class:`hdl.isa.Rounding`).
HALF_UP, HALF_EVEN, DOUBLE = 0, 1, 2


def _shifts(shift) -> np.ndarray:
    s = np.asarray(shift, dtype=np.int64)
    if s.size and (s.min() < 0 or s.max() > 63):
        raise ValueError(f"shift={shift} out of range; allowed: 0 to 63")
    return s


def _half_up(v: np.ndarray, s: np.ndarray) -> np.ndarray:
    # floor((v + 2**(s-1)) / 2**s) == floor((floor(v / 2**(s-1)) + 1) / 2): the same value
    # without the addition, which overflows int64 for v = 2**62, s = 63.
    return np.where(s == 0, v, ((v >> np.maximum(s - 1, 0)) + 1) >> 1)


def rounding_shift(values, shift, rounding: int = HALF_UP) -> np.ndarray:
    """``values / 2**shift`` rounded to an integer; ``shift`` (0 to 63) is a scalar or
    broadcasts against ``values`` (a shift per column); ``shift == 0`` is exact.

    - ``HALF_UP``: to nearest, ties towards +infinity, ``(v + 2**(s-1)) >> s``;
    - ``HALF_EVEN``: to nearest, ties to the even neighbour;
    - ``DOUBLE``: for ``shift <= 31`` as ``HALF_UP``; above, TFLite's reference kernels'
      ``RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(...), shift - 31)``: first to
      nearest at ``2**31`` with ties up (gemmlowp's doubling high multiply, whose saturation
      cannot change the result here), then at ``2**(shift - 31)`` with ties away from zero.
    """
    v = np.asarray(values, dtype=np.int64)
    s = _shifts(shift)
    v, s = np.broadcast_arrays(v, s)
    if rounding == HALF_UP:
        return _half_up(v, s)
    if rounding == HALF_EVEN:
        sm = np.maximum(s - 1, 0)
        floor = (v >> sm) >> 1
        rem = v & ((np.int64(1) << sm) * 2 - 1)          # v mod 2**s (s <= 63)
        half = np.int64(1) << sm
        up = (rem > half) | ((rem == half) & ((floor & 1) == 1))
        return np.where(s == 0, v, floor + up)
    if rounding == DOUBLE:
        high = _half_up(v, np.full_like(s, 31))          # SaturatingRoundingDoublingHighMul
        e = np.maximum(s - 31, 0)
        mask = (np.int64(1) << e) - 1
        threshold = (mask >> 1) + (high < 0)             # RoundingDivideByPOT
        second = (high >> e) + ((high & mask) > threshold)
        return np.where(s <= 31, _half_up(v, s), second)
    raise ValueError(f"rounding={rounding} is not a rounding mode; allowed: 0 (HALF_UP), "
                     f"1 (HALF_EVEN), 2 (DOUBLE)")


def requantise(acc, bias, multiplier, shift, zero_point: int,
               rounding: int = HALF_UP) -> np.ndarray:
    """int32 accumulator values to int8, per column, exactly as the activation unit does:

    1. ``t = wrap32(acc + bias)`` (32-bit two's complement add);
    2. ``p = t * multiplier``, exact (|p| <= 2**62);
    3. ``r = rounding_shift(p, shift, rounding)``: ``shift`` one for all columns or one per
       column (``r = p`` when it is 0);
    4. ``q = saturate_int8(saturate_int32(r) + zero_point)``.
    """
    acc = np.asarray(acc, dtype=np.int64)
    t = wrap(acc + np.asarray(bias, dtype=np.int64), 32)
    p = t * np.asarray(multiplier, dtype=np.int64)
    r = saturate(rounding_shift(p, shift, rounding), -(1 << 31), (1 << 31) - 1)
    return saturate(r + zero_point)


def reciprocals(d) -> tuple[np.ndarray, np.ndarray]:
    """NORMALISE's ``(multiplier, extra shift)`` for each divisor in ``d`` (int32 values),
    elementwise :func:`hdl.isa.reciprocal`: for ``d > 0``, ``e = max(0, bit_length(d) -
    RECIPROCAL_BITS)``, ``m = d >> e`` (the top ``RECIPROCAL_BITS`` bits) and the multiplier
    ``floor((2**RECIPROCAL_SCALE + floor(m / 2)) / m)`` (``2**RECIPROCAL_SCALE / m`` to
    nearest, ties up); ``(0, 0)`` for ``d <= 0``. Both int64, ``d``'s shape."""
    d = np.asarray(d, dtype=np.int64)
    positive = d > 0
    d = np.where(positive, d, 1)
    # frexp's exponent is the bit length of a positive integer below 2**53, exactly.
    bit_length = np.frexp(d.astype(np.float64))[1].astype(np.int64)
    e = np.maximum(bit_length - RECIPROCAL_BITS, 0)
    m = d >> e
    recip = ((np.int64(1) << RECIPROCAL_SCALE) + m // 2) // m
    return np.where(positive, recip, 0), np.where(positive, e, 0)


def requantise_normalised(acc, bias, shift, zero_point: int,
                          rounding: int = HALF_UP) -> np.ndarray:
    """ACTIVATE's function NORMALISE (:class:`hdl.isa.Func`) on accumulator rows ``acc``
    (``(rows, cols)`` int32 values): each row divided by its own last column, to int8,
    exactly as the activation unit does. For each row, ``d`` = its raw accumulator in
    column ``cols - 1`` (before the bias) and ``(recip, e) = reciprocals(d)``; then per
    column ``j``:

    1. ``t = wrap32(acc[j] + bias[j])``;
    2. ``p = t * recip``, exact (``|p| <= 2**56``);
    3. ``r = rounding_shift(p, min(63, shift[j] + e), rounding)``, ``shift`` (0 to 63) one
       for all columns or one per column;
    4. ``q = saturate_int8(saturate_int32(r) + zero_point)``.

    The multiplier of the parameter slot is not used, and the function is the identity, so
    ``q`` is about ``t / d * 2**(RECIPROCAL_SCALE - shift)`` (``zero_point`` for
    ``d <= 0``)."""
    acc = np.asarray(acc, dtype=np.int64)
    if acc.ndim != 2 or acc.shape[1] == 0:
        raise ValueError(f"requantise_normalised needs accumulator rows (rows, cols), the "
                         f"divisor in the last column; got shape {acc.shape}")
    shift = _shifts(shift)
    recip, e = reciprocals(acc[:, -1])
    t = wrap(acc + np.asarray(bias, dtype=np.int64), 32)
    p = t * recip[:, None]
    s = np.minimum(shift + e[:, None], 63)
    r = saturate(rounding_shift(p, s, rounding), -(1 << 31), (1 << 31) - 1)
    return saturate(r + zero_point)


def _lut(function, scale_zp) -> np.ndarray:
    scale, zp = scale_zp
    x = np.arange(-128, 128) * LUT_INPUT_SCALE
    # round half away from zero on exact float64 values; the table is a constant, so this is
    # computed once and the hardware ROM holds the very same numbers.
    y = function(x) / scale
    rounded = np.where(y >= 0, np.floor(y + 0.5), np.ceil(y - 0.5))
    return saturate(rounded.astype(np.int64) + zp)


#: Tables indexed by ``q + 128`` for q in -128..127.
SIGMOID_LUT = _lut(lambda x: 1 / (1 + np.exp(-x)), SIGMOID_OUTPUT)
TANH_LUT = _lut(np.tanh, TANH_OUTPUT)


def table_values(table) -> np.ndarray:
    """The programmable table's 256 entries (:data:`hdl.isa.TABLE_ENTRIES`, entry ``k`` for
    ``q = k - 128``) as int8 values in int64: each given as an int8 (-128..127) or as its
    raw byte (0..255, two's complement: 255 is -1); ``bytes`` are raw bytes. Raises
    :class:`ValueError` for another length or a value outside -128..255."""
    if isinstance(table, bytes | bytearray):
        table = list(table)
    values = np.asarray(table)
    if values.shape != (256,):
        raise ValueError(f"the table has shape {values.shape}; allowed: 256 entries "
                         f"(entry k for q = k - 128)")
    if values.dtype.kind not in "iu":
        raise ValueError(f"the table holds {values.dtype} values; allowed: integers "
                         f"-128 to 255")
    values = values.astype(np.int64)
    if values.min() < -128 or values.max() > 255:
        raise ValueError(f"the table holds values outside -128..255 (int8 or uint8): "
                         f"min {values.min()}, max {values.max()}")
    return from_raw(values, signed=True)


def activate(q, func: int, zero_point: int = 0, clamp_hi: int = 127,
             table=None) -> np.ndarray:
    """Apply function ``func`` (:class:`hdl.isa.Func` value) to requantised int8 values.
    TABLE (5) looks ``q`` up in ``table`` (256 entries, int8 or raw bytes, see
    :func:`table_values`): ``table[q + 128]`` as an int8. NORMALISE (6) needs the
    accumulators, not ``q``: it is :func:`requantise_normalised`."""
    q = np.asarray(q, dtype=np.int64)
    if func == 0:    # IDENTITY
        return q
    if func == 1:    # RELU
        return np.maximum(q, zero_point)
    if func == 2:    # CLAMP
        return np.minimum(np.maximum(q, zero_point), clamp_hi)
    if func == 3:    # SIGMOID
        return SIGMOID_LUT[q + 128]
    if func == 4:    # TANH
        return TANH_LUT[q + 128]
    if func == 5:    # TABLE
        if table is None:
            raise ValueError("func=5 (TABLE) needs the table: table=, 256 entries")
        return table_values(table)[q + 128]
    if func == 6:    # NORMALISE
        raise ValueError("func=6 (NORMALISE) is not a function of q: it divides each row "
                         "by its last accumulator, so it needs the accumulators; use "
                         "requantise_normalised(acc, bias, shift, zero_point, rounding) "
                         "instead of requantise and activate (its function is the identity)")
    raise ValueError(f"func={func} is not an activation function; allowed: 0 to 5 (and 6, "
                     f"NORMALISE, through requantise_normalised)")


def max_pool_rows(values, window: int) -> np.ndarray:
    """Element-wise max over groups of ``window`` consecutive rows."""
    values = np.asarray(values, dtype=np.int64)
    if values.shape[0] % window:
        raise ValueError(f"{values.shape[0]} rows do not split into windows of {window}")
    return values.reshape(-1, window, values.shape[1]).max(axis=1)
