"""hdl.memory.block_fifo.BlockFIFO against amaranth.lib.fifo.SyncFIFOBuffered: the same outputs in
every cycle under random writes and reads (full and empty included), for each depth form."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import fifo
from amaranth.sim import Simulator

from hdl.memory.block_fifo import BlockFIFO

SEED = 9100


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 9, 16])
def test_same_as_library_queue(depth: int):
    """Writes and reads at random rates (a phase that fills the queue, one that drains it):
    ``w_rdy``, ``r_rdy``, ``level`` and, when ``r_rdy``, ``r_data`` equal the library's."""
    seed = SEED + depth
    print(f"seed {seed}")
    rng = random.Random(seed)
    m = Module()
    m.submodules.ours = ours = BlockFIFO(width=12, depth=depth)
    m.submodules.theirs = theirs = fifo.SyncFIFOBuffered(width=12, depth=depth)
    seen = {"full": 0, "empty": 0, "data": 0}

    async def bench(ctx):
        for cycle in range(1500):
            phase = cycle // 100 % 3          # 0: fill, 1: drain, 2: balanced
            w_en = rng.random() < (0.9, 0.1, 0.5)[phase]
            r_en = rng.random() < (0.1, 0.9, 0.5)[phase]
            value = rng.choice([0, 0xFFF, rng.getrandbits(12)])
            for q in (ours, theirs):
                ctx.set(q.w_en, w_en)
                ctx.set(q.w_data, value)
                ctx.set(q.r_en, r_en)
            for name in ("w_rdy", "r_rdy", "level"):
                assert ctx.get(getattr(ours, name)) == ctx.get(getattr(theirs, name)), \
                    f"{name} in cycle {cycle}, seed {seed}"
            if ctx.get(theirs.r_rdy):
                assert ctx.get(ours.r_data) == ctx.get(theirs.r_data), \
                    f"r_data in cycle {cycle}, seed {seed}"
                seen["data"] += 1
            seen["full"] += not ctx.get(theirs.w_rdy)
            seen["empty"] += ctx.get(theirs.level) == 0
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert all(seen.values()), seen


def test_storage_is_block_ram_without_read_during_write():
    """The storage memory carries ``no_rw_check`` (the point of the class)."""
    from amaranth.back import rtlil
    q = BlockFIFO(width=8, depth=12)
    text = rtlil.convert(q, ports=[q.w_data, q.w_en, q.w_rdy, q.r_data, q.r_en, q.r_rdy])
    assert "no_rw_check" in text
