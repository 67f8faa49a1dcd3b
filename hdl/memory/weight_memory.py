"""Weight memory: the on-chip store of weight tiles the host fills (TPU v1 kept its weights
in off-chip DRAM; a small FPGA part keeps them in block RAM)."""

from hdl.layouts import weight_row_layout
from hdl.memory.row_memory import RowMemory

__all__ = ["WeightMemory"]


class WeightMemory(RowMemory):
    """``tiles`` weight tiles of ``rows`` rows, row ``r`` of tile ``t`` at address
    ``t * rows + r``; each row carries ``cols`` raw weights and the tile's signedness.

    One write client ``w[0]`` (the host, LOAD_WEIGHTS) and one read client ``r[0]`` (the
    weight loader, READ_WEIGHTS), each with its own port; see :class:`RowMemory` for the
    members and their protocol.
    """

    def __init__(self, *, tiles: int, rows: int, cols: int, data_width: int = 8,
                 pipelined: bool = False):
        self.tiles = tiles
        self.rows = rows
        super().__init__(depth=tiles * rows, row_shape=weight_row_layout(cols, data_width),
                         pipelined=pipelined)
