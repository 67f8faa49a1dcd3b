"""The platform-independent top of a board build: a UART, the host link and the core."""

from collections.abc import Callable

from amaranth.hdl import (
    ClockDomain,
    ClockSignal,
    DomainRenamer,
    Elaboratable,
    Module,
    ResetInserter,
    ResetSignal,
    Signal,
    Value,
)
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.core import Core
from hdl.link.host_link import HostLink
from hdl.link.uart import UARTReceiver, UARTTransmitter

__all__ = ["BeatSlot", "BoardCore", "RUNNING_HOLD_S", "running_epoch_bits"]

#: How long ``o_running`` stays lit at least after the core last took or sent a beat, in
#: seconds (less than four times that).
RUNNING_HOLD_S = 0.05


class BeatSlot(Elaboratable):
    """A one-beat register between the link and the core, with :class:`~amaranth.lib.fifo.
    SyncFIFOBuffered`'s ports and its ``depth=1`` behaviour (a beat every other cycle at
    most): ``w_rdy`` while empty, ``r_rdy`` while full.

    The beat register loads whenever the slot is empty, whatever ``w_en``: only the level
    follows the handshake. The FIFO's register loads on ``w_en & w_rdy``, so the writer's
    ``valid``, which comes from the link's delivery logic, would drive the enable of every
    bit of the beat. What the slot shows while empty is never read (``r_rdy`` is low).
    """

    def __init__(self, width: int):
        self.width = width
        self.w_data = Signal(width)
        self.w_en = Signal()
        self.w_rdy = Signal()
        self.r_data = Signal(width)
        self.r_en = Signal()
        self.r_rdy = Signal()

    def elaborate(self, platform):
        m = Module()
        full = Signal()
        m.d.comb += [self.w_rdy.eq(~full), self.r_rdy.eq(full)]
        with m.If(~full):
            m.d.sync += [self.r_data.eq(self.w_data), full.eq(self.w_en)]
        with m.Elif(self.r_en):
            m.d.sync += full.eq(0)
        return m


def running_epoch_bits(clock_hz: int) -> int:
    """log2 of the cycles of one epoch of ``o_running``'s hold: the smallest power of two
    that lasts :data:`RUNNING_HOLD_S`."""
    return max(1, (max(1, int(clock_hz * RUNNING_HOLD_S)) - 1).bit_length())


