"""Activation unit: requantisation, activation function and max-pooling."""

import itertools

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.datapath.activation_table import table_quarter
from hdl.datapath.pooling import pool_column, pool_controls
from hdl.datapath.rounding import rounding_controls, rounding_shift
from hdl.datapath.wide_product import biased_product
from hdl.isa import RECIPROCAL_BITS, TABLE_ENTRIES, Func, Rounding, reciprocal
from hdl.layouts import acc_row_layout
from hdl.lib.compare import greater_than
from hdl.lib.registers import register_copies
from hdl.lib.vendor import ecp5_mult_instance
from hdl.memory.block_ram import PipelinedMemory
from hdl.ports import MemWriteSignature, requant_params_layout

__all__ = ["ActivationUnit"]


class ActivationUnit(wiring.Component):
    """Turns rows of int32 sums into rows of int8 activations, one row per cycle.

    For each column ``j``, exactly as :func:`sim.models.golden.requantise` and
    :func:`sim.models.golden.activate` specify:

    1. ``t = wrap32(acc + bias[j])``;
    2. ``p = t * multiplier[j]`` (exact, 64 bits);
    3. ``r = p / 2**shift[j]`` rounded to an integer in the slot's rounding mode (HALF_UP,
       HALF_EVEN or TFLite's DOUBLE; ``r = p`` when ``shift[j] == 0``; see
       :mod:`hdl.datapath.rounding`);
    4. ``q = saturate_int8(saturate_int32(r) + zero_point)``;
    5. the function: IDENTITY ``q``; RELU ``max(q, zero_point)``; CLAMP
       ``min(max(q, zero_point), clamp_hi)``; SIGMOID and TANH a fixed table indexed by
       ``q`` (see :func:`~hdl.datapath.activation_table.lut_table`); TABLE (with ``table``)
       the programmable table's entry ``q + 128``; NORMALISE (with ``row_scale``) the
       identity, the row having been requantised with the reciprocal of its last column's
       sum as the multiplier (:func:`hdl.isa.reciprocal`, ``shift + e`` the shift);
    6. max-pooling: the element-wise maximum over the rows up to one with ``last`` set,
       sent as one output row.

    ``bias``, ``multiplier``, ``shift`` (per column), ``rounding``, ``zero_point``,
    ``clamp_hi`` and the function come from ``i_params``, held steady by the controller while a
    row is in flight.

    Timing: the unit takes a row every cycle while it has room for the output rows it may
    still owe (:data:`FIFO_DEPTH` windows: it never stalls while ``o_row`` is taken every
    cycle) and offers a window's output row :data:`STAGES` cycles after taking the row that
    closes the window. The datapath itself never stalls (no clock enable fans out over its
    registers): back-pressure on ``o_row`` fills an output FIFO, and ``i_row.ready`` falls
    before it can overflow. Every stage is a register, an adder or a few LUT levels deep:
    the 32 x 32 product is four 18 x 18 partial products (each in a DSP block with its input
    and output registers, then a fabric register), summed in two stages; the rounding shift
    is two 8:1 steps and a stage that decides the rounding increment from the bits shifted
    out; saturation works on the shifted value's low bits and a flag.

    Parameters
    ----------
    cols, acc_width : int
        Columns, sum width (32).
    table : bool
        Build the programmable table (LOAD_TABLE, function TABLE): a 256-byte memory per
        column (a block RAM each; the row's ``cols`` lookups happen in one cycle), all
        written together from ``i_table``.
    pipelined : bool
        With ``table``: read each copy through its block RAM's output register
        (:class:`~hdl.memory.block_ram.PipelinedMemory`, the fast pipeline's choice), addressed
        a stage earlier with the value saturated from s11's registers: a DP16KD read without
        it is too late in the cycle for the ULX3S's clock.
    row_scale : bool
        Build NORMALISE: the row's divisor cut to its top bits in the bias stage (a priority
        encoder and a shifter, once per row), its reciprocal read from a fixed table into
        every column's multiplier input in place of the slot's multiplier, and the extra
        shift carried down the stages beside the row to the rounding shift.
    multiplier : str
        ``"infer"``: the partial products are ``*`` between fabric registers (any part).
        ``"ecp5"``: each is an ECP5 ``MULT18X18D`` with registered inputs and output, as
        :class:`hdl.datapath.pe.PE` builds it (same timing; elaborated as for the PE: the instance
        on
        an ECP5 platform and in Verilog simulation, fabric registers otherwise).

    Members
    -------
    i_row : In(stream.Signature(acc_row_layout))
        Sums, with ``last`` on the final row of each pooling window.
    o_row : Out(stream.Signature(ArrayLayout(signed(8), cols)))
        Activations, one row per pooling window.
    i_params : In(requant_params_layout(cols))
        The requantisation parameters and the function (``func``).
    i_table : In(MemWriteSignature(8, unsigned(8)))
        With ``table``: an entry of the programmable table (always ready; written a cycle
        later, from registers, into every column's copy).
    o_busy : Out(1)
        A row is in the pipeline or an output row waits.
    """

    #: Cycles from taking a row that closes a window to offering its output row.
    STAGES = 20
    #: Output rows the unit holds for a stalled ``o_row``: more than it can owe with ``o_row``
    #: taken every cycle (a row for each stage, and one whose credit is on its way back), so
    #: it then takes a row every cycle. (The credit register is late only after a cycle
    #: that closed no window: with a window closing every cycle it is exact.)
    FIFO_DEPTH = STAGES + 2

    def __init__(self, *, cols: int, acc_width: int = 32, multiplier: str = "infer",
                 table: bool = False, row_scale: bool = False, pipelined: bool = False):
        if acc_width != 32:
            raise ValueError(f"acc_width={acc_width} is not supported; allowed: 32")
        if multiplier not in ("infer", "ecp5"):
            raise ValueError(f"multiplier={multiplier!r} is not supported; allowed: 'infer', "
                             f"'ecp5'")
        self.cols = cols
        self.acc_width = acc_width
        self.multiplier = multiplier
        self.table = table
        self.row_scale = row_scale
        self.pipelined = pipelined
        super().__init__({
            "i_row":    In(stream.Signature(acc_row_layout(cols, acc_width))),
            "o_row":    Out(stream.Signature(data.ArrayLayout(signed(8), cols))),
            "i_params": In(requant_params_layout(cols)),
            **({"i_table": In(MemWriteSignature(8, unsigned(8)))} if table else {}),
            "o_busy":   Out(1),
        })

    def elaborate(self, platform):
        instantiate = self.multiplier == "ecp5" and ecp5_mult_instance(platform)
        m = Module()
        cols = self.cols
        # The parameters, registered: they are steady while rows are in flight, and the
        # first use (the bias) is a cycle after a row is taken.
        prm = Signal.like(self.i_params)
        m.d.sync += prm.eq(self.i_params)
        # Register stages before the pooling: s1 input; s2 bias; s3, s4 the multipliers'
        # input and output registers; s5 partial products; s6 middle sum; s7 product (s1-s7:
        # hdl.datapath.wide_product); s8 coarse shift; s9 fine shift; s10 the rounding
        # increment (s8-s10: hdl.datapath.rounding); s11 low bits + zero point + increment;
        # s12 whether and how it clips; s13 saturated; s14 the compares with the zero point
        # and clamp_hi and the table in quarters; s15 the function's result. Then the
        # pooling's four (P1-P4, hdl.datapath.pooling), from which a window's row goes into
        # the output FIFO (it is offered a cycle later).
        depth = self.STAGES - 5         # s1-s15

        # Output FIFO and the credit that keeps it from overflowing: a window's row is
        # owed from the cycle its closing row is taken until o_row takes it.
        m.submodules.out_fifo = out_fifo = fifo.SyncFIFO(
            width=8 * cols, depth=self.FIFO_DEPTH)
        owed = Signal(range(self.FIFO_DEPTH + 1))
        room = Signal(init=1)       # owed < FIFO_DEPTH, or a cycle late (see below)
        take = Signal()
        give = Signal()
        m.d.comb += [
            self.i_row.ready.eq(room),
            take.eq(self.i_row.valid & room),
            self.o_row.valid.eq(out_fifo.r_rdy),
            self.o_row.payload.eq(out_fifo.r_data),
            out_fifo.r_en.eq(self.o_row.ready),
            give.eq(out_fifo.r_rdy & self.o_row.ready),
        ]
        # The credit is returned a cycle after the FIFO gives a row (``given``): o_row's ready
        # comes from the unified buffer's write arbiter, and ended a long path here. The
        # credit counts one row too many meanwhile, never too few (FIFO_DEPTH allows for it).
        # `room` is a register of its own, so that the compare does not run into i_row's
        # ready and the accumulator reads behind it; it is computed from registers alone,
        # counting a window closed whenever there was room (`last` comes late, from the
        # activation engine's window logic), so it may be low a cycle with a row to spare
        # (after a cycle in which no window closed).
        given = Signal()
        m.d.sync += [given.eq(give),
                     owed.eq(owed + (take & self.i_row.payload.last) - given),
                     room.eq(owed + room - given < self.FIFO_DEPTH)]

        valid = [Signal(name=f"valid_s{i}") for i in range(1, depth + 1)]
        last = [Signal(name=f"last_s{i}") for i in range(1, depth + 1)]
        m.d.sync += [valid[0].eq(take), last[0].eq(self.i_row.payload.last)]
        for i in range(1, depth):
            m.d.sync += [valid[i].eq(valid[i - 1]), last[i].eq(last[i - 1])]
        m.d.comb += self.o_busy.eq(Cat(*valid).any() | (owed != 0))

        # The parameters every column uses from the shift on, decoded into a register and
        # copied from it, a copy per column (two cycles later still: their first use is 7
        # cycles after a row is taken), so that none is routed to all the columns'
        # multiplexers.
        func = prm.func
        scalars = data.StructLayout({"zero_point": signed(8), "clamp_hi": signed(8),
                                     "zp_above": 1, "table": 1, "tanh": 1, "relu": 1,
                                     "clamp": 1, **({"program": 1} if self.table else {}),
                                     **({"normalise": 1} if self.row_scale else {})})
        shared = Signal(scalars)
        m.d.sync += [
            shared.zero_point.eq(prm.zero_point),
            shared.clamp_hi.eq(prm.clamp_hi),
            shared.zp_above.eq(greater_than(prm.zero_point, prm.clamp_hi)),
            shared.table.eq((func == Func.SIGMOID) | (func == Func.TANH)),
            shared.tanh.eq(func == Func.TANH),
            shared.relu.eq(func == Func.RELU),
            shared.clamp.eq(func == Func.CLAMP),
        ]
        if self.row_scale:
            m.d.sync += shared.normalise.eq(func == Func.NORMALISE)
            recip, row_e = self._reciprocal(m)
        if self.table:
            m.d.comb += self.i_table.ready.eq(1)
            m.d.sync += shared.program.eq(func == Func.TABLE)
            # An entry is written a cycle after it arrives, from registers: the write fans out
            # to every column's block RAM.
            table_write = Signal.like(self.i_table.payload)
            table_en = Signal()
            m.d.sync += [table_write.eq(self.i_table.payload), table_en.eq(self.i_table.valid)]
        # Four copies per column: for the coarse shift (it drives a 64-bit multiplexer), for
        # the fine shift, for the table's function bit (an input of every table LUT) and for
        # the rest: one copy for all of it is a long route into the compares with the zero
        # point.
        # Each column's shift and rounding controls are decoded beside them.
        column = data.StructLayout({"scalars": scalars, "rounding": rounding_controls()})
        column_params = []
        for j in range(cols):
            rnd = Signal(rounding_controls(), name=f"rounding_{j}")
            double = prm.rounding == Rounding.DOUBLE
            m.d.sync += [rnd.shift.eq(prm.shift[j]),
                         rnd.even.eq(prm.rounding == Rounding.HALF_EVEN),
                         rnd.double.eq(double),
                         rnd.two_step.eq(double & prm.shift[j][5])]
            copies = register_copies(m, Cat(shared.as_value(), rnd.as_value()), 4,
                                     f"params_{j}")
            column_params.append([data.View(column, copy) for copy in copies])

        # Max-pooling (hdl.datapath.pooling) in four stages, P1-P4, after s15.
        s15 = depth - 1
        p1, closes, single = pool_controls(m, valid[s15], last[s15], cols)
        pooled = Signal(data.ArrayLayout(signed(8), cols))       # P4: the window's row
        for j in range(cols):
            def reg(shape, name, j=j):
                return Signal(shape, name=f"{name}_{j}", reset_less=True)

            fits = {name: reg(1, name) for name in     # s9: r[9:64] all 0 or all 1, in parts
                    ("hi_zero", "hi_ones", "lo_zero", "lo_ones")}
            r_low = reg(signed(10), "r_low")           # s10: r's low bits,
            small = reg(1, "small")                    #      r fits 10 bits: v is exact
            negative = reg(1, "negative")
            v = reg(signed(12), "v")                   # s11: low bits + zero point + carry
            small_11 = reg(1, "small_11")
            negative_11 = reg(1, "negative_11")
            clip = reg(1, "clip")                      # s12: it saturates,
            clip_low = reg(1, "clip_low")              #      to -128,
            v_low = reg(signed(8), "v_low")            #      or is v's low bits
            q = reg(signed(8), "q")                    # s13: saturated
            q_14 = reg(signed(8), "q_14")              # s14: q, q > zp, ReLU > clamp_hi and
            gt_zp = reg(1, "gt_zp")                    #      the table entries of q's
            above = reg(1, "above")                    #      quarter of the index range
            quarters = [reg(unsigned(8), f"tbl{k}") for k in range(4)]
            result = reg(signed(8), "result")          # s15: the function's result
            program = reg(signed(8), "program")        # s14: the programmable table's entry

            cp_hi, cp_lo, cp_tbl, cp = (c.scalars for c in column_params[j])
            rd_hi, rd_lo, _, rd = (c.rounding for c in column_params[j])
            multiplier = prm.multiplier[j]
            if self.row_scale:
                # NORMALISE: the row's reciprocal instead of the slot's multiplier, and its
                # shift grown by the divisor's cut (at most 63), carried beside the row: the
                # rounding stages read it in s7 (coarse), s8 (fine) and s9 (increment).
                multiplier = Mux(cp.normalise, recip, multiplier)
                total = rd_hi.shift + Mux(cp.normalise, row_e, 0)
                shift7, shift8 = reg(6, "shift_s7"), reg(6, "shift_s8")
                two7, two8, two9 = (reg(1, f"two_step_s{i}") for i in (7, 8, 9))
                clipped = Mux(total > 63, 63, total)
                m.d.sync += [shift7.eq(clipped), two7.eq(rd.double & clipped[5]),
                             shift8.eq(shift7), two8.eq(two7), two9.eq(two8)]
                controls = rounding_controls()
                rd_hi = data.View(controls, Cat(shift7, rd.even, rd.double, two7))
                rd_lo = data.View(controls, Cat(shift8, rd.even, rd.double, two8))
                rd = data.View(controls, Cat(shift8, rd.even, rd.double, two9))

            # s1-s7: + bias, times the multiplier (hdl.datapath.wide_product).
            p = biased_product(m, self.i_row.payload.data[j], prm.bias[j], multiplier,
                               suffix=f"_{j}", instantiate=instantiate)
            # s8-s10: r = p >>> shift and the rounding increment (hdl.datapath.rounding).
            is_table, is_tanh, is_relu, is_clamp = cp.table, cp_tbl.tanh, cp.relu, cp.clamp
            coarse, r, carry = rounding_shift(m, p, rd_hi, rd_lo, rd, suffix=f"_{j}")
            with m.Switch(rd_lo.shift[0:3]):
                for k in range(8):
                    with m.Case(k):
                        # r[9:64] is coarse[9 + k:64] (sign-extended): its bits below 16
                        # here, those from 16 on below, each reduced from coarse, so that
                        # `small` is one LUT of four flip-flops, not five LUT levels from r.
                        low_bits = coarse[9 + k:16]
                        m.d.sync += [fits["lo_zero"].eq(low_bits == 0 if k < 7 else 1),
                                     fits["lo_ones"].eq(low_bits.all() if k < 7 else 1)]
            m.d.sync += [fits["hi_zero"].eq(coarse[16:64] == 0),
                         fits["hi_ones"].eq(coarse[16:64].all())]
            # saturate_int8(saturate_int32(r + carry) + zp) == saturate_int8(r + carry + zp)
            # (zp is int8): exact from r's low 10 bits when r fits them, else the sign decides.
            zp = cp.zero_point
            # s12: whether it clips, read off v's top bits, not compared (a compare is a carry
            # chain), into registers, so that the value saturated in s13 is a LUT from
            # registers: deciding and saturating do not fit one cycle on the fast build.
            high = v[7:11]
            m.d.sync += [clip.eq(~small_11 | Mux(v[11], ~high.all(), high.any())),
                         clip_low.eq(Mux(small_11, v[11], negative_11)),
                         v_low.eq(v[0:8])]
            # s13: saturated, in five registers: one is compared and passed on, and a copy
            # for each quarter of the table indexes it (one register, or one copy for the
            # whole table, fans out too far). Each copy loads with a row in s12 and in some
            # cycles that hold no row in s12 too (a different set for each), so that
            # synthesis keeps them apart from `q`, which loads every cycle, and from each
            # other; only a row in s13 uses them. (register_copies' form would put a compare
            # with the copy into its enable.)
            saturated = Mux(clip, Mux(clip_low, -128, 127), v_low)
            m.d.sync += q.eq(saturated)
            q_tbl = []
            # valid[i]: a row in stage s(i + 1)
            for k, also in enumerate((0, valid[10], valid[12], valid[9])):
                copy = reg(signed(8), f"q_tbl{k}")
                with m.If(valid[11] | also):
                    m.d.sync += copy.eq(saturated)
                q_tbl.append(copy)
            m.d.sync += [
                r_low.eq(r[0:10]),
                small.eq((fits["hi_zero"] & fits["lo_zero"]) | (fits["hi_ones"] & fits["lo_ones"])),
                negative.eq(r[63]),
                v.eq(r_low + zp + carry),
                small_11.eq(small),
                negative_11.eq(negative),
                q_14.eq(q),
                # ReLU's compare is registered and its multiplexer is in s15: in one stage
                # they do not fit a cycle on the fast build. The unit's compares are LUT
                # trees (greater_than), faster than the ECP5's carry chain.
                gt_zp.eq(greater_than(q, zp)),
                # max(q, zp) > clamp_hi, without the max in series.
                above.eq(greater_than(q, cp.clamp_hi) | cp.zp_above),
            ]
            # The tables, SIGMOID at 0..255 and TANH at 256..511, index q + 128: in s14 the
            # four entries q's low 6 bits select (one per value of its top 2 bits), in s15
            # the one its top bits select.
            for k in range(4):
                m.d.sync += quarters[k].eq(table_quarter(k, q_tbl[k][:6], is_tanh))
            top = Cat(q_14[6], ~q_14[7])
            tbl = Mux(top[1], Mux(top[0], quarters[3], quarters[2]),
                      Mux(top[0], quarters[1], quarters[0]))
            relu = Mux(gt_zp, q_14, cp.zero_point)
            clamp = Mux(above, cp.clamp_hi, relu)
            chosen = Mux(is_table, tbl, Mux(is_relu, relu, Mux(is_clamp, clamp, q_14)))
            if self.table:
                # The programmable table, read with the saturated value: its entry registered
                # in s14. Either the block RAM's address register is s13 (the value as q
                # takes it), or (pipelined) its address register is s12 and its output
                # register s13, from the value saturated straight from s11's registers.
                if self.pipelined:
                    lookup = PipelinedMemory(shape=unsigned(8), depth=TABLE_ENTRIES)
                    write, read = lookup.w, lookup.r[0]
                    high = v[7:11]
                    early = Mux(~small_11 | Mux(v[11], ~high.all(), high.any()),
                                Mux(Mux(small_11, v[11], negative_11), -128, 127), v[0:8])
                    m.d.comb += [read.addr.eq(Cat(early[:7], ~early[7])), read.en.eq(1)]
                else:
                    lookup = memory.Memory(shape=unsigned(8), depth=TABLE_ENTRIES, init=[])
                    write, read = lookup.write_port(), lookup.read_port(transparent_for=())
                    m.d.comb += read.addr.eq(Cat(saturated[:7], ~saturated[7]))
                m.submodules[f"table_{j}"] = lookup
                m.d.comb += [write.addr.eq(table_write.addr), write.data.eq(table_write.data),
                             write.en.eq(table_en)]
                m.d.sync += program.eq(read.data)
                chosen = Mux(cp.program, program, chosen)
            m.d.sync += result.eq(chosen)

            pool_column(m, j, result, p1[j], closes, single, pooled[j])

        m.d.comb += [
            out_fifo.w_data.eq(pooled),
            out_fifo.w_en.eq(closes[3]),
        ]
        return m

    def _reciprocal(self, m: Module):
        """NORMALISE's ``(reciprocal, e)``: in s1 the divisor (the row's last column, as it
        arrives), in s2 its top :data:`~hdl.isa.RECIPROCAL_BITS` bits and the shift ``e``
        that cuts them; the reciprocal read in s2 from a fixed table
        (:func:`~hdl.isa.reciprocal`) into the multipliers' input registers of s3, and ``e``
        delayed to s6 (the shift's stage adds it in s7). A divisor of 0 or less: a
        reciprocal of 0."""
        bits = RECIPROCAL_BITS
        d = Signal(signed(32), name="divisor_s1", reset_less=True)
        m.d.sync += d.eq(self.i_row.payload.data[self.cols - 1])
        e_next = Signal(range(33 - bits))
        for k in range(bits, 31):       # the highest set bit decides (later ones win)
            with m.If(d[k]):
                m.d.comb += e_next.eq(k + 1 - bits)
        top = Signal(bits, name="divisor_top_s2", reset_less=True)
        positive = Signal(name="divisor_positive_s2", reset_less=True)
        e_stages = [Signal(range(33 - bits), name=f"divisor_e_s{i}", reset_less=True)
                    for i in range(2, 7)]
        m.d.sync += [top.eq(d.as_unsigned() >> e_next), positive.eq(~d[31] & d.any()),
                     e_stages[0].eq(e_next)]
        for a, b in itertools.pairwise(e_stages):
            m.d.sync += b.eq(a)
        entries = [0] + [reciprocal(t)[0] for t in range(1, 1 << bits)]
        m.submodules.reciprocals = rom = memory.Memory(
            shape=unsigned(max(entries).bit_length()), depth=1 << bits, init=entries)
        read = rom.read_port(domain="comb")
        m.d.comb += read.addr.eq(top)
        recip = Signal(signed(32), name="reciprocal_s2")
        m.d.comb += recip.eq(Mux(positive, read.data, 0))
        return recip, e_stages[-1]
