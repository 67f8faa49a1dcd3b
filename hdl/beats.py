"""The beats on the host stream besides instructions: the data rows that follow READ_HOST,
LOAD_WEIGHTS and LOAD_PARAMS and that WRITE_HOST and READ_COUNTERS send, the DONE beat HALT
sends and the error beat, as layouts for the gateware and as values for the host.

The instruction words themselves, and the resynchronisation word, are :mod:`hdl.isa`'s.
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from hdl.isa import COUNTER_BITS, ErrorCode

__all__ = [
    "DONE_MAGIC", "ERROR_MAGIC", "DoneBeat", "ErrorBeat", "DATA_BITS", "ub_row_beat",
    "weight_row_beat", "param_row_beat", "COUNTER_BEAT", "done_beat", "error_beat",
]

#: Upper 32 bits of the beat HALT sends; the lower 32 bits count the program's instructions.
DONE_MAGIC = 0x444F4E45   # "DONE"

#: Upper 32 bits of the beat the core sends when an instruction fails its checks.
ERROR_MAGIC = 0x4641494C  # "FAIL"


class DoneBeat(data.Struct):
    """The beat HALT sends (in the low 64 bits of a host beat)."""
    instructions: 32     # instructions in the program, the HALT included
    magic:        32     # DONE_MAGIC


class ErrorBeat(data.Struct):
    """The beat the core sends when an instruction fails its checks, after the output of
    every earlier instruction (in the low 64 bits of a host beat)."""
    instr_index: 24      # the failing instruction's index in its program
    code:        4       # ErrorCode
    _pad:        4
    magic:       32      # ERROR_MAGIC


# Data beats ----------------------------------------------------------------------------------
# Each sits in the low bits of a host beat; bits above it are ignored on input and zero on
# output. Their sizes depend on the configuration (``ub_row = max(rows, cols)``).

#: Bits of one activation or weight element (int8 or uint8: the same raw bits).
DATA_BITS = 8


def ub_row_beat(ub_row: int) -> data.ArrayLayout:
    """A unified-buffer row (READ_HOST in, WRITE_HOST out): ``ub_row`` raw bytes, element 0
    in the low bits."""
    return data.ArrayLayout(unsigned(DATA_BITS), ub_row)


def weight_row_beat(cols: int) -> data.ArrayLayout:
    """A weight row (LOAD_WEIGHTS): ``cols`` raw bytes, column 0 in the low bits."""
    return data.ArrayLayout(unsigned(DATA_BITS), cols)


def param_row_beat(cols: int) -> data.ArrayLayout:
    """A parameter row (LOAD_PARAMS: the bias row, then the multiplier row): ``cols`` int32,
    column 0 in the low bits."""
    return data.ArrayLayout(signed(32), cols)


#: A counter beat (READ_COUNTERS), one per counter in :data:`COUNTERS` order.
COUNTER_BEAT = unsigned(COUNTER_BITS)


def done_beat(instructions: int) -> int:
    """The beat HALT sends for a program of ``instructions`` instructions."""
    return data.Layout.cast(DoneBeat).const({
        "instructions": instructions & 0xFFFF_FFFF, "magic": DONE_MAGIC}).as_bits()


def error_beat(code: ErrorCode | int, index: int) -> int:
    """The beat the core sends when instruction ``index`` fails with ``code``."""
    return data.Layout.cast(ErrorBeat).const({
        "instr_index": index & 0xFF_FFFF, "code": int(getattr(code, "value", code)),
        "magic": ERROR_MAGIC}).as_bits()
