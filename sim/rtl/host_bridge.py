"""Simulation-only wrapper of the core that holds the host stream's beats in memories, so a
host program can run on the RTL without Python stepping every clock cycle.

The host (:mod:`sim.rtl.server`, through the simulator's VPI) writes instruction and data
beats into the input ring at a frozen simulation time and advances ``i_in_wr``; the bridge
feeds them to the core's ``i_host`` one a cycle. Every beat the core sends on ``o_host`` lands
in the output ring, which the host reads back in bulk and releases by advancing
``i_out_rd``. ``o_event`` rises when the host has something to do (the output count it waits
for, an error, input to refill), so the simulator runs free between the host's visits.

The input ring is addressed by counters one bit wider than the memory's address, so that a
full ring (``depth`` beats) differs from an empty one; the output counters are
:data:`COUNT_BITS` wide. Nothing here is meant for synthesis.
"""

from __future__ import annotations

import itertools

from amaranth.hdl import ClockDomain, ClockSignal, Instance, Module, ResetSignal, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.control.hazards import HAZARD_RULES
from hdl.core import ACTIVITY, Core
from hdl.isa import Status

__all__ = ["HostBridge", "DEFAULT_IN_DEPTH", "DEFAULT_OUT_DEPTH", "COUNT_BITS",
           "OVERLAPS", "COVERAGE_BITS", "RING_MODULE"]

#: Pairs of :data:`hdl.core.ACTIVITY` whose overlap the bridge counts.
OVERLAPS = tuple(itertools.combinations(ACTIVITY, 2))
#: Width of the coverage counters (they saturate).
COVERAGE_BITS = 32

DEFAULT_IN_DEPTH = 4096
DEFAULT_OUT_DEPTH = 4096
#: Width of the output beat counters (they wrap).
COUNT_BITS = 32
#: The rings' Verilog module (``sim/rtl/models/amtpu_ring.v``).
RING_MODULE = "amtpu_ring"


class _RingPort:
    """The signals of one port of a ring: ``addr`` and ``data``, and ``en`` (writes only)."""

    def __init__(self, abits: int, width: int):
        self.addr = Signal(abits)
        self.data = Signal(width)
        self.en = Signal()


def _ring(write: _RingPort, read: _RingPort, clk) -> Instance:
    """One ring: *write* stores at the edges where its ``en`` is high, *read* returns the row
    at its ``addr`` as of the edge before (both ports on *clk*)."""
    return Instance(RING_MODULE, p_WIDTH=len(write.data), p_ABITS=len(write.addr),
                    i_clk=clk, i_wen=write.en, i_waddr=write.addr, i_wdata=write.data,
                    i_raddr=read.addr, o_rdata=read.data)


def _check_depth(name: str, depth: int) -> int:
    if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
        raise ValueError(f"HostBridge {name}={depth!r} is not supported; allowed: a power of "
                         f"two of at least 2")
    return depth.bit_length()       # log2(depth) + 1: counter width with the wrap bit


