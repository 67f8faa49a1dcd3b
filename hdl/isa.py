"""Instruction set of the core: one definition shared by the gateware and the host.

Every instruction is one 64-bit word, an :class:`amaranth.lib.data.Struct` whose low four
bits are the :class:`Opcode`. The gateware decodes the words with these layouts and the host
assembler packs the very same layouts (``Matmul.const({...}).as_bits()``), so the two cannot
disagree about a field.

The host stream carries one *beat* per instruction or data row: a beat is
``TPUConfig.host_width`` bits, wide enough for an instruction, a unified-buffer row, a weight
row or a row of ``cols`` int32 values, each in the low bits of the beat. Instructions that move
data from the host (READ_HOST, LOAD_WEIGHTS, LOAD_PARAMS) are followed in the stream by their
data beats, and so is LOAD_TABLE (the activation unit's programmable table); UB_TO_WEIGHTS
moves data on chip (unified buffer to weight memory) and has none.
The core answers on its output stream with the beats WRITE_HOST, READ_COUNTERS and HALT send,
and with an error beat when an instruction fails its checks.

Semantics are written out in docs/isa.md (generated from this module by
``python -m firmware.isadoc``) and executed bit-exactly by :mod:`sim.models.isa_sim`.
"""

import functools

from amaranth.hdl import Shape, signed, unsigned
from amaranth.lib import data, enum

__all__ = ["INSTR_BITS", "Opcode", "Func", "Rounding", "Pool", "ErrorCode", "TableTarget",
           "COUNTERS",
           "COUNTER_BITS",
           "RESYNC_WORD", "Instr", "Nop", "Halt", "Sync", "ReadHost", "WriteHost",
           "LoadWeights", "ReadWeights", "Matmul", "Activate", "LoadParams", "ReadCounters",
           "ClearCounters", "UbToWeights", "LoadTable", "MatmulLookup", "TABLE_ENTRIES",
           "table_beats", "sum_table_beats",
           "window_rows", "window_ends", "window_cycles",
           "RECIPROCAL_BITS", "RECIPROCAL_SCALE", "reciprocal",
           "FORMATS", "Status", "decode"]

INSTR_BITS = 64


class Opcode(enum.Enum, shape=unsigned(4)):
    """Operation of an instruction word. Value 15 is reserved (UNKNOWN_OPCODE), and so are 12
    on a core built without UB_TO_WEIGHTS (:attr:`~hdl.config.TPUConfig.ub_to_weights`), 13 on
    one without the programmable table (:attr:`~hdl.config.TPUConfig.lookup_table`) and 14 on
    one without the sum tables (:attr:`~hdl.config.TPUConfig.sum_tables`)."""
    NOP           = 0   # do nothing
    HALT          = 1   # end of program: wait until idle, send a DONE beat
    SYNC          = 2   # wait until every unit is idle
    READ_HOST     = 3   # host -> unified buffer (TPU v1 Read_Host_Memory)
    WRITE_HOST    = 4   # unified buffer -> host (TPU v1 Write_Host_Memory)
    LOAD_WEIGHTS  = 5   # host -> weight memory
    READ_WEIGHTS  = 6   # weight memory -> weight FIFO (TPU v1 Read_Weights)
    MATMUL        = 7   # unified buffer x weights -> accumulators (TPU v1 MatrixMultiply)
    ACTIVATE      = 8   # accumulators -> requantise, function, pool -> unified buffer
    LOAD_PARAMS   = 9   # host -> requantisation parameter slot
    READ_COUNTERS = 10  # performance counters -> host
    CLEAR_COUNTERS = 11  # zero the performance counters
    UB_TO_WEIGHTS = 12  # unified buffer -> one weight tile, optionally transposed (attention)
    LOAD_TABLE    = 13  # host -> the activation unit's programmable table (exp, GELU, ...)
                        # or a sum table
    MATMUL_LOOKUP = 14  # MATMUL whose sums index a sum table of int32 (the residual ADD)


