"""ISA-level simulator: the bit-exact reference the RTL core is compared with.

:class:`IsaSim` executes the host stream of :mod:`hdl.isa` one instruction at a time, in
program order, with numpy and :mod:`sim.models.golden`. It has no notion of time: the hardware may
overlap instructions however it likes, but what it sends to the host and what it leaves in
its memories must equal what this model produces.

Beats
-----
The host stream is a sequence of beats of ``host_width`` bits. A beat is either an
instruction (the low 64 bits; higher bits are ignored) or one of the data beats that follow
READ_HOST, LOAD_WEIGHTS, LOAD_PARAMS and LOAD_TABLE. Data rows sit in the low bits of their
beat; bits above the row are ignored.

- Unified-buffer row (READ_HOST, WRITE_HOST): ``ub_row = max(rows, cols)`` elements, element
  ``i`` at bits ``[8i, 8i+8)`` as a raw byte (int8 and uint8 share the 8 bits).
- Weight row (LOAD_WEIGHTS): ``cols`` elements, element ``j`` at bits ``[8j, 8j+8)``.
- Parameter row (LOAD_PARAMS): ``cols`` int32 values, column ``j`` at bits ``[32j, 32j+32)``,
  two's complement. The per-column shift row (LOAD_PARAMS's third beat, with
  ``column_shifts``) has the same layout; column ``j``'s shift is bits ``[32j, 32j+6)`` and
  the lane's other 26 bits are ignored.
- Table row (LOAD_TABLE): a parameter row's ``4 * cols`` bytes, each an entry of the table
  (raw, int8 in two's complement): beat ``b`` (``0..table_beats(cols)-1``,
  ``hdl.isa.table_beats(cols) = ceil(256 / (4 * cols))``) holds entries
  ``4 * cols * b ..``, entry ``k`` at bits ``[8i, 8i+8)`` with ``i = k - 4 * cols * b``;
  the last beat's bits past entry 255 are ignored (``cols = 3``: 22 beats of 12 entries,
  the last holding entries 252..255 in its low 32 bits).
- Sum-table row (LOAD_TABLE of SUM0 or SUM1): a parameter row, ``cols`` int32 entries: beat
  ``b`` (``0..sum_table_beats(cols)-1``, ``ceil(256 / cols)``) holds entries ``cols * b ..``
  in its lanes, column order; the last beat's lanes past entry 255 are ignored.
- Counter beat (READ_COUNTERS): the 48-bit counter value.
- DONE beat (HALT, :class:`hdl.beats.DoneBeat`): ``DONE_MAGIC << 32 | n``, ``n`` the number
  of instructions in the program, the HALT included.
- Error beat (an instruction failed its checks, :class:`hdl.beats.ErrorBeat`), see Errors.

A *program* is the instructions from reset, from the last HALT, the last error clear or the
last resynchronisation word up to and including the next HALT; its instructions are indexed
from 0. Memories, the weight queue, parameter slots, the table and counters persist from one
program to the next.

State
-----
All zero at reset (the core clears the unified buffer, the accumulators and the parameter
slots row by row after a reset, before it takes the first beat; weight tiles are unreadable
until written, as their written flags are cleared):

- unified buffer: ``ub_depth x ub_row`` raw bytes;
- accumulators: ``acc_depth x cols`` int32;
- weight memory: ``weight_mem_tiles`` tiles of ``rows x cols`` raw bytes, each with a signed
  flag and a written flag;
- the weight queue: tiles read by READ_WEIGHTS and not yet switched in, at most
  ``weight_fifo_depth + 1`` (the weight FIFO plus the array's shadow registers);
- the active tile: the one MATMUL multiplies by (none until the first switch);
- ``param_slots`` parameter slots: per-column int32 ``bias`` and ``multiplier``, a
  per-column ``shift`` (0..63), the ``rounding`` mode (:class:`hdl.isa.Rounding`, HALF_UP at
  reset), ``zero_point`` and ``clamp_hi`` (int8, two's complement in their 8-bit fields);
- the programmable table: 256 raw bytes, entry ``k`` the int8 output for the requantised
  value ``q = k - 128`` (all zero at reset, so TABLE gives 0 until a LOAD_TABLE; a core
  built without it, ``lookup_table=False``, has none);
- the two sum tables (``sum_tables``): 256 int32 each, all zero at reset.

Instructions
------------
- NOP, SYNC: no effect at this level (SYNC is a timing fence).
- HALT: sends the DONE beat; the next instruction has index 0.
- READ_HOST: ``count`` data beats into unified-buffer rows ``ub_addr..ub_addr+count-1``.
- WRITE_HOST: sends unified-buffer rows ``ub_addr..ub_addr+count-1``, all ``ub_row``
  elements of each, one beat per row.
- LOAD_WEIGHTS: ``count * rows`` data beats into tiles ``tile..tile+count-1``, row 0 of each
  tile first; marks each tile written, with the instruction's ``signed`` flag.
- READ_WEIGHTS: appends copies of tiles ``tile..tile+count-1`` (their contents and signed
  flags at that moment) to the weight queue. A later LOAD_WEIGHTS or UB_TO_WEIGHTS does not
  change queued tiles.
- MATMUL: if ``switch``, the oldest queued tile becomes the active tile. Then for ``i`` in
  ``0..count-1``: ``x`` = the first ``rows`` elements of unified-buffer row ``ub_addr+i``
  (with ``window``: elements ``lane + i * step .. + rows - 1`` of rows ``ub_addr..`` read
  as one run, ``ub_row`` elements a row, ``golden.window_index``),
  int8 if ``signed`` else uint8; ``psum = golden.matmul(x, W)`` with the active tile ``W``
  (int8 or uint8 per its flag), wrapped to int32; accumulator row ``acc_addr+i`` becomes
  ``wrap32(acc + psum)`` if ``accumulate`` else ``psum``.
- MATMUL_LOOKUP: as MATMUL without ``window``, but every ``psum`` value ``s`` becomes
  ``sum_table[table][s mod 256]`` (``golden.lookup_sums``) before it is written or added.
- ACTIVATE: ``window`` is 1, 2, 4 for ``pool`` NONE, MAX2, MAX4. Parameter slot ``slot``
  holds per column ``j`` an int32 ``bias[j]``, ``multiplier[j]`` and a shift ``s = shift[j]``
  (0..63), and for all columns the rounding mode, ``z = zero_point`` and ``clamp_hi``. For
  every accumulator value ``a`` of rows ``acc_addr..acc_addr+count-1``, column ``j``, on
  exact integers (``golden.requantise`` and ``golden.activate``):

  1. ``t = wrap32(a + bias[j])``: the sum modulo 2**32 as a two's complement int32;
  2. ``p = t * multiplier[j]``, exact (``|p| <= 2**62``);
  3. ``r = p`` when ``s == 0``; otherwise ``p / 2**s`` rounded to an integer by the slot's
     rounding mode (``golden.rounding_shift``; see Rounding modes below):
     - HALF_UP: ``r = floor((p + 2**(s - 1)) / 2**s)`` (to nearest, ties towards +infinity;
       an arithmetic right shift);
     - HALF_EVEN: ``r`` the integer nearest ``p / 2**s``, on a tie the even one;
     - DOUBLE: as HALF_UP when ``s <= 31``; above, in two steps:
       ``h = floor((p + 2**30) / 2**31)`` (to nearest, ties towards +infinity), then, with
       ``e = s - 31``, ``r = floor(h / 2**e) + (1 if (h mod 2**e) > 2**(e-1) - 1 +
       (1 if h < 0 else 0) else 0)`` (``h / 2**e`` to nearest, ties away from zero);
  4. ``q = clamp(clamp(r, -2**31, 2**31 - 1) + z, -128, 127)``: the zero point is added
     after the shift and before the function;
  5. ``f = q`` (IDENTITY), ``max(q, z)`` (RELU), ``min(max(q, z), clamp_hi)`` (CLAMP),
     ``SIGMOID_LUT[q + 128]`` (SIGMOID), ``TANH_LUT[q + 128]`` (TANH) or ``table[q + 128]``
     (TABLE: the programmable table's byte as an int8, ``golden.activate``'s ``table``):
     the tables are looked up with the zero point already added, so a program that wants
     the fixed tables' input scale 1/16 centred on 0 uses ``z = 0``. With
     ``x = (k - 128) / 16`` for ``k`` in 0..255 and
     ``round`` rounding halves away from zero,
     ``SIGMOID_LUT[k] = clamp(round(256 / (1 + exp(-x))) - 128, -128, 127)`` and
     ``TANH_LUT[k] = clamp(round(128 * tanh(x)), -128, 127)``;
  6. ``y`` = the element-wise maximum of ``f`` over each group of ``window`` consecutive
     rows (``golden.max_pool_rows``).

  NORMALISE (on a core built with ``row_scale``) divides each row by its own last column
  (``golden.requantise_normalised``), with ``B = RECIPROCAL_BITS`` and
  ``S = RECIPROCAL_SCALE`` (:mod:`hdl.isa`; docs/isa.md gives their values under ACTIVATE).
  For each accumulator row, ``d`` = its value in column ``cols - 1`` as it stands (before
  the bias); when ``d > 0``, ``e = max(0, bit_length(d) - B)``, ``m = floor(d / 2**e)``
  (``d``'s top ``B`` bits) and ``recip = floor((2**S + floor(m / 2)) / m)`` (``2**S / m`` to
  nearest, ties up; ``hdl.isa.reciprocal``); when ``d <= 0``, ``recip = e = 0``, so every
  element of the row becomes ``z``. Then every column ``j`` of the row goes through step 1,
  step 2 with ``p = t * recip`` (exact, ``|p| <= 2**(31 + S)``; the slot's ``multiplier`` is
  not used), step 3 with the shift ``s = min(63, shift[j] + e)`` and the slot's rounding
  mode, step 4, step 5 the identity (``f = q``) and step 6. So ``q`` is ``z`` plus
  ``t / d * 2**(S - shift[j])`` rounded, saturated to int8, as precisely as ``recip / 2**e``
  stands for ``2**S / d``: ``recip / 2**e`` is ``2**S / d`` rounded to the nearest integer
  when ``d < 2**B`` (``e = 0``), and above it is within a relative ``2**(1 - B)`` of
  ``2**S / d`` (``m * 2**e <= d < (m + 1) * 2**e`` with ``m >= 2**(B - 1)``, the cut, and
  the rounding of ``recip``). The divisor is read before the bias and each row has its own;
  column ``cols - 1`` is requantised too (``t / d = 1`` there when its bias is 0).

  The ``count / window`` rows of ``y`` go to unified-buffer rows ``ub_addr..``: elements
  ``0..cols-1`` the results as raw bytes, elements ``cols..ub_row-1`` zero.
- LOAD_PARAMS: ``rounding``, ``zero_point`` and ``clamp_hi`` of slot ``slot`` from the
  instruction, and with ``column_shifts`` clear its ``shift`` for every column; then two
  data beats, the bias row and the multiplier row, and with ``column_shifts`` set a third,
  the per-column shift row (the instruction's ``shift`` field is then ignored).
- LOAD_TABLE: with ``target`` ACTIVATION, ``table_beats(cols)`` data beats (Table row
  above), which replace all 256 entries of the programmable table; with SUM0 or SUM1,
  ``sum_table_beats(cols)`` beats (Sum-table row above), which replace sum table 0 or 1.
- READ_COUNTERS: sends one beat per counter, in ``isa.COUNTERS`` order.
- CLEAR_COUNTERS: zeroes every counter.
- UB_TO_WEIGHTS: tile ``tile`` becomes all zero bytes; then for ``i`` in ``0..count-1``,
  with ``u`` = unified-buffer row ``ub_addr+i`` (raw bytes): if ``transpose``,
  ``tile[r][i] = u[r]`` for ``r`` in ``0..rows-1`` (buffer row ``i`` is tile column ``i``),
  else ``tile[i][c] = u[c]`` for ``c`` in ``0..cols-1``. Marks the tile written, with the
  instruction's ``signed`` flag. No data beats: the rows come from the unified buffer.

Rounding modes
--------------
The slot's ``rounding`` (:class:`hdl.isa.Rounding`) says how step 3 of ACTIVATE rounds
``p / 2**s``, ``p = t * multiplier[j]`` exact and ``1 <= s <= 63`` (``s == 0`` is exact in
every mode), with ``floor`` rounding towards minus infinity:

- HALF_UP (0): ``r = floor((p + 2**(s-1)) / 2**s)``: to nearest, a tie (``p / 2**s`` an odd
  multiple of 1/2) goes up, towards +infinity, for negative ``p`` too.
- HALF_EVEN (1): ``r = floor(p / 2**s)``, plus 1 if ``p mod 2**s > 2**(s-1)``, or if
  ``p mod 2**s == 2**(s-1)`` and ``floor(p / 2**s)`` is odd: to nearest, a tie to the even
  neighbour (IEEE 754's default, numpy's ``rint``, C's ``nearbyint``).
- DOUBLE (2): TFLite's reference kernels, which round twice. For ``s <= 31`` as HALF_UP.
  For ``s > 31``: ``h = floor((p + 2**30) / 2**31)`` (gemmlowp's
  SaturatingRoundingDoublingHighMul, ties up), then with ``e = s - 31``,
  ``mask = 2**e - 1`` and ``threshold = floor(mask / 2) + (1 if h < 0 else 0)``,
  ``r = floor(h / 2**e) + (1 if (h mod 2**e) > threshold else 0)`` (gemmlowp's
  RoundingDivideByPOT: ``h / 2**e`` to nearest, ties away from zero). Rounding twice is not
  rounding once: ``p = 2**31 - 1``, ``s = 32`` is just below 1/2, so HALF_UP and HALF_EVEN
  give 0, but ``h = 1`` and ``1 / 2`` rounds away from zero to 1; ``p = -2**31``, ``s = 32``
  (exactly -1/2) gives 0 in HALF_UP and HALF_EVEN, -1 in DOUBLE.
- 3 is not a rounding mode: LOAD_PARAMS fails with BAD_FIELD.

**DOUBLE is TFLite's MultiplyByQuantizedMultiplier.** TFLite's reference kernels requantise
an int32 ``x`` (accumulator plus bias) with a Q31 multiplier ``M`` and a shift ``n``
(``n > 0`` a left shift) as ``RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(x *
2**L, M), R)``, ``L = max(n, 0)``, ``R = max(-n, 0)``. With ``multiplier = M`` and
``s = 31 - n`` (so ``-32 <= n <= 31``), DOUBLE computes exactly that for every ``x`` whose
left shift ``x * 2**L`` fits int32:

- the doubling high multiply of ``a`` and ``b`` is ``(a*b + nudge) / 2**31`` truncated
  towards zero, ``nudge = 2**30`` for ``a*b >= 0`` and ``1 - 2**30`` otherwise; for
  ``a*b < 0`` truncation is ``ceil``, and ``ceil((a*b + 1 - 2**30) / 2**31) =
  floor((a*b + 2**30) / 2**31)``, so in both cases it is ``floor((a*b + 2**30) / 2**31)``,
  the ``h`` above with ``a*b = x * 2**L * M``;
- ``n <= 0``: ``L = 0``, ``a*b = p``, ``R = s - 31 = e`` and RoundingDivideByPOT is the
  second step above, term for term; its one saturation (``a = b = -2**31``, ``h = 2**31``
  becomes ``2**31 - 1``) gives the same ``r`` after ``r`` is clamped to int32 (``e = 0``) or
  divided (``e >= 1``: ``2**(31-e)`` either way, the ``2**31 - 1`` case a tie at ``e = 1``
  rounded away from zero);
- ``n > 0``: ``R = 0`` and ``floor((x * 2**L * M + 2**30) / 2**31) = floor((p +
  2**(s-1)) / 2**s)`` with ``s = 31 - L <= 31``: HALF_UP, which is DOUBLE for ``s <= 31``
  (``L = 31``: both are ``p``; the saturating case ``x * 2**L = M = -2**31`` gives
  ``2**31 - 1`` in TFLite and ``2**31``, clamped to ``2**31 - 1`` in step 4, here).
  TFLite computes ``x * 2**L`` in int32; where that overflows TFLite's result is not the
  rounded product (the wrapped value, or undefined in C++), and the core's is.

Which TFLite kernels round twice is the kernel's choice, not the format's: with LiteRT
2.3's reference op resolver, CONV_2D and DEPTHWISE_CONV_2D round twice (DOUBLE) and
FULLY_CONNECTED rounds the exact product once, ties up (HALF_UP at the same `s`), measured
on near-ties layer by layer (tests/firmware/test_tflite.py); the TFLite importer chooses
the mode per operator.

TFLite then adds the output zero point and clamps to the fused activation's range, the
core's step 4 and its RELU (``max(q, z)``) or CLAMP (``min(max(q, z), clamp_hi)``).

**HALF_EVEN reproduces a float32 scale.** onnxruntime's CPU kernels (and the ONNX
QuantizeLinear and QLinearMatMul specifications) requantise as
``nearbyint(float32(t) * S)``, ``S`` the float32 scale ``a_scale * w_scale / y_scale``
computed in float32 and the product rounded to float32, ``nearbyint`` rounding half to even;
then the zero point and saturation. A positive normal float32 is exactly
``S = m * 2**-s`` with its 24-bit significand ``2**23 <= m < 2**24`` (or ``m`` with its
trailing zero bits dropped and ``s`` lowered to match); with ``multiplier = m`` and that
``s`` (per column for per-channel scales: ``s`` follows each scale's exponent, which is why
shifts are per column; ``0 <= s <= 63`` holds for ``2**-40 <= S < 2**24``, and smaller scales
give ``|t * S| < 2**-9``, so ``r = 0`` and multiplier 0 reproduces them) HALF_EVEN computes
``x = t * S`` exactly and rounds it half to even, so it equals onnxruntime's result wherever
onnxruntime's float32 arithmetic rounds ``x`` to the same integer. Float32 rounding is
monotone and every half-integer ``h`` with ``|h| < 2**23`` is a float32, so a rounded value
never passes such an ``h``: if ``x < h`` then ``fl(x) <= fl(h) = h``. The two can differ
only where

1. the float32 product lands exactly on a half-integer that the exact product is not on
   (``|x - h| <= ulp(h) / 2``, about ``2**-17`` for ``|h|`` near 128), and half to even then
   picks the neighbour on the other side of ``h`` from ``x``; or
2. ``|t| > 2**24``, where ``float32(t)`` is itself rounded, so ``float32(t) * S`` differs
   from ``x`` by up to a relative ``2**-24`` and can pass a half-integer ``x`` is near.

A tie of the exact product (``x = h``) is a float32 and rounds half to even on both sides;
outputs beyond int8 saturate alike on both sides. So the two agree except where a float32
rounding crosses (or lands on) a tie.

Errors
------
Each instruction is checked when it is decoded, before it has any effect (before its data
beats are consumed). The first failing check, in this order, sets the error:

1. UNKNOWN_OPCODE: opcode 15; 12 (UB_TO_WEIGHTS) on a core built without it
   (``ub_to_weights=False``), 13 (LOAD_TABLE) on a core built without the table
   (``lookup_table=False``), 14 (MATMUL_LOOKUP) on one without the sum tables
   (``sum_tables=False``).
2. BAD_FIELD: ``count == 0`` for READ_HOST, WRITE_HOST, LOAD_WEIGHTS, READ_WEIGHTS, MATMUL,
   MATMUL_LOOKUP, ACTIVATE, UB_TO_WEIGHTS; for LOAD_TABLE ``target == 3`` on a core with the
   sum tables (one without them decodes no target: every LOAD_TABLE is the activation
   table's); for ACTIVATE ``func == 7`` (``func == 5``, TABLE, too on a
   core without the table, ``lookup_table=False``, and ``func == 6``, NORMALISE, on one
   without the row scale, ``row_scale=False``), ``pool == 3``, ``count % window != 0`` or
   ``slot >= param_slots``;
   for LOAD_PARAMS ``slot >= param_slots`` or ``rounding == 3``; for UB_TO_WEIGHTS
   ``count > cols`` with ``transpose``, ``count > rows`` without; for MATMUL ``window`` on
   a core without the window mode (``conv_windows=False``) or with ``lane >= ub_row``.
3. SIGNEDNESS: LOAD_WEIGHTS, UB_TO_WEIGHTS or MATMUL with ``signed`` clear on a core built
   for int8 only (``operands="int8"``).
4. UB_RANGE: ``ub_addr + n > ub_depth``, ``n`` = ``count`` (READ_HOST, WRITE_HOST, MATMUL,
   UB_TO_WEIGHTS), ``count / window`` (ACTIVATE) or, for a MATMUL with ``window``,
   ``isa.window_rows(lane, step, count, rows, ub_row)``.
5. ACC_RANGE: ``acc_addr + count > acc_depth`` (MATMUL, ACTIVATE).
6. WEIGHT_RANGE: ``tile + count > weight_mem_tiles`` (LOAD_WEIGHTS, READ_WEIGHTS),
   ``tile + 1 > weight_mem_tiles`` (UB_TO_WEIGHTS).
7. WEIGHT_UNWRITTEN: READ_WEIGHTS of a tile no LOAD_WEIGHTS or UB_TO_WEIGHTS has written.
8. WEIGHT_EMPTY: MATMUL with ``switch`` and an empty queue, or without ``switch`` and no
   active tile yet.
9. WEIGHT_OVERFLOW: READ_WEIGHTS that would make the queue longer than
   ``weight_fifo_depth + 1`` tiles.

The status then holds the error code and the failing instruction's index (``halted`` is
cleared); memories, queue, parameters, the table and counters are as they were before that
instruction.
The core sends an *error beat* (:class:`hdl.beats.ErrorBeat`: ``ERROR_MAGIC << 32 | code << 24
| index``) after the output of every earlier instruction, then discards every beat it
receives until the error is cleared, in band by the resynchronisation word
(:data:`hdl.isa.RESYNC_WORD`, consumed) or out of band by ``i_clear`` (:meth:`IsaSim.clear`);
the next beat after either is instruction 0 of a new program. ``i_clear`` with no error
pending does nothing; the resynchronisation word with no error pending restarts the program
(the next instruction has index 0) and is not an instruction. Reserved (``_``-prefixed)
fields are ignored.

The instruction index moves on when an instruction issues (decodes without error), before
its data beats; the ``instructions`` counter counts it once its data beats are in.

Counters
--------
Counters are ``config.counter_bits`` wide (48 by default; beats carry 48 bits), wrap, and
count from reset or the last CLEAR_COUNTERS. READ_COUNTERS reports them as if every earlier
instruction had completed (the hardware waits until idle before it samples them). Four are
fixed by the program and checked exactly (:data:`DETERMINISTIC_COUNTERS`):

- ``instructions``: instructions completed without error before the READ_COUNTERS being
  executed (each READ_COUNTERS counts once it completes; CLEAR_COUNTERS leaves 0);
- ``array_active``: the sum of MATMUL ``count`` fields;
- ``useful_macs``: ``array_active * rows * cols``;
- ``weight_shift``: ``rows`` for every tile that entered the shadow registers: the hardware
  shifts the oldest queued tile in as soon as they are free, so since reset this is
  ``rows * (tiles switched in + (1 if the queue is non-empty else 0))``.

The others (``cycles``, ``weight_stall``, ``non_matrix``, ``raw_stall``, ``host_stall``)
depend on timing: the model reports them as ``None``, in :meth:`IsaSim.counters` and as
``None`` entries of :attr:`IsaSim.output`; :func:`beats_match` treats those as wildcards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from amaranth.lib import data

from hdl import isa
from hdl.beats import done_beat, error_beat, param_row_beat, ub_row_beat, weight_row_beat
from hdl.config import TPUConfig
from sim.models import golden

__all__ = ["IsaSim", "SimStatus", "ParamSlot", "DETERMINISTIC_COUNTERS", "POOL_WINDOW",
           "beats_match", "error_beat"]

#: Counters whose values the ISA level determines; the rest depend on timing.
DETERMINISTIC_COUNTERS = ("instructions", "array_active", "useful_macs", "weight_shift")

#: Rows each pooling mode reduces to one.
POOL_WINDOW = {isa.Pool.NONE: 1, isa.Pool.MAX2: 2, isa.Pool.MAX4: 4}

_INSTR_MASK = (1 << isa.INSTR_BITS) - 1


def _int8(value: int) -> int:
    """An 8-bit field (unsigned or signed shape) as int8."""
    return ((int(value) + 128) & 0xFF) - 128


def _row(beat: int, size: int, dtype) -> np.ndarray:
    """The data row in the low ``size`` bits of ``beat`` (a layout of :mod:`hdl.isa`:
    elements of ``dtype``, element 0 lowest)."""
    raw = (beat & ((1 << size) - 1)).to_bytes(size // 8, "little")
    return np.frombuffer(raw, dtype=dtype).copy()


def beats_match(expected: Sequence[int | None], actual: Sequence[int]) -> bool:
    """Whether ``actual`` equals ``expected``, a ``None`` in ``expected`` matching any beat
    (the timing-dependent counters)."""
    return len(expected) == len(actual) and all(
        e is None or e == a for e, a in zip(expected, actual, strict=True))


@dataclass
class ParamSlot:
    """One requantisation parameter slot."""
    bias: np.ndarray        # cols int32 values
    multiplier: np.ndarray  # cols int32 values
    shift: np.ndarray       # cols shifts, 0..63 (the scalar for each column, or per column)
    rounding: isa.Rounding = isa.Rounding.HALF_UP
    zero_point: int = 0
    clamp_hi: int = 0


@dataclass(frozen=True)
class SimStatus:
    """The core's status (:class:`hdl.isa.Status`)."""
    error: bool
    code: isa.ErrorCode
    instr_index: int
    halted: bool

    def as_bits(self) -> int:
        """The status word as the hardware presents it."""
        index_width = data.Layout.cast(isa.Status)["instr_index"].width
        return data.Layout.cast(isa.Status).const({
            "error": int(self.error), "code": self.code, "halted": int(self.halted),
            "instr_index": self.instr_index & ((1 << index_width) - 1),
        }).as_bits()


