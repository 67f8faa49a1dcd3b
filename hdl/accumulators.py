"""Accumulator memory: where MATMUL output rows are written or summed in place."""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .ports import MemReadSignature
from .unified_buffer import RegisteredRead, serve_reads

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
    taken one per cycle without back-pressure: a read-modify-write pipeline of two stages.
    A row taken in cycle ``c`` is written in cycle ``c + 1`` (``o_written`` high then). With
    ``bypass`` the read port is transparent to the write port, so back-to-back rows to the
    same address add up correctly; without it (no read-during-write bypass: 144 logic cells
    fewer on a 4x4 iCE40 core) the client must not send a row that accumulates into the
    address of the row it sent in the cycle before
    (:class:`~hdl.control.matrix_engine.MatrixEngine` leaves a cycle between them),
    and a read of ``r`` in the cycle its row is written returns an undefined row on a part
    (the block RAM is told it may: the core's hazard rules never let an ACTIVATE read rows a
    MATMUL writes). With the bypass, that read returns the old row.

    With ``registered_read`` the old sums are registered as they leave the block RAM, so the
    adder starts at a flip-flop instead of at the RAM's slow output (the ECP5 build's
    critical path): three stages, a row taken in cycle ``c`` is written in cycle ``c + 2``.
    The row right behind it read its old sums before that write, so when it goes to the same
    address it adds to the value just written (a register of the last write) instead.

    Parameters
    ----------
    depth, cols, acc_width : int
        Rows, sums per row, sum width.
    registered_read : bool
        The three-stage pipeline above (one more cycle from a row to ``o_written``); needs
        ``bypass``.
    bypass : bool
        Back-to-back rows to one address add up (see above).

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

    def __init__(self, *, depth: int, cols: int, acc_width: int = 32,
                 registered_read: bool = False, bypass: bool = True):
        if registered_read and not bypass:
            raise ValueError("Accumulators registered_read=True needs bypass=True (the row "
                             "two behind a write reads through it)")
        self.bypass = bypass
        self.depth = depth
        self.registered_read = registered_read
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
        if self.bypass:
            m.submodules.mem = mem = memory.Memory(shape=row, depth=self.depth, init=[])
            wr = mem.write_port()
            rmw = mem.read_port(transparent_for=(wr,))
            rd = mem.read_port()
        else:
            # No read meets a write to its own row in a cycle where its data is used (the
            # client's rule above; the hazard rules keep ACTIVATE's reads off the rows a
            # MATMUL writes), so the block RAM may return anything then (``no_rw_check``).
            # (RegisteredRead: some 400 flip-flops fewer for 4 columns on the iCE40.)
            m.submodules.mem = mem = memory.Memory(shape=row, depth=self.depth, init=[],
                                                   attrs={"no_rw_check": 1})
            wr = mem.write_port()
            rmw, rd = RegisteredRead(m, mem, "rmw"), RegisteredRead(m, mem, "rd")

        # Stage A: take the row, read the old sums.
        m.d.comb += [
            self.i_psum.ready.eq(1),
            rmw.addr.eq(self.i_psum.payload.addr),
            rmw.en.eq(1),
        ]
        valid_b = Signal()
        write_b = Signal.like(self.i_psum.payload)
        m.d.sync += [valid_b.eq(self.i_psum.valid), write_b.eq(self.i_psum.payload)]

        if not self.registered_read:
            # Stage B: add (or not) and write.
            valid_w, write_w, old = valid_b, write_b, rmw.data
        else:
            # Stage B: register the old sums. Stage C: add (or not) and write; a row whose
            # address the previous cycle wrote takes that write's sums, which its read (one
            # cycle before that write) did not see. Which of the two it adds to is decided in
            # stage B, against the write in progress then, into two flip-flops: no address
            # compare runs into the adders.
            valid_w = Signal()
            write_w = Signal.like(self.i_psum.payload)
            old_q = Signal(row)
            last = Signal(row)
            use_old = Signal()      # stage C adds to the sums read
            use_last = Signal()     # ... to those written in the cycle before
            forward = valid_w & (write_w.addr == write_b.addr)
            m.d.sync += [valid_w.eq(valid_b), write_w.eq(write_b), old_q.eq(rmw.data),
                         last.eq(wr.data),
                         use_old.eq(write_b.accumulate & ~forward),
                         use_last.eq(write_b.accumulate & forward)]
        m.d.comb += [
            wr.en.eq(valid_w),
            wr.addr.eq(write_w.addr),
            self.o_written.eq(valid_w),
        ]
        for c in range(self.cols):
            if not self.registered_read:
                addend = Mux(write_w.accumulate, old[c], 0)
            else:
                addend = (Mux(use_old, old_q[c], 0) | Mux(use_last, last[c], 0)).as_signed()
            m.d.comb += wr.data[c].eq(addend + write_w.data[c])

        serve_reads(m, rd, [self.r.addr], [self.r.data])
        return m
