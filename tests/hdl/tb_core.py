"""cocotb testbench: the whole core, driven through its host stream, against the ISA
simulator (:class:`sim.models.isa_sim.IsaSim`).

Every beat the core sends (unified-buffer rows, counters, DONE beats) is compared with ``==``
to the beat the ISA simulator sends for the same program; only the counters that depend on
timing are not compared. Host beats arrive with random idle cycles and the core's answers
meet random back-pressure. Seeds are fixed, logged and named in every failure.
"""

from __future__ import annotations

import bisect
import json
import os

import cocotb
import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data
from cocotb.triggers import FallingEdge
from progen import check_counter_invariants, check_counter_timing, random_bytes, random_program

from firmware.asm import Program, data_beats, decode, disassemble
from firmware.gemm import gemm_program, gemm_reference
from hdl.beats import DONE_MAGIC
from hdl.isa import (
    COUNTERS,
    INSTR_BITS,
    RESYNC_WORD,
    TABLE_ENTRIES,
    ErrorCode,
    Func,
    Opcode,
    Pool,
    Status,
)
from sim.models.isa_sim import IsaSim, beats_match, error_beat
from sim.rtl.runner import config_from_env
from sim.rtl.streams import StreamDriver, StreamMonitor, random_stalls, reset, start_clock

STATUS = data.Layout.cast(Status)
ERROR_BIT = 1 << STATUS["error"].offset
HALTED_BIT = 1 << STATUS["halted"].offset

#: check()'s time limit, in cycles: a base (the memories cleared after a reset, pipeline
#: latencies) plus an allowance per beat queued and per row the queued instructions move.
TIMEOUT_BASE = 2_000
TIMEOUT_PER_BEAT = 16
TIMEOUT_PER_ROW = 4
#: The longest a working core goes without taking or sending a beat is the time its engines
#: take to drain all they may hold; check() allows the base plus this many cycles a row.
QUIET_PER_ROW = 4