class Func(enum.Enum, shape=unsigned(3)):
    """Activation function applied after requantisation. Value 7 is invalid, and so are 5 on
    a core built without the programmable table and 6 on one without the row scale
    (:attr:`~hdl.config.TPUConfig.row_scale`)."""
    IDENTITY = 0
    RELU     = 1   # max(q, zero_point)
    CLAMP    = 2   # min(max(q, zero_point), clamp_hi), ReLU6 when clamp_hi encodes 6.0
    SIGMOID  = 3   # table: input scale 1/16, output scale 1/256, zero point -128
    TANH     = 4   # table: input scale 1/16, output scale 1/128, zero point 0
    TABLE    = 5   # the programmable table (LOAD_TABLE): entry q + 128, as an int8
    NORMALISE = 6  # the row divided by its last column: the multiplier is the reciprocal of
                   # that accumulator (see RECIPROCAL_BITS), the shift grows with it


class Rounding(enum.Enum, shape=unsigned(2)):
    """How the requantiser rounds ``p / 2**shift`` (``p`` the exact product). Value 3 is
    invalid. See :func:`sim.models.golden.rounding_shift` and docs/isa.md."""
    HALF_UP   = 0   # to nearest, ties towards +infinity
    HALF_EVEN = 1   # to nearest, ties to even (onnxruntime, ONNX QuantizeLinear)
    DOUBLE    = 2   # gemmlowp (TFLite's reference convolutions): to nearest at 2**31, ties up,
                    # then at 2**(shift - 31), ties away from zero; HALF_UP for shift <= 31


class Pool(enum.Enum, shape=unsigned(2)):
    """Max-pooling window over consecutive accumulator rows. Value 3 is invalid."""
    NONE = 0   # one output row per accumulator row
    MAX2 = 1   # element-wise max of 2 rows
    MAX4 = 2   # element-wise max of 4 rows


class TableTarget(enum.Enum, shape=unsigned(2)):
    """Which table a LOAD_TABLE replaces. Value 3 is invalid (BAD_FIELD). A core built without
    the sum tables (:attr:`~hdl.config.TPUConfig.sum_tables`) decodes no target (its netlist
    is the one before them): every LOAD_TABLE replaces its activation table."""
    ACTIVATION = 0   # the activation unit's programmable table (ACTIVATE's TABLE): int8
    SUM0       = 1   # sum table 0 (MATMUL_LOOKUP with table 0): int32
    SUM1       = 2   # sum table 1


class ErrorCode(enum.Enum, shape=unsigned(4)):
    """Why the core stopped. Every check happens before the instruction has any effect."""
    NONE             = 0
    UNKNOWN_OPCODE   = 1   # opcode 15 (12 on a core without UB_TO_WEIGHTS, 13 on one
                           # without the programmable table, 14 on one without the sum
                           # tables)
    UB_RANGE         = 2   # unified-buffer rows addr..addr+count-1 past ub_depth (a window
                           # MATMUL's: window_rows)
    ACC_RANGE        = 3   # accumulator rows past acc_depth
    WEIGHT_RANGE     = 4   # weight tiles past weight_mem_tiles
    WEIGHT_UNWRITTEN = 5   # READ_WEIGHTS of a tile no LOAD_WEIGHTS has written
    WEIGHT_EMPTY     = 6   # MATMUL needs a tile (switch, or none active) but none is queued
    WEIGHT_OVERFLOW  = 7   # READ_WEIGHTS would queue more than weight_fifo_depth + 1 tiles
    BAD_FIELD        = 8   # function (TABLE too on a core without the table, NORMALISE
                           # on one without the row scale), pooling,
                           # rounding or slot out of range, count not
                           # a multiple of the pooling window, UB_TO_WEIGHTS count past
                           # the tile's columns (transpose) or rows, MATMUL window on a
                           # core without conv_windows or with lane >= ub_row,
                           # LOAD_TABLE target 3 (a core with the sum tables)
    SIGNEDNESS       = 9   # LOAD_WEIGHTS, UB_TO_WEIGHTS or MATMUL of uint8 operands (signed
                           # clear) on a core built for int8 only (TPUConfig.operands="int8")


