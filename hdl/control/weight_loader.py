"""The weight loader: READ_WEIGHTS, weight memory -> weight FIFO."""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.isa import ReadWeights
from hdl.layouts import weight_row_layout
from hdl.lib.arith import times_constant
from hdl.ports import MatrixStatusSignature, MemReadSignature, addr_bits

__all__ = ["WeightLoader"]


class WeightLoader(wiring.Component):
    """Runs READ_WEIGHTS behind later instructions: reads tiles ``tile..tile+count-1`` from
    the weight memory, a row a cycle as the FIFO takes them, into the matrix unit.

    Contract: takes an instruction on ``i_read_weights`` only when the previous one has
    delivered all its rows, and once ready stays ready until it takes one; requests the rows in
    address order and passes the responses on unchanged and in order (each row carries its
    tile's signedness); ``o_busy`` is high from the cycle after it takes an instruction until
    its last row has left; ``o_idle`` also waits until the matrix unit has no tile in flight
    (every queued tile is whole in the shadow registers, or none is queued), which SYNC, HALT
    and the counter instructions need.

    Members
    -------
    i_read_weights : In(stream.Signature(ReadWeights))
        Instructions from the front end.
    o_wm : Out(MemReadSignature(wm_bits, weight_row_layout))
        Weight memory read client.
    o_weight : Out(stream.Signature(weight_row_layout))
        Weight rows to the matrix unit.
    i_matrix : In(MatrixStatusSignature(weight_fifo_depth))
        The matrix unit's status.
    o_busy, o_idle : Out(1)
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        self.wm_bits = addr_bits(config.weight_mem_tiles * config.rows)
        wrow = weight_row_layout(config.cols, config.data_width)
        super().__init__({
            "i_read_weights": In(stream.Signature(ReadWeights)),
            "o_wm":           Out(MemReadSignature(self.wm_bits, wrow)),
            "o_weight":       Out(stream.Signature(wrow)),
            "i_matrix":       In(MatrixStatusSignature(config.weight_fifo_depth)),
            "o_busy":         Out(1),
            "o_idle":         Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        limit = cfg.weight_mem_tiles * cfg.rows + 1
        addr = Signal(self.wm_bits)
        req_left = Signal(range(limit))
        pending = Signal(range(limit))
        # req_left != 0 and pending != 0, kept in registers beside the counts, so that no
        # compare runs through the weight memory's read handshake into the counts.
        requesting = Signal()
        loading = Signal()
        scaling = Signal()      # with scale_tiles_late: the counts are in tiles, this cycle
        idle = ~requesting & ~loading
        cmd = self.i_read_weights
        m.d.comb += [
            cmd.ready.eq(idle),
            self.o_busy.eq(loading),
            self.o_idle.eq(idle & ((self.i_matrix.tiles == 0) | self.i_matrix.shadow_full)),
            self.o_wm.addr.valid.eq(requesting),
            self.o_wm.addr.payload.eq(addr),
        ]
        wiring.connect(m, wiring.flipped(self.o_wm.data), wiring.flipped(self.o_weight))
        with m.If(cmd.valid & cmd.ready):
            some = cmd.payload.count != 0
            if cfg.scale_tiles_late:
                # Tiles now, rows a cycle later (`scaling`; TPUConfig.scale_tiles_late).
                m.d.sync += [addr.eq(cmd.payload.tile), req_left.eq(cmd.payload.count),
                             pending.eq(cmd.payload.count), scaling.eq(some),
                             loading.eq(some)]
            else:
                m.d.sync += [
                    addr.eq(times_constant(cmd.payload.tile, cfg.rows)),
                    req_left.eq(times_constant(cmd.payload.count, cfg.rows)),
                    pending.eq(times_constant(cmd.payload.count, cfg.rows)),
                    requesting.eq(some), loading.eq(some),
                ]
        if cfg.scale_tiles_late:    # (no such cycle otherwise)
            with m.Elif(scaling):
                m.d.sync += [addr.eq(times_constant(addr, cfg.rows)),
                             req_left.eq(times_constant(req_left, cfg.rows)),
                             pending.eq(times_constant(pending, cfg.rows)),
                             requesting.eq(1), scaling.eq(0)]
        with m.Else():
            with m.If(self.o_wm.addr.valid & self.o_wm.addr.ready):
                m.d.sync += [addr.eq(addr + 1), req_left.eq(req_left - 1),
                             requesting.eq(req_left != 1)]
            with m.If(self.o_wm.data.valid & self.o_wm.data.ready):
                m.d.sync += [pending.eq(pending - 1), loading.eq(pending != 1)]
        return m
