"""cocotb test module of the guided tour (:mod:`sim.waves.tour`): one small program on the core.

Run inside the simulator by :func:`sim.waves.tour.run_tour` with :class:`hdl.core.Core` as the
toplevel. The single test, :func:`tour`, resets the core, sends the program of the tour's
stop (``AMTPU_TOUR``, :data:`sim.waves.tour.TOURS`, the matmul by default) on ``i_host`` and
takes every beat on ``o_host`` without back-pressure, so the waveform shows the core at full
speed. Every cycle it samples a few internal signals (by their names in the Verilog
hierarchy, the stop's events) and notes the first cycle each event happens, for the save
file's markers. It writes the beats
it received, their times and the events' times to the JSON file named by
``AMTPU_TOUR_OUT``; :func:`sim.waves.tour.run_tour` compares the beats with the ISA simulator's.
"""

from __future__ import annotations

import json
import os

import cocotb
from amaranth.hdl import unsigned
from cocotb.triggers import FallingEdge, ReadOnly
from cocotb.utils import get_sim_time

from sim.rtl.runner import config_from_env
from sim.rtl.streams import StreamDriver, StreamMonitor, reset, start_clock
from sim.waves.tour import TOURS

#: Cycles the test allows from the reset to the last beat (the buffer's clearing included).
TIMEOUT_CYCLES = 5_000
#: The clock period (sim.rtl.streams.start_clock's default), in ps.
PERIOD_PS = 10_000
#: Cycles simulated after the DONE beat.
TAIL_CYCLES = 100


def _handle(dut, path: str):
    """The simulator handle of ``a.b.c`` below the toplevel."""
    handle = dut
    for part in path.split("."):
        handle = getattr(handle, part)
    return handle


def _equals(handle, value: int) -> bool:
    """Whether the signal holds *value* (never while any of its bits is X or Z)."""
    try:
        return int(handle.value) == value
    except ValueError:
        return False


@cocotb.test()
async def tour(dut):
    """The tour's program, from reset to its DONE beat."""
    config = config_from_env()
    stop = TOURS[os.environ.get("AMTPU_TOUR", "matmul")]
    program = stop.program(config)
    start_clock(dut, impl="py")         # the clock whose times docs/tour.md quotes
    dut.i_clear.value = 0
    host = unsigned(config.host_width)
    driver = StreamDriver(dut, "i_host", dut.clk, host)
    monitor = StreamMonitor(dut, "o_host", dut.clk, host)
    await reset(dut)
    start = int(get_sim_time("ps"))
    driver.extend(program.beats)

    probes = {name: [(_handle(dut, path), value) for path, value in signals.items()]
              for name, (_, signals) in stop.events.items()}
    first: dict[str, int] = {}
    received_at: list[int] = []
    taken_at: list[int] = []
    for _ in range(TIMEOUT_CYCLES):
        await FallingEdge(dut.clk)
        await ReadOnly()
        now = int(get_sim_time("ps"))
        for name, handles in probes.items():
            if name not in first and all(_equals(h, v) for h, v in handles):
                first[name] = now
        if dut.o_host__valid.value and dut.o_host__ready.value:
            received_at.append(now)
        if dut.i_host__valid.value and dut.i_host__ready.value:
            taken_at.append(now)
        if len(monitor.received) >= program.expected_beats:
            break
    # Quiet cycles after the DONE beat: the waveform shows the core idle again, and runs on
    # past the view (GTKWave ignores a saved start time whose page would pass the end).
    for _ in range(TAIL_CYCLES):
        await FallingEdge(dut.clk)
    end = int(get_sim_time("ps"))
    out = os.environ.get("AMTPU_TOUR_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({"received": [int(beat) for beat in monitor.received],
                       "received_at": received_at, "taken_at": taken_at,
                       "events": first, "reset_done": start, "end": end,
                       "period": PERIOD_PS}, f)
    assert len(monitor.received) == program.expected_beats, \
        f"got {len(monitor.received)} of {program.expected_beats} beats in " \
        f"{TIMEOUT_CYCLES} cycles"
    assert driver.pending() == 0, f"{driver.pending()} beats not taken"
