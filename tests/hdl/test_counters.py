"""Performance counters: each event counts, ``clear`` wins, and a narrow counter wraps at its
width (``TPUConfig.counter_bits``), as the ISA simulator masks it."""

from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from hdl.config import ConfigError, TPUConfig
from hdl.control.counters import PerfCounters
from hdl.isa import COUNTERS
from hdl.ports import COUNTER_EVENTS
from sim.isa_sim import IsaSim


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


# 6: useful_macs counts on its own; 8: it is array_active shifted (a power of two).
@pytest.mark.parametrize("macs", [6, 8])
@pytest.mark.parametrize("width", [4, 48])
def test_counters_count_and_wrap(width: int, macs: int):
    seed = 7000 + width
    print(f"seed {seed}")
    rng = random.Random(seed)
    events = []
    for i in range(120):
        ev = {name: int(rng.random() < 0.6) for name in COUNTER_EVENTS}
        ev["clear"] = int(i == 50)
        events.append(ev)
    dut = PerfCounters(macs_per_row=macs, width=width)
    seen: dict[str, int] = {}

    async def bench(ctx):
        for ev in events:
            for name, value in ev.items():
                ctx.set(getattr(dut.i_events, name), value)
            await ctx.tick()
        for name, value in dict.fromkeys(COUNTER_EVENTS, 0).items():
            ctx.set(getattr(dut.i_events, name), value)
        for i, name in enumerate(COUNTERS):
            ctx.set(dut.i_select, i)
            seen[name] = ctx.get(dut.o_value)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == model(events, width, macs), f"seed {seed}"
    if width < 48:
        # 69 cycles after the clear: the 4-bit cycle counter wrapped more than once.
        assert seen["cycles"] == 69 % 16


def test_counter_bits_in_config_and_isa_sim():
    assert TPUConfig().counter_bits == 48
    with pytest.raises(ConfigError, match="counter_bits=31 is not supported; allowed: 32 to 48"):
        TPUConfig(counter_bits=31)
    sim = IsaSim(TPUConfig(rows=2, cols=2, counter_bits=32))
    sim._counts["instructions"] = (1 << 32) + 5
    assert sim.counters()["instructions"] == 5
