"""FIFO of whole weight tiles between the weight source and the systolic array."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.layouts import weight_row_layout
from hdl.memory.block_fifo import BlockFIFO

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
    registered : bool
        ``o_row`` comes from a ring of two row registers behind the queue (the queue's
        capacity two rows less), so that ``o_row.ready`` moves only the ring's pointers and
        count, and the queue is read on the ring's registered room: the ready of the
        systolic array's weight shift, which depends on the activation stream in the same
        cycle, would run into the queue's read logic and the enables of its output
        register. Same contract, a row a cycle later from the queue to ``o_row``.

    Members
    -------
    i_row : In(stream.Signature(weight_row_layout))
        Rows of incoming tiles.
    o_row : Out(stream.Signature(weight_row_layout))
        Rows of whole tiles, oldest first.
    o_tiles : Out(range(depth + 1))
        Whole tiles stored (including one being read out).
    """

    #: Rows the ring behind the queue holds (``registered``).
    RING = 2

    def __init__(self, *, rows: int, cols: int, data_width: int = 8, depth: int = 4,
                 registered: bool = False):
        if rows < 1 or cols < 1 or depth < 1:
            raise ValueError(f"WeightFIFO needs rows, cols and depth >= 1, "
                             f"not rows={rows}, cols={cols}, depth={depth}")
        if registered and rows * depth <= self.RING:
            raise ValueError(f"WeightFIFO registered=True needs more than {self.RING} rows "
                             f"of storage, not rows={rows} x depth={depth}")
        self.registered = registered
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

        width = len(self.i_row.payload.as_value())
        ring = self.RING if self.registered else 0
        m.submodules.rows = rows = BlockFIFO(width=width, depth=self.rows * self.depth - ring)
        wiring.connect(m, wiring.flipped(self.i_row), rows.w_stream)

        # Count whole tiles in and out so a partial tile is never offered: `tiles` until a
        # tile's last row leaves o_row, `readable` until it leaves the queue (the same count
        # without the ring).
        tiles = self.o_tiles
        tile_in = _count_rows(m, rows.w_en & rows.w_rdy, self.rows, "written")
        out_take = self.o_row.valid & self.o_row.ready
        tile_out = _count_rows(m, out_take, self.rows, "read")
        m.d.sync += tiles.eq(tiles + tile_in - tile_out)
        if not ring:
            has_tile = tiles != 0
            m.d.comb += [
                self.o_row.valid.eq(rows.r_rdy & has_tile),
                self.o_row.payload.eq(rows.r_data),
                rows.r_en.eq(self.o_row.ready & has_tile),
            ]
            return m

        readable = Signal(range(self.depth + 1))
        count = Signal(range(ring + 1))         # rows in the ring
        head = Signal(range(ring))              # the ring's entry o_row shows
        tail = Signal(range(ring))              # the entry the next row goes to
        entries = [Signal(width, name=f"ring{i}", reset_less=True) for i in range(ring)]
        push = Signal()
        m.d.comb += [
            rows.r_en.eq((count != ring) & (readable != 0)),
            push.eq(rows.r_en & rows.r_rdy),
            self.o_row.valid.eq(count != 0),
            self.o_row.payload.eq(Mux(head, entries[1], entries[0])),
        ]
        tile_pulled = _count_rows(m, push, self.rows, "pulled")
        m.d.sync += [readable.eq(readable + tile_in - tile_pulled),
                     count.eq(count + push - out_take)]
        with m.If(push):
            m.d.sync += tail.eq(~tail)
            for i, entry in enumerate(entries):
                with m.If(tail == i):
                    m.d.sync += entry.eq(rows.r_data)
        with m.If(out_take):
            m.d.sync += head.eq(~head)
        return m


def _count_rows(m, take, rows: int, name: str):
    """A row counter modulo *rows* that counts *take*; returns the signal that is high when
    the row taken is a tile's last."""
    counter = Signal(range(rows), name=name)
    last = Signal(name=f"{name}_last")
    with m.If(take):
        m.d.sync += counter.eq(_wrap_inc(counter, rows))
        m.d.comb += last.eq(counter == rows - 1)
    return last


def _wrap_inc(counter, modulus):
    """``counter + 1`` wrapping to 0 at ``modulus``."""
    return Mux(counter == modulus - 1, 0, counter + 1)
