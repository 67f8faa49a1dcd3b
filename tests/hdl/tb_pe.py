"""cocotb testbench: one processing element, lock-step, against a cycle model.

The DUT is ``PE(data_width=8, acc_width=32, row=1, row_bits=2)``: it latches only weights
tagged with row 1. Every cycle the testbench writes the inputs after the falling edge,
steps :class:`PEModel` and compares all registered outputs (and the internal ``active`` and
``shadow`` registers) in ``ReadOnly``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly

from sim.models.golden import wrap
from sim.rtl.streams import reset, start_clock

ROW = 1
ROW_BITS = 2
OPERAND_BITS = 9     # data_width + 1: the array edge's sign/zero extension of an 8-bit operand
ACC_BITS = 32
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def wrap32(value: int) -> int:
    return int(wrap(value, ACC_BITS))


def wbus_bits(valid: int, row: int, value: int) -> int:
    """Pack the weight bus: valid (bit 0), row (bits 1..2), signed 9-bit data (bits 3..11)."""
    return (valid & 1) | (row & 3) << 1 | (value & 0x1FF) << 3


@dataclass
class Inputs:
    act: int = 0          # 9-bit signed value
    switch: int = 0
    wvalid: int = 0
    wrow: int = 0
    wdata: int = 0        # 9-bit signed value
    psum: int = 0         # int32


@dataclass
class PEModel:
    """Next-state model of the PE's registers (the contract in ``hdl/datapath/pe.py``).

    ``ecp5``: the ``multiplier="ecp5"`` PE (``latency`` 7), whose ``w_pre`` register holds
    the weight the activation met for a cycle, ``a_pre`` and ``w_pipe`` take the activation
    (from ``o_act``) and that weight on for another before the multiplier's operand
    registers take them, and whose ``product_pipe`` and ``addend`` registers hold the
    product for two cycles before the adder. Otherwise (``latency`` 3) the operand
    registers take ``i_act`` and the weight, the adder takes ``product``, and the pipeline
    registers mirror the operands and ``product``.
    """

    row: int = ROW
    active: int = 0
    shadow: int = 0
    w_pre: int = 0        # the weight the activation met, before the operand register
    a_pre: int = 0        # the operands a cycle later, on their way to the block
    w_pipe: int = 0
    a: int = 0            # multiplier operands
    w: int = 0
    product: int = 0
    product_pipe: int = 0  # the product a cycle later
    addend: int = 0       # what the adder adds: the product register, or two cycles later
    o_psum: int = 0
    o_act: int = 0
    o_switch: int = 0
    o_wbus: int = 0
    ecp5: bool = False
    history: list = field(default_factory=list)

    def step(self, i: Inputs) -> None:
        weight = self.shadow if i.switch else self.active
        if self.ecp5:
            n_w_pre, n_a_pre, n_w_pipe = weight, self.o_act, self.w_pre
            n_a, n_w = self.a_pre, self.w_pipe
        else:
            n_w_pre, n_a_pre, n_w_pipe = weight, i.act, weight
            n_a, n_w = i.act, weight
        n_product = self.a * self.w
        n_psum = wrap32(i.psum + self.addend)
        n_product_pipe = self.product
        n_addend = self.product_pipe if self.ecp5 else n_product
        n_active = self.shadow if i.switch else self.active
        n_shadow = i.wdata if i.wvalid and i.wrow == self.row else self.shadow
        self.w_pre, self.a_pre, self.w_pipe = n_w_pre, n_a_pre, n_w_pipe
        self.a, self.w = n_a, n_w
        self.product, self.product_pipe = n_product, n_product_pipe
        self.addend, self.o_psum = n_addend, n_psum
        self.active, self.shadow = n_active, n_shadow
        self.o_act, self.o_switch = i.act, i.switch
        self.o_wbus = wbus_bits(i.wvalid, i.wrow, i.wdata)
        self.history.append(self.o_psum)


class Testbench:
    """Clock, reset and lock-step stimulus for the PE."""

    def __init__(self, dut, seed: int | None = None):
        self.dut = dut
        self.seed = seed
        self.model = PEModel()
        self.cycle = 0
        self.log = dut._log
        start_clock(dut)
        self.apply(Inputs())
        if seed is not None:
            self.log.info("seed %d", seed)

    async def reset(self) -> None:
        await reset(self.dut)
        # Reset clears the control registers only; the datapath registers (weights,
        # operands, product, partial sum, activation) keep their values by design.
        await ReadOnly()
        dut = self.dut
        self.model = PEModel(
            active=dut.active.value.to_signed(), shadow=dut.shadow.value.to_signed(),
            a=dut.a.value.to_signed(), w=dut.w.value.to_signed(),
            product=dut.product.value.to_signed(), addend=dut.product.value.to_signed(),
            o_psum=dut.o_psum.value.to_signed(), o_act=dut.o_act.value.to_signed())

    def apply(self, i: Inputs) -> None:
        dut = self.dut
        dut.i_act.value = i.act & 0x1FF
        dut.i_switch.value = i.switch
        dut.i_wbus.value = wbus_bits(i.wvalid, i.wrow, i.wdata)
        dut.i_psum.value = i.psum & 0xFFFFFFFF

    async def step(self, i: Inputs | None = None) -> None:
        """One clock cycle: drive *i* and compare every output with the model."""
        i = i or Inputs()
        await FallingEdge(self.dut.clk)
        self.apply(i)
        # Registered outputs still hold what the previous edges made of earlier inputs.
        await ReadOnly()
        self.check()
        self.model.step(i)
        self.cycle += 1

    def check(self) -> None:
        dut, m = self.dut, self.model
        got = {
            "o_psum": dut.o_psum.value.to_signed(),
            "o_act": dut.o_act.value.to_signed(),
            "o_switch": int(dut.o_switch.value),
            "o_wbus": dut.o_wbus.value.to_unsigned(),
            "active": dut.active.value.to_signed(),
            "shadow": dut.shadow.value.to_signed(),
            "a": dut.a.value.to_signed(),
            "w": dut.w.value.to_signed(),
            "product": dut.product.value.to_signed(),
        }
        want = {name: getattr(m, name) for name in got}
        seed = "" if self.seed is None else f" (seed {self.seed})"
        assert got == want, f"cycle {self.cycle}: expected {want}, got {got}{seed}"

    async def run(self, inputs: list[Inputs]) -> None:
        for i in inputs:
            await self.step(i)
        for _ in range(3):
            await self.step()


async def start(dut, seed: int | None = None) -> Testbench:
    tb = Testbench(dut, seed)
    await tb.reset()
    return tb


@cocotb.test()
async def test_weight_bus(dut):
    """Only weights tagged with this PE's row reach the shadow register; all pass through."""
    tb = await start(dut)
    await tb.run([Inputs(wvalid=1, wrow=r, wdata=10 * r + 5) for r in range(4)]
                 + [Inputs(wvalid=0, wrow=ROW, wdata=-77)]
                 + [Inputs(wvalid=1, wrow=ROW, wdata=-256), Inputs(wvalid=1, wrow=ROW, wdata=255)])
    assert dut.shadow.value.to_signed() == 255
    assert dut.active.value.to_signed() == 0, "loading the shadow must not touch the active"


