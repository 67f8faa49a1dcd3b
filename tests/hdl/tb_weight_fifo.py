"""cocotb testbench: the weight FIFO (whole tiles in, whole tiles out, in order).

The DUT is ``WeightFIFO(rows=cfg.rows, cols=cfg.cols, depth=4)``. Besides the in-order
scoreboard, a checker samples both streams every cycle and asserts the FIFO's contract:

- whole-tile rule: ``o_row`` is never valid unless the tile it would read from is
  completely stored;
- ``o_tiles`` equals whole tiles written minus whole tiles read;
- no gaps: within a tile, ``o_row`` stays valid until the tile's last row is read.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly

from hdl.layouts import weight_row_layout
from sim.models.golden import operand_range, to_raw
from sim.rtl.runner import config_from_env
from sim.rtl.scoreboard import Scoreboard
from sim.rtl.streams import (
    StreamDriver,
    StreamMonitor,
    burst_stalls,
    random_stalls,
    reset,
    start_clock,
)

DEPTH = 4


def row_vector(row: dict) -> np.ndarray:
    """A weight row payload as one array: the raw weights, then the signed flag."""
    return np.array([*row["data"], row["signed"]], dtype=np.int64)


class Testbench:
    """Clock, reset, row driver, row monitor, scoreboard and the contract checker."""

    def __init__(self, dut, seed: int, *, idle=None, backpressure=None):
        self.dut = dut
        self.config = cfg = config_from_env()
        self.rows, self.depth = cfg.rows, DEPTH
        self.seed = seed
        self.log = dut._log
        self.log.info("weight_fifo rows=%d cols=%d depth=%d: seed %d",
                      cfg.rows, cfg.cols, DEPTH, seed)
        self.rng = np.random.default_rng(seed)
        self.scoreboard = Scoreboard(f"weight_fifo {cfg.name}", seed, self.log)
        layout = weight_row_layout(cfg.cols, cfg.data_width)
        start_clock(dut)
        self.source = StreamDriver(dut, "i_row", dut.clk, layout, idle)
        self.sink = StreamMonitor(dut, "o_row", dut.clk, layout, backpressure,
                                  callback=lambda row: self.scoreboard.receive(row_vector(row)))
        self.rows_in = 0
        self.rows_out = 0
        self.max_tiles = 0
        self.queued = 0
        # Runs from the start, like the driver and monitor, so it sees every transfer; it
        # checks from the end of reset on (values are undefined before).
        self.checking = False
        cocotb.start_soon(self._check())

    async def reset(self) -> None:
        await reset(self.dut)
        self.checking = True

    async def _check(self) -> None:
        dut, rows = self.dut, self.rows
        gap_possible = False
        while True:
            await FallingEdge(dut.clk)
            await ReadOnly()
            if not self.checking:
                continue
            where = f"after {self.rows_in} rows in, {self.rows_out} out (seed {self.seed})"
            out_valid = bool(dut.o_row__valid.value)
            tiles = dut.o_tiles.value.to_unsigned()
            stored = self.rows_in // rows - self.rows_out // rows
            assert tiles == stored, f"o_tiles {tiles}, expected {stored} whole tiles, {where}"
            if out_valid:
                needed = (self.rows_out // rows + 1) * rows
                assert self.rows_in >= needed, (
                    f"o_row valid with only {self.rows_in - self.rows_out // rows * rows} of "
                    f"{rows} rows of the tile stored, {where}")
            elif gap_possible:
                raise AssertionError(f"o_row not valid in the middle of a tile, {where}")
            self.max_tiles = max(self.max_tiles, tiles)
            in_xfer = bool(dut.i_row__valid.value) and bool(dut.i_row__ready.value)
            out_xfer = out_valid and bool(dut.o_row__ready.value)
            self.rows_in += in_xfer
            self.rows_out += out_xfer
            # Once valid, o_row stays valid until the tile's last row has been read.
            gap_possible = out_valid and not (out_xfer and self.rows_out % rows == 0)

    def make_tile(self) -> list[dict]:
        """Payloads of one random tile (random signedness)."""
        cfg = self.config
        signed = bool(self.rng.integers(2))
        lo, hi = operand_range(signed, cfg.data_width)
        tile = self.rng.integers(lo, hi + 1, size=(cfg.rows, cfg.cols))
        return [{"data": to_raw(row).tolist(), "signed": int(signed)} for row in tile]

    def queue_rows(self, payloads: list[dict]) -> None:
        for payload in payloads:
            self.source.append(payload)
            self.scoreboard.expect(row_vector(payload))
            self.queued += 1

    def queue_tiles(self, count: int) -> None:
        for _ in range(count):
            self.queue_rows(self.make_tile())

    async def finish(self, slack: int = 3) -> None:
        limit = 50 + slack * self.queued
        waited = 0
        while self.scoreboard.outstanding and not self.scoreboard.errors and waited < limit:
            await ClockCycles(self.dut.clk, 8)
            waited += 8
        await ClockCycles(self.dut.clk, 2 * self.rows + 8)
        self.scoreboard.check_done()
        assert self.source.pending() == 0
        assert self.rows_in == self.rows_out == self.queued, (
            f"{self.rows_in} rows in, {self.rows_out} out, {self.queued} queued "
            f"(seed {self.seed})")
        self.log.info("%d rows checked, at most %d tiles stored", self.queued, self.max_tiles)


async def start(dut, seed: int, **stalls) -> Testbench:
    tb = Testbench(dut, seed, **stalls)
    await tb.reset()
    return tb


@cocotb.test()
@cocotb.parametrize(pattern=["none", "light", "heavy", "bursts"])
async def test_order(dut, pattern: str):
    """Random rows through the FIFO under idle/backpressure patterns: order kept, nothing
    lost or doubled, contract checked every cycle."""
    seed = 200 + ["none", "light", "heavy", "bursts"].index(pattern)
    stalls = {
        "none": {},
        "light": {"idle": random_stalls(seed + 1, 0.2),
                  "backpressure": random_stalls(seed + 2, 0.2)},
        "heavy": {"idle": random_stalls(seed + 1, 0.5),
                  "backpressure": random_stalls(seed + 2, 0.7)},
        "bursts": {"idle": burst_stalls(seed + 1, 12),
                   "backpressure": burst_stalls(seed + 2, 24)},
    }[pattern]
    tb = await start(dut, seed, **stalls)
    tb.queue_tiles(3 * DEPTH)
    await tb.finish(slack=12)


@cocotb.test()
async def test_fill(dut):
    """With the consumer stalled the FIFO takes exactly ``depth`` tiles, then holds
    ``i_row`` off; released, it delivers them all in order."""
    tb = await start(dut, 210, backpressure=iter(lambda: True, None))
    tb.queue_tiles(DEPTH + 2)
    await ClockCycles(dut.clk, (DEPTH + 2) * tb.rows + 20)
    await ReadOnly()
    assert tb.source.sent == DEPTH * tb.rows, (
        f"FIFO took {tb.source.sent} rows with the consumer stalled, not {DEPTH * tb.rows}")
    assert dut.i_row__ready.value == 0, "i_row ready while full"
    assert dut.o_tiles.value.to_unsigned() == DEPTH
    assert dut.o_row__valid.value == 1
    assert tb.rows_out == 0
    await FallingEdge(dut.clk)
    tb.sink.set_backpressure_generator(None)
    await tb.finish()
    assert tb.max_tiles == DEPTH


@cocotb.test()
async def test_partial_tile(dut):
    """A tile missing its last row is never offered; the last row makes it whole."""
    tb = await start(dut, 220)
    tile = tb.make_tile()
    tb.queue_rows(tile[:-1])
    await ClockCycles(dut.clk, 3 * tb.rows + 10)
    await ReadOnly()
    assert tb.rows_in == tb.rows - 1
    assert dut.o_row__valid.value == 0, "partial tile offered"
    assert dut.o_tiles.value.to_unsigned() == 0
    await FallingEdge(dut.clk)
    tb.queue_rows(tile[-1:])
    await tb.finish()
