"""cocotb test module that serves a host process's requests on the RTL core.

Run inside the simulator by :class:`firmware.transports.rtl.RtlDevice` with the design
:class:`sim.rtl.host_bridge.HostBridge` as the toplevel. The single test, :func:`serve`, connects
back to the host (``multiprocessing.connection``; address and key from the environment),
starts the clock, resets the core and then answers requests until ``close``. While it waits
for the host the simulation is frozen; while it awaits the bridge's ``o_event`` the simulator
runs free, with no Python in between.

Requests are tuples ``(name, *arguments)``; every request gets one reply, ``("ok", value)``
or ``("error", kind, beats_received, status_bits)``:

``("send", beats)``
    Queue beats for the core's input (written into the bridge's input ring as room allows).
``("receive", count, timeout_cycles)``
    Run until ``count`` output beats are held, then return them (oldest first). Fails with
    kind ``"error"`` when the core's status shows an error first, ``"timeout"`` when
    ``timeout_cycles`` core cycles pass first (``None``: ``AMTPU_RTL_IDLE_CYCLES``, default
    10,000, pass with the core neither taking an input beat nor sending one); the beats that
    did arrive stay for the next receive.
``("coverage",)``
    The bridge's coverage counters (hazard rules stalled on, engine pairs that overlapped).
``("status",)``, ``("cycles",)``
    The core's status bits; rising clock edges so far.
``("clear",)``, ``("reset",)``
    Clear a pending error with ``i_clear`` (held until the core has sent its error beat and
    left the error state) or hold the core in reset (three cycles); both drop the queued
    input beats and the output beats not yet returned. The bridge registers its inputs, so
    both take effect at the second clock edge after the request.
``("close",)``
    End the test (and with it the simulation).

Every request is handled just after a falling clock edge, where reading and writing the
design is race-free on Icarus and Verilator. Environment: ``AMTPU_RTL_ADDRESS``,
``AMTPU_RTL_AUTHKEY`` (hex), ``AMTPU_RTL_IN_DEPTH``, ``AMTPU_RTL_OUT_DEPTH``,
``AMTPU_RTL_ERROR_MASK`` (the status bit that flags an error), ``AMTPU_RTL_PERIOD_NS``,
``AMTPU_RTL_IDLE_CYCLES`` (the default receive timeout: cycles without progress).
"""

from __future__ import annotations

import os
from collections import deque
from multiprocessing.connection import Client

import cocotb
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.handle import Immediate
from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, First, RisingEdge, Timer

from hdl.beats import ERROR_MAGIC, ErrorBeat
from hdl.control.hazards import HAZARD_RULES
from hdl.isa import Status
from sim.rtl.host_bridge import COVERAGE_BITS, OVERLAPS

STATUS = data.Layout.cast(Status)
ERROR_BEAT = data.Layout.cast(ErrorBeat)

#: Width of the bridge's output counters (:data:`sim.rtl.host_bridge.COUNT_BITS`).
COUNT_BITS = 32
#: Cycles a receive waits by default while the core neither takes nor sends a beat.
IDLE_CYCLES = 10_000
RESET_CYCLES = 3
#: Cycles the clear waits for the core to send its error beat and leave the error state.
CLEAR_CYCLES = 100_000