class _Error(Exception):
    def __init__(self, code: isa.ErrorCode):
        self.code = code


class IsaSim:
    """Executes host beats; see the module documentation for the semantics.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration (default :class:`TPUConfig()`).

    Attributes
    ----------
    output : list of int or None
        Beats the core sent, in order (``None`` for timing-dependent counters).
    ub : ndarray, (ub_depth, ub_row) uint8
        Unified buffer, raw bytes.
    acc : ndarray, (acc_depth, cols) int64
        Accumulators (int32 values).
    weights : ndarray, (weight_mem_tiles, rows, cols) uint8
        Weight memory, raw bytes; ``weight_signed`` and ``weight_written`` hold the flags.
    queue : list of (ndarray, bool)
        Tiles (raw bytes) and signed flags read but not switched in, oldest first.
    active : (ndarray, bool) or None
        The active tile.
    params : list of ParamSlot
    table : ndarray, (256,) uint8
        The programmable table, raw bytes (zero until a LOAD_TABLE).
    sum_tables : ndarray, (2, 256) int64
        The sum tables (int32 values; zero until a LOAD_TABLE of each).
    """

    def __init__(self, config: TPUConfig | None = None):
        self.config = config if config is not None else TPUConfig()
        self.reset()

    # Control -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Everything to its reset state (all zero, no error, index 0, output emptied)."""
        c = self.config
        self.ub = np.zeros((c.ub_depth, c.ub_row), dtype=np.uint8)
        self.acc = np.zeros((c.acc_depth, c.cols), dtype=np.int64)
        self.weights = np.zeros((c.weight_mem_tiles, c.rows, c.cols), dtype=np.uint8)
        self.weight_signed = np.zeros(c.weight_mem_tiles, dtype=bool)
        self.weight_written = np.zeros(c.weight_mem_tiles, dtype=bool)
        self.queue: list[tuple[np.ndarray, bool]] = []
        self.active: tuple[np.ndarray, bool] | None = None
        self.params = [ParamSlot(np.zeros(c.cols, dtype=np.int64),
                                 np.zeros(c.cols, dtype=np.int64),
                                 np.zeros(c.cols, dtype=np.int64))
                       for _ in range(c.param_slots)]
        self.table = np.zeros(isa.TABLE_ENTRIES, dtype=np.uint8)
        self.sum_tables = np.zeros((2, isa.TABLE_ENTRIES), dtype=np.int64)
        self.output: list[int | None] = []
        self._counts = dict.fromkeys(DETERMINISTIC_COUNTERS, 0)
        self._error = isa.ErrorCode.NONE
        self._index = 0
        self._halted = False
        self._pending: list[Callable[[int], None]] = []

    def clear(self) -> None:
        """The out-of-band clear (``i_clear``): with an error pending, clear it; the next
        beat is instruction 0 of a new program. Without an error it does nothing. Memories,
        queue, parameters, the table and counters stay."""
        if self._error == isa.ErrorCode.NONE:
            return
        self._error = isa.ErrorCode.NONE
        self._index = 0
        self._halted = False
        self._pending = []

    @property
    def status(self) -> SimStatus:
        """Error flag and code, the index of the failing (else the next) instruction in the
        current program, and whether the last instruction was a HALT."""
        return SimStatus(error=self._error != isa.ErrorCode.NONE, code=self._error,
                         instr_index=self._index, halted=self._halted)

    @property
    def error(self) -> isa.ErrorCode:
        return self._error

    @property
    def expecting_data(self) -> int:
        """Data beats the current instruction still waits for."""
        return len(self._pending)

    def counters(self) -> dict[str, int | None]:
        """Counter values now, ``None`` for the timing-dependent ones."""
        mask = (1 << self.config.counter_bits) - 1
        return {name: self._counts[name] & mask if name in self._counts else None
                for name in isa.COUNTERS}

    # Host stream ---------------------------------------------------------------------------

    def feed(self, beats: Iterable[int]) -> int:
        """Process beats; returns how many were discarded because an error was pending (the
        core drops every beat after an error until :data:`hdl.isa.RESYNC_WORD`, which it
        consumes to clear the error)."""
        beats = list(beats)
        limit = 1 << self.config.host_width
        discarded = 0
        for position, beat in enumerate(beats):
            beat = int(beat)
            if not 0 <= beat < limit:
                raise ValueError(f"beat {position} = {beat:#x} does not fit in "
                                 f"host_width={self.config.host_width} bits")
            if self._error != isa.ErrorCode.NONE:
                if beat & _INSTR_MASK == isa.RESYNC_WORD:
                    self.clear()
                else:
                    discarded += 1
                continue
            if self._pending:
                self._pending.pop(0)(beat)
                if not self._pending:
                    self._complete()
            else:
                self._instruction(beat)
        return discarded

    def run(self, beats: Iterable[int]) -> list[int | None]:
        """Feed ``beats`` and return the output beats they produced; raises
        :class:`RuntimeError` if the program stopped on an error."""
        start = len(self.output)
        left = self.feed(beats)
        if self._error != isa.ErrorCode.NONE:
            raise RuntimeError(f"{self._error.name} at instruction {self._index} "
                               f"({left} beats unconsumed)")
        return self.output[start:]

    # Execution -----------------------------------------------------------------------------

    def _complete(self) -> None:
        self._counts["instructions"] += 1

    def _instruction(self, beat: int) -> None:
        word = beat & _INSTR_MASK
        if word == isa.RESYNC_WORD:          # restart the program; not an instruction
            self._index = 0
            self._halted = False
            return
        self._halted = False
        opcode, fields = isa.decode(word)       # the decoder the assembler uses too
        try:
            if opcode not in self.config.opcodes:
                raise _Error(isa.ErrorCode.UNKNOWN_OPCODE)   # reserved, or not built
            execute = getattr(self, f"_op_{opcode.name.lower()}")
            execute(fields)
        except _Error as error:
            self._error = error.code
            self._pending = []
            self.output.append(error_beat(error.code, self._index))
            return
        if opcode != isa.Opcode.HALT:
            self._index += 1                 # the index moves on as the instruction issues
            if not self._pending:
                self._complete()

    def _check_count(self, count: int) -> None:
        if count == 0:
            raise _Error(isa.ErrorCode.BAD_FIELD)

    def _check_signed(self, f) -> None:
        if self.config.operands == "int8" and not f["signed"]:
            raise _Error(isa.ErrorCode.SIGNEDNESS)

    def _check_ub(self, addr: int, n: int) -> None:
        if addr + n > self.config.ub_depth:
            raise _Error(isa.ErrorCode.UB_RANGE)

    def _check_acc(self, addr: int, n: int) -> None:
        if addr + n > self.config.acc_depth:
            raise _Error(isa.ErrorCode.ACC_RANGE)

    def _check_tiles(self, tile: int, n: int) -> None:
        if tile + n > self.config.weight_mem_tiles:
            raise _Error(isa.ErrorCode.WEIGHT_RANGE)

    def _op_nop(self, f) -> None:
        pass

    _op_sync = _op_nop

    def _op_halt(self, f) -> None:
        self._counts["instructions"] += 1
        self.output.append(done_beat(self._index + 1))
        self._index = 0
        self._halted = True

    def _op_read_host(self, f) -> None:
        self._check_count(f["count"])
        self._check_ub(f["ub_addr"], f["count"])
        size = data.Layout.cast(ub_row_beat(self.config.ub_row)).size

        def write(row: int, beat: int) -> None:
            self.ub[row] = _row(beat, size, np.uint8)

        self._pending = [lambda beat, row=f["ub_addr"] + i: write(row, beat)
                         for i in range(f["count"])]

    def _op_write_host(self, f) -> None:
        self._check_count(f["count"])
        self._check_ub(f["ub_addr"], f["count"])
        for row in self.ub[f["ub_addr"]:f["ub_addr"] + f["count"]]:
            self.output.append(int.from_bytes(row.tobytes(), "little"))

    def _op_load_weights(self, f) -> None:
        self._check_count(f["count"])
        self._check_signed(f)
        self._check_tiles(f["tile"], f["count"])
        rows, cols = self.config.rows, self.config.cols
        size = data.Layout.cast(weight_row_beat(cols)).size
        signed = bool(f["signed"])

        def write(tile: int, row: int, beat: int) -> None:
            self.weights[tile, row] = _row(beat, size, np.uint8)
            if row == rows - 1:
                self.weight_written[tile] = True
                self.weight_signed[tile] = signed

        self._pending = [lambda beat, t=f["tile"] + i // rows, r=i % rows: write(t, r, beat)
                         for i in range(f["count"] * rows)]

    def _op_read_weights(self, f) -> None:
        tile, count = f["tile"], f["count"]
        self._check_count(count)
        self._check_tiles(tile, count)
        if not self.weight_written[tile:tile + count].all():
            raise _Error(isa.ErrorCode.WEIGHT_UNWRITTEN)
        if len(self.queue) + count > self.config.weight_fifo_depth + 1:
            raise _Error(isa.ErrorCode.WEIGHT_OVERFLOW)
        if not self.queue:
            self._counts["weight_shift"] += self.config.rows
        for t in range(tile, tile + count):
            self.queue.append((self.weights[t].copy(), bool(self.weight_signed[t])))

    def _op_matmul(self, f, table: int | None = None) -> None:
        count, ub_addr, acc_addr = f["count"], f["ub_addr"], f["acc_addr"]
        cfg = self.config
        self._check_count(count)
        window = bool(f.get("window", 0))
        if window and (not cfg.conv_windows or f["lane"] >= cfg.ub_row):
            raise _Error(isa.ErrorCode.BAD_FIELD)
        self._check_signed(f)
        span = (isa.window_rows(f["lane"], f["step"], count, cfg.rows, cfg.ub_row)
                if window else count)
        self._check_ub(ub_addr, span)
        self._check_acc(acc_addr, count)
        if not self.queue if f["switch"] else self.active is None:
            raise _Error(isa.ErrorCode.WEIGHT_EMPTY)
        if f["switch"]:
            self.active = self.queue.pop(0)
            if self.queue:
                self._counts["weight_shift"] += self.config.rows
        tile, w_signed = self.active
        x_signed = bool(f["signed"])
        if window:
            elements = self.ub[ub_addr:ub_addr + span].reshape(-1)
            raw = elements[golden.window_index(f["lane"], f["step"], count, cfg.rows)]
        else:
            raw = self.ub[ub_addr:ub_addr + count, :cfg.rows]
        x = golden.from_raw(raw, x_signed)
        w = golden.from_raw(tile, w_signed)
        psum = golden.matmul(x, w, x_signed=x_signed, w_signed=w_signed)
        if table is not None:
            psum = golden.lookup_sums(psum, self.sum_tables[table])
        rows = slice(acc_addr, acc_addr + count)
        self.acc[rows] = golden.wrap(self.acc[rows] + psum) if f["accumulate"] else psum
        self._counts["array_active"] += count
        self._counts["useful_macs"] += count * self.config.rows * self.config.cols

    def _op_matmul_lookup(self, f) -> None:
        self._op_matmul(f, table=f["table"])

    def _op_activate(self, f) -> None:
        count, func, pool, slot = f["count"], f["func"], f["pool"], f["slot"]
        self._check_count(count)
        if (not isinstance(func, isa.Func) or not isinstance(pool, isa.Pool)
                or count % POOL_WINDOW[pool] or slot >= self.config.param_slots
                or func not in self.config.functions):
            raise _Error(isa.ErrorCode.BAD_FIELD)
        window = POOL_WINDOW[pool]
        self._check_ub(f["ub_addr"], count // window)
        self._check_acc(f["acc_addr"], count)
        p = self.params[slot]
        acc = self.acc[f["acc_addr"]:f["acc_addr"] + count]
        if func == isa.Func.NORMALISE:      # the multiplier from the row; then the identity
            fq = golden.requantise_normalised(acc, p.bias, p.shift, p.zero_point,
                                              p.rounding.value)
        else:
            q = golden.requantise(acc, p.bias, p.multiplier, p.shift, p.zero_point,
                                  p.rounding.value)
            fq = golden.activate(q, func.value, p.zero_point, p.clamp_hi, table=self.table)
        y = golden.max_pool_rows(fq, window)
        out = self.ub[f["ub_addr"]:f["ub_addr"] + count // window]
        out[:, :self.config.cols] = golden.to_raw(y)
        out[:, self.config.cols:] = 0

    def _op_load_params(self, f) -> None:
        slot, rounding = f["slot"], f["rounding"]
        if slot >= self.config.param_slots or not isinstance(rounding, isa.Rounding):
            raise _Error(isa.ErrorCode.BAD_FIELD)
        cols = self.config.cols
        p = self.params[slot]
        p.rounding = rounding
        p.zero_point = _int8(f["zero_point"])
        p.clamp_hi = _int8(f["clamp_hi"])
        if not f["column_shifts"]:
            p.shift = np.full(cols, f["shift"], dtype=np.int64)
        size = data.Layout.cast(param_row_beat(cols)).size
        shift_mask = (1 << data.Layout.cast(isa.LoadParams)["shift"].width) - 1

        def bias(beat: int) -> None:
            p.bias = _row(beat, size, np.dtype("<i4")).astype(np.int64)

        def multiplier(beat: int) -> None:
            p.multiplier = _row(beat, size, np.dtype("<i4")).astype(np.int64)

        def shifts(beat: int) -> None:
            p.shift = _row(beat, size, np.dtype("<u4")).astype(np.int64) & shift_mask

        self._pending = [bias, multiplier] + [shifts] * f["column_shifts"]

    def _op_load_table(self, f) -> None:
        # (A core without the sum tables decodes no target: the activation table's.)
        target = f["target"] if self.config.sum_tables else isa.TableTarget.ACTIVATION
        if not isinstance(target, isa.TableTarget):
            raise _Error(isa.ErrorCode.BAD_FIELD)
        cols = self.config.cols
        if target != isa.TableTarget.ACTIVATION:
            sums = self.sum_tables[target.value - 1]

            def sum_entries(first: int, beat: int) -> None:
                n = min(cols, isa.TABLE_ENTRIES - first)
                sums[first:first + n] = _row(beat, 32 * n, np.dtype("<i4"))

            self._pending = [lambda beat, first=b * cols: sum_entries(first, beat)
                             for b in range(isa.sum_table_beats(cols))]
            return
        per_beat = data.Layout.cast(param_row_beat(cols)).size // 8

        def entries(first: int, beat: int) -> None:
            n = min(per_beat, isa.TABLE_ENTRIES - first)     # the last beat: up to entry 255
            self.table[first:first + n] = _row(beat, 8 * n, np.uint8)

        self._pending = [lambda beat, first=b * per_beat: entries(first, beat)
                         for b in range(isa.table_beats(self.config.cols))]

    def _op_read_counters(self, f) -> None:
        self.output.extend(self.counters().values())

    def _op_ub_to_weights(self, f) -> None:
        ub_addr, tile, count = f["ub_addr"], f["tile"], f["count"]
        rows, cols = self.config.rows, self.config.cols
        self._check_count(count)
        if count > (cols if f["transpose"] else rows):
            raise _Error(isa.ErrorCode.BAD_FIELD)
        self._check_signed(f)
        self._check_ub(ub_addr, count)
        self._check_tiles(tile, 1)
        src = self.ub[ub_addr:ub_addr + count]              # ub_row >= rows, cols
        w = np.zeros((rows, cols), dtype=np.uint8)
        if f["transpose"]:
            w[:, :count] = src[:, :rows].T
        else:
            w[:count, :] = src[:, :cols]
        self.weights[tile] = w                              # queued tiles are copies
        self.weight_written[tile] = True
        self.weight_signed[tile] = bool(f["signed"])

    def _op_clear_counters(self, f) -> None:
        # The instruction completes after this; CLEAR_COUNTERS itself is not counted.
        self._counts = dict.fromkeys(DETERMINISTIC_COUNTERS, 0)
        self._counts["instructions"] = -1