class Testbench:
    """Clock, reset, the host-stream driver and monitor, and the reference model.

    Every beat for the core goes through :meth:`send` (run by the reference too) or
    :meth:`drive` (the driver alone), so that a failure can name the last instruction the
    core accepted.
    """

    def __init__(self, dut, seed: int, idle: float = 0.0, backpressure: float = 0.0):
        self.dut = dut
        self.seed = seed
        self.config = config_from_env()
        self.ref = IsaSim(self.config)
        host = unsigned(self.config.host_width)
        start_clock(dut)
        dut.i_clear.value = 0
        self.driver = StreamDriver(dut, "i_host", dut.clk, host,
                                   random_stalls(seed, idle) if idle else None)
        self.monitor = StreamMonitor(dut, "o_host", dut.clk, host,
                                     random_stalls(seed + 1, backpressure) if backpressure
                                     else None)
        self.expected: list[int | None] = []
        self.stream: list[int] = []         # every beat given to the driver, in order
        self.starts: list[int] = []         # positions in it of the instruction words
        self.resyncs: list[int] = []        # ... and of the resynchronisation words
        self._data_left = 0                 # data beats owed by the last instruction
        self._unchecked = 0                 # beats queued since the last check
        self._rows = 0                      # rows of work queued since the last check
        dut._log.info(f"seed {seed}, config {self.config}")

    async def reset(self):
        await reset(self.dut)

    def send(self, beats: list[int]):
        """Queue a program; the reference runs it to completion."""
        self.expected.extend(self.ref.run(beats))
        self.drive(beats)

    def drive(self, beats: list[int]):
        """Queue beats for the core without the reference."""
        cfg = self.config
        for beat in beats:
            beat = int(beat)
            if beat & ((1 << INSTR_BITS) - 1) == RESYNC_WORD:
                # (Data to the core after an instruction that takes data, but the parse here
                # cannot know which instructions an error discarded: resynchronise it.)
                self.resyncs.append(len(self.stream))
                self._data_left = 0
            elif self._data_left:
                self._data_left -= 1
            else:
                self.starts.append(len(self.stream))
                opcode, fields = decode(beat)
                count = fields.get("count", 0)
                rows = min(count, cfg.ub_depth)    # more fails its range check
                tile_rows = min(count, cfg.weight_mem_tiles) * cfg.rows
                self._data_left = data_beats(beat, cfg)
                self._rows += {Opcode.WRITE_HOST: rows,
                               Opcode.READ_WEIGHTS: tile_rows,
                               Opcode.UB_TO_WEIGHTS: min(count, cfg.ub_depth) + cfg.rows,
                               Opcode.MATMUL: rows + cfg.rows + cfg.cols,
                               Opcode.ACTIVATE: rows + cfg.cols,
                               # (its entries are written one a cycle, whatever the beats)
                               Opcode.LOAD_TABLE: TABLE_ENTRIES,
                               Opcode.READ_COUNTERS: len(COUNTERS)}.get(opcode, 0)
            self.stream.append(beat)
        self._unchecked += len(beats)
        self.driver.extend(beats)

    def last_accepted(self) -> str:
        """The last instruction word the core took, disassembled, with its position."""
        taken = self.driver.sent
        if taken > len(self.stream):
            return f"unknown ({taken} beats taken, {len(self.stream)} queued through drive)"
        k = bisect.bisect_right(self.starts, taken - 1) - 1
        if k < 0:
            return f"none ({taken} beats taken)"
        start = self.starts[k]
        end = self.starts[k + 1] if k + 1 < len(self.starts) else len(self.stream)
        try:
            text = disassemble(self.stream[start:end], self.config).splitlines()[0]
        except ValueError:
            text = f".word {self.stream[start]:#x}"
        return (f"instruction {k} of the stream (beat {start}; {taken} of {len(self.stream)} "
                f"beats taken): {text}")

    def budget(self) -> int:
        """Cycles :meth:`check` allows for the beats queued since the last check."""
        cfg = self.config
        return (TIMEOUT_BASE + 2 * (cfg.ub_depth + cfg.acc_depth) +
                TIMEOUT_PER_BEAT * self._unchecked + TIMEOUT_PER_ROW * self._rows)

    def quiet_limit(self) -> int:
        """Cycles :meth:`check` allows without a beat in or out: the memories cleared after
        a reset, or every engine draining the most it may hold (MATMULs in flight, an
        ACTIVATE, a WRITE_HOST, a full weight queue)."""
        cfg = self.config
        rows = (cfg.ub_depth + (cfg.matmul_slots + 1) * cfg.acc_depth +
                (cfg.weight_fifo_depth + 1) * cfg.rows)
        return TIMEOUT_BASE + QUIET_PER_ROW * rows

    async def check(self, what: str, timeout_cycles: int | None = None,
                    fail_on_error: bool = True):
        """Wait for every expected beat and compare them, each as it arrives. Fails at once
        when a beat differs, when the core stops with an error (unless ``fail_on_error`` is
        off; then when it stops with another error than the reference's), when the core has
        taken every beat and sent a DONE beat with fewer beats than expected, and after
        ``timeout_cycles`` (default :meth:`budget`) without all of them, or after
        :meth:`quiet_limit` cycles without a beat in or out: a hang, named by the seed and the
        last instruction the core accepted."""
        budget = self.budget() if timeout_cycles is None else timeout_cycles
        quiet = self.quiet_limit()
        moved = (-1, -1)                 # (beats taken, beats received) when last seen
        last_move = longest = 0
        self._unchecked = self._rows = 0
        got = self.monitor.received
        checked = 0
        done_seen = None                 # cycle the core went quiet after a DONE beat

        def fail(why: str):
            raise AssertionError(
                f"seed {self.seed}: {what}: {why}; got {len(got)} of {len(self.expected)} "
                f"beats; status {self.status()}; last instruction accepted: "
                f"{self.last_accepted()}")

        for cycle in range(budget + 1):
            for i in range(checked, min(len(got), len(self.expected))):
                e = self.expected[i]
                if e is not None and e != got[i]:
                    fail(f"beat {i} is {got[i]:#x}, the ISA simulator sent {e:#x}")
            checked = len(got)
            if len(got) >= len(self.expected):
                break
            bits = int(self.dut.o_status.value)
            # (An error a resynchronisation word still queued will clear is not a failure.)
            if bits & ERROR_BIT and not (self.resyncs and
                                         self.resyncs[-1] >= self.driver.sent):
                status = self.status()
                if fail_on_error:
                    fail("the core stopped with an error")
                ref = self.ref.status
                if (status["code"], status["instr_index"]) != (ref.code, ref.instr_index):
                    fail(f"the ISA simulator stopped with {ref.code.name} at instruction "
                         f"{ref.instr_index}")
            # Every beat taken, halted after a DONE beat: nothing more will come.
            if (bits & HALTED_BIT and not self.driver.pending() and got
                    and got[-1] >> 32 == DONE_MAGIC):
                done_seen = cycle if done_seen is None else done_seen
                if cycle - done_seen > 16:
                    fail("the core finished (DONE) with fewer beats than expected")
            else:
                done_seen = None
            if (self.driver.sent, len(got)) != moved:
                longest = max(longest, cycle - last_move)
                moved, last_move = (self.driver.sent, len(got)), cycle
            elif cycle - last_move >= quiet:
                fail(f"no beat in or out for {quiet} cycles (a hang)")
            if cycle == budget:
                fail(f"timeout after {budget} cycles (a hang)")
            await FallingEdge(self.dut.clk)
        self.dut._log.info(f"{what}: {cycle} of {budget} cycles allowed, at most {longest} of "
                           f"{quiet} without a beat in or out")
        assert len(got) == len(self.expected), \
            f"seed {self.seed}: {what}: got {len(got)} beats, expected {len(self.expected)}"
        assert beats_match(self.expected, got)
        check_counter_invariants(self.expected, got, f"seed {self.seed}: {what}")

    def status(self) -> dict:
        value = STATUS.from_bits(int(self.dut.o_status.value))
        return {"error": int(value.error), "code": ErrorCode(value.code),
                "halted": int(value.halted), "instr_index": int(value.instr_index)}


