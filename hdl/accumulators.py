"""Accumulator memory: where MATMUL output rows are written or summed in place."""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .ports import MemReadSignature
from .unified_buffer import serve_reads

__all__ = ["Accumulators", "psum_write_layout"]


def psum_write_layout(addr_bits: int, cols: int, acc_width: int = 32) -> data.StructLayout:
    return data.StructLayout({
        "addr":       unsigned(addr_bits),
        "accumulate": unsigned(1),
        "data":       data.ArrayLayout(signed(acc_width), cols),
    })


class Accumulators(wiring.Component):
    """``depth`` rows of ``cols`` wrapping ``acc_width``-bit sums.

    Each row on ``i_psum`` either overwrites its row or is added to it (``accumulate``), so
    a reduction longer than the array is summed in place (TPU v1's accumulators). Rows are
    taken one per cycle without back-pressure: a read-modify-write pipeline of two stages,
    with the read port transparent to the write port so back-to-back rows to the same
    address add up correctly.

    Parameters
    ----------
    depth, cols, acc_width : int
        Rows, sums per row, sum width.

    Members
    -------
    i_psum : In(stream.Signature(psum_write_layout))
        Rows to write or add; always ready.
    o_written : Out(1)
        Pulses when a row of ``i_psum`` has been written.
    r : In(MemReadSignature(addr_bits, ArrayLayout(signed(acc_width), cols)))
        The read client (the activation unit): requests on ``r.addr``, responses on
        ``r.data``, in order.
    """

    def __init__(self, *, depth: int, cols: int, acc_width: int = 32):
        self.depth = depth
        self.cols = cols
        self.acc_width = acc_width
        self.addr_bits = max(1, (depth - 1).bit_length())
        row = data.ArrayLayout(signed(acc_width), cols)
        super().__init__({
            "i_psum":    In(stream.Signature(psum_write_layout(self.addr_bits, cols,
                                                               acc_width))),
            "o_written": Out(1),
            "r":         In(MemReadSignature(self.addr_bits, row)),
        })

    def elaborate(self, platform):
        m = Module()
        row = data.ArrayLayout(signed(self.acc_width), self.cols)
        m.submodules.mem = mem = memory.Memory(shape=row, depth=self.depth, init=[])
        wr = mem.write_port()
        rmw = mem.read_port(transparent_for=(wr,))
        rd = mem.read_port()

        # Stage A: take the row, read the old sums.
        m.d.comb += [
            self.i_psum.ready.eq(1),
            rmw.addr.eq(self.i_psum.payload.addr),
            rmw.en.eq(1),
        ]
        valid_b = Signal()
        write_b = Signal.like(self.i_psum.payload)
        m.d.sync += [valid_b.eq(self.i_psum.valid), write_b.eq(self.i_psum.payload)]

        # Stage B: add (or not) and write.
        m.d.comb += [
            wr.en.eq(valid_b),
            wr.addr.eq(write_b.addr),
            self.o_written.eq(valid_b),
        ]
        for c in range(self.cols):
            m.d.comb += wr.data[c].eq(Mux(write_b.accumulate, rmw.data[c], 0) + write_b.data[c])

        serve_reads(m, rd, [self.r.addr], [self.r.data])
        return m