#: Performance counters, in the order READ_COUNTERS sends them (one beat each, 48 bits).
#: Categories follow TPU v1's Table 3.
COUNTERS = (
    "cycles",          # every cycle since the counters were cleared
    "instructions",    # instructions completed (decoded without error)
    "array_active",    # cycles an activation row entered the systolic array
    "useful_macs",     # multiply-accumulates of those rows: rows * cols each
    "weight_stall",    # cycles a MATMUL row waited for its weight tile to shift in
    "weight_shift",    # cycles a weight row shifted into the array's shadow registers
    "non_matrix",      # cycles the array was idle while ACTIVATE, UB_TO_WEIGHTS or host
                       # transfers ran
    "raw_stall",       # cycles an instruction waited on a unified-buffer/accumulator hazard
    "host_stall",      # cycles the core waited for a beat from the host
)
COUNTER_BITS = 48

#: The resynchronisation word (a beat's low 64 bits): after an error the core discards every
#: beat until this one, which clears the error and restarts the program at instruction 0; with
#: no error pending it only restarts the program. Its opcode, 15, is reserved (no instruction).
RESYNC_WORD = 0x5253594E_0000000F   # "RSYN" << 32 | opcode 15


class Instr(data.Struct):
    """Generic view of an instruction word: the decoder's view of the fields."""
    opcode: Opcode
    flags:  4
    a:      16
    b:      16
    count:  16
    c:      8


class Nop(data.Struct):
    """Do nothing."""
    opcode: Opcode
    _pad:   60


class Halt(data.Struct):
    """End of program: wait until every unit is idle, then send one DONE beat
    (``DONE_MAGIC << 32 | instructions in this program``). The instruction index restarts.
    Timing: the beat leaves the cycle after the last unit goes idle."""
    opcode: Opcode
    _pad:   60


class Sync(data.Struct):
    """Wait until every unit is idle (a fence). Never needed for correctness: the
    interlocks order conflicting instructions; use it to separate phases for measurement."""
    opcode: Opcode
    _pad:   60


class ReadHost(data.Struct):
    """``count`` beats from the host into unified-buffer rows ``ub_addr..``.
    The low ``8 * ub_row`` bits of each beat are the row (element 0 lowest).
    Timing: runs in the front end, one beat a cycle (every other cycle while an ACTIVATE
    writes the buffer too); waits while an unfinished MATMUL or WRITE_HOST reads, or an
    ACTIVATE writes, any of its rows."""
    opcode:  Opcode
    _flags:  4
    ub_addr: 16
    _b:      16
    count:   16
    _c:      8


class WriteHost(data.Struct):
    """Unified-buffer rows ``ub_addr..ub_addr+count-1`` to the host, one beat each.
    Timing: runs in the host writer behind later instructions, a row a cycle as the host
    takes them (the buffer has a read port for it alone); waits while an unfinished
    ACTIVATE writes any of its rows or another WRITE_HOST runs."""
    opcode:  Opcode
    _flags:  4
    ub_addr: 16
    _b:      16
    count:   16
    _c:      8


class LoadWeights(data.Struct):
    """``count * rows`` beats from the host into weight tiles ``tile..``, row 0 of each tile
    first (the low ``8 * cols`` bits of each beat). ``signed``: the tiles hold int8, else
    uint8. Timing: runs in the front end, one beat a cycle; waits while an unfinished
    READ_WEIGHTS reads any of its tiles."""
    opcode: Opcode
    signed: 1
    _flags: 3
    tile:   16
    _b:     16
    count:  16
    _c:     8