class HostBridge(wiring.Component):
    """:class:`hdl.core.Core` between an input ring and an output ring of host beats.

    Every input is registered before any logic uses it, so a change the host makes takes
    effect at the next clock edge, and no logic depends on an input combinationally: a
    compiled simulator (Verilator) then evaluates nothing when only the clock falls. For the
    same reason the core's reset is the registered ``i_reset``, not a reset port.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration.
    in_depth : int
        Beats the input ring holds, a power of two.
    out_depth : int
        Beats the output ring holds, a power of two.

    Members
    -------
    clk : In(1)
        The clock of the core and the bridge.
    i_reset : In(1)
        Synchronous reset of the core and the rings (registered: the core is in reset from
        the edge after ``i_reset`` rises to the edge after it falls).
    i_in_wr : In(unsigned(log2(in_depth) + 1))
        Beats the host has written into the input ring, modulo ``2 * in_depth``. The host
        writes beat ``n`` into ``in_mem[n % in_depth]`` before counting it here, and never
        overwrites a beat the core has not taken (``i_in_wr - o_in_rd <= in_depth``).
    o_in_rd : Out(unsigned(log2(in_depth) + 1))
        Beats the core has taken from the input ring, modulo ``2 * in_depth``.
    i_in_drop : In(1)
        Drops every beat the core has not taken (the ring's read counter jumps to
        ``i_in_wr``); the core takes no beat in a cycle that drops.
    i_in_more : In(1)
        The host holds beats that did not fit in the ring: ``o_event`` rises when the ring is
        at most half full, in time for a refill before the core runs dry.
    i_load : In(1)
        Load port of the input ring (for hosts that cannot write the memory directly):
        writes ``i_load_data`` into ``in_mem[i_load_addr]`` at the clock edge.
    i_load_addr : In(unsigned(log2(in_depth)))
    i_load_data : In(unsigned(config.host_width))
    o_out_wr : Out(unsigned(COUNT_BITS))
        Beats the core has sent into the output ring, modulo ``2 ** COUNT_BITS``; beat ``n``
        is in ``out_mem[n % out_depth]``. Restarts at 0 with a reset.
    i_out_rd : In(unsigned(COUNT_BITS))
        Beats the host has read from the output ring, modulo ``2 ** COUNT_BITS``. The core
        waits (``o_host.ready`` low) while the ring is full.
    i_out_target : In(unsigned(COUNT_BITS))
        ``o_event`` rises once ``o_out_wr`` reaches this count (modulo ``2 ** COUNT_BITS``,
        within ``2 ** (COUNT_BITS - 1)`` beats).
    i_out_addr : In(unsigned(log2(out_depth)))
        Read port of the output ring (for hosts that cannot read the memory directly).
    o_out_data : Out(unsigned(config.host_width))
        ``out_mem[i_out_addr]`` as of the previous clock edge.
    o_event : Out(1)
        ``o_out_wr`` has reached ``i_out_target``, or the core's status shows an error, or
        ``i_in_more`` is set and the input ring is at most half full.
    o_status : Out(Status)
        The core's status.
    i_clear : In(1)
        The core's ``i_clear`` (registered).

    The rings are instances ``in_mem`` and ``out_mem`` of :data:`RING_MODULE`
    (``sim/rtl/models/amtpu_ring.v``, ``host_width`` bits a beat, no initial contents); the
    host reaches their rows as ``in_mem.mem`` and ``out_mem.mem`` through the simulator's VPI.
    """

    def __init__(self, config: TPUConfig, *, in_depth: int = DEFAULT_IN_DEPTH,
                 out_depth: int = DEFAULT_OUT_DEPTH):
        self.config = config
        self.in_depth = in_depth
        self.out_depth = out_depth
        super().__init__(self.signature_for(config, in_depth, out_depth))

    @staticmethod
    def signature_for(config: TPUConfig, in_depth: int = DEFAULT_IN_DEPTH,
                      out_depth: int = DEFAULT_OUT_DEPTH) -> wiring.Signature:
        """The bridge's signature (its ports), without building a bridge."""
        in_ptr = _check_depth("in_depth", in_depth)
        out_ptr = _check_depth("out_depth", out_depth)
        width = config.host_width
        count = unsigned(COUNT_BITS)
        return wiring.Signature({
            "clk":          In(1),
            "i_reset":      In(1),
            "i_in_wr":      In(unsigned(in_ptr)),
            "o_in_rd":      Out(unsigned(in_ptr)),
            "i_in_drop":    In(1),
            "i_in_more":    In(1),
            "i_load":       In(1),
            "i_load_addr":  In(unsigned(in_ptr - 1)),
            "i_load_data":  In(unsigned(width)),
            "o_out_wr":     Out(count),
            "i_out_rd":     In(count),
            "i_out_target": In(count),
            "i_out_addr":   In(unsigned(out_ptr - 1)),
            "o_out_data":   Out(unsigned(width)),
            "o_event":      Out(1),
            "o_status":     Out(Status),
            "i_clear":      In(1),
            "o_stall_cycles":   Out(data.ArrayLayout(unsigned(COVERAGE_BITS),
                                                     len(HAZARD_RULES))),
            "o_overlap_cycles": Out(data.ArrayLayout(unsigned(COVERAGE_BITS), len(OVERLAPS))),
        })

    def elaborate(self, platform):
        m = Module()
        # `host`: the registered inputs, never reset; `sync`: the core and the rings, reset
        # by the registered i_reset. Both run on `clk`.
        m.domains.sync = ClockDomain()
        m.domains.host = ClockDomain(reset_less=True)
        reset = Signal()
        m.d.comb += [
            ClockSignal("sync").eq(self.clk),
            ClockSignal("host").eq(self.clk),
            ResetSignal("sync").eq(reset),
        ]
        inputs = {}
        for name in ("i_reset", "i_in_wr", "i_in_drop", "i_in_more", "i_out_rd",
                     "i_out_target", "i_clear"):
            port = getattr(self, name)
            inputs[name] = Signal.like(port, name=f"{name}_r")
            m.d.host += inputs[name].eq(port)
        m.d.comb += reset.eq(inputs["i_reset"])
        in_wr, drop = inputs["i_in_wr"], inputs["i_in_drop"]

        m.submodules.core = core = Core(self.config)
        in_bits = len(self.i_load_addr)
        out_bits = len(self.i_out_addr)
        width = self.config.host_width

        # Input ring. A registered read fetches the beat at the next read position at each
        # edge; `fetched` says that position held a written beat at that edge, so a beat the
        # host writes while the ring is empty is never presented stale (the read is not
        # transparent: it sees what VPI wrote before the edge).
        load = _RingPort(in_bits, width)
        fetch = _RingPort(in_bits, width)
        m.submodules.in_mem = _ring(load, fetch, self.clk)
        rd = Signal.like(self.o_in_rd)
        rd_next = Signal.like(rd)
        fetched = Signal()
        take = Signal()
        m.d.comb += [
            core.i_host.valid.eq(fetched & ~drop),
            core.i_host.payload.eq(fetch.data),
            take.eq(core.i_host.valid & core.i_host.ready),
            rd_next.eq(rd + take),
            fetch.addr.eq(rd_next[:in_bits]),
            self.o_in_rd.eq(rd),
            load.en.eq(self.i_load),
            load.addr.eq(self.i_load_addr),
            load.data.eq(self.i_load_data),
        ]
        with m.If(drop):
            m.d.comb += rd_next.eq(in_wr)
        m.d.sync += [rd.eq(rd_next), fetched.eq(rd_next != in_wr)]

        # Output ring.
        store = _RingPort(out_bits, width)
        peek = _RingPort(out_bits, width)
        m.submodules.out_mem = _ring(store, peek, self.clk)
        wr = Signal.like(self.o_out_wr)
        unread = Signal.like(wr)
        m.d.comb += [
            unread.eq(wr - inputs["i_out_rd"]),
            core.o_host.ready.eq(unread < self.out_depth),
            store.en.eq(core.o_host.valid & core.o_host.ready),
            store.addr.eq(wr[:out_bits]),
            store.data.eq(core.o_host.payload),
            peek.addr.eq(self.i_out_addr),
            self.o_out_data.eq(peek.data),
            self.o_out_wr.eq(wr),
        ]
        with m.If(store.en):
            m.d.sync += wr.eq(wr + 1)

        # The host's wake-up call.
        past_target = Signal.like(wr)
        filled = Signal.like(rd)
        m.d.comb += [
            past_target.eq(wr - inputs["i_out_target"]),
            filled.eq(in_wr - rd),
            self.o_event.eq(~past_target[-1] | core.o_status.error |
                            (inputs["i_in_more"] & (filled <= self.in_depth // 2))),
            self.o_status.eq(core.o_status),
            core.i_clear.eq(inputs["i_clear"]),
        ]

        # Coverage: cycles the core stalled on each hazard rule, cycles each pair of engines
        # worked at once (saturating counters, cleared by the reset).
        top = (1 << COVERAGE_BITS) - 1
        busy = dict(zip(ACTIVITY, core.o_activity.busy, strict=True))
        events = ([core.o_activity.stall_rules[i] for i in range(len(HAZARD_RULES))] +
                  [busy[x] & busy[y] for x, y in OVERLAPS])
        counters = ([self.o_stall_cycles[i] for i in range(len(HAZARD_RULES))] +
                    [self.o_overlap_cycles[i] for i in range(len(OVERLAPS))])
        for event, counter in zip(events, counters, strict=True):
            count = Signal(COVERAGE_BITS)
            with m.If(event & (count != top)):
                m.d.sync += count.eq(count + 1)
            m.d.comb += counter.eq(count)
        return m
