"""The activation unit's rounding shift: ``p / 2**shift`` rounded to an integer in one of
the three :class:`~hdl.isa.Rounding` modes, in three register stages."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data

__all__ = ["rounding_controls", "rounding_shift"]


#: What each column's rounding stages read from its parameters (decoded once a slot is
#: presented, so that no stage compares the mode or the shift).
def rounding_controls() -> data.StructLayout:
    return data.StructLayout({
        "shift":    6,
        "even":     1,      # HALF_EVEN
        "double":   1,      # DOUBLE: bits 0-29 never decide a tie (see below)
        "two_step": 1,      # DOUBLE with shift >= 32: the second rounding exists
    })


def _any_below(m: Module, chunks, part, coarse_bits, hi, lo, name: str) -> Signal:
    """A register: whether any bit of a 64-bit value below bit ``8 * hi + lo - 1`` is set,
    from its byte reductions ``chunks``, ``part`` (the reduction of its bits ``8 * hi - 8``
    to ``8 * hi - 2``) and ``coarse_bits`` (its bits from ``8 * hi`` on)."""
    whole = Cat(*(Cat(*chunks[:h]).any() if h else Const(0) for h in range(8)))
    whole_but_one = Cat(*(Cat(*chunks[:h - 1], part).any() if h else Const(0)
                          for h in range(8)))
    coarse_part = Cat(*(coarse_bits[:k - 1].any() if k > 1 else Const(0) for k in range(8)))
    flag = Signal(name=name, reset_less=True)
    m.d.sync += flag.eq(Mux(lo == 0, whole_but_one.bit_select(hi, 1),
                            whole.bit_select(hi, 1) | coarse_part.bit_select(lo, 1)))
    return flag


def rounding_shift(m: Module, p: Value, hi_ctl, lo_ctl, ctl, *, suffix: str):
    """``(coarse, r, carry)``: ``r = p >> shift`` (arithmetic, 64 bits) two cycles after *p*
    (``coarse = p >> 8 * shift[3:6]`` a cycle after *p*) and the
    rounding increment ``carry`` a cycle after that, so that the rounded value is
    ``r + carry``, exactly as :func:`sim.models.golden.rounding_shift`:

    - HALF_UP: ``carry = b``, the bit under the shift (``p[shift - 1]``, 0 for shift 0);
    - HALF_EVEN: ``carry = b & (s | r[0])``, ``s`` any bit below ``b`` set (the rest is not
      exactly a half) and ``r[0]`` odd;
    - DOUBLE with ``shift >= 32``: TFLite's two roundings, first at ``2**31`` (ties up), then
      at ``2**(shift - 31)`` (ties away from zero), are one: with ``n = p < -2**30`` (the
      first rounding's result is negative) and ``B`` the bits 30 to ``shift - 2``,
      ``carry = n ? b & any(B) : b | all(B)`` (``floor((floor(x / 2**31) + c) / 2**e) =
      floor((x + c 2**31) / 2**(31 + e))``: the two roundings' constants add up, see
      docs/isa.md); below 32, DOUBLE is HALF_UP.

    *hi_ctl*, *lo_ctl* and *ctl* are registered copies of the column's
    :func:`rounding_controls` (for the coarse shift, the fine shift and the rest: each drives
    many multiplexers). ``r`` is a register; ``carry`` is too.
    """
    def reg(shape, name):
        return Signal(shape, name=f"{name}{suffix}", reset_less=True)

    # s8: the coarse shift by 8 * shift[3:6], the bit under it, and the reductions the sticky
    # flags need: the bytes of p (bits 0-29 masked for DOUBLE) and of ~p (bits 0-29 masked),
    # and the 7 bits under the coarse shift's bit of each.
    coarse = reg(signed(64), "coarse")
    below = reg(1, "below")
    negative_big = reg(1, "n")                  # p < -2**30
    x_any = Cat(p[:30] & ~ctl.double.replicate(30), p[30:])
    x_all = Cat(Const(0, 30), ~p[30:])
    any_bytes = [reg(1, f"any_byte{i}") for i in range(8)]
    all_bytes = [reg(1, f"nall_byte{i}") for i in range(8)]
    any_part = reg(1, "any_part")
    all_part = reg(1, "nall_part")
    shift_hi = hi_ctl.shift[3:6]
    for i in range(8):
        m.d.sync += [any_bytes[i].eq(x_any[8 * i:8 * i + 8].any()),
                     all_bytes[i].eq(x_all[8 * i:8 * i + 8].any())]
    with m.Switch(shift_hi):
        for k in range(8):
            with m.Case(k):
                m.d.sync += [coarse.eq(p >> (8 * k)),
                             below.eq(p[8 * k - 1] if k else 0),
                             any_part.eq(x_any[8 * k - 8:8 * k - 1].any() if k else 0),
                             all_part.eq(x_all[8 * k - 8:8 * k - 1].any() if k else 0)]
    m.d.sync += negative_big.eq(p[63] & ~p[30:].all())

    # s9: the fine shift, the bit under the shift (b) and the two sticky flags: any bit of
    # x_any, of x_all, under b. Above bit 29 the masks are gone and the coarse value's own bits
    # are p's (DOUBLE's second rounding needs shift >= 32, so its coarse shift is >= 32).
    r = reg(signed(64), "r")
    b = reg(1, "b")
    shift_lo = lo_ctl.shift[0:3]
    with m.Switch(shift_lo):
        for k in range(8):
            with m.Case(k):
                m.d.sync += [r.eq(coarse >> k), b.eq(coarse[k - 1] if k else below)]
    # (The parameters hold while rows are in flight: the stages read the same copy.)
    s_any = _any_below(m, any_bytes, any_part, coarse, ctl.shift[3:6], ctl.shift[0:3],
                       f"sticky_any{suffix}")
    s_all = _any_below(m, all_bytes, all_part, ~coarse, ctl.shift[3:6], ctl.shift[0:3],
                       f"sticky_nall{suffix}")
    n9 = reg(1, "n_s9")
    m.d.sync += n9.eq(negative_big)

    # s10: the increment.
    carry = reg(1, "carry")
    m.d.sync += carry.eq(Mux(ctl.two_step,
                             Mux(n9, b & s_any, b | ~s_all),
                             Mux(ctl.even, b & (s_any | r[0]), b)))
    return coarse, r, carry
