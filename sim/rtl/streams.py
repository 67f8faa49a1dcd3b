"""cocotb 2 drivers and monitors for ``amaranth.lib.stream`` ports.

Amaranth names a stream port's signals ``<prefix>__valid``, ``<prefix>__ready`` and
``<prefix>__payload``; the payload is one flat vector holding an ``amaranth.lib.data``
layout, packed with ``layout.const(...)`` and unpacked with ``layout.from_bits(...)``.

Timing convention, used by everything here (race-free on Icarus and Verilator): inputs are
written just after the falling edge, then the testbench waits for ``ReadOnly`` of the same
half cycle and samples. What it samples there is stable up to the next rising edge, so a
sampled ``valid & ready`` is exactly a transfer at that edge.

Stall patterns follow Forencich's cocotbext-axi: a driver takes an *idle* generator (``True``
= do not offer a new beat this cycle), a monitor a *backpressure* generator (``True`` =
deassert ready this cycle). A driver never withdraws a beat it has offered (the stream
rule: once ``valid`` is high it stays high, with the same payload, until accepted).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cocotb
from amaranth.hdl import Shape, ShapeCastable
from amaranth.lib import data
from cocotb.triggers import Event, FallingEdge, ReadOnly

__all__ = ["pack", "unpack", "to_python", "random_stalls", "never", "burst_stalls",
           "start_clock", "reset", "StreamDriver", "StreamMonitor"]


# Payload packing ----------------------------------------------------------------------------

def to_python(value: Any) -> Any:
    """A ``data.Const`` view as plain Python: arrays to lists, structs to dicts, fields to
    ints (signed fields as negative ints)."""
    if isinstance(value, data.Const):
        layout = value.shape()
        if isinstance(layout, data.ArrayLayout):
            return [to_python(value[i]) for i in range(layout.length)]
        return {name: to_python(value[name]) for name, _ in layout}
    return int(value)


def pack(layout: ShapeCastable | Shape, value: Any) -> int:
    """Raw bits of *value* (a dict/list for a data layout, an int for a plain shape)."""
    if isinstance(layout, data.Layout):
        return layout.const(value).as_bits()
    width = Shape.cast(layout).width
    return int(value) & ((1 << width) - 1)


def unpack(layout: ShapeCastable | Shape, bits: int) -> Any:
    """Python value of raw *bits* under *layout* (inverse of :func:`pack`)."""
    if isinstance(layout, data.Layout):
        return to_python(layout.from_bits(bits))
    shape = Shape.cast(layout)
    if shape.signed and bits >> (shape.width - 1) & 1:
        return bits - (1 << shape.width)
    return bits


# Stall patterns -----------------------------------------------------------------------------

def never() -> Iterator[bool]:
    """No stalls."""
    return itertools.repeat(False)


def random_stalls(seed: int, probability: float) -> Iterator[bool]:
    """Independent stalls with the given probability per cycle, reproducible from *seed*."""
    rng = random.Random(seed)
    while True:
        yield rng.random() < probability


def burst_stalls(seed: int, max_run: int = 8) -> Iterator[bool]:
    """Alternating random-length runs of stalls and no stalls (1 to *max_run* cycles)."""
    rng = random.Random(seed)
    while True:
        yield from itertools.repeat(True, rng.randint(1, max_run))
        yield from itertools.repeat(False, rng.randint(1, max_run))


# Clock and reset ----------------------------------------------------------------------------

def start_clock(dut, period_ns: int = 10, impl: str = "gpi"):
    """Hold ``dut.rst`` (synchronous, active high) and start ``dut.clk``; returns the
    clock's task. Reset stays asserted until :func:`reset` releases it, so no edge ever
    samples an undriven reset.

    ``impl="gpi"`` (the default): the clock toggles in the simulator, without a Python
    coroutine woken twice a cycle (cocotb's choice without COCOTB_TRUST_INERTIAL_WRITES). It
    starts low, so its first edge rises (at half a period, reset held) before any falling
    edge a testbench waits for; started high, its first falling edge came before any rising
    one, and a monitor sampled outputs no edge had set yet. ``impl="py"``: cocotb's Python
    clock, rising at 0 ns (the tour's times in docs/tour.md are that clock's)."""
    from cocotb.clock import Clock
    dut.rst.value = 1
    if impl == "py":
        return Clock(dut.clk, period_ns, unit="ns", impl="py").start()
    return Clock(dut.clk, period_ns, unit="ns", impl=impl).start(start_high=False)


async def reset(dut, cycles: int = 3) -> None:
    """Assert ``dut.rst`` for *cycles* falling edges (so at least ``cycles - 1`` rising
    edges), then release it just after a falling edge."""
    dut.rst.value = 1
    for _ in range(cycles):
        await FallingEdge(dut.clk)
    dut.rst.value = 0


# Driver and monitor -------------------------------------------------------------------------

class StreamDriver:
    """Source for an Amaranth stream input port of the DUT.

    Beats queued with :meth:`append` (or awaited one by one with :meth:`send`) are offered in
    order, one per cycle at most, with idle cycles from the idle generator between them.

    Attributes
    ----------
    sent : int
        Beats transferred so far.
    stalls : list[int]
        For each cycle that a beat was offered and not accepted, that beat's index.
    sent_cycles : list[int]
        For each beat, the cycle (since the driver started) it was transferred in.
    """

    def __init__(self, dut, prefix: str, clk, layout, idle: Iterable[bool] | None = None):
        self.name = prefix
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk = clk
        self.layout = layout
        self._idle = iter(idle) if idle is not None else never()
        self._queue: deque[tuple[Any, Event | None]] = deque()
        self._empty = Event()
        self._empty.set()
        self.sent = 0
        self.stalls: list[int] = []
        self.sent_cycles: list[int] = []
        self.cycle = 0
        self.valid.value = 0
        self._task = cocotb.start_soon(self._run())

    def set_idle_generator(self, idle: Iterable[bool] | None) -> None:
        self._idle = iter(idle) if idle is not None else never()

    def append(self, value: Any) -> None:
        """Queue one beat (a dict/list/int for the payload layout)."""
        self._queue.append((value, None))
        self._empty.clear()

    def extend(self, values: Iterable[Any]) -> None:
        for value in values:
            self.append(value)

    async def send(self, value: Any) -> None:
        """Queue one beat and wait until it has been transferred."""
        done = Event()
        self._queue.append((value, done))
        self._empty.clear()
        await done.wait()

    def pending(self) -> int:
        """Beats not yet transferred (including one being offered)."""
        return len(self._queue)

    async def wait_idle(self) -> None:
        """Wait until every queued beat has been transferred."""
        await self._empty.wait()

    async def _run(self) -> None:
        offered = valid = False
        while True:
            await FallingEdge(self.clk)
            self.cycle += 1
            if not offered:
                idle = next(self._idle)
                if self._queue and not idle:
                    self.payload.value = pack(self.layout, self._queue[0][0])
                    offered = True
                if offered != valid:
                    # Writes cost simulator time even when nothing changes: skip those.
                    valid = offered
                    self.valid.value = int(valid)
            await ReadOnly()
            if offered:
                if self.ready.value:
                    _, done = self._queue.popleft()
                    self.sent += 1
                    self.sent_cycles.append(self.cycle)
                    offered = False
                    if done is not None:
                        done.set()
                    if not self._queue:
                        self._empty.set()
                else:
                    self.stalls.append(self.sent)


class StreamMonitor:
    """Sink for an Amaranth stream output port of the DUT.

    Drives ``ready`` from the backpressure generator (``True`` = not ready this cycle) and
    records every transferred payload, as plain Python values, in :attr:`received`; each is
    also passed to *callback*. With ``drive_ready=False`` it only observes (for a port
    another component drives the ready of).

    Attributes
    ----------
    received : list
        Payloads in arrival order.
    cycles : list[int]
        For each payload, the cycle (since the monitor started) it was transferred in.
    """

    def __init__(self, dut, prefix: str, clk, layout,
                 backpressure: Iterable[bool] | None = None,
                 callback: Callable[[Any], None] | None = None, *, drive_ready: bool = True):
        self.name = prefix
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk = clk
        self.layout = layout
        self.callback = callback
        self.drive_ready = drive_ready
        self._backpressure = iter(backpressure) if backpressure is not None else never()
        self.received: list[Any] = []
        self.cycles: list[int] = []
        self.cycle = 0
        self._count_event = Event()
        if drive_ready:
            self.ready.value = 0
        self._task = cocotb.start_soon(self._run())

    def set_backpressure_generator(self, backpressure: Iterable[bool] | None) -> None:
        self._backpressure = iter(backpressure) if backpressure is not None else never()

    async def wait_for(self, count: int) -> None:
        """Wait until at least *count* payloads have been received."""
        while len(self.received) < count:
            self._count_event.clear()
            await self._count_event.wait()

    async def _run(self) -> None:
        ready = False
        while True:
            await FallingEdge(self.clk)
            self.cycle += 1
            if self.drive_ready:
                now = not next(self._backpressure)
                if now != ready:
                    ready = now
                    self.ready.value = int(ready)
            await ReadOnly()
            if not self.drive_ready:
                ready = bool(self.ready.value)
            if ready and self.valid.value:
                value = unpack(self.layout, self.payload.value.to_unsigned())
                self.received.append(value)
                self.cycles.append(self.cycle)
                self._count_event.set()
                if self.callback is not None:
                    self.callback(value)
