"""cocotb testbenches for the ECP5 multiplier: the ``MULT18X18D`` simulation model alone
(``sim/rtl/vendor/MULT18X18D.v``) against numpy, and a PE with ``multiplier="ecp5"`` lock-step
against the PE's cycle model with a random clock enable.

The model's DUT is :class:`test_pe_dsp.MultHarness`: blocks of several register settings and
signedness on shared ``a``, ``b``, ``ce``, one ``p_<variant>`` each (the variants in
``AMTPU_MULT``, JSON); the PE's is
``PE(data_width=8, acc_width=32, row=1, row_bits=2, multiplier="ecp5")``.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, ReadOnly
from tb_pe import Inputs, PEModel, wbus_bits

from sim.rtl.streams import reset, start_clock

INT18_MIN, INT18_MAX = -(2**17), 2**17 - 1
# The PE's operands: 9-bit two's complement (int8 or uint8 extended by the array's edge).
PE_EXTREMES = [-256, -255, -129, -128, -127, -1, 0, 1, 127, 128, 255]
WIDE_EXTREMES = [INT18_MIN, INT18_MIN + 1, INT18_MAX, INT18_MAX - 1, -(2**16), 2**16 - 1]
UNSIGNED_EXTREMES = [0, 1, 127, 128, 255, 256, 511, 2**17, 2**18 - 1]
MASK18 = (1 << 18) - 1


def _variants() -> dict[str, dict]:
    return json.loads(os.environ["AMTPU_MULT"])


def _stimulus(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """18-bit patterns for A and B: every pair of the extreme values (signed and unsigned),
    then *count* random pairs from three ranges in turn (the PE's 9 bits, all 18 bits, the
    extremes)."""
    ext = np.unique(np.array(PE_EXTREMES + WIDE_EXTREMES + UNSIGNED_EXTREMES) & MASK18)

    def random_bits() -> np.ndarray:
        pick = rng.integers(0, 3, count)
        nine = rng.integers(-256, 256, count) & MASK18
        wide = rng.integers(0, 2**18, count)
        return np.where(pick == 0, nine, np.where(pick == 1, wide, rng.choice(ext, count)))

    return (np.concatenate([np.repeat(ext, len(ext)), random_bits()]),
            np.concatenate([np.tile(ext, len(ext)), random_bits()]))


def _as_signed(bits: np.ndarray) -> np.ndarray:
    return np.where(bits >= 2**17, bits - 2**18, bits)


class StageModel:
    """Which stimulus each register stage of one block holds (its index; -1 for the 0 the
    registers start with) and so which product ``P`` shows."""

    def __init__(self, reg_input: bool, reg_output: bool):
        self.reg_input, self.reg_output = reg_input, reg_output
        self.inputs = self.output = -1

    def shown(self, t: int) -> int:
        """The stimulus whose product P shows while stimulus *t* is on the inputs."""
        multiplied = self.inputs if self.reg_input else t
        return self.output if self.reg_output else multiplied

    def edge(self, t: int) -> None:
        """An enabled rising edge while stimulus *t* is on the inputs."""
        self.output = self.inputs if self.reg_input else t
        self.inputs = t


@cocotb.test()
async def test_model_products(dut):
    """Each block of the harness (``p_<variant>``), fed the same operands: every pair of
    extreme values, then random ones, with a random clock enable. ``P`` is numpy's product
    of the operands the enabled edges captured (one edge for each register stage the block's
    parameters ask for), to the bit."""
    variants = _variants()
    rng = np.random.default_rng(1)
    a_bits, b_bits = _stimulus(rng, 700)
    steps = len(a_bits)
    # numpy's int64 products are exact for 18 x 18 bits; an unsigned block reads the bits
    # as unsigned numbers, a signed one as two's complement.
    products = {True: _as_signed(a_bits) * _as_signed(b_bits), False: a_bits * b_bits}
    ce_values = (rng.random(steps) < 0.8).astype(int)
    ce_values[:steps - 700] = 1     # the extreme pairs back to back

    models = {name: StageModel(v["reg_input"], v["reg_output"]) for name, v in variants.items()}
    dut.a.value = 0
    dut.b.value = 0
    dut.ce.value = 1
    # (The harness has no reset; the GPI clock as sim.rtl.streams.start_clock's.)
    Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
    for _ in range(3):      # zeros through every stage (an edge at time 0 may sample X)
        await FallingEdge(dut.clk)
    checked = 0
    for t in range(steps):
        await FallingEdge(dut.clk)
        dut.a.value = int(a_bits[t])
        dut.b.value = int(b_bits[t])
        dut.ce.value = int(ce_values[t])
        await ReadOnly()
        for name, variant in variants.items():
            signed, model = variant["signed"], models[name]
            shown = model.shown(t)
            want = 0 if shown < 0 else int(products[signed][shown])
            port = getattr(dut, f"p_{name}").value
            got = port.to_signed() if signed else port.to_unsigned()
            assert got == want, (
                f"{name}, cycle {t}: P = {got}, expected {want} = product of stimulus "
                f"{shown} (signed={signed}, registered inputs={model.reg_input}, "
                f"output={model.reg_output})")
            checked += shown >= 0
            if ce_values[t]:
                model.edge(t)
    assert checked > len(variants) * steps // 2


@cocotb.test()
async def test_runs(dut):
    """Ten clock cycles: a harness whose parameters the model refuses never gets here."""
    dut.a.value = 0
    dut.b.value = 0
    dut.ce.value = 1
    Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
    for _ in range(10):
        await FallingEdge(dut.clk)
    assert get_sim_time("ns") >= 90


@cocotb.test()
@cocotb.parametrize(seed=[1, 2])
async def test_pe_enable(dut, seed: int):
    """The PE with its DSP block, random inputs and a random ``i_en``: ports, weights, the
    block's registers and the fabric registers before (``w_pre``, ``a_pre``, ``w_pipe``) and
    after (``product_pipe``, ``addend``) it follow the PE's cycle model (``o_psum`` adds
    ``i_psum`` six cycles after the activation), every register holding while ``i_en`` is
    low."""
    rng = random.Random(seed)
    start_clock(dut)
    dut.i_en.value = 1
    dut.i_act.value = 0
    dut.i_switch.value = 0
    dut.i_wbus.value = 0
    dut.i_psum.value = 0
    await reset(dut)
    await ReadOnly()
    mult = dut.mult
    model = PEModel(active=dut.active.value.to_signed(), shadow=dut.shadow.value.to_signed(),
                    w_pre=dut.w_pre.value.to_signed(), a_pre=dut.a_pre.value.to_signed(),
                    w_pipe=dut.w_pipe.value.to_signed(),
                    a=mult.a_reg.value.to_signed(), w=mult.b_reg.value.to_signed(),
                    product=mult.p_reg.value.to_signed(),
                    product_pipe=dut.product_pipe.value.to_signed(),
                    addend=dut.addend.value.to_signed(),
                    o_psum=dut.o_psum.value.to_signed(), o_act=dut.o_act.value.to_signed(),
                    ecp5=True)
    # The reset ends just after a falling edge: the next rising edge, before the first
    # comparison, takes the zero inputs set above (the datapath has no reset, and seven stages
    # need not have flushed during the reset).
    model.step(Inputs())

    def operand() -> int:
        return rng.choice([rng.randint(-128, 127), rng.randint(0, 255),
                           rng.choice(PE_EXTREMES + [-256])])

    held = 0
    for cycle in range(800):
        i = Inputs(act=operand(), switch=int(rng.random() < 0.15),
                   wvalid=int(rng.random() < 0.5), wrow=rng.randrange(4), wdata=operand(),
                   psum=rng.randint(-(2**31), 2**31 - 1))
        en = int(rng.random() < 0.7)
        await FallingEdge(dut.clk)
        dut.i_act.value = i.act & 0x1FF
        dut.i_switch.value = i.switch
        dut.i_wbus.value = wbus_bits(i.wvalid, i.wrow, i.wdata)
        dut.i_psum.value = i.psum & 0xFFFFFFFF
        dut.i_en.value = en
        await ReadOnly()
        got = {
            "o_psum": dut.o_psum.value.to_signed(), "o_act": dut.o_act.value.to_signed(),
            "o_switch": int(dut.o_switch.value), "o_wbus": dut.o_wbus.value.to_unsigned(),
            "active": dut.active.value.to_signed(), "shadow": dut.shadow.value.to_signed(),
            "w_pre": dut.w_pre.value.to_signed(), "a_pre": dut.a_pre.value.to_signed(),
            "w_pipe": dut.w_pipe.value.to_signed(),
            "a": mult.a_reg.value.to_signed(), "w": mult.b_reg.value.to_signed(),
            "product": mult.p_reg.value.to_signed(),
            "product_pipe": dut.product_pipe.value.to_signed(),
            "addend": dut.addend.value.to_signed(),
        }
        want = {name: getattr(model, name) for name in got}
        assert got == want, f"cycle {cycle} (seed {seed}): expected {want}, got {got}"
        if en:
            model.step(i)
        else:
            held += 1
    assert held > 100, f"only {held} cycles with i_en low"
