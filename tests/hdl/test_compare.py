"""hdl.lib.compare.greater_than equals ``>`` for every pair of values (exhaustive: one operand a
signal, the other each constant of the width), signed and unsigned, at widths with a lone
bit at the top and with an odd count of groups to merge."""

from __future__ import annotations

import pytest
from amaranth.hdl import Const, Module, Signal, signed, unsigned
from amaranth.sim import Simulator
from tiers import tiered

from hdl.lib.compare import greater_than


@pytest.mark.parametrize("width", tiered([1, 2, 3, 5, 7, 8], fast=[1, 2, 3, 5, 7]))
@pytest.mark.parametrize("is_signed", [False, True], ids=["unsigned", "signed"])
def test_equals_operator(width: int, is_signed: bool):
    shape = signed(width) if is_signed else unsigned(width)
    low, high = (-(1 << width - 1), 1 << width - 1) if is_signed else (0, 1 << width)
    m = Module()
    a = Signal(shape)
    # Both operand orders: bit k - low of `right` is a > k, of `left` k > a.
    right = Signal(high - low)
    left = Signal(high - low)
    for k in range(low, high):
        m.d.comb += [right[k - low].eq(greater_than(a, Const(k, shape))),
                     left[k - low].eq(greater_than(Const(k, shape), a))]
    checked = 0

    async def bench(ctx):
        nonlocal checked
        for x in range(low, high):
            ctx.set(a, x)
            got_right, got_left = ctx.get(right), ctx.get(left)
            for k in range(low, high):
                assert (got_right >> (k - low)) & 1 == (x > k), f"{x} > {k}, {shape}"
                assert (got_left >> (k - low)) & 1 == (k > x), f"{k} > {x}, {shape}"
                checked += 2

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert checked == 2 * (high - low) ** 2


def test_rejects_mixed_shapes():
    with pytest.raises(ValueError, match="one shape"):
        greater_than(Signal(signed(8)), Signal(unsigned(8)))
    with pytest.raises(ValueError, match="one shape"):
        greater_than(Signal(8), Signal(7))
