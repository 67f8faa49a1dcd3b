"""A 64-bit signed product of two int32 values from four 18 x 18 multipliers."""

from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned

from hdl.lib.vendor import mult18x18d

__all__ = ["PRODUCT_STAGES", "product_32x32"]

#: Cycles from the operands to the product.
PRODUCT_STAGES = 5


def product_32x32(m: Module, t, mult, *, suffix: str, instantiate: bool) -> Signal:
    """``t * mult`` exactly (two int32, a 64-bit register), :data:`PRODUCT_STAGES` cycles
    after *t* and *mult*: the multipliers' input and output registers, the partial products
    in fabric registers (the block's output is routed far: into a register before any
    adder), the middle ones summed, then the product.

    ``t * m = t_hi m_hi 2**34 + (t_hi m_lo + t_lo m_hi) 2**17 + t_lo m_lo``: each an 18 x 18
    signed multiply (the low halves zero-extended), an ECP5 ``MULT18X18D`` with registered
    inputs and output if *instantiate*, else ``*`` between fabric registers. Every signal's
    name ends in *suffix*.
    """
    def reg(shape, name):
        return Signal(shape, name=f"{name}{suffix}", reset_less=True)

    pp = {"ll": reg(unsigned(34), "pp_ll"), "lh": reg(signed(33), "pp_lh"),
          "hl": reg(signed(33), "pp_hl"), "hh": reg(signed(30), "pp_hh")}
    mid = reg(signed(34), "mid")               # the middle partial products
    lohi = reg(signed(64), "lohi")             # the outer ones side by side
    p = reg(signed(64), "p")
    halves = {"lo": (t[0:17], mult[0:17]),
              "hi": (t[17:32].as_signed(), mult[17:32].as_signed())}
    for name, (ta, mb) in (("ll", (halves["lo"][0], halves["lo"][1])),
                           ("lh", (halves["lo"][0], halves["hi"][1])),
                           ("hl", (halves["hi"][0], halves["lo"][1])),
                           ("hh", (halves["hi"][0], halves["hi"][1]))):
        product = Signal(signed(36), name=f"prod_{name}{suffix}")
        if instantiate:
            m.submodules[f"mult_{name}{suffix}"] = mult18x18d(m, a=ta, b=mb, p=product,
                                                              ce=Const(1, 1))
        else:
            op_a = reg(signed(18), f"op_a_{name}")
            op_b = reg(signed(18), f"op_b_{name}")
            m.d.sync += [op_a.eq(ta), op_b.eq(mb), product.eq(op_a * op_b)]
        m.d.sync += pp[name].eq(product)
    m.d.sync += [
        mid.eq(pp["lh"] + pp["hl"]),
        lohi.eq(Cat(pp["ll"], pp["hh"])),      # t_lo m_lo < 2**34: no overlap
        p.eq(Cat(lohi[0:17], lohi[17:64].as_signed() + mid)),
    ]
    return p
