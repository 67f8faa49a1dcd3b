"""The weight mover: UB_TO_WEIGHTS, unified-buffer rows -> one weight tile."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import ub_row_beat
from hdl.config import TPUConfig
from hdl.isa import UbToWeights
from hdl.layouts import weight_row_layout
from hdl.lib.arith import times_constant
from hdl.ports import MemReadSignature, MemWriteSignature, addr_bits

__all__ = ["WeightMover"]


class WeightMover(wiring.Component):
    """Runs UB_TO_WEIGHTS for the front end: reads unified-buffer rows ``ub_addr..`` into a
    tile buffer, as its rows or (``transpose``) its columns, then writes the buffer to the
    weight memory as tile ``tile``, row 0 first.

    Why a tile buffer: a transposed row is one byte of every row of the tile, and the weight
    memory writes whole rows; ``rows x cols`` bytes of flip-flops turn ``count`` buffer rows
    into ``rows`` weight rows in ``count + rows`` cycles (and the read latency), where writing
    the weight memory a byte at a time would take ``rows x count``. The plain form goes
    through the buffer too, so that both forms fill the rest of the tile with zeros the same
    way: the buffer is cleared while the mover is idle.

    Contract: takes an instruction on ``i_move`` only when idle (``ready`` is ``~o_busy``);
    ``o_busy`` is high from the cycle after it takes one (with ``count`` at least 1, which the
    front end's checks ensure) through the cycle its last weight row is accepted, and falls
    in the next, so that a READ_WEIGHTS dispatched once it has fallen reads the new rows (a
    pipelined weight memory lands a write a cycle after accepting it, and the front end
    acts on the fall a cycle later still). Its buffer reads are done by then too. It
    requests the buffer rows in order and writes the weight rows in order.

    Members
    -------
    i_move : In(stream.Signature(UbToWeights))
        The instruction, from the front end as it issues.
    o_ub : Out(MemReadSignature(ub_bits, ub_row))
        Unified-buffer read client (it shares WRITE_HOST's port).
    o_wm : Out(MemWriteSignature(wm_bits, weight_row_layout))
        Weight-memory write client.
    o_busy : Out(1)
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        self.ub_bits = addr_bits(config.ub_depth)
        self.wm_bits = addr_bits(config.weight_mem_tiles * config.rows)
        super().__init__({
            "i_move": In(stream.Signature(UbToWeights)),
            "o_ub":   Out(MemReadSignature(self.ub_bits, ub_row_beat(config.ub_row))),
            "o_wm":   Out(MemWriteSignature(
                self.wm_bits, weight_row_layout(config.cols, config.data_width))),
            "o_busy": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        m = Module()
        cmd = self.i_move
        tile_layout = data.ArrayLayout(data.ArrayLayout(cfg.data_width, cols), rows)
        # The tile being assembled (reset-less: cleared while idle).
        buf = Signal(tile_layout, reset_less=True)
        transpose = Signal()
        signed = Signal()
        ub_addr = Signal(self.ub_bits)
        wm_addr = Signal(self.wm_bits)
        req_left = Signal(range(max(rows, cols) + 1))   # buffer rows still to request
        recv = Signal(range(max(rows, cols) + 1))       # buffer rows received so far
        recv_left = Signal(range(max(rows, cols) + 1))  # buffer rows still to receive
        out_row = Signal(range(rows))                   # the tile row being written
        busy = self.o_busy
        reading = Signal()
        writing = Signal()
        m.d.comb += cmd.ready.eq(~busy)

        # While idle the registers follow the offered instruction every cycle, so that only
        # `busy` and `reading` depend on its `valid` (the front end's dispatch, a long path
        # across the die on the ULX3S when it enabled every one of these registers).
        with m.If(~busy):
            p = cmd.payload
            m.d.sync += [
                buf.eq(0), transpose.eq(p.transpose), signed.eq(p.signed),
                ub_addr.eq(p.ub_addr[:self.ub_bits]),
                wm_addr.eq(times_constant(p.tile, rows)[:self.wm_bits]),
                req_left.eq(p.count), recv_left.eq(p.count), recv.eq(0), out_row.eq(0),
                writing.eq(0),
            ]
            with m.If(cmd.valid):
                m.d.sync += [busy.eq(1), reading.eq(1)]

        # Read: a request a cycle while any is left; each row into the buffer as it arrives.
        m.d.comb += [self.o_ub.addr.valid.eq(reading & (req_left != 0)),
                     self.o_ub.addr.payload.eq(ub_addr),
                     self.o_ub.data.ready.eq(reading)]
        with m.If(self.o_ub.addr.valid & self.o_ub.addr.ready):
            m.d.sync += [ub_addr.eq(ub_addr + 1), req_left.eq(req_left - 1)]
        row = self.o_ub.data.payload
        with m.If(self.o_ub.data.valid & self.o_ub.data.ready):
            for r in range(rows):
                for c in range(cols):
                    # Row `recv` of the buffer takes the row's first `cols` elements; with
                    # transpose, column `recv` takes its first `rows`.
                    with m.If(Mux(transpose, recv == c, recv == r)):
                        m.d.sync += buf[r][c].eq(Mux(transpose, row[r], row[c]))
            m.d.sync += [recv.eq(recv + 1), recv_left.eq(recv_left - 1)]
            with m.If(recv_left == 1):
                m.d.sync += [reading.eq(0), writing.eq(1)]

        # Write: the tile's rows, a row a cycle as the weight memory takes them.
        m.d.comb += [self.o_wm.valid.eq(writing),
                     self.o_wm.payload.addr.eq(wm_addr),
                     self.o_wm.payload.data.data.eq(buf[out_row]),
                     self.o_wm.payload.data.signed.eq(signed)]
        with m.If(self.o_wm.valid & self.o_wm.ready):
            m.d.sync += [wm_addr.eq(wm_addr + 1), out_row.eq(out_row + 1)]
            with m.If(out_row == rows - 1):
                m.d.sync += [writing.eq(0), busy.eq(0)]
        return m