@cocotb.test()
@cocotb.parametrize(block=list(range(int(os.environ.get("AMTPU_PROGRAM_BLOCKS", "1")))))
async def test_random_programs(dut, block: int):
    """Constrained-random programs back to back, with random stalls on both host streams."""
    programs = int(os.environ.get("AMTPU_PROGRAMS", "25"))
    base = int(os.environ.get("AMTPU_SEED", "1000")) + block * programs
    tb = Testbench(dut, base, idle=0.2, backpressure=0.3)
    await tb.reset()
    for seed in range(base, base + programs):
        tb.send(random_program(tb.config, np.random.default_rng(seed), after=tb.ref).beats)
    dut._log.info(f"{programs} programs, seeds {base}..{base + programs - 1}, "
                  f"{len(tb.driver._queue)} beats")
    await tb.check(f"programs with seeds {base}..{base + programs - 1}")
    reads = check_counter_timing(tb.stream, tb.starts, tb.driver.sent_cycles, tb.monitor.cycles,
                                 tb.expected, tb.monitor.received, f"seeds {base}..")
    dut._log.info(f"{reads} READ_COUNTERS after a CLEAR_COUNTERS checked against the cycles")
    counts = tb.ref.counters()
    dut._log.info(f"reference counters after the programs: {counts}")


