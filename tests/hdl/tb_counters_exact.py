"""cocotb testbench: the timing-dependent performance counters (``cycles``, ``weight_stall``,
``non_matrix``, ``raw_stall``, ``host_stall``) of the whole core, each computed exactly and
compared with ``==``.

The ISA simulator cannot predict these counters (``None`` in its output), so each test here
builds a short program whose timing it controls: the host withholds chosen beats for a known
number of cycles, holds the output stream back, or sends an instruction that must wait for an
earlier one. The expected value of each counter is computed from the documented cycle
semantics of its event, and from the cycles the testbench saw beats move at the core's ports:

- :class:`~hdl.control.counters.PerfCounters`: a counter shown in cycle ``t`` counts its
  events of the cycles ``c + 1 .. t - 3``, where ``c`` is the cycle CLEAR_COUNTERS issued
  (its beat is taken). READ_COUNTERS samples each counter when it is shown and offers the
  beat in the next cycle; on the reference and compact pipelines the host writer passes it
  on in that cycle, so with the host always ready a counter beat that leaves in cycle ``o``
  was sampled in ``o - 1``; the fast pipeline's beat register and beat FIFO add two cycles
  (:data:`BEAT_LAG`);
- ``cycles``: every cycle;
- ``host_stall``: each cycle the front end waits for a beat (an instruction at fetch, or a
  data beat of READ_HOST, LOAD_WEIGHTS, LOAD_PARAMS) and the host offers none: here exactly
  the cycles the host withholds a beat;
- ``raw_stall``: each cycle an instruction waits at fetch on an unfinished instruction's
  range (:data:`~hdl.control.hazards.HAZARD_RULES`): the cycles the wait adds to the
  :data:`ISSUE` cycles any instruction spends from its offer to its take (none on the
  reference pipeline, whose instruction may issue in its first cycle; two on the compact
  one, three on the fast one, which decide from registered answers). The waiting instruction
  is taken :data:`WAKE` cycles after the earlier one stops being unfinished (a WRITE_HOST
  when its last row is taken, a MATMUL in the cycle after its last row is written,
  ``array_latency + 2`` cycles after that row's buffer read on the reference pipeline,
  :data:`RETIRE`); so ``raw_stall = taken - offered - ISSUE``;
- ``weight_stall``: each cycle a MATMUL's ``switch`` row waits for its tile to be whole in the
  shadow registers. READ_WEIGHTS's rows enter the weight FIFO a row a cycle, the FIFO offers
  the tile once it is whole and the tile shifts in in ``rows`` cycles; the weight memory and
  the buffer read alike, so the ``switch`` row waits ``2 * rows - d`` cycles when its MATMUL
  issued ``d`` cycles after the READ_WEIGHTS (a cycle more on the fast pipeline, whose
  weight FIFO's rows leave through a ring of registers: :data:`WEIGHT_EXTRA`);
- ``non_matrix``: each cycle no row enters the array and host work moves (a READ_HOST or
  LOAD_WEIGHTS data beat, a counter, DONE or error beat offered to the host, a WRITE_HOST or
  an ACTIVATE running: from the cycle after it is taken until its last row has been taken,
  or written).

Every pipeline (:attr:`~hdl.config.TPUConfig.pipeline`) runs the same programs; the cycles
its registers add are the tables below, from its documented structure and asserted by each
test before it checks the counters, so a counter that is off by one cycle on one pipeline
fails here. Seeds are fixed and logged; the programs' outputs are also compared with the ISA
simulator beat for beat (:class:`tb_core.Testbench`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import cocotb
import numpy as np
from tb_core import Testbench

from firmware.asm import Program
from hdl.isa import COUNTERS, Rounding

#: The counters the ISA simulator cannot predict, checked here.
TIMED = ("cycles", "weight_stall", "non_matrix", "raw_stall", "host_stall")
#: Cycles from a counter's events to the value the bank shows (events registered twice).
LAG = 3
#: An event high in every cycle (``cycles``'s).
EVERY_CYCLE = "every cycle"

#: Per pipeline: cycles from an instruction beat's offer to its take when nothing holds it
#: (it issues in its first, third or fourth cycle at the front end).
ISSUE = {"reference": 0, "compact": 2, "fast": 3}
#: Cycles from the cycle an earlier instruction stops being unfinished to the take of an
#: instruction that waited on it (the compact pipeline acts on the registered hazard, the fast
#: one on the tracker's late hazard, registered).
WAKE = {"reference": 0, "compact": 1, "fast": 2}
#: Cycles from a counter's sampling to its beat leaving with the host ready (the fast
#: pipeline's beat register and the host writer's beat FIFO).
BEAT_LAG = {"reference": 1, "compact": 1, "fast": 3}
#: A unified-buffer read through its block RAM's output register (the fast pipeline): a
#: WRITE_HOST's first row leaves a cycle later.
READ_EXTRA = {"reference": 0, "compact": 0, "fast": 1}
#: The weight FIFO's output ring (the fast pipeline): a tile reaches the shadow registers a
#: cycle later.
WEIGHT_EXTRA = {"reference": 0, "compact": 0, "fast": 1}
#: Cycles from a MATMUL's last buffer read to the cycle it stops being unfinished, beyond
#: ``array_latency``: its last row written and retired (the fast pipeline: the buffer's and
#: the accumulators' registered reads, the array's registered enable, retiring a cycle after
#: the last write).
RETIRE = {"reference": 3, "compact": 3, "fast": 8}


def idle_schedule(gaps: dict[int, int], beats: int) -> Iterator[bool]:
    """The driver's idle generator: withhold beat ``i`` for ``gaps[i]`` cycles after the beat
    before it is taken (the driver asks once a cycle while it offers nothing)."""
    for i in range(beats):
        yield from itertools.repeat(True, gaps.get(i, 0))
        yield False
    yield from itertools.repeat(False)


class CounterRun:
    """A program (:attr:`p`) with a gap schedule, run on the core, and the cycles its beats
    moved in.

    :meth:`run` resets the core, sends the program (compared with the ISA simulator beat for
    beat) and waits for every answer; then the methods give the cycles (of the driver's and
    the monitor's common count) each beat was taken, offered and sent back.
    """

    def __init__(self, dut, seed: int, name: str):
        self.tb = Testbench(dut, seed)
        self.dut = dut
        self.cfg = self.tb.config
        self.name = name
        self.p = Program(self.cfg)
        pipeline = self.cfg.pipeline
        self.issue, self.wake = ISSUE[pipeline], WAKE[pipeline]
        self.read_extra, self.weight_extra = READ_EXTRA[pipeline], WEIGHT_EXTRA[pipeline]
        self.beat_lag, self.retire = BEAT_LAG[pipeline], RETIRE[pipeline]
        self.gaps: dict[int, int] = {}
        self.marks: dict[str, int] = {}
        self.hold_out: tuple[str, int] | None = None

    def mark(self, label: str, gap: int = 0) -> int:
        """Name the next beat ``label`` and withhold it ``gap`` cycles; returns its index."""
        i = len(self.p.beats)
        self.marks[label] = i
        if gap:
            self.gaps[i] = gap
        return i

    def gap_next(self, gap: int) -> None:
        """Withhold the next beat ``gap`` cycles (the front end then waits for it)."""
        if gap:
            self.gaps[len(self.p.beats)] = gap

    def hold_output(self, label: str, cycles: int) -> None:
        """Keep ``o_host`` not ready until ``cycles`` cycles after beat ``label`` is taken."""
        self.hold_out = (label, cycles)

    async def run(self) -> None:
        tb = self.tb
        await tb.reset()
        tb.driver.set_idle_generator(idle_schedule(self.gaps, len(self.p.beats)))
        if self.hold_out is not None:
            label, cycles = self.hold_out
            at = self.marks[label]
            driver, monitor = tb.driver, tb.monitor

            def held() -> Iterator[bool]:
                while driver.sent <= at or monitor.cycle <= driver.sent_cycles[at] + cycles:
                    yield True
                yield from itertools.repeat(False)
            monitor.set_backpressure_generator(held())
        tb.send(self.p.beats)
        await tb.check(self.name)

    # Cycles ------------------------------------------------------------------------------

    def taken(self, label: str | int) -> int:
        i = self.marks[label] if isinstance(label, str) else label
        return self.tb.driver.sent_cycles[i]

    def offered(self, label: str | int) -> int:
        """The cycle beat ``label`` was first offered: after the beat before it was taken and
        its gap."""
        i = self.marks[label] if isinstance(label, str) else label
        return self.taken(i - 1) + self.gaps.get(i, 0) + 1

    def outputs(self) -> list[int]:
        return self.tb.monitor.cycles

    def counter_beats(self) -> int:
        """Index in the output of the (only) READ_COUNTERS's first beat."""
        return self.marks.get("counters_out", 0)

    def sampled(self, name: str) -> int:
        """The cycle counter ``name`` was sampled in (its beat left :data:`BEAT_LAG` cycles
        later)."""
        return self.outputs()[self.counter_beats() + COUNTERS.index(name)] - self.beat_lag

    def waited(self, label: str) -> int:
        """The cycles beat ``label`` waited beyond the pipeline's :data:`ISSUE` cycles (its
        ``raw_stall`` where it waited on a hazard)."""
        return self.taken(label) - self.offered(label) - self.issue

    def window(self, name: str) -> range:
        """The cycles whose events counter ``name``'s value counts."""
        return range(self.taken("clear") + 1, self.sampled(name) - LAG + 1)

    def got(self) -> dict[str, int]:
        beats = self.tb.monitor.received[self.counter_beats():][:len(COUNTERS)]
        return dict(zip(COUNTERS, beats, strict=True))

    def check(self, expected: dict[str, int | str | Iterable[int]]) -> None:
        """Compare the timed counters with ``expected``: a count, or the cycles the event
        was high in (counted over the counter's window), or :data:`EVERY_CYCLE`."""
        got = self.got()
        want = {}
        for name in TIMED:
            value = expected[name]
            if value == EVERY_CYCLE:
                value = len(self.window(name))
            elif not isinstance(value, int):
                value = len(set(value) & set(self.window(name)))
            want[name] = value
        self.dut._log.info(f"{self.name}: counters {got}, expected {want}")
        wrong = {name: (got[name], want[name]) for name in TIMED if got[name] != want[name]}
        assert not wrong, (f"seed {self.tb.seed}: {self.name}: counters (got, expected): "
                           f"{wrong}")

    def counter_beat_cycles(self) -> list[int]:
        """Cycles the READ_COUNTERS's beats were offered (the host is ready then: the
        cycle each leaves)."""
        first = self.counter_beats()
        return self.outputs()[first:first + len(COUNTERS)]


def _rows(cfg, n: int, value: int = 1) -> np.ndarray:
    return np.full((n, cfg.ub_row), value)


def _tile(cfg, value: int = 1) -> np.ndarray:
    return np.full((cfg.rows, cfg.cols), value)


@cocotb.test()
async def test_host_gaps(dut):
    """The host withholds beats: before instructions, between READ_HOST's and LOAD_WEIGHTS's
    data beats, and before LOAD_PARAMS's bias and multiplier beats. ``host_stall`` is the sum
    of the gaps; ``non_matrix`` the data beats (LOAD_PARAMS's too) and the counter beats;
    nothing else stalls."""
    r = CounterRun(dut, seed=31, name="host gaps")
    cfg, p = r.cfg, r.p
    r.mark("clear")
    p.clear_counters()
    r.gap_next(2)
    p.read_host(0, _rows(cfg, 3))           # instruction, 3 data beats
    host_rows = [r.marks["clear"] + 2 + i for i in range(3)]
    r.gaps[host_rows[1]] = 3
    r.gaps[host_rows[2]] = 1
    start = len(p.beats)
    p.load_weights(0, _tile(cfg))
    weight_rows = [start + 1 + i for i in range(cfg.rows)]
    r.gaps[weight_rows[1]] = 4
    start = len(p.beats)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols)
    param_rows = [start + 1, start + 2]
    r.gaps[param_rows[0]] = 5               # LOAD_PARAMS waits for its bias beat
    r.gaps[param_rows[1]] = 2               # ... and for its multiplier beat
    r.gap_next(3)
    p.nop()
    r.mark("read_counters", gap=6)
    p.read_counters()
    p.halt()
    await r.run()
    beats_out = r.counter_beat_cycles()
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": sum(r.gaps.values()),
        "raw_stall": 0,
        "weight_stall": 0,
        "non_matrix": [r.taken(i) for i in host_rows + weight_rows + param_rows] + beats_out,
    })


