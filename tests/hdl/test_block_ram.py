# amaranth: UnusedElaboratable=no
"""PipelinedMemory (hdl/memory/block_ram.py): its DP16KD blocks and their model under the cocotb
bench (tb_block_ram.py) at every block width, and its fabric form under amaranth.sim, both
against the bench's model; its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from amaranth.sim import Simulator
from tb_block_ram import Model

from hdl.memory.block_ram import PipelinedMemory, dp16kd_width
from sim.rtl.runner import run

HERE = Path(__file__).parent

#: (depth, width, readers): each DP16KD width (18, 9, 4, 1 bits a block), rows over several
#: blocks side by side, the last one partly used.
SHAPES = {"d16w20": (16, 20, 2), "d1500w12": (1500, 12, 2), "d3000w5": (3000, 5, 1),
          "d10000w3": (10000, 3, 1)}


def test_block_widths():
    assert [dp16kd_width(d) for d in (1, 1024, 1025, 2048, 4096, 8192, 16384)] == \
        [18, 18, 9, 9, 4, 2, 1]
    with pytest.raises(ValueError, match="at most 16384 rows"):
        dp16kd_width(16385)
    with pytest.raises(ValueError, match="depth >= 1 and readers >= 1"):
        PipelinedMemory(shape=8, depth=16, readers=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_dp16kd(shape: str):
    """The DP16KD instances (address pins, byte enables, slices, the output register and
    both enables) and their model, cycle by cycle."""
    depth, width, readers = SHAPES[shape]
    run("block_ram", lambda: PipelinedMemory(shape=width, depth=depth, readers=readers),
        shape, "tb_block_ram", HERE, ["test_random"],
        extra_env={"AMTPU_BRAM": json.dumps({"depth": depth, "width": width,
                                             "readers": readers})})


def test_fabric_form():
    """For amaranth.sim (``platform=None``): the same behaviour from a Memory read port and a
    register (a colliding read returns the old row there, which the model leaves open)."""
    depth, width, readers, seed = 16, 12, 2, 1390
    dut = PipelinedMemory(shape=width, depth=depth, readers=readers)
    rng = np.random.default_rng(seed)
    model = Model(depth, readers)
    compared = 0

    async def bench(ctx):
        nonlocal compared
        for cycle in range(600):
            for port in range(readers):
                want = model.out[port]
                if want is not None:
                    got = ctx.get(dut.r[port].data)
                    assert got == want, f"r[{port}] cycle {cycle}: {got} != {want} (seed {seed})"
                    compared += 1
            write = (int(rng.integers(depth)), int(rng.integers(1 << width))) \
                if rng.random() < 0.5 else None
            ctx.set(dut.w.en, write is not None)
            if write is not None:
                ctx.set(dut.w.addr, write[0])
                ctx.set(dut.w.data, write[1])
            reads = [(int(rng.integers(depth)), bool(rng.random() < 0.7))
                     for _ in range(readers)]
            for port, (addr, en) in enumerate(reads):
                ctx.set(dut.r[port].addr, addr)
                ctx.set(dut.r[port].en, en)
            model.edge(write, reads)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert compared > 600
