"""cocotb testbench: the accumulator memory (overwrite or add rows in place, read them back).

The DUT is ``Accumulators(depth=, cols=)`` with the sizes in ``AMTPU_ACC`` (JSON, set by
``test_accumulators.py``). A sampler looks at the ports every cycle (``ReadOnly`` after the
falling edge) and keeps a numpy model of the memory, in int32 with ``golden.wrap``. Timing
it checks, as observed and documented by ``Accumulators``:

- ``i_psum`` is always ready (after reset);
- a row accepted in cycle ``c`` is written at the end of cycle ``c + L``, and ``o_written``
  is high in exactly that cycle ``c + L`` (``L`` = 1; 4 with ``registered``);
- the row it adds to is the memory's row *including* the write of cycle ``c`` (the RMW read
  is transparent) with ``registered``, so back-to-back rows to one address add up; without it the
  psum driver keeps the block's rule instead: it leaves a cycle before a row that
  accumulates into the address of the row it sent in the cycle before;
- the read client is read-before-write: a read accepted in cycle ``c + L`` (while the row is
  being written) returns the old row, one accepted in ``c + L + 1`` the new one (without
  ``registered`` the first is undefined on a part, and simulation's old row is not checked;
  with ``registered`` it is undefined in simulation too, the DP16KD model's inverted
  row, and only its arrival is checked). With ``registered`` a read's row arrives two
  cycles after its address, else one.

Reads go to an in-order scoreboard fed by that model. The memory keeps its contents from one
cocotb test to the next, so every test starts by overwriting every row.
"""

from __future__ import annotations

import itertools
import json
import os

import cocotb
import numpy as np
from amaranth.hdl import signed, unsigned
from amaranth.lib import data
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge

from hdl.layouts import psum_write_layout
from sim.models.golden import wrap
from sim.rtl.scoreboard import Scoreboard
from sim.rtl.streams import (
    StreamDriver,
    StreamMonitor,
    burst_stalls,
    never,
    random_stalls,
    reset,
    start_clock,
    unpack,
)

ENV = "AMTPU_ACC"
PATTERNS = ["none", "light", "heavy", "bursts"]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
EXTREMES = [INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX]


def sizes_from_env() -> tuple[int, int]:
    """``(depth, cols)`` of the DUT."""
    value = json.loads(os.environ.get(ENV, '{"depth": 16, "cols": 2}'))
    return int(value["depth"]), int(value["cols"])


def registered_from_env() -> bool:
    """Whether the DUT has the ``registered`` pipeline (and with it, rows to one address
    back to back)."""
    return bool(json.loads(os.environ.get(ENV, "{}")).get("registered"))


def latency_from_env() -> int:
    """Cycles from taking a row to writing it: 4 with ``registered``, else 1."""
    return 4 if registered_from_env() else 1


