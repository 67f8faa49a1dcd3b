"""Port groups shared by the core's blocks, so that :mod:`hdl.core` connects them with
``wiring.connect``: a memory read client, a memory write request, the requantisation
parameters as one struct, the matrix unit's status and the performance-counter events.

Each signature is written from the point of view of the block that *drives* the group's
requests (the client, the producer); the other side takes it flipped (``In(...)``).
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import param_row_beat
from hdl.isa import COUNTERS, Func, Rounding

__all__ = ["addr_bits", "write_request_layout", "MemReadSignature", "MemWriteSignature",
           "requant_params_layout", "ColumnWord", "ParamColumnSignature", "MatrixStatusSignature",
           "CounterEventsSignature", "COUNTER_EVENTS"]


def addr_bits(depth: int) -> int:
    """Bits of an address into ``depth`` rows (at least 1)."""
    return max(1, (depth - 1).bit_length())


def write_request_layout(addr_bits: int, row_shape) -> data.StructLayout:
    """One write request: the row's address and its contents."""
    return data.StructLayout({"addr": unsigned(addr_bits), "data": row_shape})


class MemReadSignature(wiring.Signature):
    """A memory read client: addresses out, rows back, one per address, in order.

    Members
    -------
    addr : Out(stream.Signature(unsigned(addr_bits)))
        Read requests.
    data : In(stream.Signature(row_shape))
        Read responses.
    """

    def __init__(self, addr_bits: int, row_shape):
        self.addr_bits = addr_bits
        self.row_shape = row_shape
        super().__init__({
            "addr": Out(stream.Signature(unsigned(addr_bits))),
            "data": In(stream.Signature(row_shape)),
        })


def MemWriteSignature(addr_bits: int, row_shape) -> stream.Signature:
    """A memory write client: a stream of :func:`write_request_layout` requests."""
    return stream.Signature(write_request_layout(addr_bits, row_shape))


def requant_params_layout(cols: int) -> data.StructLayout:
    """What the activation unit applies to a row: per-column int32 bias and multiplier, the
    per-column rounding shift and the rounding mode, the zero point, CLAMP's upper bound and
    the function."""
    return data.StructLayout({
        "bias":       param_row_beat(cols),
        "multiplier": param_row_beat(cols),
        "shift":      data.ArrayLayout(unsigned(6), cols),
        "rounding":   Rounding,
        "zero_point": signed(8),
        "clamp_hi":   signed(8),
        "func":       Func,
    })


class ColumnWord(enum.Enum, shape=unsigned(2)):
    """A column's words in the serial unit's parameter store (and the store's address bits
    that say which)."""
    BIAS       = 0
    MULTIPLIER = 1
    SCALARS    = 2      # the slot's scalars, at column 0
    SHIFT      = 3


class ParamColumnSignature(wiring.Signature):
    """The requantisation parameters one column at a time, for
    :class:`~hdl.datapath.activation_serial.SerialActivationUnit`: the unit selects a column's
    bias, multiplier or shift and reads it as ``word`` one cycle later (a synchronous
    block-RAM read); the scalars and the function are held while a row is in flight.

    Members
    -------
    col : Out(range(cols))
        The column whose word to read.
    kind : Out(ColumnWord)
        Which of its words.
    word : In(signed(32))
        The word selected in the previous cycle.
    shift : In(6)
        The slot's shift, for every column unless ``column_shifts``.
    column_shifts : In(1)
        Each column has its own shift (its ``SHIFT`` word's low 6 bits).
    rounding, zero_point, clamp_hi, func : In
        As in :func:`requant_params_layout`.
    """

    def __init__(self, cols: int):
        super().__init__({
            "col":        Out(range(cols)),
            "kind":       Out(ColumnWord),
            "word":       In(signed(32)),
            "shift":      In(6),
            "column_shifts": In(1),
            "rounding":   In(Rounding),
            "zero_point": In(signed(8)),
            "clamp_hi":   In(signed(8)),
            "func":       In(Func),
        })


class MatrixStatusSignature(wiring.Signature):
    """The matrix unit's status, as it drives it.

    Members
    -------
    weight_stall : Out(1)
        A ``switch`` row waits for its tile to finish shifting in.
    weight_shift : Out(1)
        A weight row shifts into the shadow registers this cycle.
    shadow_full : Out(1)
        The shadow registers hold a whole tile that is not switched in yet.
    tiles : Out(range(fifo_depth + 1))
        Whole tiles waiting in the weight FIFO.
    """

    def __init__(self, fifo_depth: int):
        self.fifo_depth = fifo_depth
        super().__init__({
            "weight_stall": Out(1),
            "weight_shift": Out(1),
            "shadow_full":  Out(1),
            "tiles":        Out(range(fifo_depth + 1)),
        })


#: Event inputs of the performance counters (one bit each, counted when high).
#: ``useful_macs`` counts ``rows * cols`` per ``array_active`` cycle; ``non_matrix`` counts
#: the cycles ``other_work`` is high and no row enters the array; ``cycles`` every cycle.
COUNTER_EVENTS = ("instructions", "array_active", "weight_stall", "weight_shift",
                  "other_work", "raw_stall", "host_stall", "clear")
assert {"cycles", "useful_macs", "non_matrix"} | set(COUNTER_EVENTS) - {"other_work", "clear"} \
    == set(COUNTERS)


class CounterEventsSignature(wiring.Signature):
    """Events the performance counters count, as the blocks drive them (see
    :data:`COUNTER_EVENTS`)."""

    def __init__(self):
        super().__init__({name: Out(1) for name in COUNTER_EVENTS})