@cocotb.test()
async def test_switch(dut):
    """The switch activation multiplies with the shadow weight and makes it the active one;
    a weight latched in the switch cycle becomes the next shadow."""
    tb = await start(dut)
    await tb.run([
        Inputs(wvalid=1, wrow=ROW, wdata=3),
        Inputs(act=5, switch=1),                        # 5 * 3 and active <- 3
        Inputs(act=7, wvalid=1, wrow=ROW, wdata=-4),    # 7 * 3, shadow <- -4
        Inputs(act=2),                                  # 2 * 3
        Inputs(act=-9, switch=1, wvalid=1, wrow=ROW, wdata=100),  # -9 * -4, shadow <- 100
        Inputs(act=11),                                 # 11 * -4
        Inputs(act=1, switch=1),                        # 1 * 100
        Inputs(act=1, switch=1),                        # 1 * 100 again (shadow unchanged)
    ])
    assert dut.active.value.to_signed() == 100


@cocotb.test()
async def test_timing(dut):
    """Operands registered in the cycle the activation arrives, the product one cycle later,
    o_psum = i_psum + product the cycle after that; o_act/o_switch/o_wbus one cycle after
    their inputs."""
    tb = await start(dut)
    await tb.run([Inputs(wvalid=1, wrow=ROW, wdata=6), Inputs(act=0, switch=1)])
    dut = tb.dut
    await FallingEdge(dut.clk)
    tb.apply(Inputs(act=7))
    await FallingEdge(dut.clk)
    tb.apply(Inputs())
    await ReadOnly()
    assert dut.a.value.to_signed() == 7 and dut.w.value.to_signed() == 6
    assert dut.o_act.value.to_signed() == 7
    await FallingEdge(dut.clk)
    tb.apply(Inputs(psum=1000))
    await ReadOnly()
    assert dut.product.value.to_signed() == 42
    assert dut.o_psum.value.to_signed() == 0
    await FallingEdge(dut.clk)
    tb.apply(Inputs())
    await ReadOnly()
    assert dut.o_psum.value.to_signed() == 1042, "o_psum must add the product to i_psum " \
        "presented two cycles after the activation"