class Testbench:
    """Clock, reset, psum driver, read-address driver, response monitor with scoreboard and
    the per-cycle sampler holding the memory model."""

    def __init__(self, dut, seed: int, *, psum_idle=None, read_idle=None, backpressure=None):
        self.dut = dut
        self.depth, self.cols = sizes_from_env()
        self.latency = latency_from_env()
        self.registered = registered_from_env()
        self.addr_bits = max(1, (self.depth - 1).bit_length())
        self.seed = seed
        self.log = dut._log
        self.log.info("accumulators depth=%d cols=%d: seed %d", self.depth, self.cols, seed)
        self.rng = np.random.default_rng(seed)
        self.psum_layout = psum_write_layout(self.addr_bits, self.cols, 32)
        self.row_layout = data.ArrayLayout(signed(32), self.cols)
        self.scoreboard = Scoreboard(f"accumulators d{self.depth}x{self.cols}", seed, self.log)
        start_clock(dut)
        clk = dut.clk
        self.bypass = registered_from_env()
        self.psum = StreamDriver(dut, "i_psum", clk, self.psum_layout,
                                 psum_idle if self.bypass else self._gapped(psum_idle))
        self.reader = StreamDriver(dut, "r__addr", clk, unsigned(self.addr_bits), read_idle)
        self.monitor = StreamMonitor(dut, "r__data", clk, self.row_layout, backpressure,
                                     callback=self.scoreboard.receive)
        self.memory = np.zeros((self.depth, self.cols), dtype=np.int64)
        self.queued: list[dict] = []
        self.accepted: list[dict] = []
        self.reads_queued = 0
        self.written = 0
        self.read_during_write = 0     # reads accepted while their row was being written
        self.cycle = 0
        self.checking = False
        self.errors: list[str] = []
        cocotb.start_soon(self._sample())

    async def reset(self) -> None:
        await reset(self.dut)
        self.checking = True

    def _gapped(self, idle):
        """*idle*, and idle where the next row would accumulate into the address of the row
        sent in the cycle before (the rule of a block without ``bypass``)."""
        base = iter(idle) if idle is not None else never()
        while True:
            stall = next(base)
            driver = self.psum
            if (not stall and driver.pending() and driver.sent
                    and driver.sent_cycles[-1] == driver.cycle - 1):
                head, last = driver._queue[0][0], self.queued[driver.sent - 1]
                stall = bool(head["accumulate"]) and head["addr"] == last["addr"]
            yield stall

    def _fail(self, message: str) -> None:
        message = f"{message} (cycle {self.cycle}, seed {self.seed})"
        self.errors.append(message)
        self.log.error(message)
        raise AssertionError(message)

    async def _sample(self) -> None:
        dut = self.dut
        # Rows accepted in the last `latency` cycles (None: none), oldest first: the first
        # is written this cycle.
        pipe: list[dict | None] = [None] * self.latency
        while True:
            await FallingEdge(dut.clk)
            await ReadOnly()
            if not self.checking:
                continue
            self.cycle += 1
            if not dut.i_psum__ready.value:
                self._fail("i_psum not ready")
            # A read sees the memory before this cycle's write.
            read_addr = None
            if dut.r__addr__valid.value and dut.r__addr__ready.value:
                read_addr = dut.r__addr__payload.value.to_unsigned()
            written = bool(dut.o_written.value)
            pending = pipe.pop(0)
            if read_addr is not None:
                if self.registered and pending is not None and pending["addr"] == read_addr:
                    # The block RAM's read meets the write to its row: undefined.
                    self.scoreboard.expect_undefined()
                else:
                    self.scoreboard.expect(self.memory[read_addr].copy())
            if written != (pending is not None):
                self._fail(f"o_written {int(written)}, expected {int(pending is not None)} "
                           f"(a row accepted {self.latency} cycle(s) before: "
                           f"{pending is not None})")
            if pending is not None:
                addr = pending["addr"]
                old = self.memory[addr] if pending["accumulate"] else 0
                self.memory[addr] = wrap(old + np.asarray(pending["data"], dtype=np.int64))
                self.written += 1
                self.read_during_write += read_addr == addr
            taken = None
            if dut.i_psum__valid.value and dut.i_psum__ready.value:
                taken = unpack(self.psum_layout, dut.i_psum__payload.value.to_unsigned())
                self.accepted.append(taken)
            pipe.append(taken)

    # Stimulus -------------------------------------------------------------------------------

    def random_data(self) -> list[int]:
        """Random sums: a mix of extremes, small and full-range values."""
        kind = self.rng.integers(3, size=self.cols)
        extreme = self.rng.choice(EXTREMES, size=self.cols)
        small = self.rng.integers(-1000, 1001, size=self.cols)
        full = self.rng.integers(INT32_MIN, INT32_MAX, size=self.cols, endpoint=True)
        return np.choose(kind, [extreme, small, full]).tolist()

    def queue_psum(self, addr: int, accumulate: bool, row=None) -> dict:
        request = {"addr": int(addr), "accumulate": int(accumulate),
                   "data": [int(v) for v in (row if row is not None else self.random_data())]}
        self.psum.append(request)
        self.queued.append(request)
        return request

    def queue_read(self, addr: int) -> None:
        self.reader.append(int(addr))
        self.reads_queued += 1

    async def fill(self) -> None:
        for addr in range(self.depth):
            self.queue_psum(addr, False)
        await self.wait_done()

    async def read_rows(self, addrs) -> list[list[int]]:
        """Read *addrs* once everything queued is written; the rows as received."""
        await self.wait_done()
        first = len(self.monitor.received)
        for addr in addrs:
            self.queue_read(addr)
        await self.wait_done()
        return self.monitor.received[first:]

    async def wait_done(self, limit: int | None = None) -> None:
        """Wait until every queued row is written and every read answered."""
        limit = limit or 100 + 20 * (len(self.queued) + self.reads_queued)
        waited = 0
        while waited < limit and not self.errors and (
                self.psum.pending() or self.reader.pending() or self.scoreboard.outstanding
                or self.written < len(self.queued)):
            await ClockCycles(self.dut.clk, 2)
            waited += 2
        assert not self.errors, self.errors[0]
        assert waited < limit, (
            f"timeout after {waited} cycles: {self.psum.pending()} rows and "
            f"{self.reader.pending()} reads pending, {self.written} of {len(self.queued)} "
            f"written, {self.scoreboard.outstanding} responses outstanding (seed {self.seed})")

    async def finish(self) -> None:
        await self.wait_done()
        await ClockCycles(self.dut.clk, 4)
        assert not self.errors, self.errors[0]
        self.scoreboard.check_done()
        assert self.accepted == self.queued, (
            f"{len(self.accepted)} rows accepted, {len(self.queued)} queued (seed {self.seed})")
        assert self.written == len(self.queued), (
            f"o_written pulsed {self.written} times for {len(self.queued)} rows "
            f"(seed {self.seed})")
        assert len(self.monitor.received) == self.reads_queued