@cocotb.test()
async def test_load_params_beats_are_host_work(dut):
    """LOAD_PARAMS is a host transfer, so by :data:`hdl.isa.COUNTERS` its data beats (two,
    or three with per-column shifts; not its instruction beat, as for READ_HOST and
    LOAD_WEIGHTS) are ``non_matrix`` cycles."""
    r = CounterRun(dut, seed=32, name="LOAD_PARAMS beats as host work")
    cfg, p = r.cfg, r.p
    r.mark("clear")
    p.clear_counters()
    start = len(p.beats)
    p.load_params(1, [3] * cfg.cols, [4] * cfg.cols, shift=2)
    r.gaps[start + 1] = 4
    second = len(p.beats)
    p.load_params(0, [3] * cfg.cols, [4] * cfg.cols, shift=list(range(cfg.cols)),
                  rounding=Rounding.DOUBLE)
    r.gaps[second + 3] = 2
    p.read_counters()
    p.halt()
    await r.run()
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": 6,
        "raw_stall": 0,
        "weight_stall": 0,
        "non_matrix": [r.taken(start + 1), r.taken(start + 2), r.taken(second + 1),
                       r.taken(second + 2), r.taken(second + 3)] + r.counter_beat_cycles(),
    })


@cocotb.test()
@cocotb.parametrize(hold=[0, 10])
async def test_raw_write_host(dut, hold: int):
    """A READ_HOST into a row a WRITE_HOST still sends (``read_host_war_write_host``) while
    the host holds the output back for ``hold`` cycles: the READ_HOST is taken in the cycle
    after the WRITE_HOST's last row leaves, and waits (``raw_stall``) from the cycle it is
    offered; ``non_matrix`` is the WRITE_HOST's busy cycles, the READ_HOST's data beat and
    the counter beats."""
    r = CounterRun(dut, seed=33 + hold, name=f"READ_HOST behind WRITE_HOST, hold {hold}")
    cfg, p = r.cfg, r.p
    count = 4
    p.read_host(0, np.arange(count * cfg.ub_row).reshape(count, cfg.ub_row) % 100)
    r.mark("clear")
    p.clear_counters()
    r.mark("write_host")
    p.write_host(0, count)
    r.mark("read_host")
    p.read_host(2, _rows(cfg, 1, 7))
    r.marks["counters_out"] = count
    p.read_counters()
    p.halt()
    r.hold_output("write_host", hold)
    await r.run()
    w = r.taken("write_host")
    rows_out = r.outputs()[:count]
    # The first row is read the cycle after the WRITE_HOST issues and offered the next; the
    # host takes a row a cycle once it is ready.
    first = max(w + 2 + r.read_extra, w + hold + 1)
    assert rows_out == list(range(first, first + count)), \
        f"{r.name}: WRITE_HOST rows left in cycles {rows_out}"
    assert r.taken("read_host") == rows_out[-1] + 1 + r.wake, \
        f"{r.name}: READ_HOST taken in cycle {r.taken('read_host')}"
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": 0,
        "raw_stall": r.waited("read_host"),
        "weight_stall": 0,
        "non_matrix": (list(range(w + 1, rows_out[-1] + 1)) +
                       [r.taken(r.marks["read_host"] + 1)] + r.counter_beat_cycles()),
    })


