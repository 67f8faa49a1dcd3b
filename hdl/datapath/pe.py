"""Processing element of the weight-stationary systolic array."""

from amaranth.hdl import (
    EnableInserter,
    Module,
    Mux,
    Signal,
    signed,
    unsigned,
)
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.lib.arith import shift_add_multiply
from hdl.lib.vendor import ecp5_mult_instance, mult18x18d

__all__ = ["PE", "weight_bus_layout", "PE_MULTIPLIERS"]

#: Values of :class:`PE`'s ``multiplier``.
PE_MULTIPLIERS = ("infer", "ecp5", "lut", "ice40")


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
    the cycle after that: ``o_psum`` holds the sum :attr:`latency` = 3 cycles after the
    activation arrived, and the partial sum from the cell above must arrive
    ``latency - 1`` = 2 cycles after it. With ``pipelined`` (the fast pipeline) the routes
    into and out of the multiplier, a DSP block far from the fabric around it, get two cycles
    each: the weight the activation meets is registered in the fabric (``w_pre``),
    ``w_pipe`` and ``a_pre`` (from ``o_act``'s register) take the operands on towards the
    block, whose input registers take them one cycle later, and two fabric registers
    (``product_pipe``, ``addend``) hold the product between the block's output register and
    the adder: ``latency`` = 7, and ``i_psum`` is added 6 cycles after the activation. The
    array's skew
    provides either: the cell below gets the activation one cycle after this cell and this
    cell's ``o_psum`` one cycle after this cell's ``i_psum``, whatever ``latency`` is. The
    weight is still chosen in the cycle the activation arrives, so tile switches keep their
    timing. The sum wraps modulo
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
    multiplier : str
        How the product and its registers are built:

        - ``"infer"``: a plain ``*`` between fabric registers; synthesis maps the ``*`` to a
          combinational DSP multiplier (yosys 0.70 never packs the registers into an ECP5
          block).
        - ``"ecp5"``: an ECP5 ``MULT18X18D`` instance whose input registers are the operand
          registers and whose output register is the product register (``REG_INPUTA_CLK``,
          ``REG_INPUTB_CLK``, ``REG_OUTPUT_CLK`` = ``"CLK0"``, clock enable ``CE0`` =
          ``i_en``), with no fabric between the registers and the multiplier; the same
          cycles as ``"infer"``. Adds the ``i_en`` port.
        - ``"lut"``: the same product built from shifted partial products, which synthesis
          keeps in LUT logic (for parts with fewer DSP blocks than PEs).
        - ``"ice40"``: the product comes from outside, from a
          :class:`~hdl.datapath.dual_mult.DualMultiplier` that the array shares between two PEs (one
          iCE40 ``SB_MAC16``): the cell sends the low 8 bits of the operands on ``o_mul_a``
          and ``o_mul_w`` (int8 operands only: the core checks the instructions' ``signed``
          flags, see :attr:`hdl.config.TPUConfig.operands`) and takes the product on
          ``i_product`` two cycles later; the block's input and product registers are the
          cell's, so the timing is that of ``"infer"`` (``latency`` 3). Adds those ports.
    pipelined : bool
        Two more registers each side of the multiplier (``w_pre``, ``a_pre``, ``w_pipe``,
        ``product_pipe`` and ``addend``; ``latency`` 7) and the ``i_en`` port: the fast
        pipeline's PE. Not with ``"ice40"``, whose shared block holds the registers.

    Which circuit ``multiplier="ecp5"`` elaborates to depends on the ``platform`` it is
    elaborated for (the PE behaves the same on every path):

    - an ECP5 platform (``platform.family == "ecp5"``), for synthesis, and
      :data:`VERILOG_SIM_PLATFORM`, for Icarus and Verilator (:mod:`sim.rtl.runner` compiles
      the model ``sim/rtl/vendor/MULT18X18D.v`` with the design): the ``MULT18X18D`` instance;
    - ``None`` (``amaranth.sim``, which would silently read an instance's outputs as 0, and
      a netlist for no particular target) and ``"formal"``: fabric registers and ``*``,
      gated by ``i_en``, which is the instance's behaviour by construction (the registers
      before and after the block are in the fabric on every path);
    - any other platform: a ``ValueError`` (the part has no ``MULT18X18D``).

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
    i_en : In(1, init=1)
        Only with ``multiplier="ecp5"`` or ``pipelined``: clock enable of every register of
        the cell. An
        ``EnableInserter`` around the cell does not reach an instance's registers, so the
        enable it applies must also drive ``i_en``.
    o_mul_a, o_mul_w : Out(signed(data_width))
        Only with ``multiplier="ice40"``: the operands for the shared multiplier.
    i_product : In(signed(2 * data_width))
        Only with ``multiplier="ice40"``: their product, two cycles later.
    """

    def __init__(self, *, data_width: int = 8, acc_width: int = 32, row: int = 0,
                 row_bits: int = 1, multiplier: str = "infer", pipelined: bool = False):
        if not 0 <= row < 2 ** row_bits:
            raise ValueError(f"PE row={row} does not fit row_bits={row_bits}")
        if multiplier not in PE_MULTIPLIERS:
            raise ValueError(f"PE multiplier={multiplier!r} is not supported; allowed: "
                             + ", ".join(repr(value) for value in PE_MULTIPLIERS))
        if multiplier == "ecp5" and 2 * (data_width + 1) > 18:
            raise ValueError(f"PE multiplier='ecp5' takes operands of up to 8 bits (9 after "
                             f"extension, an 18-bit product), not data_width={data_width}")
        if pipelined and multiplier == "ice40":
            raise ValueError("PE pipelined=True is not supported with multiplier='ice40' (the "
                             "shared SB_MAC16 holds the operand and product registers); "
                             "allowed: 'infer', 'ecp5' or 'lut'")
        self.data_width = data_width
        self.acc_width = acc_width
        self.row = row
        self.multiplier = multiplier
        self.pipelined = pipelined
        operand = signed(data_width + 1)
        bus = weight_bus_layout(data_width=data_width, row_bits=row_bits)
        members = {
            "i_act":    In(operand),
            "i_switch": In(1),
            "i_wbus":   In(bus),
            "i_psum":   In(signed(acc_width)),
            "o_act":    Out(operand),
            "o_switch": Out(1),
            "o_wbus":   Out(bus),
            "o_psum":   Out(signed(acc_width)),
        }
        if pipelined or multiplier == "ecp5":
            members["i_en"] = In(1, init=1)
        if multiplier == "ice40":
            members["o_mul_a"] = Out(signed(data_width))
            members["o_mul_w"] = Out(signed(data_width))
            members["i_product"] = In(signed(2 * data_width))
        super().__init__(members)

    @property
    def latency(self) -> int:
        """Cycles from an activation on ``i_act`` to ``o_psum`` holding its sum (3; 7 with
        ``pipelined``); ``i_psum`` is added ``latency - 1`` cycles after it."""
        return 7 if self.pipelined else 3

    @property
    def use_dsp(self) -> bool:
        """Whether the product comes from a DSP block (``multiplier`` is not ``"lut"``)."""
        return self.multiplier != "lut"

    def elaborate(self, platform):
        instantiate = self.multiplier == "ecp5" and ecp5_mult_instance(platform)
        m = Module()

        operand = signed(self.data_width + 1)
        product_shape = signed(2 * (self.data_width + 1))
        active = Signal(operand, reset_less=True)
        shadow = Signal(operand, reset_less=True)
        act = Signal(operand, reset_less=True)
        psum = Signal(signed(self.acc_width), reset_less=True)
        weight = Mux(self.i_switch, shadow, active)     # what the arriving activation meets

        if self.pipelined:
            # Register to register into the block: the weight select (a LUT after the
            # neighbour's o_switch) and the route to the DSP site do not fit one cycle
            # together, and the route alone is long: w_pre, and a_pre and w_pipe (which take
            # the operands only to the block, so the placer can put them half way) split it.
            w_pre = Signal(operand, reset_less=True)
            a_pre = Signal(operand, reset_less=True)
            w_pipe = Signal(operand, reset_less=True)
            m.d.sync += [w_pre.eq(weight), a_pre.eq(act), w_pipe.eq(w_pre)]
            a_in, w_in = a_pre, w_pipe
        else:
            a_in, w_in = self.i_act, weight

        if self.multiplier == "ice40":
            # Operand and product registers in the shared SB_MAC16 (the array's).
            product = self.i_product
            m.d.comb += [self.o_mul_a.eq(a_in[:self.data_width]),
                         self.o_mul_w.eq(w_in[:self.data_width])]
        elif instantiate:
            # The block's A/B input registers are the operand registers, its output register
            # the product register; CE0 gates all three.
            product = Signal(product_shape)
            m.submodules.mult = mult18x18d(m, a=a_in, b=w_in, p=product, ce=self.i_en)
        else:
            a = Signal(operand, reset_less=True)        # multiplier operands
            w = Signal(operand, reset_less=True)
            product = Signal(product_shape, reset_less=True)
            m.d.sync += [
                a.eq(a_in),
                w.eq(w_in),
                product.eq(shift_add_multiply(m, a, w) if self.multiplier == "lut"
                           else a * w),
            ]

        if self.pipelined:
            # The block's P output reaches the fabric late: product_pipe, which only takes
            # the product on, and addend keep that route in two cycles and the carry chain
            # in a third.
            product_pipe = Signal(product_shape, reset_less=True)
            addend = Signal(product_shape, reset_less=True)
            m.d.sync += [product_pipe.eq(product), addend.eq(product_pipe)]
        else:
            addend = product
        m.d.sync += [
            psum.eq(self.i_psum + addend),
            act.eq(self.i_act),
            self.o_switch.eq(self.i_switch),
            self.o_wbus.eq(self.i_wbus),
        ]
        m.d.comb += [self.o_act.eq(act), self.o_psum.eq(psum)]
        with m.If(self.i_switch):
            m.d.sync += active.eq(shadow)
        with m.If(self.i_wbus.valid & (self.i_wbus.row == self.row)):
            m.d.sync += shadow.eq(self.i_wbus.data)

        if "i_en" in self.signature.members:
            return EnableInserter(self.i_en)(m)
        return m
