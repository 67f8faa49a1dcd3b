"""Processing element of the weight-stationary systolic array."""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PE", "weight_bus_layout"]


def weight_bus_layout(*, data_width: int = 8, row_bits: int = 1) -> data.StructLayout:
    """One weight travelling down a column: the row it is for and its extended value."""
    return data.StructLayout({
        "valid": unsigned(1),
        "row":   unsigned(row_bits),
        "data":  signed(data_width + 1),
    })


class PE(wiring.Component):
    """Weight-stationary multiply-accumulate cell.

    Operands are ``data_width``-bit integers, signed or unsigned, which the array edges extend
    to ``data_width + 1``-bit signed values, so one signed multiplier (9 x 9 -> 18 bits, one
    DSP multiplier on ECP5 and iCE40) serves all four signedness combinations.

    The cell holds two weights: the *active* weight it multiplies with and a *shadow* weight
    that the next tile is shifted into while the current tile computes. ``i_switch`` travels
    with the activation it marks: for that activation the cell multiplies with the shadow
    weight and copies it into the active register, so each cell switches tiles exactly when
    the first activation of the new tile reaches it and no cycle is lost.

    Weights for the shadow register travel down the column on a bus; the cell latches the
    one whose ``row`` equals its own ``row`` and passes every weight on.

    Timing (all outputs registered): the activation and the weight it meets are registered
    as the multiplier's operands in the cycle the activation arrives (so the weight select
    and the multiplier are in different cycles, and the operand and product registers can
    sit inside the DSP block), the product one cycle later, and ``o_psum = i_psum + product``
    the cycle after that; so the partial sum from the cell above must arrive two cycles after
    this cell's activation, which is what the array's skew provides. The sum wraps modulo
    ``2**acc_width`` (two's complement), as the golden model does. Datapath registers have
    no reset (the interlocks never let a value from before a reset be used), which keeps the
    reset net off the DSP blocks and thousands of flip-flops.

    Parameters
    ----------
    data_width : int
        Operand width before extension (8).
    acc_width : int
        Partial-sum width (32).
    row : int
        Index of the cell's row, compared with the weight bus's ``row`` field.
    row_bits : int
        Width of the weight bus's ``row`` field.
    use_dsp : bool
        ``True``: a plain ``*`` that synthesis maps to a DSP multiplier. ``False``: the same
        product built from shifted partial products, which synthesis keeps in LUT logic (for
        parts with fewer DSP blocks than PEs).

    Members
    -------
    i_act : In(signed(data_width + 1))
        Activation from the left; passed to ``o_act`` one cycle later.
    i_switch : In(1)
        Marks ``i_act`` as the first activation of a new weight tile.
    i_wbus : In(weight_bus_layout)
        Weight from above; passed to ``o_wbus`` one cycle later.
    i_psum : In(signed(acc_width))
        Partial sum from above.
    o_act, o_switch, o_wbus : Out
        The registered inputs, for the cell to the right (act, switch) and below (wbus).
    o_psum : Out(signed(acc_width))
        Partial sum for the cell below.
    """

    def __init__(self, *, data_width: int = 8, acc_width: int = 32, row: int = 0,
                 row_bits: int = 1, use_dsp: bool = True):
        if not 0 <= row < 2 ** row_bits:
            raise ValueError(f"PE row={row} does not fit row_bits={row_bits}")
        self.data_width = data_width
        self.acc_width = acc_width
        self.row = row
        self.use_dsp = use_dsp
        operand = signed(data_width + 1)
        bus = weight_bus_layout(data_width=data_width, row_bits=row_bits)
        super().__init__({
            "i_act":    In(operand),
            "i_switch": In(1),
            "i_wbus":   In(bus),
            "i_psum":   In(signed(acc_width)),
            "o_act":    Out(operand),
            "o_switch": Out(1),
            "o_wbus":   Out(bus),
            "o_psum":   Out(signed(acc_width)),
        })

    def elaborate(self, platform):
        m = Module()

        operand = signed(self.data_width + 1)
        active = Signal(operand, reset_less=True)
        shadow = Signal(operand, reset_less=True)
        a = Signal(operand, reset_less=True)            # multiplier operands
        w = Signal(operand, reset_less=True)
        product = Signal(signed(2 * (self.data_width + 1)), reset_less=True)
        act = Signal(operand, reset_less=True)
        psum = Signal(signed(self.acc_width), reset_less=True)

        m.d.sync += [
            a.eq(self.i_act),
            w.eq(Mux(self.i_switch, shadow, active)),
            product.eq(a * w if self.use_dsp else _shift_add_multiply(a, w)),
            psum.eq(self.i_psum + product),
            act.eq(self.i_act),
            self.o_switch.eq(self.i_switch),
            self.o_wbus.eq(self.i_wbus),
        ]
        m.d.comb += [self.o_act.eq(act), self.o_psum.eq(psum)]
        with m.If(self.i_switch):
            m.d.sync += active.eq(shadow)
        with m.If(self.i_wbus.valid & (self.i_wbus.row == self.row)):
            m.d.sync += shadow.eq(self.i_wbus.data)

        return m


def _shift_add_multiply(a, b):
    """Signed ``a * b`` as a sum of shifted partial products (two's complement: the sign bit
    of ``a`` weighs ``-2**(n-1)``), so that synthesis does not infer a DSP multiplier."""
    width = len(a)
    partials = [Mux(a[i], b << i, 0) for i in range(width - 1)]
    result = sum(partials[1:], partials[0])
    return result - Mux(a[width - 1], b << (width - 1), 0)
