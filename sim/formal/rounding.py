"""Proof of the activation unit's rounding stages (:func:`hdl.datapath.rounding.rounding_shift`)
against the rounding modes' definitions written as wide arithmetic.

For any 64-bit product ``p`` and any column controls (held, as the parameter store holds them
while rows are in flight), three cycles after ``p`` enters: ``r + carry`` (``r`` registered a
cycle later, as the unit uses it) equals

- HALF_UP: ``floor((p + 2**(s-1)) / 2**s)``;
- HALF_EVEN: ``floor(p / 2**s)``, plus one above a half, or at a half with an odd floor;
- DOUBLE: HALF_UP for ``s <= 31``, else gemmlowp's ``RoundingDivideByPOT(r1, s - 31)`` of
  ``r1 = floor((p + 2**30) / 2**31)``, as TFLite's reference kernels compute it
  (:func:`sim.models.golden.rounding_shift`; tests/sim/test_rounding.py checks that against
  gemmlowp's integer code).

The model is not the RTL's closed form (one carry from the shifted-out bits): it computes the
two roundings one after the other, with variable shifts on 66- and 130-bit values.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.datapath.rounding import rounding_controls, rounding_shift
from sim.formal.harness import Harness, Inside, past

__all__ = ["RoundingStages", "rounding_harness"]


class RoundingStages(wiring.Component):
    """:func:`rounding_shift` on ports: ``o_r`` and ``o_carry`` three cycles after ``i_p``."""

    def __init__(self, *, bug: bool = False):
        self.bug = bug
        super().__init__({
            "i_p":     In(signed(64)),
            "i_ctl":   In(rounding_controls()),
            "o_r":     Out(signed(64)),
            "o_carry": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ctl = self.i_ctl
        _, r, carry = rounding_shift(m, self.i_p, ctl, ctl, ctl, suffix="")
        m.d.sync += self.o_r.eq(r)
        m.d.comb += self.o_carry.eq(carry ^ self.bug)
        return m


def _spec(p, ctl) -> tuple:
    """``(half_up, half_even, double)`` of *p* at ``ctl.shift``, as wide arithmetic."""
    s = ctl.shift
    x = p.as_signed()
    x66 = Signal(signed(66), name="spec_p")
    half = Signal(signed(66), name="spec_half")
    up = Signal(signed(66), name="spec_up")
    floor = Signal(signed(66), name="spec_floor")
    twice_rem = Signal(signed(132), name="spec_twice_rem")
    unit = Signal(signed(132), name="spec_unit")
    even = Signal(signed(66), name="spec_even")
    r1 = Signal(signed(66), name="spec_r1")
    e = Signal(6, name="spec_e")
    mask = Signal(signed(66), name="spec_mask")
    second = Signal(signed(66), name="spec_second")
    assigns = [
        x66.eq(x),
        half.eq((Const(1, signed(66)) << s) >> 1),
        up.eq((x66 + half) >> s),
        floor.eq(x66 >> s),
        twice_rem.eq((x66 - (floor << s)) << 1),
        unit.eq(Const(1, signed(66)) << s),
        even.eq(floor + Mux(s == 0, 0,
                            (twice_rem > unit) | ((twice_rem == unit) & floor[0]))),
        r1.eq((x66 + (1 << 30)) >> 31),
        e.eq(s - 31),
        mask.eq((Const(1, signed(66)) << e) - 1),
        second.eq((r1 >> e) + ((r1 & mask) > ((mask >> 1) + (r1 < 0)))),
    ]
    double = Mux(s <= 31, up, second)
    return assigns, up, even, double


def rounding_harness(*, bug: bool = False) -> Harness:
    """Harness proving :class:`RoundingStages` (see the module docstring). ``bug`` inverts
    the carry: the proof must fail (for the tests)."""

    def properties(m: Module, dut: RoundingStages, inside: Inside) -> None:
        ctl = dut.i_ctl
        # The controls as the unit decodes them, held while the rows are in flight.
        held = past(m, ctl.as_value(), name="ctl_before")
        started = Signal(2, name="age", init=0)
        with m.If(started != 3):
            m.d.sync += started.eq(started + 1)
        m.d.comb += [
            Assume(ctl.two_step == (ctl.double & ctl.shift[5])),
            Assume(~(ctl.even & ctl.double)),
        ]
        with m.If(started != 0):
            m.d.comb += Assume(ctl.as_value() == held)
        p3 = dut.i_p
        for k in range(3):
            p3 = past(m, p3, name=f"p_{k + 1}")
        assigns, up, even, double = _spec(p3, ctl)
        m.d.comb += assigns
        want = Mux(ctl.double, double, Mux(ctl.even, even, up))
        got = Signal(signed(66), name="got")
        m.d.comb += got.eq(dut.o_r + dut.o_carry)
        with m.If(started == 3):
            m.d.comb += Assert(got == want, "r + carry is the rounding mode's result")

    return Harness(RoundingStages(bug=bug), properties)