class ReadWeights(data.Struct):
    """Queue weight tiles ``tile..tile+count-1`` for the matrix unit. Runs behind later
    instructions; the tiles shift into the array while earlier MATMULs compute.
    Timing: runs in the weight loader, one row a cycle into the weight FIFO while it has
    room; a tile shifts into the array's shadow registers in ``rows`` cycles once the
    previous one has been switched in. Waits while another READ_WEIGHTS runs."""
    opcode: Opcode
    _flags: 4
    tile:   16
    _b:     16
    count:  16
    _c:     8


class Matmul(data.Struct):
    """Multiply unified-buffer rows ``ub_addr..`` (the first ``rows`` elements of each) by
    the active weight tile into accumulator rows ``acc_addr..``, ``count`` rows.
    ``switch``: first make the oldest queued tile active. ``accumulate``: add to the
    accumulator rows, else overwrite them. ``signed``: the activations are int8, else uint8.
    ``window`` (a core with :attr:`~hdl.config.TPUConfig.conv_windows`): row ``i``'s
    activations are instead the ``rows`` elements from element ``lane + i * step`` of the
    buffer read as one run of elements from row ``ub_addr`` (``ub_row`` elements a row, row
    ``ub_addr``'s element 0 first): a convolution's windows over a tensor stored as it is
    (height, width, channels, packed), ``step`` the channels times the stride, so that no
    host or earlier instruction cuts patches. The rows read are :func:`window_rows`;
    ``lane`` and ``step`` are ignored without ``window``.
    Timing: runs in the matrix engine, up to ``matmul_slots`` MATMULs in flight; one row a
    cycle, the next MATMUL's first row entering the array the cycle after this one's last; a
    row's sums reach the accumulators ``rows + cols + 4`` cycles after its buffer read
    (``rows + cols + 8`` with ``pipeline="fast"``, whose PEs register the multiplier's inputs
    and output twice more). With ``window``, the engine reads the rows in order, one a cycle,
    each as soon as a window needs it, and sends a window in the cycle its last row is read
    or, when that row was read already, in a cycle of its own: ``count`` cycles plus one for
    each row read that completes no window (:func:`window_cycles`), so a window a cycle
    while ``step <= ub_row``. The ``switch`` row waits (weight stall) until its tile is in the
    shadow registers. Waits while an unfinished ACTIVATE writes its buffer rows or reads its
    accumulator rows."""
    opcode:     Opcode
    accumulate: 1
    switch:     1
    signed:     1
    window:     1
    ub_addr:    16
    acc_addr:   16
    count:      16
    lane:       4
    step:       4


def window_rows(lane: int, step: int, count: int, rows: int, ub_row: int) -> int:
    """Unified-buffer rows a ``window`` MATMUL reads from its ``ub_addr``: those holding
    elements ``lane .. lane + (count - 1) * step + rows - 1``."""
    return (lane + (count - 1) * step + rows - 1) // ub_row + 1


