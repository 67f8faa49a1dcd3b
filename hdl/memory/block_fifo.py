"""A first-in first-out queue in block RAM without read-during-write emulation."""

from amaranth.asserts import Initial
from amaranth.hdl import Assert, Assume, Module, Mux, Signal
from amaranth.lib import fifo, memory

from hdl.memory.row_memory import RegisteredRead

__all__ = ["BlockFIFO"]


class BlockFIFO(fifo.SyncFIFOBuffered):
    """:class:`amaranth.lib.fifo.SyncFIFOBuffered`, the same interface and the same behaviour
    cycle for cycle, with its storage read through
    :class:`~hdl.memory.row_memory.RegisteredRead`
    and marked ``no_rw_check``.

    The queue reads an entry only when it holds one and writes only when it has room, so a
    read never meets a write to its entry. Yosys cannot see that: given the library queue's
    synchronous read port it keeps read-before-write on the iCE40's block RAM with a copy of
    each write and a multiplexer a bit, a cost in cells that small parts cannot spare.
    ``depth`` below 2 is the library's
    register form.
    """

    def elaborate(self, platform):
        if self.depth < 2:
            return super().elaborate(platform)
        m = Module()
        do_write = self.w_rdy & self.w_en
        m.d.comb += [self.w_level.eq(self.level), self.r_level.eq(self.level)]

        # The entries after the output register.
        depth = self.depth - 1
        entries = Signal(range(depth + 1))
        has_entry = Signal()
        m.d.comb += [self.w_rdy.eq(entries != depth), has_entry.eq(entries != 0)]
        do_read = has_entry & (~self.r_rdy | self.r_en)

        m.submodules.storage = storage = memory.Memory(
            shape=self.width, depth=depth, init=[], attrs={"no_rw_check": 1})
        w_port = storage.write_port()
        r_port = RegisteredRead(m, storage, "storage")
        produce = Signal(range(depth))
        consume = Signal(range(depth))

        def increment(pointer):
            return pointer + 1 if depth == 1 << len(pointer) else \
                Mux(pointer == depth - 1, 0, pointer + 1)

        m.d.comb += [
            w_port.addr.eq(produce), w_port.data.eq(self.w_data), w_port.en.eq(do_write),
            r_port.addr.eq(consume), r_port.en.eq(do_read), self.r_data.eq(r_port.data),
            self.level.eq(entries + self.r_rdy),
        ]
        with m.If(do_write):
            m.d.sync += produce.eq(increment(produce))
        with m.If(do_read):
            m.d.sync += [consume.eq(increment(consume)), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        with m.If(do_write & ~do_read):
            m.d.sync += entries.eq(entries + 1)
        with m.If(do_read & ~do_write):
            m.d.sync += entries.eq(entries - 1)

        if platform == "formal":
            # The pointers and the count agree: assumed of the first state, proved of the rest
            # (as the library queue does).
            agree = Signal()
            m.d.comb += agree.eq(
                (produce < depth) & (consume < depth) &
                Mux(produce == consume, (entries == 0) | (entries == depth),
                    Mux(produce > consume, entries == produce - consume,
                        entries == depth + produce - consume)))
            with m.If(Initial()):
                m.d.comb += Assume(agree)
            with m.Else():
                m.d.comb += Assert(agree)
        return m