@cocotb.test()
async def test_raw_matmul_activate(dut):
    """An ACTIVATE of the accumulator rows a MATMUL writes (``activate_raw_matmul_acc``), and
    a WRITE_HOST of the rows the ACTIVATE writes (``write_host_raw_activate``). The ACTIVATE
    is taken in the cycle after the MATMUL's last row is written, ``rows + cols + 4`` cycles
    after that row's buffer read (a row a cycle from the cycle after the MATMUL issues); the
    WRITE_HOST in the cycle the ACTIVATE stops being busy (on the reference pipeline; the
    others :data:`WAKE` cycles later). ``raw_stall`` counts both waits,
    ``non_matrix`` the ACTIVATE's and the WRITE_HOST's busy cycles and the counter beats."""
    r = CounterRun(dut, seed=35, name="ACTIVATE behind MATMUL, WRITE_HOST behind ACTIVATE")
    cfg, p = r.cfg, r.p
    count = 4
    p.load_weights(0, np.arange(cfg.rows * cfg.cols).reshape(cfg.rows, cfg.cols) % 7)
    p.read_host(0, np.arange(count * cfg.ub_row).reshape(count, cfg.ub_row) % 50)
    p.load_params(0, [1] * cfg.cols, [1] * cfg.cols)
    p.read_weights(0, 1)
    p.matmul(0, 0, 1, switch=True)          # the tile active: no weight stall below
    p.sync()
    r.mark("clear")
    p.clear_counters()
    r.mark("matmul")
    p.matmul(0, 0, count)
    r.mark("activate")
    p.activate(0, 8, count, slot=0)
    r.mark("write_host")
    p.write_host(8, count)
    r.marks["counters_out"] = count
    p.read_counters()
    p.halt()
    await r.run()
    m, a, w = r.taken("matmul"), r.taken("activate"), r.taken("write_host")
    assert m == r.offered("matmul") + r.issue, f"{r.name}: the MATMUL waited"
    last_read = m + count                   # reads in cycles m + 1 .. m + count
    assert a == last_read + cfg.array_latency + r.retire + r.wake, \
        f"{r.name}: ACTIVATE taken {a - m} cycles after the MATMUL"
    rows_out = r.outputs()[:count]
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": 0,
        "raw_stall": r.waited("activate") + r.waited("write_host"),
        "weight_stall": 0,
        "non_matrix": (list(range(a + 1, w - r.wake)) +
                       list(range(w + 1, rows_out[-1] + 1)) +
                       r.counter_beat_cycles()),
    })


