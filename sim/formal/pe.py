"""Proof of the processing element (:class:`hdl.datapath.pe.PE`) against a shadow model.

Contract, from the PE's docstring, checked on the ports every cycle:

- ``o_psum(t) == i_psum(t-1) + a(t-L) * w(t-L)``, truncated to ``acc_width`` bits (wrap
  modulo ``2**acc_width``), where ``L`` is the PE's ``latency`` (3; 7 with
  ``multiplier="ecp5"``), ``a(t-L)`` is the activation that arrived ``L`` cycles earlier
  and ``w(t-L)`` the weight it met: the shadow weight if ``i_switch`` marked it, else the
  active weight (operands registered, product registered, sum the cycle after; with
  ``"ecp5"`` the activation and the weight registered twice more before the operand
  registers and the product twice more after its register);
- the active weight becomes the shadow weight on a marked activation and never changes
  otherwise; the shadow weight is the last bus weight tagged with the cell's row;
- ``o_act``, ``o_switch``, ``o_wbus`` are the inputs one cycle later.

With ``multiplier="ecp5"`` (elaborated for ``"formal"``: the block's registers in the fabric,
as :class:`hdl.datapath.pe.PE` documents) the free ``i_en`` stops every register: "cycles" above are
the cycles with ``i_en`` high, and the model's registers advance only in those.

The model keeps its own active and shadow weights; auxiliary invariants tie them (and the
multiplier's weight operand) to the PE's registers so that k-induction closes. The reset is
free (``reset="any"``): the properties hold across a reset at any time.
"""

from __future__ import annotations

from amaranth.hdl import Assert, EnableInserter, Module, Mux, Signal, Value, signed

from hdl.datapath.pe import PE
from sim.formal.harness import Harness, Inside

__all__ = ["pe_harness"]


def _past(m: Module, value, cycles: int, *, name: str, reset_less: bool) -> list[Value]:
    """*value* as it was 1, 2, ... *cycles* cycles ago (registers added to *m*)."""
    past = []
    for index in range(cycles):
        reg = Signal.like(value, name=f"{name}_{index + 1}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        past.append(value := reg)
    return past


def pe_harness(*, data_width: int = 8, acc_width: int = 32, row: int = 1, row_bits: int = 2,
               multiplier: str = "infer", pipelined: bool = False, model_bug: bool = False,
               invariants: bool = True) -> Harness:
    """Harness proving :class:`PE` (see the module docstring).

    Parameters
    ----------
    data_width, acc_width, row, row_bits, multiplier, pipelined
        The PE's parameters.
    model_bug : bool
        Deliberately wrong model (adds 1 to the sum): the proof must fail. For the tests.
    invariants : bool
        ``False`` leaves out the invariants on the internal state: the contract still holds,
        but k-induction cannot close (the active weight can hide for any number of cycles).
        For the tests.
    """
    dut = PE(data_width=data_width, acc_width=acc_width, row=row, row_bits=row_bits,
             multiplier=multiplier, pipelined=pipelined)
    operand = signed(data_width + 1)
    latency = dut.latency

    def properties(harness: Module, pe: PE, inside: Inside) -> None:
        # The model's registers advance with the PE's (every cycle but with "ecp5"'s i_en).
        m = Module()
        if "i_en" in pe.signature.members:
            harness.submodules.model = EnableInserter(pe.i_en)(m)
        else:
            harness.submodules.model = m
        # Shadow model of the two weight registers (no reset, like the PE's).
        active = Signal(operand, name="model_active", reset_less=True)
        shadow = Signal(operand, name="model_shadow", reset_less=True)
        weight = Signal(operand, name="model_weight")     # what the arriving activation meets
        m.d.comb += weight.eq(Mux(pe.i_switch, shadow, active))
        with m.If(pe.i_switch):
            m.d.sync += active.eq(shadow)
        with m.If(pe.i_wbus.valid & (pe.i_wbus.row == row)):
            m.d.sync += shadow.eq(pe.i_wbus.data)

        # Contract on the ports.
        acts = _past(m, pe.i_act, latency, name="past_act", reset_less=True)
        weights = _past(m, weight, latency, name="past_weight", reset_less=True)
        [psum_1] = _past(m, pe.i_psum, 1, name="past_psum", reset_less=True)
        expected = Signal(signed(acc_width), name="expected_psum")
        # Assigning to acc_width bits truncates: the wrap modulo 2**acc_width.
        m.d.comb += expected.eq(psum_1 + acts[-1] * weights[-1] + (1 if model_bug else 0))
        m.d.comb += Assert(pe.o_psum == expected,
                           f"o_psum = i_psum + a * w, {latency}-cycle timing")
        # o_switch and o_wbus reset with the PE, so their past copies do too.
        [switch_1] = _past(m, pe.i_switch, 1, name="past_switch", reset_less=False)
        [wbus_1] = _past(m, pe.i_wbus.as_value(), 1, name="past_wbus", reset_less=False)
        m.d.comb += [
            Assert(pe.o_act == acts[0], "o_act is i_act one cycle later"),
            Assert(pe.o_switch == switch_1, "o_switch is i_switch one cycle later"),
            Assert(pe.o_wbus.as_value() == wbus_1, "o_wbus is i_wbus one cycle later"),
        ]

        # Invariants on the internal state, for induction: the model's weights are the PE's,
        # the multiplier's operands are the activation and the weight the model chose, the
        # product register holds their product (for multiplier="lut" this is where the
        # shift-and-add multiplier is proved equal to `*`).
        if not invariants:
            return
        pre = 2 if latency == 7 else 0       # "ecp5": w_pre and o_act's, then w_pipe, a_pre
        m.d.comb += [
            Assert(inside.signal("active") == active,
                   "active weight changes only on a switch, to the shadow weight"),
            Assert(inside.signal("shadow") == shadow, "shadow weight is the last for this row"),
            Assert(inside.signal("a") == acts[pre], "the activation operand is i_act"),
            Assert(inside.signal("w") == weights[pre],
                   "the weight operand is shadow on a switch, else active"),
            Assert(inside.signal("product") == acts[pre + 1] * weights[pre + 1],
                   "the product register"),
        ]
        if pre:
            m.d.comb += [
                Assert(inside.signal("w_pre") == weights[0],
                       "w_pre: the weight the activation met"),
                Assert(inside.signal("a_pre") == acts[1], "a_pre: o_act a cycle later"),
                Assert(inside.signal("w_pipe") == weights[1], "w_pipe: w_pre a cycle later"),
                Assert(inside.signal("product_pipe") == acts[pre + 2] * weights[pre + 2],
                       "product_pipe: the product a cycle later"),
                Assert(inside.signal("addend") == acts[pre + 3] * weights[pre + 3],
                       "the addend register: the product two cycles later"),
            ]

    return Harness(dut, properties, reset="any")