@cocotb.test()
@cocotb.parametrize(
    (("act", "weight"), [
        (-256, -256), (-128, -128), (255, 255), (-128, 255), (255, -128), (127, -128),
        (-1, 255), (0, -256),
    ]),
)
async def test_extremes(dut, act: int, weight: int):
    """Extreme 9-bit operands: int8 -128, uint8 255 and the 9-bit limits."""
    tb = await start(dut)
    await tb.run([Inputs(wvalid=1, wrow=ROW, wdata=weight),
                  Inputs(act=act, switch=1, psum=0),
                  Inputs(act=act),
                  Inputs(psum=123)])           # two cycles after the first activation
    assert wrap32(123 + act * weight) in tb.model.history


@cocotb.test()
@cocotb.parametrize(
    (("psum", "act", "weight"), [
        (INT32_MAX - 10, 255, 255),       # positive overflow wraps to negative
        (INT32_MAX, 1, 1),
        (INT32_MIN + 10, 255, -256),      # negative overflow wraps to positive
        (INT32_MIN, -1, 1),
        (-1, 1, 1),                       # -1 + 1 = 0
    ]),
)
async def test_psum_wrap(dut, psum: int, act: int, weight: int):
    """``i_psum + product`` wraps modulo 2**32 (two's complement), as the golden model."""
    tb = await start(dut)
    await tb.run([Inputs(wvalid=1, wrow=ROW, wdata=weight),
                  Inputs(act=act, switch=1),
                  Inputs(),
                  Inputs(psum=psum)])          # two cycles after the activation
    expected = wrap32(psum + act * weight)
    assert expected in tb.model.history
    if psum > 0 and act * weight > 0 and psum + act * weight > INT32_MAX:
        assert expected < 0


@cocotb.test()
@cocotb.parametrize(seed=[1, 2, 3])
async def test_random(dut, seed: int):
    """Random inputs every cycle (operands, switch, weight bus rows, partial sums near the
    int32 limits), compared with the model every cycle."""
    rng = random.Random(seed)
    tb = await start(dut, seed)

    def operand() -> int:
        return rng.choice([rng.randint(-128, 127), rng.randint(0, 255),
                           rng.choice([-256, -128, 255, 127, 0, -1])])

    def psum() -> int:
        return rng.choice([rng.randint(INT32_MIN, INT32_MAX), INT32_MAX - rng.randint(0, 99),
                           INT32_MIN + rng.randint(0, 99)])

    await tb.run([Inputs(act=operand(), switch=int(rng.random() < 0.15),
                         wvalid=int(rng.random() < 0.5), wrow=rng.randrange(4),
                         wdata=operand(), psum=psum())
                  for _ in range(600)])