class Server:
    """The bridge's rings, mirrored by counters, and the request handlers."""

    def __init__(self, dut, period_ns: int, in_depth: int, out_depth: int, error_mask: int):
        self.dut = dut
        self.period = period_ns
        self.in_depth = in_depth
        self.out_depth = out_depth
        self.error_mask = error_mask
        self.in_mem = dut.in_mem.mem               # the rows of the rings (amtpu_ring.v)
        self.out_mem = dut.out_mem.mem
        self.in_cells: list = [None] * in_depth      # element handles, made on first use
        self.out_cells: list = [None] * out_depth
        self.pending: deque[int] = deque()           # beats sent that did not fit the ring
        self.held: deque[int] = deque()              # beats read from the ring, not returned
        self.in_wr = 0          # beats written into the input ring (all time)
        self.out_rd = 0         # beats read from the output ring (all time)
        self.target = 0         # the output count o_event waits for
        self.more = False       # i_in_more
        self.idle_cycles = int(os.environ.get("AMTPU_RTL_IDLE_CYCLES", IDLE_CYCLES))

    # The bridge ----------------------------------------------------------------------------

    def drive_idle(self) -> None:
        dut = self.dut
        for port in (dut.i_in_wr, dut.i_in_drop, dut.i_in_more, dut.i_load, dut.i_load_addr,
                     dut.i_load_data, dut.i_out_rd, dut.i_out_target, dut.i_out_addr,
                     dut.i_clear):
            port.value = 0
        self.in_wr = self.out_rd = self.target = 0
        self.more = False

    def refill(self) -> bool:
        """Move pending beats into the input ring, as many as fit; whether an input of the
        bridge changed."""
        changed = False
        if self.pending:
            filled = (self.in_wr - int(self.dut.o_in_rd.value)) % (2 * self.in_depth)
            room = min(self.in_depth - filled, len(self.pending))
            for _ in range(room):
                index = self.in_wr % self.in_depth
                cell = self.in_cells[index]
                if cell is None:
                    cell = self.in_cells[index] = self.in_mem[index]
                cell.set(Immediate(self.pending.popleft()))
                self.in_wr += 1
            if room:
                self.dut.i_in_wr.value = self.in_wr % (2 * self.in_depth)
                changed = True
        more = bool(self.pending)
        if more != self.more:
            self.more = more
            self.dut.i_in_more.value = int(more)
            changed = True
        return changed

    def drain(self) -> None:
        """Move the output ring's unread beats into :attr:`held` (the bridge's event does
        not depend on what was read, so this changes nothing the event waits for)."""
        unread = (int(self.dut.o_out_wr.value) - self.out_rd) % (1 << COUNT_BITS)
        if not unread:
            return
        for _ in range(unread):
            index = self.out_rd % self.out_depth
            cell = self.out_cells[index]
            if cell is None:
                cell = self.out_cells[index] = self.out_mem[index]
            self.held.append(cell.value.to_unsigned())
            self.out_rd += 1
        self.dut.i_out_rd.value = self.out_rd % (1 << COUNT_BITS)

    def input_drained(self) -> bool:
        """Whether the core has taken every beat sent."""
        taken = int(self.dut.o_in_rd.value)
        return not self.pending and taken == self.in_wr % (2 * self.in_depth)

    def error_beat_position(self, status: int) -> int | None:
        """Where the error beat for ``status`` is among the held beats, if it has come."""
        code, index = STATUS["code"], STATUS["instr_index"]
        beat = ERROR_BEAT.const({
            "instr_index": (status >> index.offset) & ((1 << index.width) - 1),
            "code": (status >> code.offset) & ((1 << code.width) - 1),
            "magic": ERROR_MAGIC,
        }).as_bits()
        for position, held in enumerate(self.held):
            if held & ((1 << 64) - 1) == beat:
                return position
        return None

    def status_bits(self) -> int:
        return int(self.dut.o_status.value.to_unsigned())

    def cycles(self) -> int:
        return int(get_sim_time("ns")) // self.period

    # Requests ------------------------------------------------------------------------------

    async def send(self, beats: list[int]) -> tuple:
        self.pending.extend(beats)
        self.refill()
        return ("ok", None)

    async def receive(self, count: int, timeout_cycles: int | None) -> tuple:
        idle = timeout_cycles is None
        deadline = self.cycles() + (self.idle_cycles if idle else timeout_cycles)
        dut = self.dut
        progress = None
        while True:
            self.drain()
            changed = self.refill()
            if idle:
                now = (int(dut.o_in_rd.value), self.out_rd)
                if now != progress:
                    progress, deadline = now, self.cycles() + self.idle_cycles
            status = self.status_bits()
            # With an error pending, wait until the core has taken every beat sent (it
            # discards them, or the resynchronisation word clears the error), as the ISA
            # transport does at once; then fail if the error beat is among the beats asked
            # for (the beats before it stay for the next receive).
            settled = not status & self.error_mask or self.input_drained()
            if status & self.error_mask and settled:
                stop = self.error_beat_position(status)
                if stop is not None and stop < count:
                    return ("error", "error", stop, status)
            if settled and len(self.held) >= count:
                return ("ok", [self.held.popleft() for _ in range(count)])
            left = deadline - self.cycles()
            if left <= 0:
                return ("error", "timeout", len(self.held), status)
            # Wait for the beats still missing, or a ring's worth of them.
            target = self.out_rd + min(count - len(self.held), self.out_depth)
            if target != self.target:
                self.target = target
                dut.i_out_target.value = target % (1 << COUNT_BITS)
                changed = True
            if changed or dut.o_event.value:
                # The bridge registers its inputs: the event means the new values only after
                # an edge. Waiting for a rising event is safe once it is low with them.
                await FallingEdge(dut.clk)
                continue
            await First(RisingEdge(dut.o_event), Timer(left * self.period, unit="ns"))
            await FallingEdge(dut.clk)

    async def status(self) -> tuple:
        return ("ok", self.status_bits())

    async def coverage(self) -> tuple:
        """The bridge's coverage counters: cycles stalled on each hazard rule, cycles each
        pair of engines worked at once (since the last reset)."""
        def split(value, n: int) -> list[int]:
            bits = int(value.to_unsigned())
            mask = (1 << COVERAGE_BITS) - 1
            return [(bits >> (COVERAGE_BITS * i)) & mask for i in range(n)]
        stalls = split(self.dut.o_stall_cycles.value, len(HAZARD_RULES))
        overlaps = split(self.dut.o_overlap_cycles.value, len(OVERLAPS))
        return ("ok", {"stalls": dict(zip(HAZARD_RULES, stalls, strict=True)),
                       "overlaps": {f"{a}+{b}": n
                                    for (a, b), n in zip(OVERLAPS, overlaps, strict=True)}})

    async def cycles_request(self) -> tuple:
        return ("ok", self.cycles())

    async def clear(self) -> tuple:
        """Clear a pending error with i_clear and drop the queued beats and the output beats
        not yet returned (the error beat among them). The core sends its error beat before it
        takes a clear, so i_clear stays high until the error is gone (at most
        CLEAR_CYCLES cycles); with no error pending it is one pulse and changes nothing in
        the core."""
        dut = self.dut
        self.pending.clear()
        self.more = False
        dut.i_in_more.value = 0
        dut.i_clear.value = 1
        dut.i_in_drop.value = 1
        await FallingEdge(dut.clk)
        dut.i_in_drop.value = 0
        await FallingEdge(dut.clk)          # registered: the core has seen the clear now
        for _ in range(CLEAR_CYCLES):
            if not self.status_bits() & self.error_mask:
                break
            await FallingEdge(dut.clk)
        dut.i_clear.value = 0
        await FallingEdge(dut.clk)
        self.drain()
        self.held.clear()
        return ("ok", None)

    async def reset(self) -> tuple:
        """Hold the core in reset for RESET_CYCLES edges; drop every beat, queued or held."""
        dut = self.dut
        self.pending.clear()
        self.held.clear()
        self.sent = 0
        self.drive_idle()
        dut.i_reset.value = 1
        for _ in range(RESET_CYCLES):
            await FallingEdge(dut.clk)
        dut.i_reset.value = 0
        await FallingEdge(dut.clk)
        return ("ok", None)