async def start(dut, seed: int, **stalls) -> Testbench:
    tb = Testbench(dut, seed, **stalls)
    await tb.reset()
    await tb.fill()
    return tb


@cocotb.test()
async def test_wrap(dut):
    """Overwrite, then accumulate across the int32 limits: 2**31-1 + 1 -> -2**31,
    -2**31 + -1 -> 2**31-1, -2**31 + -2**31 -> 0; an overwrite discards the old sum."""
    tb = await start(dut, 400)
    cols = tb.cols
    addr = int(tb.rng.integers(tb.depth))
    steps = [
        # (accumulate, data per column pattern, expected row afterwards)
        (False, [INT32_MAX, INT32_MIN], [INT32_MAX, INT32_MIN]),
        (True, [1, -1], [INT32_MIN, INT32_MAX]),
        (True, [-1, 1], [INT32_MAX, INT32_MIN]),
        (True, [INT32_MAX, INT32_MIN], [-2, 0]),
        (True, [INT32_MIN, INT32_MIN], [INT32_MAX - 1, INT32_MIN]),
        (False, [5, -7], [5, -7]),
        (True, [INT32_MAX, INT32_MAX], [INT32_MIN + 4, INT32_MAX - 7]),
    ]
    for accumulate, pattern, expected in steps:
        tb.queue_psum(addr, accumulate, [pattern[c % 2] for c in range(cols)])
        (got,) = await tb.read_rows([addr])
        want = [expected[c % 2] for c in range(cols)]
        assert got == want, (
            f"row {addr} after {'adding' if accumulate else 'writing'} {pattern}: got {got}, "
            f"expected {want} (seed {tb.seed})")
    await tb.finish()


@cocotb.test()
async def test_same_address(dut):
    """Rows to one address on consecutive cycles (accumulate, overwrite then accumulate,
    two addresses interleaved): the transparent RMW read sums them all."""
    tb = await start(dut, 410)
    a, b = (int(x) for x in tb.rng.choice(tb.depth, size=2, replace=False))
    # 1. Overwrite then 12 accumulates on back-to-back cycles.
    await RisingEdge(dut.clk)
    rows = [tb.random_data() for _ in range(13)]
    tb.queue_psum(a, False, rows[0])
    for row in rows[1:]:
        tb.queue_psum(a, True, row)
    (got,) = await tb.read_rows([a])
    want = wrap(np.sum(np.asarray(rows, dtype=np.int64), axis=0)).tolist()
    assert got == want, f"13 back-to-back rows to {a}: got {got}, expected {want} (seed {tb.seed})"
    cycles = tb.psum.sent_cycles[-13:]
    step = 1 if tb.bypass else 2        # without the bypass, a cycle between them
    assert cycles == list(range(cycles[0], cycles[0] + step * 13, step)), \
        f"rows not {step} cycle(s) apart: {cycles}"
    # 2. A, B, A, A, B, A (accumulate) and an overwrite in the middle of A's run.
    base = {a: tb.memory[a].copy(), b: tb.memory[b].copy()}
    plan = [(a, True), (b, True), (a, True), (a, False), (a, True), (b, True), (a, True)]
    sums = {a: base[a], b: base[b]}
    for addr, accumulate in plan:
        row = np.asarray(tb.queue_psum(addr, accumulate)["data"], dtype=np.int64)
        sums[addr] = wrap((sums[addr] if accumulate else 0) + row)
    got = await tb.read_rows([a, b])
    want = [sums[a].tolist(), sums[b].tolist()]
    assert got == want, f"interleaved rows to {a}, {b}: got {got}, expected {want} (seed {tb.seed})"
    # 3. Two rows to A with 0-5 rows to other addresses between them, back to back: the
    # second is 1-6 cycles behind the first (each forwarding distance of the registered
    # pipeline, and the first that reads A's row from the block RAM).
    for gap in range(1, 7):
        others = [int(x) for x in tb.rng.choice([x for x in range(tb.depth) if x != a],
                                                size=gap - 1, replace=False)]
        sums = {addr: tb.memory[addr].copy() for addr in [a] + others}
        first = len(tb.psum.sent_cycles)
        for addr in [a] + others + [a]:
            row = np.asarray(tb.queue_psum(addr, True)["data"], dtype=np.int64)
            sums[addr] = wrap(sums[addr] + row)
        got = await tb.read_rows([a] + others)
        want = [sums[addr].tolist() for addr in [a] + others]
        assert got == want, (f"rows to {a} {gap} cycle(s) apart (between them {others}): got "
                             f"{got}, expected {want} (seed {tb.seed})")
        cycles = tb.psum.sent_cycles[first:]
        # (Without the bypass the driver leaves a cycle between two rows to A.)
        spacing = step if gap == 1 else gap
        assert cycles[-1] - cycles[0] == spacing, f"rows not back to back: {cycles}"
    await tb.finish()