class BoardCore(wiring.Component):
    """The core behind its host link on a UART (8N1, ``divisor`` clock cycles a bit).

    ::

        i_rx -> UARTReceiver -> HostLink -> Core.i_host
        o_tx <- UARTTransmitter <- HostLink <- Core.o_host
                                   HostLink <-> Core.o_status, i_clear, reset

    The core sits under a :class:`~amaranth.hdl.ResetInserter` driven by the link's
    ``o_core_reset`` (a RESET frame); the link itself is reset only with the clock domain.
    Board files (:mod:`boards`) add the clock, the reset and the pins.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration. With ``pipeline="fast"`` the paths between the link and
        the core are registered (below).
    divisor : int
        Clock cycles per UART bit (clock / baud), at least 2.
    max_beats : int
        Beats a DATA frame may carry (the link's frame buffers).
    clock_hz : int
        The clock, reported in INFO_REPLY and used for the LED's hold time.
    reset_buffer : callable, optional
        With the fast pipeline: ``reset_buffer(m, signal)`` returns the signal that resets
        the core, driven from ``signal`` (the ULX3S top puts it on a ``DCCA`` global, since
        nextpnr-ecp5 promotes only clocks and the core has thousands of flip-flops).

    With the fast pipeline the paths between the link and the core are registered, for fast
    clocks: the beats each way pass through a one-entry :class:`BeatSlot` (reset with the
    core), so that no path runs from the unified buffer's block RAM output through the
    link's frame logic, nor from the link's frame buffer into the core's dispatch; the link's
    ``o_clear`` reaches the core a cycle later, and the core's status the link a cycle later;
    the link's frame checks are registered (``HostLink(registered_checks=True)``); and the
    core (with both slots) runs in a clock domain of its own on the same clock, whose reset
    is the link's core reset or the domain's own, registered twice (``reset_buffer`` may put
    it on a global network), the link taking no beat in the two cycles after the RESET. A
    beat every other cycle at most each way, which the UART is far below; ``2 * host_width``
    flip-flops more.

    Members
    -------
    i_rx : In(1, init=1)
        UART line from the host.
    o_tx : Out(1, init=1)
        UART line to the host.
    o_running : Out(1)
        For an LED: high while the core takes or sends beats, and after the last one until
        the end of the epoch after its own (epochs of ``2**running_epoch_bits(clock_hz)``
        cycles of the link's cycle counter: :data:`RUNNING_HOLD_S` to four times it), so a
        short burst is visible.
    o_error : Out(1)
        For an LED: the core's error flag (``o_status.error``), until CLEAR, the
        resynchronisation word or RESET.
    """

    def __init__(self, config: TPUConfig, *, divisor: int, max_beats: int, clock_hz: int,
                 reset_buffer: Callable[[Module, Value], Value] | None = None):
        self.config = config
        self.register_link = config.pipeline == "fast"
        self.reset_buffer = reset_buffer
        self.divisor = divisor
        self.max_beats = max_beats
        self.clock_hz = clock_hz
        # Built here so that bad arguments fail at construction, not at elaboration.
        self._rx = UARTReceiver(divisor=divisor)
        self._tx = UARTTransmitter(divisor=divisor)
        self._link = HostLink(config, max_beats=max_beats, clock_hz=clock_hz,
                              registered_checks=self.register_link)
        super().__init__({
            "i_rx":      In(1, init=1),
            "o_tx":      Out(1, init=1),
            "o_running": Out(1),
            "o_error":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = rx = self._rx
        m.submodules.uart_tx = tx = self._tx
        m.submodules.link = link = self._link
        core = Core(self.config)
        if not self.register_link:
            m.submodules.core = ResetInserter(link.o_core_reset)(core)
            wiring.connect(m, core.o_host, link.i_host)
            wiring.connect(m, link.o_host, core.i_host)
            m.d.comb += core.i_clear.eq(link.o_clear)
        else:
            # The core's domain: the same clock, reset by a register (the link's core reset
            # or the domain's own, registered twice) that drives nothing but the reset
            # network (with the masks below on the same register, the placer pulls it
            # towards the link, far from the global buffer). `core_reset` is high from the
            # cycle before the core's reset to its last cycle.
            m.domains.core = cd_core = ClockDomain("core", local=True)
            reset_1 = Signal(init=1, reset_less=True)
            reset_net = Signal(init=1, reset_less=True)
            # (`core_reset`, the masks', is reset_1 | reset_net in a register of its own: from
            # reset_net, by the global buffer, the route back to the link is long.)
            core_reset = Signal(init=1, reset_less=True)
            restart = link.o_core_reset | ResetSignal("sync")
            m.d.sync += [reset_1.eq(restart), reset_net.eq(reset_1),
                         core_reset.eq(restart | reset_1)]
            m.d.comb += [cd_core.clk.eq(ClockSignal("sync")),
                         cd_core.rst.eq(self.reset_buffer(m, reset_net) if self.reset_buffer
                                        else reset_net)]
            to_core = DomainRenamer("core")
            m.submodules.core = to_core(core)
            out_slot = BeatSlot(self.config.host_width)
            in_slot = BeatSlot(self.config.host_width)
            m.submodules.beat_register = to_core(out_slot)
            m.submodules.in_beat_register = to_core(in_slot)
            clear = Signal()
            # In the cycle the registered reset reaches the core, the slots still hold beats
            # from before it: the link must neither start a BEAT frame with the core's nor
            # hand one over that the reset would lose. (The link cannot be idle then today:
            # the RESET's ACK, or a reply that filled the queue and dropped it, is being sent;
            # the mask keeps that from mattering.)
            m.d.sync += clear.eq(link.o_clear)
            m.d.comb += [out_slot.w_data.eq(core.o_host.payload),
                         out_slot.w_en.eq(core.o_host.valid),
                         core.o_host.ready.eq(out_slot.w_rdy),
                         link.i_host.payload.eq(out_slot.r_data),
                         link.i_host.valid.eq(out_slot.r_rdy & ~core_reset),
                         out_slot.r_en.eq(link.i_host.ready),
                         in_slot.w_data.eq(link.o_host.payload),
                         in_slot.w_en.eq(link.o_host.valid & ~core_reset),
                         link.o_host.ready.eq(in_slot.w_rdy & ~core_reset),
                         core.i_host.payload.eq(in_slot.r_data),
                         core.i_host.valid.eq(in_slot.r_rdy),
                         in_slot.r_en.eq(core.i_host.ready),
                         core.i_clear.eq(clear)]

        m.d.comb += [rx.i_rx.eq(self.i_rx), self.o_tx.eq(tx.o_tx)]
        wiring.connect(m, rx.o_data, link.i_rx)
        wiring.connect(m, link.o_tx, tx.i_data)
        if self.register_link:
            status = Signal.like(core.o_status)
            m.d.sync += status.eq(core.o_status)
            m.d.comb += link.i_status.eq(status)
        else:
            m.d.comb += link.i_status.eq(core.o_status)
        m.d.comb += [
            self.o_error.eq(core.o_status.error),
        ]

        # Two flags, this epoch's and the last one's, instead of a counter of its own: the
        # epochs are bits of the link's cycle counter.
        bit = running_epoch_bits(self.clock_hz)
        moved = Signal()        # (registered: the core's ready comes from deep in it)
        m.d.sync += moved.eq((core.i_host.valid & core.i_host.ready) |
                             (core.o_host.valid & core.o_host.ready))
        epoch = Signal()
        now = Signal()          # a beat moved in this epoch
        before = Signal()       # ... in the one before
        m.d.sync += epoch.eq(link.o_cycles[bit])
        with m.If(epoch != link.o_cycles[bit]):
            m.d.sync += [before.eq(now | moved), now.eq(0)]
        with m.Elif(moved):
            m.d.sync += now.eq(1)
        m.d.sync += self.o_running.eq(moved | now | before)     # (registered: a pin)
        return m