@cocotb.test()
async def serve(dut):
    """Serve the host's requests until it closes the device."""
    env = os.environ
    period = int(env.get("AMTPU_RTL_PERIOD_NS", "10"))
    server = Server(dut, period, int(env["AMTPU_RTL_IN_DEPTH"]),
                    int(env["AMTPU_RTL_OUT_DEPTH"]), int(env["AMTPU_RTL_ERROR_MASK"]))
    conn = Client(env["AMTPU_RTL_ADDRESS"], family="AF_UNIX",
                  authkey=bytes.fromhex(env["AMTPU_RTL_AUTHKEY"]))
    dut.i_reset.value = 1
    # The GPI clock toggles in the simulator, without Python.
    Clock(dut.clk, period, unit="ns", impl="gpi").start()
    await server.reset()
    conn.send(("hello", os.getpid()))
    handlers = {
        "send": server.send, "receive": server.receive, "status": server.status,
        "cycles": server.cycles_request, "clear": server.clear, "reset": server.reset,
        "coverage": server.coverage,
    }
    try:
        while True:
            try:
                request = conn.recv()
            except EOFError:
                return                      # the host went away: end quietly
            name, args = request[0], request[1:]
            if name == "close":
                conn.send(("ok", None))
                return
            handler = handlers.get(name)
            if handler is None:
                conn.send(("error", "request", 0, 0, f"unknown request {name!r}"))
                continue
            conn.send(await handler(*args))
    finally:
        conn.close()
