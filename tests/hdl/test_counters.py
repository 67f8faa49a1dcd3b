"""Performance counters: each event counts, ``clear`` wins, and a narrow counter wraps at its
width (``TPUConfig.counter_bits``), as the ISA simulator masks it; the relations between the
timing-dependent counters that the random regression checks (:func:`progen.counter_invariants`)
find each read and each broken relation. The counters of the whole core, computed exactly:
``test_counters_exact.py``."""

from __future__ import annotations

import random
import re

import pytest
from amaranth.sim import Simulator
from progen import (
    check_counter_invariants,
    check_counter_timing,
    counter_invariants,
    counter_reads,
)

from firmware.asm import Program
from hdl.config import ConfigError, TPUConfig
from hdl.control.counters import RING, PerfCounters
from hdl.isa import COUNTERS
from hdl.ports import COUNTER_EVENTS
from hdl.presets import get_config
from sim.models.isa_sim import IsaSim


def model(events: list[dict[str, int]], width: int, macs: int) -> dict[str, int]:
    counts = dict.fromkeys(COUNTERS, 0)
    for ev in events:
        if ev["clear"]:
            counts = dict.fromkeys(COUNTERS, 0)
            continue
        counts["cycles"] += 1
        counts["instructions"] += ev["instructions"]
        counts["array_active"] += ev["array_active"]
        counts["useful_macs"] += macs * ev["array_active"]
        counts["weight_stall"] += ev["weight_stall"]
        counts["weight_shift"] += ev["weight_shift"]
        counts["non_matrix"] += ev["other_work"] & (1 - ev["array_active"])
        counts["raw_stall"] += ev["raw_stall"]
        counts["host_stall"] += ev["host_stall"]
    return {name: value % (1 << width) for name, value in counts.items()}


# 6 and 12: useful_macs is array_active times a sum of shifts; 8: one shift.
@pytest.mark.parametrize("macs", [6, 8, 12])
@pytest.mark.parametrize("width", [4, 48])
def test_counters_count_and_wrap(width: int, macs: int):
    """Random events every cycle (a clear among them) while counters are selected at random
    times: whenever ``o_valid`` is high, ``o_value`` is the selected counter's count up to
    three cycles before (the events are registered twice), and a selected counter is shown
    within ``len(RING)`` cycles."""
    seed = 7000 + width + macs
    print(f"seed {seed}")
    rng = random.Random(seed)
    events = []
    for i in range(400):
        ev = {name: int(rng.random() < 0.6) for name in COUNTER_EVENTS}
        ev["clear"] = int(i in (50, 300))
        events.append(ev)
    dut = PerfCounters(macs_per_row=macs, width=width)
    shown = dict.fromkeys(COUNTERS, 0)

    async def bench(ctx):
        select, waited = 0, 0
        for i, ev in enumerate(events):
            if waited == 0 or rng.random() < 0.2:
                select, waited = rng.randrange(len(COUNTERS)), 0
            ctx.set(dut.i_select, select)
            for name, value in ev.items():
                ctx.set(getattr(dut.i_events, name), value)
            name = COUNTERS[select]
            if ctx.get(dut.o_valid):
                expected = model(events[:max(i - 2, 0)], width, macs)[name]
                assert ctx.get(dut.o_value) == expected, f"{name} in cycle {i}, seed {seed}"
                shown[name] += 1
                waited = 0
            else:
                waited += 1
                assert waited < len(RING), f"{name} not shown in {len(RING)} cycles, seed {seed}"
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert all(shown.values()), f"every counter compared: {shown}"
    if width < 48:
        # 99 cycles after the last clear: the 4-bit cycle counter wrapped several times.
        assert model(events, width, macs)["cycles"] == 99 % 16


def test_counter_bits_in_config_and_isa_sim():
    assert TPUConfig().counter_bits == 48
    with pytest.raises(ConfigError, match="counter_bits=31 is not supported; allowed: 32 to 48"):
        TPUConfig(counter_bits=31)
    sim = IsaSim(TPUConfig(rows=2, cols=2, counter_bits=32))
    sim._counts["instructions"] = (1 << 32) + 5
    assert sim.counters()["instructions"] == 5


def test_counter_invariants_find_each_read_and_each_broken_relation():
    """progen.counter_reads finds every READ_COUNTERS in a stream by the ISA simulator's
    open counters; counter_invariants names each relation a made-up read breaks."""
    config = get_config("tiny")
    p = Program(config)
    p.read_host(0, [[1, 2], [3, 4]])
    p.read_counters()
    p.write_host(0, 2)
    p.read_counters()
    p.halt()
    expected = IsaSim(config).run(p.beats)
    good = {"cycles": 40, "weight_stall": 0, "non_matrix": 5, "raw_stall": 3,
            "host_stall": 30}
    got = [good[name] if e is None and name in good else e
           for e, name in zip(expected, [*COUNTERS, "row", "row", *COUNTERS, "done"],
                              strict=True)]
    reads = counter_reads(expected, got)
    assert [read["instructions"] for read in reads] == [1, 3]
    assert all(counter_invariants(read) == [] for read in reads)
    assert check_counter_invariants(expected, got, "good") == 2
    base = dict(reads[0], array_active=0, instructions=1)
    cases = {
        "array_active + weight_stall <= cycles": dict(weight_stall=41),
        "raw_stall + host_stall + instructions <= cycles + 1": dict(host_stall=38),
        "non_matrix >= 5": dict(non_matrix=4),
    }
    for relation, change in cases.items():
        assert counter_invariants({**base, **change}) == [relation]
    assert counter_invariants({**base, "host_stall": 37}) == []      # cycles + 1 is allowed
    bad = list(got)
    bad[COUNTERS.index("non_matrix")] = 0
    with pytest.raises(AssertionError, match="READ_COUNTERS 0 of 2 breaks non_matrix >= 5"):
        check_counter_invariants(expected, bad, "bad")


def test_counter_timing_bounds_each_read_by_the_cycles_seen():
    """progen.check_counter_timing: CLEAR_COUNTERS taken in cycle 10, a NOP in 11, the host
    silent in 12..14, READ_COUNTERS taken in 15, its beats leaving from cycle 20: ``cycles``
    lies in 3..6, the front end's cycles fit in 4; one past either bound fails, naming it."""
    config = get_config("tiny")
    p = Program(config)
    p.clear_counters()
    p.nop()
    p.read_counters()
    p.halt()
    expected = IsaSim(config).run(p.beats)
    taken = [10, 11, 15, 16]
    sent = [20 + 9 * k for k in range(len(expected))]
    values = {"cycles": 6, "weight_stall": 0, "non_matrix": 6, "raw_stall": 0, "host_stall": 3}

    def check(**change):
        got = [{**values, **change}[name] if e is None else e
               for e, name in zip(expected, [*COUNTERS, "done"], strict=True)]
        return check_counter_timing(p.beats, [0, 1, 2, 3], taken, sent, expected, got, "case")

    assert check() == 1
    assert check(cycles=3, host_stall=0) == 1
    for change, bound in [({"cycles": 2}, "cycles >= r - 2 - c"),
                          ({"cycles": 7}, "cycles <= (cycles's beat left) - 4 - c"),
                          ({"host_stall": 4}, "raw_stall + host_stall + instructions <= r - 1 - c"),
                          ({"non_matrix": 61}, "array_active + non_matrix <= ")]:
        with pytest.raises(AssertionError, match=re.escape(bound)):
            check(**change)
