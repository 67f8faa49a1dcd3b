"""Accumulator memory: where MATMUL output rows are written or summed in place."""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .block_ram import PipelinedMemory
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
    MATMUL writes). With the bypass, that read returns the old row; with ``registered_read``
    it is undefined again.

    With ``registered_read`` the sums live in a :class:`~hdl.block_ram.PipelinedMemory`: the
    old sums leave the block RAM through its output register, so the adder starts at a
    flip-flop instead of at the RAM's slow output (the ECP5 build): three stages, a row taken
    in cycle ``c`` is written in cycle ``c + 2``. The two rows right behind it read their old
    sums before that write (the next one in the cycle it is written, which returns an
    undefined row), so one that goes to the same address adds to the value written (a
    register of each of the last two writes) instead. The read client's rows arrive two
    cycles after their addresses.

    Parameters
    ----------
    depth, cols, acc_width : int
        Rows, sums per row, sum width.
    registered_read : bool
        The three-stage pipeline above (one more cycle from a row to ``o_written``, and to a
        read's row); needs ``bypass``.
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
        if self.registered_read:
            m.submodules.mem = mem = PipelinedMemory(shape=row, depth=self.depth, readers=2)
            wr, rmw, rd = mem.w, mem.r[0], mem.r[1]
        elif self.bypass:
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
            # Stage B: the block RAM's output register takes the old sums. Stage C: add (or
            # not) and write. The old sums miss two writes: the one in the cycle the row read
            # them (stage A: that read returns an undefined row when the write is to its
            # address) and the one in the cycle after (stage B); a row whose address either
            # wrote takes the sums it wrote instead, the later one if both. Which it adds to is
            # decided in stage B, against those two writes, into three flip-flops: no address
            # compare runs into the adders.
            valid_w = Signal()
            write_w = Signal.like(self.i_psum.payload)
            old_q = rmw.data
            last = Signal(row)      # the sums written in the cycle before
            last2 = Signal(row)     # ... two cycles before
            valid_2 = Signal()      # stage C's row of the cycle before, its address
            addr_2 = Signal.like(write_w.addr)
            use_old = Signal()      # stage C adds to the sums read
            use_last = Signal()     # ... to those written in the cycle before
            use_last2 = Signal()    # ... two cycles before
            forward = valid_w & (write_w.addr == write_b.addr)
            forward2 = valid_2 & (addr_2 == write_b.addr)
            m.d.sync += [valid_w.eq(valid_b), write_w.eq(write_b),
                         last.eq(wr.data), last2.eq(last),
                         valid_2.eq(valid_w), addr_2.eq(write_w.addr),
                         use_old.eq(write_b.accumulate & ~forward & ~forward2),
                         use_last.eq(write_b.accumulate & forward),
                         use_last2.eq(write_b.accumulate & ~forward & forward2)]
        m.d.comb += [
            wr.en.eq(valid_w),
            wr.addr.eq(write_w.addr),
            self.o_written.eq(valid_w),
        ]
        for c in range(self.cols):
            if not self.registered_read:
                addend = Mux(write_w.accumulate, old[c], 0)
            else:
                addend = (Mux(use_old, old_q[c], 0) | Mux(use_last, last[c], 0) |
                          Mux(use_last2, last2[c], 0)).as_signed()
            m.d.comb += wr.data[c].eq(addend + write_w.data[c])

        serve_reads(m, rd, [self.r.addr], [self.r.data],
                    latency=2 if self.registered_read else 1)
        return m