@cocotb.test()
@cocotb.parametrize(gap=[0, 1, 3, 9])
async def test_weight_stall(dut, gap: int):
    """A MATMUL whose ``switch`` row waits for the tile a READ_WEIGHTS just queued, issued
    ``d = gap + 1`` cycles after it (the host withholds the MATMUL ``gap`` cycles; on the
    compact and fast pipelines :data:`ISSUE` cycles more): it waits ``max(0, 2 * rows - d)``
    cycles (``weight_stall``; :data:`WEIGHT_EXTRA` more), and the host gap is
    ``host_stall``."""
    r = CounterRun(dut, seed=40 + gap, name=f"MATMUL waiting for weights, gap {gap}")
    cfg, p = r.cfg, r.p
    p.load_weights(0, np.arange(cfg.rows * cfg.cols).reshape(cfg.rows, cfg.cols) % 11 - 5)
    p.read_host(0, np.arange(3 * cfg.ub_row).reshape(3, cfg.ub_row) % 13)
    r.mark("clear")
    p.clear_counters()
    r.mark("read_weights")
    p.read_weights(0, 1)
    r.mark("matmul", gap=gap)
    p.matmul(0, 0, 3, switch=True)
    p.read_counters()
    p.halt()
    await r.run()
    d = r.taken("matmul") - r.taken("read_weights")
    assert d == gap + 1 + r.issue, f"{r.name}: MATMUL taken {d} cycles after READ_WEIGHTS"
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": gap,
        "raw_stall": 0,
        "weight_stall": max(0, 2 * cfg.rows + r.weight_extra - d),
        "non_matrix": r.counter_beat_cycles(),
    })