@cocotb.test()
async def test_read_during_write(dut):
    """A read accepted in the cycle ``o_written`` pulses for its row returns the old row
    (undefined without the bypass or with the registered read); one accepted a cycle later
    the new row."""
    tb = await start(dut, 420)
    addr = int(tb.rng.integers(tb.depth))
    old = tb.memory[addr].tolist()
    await RisingEdge(dut.clk)
    request = tb.queue_psum(addr, True)
    new = wrap(np.asarray(old) + np.asarray(request["data"])).tolist()
    # Next falling edge: the row is accepted; `latency` idle read slots, then reads in the
    # write's cycle and in the cycle after it.
    tb.reader.set_idle_generator(itertools.chain([True] * tb.latency, never()))
    tb.queue_read(addr)
    tb.queue_read(addr)
    await tb.wait_done()
    got = tb.monitor.received[-2:]
    # Without the bypass, or with the registered read, the block RAM may return anything to
    # the read in the write's cycle (the core never uses such a read); simulation gives the
    # old row without the bypass, the DP16KD model's inverted row with the registered read.
    want = [old, new] if tb.bypass and tb.latency == 1 else [got[0], new]
    if tb.registered:
        assert got[0] == wrap(~np.asarray(old, dtype=np.int64)).tolist(), (
            f"the colliding read of row {addr}: got {got[0]}, expected the model's inverted "
            f"old row (seed {tb.seed})")
    assert got == want, (
        f"reads of row {addr} in the write cycle and the next: got {got}, expected "
        f"{want} (seed {tb.seed})")
    assert tb.read_during_write >= 1
    assert tb.reader.sent_cycles[-2] == tb.psum.sent_cycles[-1] + tb.latency
    await tb.finish()


@cocotb.test()
@cocotb.parametrize(pattern=PATTERNS)
async def test_random(dut, pattern: str):
    """Random addresses (hot rows and anywhere), random overwrite/accumulate, extreme and
    random sums, with concurrent reads under idle and backpressure; every read checked
    against the model, o_written once per row exactly ``latency`` cycles after it."""
    seed = 430 + PATTERNS.index(pattern)
    stalls = {
        "none": {},
        "light": {"psum_idle": random_stalls(seed + 1, 0.2),
                  "read_idle": random_stalls(seed + 2, 0.3),
                  "backpressure": random_stalls(seed + 3, 0.3)},
        "heavy": {"psum_idle": random_stalls(seed + 1, 0.6),
                  "read_idle": random_stalls(seed + 2, 0.5),
                  "backpressure": random_stalls(seed + 3, 0.7)},
        "bursts": {"psum_idle": burst_stalls(seed + 1, 6),
                   "read_idle": burst_stalls(seed + 2, 6),
                   "backpressure": burst_stalls(seed + 3, 10)},
    }[pattern]
    tb = await start(dut, seed, **stalls)
    count = 40 + 8 * tb.depth
    hot = tb.rng.choice(tb.depth, size=3, replace=False)
    for _ in range(count):
        addr = tb.rng.choice(hot) if tb.rng.random() < 0.6 else tb.rng.integers(tb.depth)
        tb.queue_psum(addr, tb.rng.random() < 0.75)
        if tb.rng.random() < 0.8:
            tb.queue_read(tb.rng.choice(hot) if tb.rng.random() < 0.6
                          else tb.rng.integers(tb.depth))
    await tb.finish()
    # The final state, read at leisure, as well.
    rows = await tb.read_rows(range(tb.depth))
    assert rows == tb.memory.tolist()
    assert tb.read_during_write, f"no read met its row's write (seed {seed})"
    tb.log.info("%d rows, %d reads, %d reads during their row's write", len(tb.queued),
                tb.reads_queued, tb.read_during_write)
