"""The activation functions' tables (SIGMOID and TANH), and their lookup as LUT logic."""

import functools
import math

from amaranth.hdl import Cat, Const, Mux, Value

from hdl.isa import Func

__all__ = ["LUT_INPUT_SCALE", "lut_table", "table_rom", "table_quarter"]

#: A table index ``q`` (int8) stands for ``q * LUT_INPUT_SCALE``.
LUT_INPUT_SCALE = 1 / 16


def lut_table(func: Func) -> list[int]:
    """The 256 int8 outputs of a table function for inputs q = -128..127.

    SIGMOID: output scale 1/256, zero point -128; TANH: output scale 1/128, zero point 0.
    Rounded half away from zero, saturated to int8.
    """
    if func == Func.SIGMOID:
        fn, scale, zp = (lambda x: 1 / (1 + math.exp(-x))), 256, -128
    elif func == Func.TANH:
        fn, scale, zp = math.tanh, 128, 0
    else:
        raise ValueError(f"{func} has no table")
    table = []
    for q in range(-128, 128):
        y = fn(q * LUT_INPUT_SCALE) * scale
        rounded = math.floor(y + 0.5) if y >= 0 else math.ceil(y - 0.5)
        table.append(max(-128, min(127, rounded + zp)))
    return table


@functools.cache
def table_rom() -> tuple[int, ...]:
    """Both tables as raw bytes, SIGMOID at 0..255 and TANH at 256..511, indexed by
    ``q + 128``."""
    return tuple(v & 0xff for v in lut_table(Func.SIGMOID) + lut_table(Func.TANH))


def _rom_bit(values: list[int], index, memo: dict):
    """One output bit of a table as a tree of 2:1 multiplexers on the bits of *index* (equal
    subtrees shared), which synthesis maps to LUTs: a switch or an indexed array would be
    turned into a block RAM, whose slow output would need a pipeline stage of its own."""
    key = tuple(values)
    if key not in memo:
        if all(value == values[0] for value in values):
            memo[key] = Const(values[0], 1)
        else:
            half = len(values) // 2
            bit = index[half.bit_length() - 1]
            memo[key] = Mux(bit, _rom_bit(values[half:], index, memo),
                            _rom_bit(values[:half], index, memo))
    return memo[key]


def table_quarter(k: int, index, tanh) -> Value:
    """The table entry in quarter *k* of the index range (``q + 128`` in ``64 * k`` to
    ``64 * k + 63``) that *index*, ``q``'s low 6 bits, selects, of TANH if *tanh* else of
    SIGMOID: 8 bits of LUT logic."""
    rom = table_rom()
    low = Cat(index, tanh)
    memo: dict = {}
    entries = rom[64 * k:64 * (k + 1)] + rom[256 + 64 * k:256 + 64 * (k + 1)]
    return Cat(*(_rom_bit([(value >> bit) & 1 for value in entries], low, memo)
                 for bit in range(8)))
