"""Weight-stationary systolic array with double-buffered (shadow) weights."""

from amaranth.hdl import EnableInserter, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .config import TPUConfig
from .pe import PE, weight_bus_layout

__all__ = ["SystolicArray", "act_row_layout", "weight_row_layout", "psum_row_layout",
           "delay_line"]


def act_row_layout(rows: int, data_width: int = 8) -> data.StructLayout:
    """One activation row: ``rows`` raw operands, their signedness, and the tile-switch mark."""
    return data.StructLayout({
        "data":   data.ArrayLayout(unsigned(data_width), rows),
        "signed": unsigned(1),
        "switch": unsigned(1),
    })


def weight_row_layout(cols: int, data_width: int = 8) -> data.StructLayout:
    """One row of a weight tile: ``cols`` raw weights and their signedness."""
    return data.StructLayout({
        "data":   data.ArrayLayout(unsigned(data_width), cols),
        "signed": unsigned(1),
    })


def psum_row_layout(cols: int, acc_width: int = 32) -> data.ArrayLayout:
    """One output row: ``cols`` wrapped partial sums."""
    return data.ArrayLayout(signed(acc_width), cols)


def delay_line(m: Module, value, depth: int, *, name: str, reset_less: bool = False):
    """``value`` delayed by ``depth`` registers in ``m.d.sync`` (``depth`` may be 0)."""
    for index in range(depth):
        reg = Signal.like(value, name=f"{name}_d{index}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def _extend(raw, is_signed):
    """Raw operand bits to a ``width + 1``-bit signed value."""
    return Mux(is_signed, raw.as_signed(), raw)


class SystolicArray(wiring.Component):
    """``rows x cols`` grid of :class:`PE`, computing one row of ``x @ W`` per cycle.

    Activation rows (``rows`` elements, the reduction dimension) enter on ``i_act``; the
    array skews them so row ``r`` reaches the left edge ``r`` cycles after row 0, and partial
    sums flow down the columns. Output rows (``cols`` int32 sums) leave on ``o_psum``,
    de-skewed, in input order, :attr:`TPUConfig.array_latency` cycles after their input.

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

    The whole pipeline advances when ``o_psum`` is not holding an unaccepted row, so
    back-pressure on ``o_psum`` stalls the array without losing or doubling a row.

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

    def elaborate(self, platform):
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        row_bits = max(1, (rows - 1).bit_length())
        operand = signed(cfg.data_width + 1)

        m = Module()

        # Everything in `core` advances together; it stops while o_psum holds a row.
        core = Module()
        advance = Signal()
        m.d.comb += advance.eq(~self.o_psum.valid | self.o_psum.ready)
        m.submodules.core = EnableInserter(advance)(core)

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

        # Array grid.
        first_lut = rows * cols - cfg.lut_multipliers
        pes = [[PE(data_width=cfg.data_width, acc_width=cfg.acc_width, row=r,
                   row_bits=row_bits,
                   multiplier=cfg.multiplier if r * cols + c < first_lut else "lut")
                for c in range(cols)] for r in range(rows)]
        for r in range(rows):
            for c in range(cols):
                core.submodules[f"pe_{r}_{c}"] = pes[r][c]
                if "i_en" in pes[r][c].signature.members:
                    # The core's EnableInserter does not reach the registers of an
                    # instantiated DSP block: the PE takes the same enable as a port.
                    core.d.comb += pes[r][c].i_en.eq(advance)

        # Left edge: activation row r enters row r after r + 1 registers.
        for r in range(rows):
            act = Signal(operand, name=f"act_in_{r}")
            switch = Signal(name=f"switch_in_{r}")
            m.d.comb += [
                act.eq(Mux(act_take, _extend(self.i_act.payload.data[r],
                                             self.i_act.payload.signed), 0)),
                switch.eq(switch_take),
            ]
            core.d.comb += [
                pes[r][0].i_act.eq(delay_line(core, act, r + 1, name=f"act_skew_{r}",
                                              reset_less=True)),
                pes[r][0].i_switch.eq(delay_line(core, switch, r + 1,
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
                pes[0][c].i_wbus.eq(delay_line(core, bus, c + 1, name=f"wbus_skew_{c}")),
                pes[0][c].i_psum.eq(0),
            ]
            for r in range(1, rows):
                core.d.comb += [
                    pes[r][c].i_wbus.eq(pes[r - 1][c].o_wbus),
                    pes[r][c].i_psum.eq(pes[r - 1][c].o_psum),
                ]

        # Bottom edge: column c is delayed cols - 1 - c more cycles, so a whole row leaves
        # at once, cfg.array_latency cycles after its activation row was accepted.
        for c in range(cols):
            core.d.comb += self.o_psum.payload[c].eq(
                delay_line(core, pes[rows - 1][c].o_psum, cols - 1 - c,
                           name=f"psum_deskew_{c}", reset_less=True))
        valid = Signal(name="valid_in")
        m.d.comb += valid.eq(act_take)
        core.d.comb += self.o_psum.valid.eq(
            delay_line(core, valid, cfg.array_latency, name="valid_pipe"))

        return m
