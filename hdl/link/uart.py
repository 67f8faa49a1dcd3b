"""An 8N1 UART on :mod:`amaranth.lib.stream`: a receiver and a transmitter.

Both take ``divisor``, the clock cycles per bit (a 12 MHz clock at 3 Mbaud: 4). Bytes go
least significant bit first, framed by a low start bit and a high stop bit; the line idles
high.
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UARTReceiver", "UARTTransmitter", "check_divisor"]


def check_divisor(divisor: int) -> int:
    """``divisor`` if it is a supported number of clock cycles per bit, else ``ValueError``."""
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor < 2:
        raise ValueError(f"UART divisor {divisor!r} is not supported; allowed: an int of at "
                         f"least 2 (clock cycles per bit)")
    return divisor


class UARTReceiver(wiring.Component):
    """8N1 receiver.

    The line passes a two-flop synchroniser. A falling edge starts a byte; the start bit is
    sampled ``divisor // 2`` cycles later and must still be low (else the edge was a glitch
    and is ignored); each data bit and the stop bit are sampled ``divisor`` cycles after the
    previous sample, so every sample falls in the middle of its bit. A byte with a high stop
    bit goes out on ``o_data``; after a low stop bit (a framing error, or a break) the byte
    is dropped, ``o_error`` pulses, and the receiver waits for the line to go high before it
    looks for the next start bit.

    A UART cannot be held off: ``o_data`` keeps a byte until it is taken, and a byte that
    completes while the previous one is still waiting is dropped with an ``o_error`` pulse
    (an overrun). A consumer that keeps ``o_data.ready`` high never sees one.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 2.

    Members
    -------
    i_rx : In(1, init=1)
        The serial line (asynchronous to the clock).
    o_data : Out(stream.Signature(8))
        Received bytes.
    o_error : Out(1)
        One-cycle pulse: a framing error or an overrun; the byte was dropped.
    """

    def __init__(self, *, divisor: int):
        self.divisor = check_divisor(divisor)
        super().__init__({
            "i_rx":    In(1, init=1),
            "o_data":  Out(stream.Signature(8)),
            "o_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.i_rx, rx, init=1)

        timer = Signal(range(self.divisor))
        bits = Signal(range(8))
        shreg = Signal(8)
        tick = timer == 0
        with m.If(~tick):
            m.d.sync += timer.eq(timer - 1)

        with m.If(self.o_data.valid & self.o_data.ready):
            m.d.sync += self.o_data.valid.eq(0)

        with m.FSM(name="uart_rx"):
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(tick):
                    with m.If(rx):
                        m.next = "IDLE"          # a glitch, not a start bit
                    with m.Else():
                        m.d.sync += [timer.eq(self.divisor - 1), bits.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(tick):
                    m.d.sync += [timer.eq(self.divisor - 1), shreg.eq(Cat(shreg[1:], rx)),
                                 bits.eq(bits + 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(tick):
                    with m.If(~rx):
                        m.d.comb += self.o_error.eq(1)
                        m.next = "BREAK"
                    with m.Elif(self.o_data.valid & ~self.o_data.ready):
                        m.d.comb += self.o_error.eq(1)     # overrun
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [self.o_data.payload.eq(shreg), self.o_data.valid.eq(1)]
                        m.next = "IDLE"
            with m.State("BREAK"):
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UARTTransmitter(wiring.Component):
    """8N1 transmitter.

    Takes a byte from ``i_data`` when the line is idle or as the previous stop bit ends, so
    back-to-back bytes leave with no idle time between them: ``10 * divisor`` cycles a
    byte. ``o_tx`` comes straight from a flip-flop.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 2.

    Members
    -------
    i_data : In(stream.Signature(8))
        Bytes to send.
    o_tx : Out(1, init=1)
        The serial line.
    """

    def __init__(self, *, divisor: int):
        self.divisor = check_divisor(divisor)
        super().__init__({
            "i_data": In(stream.Signature(8)),
            "o_tx":   Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        left = Signal(range(11))               # bits still to finish, the current one included
        shreg = Signal(10, init=(1 << 10) - 1)  # the next bits, the one on the line at bit 0
        tick = timer == 0
        m.d.comb += self.o_tx.eq(shreg[0])
        with m.If(~tick):
            m.d.sync += timer.eq(timer - 1)

        m.d.comb += self.i_data.ready.eq((left == 0) | ((left == 1) & tick))
        with m.If(self.i_data.valid & self.i_data.ready):
            m.d.sync += [shreg.eq(Cat(Const(0, 1), self.i_data.payload, Const(1, 1))),
                         timer.eq(self.divisor - 1), left.eq(10)]
        with m.Elif((left != 0) & tick):
            m.d.sync += [shreg.eq(Cat(shreg[1:], Const(1, 1))), timer.eq(self.divisor - 1),
                         left.eq(left - 1)]
        return m