@cocotb.test()
async def test_directed_each_instruction(dut):
    """Every instruction at least once, with known values and extremes."""
    tb = Testbench(dut, seed=7)
    await tb.reset()
    cfg = tb.config
    rng = np.random.default_rng(7)
    p = Program(cfg)
    p.nop()
    p.clear_counters()
    p.load_weights(0, np.full((cfg.rows, cfg.cols), -128), signed=True)
    p.load_weights(1, np.full((cfg.rows, cfg.cols), 255), signed=False)
    p.load_weights(2, random_bytes(rng, (cfg.rows, cfg.cols), True), signed=True)
    p.read_host(0, np.full((2, cfg.ub_row), -128))
    p.read_host(2, np.full((2, cfg.ub_row), 255))
    p.read_host(4, random_bytes(rng, (4, cfg.ub_row), True))
    p.read_weights(0, 3)
    p.matmul(0, 0, 2, switch=True, signed=True)                    # -128 * -128
    p.matmul(2, 2, 2, switch=True, signed=False)                   # 255 * 255
    p.matmul(4, 4, 4, switch=True, signed=True)
    p.matmul(4, 4, 4, accumulate=True, signed=True)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols, shift=0, zp=0, clamp=127)
    p.load_params(1, [-2**31] * cfg.cols, [2**31 - 1] * cfg.cols, shift=63, zp=-128, clamp=5)
    p.activate(0, 16, 8, func=Func.IDENTITY, slot=0)                # saturates
    p.activate(0, 24, 8, func=Func.CLAMP, pool=Pool.MAX2, slot=1)
    p.activate(4, 28, 4, func=Func.SIGMOID, pool=Pool.MAX4, slot=0)
    p.activate(4, 29, 4, func=Func.TANH, slot=0)
    p.activate(4, 33, 4, func=Func.RELU, slot=0)
    p.sync()
    p.write_host(0, 40)
    p.read_counters()
    p.halt()
    tb.send(p.beats)
    await tb.check("directed program")
    assert tb.status()["halted"] == 1


