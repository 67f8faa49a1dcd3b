"""Row layouts shared by the blocks that exchange them: activation, weight and output
rows of the array, accumulator rows, accumulator writes."""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

__all__ = ["act_row_layout", "weight_row_layout", "psum_row_layout", "acc_row_layout",
           "psum_write_layout"]


def act_row_layout(rows: int, data_width: int = 8) -> data.StructLayout:
    """One activation row: ``rows`` raw operands, their signedness, and the tile-switch mark."""
    return data.StructLayout({
        "data":   data.ArrayLayout(unsigned(data_width), rows),
        "signed": unsigned(1),
        "switch": unsigned(1),
    })


def weight_row_layout(cols: int, data_width: int = 8) -> data.StructLayout:
    """One row of a weight tile: ``cols`` raw weights and their signedness."""
    return data.StructLayout({
        "data":   data.ArrayLayout(unsigned(data_width), cols),
        "signed": unsigned(1),
    })


def psum_row_layout(cols: int, acc_width: int = 32) -> data.ArrayLayout:
    """One output row: ``cols`` wrapped partial sums."""
    return data.ArrayLayout(signed(acc_width), cols)


def acc_row_layout(cols: int, acc_width: int = 32) -> data.StructLayout:
    """A row of accumulator sums entering the unit; ``last`` closes a pooling window."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(acc_width), cols),
        "last": unsigned(1),
    })


def psum_write_layout(addr_bits: int, cols: int, acc_width: int = 32,
                      sum_tables: bool = False) -> data.StructLayout:
    """A row into the accumulators: overwrite or add ``data`` at ``addr``; with the sum
    tables, ``lookup`` replaces each sum by its low byte's entry in sum table ``table``
    (MATMUL_LOOKUP)."""
    return data.StructLayout({
        "addr":       unsigned(addr_bits),
        "accumulate": unsigned(1),
        **({"lookup": unsigned(1), "table": unsigned(1)} if sum_tables else {}),
        "data":       data.ArrayLayout(signed(acc_width), cols),
    })
