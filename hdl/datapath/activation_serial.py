"""Activation unit for small parts: one requantisation datapath time-shared over the columns."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.datapath.activation_table import lut_table
from hdl.isa import RECIPROCAL_BITS, TABLE_ENTRIES, Func, Rounding, reciprocal
from hdl.layouts import acc_row_layout
from hdl.ports import ColumnWord, MemWriteSignature, ParamColumnSignature

__all__ = ["SerialActivationUnit", "element_cycles"]


def element_cycles(shift: int) -> int:
    """Cycles :class:`SerialActivationUnit` spends on one element with rounding ``shift``."""
    return 2 + 32 + max(shift - 1, 0) + 3


class SerialActivationUnit(wiring.Component):
    """The :class:`~hdl.datapath.activation.ActivationUnit`'s function, bit for bit, from one
    datapath
    that works through a row's columns one after another, for parts whose logic or DSP blocks
    the parallel unit would exhaust (the iCE40UP5K: the parallel unit's 32 x 32 multipliers,
    64-bit rounding shifters and saturations per column take more than the whole part).

    Each element takes :func:`element_cycles` cycles (with the column's shift): one to read
    the column's bias, one to add it, 32 for a shift-and-add signed multiply (one 33-bit
    adder; the column's shift word is read meanwhile), ``shift - 1`` for the arithmetic right
    shift (a bit a cycle: a shifter by 8 as well is a large share of a small part's logic;
    the bits shifted out are gathered into the flags the rounding modes need, as
    :mod:`hdl.datapath.rounding` computes them), one for rounding, saturation and the zero
    point, one for the function (and the table's address), one for the table read and
    pooling. A row of
    ``cols`` elements therefore takes ``cols`` times that (37 to 99 cycles an element),
    against one row a cycle for the parallel unit. With ``row_scale``, a NORMALISE row takes
    two cycles more before its first element (its divisor's reciprocal, from a table), and
    its elements shift by ``min(63, shift + e)``.

    The row is read from ``i_row`` while it waits (a stream's payload holds until it is
    taken) and taken when its last element is done, so the unit holds no copy of it. The
    parameters are read the same way, one word at a time from the activation engine's
    parameter store (``params``): the column's multiplier is selected the cycle before the
    element starts, its bias the cycle after, so the unit holds no parameter row either.

    Members
    -------
    i_row : In(stream.Signature(acc_row_layout))
        Sums, with ``last`` on the final row of each pooling window.
    o_row : Out(stream.Signature(ArrayLayout(signed(8), cols)))
        Activations, one row per pooling window.
    params : Out(ParamColumnSignature(cols))
        The requantisation parameters, a column's word at a time, and the function (held
        while a row is in flight).
    i_table : In(MemWriteSignature(8, unsigned(8)))
        With ``table``: an entry of the programmable table (function TABLE), which shares the
        fixed tables' memory (always ready; written a cycle later, from registers).
    o_busy : Out(1)
        A row is being worked on.
    """

    def __init__(self, *, cols: int, acc_width: int = 32, table: bool = False,
                 row_scale: bool = False):
        if acc_width != 32:
            raise ValueError(f"acc_width={acc_width} is not supported; allowed: 32")
        self.cols = cols
        self.acc_width = acc_width
        self.table = table
        self.row_scale = row_scale
        super().__init__({
            "i_row":    In(stream.Signature(acc_row_layout(cols, acc_width))),
            "o_row":    Out(stream.Signature(data.ArrayLayout(signed(8), cols))),
            "params":   Out(ParamColumnSignature(cols)),
            **({"i_table": In(MemWriteSignature(8, unsigned(8)))} if table else {}),
            "o_busy":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cols = self.cols
        params = self.params
        row = self.i_row.payload

        col = Signal(range(cols))
        hi = Signal(signed(32))            # the product's upper half while multiplying
        lo = Signal(32)                    # multiplier bits out, product bits in
        mcand = Signal(signed(32))
        step = Signal(range(32))
        left = Signal(6)                   # right shifts still to do
        shift = Signal(6)                  # the column's shift
        dropped = Signal(6)                # bits shifted out so far
        sticky = Signal()                  # any of them set
        any_hi = Signal()                  # any of those from bit 30 on set
        all_hi = Signal()                  # all of those from bit 30 on set
        n = Signal()                       # the product < -2**30
        f = Signal(signed(8))
        pooled = Signal(data.ArrayLayout(signed(8), cols))
        window_open = Signal()

        product = Cat(lo, hi).as_signed()  # 64 bits

        # The column's multiplier is read in the cycle before LOAD, its bias in LOAD; the sum
        # and its bias are added in BIAS.
        t = Signal(signed(32))
        m.d.comb += [t.eq(row.data[col] + params.word), params.col.eq(col)]

        # One multiply step: add (or, for the multiplier's sign bit, subtract) the
        # multiplicand into the upper half, then shift the 64-bit pair right by one. One
        # adder: subtracting is adding the complement and a carry in.
        sub = Signal()
        addend = Signal(signed(32))
        total = Signal(signed(33))
        m.d.comb += [
            sub.eq(step == 31),
            addend.eq(Mux(lo[0], mcand, 0) ^ sub.replicate(32).as_signed()),
            total.eq(hi + addend + sub),
        ]

        # Rounding, saturation, zero point: with x = p >>> shift and the rounding increment
        # rb (hdl.datapath.rounding's carry: from b = p[shift - 1], the sticky flags and x's
        # low bit; 0 for shift 0), saturate_int8(saturate_int32(x + rb) + zero_point) equals
        # saturate_int8(x + rb + zero_point) (the zero point is an int8): exact from x's low
        # 10 bits when x fits them, else x's sign decides. After SHIFT the product holds
        # p >>> (shift - 1): x is its upper 63 bits and b its bit 0; for shift 0, x is all
        # of it. Bit tests, where 64- and 33-bit adds and compares took carry chains.
        shift0 = Signal()
        m.d.comb += shift0.eq(shift == 0)
        b = product[0]
        two_step = (params.rounding == Rounding.DOUBLE) & shift[5]
        carry = Mux(two_step, Mux(n, b & any_hi, b | all_hi),
                    Mux(params.rounding == Rounding.HALF_EVEN, b & (sticky | product[1]), b))

        def same(bits):
            return bits.all() | ~bits.any()

        x_low = Signal(signed(10))
        rb = Signal()
        small = Signal()            # x fits 10 bits
        v = Signal(signed(12))      # x + rb + zero point, when small
        m.d.comb += [
            x_low.eq(Mux(shift0, product[:10], product[1:11])),
            rb.eq(~shift0 & carry),
            small.eq(Mux(shift0, same(product[9:]), same(product[10:]))),
            v.eq(x_low + rb + params.zero_point),
        ]
        negative = Mux(small, v[11], product[63])
        q_next = Signal(signed(8))
        m.d.comb += q_next.eq(Mux(small & same(v[7:]), v[:8].as_signed(),
                                  Mux(negative, -128, 127)))
        # The requantised value, registered: the function's compares and the table's address
        # start from it (the rounding add, saturation, two compares and the table address in
        # one cycle would set a small part's clock).
        q = Signal(signed(8))
        zp = params.zero_point
        relu = Mux(q > zp, q, zp)
        clamp = Mux(relu > params.clamp_hi, params.clamp_hi, relu)
        f_next = Mux(params.func == Func.RELU, relu,
                     Mux(params.func == Func.CLAMP, clamp, q))

        # The table functions: SIGMOID at 0..255, TANH at 256..511, index q + 128; with
        # ``table``, the programmable table (TABLE) at 512..767, written by LOAD_TABLE.
        rom_init = [x & 0xff for x in lut_table(Func.SIGMOID) + lut_table(Func.TANH)]
        depth = 512 + (TABLE_ENTRIES if self.table else 0)
        m.submodules.lut = rom = memory.Memory(shape=unsigned(8), depth=depth, init=rom_init)
        rd = rom.read_port()
        # Addressed with the value about to be registered: the data lands in POOL.
        is_table = (params.func == Func.SIGMOID) | (params.func == Func.TANH)
        if self.table:
            program = params.func == Func.TABLE
            m.d.comb += rd.addr.eq(Cat(q[:7], ~q[7], params.func == Func.TANH, program))
            is_table = is_table | program
            write = rom.write_port()
            entry = self.i_table.payload
            m.d.comb += self.i_table.ready.eq(1)
            m.d.sync += [write.addr.eq(Cat(entry.addr, Const(0, 1), Const(1, 1))),
                         write.data.eq(entry.data), write.en.eq(self.i_table.valid)]
        else:
            m.d.comb += rd.addr.eq(Cat(q[:7], ~q[7], params.func == Func.TANH))
        result = Mux(is_table, rd.data.as_signed(), f)
        best = Mux(window_open & (pooled[col] > result), pooled[col], result)

        # NORMALISE (with ``row_scale``): the row's reciprocal and extra shift, found before
        # its first column (RECIP, RECIP_READ), replace the multiplier word and grow the shift.
        normalise = Const(0)
        multiplier = params.word
        if self.row_scale:
            normalise = params.func == Func.NORMALISE
            row_recip, row_e = self._reciprocal(m, row.data[cols - 1])
            multiplier = Mux(normalise, row_recip, params.word)

        with m.FSM(name="serial_activation"):
            with m.State("IDLE"):
                # Column 0's multiplier is selected. A row that closes a window needs the
                # output register free.
                m.d.comb += params.kind.eq(ColumnWord.MULTIPLIER)
                with m.If(self.i_row.valid & (~row.last | ~self.o_row.valid)):
                    m.next = "RECIP" if self.row_scale else "LOAD"
                    if self.row_scale:
                        with m.If(~normalise):
                            m.next = "LOAD"
            if self.row_scale:
                # The divisor's top bits and its table read; then its reciprocal.
                for state, after in (("RECIP", "RECIP_READ"), ("RECIP_READ", "LOAD")):
                    with m.State(state):
                        m.d.comb += [self.o_busy.eq(1), params.kind.eq(ColumnWord.MULTIPLIER)]
                        m.next = after
            with m.State("LOAD"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += [lo.eq(multiplier), hi.eq(0), step.eq(0)]
                m.next = "BIAS"
            with m.State("BIAS"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += mcand.eq(t)
                m.next = "MULTIPLY"
            with m.State("MULTIPLY"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += [hi.eq(total[1:]), lo.eq(Cat(lo[1:], total[0])),
                             step.eq(step + 1)]
                # The column's shift word, read meanwhile (the port is free).
                with m.If(step == 0):
                    m.d.comb += params.kind.eq(ColumnWord.SHIFT)
                with m.If(step == 1):
                    base = Mux(params.column_shifts, params.word[:6], params.shift)
                    if self.row_scale:      # NORMALISE's: min(63, shift + e)
                        total = base + Mux(normalise, row_e, 0)
                        base = Mux(total > 63, 63, total)
                    m.d.sync += shift.eq(base)
                with m.If(step == 31):
                    m.d.sync += [left.eq(Mux(shift == 0, 0, shift - 1)), dropped.eq(0),
                                 sticky.eq(0), any_hi.eq(0), all_hi.eq(1)]
                    m.next = "SHIFT"
            with m.State("SHIFT"):
                m.d.comb += self.o_busy.eq(1)
                with m.If(dropped == 0):
                    m.d.sync += n.eq(product[63] & ~product[30:].all())
                with m.If(left != 0):
                    m.d.sync += [Cat(lo, hi).eq(product >> 1), left.eq(left - 1),
                                 dropped.eq(dropped + 1), sticky.eq(sticky | product[0])]
                    with m.If(dropped >= 30):
                        m.d.sync += [any_hi.eq(any_hi | product[0]),
                                     all_hi.eq(all_hi & product[0])]
                with m.Else():
                    m.d.sync += q.eq(q_next)
                    m.next = "FUNC"
            with m.State("FUNC"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += f.eq(f_next)
                m.next = "POOL"
            with m.State("POOL"):
                # The table read of q lands this cycle.
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += pooled[col].eq(best)
                with m.If(row.last):
                    m.d.sync += self.o_row.payload[col].eq(best)
                with m.If(col == cols - 1):
                    m.d.comb += self.i_row.ready.eq(1)
                    m.d.sync += [col.eq(0), window_open.eq(~row.last)]
                    with m.If(row.last):
                        m.d.sync += self.o_row.valid.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    # The next column's multiplier.
                    m.d.comb += [params.col.eq(col + 1), params.kind.eq(ColumnWord.MULTIPLIER)]
                    m.d.sync += col.eq(col + 1)
                    m.next = "LOAD"

        with m.If(self.o_row.valid & self.o_row.ready):
            m.d.sync += self.o_row.valid.eq(0)
        return m

    def _reciprocal(self, m: Module, divisor):
        """NORMALISE's ``(reciprocal, e)`` for the row's *divisor* (its last column, held on
        ``i_row``): its top bits and ``e`` registered in RECIP, read in the table of
        reciprocals in RECIP_READ, held for the row's columns."""
        bits = RECIPROCAL_BITS
        e_next = Signal(range(33 - bits))
        for k in range(bits, 31):       # the highest set bit decides (later ones win)
            with m.If(divisor[k]):
                m.d.comb += e_next.eq(k + 1 - bits)
        entries = [0] + [reciprocal(t)[0] for t in range(1, 1 << bits)]
        m.submodules.reciprocals = rom = memory.Memory(
            shape=unsigned(max(entries).bit_length()), depth=1 << bits, init=entries)
        read = rom.read_port()
        e = Signal.like(e_next)
        positive = Signal()
        recip = Signal(signed(32))
        m.d.comb += read.addr.eq(divisor.as_unsigned() >> e_next)
        # (Registered every cycle: RECIP and RECIP_READ come right before the row's first
        # column, while the row is held.)
        m.d.sync += [e.eq(e_next), positive.eq(~divisor[31] & divisor.any()),
                     recip.eq(Mux(positive, read.data, 0))]
        return recip, e
