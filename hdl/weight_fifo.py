"""FIFO of whole weight tiles between the weight source and the systolic array."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .block_fifo import BlockFIFO
from .systolic_array import weight_row_layout

__all__ = ["WeightFIFO"]


class WeightFIFO(wiring.Component):
    """Holds up to ``depth`` weight tiles of ``rows`` rows each (TPU v1: 4 tiles).

    Rows arrive on ``i_row`` one per beat, row 0 of a tile first. A tile is offered on
    ``o_row`` only once all its rows are stored, and then row by row without gaps while the
    consumer is ready, so the systolic array's shadow shift of a tile takes exactly ``rows``
    cycles. Valid/ready on both sides: no row is lost or duplicated under any stall pattern.

    Parameters
    ----------
    rows : int
        Rows in one tile.
    cols : int
        Weights in one row.
    data_width : int
        Weight width.
    depth : int
        Tiles the FIFO holds.

    Members
    -------
    i_row : In(stream.Signature(weight_row_layout))
        Rows of incoming tiles.
    o_row : Out(stream.Signature(weight_row_layout))
        Rows of whole tiles, oldest first.
    o_tiles : Out(range(depth + 1))
        Whole tiles stored (including one being read out).
    """

    def __init__(self, *, rows: int, cols: int, data_width: int = 8, depth: int = 4):
        if rows < 1 or cols < 1 or depth < 1:
            raise ValueError(f"WeightFIFO needs rows, cols and depth >= 1, "
                             f"not rows={rows}, cols={cols}, depth={depth}")
        self.rows = rows
        self.cols = cols
        self.depth = depth
        layout = weight_row_layout(cols, data_width)
        super().__init__({
            "i_row":   In(stream.Signature(layout)),
            "o_row":   Out(stream.Signature(layout)),
            "o_tiles": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()

        m.submodules.rows = rows = BlockFIFO(
            width=len(self.i_row.payload.as_value()), depth=self.rows * self.depth)
        wiring.connect(m, wiring.flipped(self.i_row), rows.w_stream)

        # Count whole tiles in and out so a partial tile is never offered.
        written = Signal(range(self.rows))
        read = Signal(range(self.rows))
        tiles = self.o_tiles
        has_tile = Signal()
        m.d.comb += [
            has_tile.eq(tiles != 0),
            self.o_row.valid.eq(rows.r_rdy & has_tile),
            self.o_row.payload.eq(rows.r_data),
            rows.r_en.eq(self.o_row.ready & has_tile),
        ]
        tile_in = Signal()
        tile_out = Signal()
        with m.If(rows.w_en & rows.w_rdy):
            m.d.sync += written.eq(_wrap_inc(written, self.rows))
            m.d.comb += tile_in.eq(written == self.rows - 1)
        with m.If(self.o_row.valid & self.o_row.ready):
            m.d.sync += read.eq(_wrap_inc(read, self.rows))
            m.d.comb += tile_out.eq(read == self.rows - 1)
        m.d.sync += tiles.eq(tiles + tile_in - tile_out)

        return m


def _wrap_inc(counter, modulus):
    """``counter + 1`` wrapping to 0 at ``modulus``."""
    return Mux(counter == modulus - 1, 0, counter + 1)
