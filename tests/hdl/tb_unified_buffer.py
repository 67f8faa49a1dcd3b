"""cocotb testbench: the unified buffer (two write clients on one port, two read ports).

The DUT is ``UnifiedBuffer(depth=, row_elems=)`` with the sizes in ``AMTPU_UB`` (JSON, set
by ``test_unified_buffer.py``). A sampler looks at every port each cycle (``ReadOnly`` after
the falling edge, so a sampled ``valid & ready`` is a transfer at the next rising edge) and
keeps a Python model of the memory:

- a read accepted in a cycle is answered with the model's row *before* that cycle's write
  (read-before-write in simulation: the DUT's read ports are not transparent; a part may
  return anything then, and the directed test does not check that read; with
  ``pipelined`` simulation returns anything too, the DP16KD model's inverted row, and only
  its arrival is checked; its rows arrive two cycles after their addresses, else one);
- the write accepted in that cycle is then applied to the model (``pipelined``: in the next
  cycle, when it lands in the block RAM; a read accepted then meets it).

Each read port's responses go to an in-order scoreboard fed from that model, so every row
read is predicted exactly. The sampler also checks that at most one write is accepted per
cycle, and the per-writer lists of accepted requests must equal what was queued (nothing
lost, doubled or reordered). The memory keeps its contents from one cocotb test to the next
in the same simulation, so every test starts by writing every row.
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge

from hdl.ports import write_request_layout
from sim.rtl.scoreboard import Scoreboard
from sim.rtl.streams import (
    StreamDriver,
    StreamMonitor,
    burst_stalls,
    random_stalls,
    reset,
    start_clock,
    unpack,
)

ENV = "AMTPU_UB"
PATTERNS = ["none", "light", "heavy", "bursts"]


def sizes_from_env() -> tuple[int, int]:
    """``(depth, row_elems)`` of the DUT."""
    value = json.loads(os.environ.get(ENV, '{"depth": 16, "row_elems": 2}'))
    return int(value["depth"]), int(value["row_elems"])


def pipelined_from_env() -> bool:
    """Whether the DUT reads through its block RAMs' output registers (``pipelined``): rows
    two cycles after their addresses, a read that meets a write to its row undefined."""
    return bool(json.loads(os.environ.get(ENV, "{}")).get("pipelined", False))


class Testbench:
    """Clock, reset, two write drivers, two read-address drivers, two response monitors with
    scoreboards, and the per-cycle sampler holding the memory model."""

    def __init__(self, dut, seed: int, *, w_idle=(None, None), r_idle=(None, None),
                 backpressure=(None, None)):
        self.dut = dut
        self.depth, self.row_elems = sizes_from_env()
        self.pipelined = pipelined_from_env()
        self.latency = 2 if self.pipelined else 1
        self.addr_bits = max(1, (self.depth - 1).bit_length())
        self.seed = seed
        self.log = dut._log
        self.log.info("unified_buffer depth=%d row_elems=%d: seed %d",
                      self.depth, self.row_elems, seed)
        self.rng = np.random.default_rng(seed)
        self.row_layout = data.ArrayLayout(unsigned(8), self.row_elems)
        self.w_layout = write_request_layout(self.addr_bits, self.row_layout)
        start_clock(dut)
        clk = dut.clk
        self.writers = [StreamDriver(dut, f"w__{i}", clk, self.w_layout, w_idle[i])
                        for i in range(2)]
        self.readers = [StreamDriver(dut, f"r__{i}__addr", clk, unsigned(self.addr_bits),
                                     r_idle[i]) for i in range(2)]
        self.scoreboards = [Scoreboard(f"unified_buffer d{self.depth} r[{i}].data", seed,
                                       self.log) for i in range(2)]
        self.monitors = [StreamMonitor(dut, f"r__{i}__data", clk, self.row_layout,
                                       backpressure[i], callback=self.scoreboards[i].receive)
                         for i in range(2)]
        self.memory = np.zeros((self.depth, self.row_elems), dtype=np.int64)
        self.queued: list[list[dict]] = [[], []]      # write requests, per writer
        self.accepted: list[list[dict]] = [[], []]    # as sampled at the port
        self.reads_queued = [0, 0]
        self.grants: list[int] = []                   # writer served, per write cycle
        self.both_valid: list[bool] = []              # both writers requesting that cycle
        self.collisions: list[tuple[int, int, int]] = []  # (cycle, reader, addr)
        self.landing: dict | None = None              # pipelined: last cycle's write
        self.cycle = 0
        self.checking = False
        self.errors: list[str] = []
        cocotb.start_soon(self._sample())

    async def reset(self) -> None:
        await reset(self.dut)
        self.checking = True

    def _fail(self, message: str) -> None:
        message = f"{message} (cycle {self.cycle}, seed {self.seed})"
        self.errors.append(message)
        raise AssertionError(message)

    async def _sample(self) -> None:
        dut = self.dut
        w_valid = [dut.w__0__valid, dut.w__1__valid]
        w_ready = [dut.w__0__ready, dut.w__1__ready]
        w_payload = [dut.w__0__payload, dut.w__1__payload]
        r_valid = [dut.r__0__addr__valid, dut.r__1__addr__valid]
        r_ready = [dut.r__0__addr__ready, dut.r__1__addr__ready]
        r_payload = [dut.r__0__addr__payload, dut.r__1__addr__payload]
        while True:
            await FallingEdge(dut.clk)
            await ReadOnly()
            if not self.checking:
                continue
            self.cycle += 1
            # Reads see the memory as it was before this cycle's write.
            read_addrs = {}
            for i in range(2):
                if r_valid[i].value and r_ready[i].value:
                    read_addrs[i] = r_payload[i].value.to_unsigned()
            valid = [bool(w_valid[i].value) for i in range(2)]
            xfer = [valid[i] and bool(w_ready[i].value) for i in range(2)]
            if xfer[0] and xfer[1]:
                self._fail("both writers accepted in one cycle (one write port)")
            if any(valid) and not any(xfer):
                self._fail(f"writers valid {valid} but none accepted")
            write = None
            for i in range(2):
                if not xfer[i]:
                    continue
                write = unpack(self.w_layout, w_payload[i].value.to_unsigned())
                self.accepted[i].append(write)
                self.grants.append(i)
                self.both_valid.append(all(valid))
            # Pipelined, the write accepted in the last cycle lands in this one.
            landing = self.landing if self.pipelined else write
            for reader, read_addr in read_addrs.items():
                if landing is not None and read_addr == landing["addr"]:
                    self.collisions.append((self.cycle, reader, read_addr))
                    if self.pipelined:
                        # The block RAM's read meets the write to its row: undefined.
                        self.scoreboards[reader].expect_undefined()
                        continue
                self.scoreboards[reader].expect(self.memory[read_addr].copy())
            if landing is not None:
                self.memory[landing["addr"]] = landing["data"]
            self.landing = write

    # Stimulus -------------------------------------------------------------------------------

    def random_row(self) -> list[int]:
        return self.rng.integers(0, 256, size=self.row_elems).tolist()

    def queue_write(self, writer: int, addr: int, row: list[int] | None = None) -> dict:
        request = {"addr": int(addr), "data": row if row is not None else self.random_row()}
        self.writers[writer].append(request)
        self.queued[writer].append(request)
        return request

    def queue_read(self, reader: int, addr: int) -> None:
        self.readers[reader].append(int(addr))
        self.reads_queued[reader] += 1

    def random_addrs(self, count: int, hot: int = 4) -> list[int]:
        """Half from a few hot rows (so reads meet recent writes), half anywhere."""
        hot_rows = self.rng.choice(self.depth, size=min(hot, self.depth), replace=False)
        anywhere = self.rng.integers(0, self.depth, size=count)
        pick_hot = self.rng.random(count) < 0.5
        return np.where(pick_hot, self.rng.choice(hot_rows, size=count), anywhere).tolist()

    async def fill(self) -> None:
        """Write every row with random data (the memory outlives a cocotb test)."""
        for addr in range(self.depth):
            self.queue_write(addr % 2, addr)
        await self.wait_done()

    async def wait_done(self, limit: int | None = None) -> None:
        """Wait until every queued request has been served and every response received."""
        pending = (sum(len(q) for q in self.queued) + sum(self.reads_queued)) or 1
        limit = limit or 100 + 20 * pending
        waited = 0
        while waited < limit and not self.errors and (
                any(w.pending() for w in self.writers + self.readers)
                or any(s.outstanding for s in self.scoreboards)):
            await ClockCycles(self.dut.clk, 4)
            waited += 4
        assert not self.errors, self.errors[0]
        assert waited < limit, (
            f"timeout after {waited} cycles: {[w.pending() for w in self.writers]} writes and "
            f"{[r.pending() for r in self.readers]} reads pending, "
            f"{[s.outstanding for s in self.scoreboards]} responses outstanding "
            f"(seed {self.seed})")

    async def finish(self) -> None:
        await self.wait_done()
        await ClockCycles(self.dut.clk, 4)
        assert not self.errors, self.errors[0]
        for i in range(2):
            self.scoreboards[i].check_done()
            assert len(self.monitors[i].received) == self.reads_queued[i], (
                f"r[{i}].data: {len(self.monitors[i].received)} responses for "
                f"{self.reads_queued[i]} reads (seed {self.seed})")
            accepted, queued = self.accepted[i], self.queued[i]
            pairs = enumerate(zip(accepted, queued, strict=False))
            differ = next((k for k, (a, q) in pairs if a != q), min(len(accepted), len(queued)))
            assert accepted == queued, (
                f"w[{i}]: {len(accepted)} writes accepted, {len(queued)} queued; first "
                f"difference at write {differ} (seed {self.seed})")
            assert self.writers[i].sent == len(self.queued[i])

    def check_no_starvation(self) -> None:
        """Round robin between two: a requesting writer waits at most one cycle per beat."""
        for i, writer in enumerate(self.writers):
            if writer.stalls:
                beats, waits = np.unique(writer.stalls, return_counts=True)
                worst = int(waits.max())
                assert worst <= 1, (
                    f"w[{i}] beat {int(beats[waits.argmax()])} waited {worst} cycles with "
                    f"round-robin arbitration (at most 1 allowed) (seed {self.seed})")


async def start(dut, seed: int, **stalls) -> Testbench:
    tb = Testbench(dut, seed, **stalls)
    await tb.reset()
    await tb.fill()
    return tb


def stall_patterns(pattern: str, seed: int) -> dict:
    def gen(offset: int, p: float, run: int):
        if pattern == "none":
            return None
        if pattern == "bursts":
            return burst_stalls(seed + offset, run)
        return random_stalls(seed + offset, p)
    light = pattern == "light"
    return {
        "w_idle": (gen(1, 0.3 if light else 0.6, 6), gen(2, 0.3 if light else 0.6, 6)),
        "r_idle": (gen(3, 0.2 if light else 0.5, 6), gen(4, 0.2 if light else 0.5, 6)),
        "backpressure": (gen(5, 0.2 if light else 0.7, 10), gen(6, 0.3 if light else 0.6, 10)),
    }


@cocotb.test()
@cocotb.parametrize(pattern=PATTERNS)
async def test_random(dut, pattern: str):
    """Both writers and both readers busy at once under random idle and backpressure: every
    read predicted by the model (writes applied in accepted order, reads before the same
    cycle's write), no write lost or doubled, reads in order, no writer waits > 1 cycle."""
    seed = 300 + PATTERNS.index(pattern)
    tb = await start(dut, seed, **stall_patterns(pattern, seed))
    count = 40 + 4 * tb.depth
    for writer in range(2):
        for addr in tb.random_addrs(count):
            tb.queue_write(writer, addr)
    for reader in range(2):
        for addr in tb.random_addrs(count):
            tb.queue_read(reader, addr)
    await tb.finish()
    tb.check_no_starvation()
    assert tb.collisions, f"no same-row read/write in one cycle was exercised (seed {seed})"
    tb.log.info("%d writes, %d reads, %d same-cycle read/write collisions",
                sum(len(a) for a in tb.accepted), sum(tb.reads_queued), len(tb.collisions))


@cocotb.test()
async def test_read_during_write(dut):
    """A read and a write of the same row accepted in the same cycle: the read returns the
    OLD row (read-before-write), a read one cycle later the new one; for both writers and
    both readers. ``pipelined``: the write lands a cycle later, so the same-cycle read
    returns the old row, the next one meets the write, and the one after returns the new
    row."""
    tb = await start(dut, 320)
    reads = 3 if tb.pipelined else 2
    for writer in range(2):
        addr = int(tb.rng.integers(tb.depth))
        old = tb.memory[addr].tolist()
        new = [(v + 1 + k) % 256 for k, v in enumerate(old)]
        await RisingEdge(dut.clk)
        # Queued between edges: the write and each reader's first read are offered at the
        # next falling edge, the other reads in the cycles after.
        tb.queue_write(writer, addr, new)
        for _ in range(reads):
            tb.queue_read(0, addr)
            tb.queue_read(1, addr)
        await tb.wait_done()
        for reader in range(2):
            got = tb.monitors[reader].received[-reads:]
            # The read that meets the write is undefined on a part
            # (simulation gives the old row; pipelined, the DP16KD model's inverted row,
            # checked below): only the others are checked.
            if tb.pipelined:
                assert got[1] == [255 - v for v in old], (
                    f"the read of row {addr} by r[{reader}] that meets the landing write: got "
                    f"{got[1]}, expected the model's inverted old row (seed {tb.seed})")
                want = [old, got[1], new]
            else:
                want = [got[0], new]
            assert got == want, (
                f"w[{writer}] row {addr} {old} -> {new} with reads by r[{reader}] in the same "
                f"and the following cycles: got {got}, expected {want} (seed {tb.seed})")
        same = [c for c in tb.collisions if c[2] == addr]
        assert {reader for _, reader, _ in same[-2:]} == {0, 1}, (
            f"reads of row {addr} not accepted in the write's cycle: {tb.collisions} "
            f"(seed {tb.seed})")
    await tb.finish()


@cocotb.test()
async def test_fairness(dut):
    """Both writers always valid: they alternate strictly, one write per cycle."""
    tb = await start(dut, 330)
    start_grants = len(tb.grants)
    count = 4 * tb.depth
    for writer in range(2):
        for addr in tb.random_addrs(count):
            tb.queue_write(writer, addr)
    await tb.finish()
    grants = tb.grants[start_grants:]
    both = tb.both_valid[start_grants:]
    assert len(grants) == 2 * count
    contended = [g for g, b in zip(grants, both, strict=True) if b]
    assert len(contended) >= 2 * count - 2, (
        f"only {len(contended)} of {2 * count} writes had both writers requesting "
        f"(seed {tb.seed})")
    runs = [k for k in range(1, len(contended)) if contended[k] == contended[k - 1]]
    assert not runs, (
        f"writer {contended[runs[0]]} served twice in a row at contended write {runs[0]} "
        f"with both requesting: {contended[max(0, runs[0] - 4):runs[0] + 2]} (seed {tb.seed})")
    cycles = sorted(tb.writers[0].sent_cycles[-count:] + tb.writers[1].sent_cycles[-count:])
    assert cycles == list(range(cycles[0], cycles[0] + 2 * count)), (
        f"write port idle while both writers requested (seed {tb.seed})")
    tb.check_no_starvation()


@cocotb.test()
async def test_throughput(dut):
    """With no stalls each read port answers a row every cycle, while writes go on."""
    tb = await start(dut, 340)
    count = 4 * tb.depth
    for reader in range(2):
        for addr in tb.random_addrs(count):
            tb.queue_read(reader, addr)
    for addr in tb.random_addrs(count):
        tb.queue_write(1, addr)
    await tb.finish()
    for i in range(2):
        sent = tb.readers[i].sent_cycles[-count:]
        assert sent == list(range(sent[0], sent[0] + count)), (
            f"r[{i}].addr stalled: took {count} addresses in {sent[-1] - sent[0] + 1} cycles "
            f"(seed {tb.seed})")
        got = tb.monitors[i].cycles[-count:]
        assert got == [c + tb.latency for c in sent], (
            f"r[{i}].data responses not {tb.latency} cycle(s) after their addresses "
            f"(seed {tb.seed})")