@cocotb.test()
@cocotb.parametrize(gap=list(range(8)))
async def test_read_right_after_clear(dut, gap: int):
    """CLEAR_COUNTERS, the host silent ``gap`` cycles, READ_COUNTERS: ``host_stall`` is the
    gap; ``cycles`` counts up to three cycles before ``cycles`` is shown, which comes round
    once in eight cycles, so over the eight gaps it is once ``host_stall - 1`` (the bound
    ``raw_stall + host_stall + instructions <= cycles + 1`` of
    :func:`progen.counter_invariants` is reached)."""
    r = CounterRun(dut, seed=50 + gap, name=f"READ_COUNTERS {gap} cycles after CLEAR")
    p = r.p
    r.mark("clear")
    p.clear_counters()
    r.mark("read_counters", gap=gap)
    p.read_counters()
    p.halt()
    await r.run()
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": gap,
        "raw_stall": 0,
        "weight_stall": 0,
        "non_matrix": r.counter_beat_cycles(),
    })


@cocotb.test()
async def test_non_matrix_excludes_array_active(dut):
    """READ_HOST's data beats while a MATMUL's rows enter the array (a row the cycle after
    its buffer read, a read a cycle from the cycle after the MATMUL issues): a cycle with
    both is array work, not ``non_matrix``; the host withholds the last data beat until the
    MATMUL's rows are in, so that one counts."""
    r = CounterRun(dut, seed=60, name="host beats under MATMUL rows")
    cfg, p = r.cfg, r.p
    count = 6
    p.load_weights(0, np.arange(cfg.rows * cfg.cols).reshape(cfg.rows, cfg.cols) % 5)
    p.read_host(0, np.arange(count * cfg.ub_row).reshape(count, cfg.ub_row) % 9)
    p.read_weights(0, 1)
    p.matmul(0, 0, 1, switch=True)
    p.sync()
    r.mark("clear")
    p.clear_counters()
    r.mark("matmul")
    p.matmul(0, 0, count)
    start = len(p.beats)
    p.read_host(count + 2, _rows(cfg, 3, 4))     # rows the MATMUL does not read
    data = [start + 1, start + 2, start + 3]
    r.gaps[data[-1]] = count
    r.marks["counters_out"] = 0
    p.read_counters()
    p.halt()
    await r.run()
    m = r.taken("matmul")
    assert m == r.offered("matmul") + r.issue, f"{r.name}: the MATMUL waited"
    active = set(range(m + 2 + r.read_extra, m + 2 + r.read_extra + count))
    beats = [r.taken(i) for i in data]
    first = m + 2 + r.issue                 # the READ_HOST offered in cycle m + 1
    assert beats[:2] == [first, first + 1] and set(beats[:2]) <= active and \
        beats[2] > max(active), \
        f"{r.name}: data beats taken in cycles {[b - m for b in beats]} after the MATMUL"
    r.check({
        "cycles": EVERY_CYCLE,
        "host_stall": count,
        "raw_stall": 0,
        "weight_stall": 0,
        "non_matrix": (set(beats) - active) | set(r.counter_beat_cycles()),
    })