@cocotb.test()
async def test_gemm(dut):
    """A tiled GEMM (64x64 @ 64x64 on the default core) equals the ISA simulator and numpy;
    the counters show the array's utilisation during the matrix phase."""
    tb = Testbench(dut, seed=2026)
    await tb.reset()
    cfg = tb.config
    size = int(os.environ.get("AMTPU_GEMM_SIZE", "64"))
    rng = np.random.default_rng(tb.seed)
    x = rng.integers(-128, 128, (size, size))
    w = rng.integers(-128, 128, (size, size))
    x[0, :] = -128                       # extremes: a row and a column at the limits
    w[:, 0] = -128
    bias = rng.integers(-2**16, 2**16, size)
    multiplier = rng.integers(1, 2**15, size)
    kwargs = dict(bias=bias, multiplier=multiplier, shift=24, zero_point=-5, func=Func.RELU)
    plan = gemm_program(cfg, x, w, measure=True, **kwargs)
    tb.send(plan.beats)
    await tb.check(f"{size}x{size} GEMM")
    result = plan.decode(tb.monitor.received)
    assert np.array_equal(result, gemm_reference(x, w, **kwargs)), \
        f"seed {tb.seed}: GEMM result differs from numpy"
    counters = plan.counters(tb.monitor.received)
    active = counters["array_active"] / counters["cycles"]
    dut._log.info(f"counters over the matrix phase: {counters}")
    dut._log.info(f"array active {100 * active:.1f}% of {counters['cycles']} cycles, "
                  f"weight stall {counters['weight_stall']}, raw stall {counters['raw_stall']}")
    path = os.environ.get("AMTPU_BENCH_OUT")
    if path:
        with open(path, "w") as f:
            json.dump({"config": cfg.name, "size": size, "seed": tb.seed,
                       "counters": counters, "exact": True}, f)
    tiles = -(-size // cfg.rows) * -(-size // cfg.cols)
    assert counters["array_active"] == tiles * size
    assert counters["useful_macs"] == tiles * size * cfg.rows * cfg.cols
    # The first tile shifted into the shadow registers before the counters were cleared.
    assert counters["weight_shift"] == (tiles - 1) * cfg.rows
    if size >= 64:
        assert active >= 0.90, f"array active {active:.3f} < 0.90 of the matrix phase"


def _error_prefix(cfg) -> Program:
    """A program that writes some state, with a WRITE_HOST still in flight at its end: tiles
    0 .. ``weight_fifo_depth`` written, none queued, one switched in."""
    p = Program(cfg)
    loaded = cfg.weight_fifo_depth + 1
    p.load_weights(0, np.arange(loaded * cfg.rows * cfg.cols).reshape(
        loaded, cfg.rows, cfg.cols) % 100)
    p.read_host(0, np.arange(4 * cfg.ub_row).reshape(4, cfg.ub_row) % 120)
    p.read_weights(0, 1)
    p.matmul(0, 0, 4, switch=True)
    p.write_host(0, 4)
    return p


def _error_case(cfg, case: str) -> tuple[Program, ErrorCode, int]:
    """:func:`_error_prefix` and then one bad instruction: ``(program, code, index of the bad
    instruction)``."""
    p = _error_prefix(cfg)
    loaded = cfg.weight_fifo_depth + 1
    ok = p.instructions
    if case == "UNKNOWN_OPCODE":
        p.word(15)      # reserved (12 to 14 are instructions where they are built)
    elif case == "BAD_FIELD":
        p.activate(0, 8, 3, pool=Pool.MAX2)               # 3 rows do not split into pairs
    elif case == "UB_RANGE":
        p.read_host(cfg.ub_depth - 1, np.zeros((2, cfg.ub_row)))
    elif case == "ACC_RANGE":
        p.matmul(0, cfg.acc_depth - 2, 4)
    elif case == "WEIGHT_RANGE":
        p.read_weights(cfg.weight_mem_tiles - 1, 2)
    elif case == "WEIGHT_UNWRITTEN":
        p.read_weights(loaded, 1)
    elif case == "WEIGHT_EMPTY":
        p.matmul(0, 0, 4, switch=True)
    elif case == "WEIGHT_OVERFLOW":
        p.read_weights(0, 1)
        ok += 1
        p.read_weights(0, loaded)                           # one more than fits
    else:
        raise ValueError(case)
    return p, ErrorCode[case], ok


# SIGNEDNESS needs a core for int8 only: test_interlocks.test_uint8_refused_on_int8_core.
ERROR_CASES = [code.name for code in ErrorCode
               if code not in (ErrorCode.NONE, ErrorCode.SIGNEDNESS)]


@cocotb.test()
@cocotb.parametrize(case=ERROR_CASES, recover=["clear", "resync"])
async def test_error(dut, case: str, recover: str):
    """A bad instruction sets a sticky error with its index and has no effect; the core sends
    an error beat after the output of the earlier instructions (still in flight), discards
    every beat after it, and recovers through ``i_clear`` or the resynchronisation word in
    the stream; then a new program sees exactly the ISA simulator's state."""
    tb = Testbench(dut, seed=ERROR_CASES.index(case))
    await tb.reset()
    cfg = tb.config
    program, code, index = _error_case(cfg, case)
    # Beats after the bad instruction (a READ_HOST that would overwrite row 0, a HALT): the
    # core must discard them.
    junk = Program(cfg)
    junk.read_host(0, np.full((2, cfg.ub_row), 0x55))
    junk.halt()
    # (The bad instruction's own data beats, if any, are discarded too.)
    assert tb.ref.feed(program.beats + junk.beats) >= len(junk.beats)
    assert tb.ref.error == code, f"reference did not stop with {code.name}"
    tb.expected.extend(tb.ref.output)
    tb.drive(program.beats + junk.beats)
    await tb.check(f"{case}: output up to the error beat", fail_on_error=False)
    assert tb.monitor.received[-1] == error_beat(code, index), \
        f"{case}: the last beat is not the error beat"
    for _ in range(50):                      # the junk beats go in and change nothing
        await FallingEdge(dut.clk)
    status = tb.status()
    assert status["error"] == 1, f"{case}: no error after the bad instruction: {status}"
    assert status["code"] == code, f"{case}: status code {status['code'].name}"
    assert status["instr_index"] == index, \
        f"{case}: index {status['instr_index']}, the bad instruction is {index}"
    assert status["halted"] == 0
    assert tb.driver.pending() == 0, f"{case}: the core did not discard the beats after it"
    if recover == "clear":
        dut.i_clear.value = 1
        await FallingEdge(dut.clk)
        dut.i_clear.value = 0
        tb.ref.clear()
        assert tb.status()["error"] == 0
    else:
        tb.send([RESYNC_WORD])
    # Read everything back: memories must equal the reference's, which never executed the
    # bad instruction nor the discarded beats.
    p = Program(cfg)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols)
    p.activate(0, 16, 4, slot=0)                     # accumulators -> buffer, unchanged
    p.write_host(0, 20)
    p.read_counters()
    p.halt()
    tb.send(p.beats)
    await tb.check(f"{case}: state after the error ({recover})")
    assert tb.status()["instr_index"] == 0


