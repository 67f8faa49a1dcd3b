"""cocotb testbench: the matrix unit (weight FIFO + systolic array) against the golden model.

The stimulus and checks are the systolic array's (``tb_systolic_array``), now with the
weight FIFO between the weight stream and the array; ``test_prefetch`` checks what the FIFO
adds: ``weight_fifo_depth`` tiles queue up beside the shadow tile while no activation comes.
"""

from __future__ import annotations

import cocotb
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly
from tb_systolic_array import (
    MatrixTestbench,
    scenario_back_to_back,
    scenario_backpressure,
    scenario_extremes,
    scenario_random,
    scenario_stalls,
    scenario_uneven_tiles,
)

from sim.rtl.runner import config_from_env


@cocotb.test()
@cocotb.parametrize(x_signed=[False, True], w_signed=[False, True])
async def test_random(dut, x_signed: bool, w_signed: bool):
    await scenario_random(dut, 300 + 2 * x_signed + w_signed, x_signed, w_signed)


@cocotb.test()
async def test_random_mixed(dut):
    """Signedness drawn per tile and per activation row."""
    await scenario_random(dut, 310, None, None)


@cocotb.test()
async def test_extremes(dut):
    await scenario_extremes(dut)


@cocotb.test()
async def test_back_to_back(dut):
    await scenario_back_to_back(dut, 320)


@cocotb.test()
@cocotb.parametrize(pattern=["light", "heavy", "bursts"])
async def test_stalls(dut, pattern: str):
    await scenario_stalls(dut, 330 + ["light", "heavy", "bursts"].index(pattern), pattern)


@cocotb.test()
@cocotb.parametrize(pattern=["none", "light"])
async def test_uneven_tiles(dut, pattern: str):
    await scenario_uneven_tiles(dut, 340 + ["none", "light"].index(pattern), pattern)


@cocotb.test()
@cocotb.parametrize(pattern=["alternate", "random", "bursts"])
async def test_backpressure(dut, pattern: str):
    await scenario_backpressure(dut, 350 + ["alternate", "random", "bursts"].index(pattern),
                                pattern)


@cocotb.test()
async def test_prefetch(dut):
    """With no activations the unit takes ``weight_fifo_depth + 1`` tiles (the FIFO's and the
    array's shadow registers) and then holds ``i_weight`` off; all of them are used after."""
    cfg = config_from_env()
    depth = cfg.weight_fifo_depth
    tb = MatrixTestbench(dut, cfg, seed=360)
    await tb.reset()
    for _ in range(depth + 2):
        w_signed = tb.random_signed()
        tb.queue_tile(tb.operands((cfg.rows, cfg.cols), w_signed), w_signed)
    await ClockCycles(dut.clk, (depth + 3) * cfg.rows + 20)
    await ReadOnly()
    taken = tb.weight.sent
    assert taken == (depth + 1) * cfg.rows, (
        f"unit took {taken} weight rows, expected {(depth + 1) * cfg.rows} "
        f"({depth} tiles in the FIFO and one in the shadow registers)")
    assert dut.i_weight__ready.value == 0
    assert dut.o_status__tiles.value.to_unsigned() == depth
    assert dut.o_status__shadow_full.value == 1
    await FallingEdge(dut.clk)
    for _ in range(depth + 2):
        tb.queue_acts(tb.operands((cfg.rows, cfg.rows), False), False)
    await tb.finish()
