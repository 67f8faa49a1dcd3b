"""hdl.lib.arith: constant multiplies from adders, equal to ``*`` for every input."""

from itertools import pairwise

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from hdl.lib.arith import csd_digits, times_constant

WIDTH = 6
FACTORS = [0, 1, 2, 3, 5, 7, 8, 11, 12, 14, 15, 16, 21, 63, 100]


def test_csd_digits():
    """0 to 299: the digits sum to k, none adjacent, each +1 or -1."""
    for k in range(300):
        digits = csd_digits(k)
        assert sum(sign << shift for shift, sign in digits) == k, k
        shifts = [shift for shift, _ in digits]
        assert all(b - a >= 2 for a, b in pairwise(shifts)), ("adjacent digits", k, digits)
        assert all(sign in (1, -1) for _, sign in digits), k


def test_csd_digits_rejects_negative():
    with pytest.raises(ValueError, match=">= 0"):
        csd_digits(-3)


def test_times_constant_rejects_signed():
    with pytest.raises(ValueError, match="unsigned"):
        times_constant(Signal(range(-4, 4)), 3)


def test_times_constant_equals_multiply():
    """Every WIDTH-bit value (0 and the largest included) times each factor, through the
    simulator, into outputs just wide enough and into ones that truncate."""
    m = Module()
    x = Signal(WIDTH)
    exact = {k: Signal(WIDTH + max(k, 1).bit_length(), name=f"exact_{k}") for k in FACTORS}
    low = {k: Signal(WIDTH, name=f"low_{k}") for k in FACTORS}
    for k in FACTORS:
        m.d.comb += [exact[k].eq(times_constant(x, k)), low[k].eq(times_constant(x, k))]
    sim = Simulator(m)

    async def bench(ctx):
        for value in range(1 << WIDTH):
            ctx.set(x, value)
            for k in FACTORS:
                assert ctx.get(exact[k]) == value * k, (value, k)
                assert ctx.get(low[k]) == (value * k) % (1 << WIDTH), (value, k)

    sim.add_testbench(bench)
    sim.run()
