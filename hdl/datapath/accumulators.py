"""Accumulator memory: where MATMUL output rows are written or summed in place."""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.layouts import psum_write_layout
from hdl.lib.registers import register_copies
from hdl.memory.block_ram import PipelinedMemory
from hdl.memory.row_memory import RegisteredRead, serve_reads
from hdl.ports import MemReadSignature, MemWriteSignature

__all__ = ["Accumulators"]


class Accumulators(wiring.Component):
    """``depth`` rows of ``cols`` wrapping ``acc_width``-bit sums.

    Each row on ``i_psum`` either overwrites its row or is added to it (``accumulate``), so
    a reduction longer than the array is summed in place (TPU v1's accumulators). Rows are
    taken one per cycle without back-pressure: a read-modify-write pipeline of two stages.
    A row taken in cycle ``c`` is written in cycle ``c + 1`` (``o_written`` high then). The
    read port is not transparent to the write port (a bypass costs a multiplexer per bit on
    small parts): the client must not send a row that accumulates into the address of the
    row it sent in the cycle before (:class:`~hdl.control.matrix_engine.MatrixEngine` leaves
    a cycle between them), and a read of ``r`` in the cycle its row is written returns an
    undefined row on a part (the block RAM is told it may: the core's hazard rules never let
    an ACTIVATE read rows a MATMUL writes).

    With ``registered`` the sums live in a :class:`~hdl.memory.block_ram.PipelinedMemory`:
    the old sums leave the block RAM through its output register and then a fabric register,
    so the adder starts at a flip-flop next to it instead of at the RAM's slow output, and
    the sums it makes are written from flip-flops, so it ends at one instead of at the RAM's
    inputs across the die (the fast pipeline): five stages, a row taken in cycle ``c`` is
    written in cycle ``c + 4``. The four rows right behind it read their old sums before that
    write (the fourth in the cycle it is written, which returns an undefined row), so one
    that goes to the same address adds to the newest of those sums instead (registers of the
    last four sums made): back-to-back rows to one address add up. The read client's rows
    arrive two cycles after their addresses.

    Parameters
    ----------
    depth, cols, acc_width : int
        Rows, sums per row, sum width.
    registered : bool
        The five-stage pipeline above (three more cycles from a row to ``o_written``, one
        more to a read's row, rows to one address back to back).
    sum_tables : bool
        MATMUL_LOOKUP's two sum tables (:class:`hdl.isa.MatmulLookup`): a memory of 512
        int32 entries per column (table bit, then the sum's low byte), read in stage A
        beside the old sums, so that a row with ``lookup`` takes the entries instead of its
        sums at no extra cycle. Written on ``i_table``, an entry a cycle into every column.

    Members
    -------
    i_psum : In(stream.Signature(psum_write_layout))
        Rows to write or add; always ready.
    o_written : Out(1)
        Pulses when a row of ``i_psum`` has been written.
    r : In(MemReadSignature(addr_bits, ArrayLayout(signed(acc_width), cols)))
        The read client (the activation unit): requests on ``r.addr``, responses on
        ``r.data``, in order.
    i_table : In(MemWriteSignature(9, signed(acc_width)))
        With ``sum_tables``: entry writes (address ``table * 256 + entry``), ready once the
        scrub below is over. The client must not write while a ``lookup`` row is in the
        pipeline (the front end waits until the core is idle).
    o_sums_scrubbing : Out(1)
        With ``sum_tables``: after a reset the tables are zeroed, an entry of both a cycle
        (512 cycles), while this is high; no ``lookup`` row may arrive meanwhile (the front
        end holds MATMUL_LOOKUP and LOAD_TABLE of a sum table until it falls). The other
        rows and reads go on.
    """

    def __init__(self, *, depth: int, cols: int, acc_width: int = 32,
                 registered: bool = False, sum_tables: bool = False):
        self.depth = depth
        self.registered = registered
        self.sum_tables = sum_tables
        self.cols = cols
        self.acc_width = acc_width
        self.addr_bits = max(1, (depth - 1).bit_length())
        row = data.ArrayLayout(signed(acc_width), cols)
        super().__init__({
            "i_psum":    In(stream.Signature(psum_write_layout(self.addr_bits, cols,
                                                               acc_width, sum_tables))),
            "o_written": Out(1),
            "r":         In(MemReadSignature(self.addr_bits, row)),
            **({"i_table": In(MemWriteSignature(9, signed(acc_width))),
                "o_sums_scrubbing": Out(1)} if sum_tables else {}),
        })

    def elaborate(self, platform):
        m = Module()
        row = data.ArrayLayout(signed(self.acc_width), self.cols)
        if self.registered:
            m.submodules.mem = mem = PipelinedMemory(shape=row, depth=self.depth, readers=2)
            wr, rmw, rd = mem.w, mem.r[0], mem.r[1]
        else:
            # No read meets a write to its own row in a cycle where its data is used (the
            # client's rule above; the hazard rules keep ACTIVATE's reads off the rows a
            # MATMUL writes), so the block RAM may return anything then (``no_rw_check``).
            # (RegisteredRead: no read-before-write registers for the block RAM to emulate.)
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
        # Data registers are not reset: their valid bits say whether they hold a row (and a
        # reset routed into their inputs puts the reset net through a LUT).
        write_b = Signal.like(self.i_psum.payload, reset_less=True)
        m.d.sync += [valid_b.eq(self.i_psum.valid), write_b.eq(self.i_psum.payload)]
        # The row's addends in stage B: its sums, or with `lookup` the sum tables' entries,
        # read in stage A beside the old sums (a memory a column: every column looks up in
        # the same cycle).
        addend_b = write_b.data
        if self.sum_tables:
            # After a reset, zeros into every entry (the tables are no reset registers), in
            # the background: only lookups and table loads wait for it.
            scrubbing = Signal(init=1)
            scrub_addr = Signal(9)
            with m.If(scrubbing):
                m.d.sync += scrub_addr.eq(scrub_addr + 1)
                with m.If(scrub_addr == 511):
                    m.d.sync += scrubbing.eq(0)
            m.d.comb += [self.i_table.ready.eq(~scrubbing),
                         self.o_sums_scrubbing.eq(scrubbing)]
            looked_up = Signal(row)
            for c in range(self.cols):
                table = memory.Memory(shape=signed(self.acc_width), depth=512, init=[])
                m.submodules[f"sum_table{c}"] = table
                w = table.write_port()
                r = table.read_port()
                m.d.comb += [
                    w.en.eq(scrubbing | self.i_table.valid),
                    w.addr.eq(Mux(scrubbing, scrub_addr, self.i_table.payload.addr)),
                    w.data.eq(Mux(scrubbing, 0, self.i_table.payload.data)),
                    r.addr.eq(Cat(self.i_psum.payload.data[c][:8],
                                  self.i_psum.payload.table)),
                    looked_up[c].eq(r.data),
                ]
            addend_b = Mux(write_b.lookup, looked_up, write_b.data)

        if not self.registered:
            # Stage B: add (or not) and write.
            m.d.comb += [
                wr.en.eq(valid_b),
                wr.addr.eq(write_b.addr),
                self.o_written.eq(valid_b),
            ]
            addend = data.View(row, addend_b)
            for c in range(self.cols):
                m.d.comb += wr.data[c].eq(Mux(write_b.accumulate, rmw.data[c], 0) +
                                          addend[c])
        else:
            # Stage B: the block RAM's output register takes the old sums. Stage C: a fabric
            # register next to the adders takes them (the route from the block RAM's register
            # would otherwise come before a 32-bit carry chain).
            # Stage D: add (or not) into flip-flops. Stage E: write them. The old sums miss
            # the four sums made in the four cycles before stage D: written in the cycle the
            # row read them (stage A: that read returns an undefined row when the write is to
            # its address) and in the three after. A row whose address one of them went to
            # takes the newest such sums instead: those of the row right ahead (made in the
            # cycle before) straight into the adder, the older three chosen in stage C into a
            # register. Which it takes is decided in stage B (from compares made in stage A,
            # against the rows then in stages B-E), into flip-flops a column: no address
            # compare runs into the adders.
            valid_c, valid_d = Signal(), Signal()
            write_c = Signal.like(self.i_psum.payload, reset_less=True)
            write_d = Signal.like(self.i_psum.payload, reset_less=True)
            old_c = Signal(row, reset_less=True)                        # stage C: old sums
            forward_d = Signal(row, reset_less=True)                   # stage D: older sums
            sums = [Signal(row, name=f"sums_{i}", reset_less=True)         # made 1-3 cycles ago
                    for i in range(1, 4)]
            valid_e = Signal()
            addr_e = Signal.like(write_c.addr, reset_less=True)
            addr_a = self.i_psum.payload.addr
            # hits[i]: the row in stage A goes to the address of the row i + 1 ahead of it.
            hits = [Signal(name=f"hit_{i}") for i in range(4)]
            m.d.sync += [hits[0].eq(valid_b & (write_b.addr == addr_a)),
                         hits[1].eq(valid_c & (write_c.addr == addr_a)),
                         hits[2].eq(valid_d & (write_d.addr == addr_a)),
                         hits[3].eq(valid_e & (addr_e == addr_a))]
            m.d.sync += [valid_c.eq(valid_b), write_c.eq(write_b), old_c.eq(rmw.data),
                         *([write_c.data.eq(addend_b)] if self.sum_tables else []),
                         valid_d.eq(valid_c), write_d.eq(write_c),
                         valid_e.eq(valid_d), addr_e.eq(write_d.addr),
                         sums[1].eq(sums[0]), sums[2].eq(sums[1])]
            # The selects, a copy per column (register_copies: one register driving all the
            # columns' multiplexers is a long route): in stage C
            # which older sums to keep (of the rows 2-4 ahead, the newest), in stage D which
            # addend to take. (`accumulate_b`: a row in stage B that accumulates; a reset
            # register, so that no copy starts undefined in a Verilog simulation, where it
            # would stay.)
            accumulate_b = Signal()
            m.d.sync += accumulate_b.eq(self.i_psum.valid & self.i_psum.payload.accumulate)
            older = hits[1] | hits[2] | hits[3]
            select = Cat(accumulate_b & ~(hits[0] | older),     # the old sums
                         accumulate_b & hits[0],                # the row right ahead's
                         accumulate_b & ~hits[0] & older,       # the older ones kept
                         hits[1], ~hits[1] & hits[2], ~hits[1] & ~hits[2])
            use_layout = data.StructLayout({"old": 1, "ahead": 1, "older": 1, "keep": 3})
            for c, copy in enumerate(register_copies(m, select, self.cols, "use_sums")):
                use_c = data.View(use_layout, copy)
                # Stage D's selects: registers of the column's stage-C copy (each its own).
                use_d = Signal(use_layout, name=f"use_d{c}")
                m.d.sync += use_d.eq(use_c)
                keep = use_c.keep
                m.d.sync += forward_d[c].eq(Mux(keep[0], sums[0][c], 0) |
                                            Mux(keep[1], sums[1][c], 0) |
                                            Mux(keep[2], sums[2][c], 0))
                addend = (Mux(use_d.old, old_c[c], 0) | Mux(use_d.ahead, sums[0][c], 0) |
                          Mux(use_d.older, forward_d[c], 0)).as_signed()
                m.d.sync += sums[0][c].eq(addend + write_d.data[c])
            # Stage E: the sums made in the cycle before, with their row's address.
            m.d.comb += [
                wr.en.eq(valid_e),
                wr.addr.eq(addr_e),
                wr.data.eq(sums[0]),
                self.o_written.eq(valid_e),
            ]

        serve_reads(m, rd, [self.r.addr], [self.r.data],
                    latency=2 if self.registered else 1)
        return m
