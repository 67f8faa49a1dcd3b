"""The host writer: WRITE_HOST, and the one place beats leave for the host."""

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import ub_row_beat
from hdl.config import TPUConfig
from hdl.isa import WriteHost
from hdl.ports import MemReadSignature, addr_bits

__all__ = ["HostWriter"]


class HostWriter(wiring.Component):
    """Runs WRITE_HOST behind later instructions and owns the output stream.

    Contract: takes a WRITE_HOST on ``i_write_host`` while idle (once ready, it stays ready
    until it takes one); reads buffer rows
    ``ub_addr..`` in order as the host takes them and sends each as one beat (the row in the
    low bits); ``o_busy`` is high from the cycle after it takes an instruction until its last
    beat has been taken. A beat on ``i_beat`` (the front end's counters, DONE and error
    beats) goes out before any row; the front end offers one only while no WRITE_HOST
    runs, so the host sees beats in program order. ``count`` is at most ``ub_depth`` (the
    front end's range check): the writer keeps counts that wide.

    Members
    -------
    i_write_host : In(stream.Signature(WriteHost))
        Instructions from the front end.
    o_ub : Out(MemReadSignature(ub_bits, ub_row))
        Unified-buffer read client.
    i_beat : In(stream.Signature(unsigned(host_width)))
        Beats from the front end.
    o_host : Out(stream.Signature(unsigned(host_width)))
        The core's output stream.
    o_busy : Out(1)
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        self.ub_bits = addr_bits(cfg.ub_depth)
        ub_row = ub_row_beat(cfg.ub_row)
        host = stream.Signature(unsigned(cfg.host_width))
        super().__init__({
            "i_write_host": In(stream.Signature(WriteHost)),
            "o_ub":         Out(MemReadSignature(self.ub_bits, ub_row)),
            "i_beat":       In(host),
            "o_host":       Out(host),
            "o_busy":       Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        busy = Signal()
        addr = Signal(self.ub_bits)
        req_left = Signal(range(self.config.ub_depth + 1))
        resp_left = Signal(range(self.config.ub_depth + 1))
        cmd = self.i_write_host
        m.d.comb += [
            cmd.ready.eq(~busy),
            self.o_busy.eq(busy),
            self.o_ub.addr.valid.eq(req_left != 0),
            self.o_ub.addr.payload.eq(addr),
        ]
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += [busy.eq(1), addr.eq(cmd.payload.ub_addr),
                         req_left.eq(cmd.payload.count), resp_left.eq(cmd.payload.count)]
        with m.If(self.o_ub.addr.valid & self.o_ub.addr.ready):
            m.d.sync += [addr.eq(addr + 1), req_left.eq(req_left - 1)]

        beat = self.i_beat
        if self.config.pipeline == "fast":
            # The front end's beats wait in a two-entry FIFO (registered
            # ready and valid), so that its state machine's beat does not run through the
            # choice below into the unified buffer's read handshake, nor that handshake back
            # into the front end. The front end offers beats only while no WRITE_HOST runs,
            # and a waiting beat still goes before any row.
            m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=len(beat.payload),
                                                               depth=2)
            m.d.comb += [beats.w_data.eq(beat.payload), beats.w_en.eq(beat.valid),
                         beat.ready.eq(beats.w_rdy)]
            beat = stream.Signature(unsigned(len(beat.payload))).create()
            m.d.comb += [beat.payload.eq(beats.r_data), beat.valid.eq(beats.r_rdy),
                         beats.r_en.eq(beat.ready)]
        with m.If(beat.valid):
            m.d.comb += [
                self.o_host.valid.eq(1),
                self.o_host.payload.eq(beat.payload),
                beat.ready.eq(self.o_host.ready),
            ]
        with m.Else():
            m.d.comb += [
                self.o_host.valid.eq(self.o_ub.data.valid),
                self.o_host.payload.eq(self.o_ub.data.payload.as_value()),
                self.o_ub.data.ready.eq(self.o_host.ready),
            ]
        with m.If(self.o_ub.data.valid & self.o_ub.data.ready):
            m.d.sync += resp_left.eq(resp_left - 1)
            with m.If(resp_left == 1):
                m.d.sync += busy.eq(0)
        return m
