"""Two signed 8 x 8 products in one iCE40 ``SB_MAC16`` (its dual 8x8 mode)."""

from amaranth.hdl import Cat, ClockSignal, Const, EnableInserter, Instance, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.lib.vendor import vendor_instance

__all__ = ["DualMultiplier", "SB_MAC16_PARAMS"]

#: The ``SB_MAC16`` parameters :class:`DualMultiplier` instantiates (names and widths of
#: yosys's ``share/ice40/cells_sim.v``): both 8x8 multipliers signed, inputs and products
#: registered, the products on the outputs; the 16x16 pipeline, the C/D registers and the
#: adders unused.
SB_MAC16_PARAMS = {
    "NEG_TRIGGER": Const(0, 1), "C_REG": Const(0, 1), "A_REG": Const(1, 1),
    "B_REG": Const(1, 1), "D_REG": Const(0, 1), "TOP_8x8_MULT_REG": Const(1, 1),
    "BOT_8x8_MULT_REG": Const(1, 1), "PIPELINE_16x16_MULT_REG1": Const(0, 1),
    "PIPELINE_16x16_MULT_REG2": Const(0, 1), "TOPOUTPUT_SELECT": Const(2, 2),
    "TOPADDSUB_LOWERINPUT": Const(0, 2), "TOPADDSUB_UPPERINPUT": Const(0, 1),
    "TOPADDSUB_CARRYSELECT": Const(0, 2), "BOTOUTPUT_SELECT": Const(2, 2),
    "BOTADDSUB_LOWERINPUT": Const(0, 2), "BOTADDSUB_UPPERINPUT": Const(0, 1),
    "BOTADDSUB_CARRYSELECT": Const(0, 2), "MODE_8x8": Const(1, 1), "A_SIGNED": Const(1, 1),
    "B_SIGNED": Const(1, 1),
}

class DualMultiplier(wiring.Component):
    """``o_p0 = i_a0 * i_b0`` and ``o_p1 = i_a1 * i_b1`` (int8 x int8 -> int16), two enabled
    cycles after the operands: the operands are registered, then the products.

    On an iCE40 (``platform.family == "iCE40"``) and for Icarus/Verilator
    (``platform="verilog-sim"``, with the model ``sim/rtl/vendor/SB_MAC16.v``) this is one
    ``SB_MAC16`` in its dual 8x8 mode (:data:`SB_MAC16_PARAMS`): ``A = {a1, a0}``,
    ``B = {b1, b0}``, ``O[15:0]`` the low product and ``O[31:16]`` the high one, its input and
    product registers enabled by ``CE`` = ``i_en``. The block's signedness is set for all of
    it (``A_SIGNED``, ``B_SIGNED``): both products are signed 8 x 8, so a core built on it
    takes int8 operands only (:attr:`hdl.config.TPUConfig.operands`). Elsewhere
    (``amaranth.sim``, ``"formal"``, a netlist for no part): the same registers and ``*`` in
    the fabric, gated by ``i_en``. Any other platform is refused.

    Members
    -------
    i_a0, i_b0, i_a1, i_b1 : In(signed(8))
        Operands.
    o_p0, o_p1 : Out(signed(16))
        Products.
    i_en : In(1, init=1)
        Clock enable of every register (an ``EnableInserter`` does not reach an instance's
        registers: drive this port instead).
    """

    def __init__(self):
        super().__init__({
            "i_a0": In(signed(8)), "i_b0": In(signed(8)),
            "i_a1": In(signed(8)), "i_b1": In(signed(8)),
            "o_p0": Out(signed(16)), "o_p1": Out(signed(16)),
            "i_en": In(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        if vendor_instance(platform, "iCE40",
                           "DualMultiplier instantiates an iCE40 SB_MAC16"):
            out = Signal(32, name="mac_o")
            zero16, zero = Const(0, 16), Const(0, 1)
            m.submodules.mac = Instance(
                "SB_MAC16",
                **{f"p_{name}": value for name, value in SB_MAC16_PARAMS.items()},
                i_CLK=ClockSignal("sync"), i_CE=self.i_en,
                i_A=Cat(self.i_a0, self.i_a1), i_B=Cat(self.i_b0, self.i_b1),
                i_C=zero16, i_D=zero16,
                **{f"i_{name}": zero for name in (
                    "AHOLD", "BHOLD", "CHOLD", "DHOLD", "IRSTTOP", "IRSTBOT", "ORSTTOP",
                    "ORSTBOT", "OLOADTOP", "OLOADBOT", "ADDSUBTOP", "ADDSUBBOT", "OHOLDTOP",
                    "OHOLDBOT", "CI", "ACCUMCI", "SIGNEXTIN")},
                o_O=out,
            )
            m.d.comb += [self.o_p0.eq(out[:16]), self.o_p1.eq(out[16:])]
            return m
        regs = Module()
        a0, b0, a1, b1 = (Signal(signed(8), name=name, reset_less=True)
                          for name in ("a0", "b0", "a1", "b1"))
        p0, p1 = (Signal(signed(16), name=name, reset_less=True) for name in ("p0", "p1"))
        regs.d.sync += [a0.eq(self.i_a0), b0.eq(self.i_b0), a1.eq(self.i_a1),
                        b1.eq(self.i_b1), p0.eq(a0 * b0), p1.eq(a1 * b1)]
        regs.d.comb += [self.o_p0.eq(p0), self.o_p1.eq(p1)]
        m.submodules.regs = EnableInserter(self.i_en)(regs)
        return m