#: Bad instructions that fail two or more checks: ``(name, add it to a program, the code
#: reported)``, the first in :class:`~hdl.isa.ErrorCode`'s priority order. After
#: :func:`_error_prefix` no tile is queued, tiles 0 .. weight_fifo_depth are written (the
#: last case leaves tiles queued: it stays last).
PRIORITY_CASES = [
    ("bad_field_before_ub_and_acc_range",     # 5 rows do not split into pairs; both ranges
     lambda p, c: p.activate(c.acc_depth - 2, c.ub_depth - 1, 5, pool=Pool.MAX2),
     ErrorCode.BAD_FIELD),
    ("bad_field_before_weight_empty",          # count 0, and no tile to switch in
     lambda p, c: p.matmul(0, 0, 0, switch=True), ErrorCode.BAD_FIELD),
    ("ub_range_before_acc_range",
     lambda p, c: p.matmul(c.ub_depth - 1, c.acc_depth - 2, 4), ErrorCode.UB_RANGE),
    ("acc_range_before_weight_empty",
     lambda p, c: p.matmul(0, c.acc_depth - 2, 4, switch=True), ErrorCode.ACC_RANGE),
    ("weight_range_before_overflow",
     lambda p, c: p.read_weights(c.weight_mem_tiles - 1, c.weight_fifo_depth + 2),
     ErrorCode.WEIGHT_RANGE),
    ("unwritten_before_overflow",              # the queue one short of full, then 2 more
     lambda p, c: (p.read_weights(0, c.weight_fifo_depth),
                   p.read_weights(c.weight_fifo_depth + 1, 2)),
     ErrorCode.WEIGHT_UNWRITTEN),
]


@cocotb.test()
async def test_error_priority(dut):
    """An instruction that fails several checks reports the first in priority order, as the
    ISA simulator does, and has no effect: after resynchronising, a program sees exactly the
    ISA simulator's state. The cases run one after another."""
    tb = Testbench(dut, seed=0)
    await tb.reset()
    cfg = tb.config
    for name, bad, code in PRIORITY_CASES:
        program = _error_prefix(cfg)
        bad(program, cfg)
        index = program.instructions - 1                    # the last instruction is bad
        start = len(tb.ref.output)
        tb.ref.feed(program.beats)
        assert tb.ref.error == code, \
            f"{name}: the ISA simulator reported {tb.ref.error.name}, not {code.name}"
        tb.expected.extend(tb.ref.output[start:])
        tb.drive(program.beats)
        await tb.check(f"{name}: output up to the error beat", fail_on_error=False)
        status = tb.status()
        assert (status["error"], status["code"], status["instr_index"]) == (1, code, index), \
            f"{name}: status {status}, expected {code.name} at instruction {index}"
        assert tb.monitor.received[-1] == error_beat(code, index), \
            f"{name}: the last beat is not the error beat"
        tb.send([RESYNC_WORD])
        p = Program(cfg)
        p.write_host(0, 4)
        p.read_weights(0, 1)
        p.matmul(0, 4, 4, switch=True)
        p.load_params(0, [0] * cfg.cols, [1] * cfg.cols)
        p.activate(4, 8, 4, slot=0)
        p.write_host(8, 4)
        p.read_counters()
        p.halt()
        tb.send(p.beats)
        await tb.check(f"{name}: state after the error")


async def _pulse_clear(dut) -> None:
    dut.i_clear.value = 1
    await FallingEdge(dut.clk)
    dut.i_clear.value = 0


