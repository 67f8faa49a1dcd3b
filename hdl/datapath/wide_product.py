"""The activation unit's first steps, ``t = wrap32(acc + bias)`` and the exact 64-bit
``t * multiplier``, from four 18 x 18 multipliers."""

from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned

from hdl.lib.vendor import mult18x18d

__all__ = ["biased_product"]


def biased_product(m: Module, acc, bias, mult, *, suffix: str, instantiate: bool) -> Signal:
    """``wrap32(acc + bias) * mult`` exactly (int32 operands, a 64-bit register), 7 cycles
    after *acc* (the sum registered, the bias added, the multipliers' input and output
    registers, the partial products, their middle sum, the product), with *bias* read a
    cycle and *mult* two cycles after it.

    ``t * m = t_hi m_hi 2**34 + (t_hi m_lo + t_lo m_hi) 2**17 + t_lo m_lo``: each an 18 x 18
    signed multiply (the low halves zero-extended), an ECP5 ``MULT18X18D`` with registered
    inputs and output if *instantiate*, else ``*`` between fabric registers; each product is
    routed far from its block, so it goes into a register before any adder. Every signal's
    name ends in *suffix*.
    """
    def reg(shape, name):
        return Signal(shape, name=f"{name}{suffix}", reset_less=True)

    a = reg(signed(32), "acc")                 # s1: the sum as it arrived
    t = reg(signed(32), "t")                   # s2: + bias, wrapped
    pp_ll = reg(unsigned(34), "pp_ll")         # s5: the four partial products
    pp_lh = reg(signed(33), "pp_lh")
    pp_hl = reg(signed(33), "pp_hl")
    pp_hh = reg(signed(30), "pp_hh")
    mid = reg(signed(34), "mid")               # s6: the middle partial products
    lohi = reg(signed(64), "lohi")             #     the outer ones side by side
    p = reg(signed(64), "p")                   # s7: the exact product
    halves = {"lo": (t[0:17], mult[0:17]),
              "hi": (t[17:32].as_signed(), mult[17:32].as_signed())}
    for name, target, (ta, mb) in (("ll", pp_ll, (halves["lo"][0], halves["lo"][1])),
                                   ("lh", pp_lh, (halves["lo"][0], halves["hi"][1])),
                                   ("hl", pp_hl, (halves["hi"][0], halves["lo"][1])),
                                   ("hh", pp_hh, (halves["hi"][0], halves["hi"][1]))):
        product = Signal(signed(36), name=f"prod_{name}{suffix}")
        if instantiate:
            m.submodules[f"mult_{name}{suffix}"] = mult18x18d(m, a=ta, b=mb, p=product,
                                                              ce=Const(1, 1))
        else:
            op_a = reg(signed(18), f"op_a_{name}")
            op_b = reg(signed(18), f"op_b_{name}")
            m.d.sync += [op_a.eq(ta), op_b.eq(mb), product.eq(op_a * op_b)]
        m.d.sync += target.eq(product)
    m.d.sync += [
        a.eq(acc),
        t.eq(a + bias),
        mid.eq(pp_lh + pp_hl),
        lohi.eq(Cat(pp_ll, pp_hh)),            # t_lo m_lo < 2**34: no overlap
        p.eq(Cat(lohi[0:17], lohi[17:64].as_signed() + mid)),
    ]
    return p
