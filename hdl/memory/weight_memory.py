"""Weight memory: the on-chip store of weight tiles the host fills (TPU v1 kept its weights
in off-chip DRAM; a small FPGA part keeps them in block RAM)."""

from hdl.layouts import weight_row_layout
from hdl.memory.row_memory import RowMemory

__all__ = ["WeightMemory"]


class WeightMemory(RowMemory):
    """``tiles`` weight tiles of ``rows`` rows, row ``r`` of tile ``t`` at address
    ``t * rows + r``; each row carries ``cols`` raw weights and the tile's signedness.

    Write clients ``w[0]`` (the host, LOAD_WEIGHTS) and, with *mover*, ``w[1]`` (the weight
    mover, UB_TO_WEIGHTS), sharing the write port; one read client ``r[0]`` (the weight
    loader, READ_WEIGHTS) with a port of its own; see :class:`RowMemory` for the members
    and their protocol.
    """

    def __init__(self, *, tiles: int, rows: int, cols: int, data_width: int = 8,
                 pipelined: bool = False, mover: bool = False):
        self.tiles = tiles
        self.rows = rows
        super().__init__(depth=tiles * rows, row_shape=weight_row_layout(cols, data_width),
                         writers=2 if mover else 1, pipelined=pipelined)
