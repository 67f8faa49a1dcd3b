"""Weight-stationary systolic array with double-buffered (shadow) weights."""

from amaranth.hdl import EnableInserter, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.datapath.dual_mult import DualMultiplier
from hdl.datapath.pe import PE, weight_bus_layout
from hdl.layouts import act_row_layout, psum_row_layout, weight_row_layout
from hdl.lib.registers import delay_line

__all__ = ["SystolicArray"]


def _extend(raw, is_signed):
    """Raw operand bits to a ``width + 1``-bit signed value."""
    return Mux(is_signed, raw.as_signed(), raw)


class SystolicArray(wiring.Component):
    """``rows x cols`` grid of :class:`PE`, computing one row of ``x @ W`` per cycle.

    Activation rows (``rows`` elements, the reduction dimension) enter on ``i_act``; the
    array skews them so row ``r`` reaches the left edge ``r`` cycles after row 0, and partial
    sums flow down the columns. Output rows (``cols`` int32 sums) leave on ``o_psum``,
    de-skewed, in input order, :attr:`TPUConfig.array_latency` cycles after their input.

    The skew suits any PE latency: PE ``(r, c)`` gets an activation ``r + c + 1`` cycles
    after it was accepted, the PE below it one cycle later, and each PE must get ``i_psum``
    :attr:`PE.latency <hdl.datapath.pe.PE.latency>` - 1 cycles after its activation, which is when
    the PE above shows its sum (its activation one cycle earlier, ``latency`` cycles to its
    ``o_psum``). So the four extra register stages of the fast pipeline's PEs (``w_pre``,
    ``w_pipe``, ``product_pipe``, ``addend``) only add four cycles to ``array_latency``
    (``rows + cols + 6`` instead of ``rows + cols + 2``). The weight and the ``switch`` mark
    travel with the same skew as the activations, and a PE still picks the weight in the
    cycle the activation arrives, so tile switches do not depend on the PE latency either.

    Weight tiles (``rows x cols``) arrive on ``i_weight`` one row per beat, row 0 first, and
    are shifted into the PEs' shadow registers while the array computes with the active
    tile. An activation row with ``switch`` set makes every PE use the shadow tile from that
    row on. Interlocks keep this safe without any padding in the input:

    - a ``switch`` row is accepted only once the whole next tile is in the shadow registers
      (until then ``o_weight_stall`` is high);
    - the next tile's rows are accepted only once the previous shadow tile has been switched
      in (from the very cycle its ``switch`` row enters).

    So with at least ``rows`` activation rows per tile and tiles ready in time, consecutive
    tiles run back to back with no bubble. Each tile carries its own signedness; each
    activation row carries its own.

    The whole pipeline advances together, and stops under back-pressure on ``o_psum``
    without losing or doubling a row:

    - by default it advances in each cycle ``o_psum`` is not holding an unaccepted row (one
      combinational enable from ``o_psum.ready`` to every register);
    - with the fast pipeline (:attr:`registered_enable`) the enable
      is a register, decided a cycle ahead from ``o_psum.ready`` and the output state, with
      a copy for each PE and each skew line so that no net drives more than a PE's clock
      enables. A row that leaves the pipeline in a cycle ``o_psum`` does not take it waits
      in a skid register, which is then the head of ``o_psum``; the pipeline stops while
      both hold a row, and restarts in the cycle the skid's row is taken. Without
      back-pressure the cycles are those of the default; ``i_act.ready`` and
      ``i_weight.ready`` no longer depend on ``o_psum.ready`` in the same cycle.

    The array holds at most ``array_latency`` rows (accepted on ``i_act``, not yet taken on
    ``o_psum``), ``array_latency + 1`` with the registered enable.

    Members
    -------
    i_weight : In(stream.Signature(weight_row_layout))
        Rows of the next weight tile.
    i_act : In(stream.Signature(act_row_layout))
        Activation rows.
    o_psum : Out(stream.Signature(psum_row_layout))
        Output rows.
    o_weight_stall : Out(1)
        A ``switch`` row is waiting for its weight tile.
    o_weight_shift : Out(1)
        A weight row is entering the array this cycle.
    o_shadow_full : Out(1)
        A whole tile waits in the shadow registers.
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        super().__init__({
            "i_weight":       In(stream.Signature(weight_row_layout(config.cols,
                                                                    config.data_width))),
            "i_act":          In(stream.Signature(act_row_layout(config.rows,
                                                                 config.data_width))),
            "o_psum":         Out(stream.Signature(psum_row_layout(config.cols,
                                                                   config.acc_width))),
            "o_weight_stall": Out(1),
            "o_weight_shift": Out(1),
            "o_shadow_full":  Out(1),
        })

    @property
    def registered_enable(self) -> bool:
        """Whether the pipeline's enable is a register (the fast pipeline; see the class
        docstring)."""
        return self.config.pipeline == "fast"

    def elaborate(self, platform):
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        row_bits = max(1, (rows - 1).bit_length())
        operand = signed(cfg.data_width + 1)
        registered = self.registered_enable

        m = Module()

        # Everything in `core` advances together; it stops while o_psum holds a row. With
        # the registered enable, each part of `core` (a PE, a skew or de-skew line) has its
        # own copy of the enable register, so that no net drives thousands of clock enables;
        # `advance` is the copy for the stream handshakes.
        core = Module()
        advance = Signal(init=1)
        enables = []
        if registered:
            m.submodules.core = core
            enables.append(advance)
        else:
            m.d.comb += advance.eq(~self.o_psum.valid | self.o_psum.ready)
            m.submodules.core = EnableInserter(advance)(core)

        def enable(name: str) -> Signal:
            en = Signal(init=1, name=f"en_{name}")
            enables.append(en)
            return en

        def part(name: str) -> Module:
            """Where the registers of one part of the pipeline go."""
            if not registered:
                return core
            module = Module()
            core.submodules[name] = EnableInserter(enable(name))(module)
            return module

        # Interlock between the activation stream and the weight shift.
        shadow_full = Signal()
        shifted = Signal(range(rows))
        act_take = Signal()
        switch_take = Signal()
        weight_take = Signal()
        m.d.comb += [
            self.i_act.ready.eq(advance & (~self.i_act.payload.switch | shadow_full)),
            act_take.eq(self.i_act.valid & self.i_act.ready),
            switch_take.eq(act_take & self.i_act.payload.switch),
            self.i_weight.ready.eq(advance & (~shadow_full | switch_take)),
            weight_take.eq(self.i_weight.valid & self.i_weight.ready),
            self.o_weight_stall.eq(self.i_act.valid & self.i_act.payload.switch &
                                   ~shadow_full),
            self.o_weight_shift.eq(weight_take),
            self.o_shadow_full.eq(shadow_full),
        ]
        with m.If(switch_take):
            m.d.sync += shadow_full.eq(0)
        with m.If(weight_take):
            with m.If(shifted == rows - 1):
                m.d.sync += [shifted.eq(0), shadow_full.eq(1)]
            with m.Else():
                m.d.sync += shifted.eq(shifted + 1)

        # Array grid. A partial sum r + 1 PEs down a column is a sum of r + 1 products,
        # which never wraps in cfg.psum_bits(r + 1) bits: the adders and registers are that
        # wide, and the bottom edge sign-extends to acc_width (the same numbers, less logic).
        first_lut = rows * cols - cfg.lut_multipliers
        pes = [[PE(data_width=cfg.data_width,
                   acc_width=min(cfg.acc_width, cfg.psum_bits(r + 1)), row=r,
                   row_bits=row_bits,
                   multiplier=cfg.multiplier if r * cols + c < first_lut else "lut",
                   # (every PE, a LUT product's too: the skew needs one latency)
                   pipelined=cfg.pipeline == "fast")
                for c in range(cols)] for r in range(rows)]
        for r in range(rows):
            for c in range(cols):
                pe = pes[r][c]
                en = enable(f"pe_{r}_{c}") if registered else advance
                if "i_en" in pe.signature.members:
                    # An EnableInserter does not reach the registers of an instantiated DSP
                    # block: the PE takes the enable as a port.
                    core.d.comb += pe.i_en.eq(en)
                    core.submodules[f"pe_{r}_{c}"] = pe
                elif registered:
                    core.submodules[f"pe_{r}_{c}"] = EnableInserter(en)(pe)
                else:
                    core.submodules[f"pe_{r}_{c}"] = pe

        # multiplier="ice40": the PEs' products two to a DualMultiplier (one SB_MAC16), in
        # row-major order; with an odd number the last one has a block of its own.
        shared = [pe for row in pes for pe in row if "i_product" in pe.signature.members]
        for index in range(0, len(shared), 2):
            pair = shared[index:index + 2]
            mult = DualMultiplier()
            m.submodules[f"mac_{index // 2}"] = mult
            m.d.comb += mult.i_en.eq(enable(f"mac_{index // 2}") if registered else advance)
            for pe, a, b, p in zip(pair, (mult.i_a0, mult.i_a1), (mult.i_b0, mult.i_b1),
                                   (mult.o_p0, mult.o_p1), strict=False):  # a pair or one
                m.d.comb += [a.eq(pe.o_mul_a), b.eq(pe.o_mul_w), pe.i_product.eq(p)]

        # Left edge: activation row r enters row r after r + 1 registers.
        for r in range(rows):
            act = Signal(operand, name=f"act_in_{r}")
            switch = Signal(name=f"switch_in_{r}")
            m.d.comb += [
                act.eq(Mux(act_take, _extend(self.i_act.payload.data[r],
                                             self.i_act.payload.signed), 0)),
                switch.eq(switch_take),
            ]
            skew = part(f"act_skew_{r}")
            core.d.comb += [
                pes[r][0].i_act.eq(delay_line(skew, act, r + 1, name=f"act_skew_{r}",
                                              reset_less=True)),
                pes[r][0].i_switch.eq(delay_line(skew, switch, r + 1,
                                                 name=f"switch_skew_{r}")),
            ]
            for c in range(1, cols):
                core.d.comb += [
                    pes[r][c].i_act.eq(pes[r][c - 1].o_act),
                    pes[r][c].i_switch.eq(pes[r][c - 1].o_switch),
                ]

        # Top edge: weight column c enters column c after c + 1 registers, so each weight
        # meets the PE it is for in the same cycle as an activation accepted with it.
        bus_layout = weight_bus_layout(data_width=cfg.data_width, row_bits=row_bits)
        for c in range(cols):
            bus = Signal(bus_layout, name=f"wbus_in_{c}")
            m.d.comb += [
                bus.valid.eq(weight_take),
                bus.row.eq(shifted),
                bus.data.eq(_extend(self.i_weight.payload.data[c],
                                    self.i_weight.payload.signed)),
            ]
            core.d.comb += [
                pes[0][c].i_wbus.eq(delay_line(part(f"wbus_skew_{c}"), bus, c + 1,
                                               name=f"wbus_skew_{c}")),
                pes[0][c].i_psum.eq(0),
            ]
            for r in range(1, rows):
                core.d.comb += [
                    pes[r][c].i_wbus.eq(pes[r - 1][c].o_wbus),
                    pes[r][c].i_psum.eq(pes[r - 1][c].o_psum),
                ]

        # Bottom edge: column c is delayed cols - 1 - c more cycles, so a whole row leaves
        # at once, cfg.array_latency cycles after its activation row was accepted.
        out = Signal(psum_row_layout(cols, cfg.acc_width), name="core_psum")
        for c in range(cols):
            depth = cols - 1 - c
            core.d.comb += out[c].eq(
                delay_line(part(f"psum_deskew_{c}") if depth else core,
                           pes[rows - 1][c].o_psum, depth, name=f"psum_deskew_{c}",
                           reset_less=True))
        valid = Signal(name="valid_in")
        m.d.comb += valid.eq(act_take)
        pipe = part("valid_pipe")
        last = cfg.array_latency - 1
        out_after = delay_line(pipe, valid, last - 1, name="valid_pipe")
        out_next = Signal(name=f"valid_pipe_d{last - 1}")      # out_valid's next row
        out_valid = Signal(name=f"valid_pipe_d{last}")
        pipe.d.sync += [out_next.eq(out_after), out_valid.eq(out_next)]

        if not registered:
            m.d.comb += [self.o_psum.valid.eq(out_valid), self.o_psum.payload.eq(out)]
            return m

        # Registered enable: the enable for a cycle is decided in the cycle before, from
        # registers and o_psum.ready, so a row can leave the core in a cycle o_psum is not
        # ready; the skid register keeps it (and is then the head of o_psum). The core runs
        # unless both the skid and the core's output hold a row: then it runs again in the
        # cycle after o_psum takes the skid's row, so back-pressure costs no throughput.
        skid_full = Signal()
        skid = Signal(psum_row_layout(cols, cfg.acc_width), name="skid_psum", reset_less=True)
        ready = self.o_psum.ready
        full_next = Signal()
        with m.If(~skid_full):
            m.d.sync += skid.eq(out)
        m.d.comb += [
            full_next.eq(~ready & (skid_full | (advance & out_valid))),
            self.o_psum.valid.eq(skid_full | out_valid),
            self.o_psum.payload.eq(Mux(skid_full, skid, out)),
        ]
        m.d.sync += skid_full.eq(full_next)
        # stop = (skid_full | out_valid) & out_next, a register computed a cycle ahead (it
        # drives every copy's next value): two rows will wait unless o_psum takes one.
        stop = Signal()
        m.d.sync += stop.eq((full_next | Mux(advance, out_next, out_valid)) &
                            Mux(advance, out_after, out_next))
        # Each copy's next value: a stopped core (only ever with both rows waiting) runs once
        # o_psum is ready; a running one stops if two rows would wait. Written from the copy's
        # own value, the copies are not identical logic, so synthesis keeps every one.
        for en in enables:
            m.d.sync += en.eq(ready | (en & ~stop))
        return m