def window_ends(lane: int, step: int, count: int, rows: int, ub_row: int) -> list[int]:
    """Per window of a ``window`` MATMUL, the row (from ``ub_addr``) that holds its last
    element: the row whose read completes it."""
    return [(lane + i * step + rows - 1) // ub_row for i in range(count)]


def window_cycles(lane: int, step: int, count: int, rows: int, ub_row: int) -> int:
    """Cycles a ``window`` MATMUL's rows take in the matrix engine when nothing waits: one a
    window, and one for each row read that completes none."""
    ends = window_ends(lane, step, count, rows, ub_row)
    return count + window_rows(lane, step, count, rows, ub_row) - len(set(ends))


class MatmulLookup(data.Struct):
    """A MATMUL whose sums index a table (a core with :attr:`~hdl.config.TPUConfig.sum_tables`):
    as :class:`Matmul` without ``window`` (the same fields in the same bits; ``table`` is
    where MATMUL's ``window`` is), but each column's sum ``s`` is replaced by entry ``s mod
    256`` (its low byte) of sum table ``table``, an int32, before it is written or added to
    the accumulator row. With an identity weight tile the sum is the activation itself, so
    ``T0[x] + T1[y]`` of two tensors forms in the accumulators: TFLite's and onnxruntime's
    quantised ADD (each input scaled by a function of its own, the sum requantised by an
    ACTIVATE), which no single multiplier of a MATMUL can express exactly. Tables are
    indexed by the byte, so an int8 ``x`` takes entry ``x & 255`` and a uint8 one entry
    ``x``. Checks, hazards and timing are MATMUL's: the lookup sits beside the accumulators'
    read of the old sums, in the same stage; after a reset it waits until the accumulators
    have zeroed the tables (512 cycles, in the background)."""
    opcode:     Opcode
    accumulate: 1
    switch:     1
    signed:     1
    table:      1
    ub_addr:    16
    acc_addr:   16
    count:      16
    _c:         8


class Activate(data.Struct):
    """Accumulator rows ``acc_addr..acc_addr+count-1`` through requantisation with parameter
    ``slot``, function ``func`` and max-pooling ``pool`` into unified-buffer rows
    ``ub_addr..`` (``count / window`` rows, the first ``cols`` elements of each).
    Timing: runs in the activation engine behind later instructions: one cycle to fetch the
    parameters, then the rows through the activation unit (``ActivationUnit.STAGES`` deep).
    Waits while an unfinished MATMUL writes its accumulator rows or reads its buffer rows, a
    WRITE_HOST reads its buffer rows, or another ACTIVATE runs."""
    opcode:   Opcode
    _flags:   4
    acc_addr: 16
    ub_addr:  16
    count:    16
    func:     Func
    pool:     Pool
    slot:     3


class LoadParams(data.Struct):
    """Requantisation parameter slot ``slot``: scalars from the instruction, then two beats
    from the host: the per-column int32 bias row and the per-column int32 multiplier row
    (column 0 in the low 32 bits); with ``column_shifts`` set, a third beat: the per-column
    rounding shifts (column ``j``'s in bits ``[32j, 32j+6)``, the lane's other bits ignored),
    which replace ``shift``. ``rounding`` (:class:`Rounding`) is the slot's rounding mode.
    Timing: runs in the front end, one beat a cycle; waits until no ACTIVATE runs."""
    opcode:     Opcode
    _flags:     4
    slot:       3
    rounding:   Rounding
    column_shifts: 1
    _pad:       2
    shift:      6
    _pad2:      2
    zero_point: signed(8)
    clamp_hi:   signed(8)
    _pad3:      24


class ReadCounters(data.Struct):
    """Send the performance counters to the host, one beat each, in :data:`COUNTERS` order.
    Timing: waits until every unit is idle, then a beat at most every two cycles as the host
    takes them. Each value is sampled after the previous beat is taken (the first after
    READ_COUNTERS issues), within 8 cycles (the counters take turns to be shown), and held
    while the host stalls."""
    opcode: Opcode
    _pad:   60


class UbToWeights(data.Struct):
    """Unified-buffer rows ``ub_addr..ub_addr+count-1`` into weight tile ``tile``, so that an
    activation the core computed (attention's K and V) becomes a weight tile without crossing
    the host link. With ``transpose`` set, buffer row ``i`` becomes column ``i`` of the tile
    (its first ``rows`` elements; ``count`` at most ``cols``): ``tile[r][i] = ub[ub_addr+i][r]``,
    Kᵀ for Q·Kᵀ. Clear, it becomes row ``i`` (its first ``cols`` elements; ``count`` at most
    ``rows``): ``tile[i][c] = ub[ub_addr+i][c]``, V for P·V. The tile's other columns (rows)
    are zero, so a sequence shorter than the array needs no padding rows. ``signed``: the tile
    holds int8, else uint8. Marks the tile written, as LOAD_WEIGHTS does; tiles already queued
    by READ_WEIGHTS keep what they held.
    Timing: runs in the front end: the rows are read a row a cycle through the unified
    buffer's second read port (shared with WRITE_HOST) into a tile buffer, then written to
    the weight memory a row a cycle (``count + rows`` cycles and the read latency); waits
    while an unfinished ACTIVATE writes any of its buffer rows or a READ_WEIGHTS reads the
    tile."""
    opcode:    Opcode
    signed:    1
    transpose: 1
    _flags:    2
    ub_addr:   16
    tile:      16
    count:     16
    _c:        8


#: NORMALISE's reciprocal: a row's divisor ``d`` (the raw accumulator of its last column),
#: when positive, is cut to its top ``RECIPROCAL_BITS`` bits, ``m = d >> e`` with
#: ``e = max(0, bit_length(d) - RECIPROCAL_BITS)``, and the row's multiplier is
#: ``round(2**RECIPROCAL_SCALE / m)`` (ties up), its shift ``min(63, shift + e)``: each
#: element becomes ``t / d * 2**(RECIPROCAL_SCALE - shift)`` to within ``2**(1 -
#: RECIPROCAL_BITS)`` relative (exactly rounded where ``d < 2**RECIPROCAL_BITS``). A divisor of
#: 0 or less gives a multiplier of 0 (the row's elements become the zero point).
RECIPROCAL_BITS = 9
RECIPROCAL_SCALE = 25

#: Entries of the programmable table: one per int8 input.
TABLE_ENTRIES = 256


def table_beats(cols: int, target: TableTarget = TableTarget.ACTIVATION) -> int:
    """Data beats that follow a LOAD_TABLE of ``target`` on a core with ``cols`` columns: the
    activation table's ``4 * cols`` byte entries each, a sum table's ``cols`` int32 entries
    each (a parameter row's 32 bits per column)."""
    per_beat = 4 * cols if target == TableTarget.ACTIVATION else cols
    return -(-TABLE_ENTRIES // per_beat)


def sum_table_beats(cols: int) -> int:
    """Data beats that follow a LOAD_TABLE of a sum table: ``cols`` entries each."""
    return table_beats(cols, TableTarget.SUM0)


def reciprocal(d: int) -> tuple[int, int]:
    """NORMALISE's ``(multiplier, extra shift)`` for the divisor ``d`` (an int32; see
    :data:`RECIPROCAL_BITS`)."""
    if d <= 0:
        return 0, 0
    e = max(0, d.bit_length() - RECIPROCAL_BITS)
    m = d >> e
    return ((1 << RECIPROCAL_SCALE) + m // 2) // m, e


class LoadTable(data.Struct):
    """Replace a table (``target``, :class:`TableTarget`). ACTIVATION: the activation unit's
    programmable table, which ACTIVATE's function TABLE reads: 256
    entries, entry ``k`` the output byte for the requantised value ``q = k - 128``, so that
    exp, GELU or any function of an int8 value runs on chip. The entries follow from the host
    in :func:`table_beats` beats of ``4 * cols`` entries each, as a parameter row's bytes
    (entry ``k`` in beat ``k // (4 * cols)``, bits ``[8 * (k % (4 * cols)), +8)``; a last
    beat's bits past entry 255 are ignored). Every column has a copy of it (the pipelined
    activation unit looks up a row's ``cols`` values in one cycle).
    SUM0 and SUM1 (a core with :attr:`~hdl.config.TPUConfig.sum_tables`): the sum table that
    MATMUL_LOOKUP's ``table`` 0 or 1 reads, 256 int32 entries, entry ``k`` for the sum whose
    low byte is ``k``, in :func:`sum_table_beats` beats of ``cols`` entries each, as a
    parameter row (entry ``k`` in beat ``k // cols``, bits ``[32 * (k % cols), +32)``; a last
    beat's lanes past entry 255 are ignored); a copy per column beside the accumulators.
    The whole table is replaced; after a reset every table holds zeros.
    Timing: runs in the front end, a beat every ``4 * cols`` cycles (ACTIVATION) or ``cols``
    cycles (a sum table): the entries are written one a cycle, into every copy at once.
    ACTIVATION waits until no ACTIVATE runs, a sum table until every unit is idle (no
    MATMUL_LOOKUP's row may be between the buffer and the accumulators) and, after a reset,
    until the accumulators have zeroed the tables."""
    opcode: Opcode
    target: TableTarget
    _pad:   58


class ClearCounters(data.Struct):
    """Zero every performance counter. Timing: waits until every unit is idle."""
    opcode: Opcode
    _pad:   60


#: The layout of each opcode.
FORMATS = {
    Opcode.NOP: Nop, Opcode.HALT: Halt, Opcode.SYNC: Sync,
    Opcode.READ_HOST: ReadHost, Opcode.WRITE_HOST: WriteHost,
    Opcode.LOAD_WEIGHTS: LoadWeights, Opcode.READ_WEIGHTS: ReadWeights,
    Opcode.MATMUL: Matmul, Opcode.ACTIVATE: Activate, Opcode.LOAD_PARAMS: LoadParams,
    Opcode.READ_COUNTERS: ReadCounters, Opcode.CLEAR_COUNTERS: ClearCounters,
    Opcode.UB_TO_WEIGHTS: UbToWeights, Opcode.LOAD_TABLE: LoadTable,
    Opcode.MATMUL_LOOKUP: MatmulLookup,
}


class Status(data.Struct):
    """Status the host can read at any time (out of band): sticky until cleared."""
    error:       1
    code:        ErrorCode
    halted:      1    # the core has finished a HALT and is waiting for more instructions
    _pad:        2
    instr_index: 24   # the failing instruction's index in its program, else the next one's


def _field_decoders(opcode: Opcode) -> tuple[tuple[str, int, int, int, type | None], ...]:
    """``(name, offset, mask, sign bit or 0, enum class or None)`` of every field after the
    opcode in *opcode*'s layout, in layout order, for :func:`decode`."""
    specs = []
    for name, field in data.Layout.cast(FORMATS[opcode]):
        if name == "opcode":
            continue
        shape = field.shape
        kind = shape if isinstance(shape, type) and issubclass(shape, enum.Enum) else None
        width = field.width
        sign = 1 << (width - 1) if kind is None and Shape.cast(shape).signed else 0
        specs.append((name, field.offset, (1 << width) - 1, sign, kind))
    return tuple(specs)


#: Per opcode, its fields as :func:`decode` reads them (from the layouts of :data:`FORMATS`).
_DECODERS = {opcode: _field_decoders(opcode) for opcode in FORMATS}
_OPCODE_MASK = (1 << Opcode.as_shape().width) - 1
_WORD_MASK = (1 << INSTR_BITS) - 1


@functools.lru_cache(maxsize=1 << 16)
def _decode(word: int) -> tuple[Opcode | int, tuple[tuple[str, object], ...]]:
    raw = word & _OPCODE_MASK
    try:
        opcode = Opcode(raw)
    except ValueError:
        return raw, ()
    fields = []
    for name, offset, mask, sign, kind in _DECODERS[opcode]:
        value = (word >> offset) & mask
        if kind is not None:
            try:
                value = kind(value)
            except ValueError:                # an enum field holding no member
                pass
        elif value & sign:
            value -= sign << 1
        fields.append((name, value))
    return opcode, tuple(fields)


def decode(word: int) -> tuple[Opcode | int, dict[str, object]]:
    """The opcode and every field after it of instruction word ``word`` (its low
    :data:`INSTR_BITS` bits), in layout order: enum fields as members (an int when the value
    names none), signed fields as negative ints, reserved fields too. An unknown opcode comes
    back as an int, with no fields. The one decoder: the assembler, the disassembler and the
    ISA simulator use it.

    The fields are cut with integer shifts from offsets taken from the layouts once, and
    words seen before come from a cache: the compiler's timing model and the ISA simulator
    decode every instruction they meet, and a view of the layout costs a few hundred
    microseconds a word (tests/hdl/test_isa.py checks this against the layouts' views)."""
    opcode, fields = _decode(int(word) & _WORD_MASK)
    return opcode, dict(fields)
