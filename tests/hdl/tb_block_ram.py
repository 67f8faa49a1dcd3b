"""cocotb testbench: ``PipelinedMemory`` as the simulators see it, DP16KD blocks and their
model (``sim/rtl/vendor/DP16KD.v``).

The DUT's shape is in ``AMTPU_BRAM`` (JSON ``{"depth", "width", "readers"}``, set by
``test_block_ram.py``). Every cycle the bench writes a random row or not and gives each read
port a random address and enable, from a few hot rows (the first, the last, some between)
and anywhere, so that reads meet writes to their rows and every address bit toggles. A
Python model (:class:`Model`) predicts each port's ``data``: with ``en`` high at an edge the
output register takes the latch and the latch takes the addressed row as it was before that
edge's write; a latch that read a row written at the same edge is undefined, and so is the
output it moves into (not compared). Every defined output is compared with ``==`` every
cycle.
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge

ENV = "AMTPU_BRAM"


def shape_from_env() -> tuple[int, int, int]:
    """``(depth, width, readers)`` of the DUT."""
    value = json.loads(os.environ.get(ENV, '{"depth": 16, "width": 20, "readers": 2}'))
    return int(value["depth"]), int(value["width"]), int(value["readers"])


class Model:
    """What each read port of a ``PipelinedMemory`` shows; ``None`` where undefined."""

    def __init__(self, depth: int, readers: int):
        self.rows = [0] * depth
        self.latch: list[int | None] = [0] * readers
        self.out: list[int | None] = [0] * readers

    def edge(self, write: tuple[int, int] | None, reads: list[tuple[int, bool]]) -> None:
        """One clock edge: *write* ``(addr, data)`` or ``None``; *reads* ``(addr, en)`` per
        port."""
        for port, (addr, en) in enumerate(reads):
            if en:
                self.out[port] = self.latch[port]
                collides = write is not None and write[0] == addr
                self.latch[port] = None if collides else self.rows[addr]
        if write is not None:
            self.rows[write[0]] = write[1]


@cocotb.test()
async def test_random(dut):
    """Random writes, reads and stalls against :class:`Model`, every cycle."""
    depth, width, readers = shape_from_env()
    seed = 1300 + depth + width
    rng = np.random.default_rng(seed)
    dut._log.info("PipelinedMemory depth=%d width=%d readers=%d: seed %d",
                  depth, width, readers, seed)
    # No reset: the block RAMs have none (their rows and registers start at zero).
    dut.w__en.value = 0
    for port in range(readers):
        getattr(dut, f"r__{port}__en").value = 0
    Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False)
    await ClockCycles(dut.clk, 2)
    model = Model(depth, readers)
    hot = sorted({0, depth - 1, *rng.integers(depth, size=4).tolist()})

    def address() -> int:
        return int(rng.choice(hot)) if rng.random() < 0.6 else int(rng.integers(depth))

    ports = [(getattr(dut, f"r__{p}__addr"), getattr(dut, f"r__{p}__en"),
              getattr(dut, f"r__{p}__data")) for p in range(readers)]
    compared = collisions = 0
    # A row of every width's extremes first, then random rows.
    extremes = [0, (1 << width) - 1, 0x2AAAAAAAA & ((1 << width) - 1)]
    for cycle in range(1500):
        await FallingEdge(dut.clk)
        for port, (_, _, data) in enumerate(ports):
            want = model.out[port]
            if want is None:
                continue
            got = data.value.to_unsigned()
            assert got == want, (f"r[{port}].data in cycle {cycle}: got {got:#x}, expected "
                                 f"{want:#x} (seed {seed})")
            compared += 1
        write = None
        if rng.random() < 0.5:
            value = (extremes[cycle % 3] if cycle < 30 else
                     int(rng.integers(1 << min(width, 62))) | (int(rng.integers(2)) << (width - 1)))
            write = (address(), value)
        dut.w__en.value = write is not None
        if write is not None:
            dut.w__addr.value, dut.w__data.value = write
        reads = []
        for addr_sig, en_sig, _ in ports:
            read = (address(), bool(rng.random() < 0.7))
            addr_sig.value, en_sig.value = read
            reads.append(read)
            collisions += read[1] and write is not None and write[0] == read[0]
        model.edge(write, reads)
    await ClockCycles(dut.clk, 2)
    dut._log.info("%d outputs compared, %d reads met a write to their row", compared,
                  collisions)
    assert collisions > 0, f"no read met a write to its row (seed {seed})"
    assert compared > 1500 * readers // 2, f"only {compared} outputs compared (seed {seed})"