@cocotb.test()
async def test_error_clears_halted(dut):
    """D1: nop, halt, then a reserved opcode: the status is 0x03 (error, UNKNOWN_OPCODE, not
    halted), then 0x00 after i_clear, as the ISA simulator says."""
    tb = Testbench(dut, seed=11)
    await tb.reset()
    p = Program(tb.config)
    p.nop()
    p.halt()
    tb.send(p.beats)
    await tb.check("nop, halt")
    assert tb.status()["halted"] == 1
    tb.ref.feed([15])
    tb.expected.extend(tb.ref.output[len(tb.expected):])
    tb.drive([15])
    await tb.check("the reserved opcode's error beat", fail_on_error=False)
    bits = int(dut.o_status.value)
    assert bits == tb.ref.status.as_bits() == 0x03, f"status {bits:#x}, ISA 0x03"
    await _pulse_clear(dut)
    tb.ref.clear()
    bits = int(dut.o_status.value)
    assert bits == tb.ref.status.as_bits() == 0x00, f"status {bits:#x} after the clear"


@cocotb.test()
async def test_clear_without_error_does_nothing(dut):
    """D4: three NOPs, an i_clear pulse with no error pending, HALT: the DONE beat counts 4
    instructions on the RTL and in the ISA simulator."""
    tb = Testbench(dut, seed=12)
    await tb.reset()
    p = Program(tb.config)
    for _ in range(3):
        p.nop()
    tb.send(p.beats)
    for _ in range(20):
        await FallingEdge(dut.clk)
    await _pulse_clear(dut)
    tb.ref.clear()
    tb.send(Program(tb.config).halt())
    await tb.check("halt after the clear")
    assert tb.monitor.received[-1] == (0x444F4E45 << 32 | 4)


@cocotb.test()
async def test_reset_clears_memories(dut):
    """D2: a reset in the middle of work clears the unified buffer, the accumulators and the
    parameter slots (and forgets the weight tiles), as the ISA simulator's reset does."""
    tb = Testbench(dut, seed=13)
    await tb.reset()
    cfg = tb.config
    rng = np.random.default_rng(13)
    p = Program(cfg)
    p.load_weights(0, random_bytes(rng, (cfg.rows, cfg.cols), True))
    p.read_host(0, random_bytes(rng, (cfg.ub_depth, cfg.ub_row), True))
    p.read_weights(0, 1)
    p.matmul(0, 0, cfg.acc_depth if cfg.acc_depth <= cfg.ub_depth else cfg.ub_depth,
             switch=True)
    p.load_params(1, [5] * cfg.cols, [7] * cfg.cols, shift=1, zp=3, clamp=9)
    tb.drive(p.beats)                        # the reference runs only what follows the reset
    await tb.driver.wait_idle()              # every beat taken; the MATMUL still running
    await FallingEdge(dut.clk)
    await reset(dut)
    tb.ref.reset()
    q = Program(cfg)
    q.write_host(0, cfg.ub_depth)                           # every buffer row: zero
    q.load_params(0, [0] * cfg.cols, [1] * cfg.cols)
    q.activate(0, 0, min(cfg.acc_depth, cfg.ub_depth), slot=0)   # every accumulator: zero
    q.activate(0, 1, 1, slot=1)                             # slot 1 cleared: zp 0, mult 0
    q.write_host(0, 2)
    q.halt()
    tb.monitor.received.clear()
    tb.expected = []
    tb.send(q.beats)
    await tb.check("read back after the reset")


@cocotb.test()
async def test_far_weight_tile(dut):
    """LOAD_WEIGHTS into the last tile and into tile 0 with different values, then a MATMUL
    with each: both equal the ISA simulator (the last tile's rows must not land on tile 0)."""
    tb = Testbench(dut, seed=14)
    await tb.reset()
    cfg = tb.config
    last = cfg.weight_mem_tiles - 1
    p = Program(cfg)
    p.load_weights(0, np.full((cfg.rows, cfg.cols), 3))
    p.load_weights(last, np.arange(cfg.rows * cfg.cols).reshape(cfg.rows, cfg.cols) - 16)
    p.read_host(0, np.arange(2 * cfg.ub_row).reshape(2, cfg.ub_row) % 50)
    p.read_weights(last, 1)
    p.read_weights(0, 1)
    p.matmul(0, 0, 2, switch=True)
    p.matmul(0, 2, 2, switch=True)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols, shift=4)
    p.activate(0, 4, 4, slot=0)
    p.write_host(4, 4)
    p.halt()
    tb.send(p.beats)
    await tb.check("far weight tile", timeout_cycles=400_000)
