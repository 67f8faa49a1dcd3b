"""The platform-independent top of a board build: a UART, the host link and the core."""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from .config import TPUConfig
from .core import Core
from .host_link import HostLink
from .uart import UARTReceiver, UARTTransmitter

__all__ = ["BoardCore", "RUNNING_HOLD_S", "running_epoch_bits"]

#: How long ``o_running`` stays lit at least after the core last took or sent a beat, in
#: seconds (less than four times that).
RUNNING_HOLD_S = 0.05


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
        The core's configuration.
    divisor : int
        Clock cycles per UART bit (clock / baud), at least 2.
    max_beats : int
        Beats a DATA frame may carry (the link's frame buffers).
    clock_hz : int
        The clock, reported in INFO_REPLY and used for the LED's hold time.
    register_link : bool
        Register the paths between the link and the core, for fast clocks (the ULX3S's):
        the core's beats reach the link through a one-entry
        :class:`~amaranth.lib.fifo.SyncFIFOBuffered` (reset with the core), so that no path
        runs from the unified buffer's block RAM output through the link's frame logic; and
        the link's core reset is registered before it fans out to the whole core, the link
        taking no beat in that cycle. A beat every other cycle at most, which the UART is far
        below; ``host_width`` flip-flops more.

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
                 register_link: bool = False):
        self.config = config
        self.register_link = register_link
        self.divisor = divisor
        self.max_beats = max_beats
        self.clock_hz = clock_hz
        # Built here so that bad arguments fail at construction, not at elaboration.
        self._rx = UARTReceiver(divisor=divisor)
        self._tx = UARTTransmitter(divisor=divisor)
        self._link = HostLink(config, max_beats=max_beats, clock_hz=clock_hz)
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
        else:
            core_reset = Signal()
            m.d.sync += core_reset.eq(link.o_core_reset)
            m.submodules.core = ResetInserter(core_reset)(core)
            slot = fifo.SyncFIFOBuffered(width=self.config.host_width, depth=1)
            m.submodules.beat_register = ResetInserter(core_reset)(slot)
            # In the cycle the registered reset reaches the core, the slot still shows a beat
            # of the core being reset: the link must not start a BEAT frame with it. (The
            # link cannot be idle then today: the RESET's ACK, or a reply that filled the
            # queue and dropped it, is being sent; the mask keeps that from mattering.)
            m.d.comb += [slot.w_data.eq(core.o_host.payload), slot.w_en.eq(core.o_host.valid),
                         core.o_host.ready.eq(slot.w_rdy),
                         link.i_host.payload.eq(slot.r_data),
                         link.i_host.valid.eq(slot.r_rdy & ~core_reset),
                         slot.r_en.eq(link.i_host.ready)]

        m.d.comb += [rx.i_rx.eq(self.i_rx), self.o_tx.eq(tx.o_tx)]
        wiring.connect(m, rx.o_data, link.i_rx)
        wiring.connect(m, link.o_tx, tx.i_data)
        wiring.connect(m, link.o_host, core.i_host)
        m.d.comb += [
            link.i_status.eq(core.o_status),
            core.i_clear.eq(link.o_clear),
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
