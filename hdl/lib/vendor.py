"""Vendor primitives: when a block instantiates one, and the ECP5 ``MULT18X18D``."""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Signal, signed

__all__ = ["VERILOG_SIM_PLATFORM", "vendor_instance", "ecp5_mult_instance", "mult18x18d"]


#: The ``platform`` that :func:`sim.rtl.verilog.generate` elaborates designs with: Verilog for
#: Icarus or Verilator, which have simulation models of the vendor primitives
#: (``sim/rtl/vendor/``), so the PE instantiates them there as on the part.
VERILOG_SIM_PLATFORM = "verilog-sim"


def vendor_instance(platform, family: str, what: str) -> bool:
    """Whether a block built on a *family* primitive instantiates it for *platform*: on a
    *family* platform (``platform.family``) and :data:`VERILOG_SIM_PLATFORM` (which has the
    simulation models), not for ``None`` (``amaranth.sim``) or ``"formal"`` (the block's
    fabric registers instead). Raises for any other platform, naming *what* the block
    instantiates."""
    if platform is None or platform == "formal":
        return False
    if platform == VERILOG_SIM_PLATFORM or getattr(platform, "family", None) == family:
        return True
    name = platform if isinstance(platform, str) else type(platform).__name__
    raise ValueError(f"{what}, which platform {name!r} does not have; allowed: an {family} "
                     f"platform, {VERILOG_SIM_PLATFORM!r}, 'formal' or None")


def ecp5_mult_instance(platform) -> bool:
    """Whether ``multiplier="ecp5"`` instantiates the ``MULT18X18D`` for *platform* (see
    :class:`hdl.datapath.pe.PE`); raises for a platform whose part has none."""
    return vendor_instance(platform, "ecp5",
                           "PE multiplier='ecp5' instantiates an ECP5 MULT18X18D")


def mult18x18d(m: Module, *, a, b, p, ce) -> Instance:
    """An ECP5 ``MULT18X18D`` computing ``p = a * b`` (signed, operands sign-extended to 18
    bits, ``p`` from the low bits of the product) with registered inputs and output on the
    ``sync`` clock, enabled by *ce*. The port and parameter names are those of yosys's
    ``share/ecp5/cells_bb.v``, which nextpnr-ecp5 reads: every bus is one port per bit."""
    a18 = Signal(signed(18), name="mult_a")
    b18 = Signal(signed(18), name="mult_b")
    p36 = Signal(36, name="mult_p")
    m.d.comb += [a18.eq(a), b18.eq(b), p.eq(p36[:len(p)])]
    ports = {}
    for index in range(18):
        ports[f"i_A{index}"] = a18[index]
        ports[f"i_B{index}"] = b18[index]
        ports[f"i_C{index}"] = Const(0, 1)
    for index in range(36):
        ports[f"o_P{index}"] = p36[index]
    return Instance(
        "MULT18X18D",
        # nextpnr-ecp5 times MULT18X18D registers only on CLK0, and reads REG_INPUTA_CLK,
        # REG_INPUTB_CLK and REG_OUTPUT_CLK to pick its timing model (all three: REGS_ALL).
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK="CLK0", p_REG_INPUTB_CE="CE0", p_REG_INPUTB_RST="RST0",
        p_REG_OUTPUT_CLK="CLK0", p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_REG_PIPELINE_CLK="NONE", p_REG_INPUTC_CLK="NONE",
        i_SIGNEDA=Const(1, 1), i_SIGNEDB=Const(1, 1),
        i_SOURCEA=Const(0, 1), i_SOURCEB=Const(0, 1),
        i_CLK0=ClockSignal("sync"), i_CE0=ce, i_RST0=Const(0, 1),
        **ports,
    )
