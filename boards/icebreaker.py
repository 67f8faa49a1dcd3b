"""iCEBreaker (iCE40UP5K-SG48): the whole core behind a UART, as a bitstream.

``python -m boards.icebreaker`` (``make bitstream BOARD=icebreaker``, the same as ``python -m
boards build --target board --board icebreaker``) builds
``build/boards/icebreaker/top.bin`` and prints the report (resources, clock asked for,
nextpnr's Fmax, peak GOPS). Program it with ``iceprog build/boards/icebreaker/top.bin``; the
host reaches the core through the FT2232H's second interface (``/dev/ttyUSB1`` on Linux):
``amtpu demo --transport serial --port /dev/ttyUSB1 --config <the board's config>``.

Top level: the 12 MHz oscillator through the UP5K's one PLL (``SB_PLL40_PAD``) to the core
clock; the core held in reset until the PLL locks and while button 1 (``button`` 0, the user
button) is pressed; :class:`hdl.link.board_core.BoardCore` (UART, host link, core) on the FTDI
UART pins; the green LED lit while the core works, the red one while it is stopped on an
error.
"""

from __future__ import annotations

import sys

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards.icebreaker import ICEBreakerPlatform

from boards.build import Board
from boards.clocks import pll_ice40, uart_divisor
from hdl.config import TPUConfig

__all__ = ["ICEBreakerTop", "BOARD", "BOARD_CONFIG", "CLOCK_MHZ", "main"]

#: The configuration that fits the UP5K (5,280 logic cells, 8 SB_MAC16, 30 EBR): a 4x4 array
#: of int8 products, two to an SB_MAC16 (see :data:`hdl.presets.PRESETS`).
BOARD_CONFIG = "icebreaker"
CLOCK_MHZ = 24.0
BAUD = 3_000_000        # the FT2232H's UART takes 3 Mbaud reliably
MAX_BEATS = 8           # host-link frame buffer: beats per DATA frame
SYNTH_OPTS = "-dsp"     # synth_ice40 maps multipliers to SB_MAC16 only when asked
#: nextpnr's placer weighs timing three times its default: a higher Fmax and a shorter place
#: and route on this design (figures in docs/timing-closure.md).
NEXTPNR_OPTS = "--placer-heap-timingweight 30"


class ICEBreakerTop(Elaboratable):
    """The iCEBreaker's top level around :class:`hdl.link.board_core.BoardCore`.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration.
    clock_mhz : float
        Core clock asked of the PLL (the closest the PLL reaches is used).
    baud : int
        UART baud rate.
    max_beats : int
        Beats per DATA frame the host link buffers.
    """

    def __init__(self, config: TPUConfig, *, clock_mhz: float = CLOCK_MHZ, baud: int = BAUD,
                 max_beats: int = MAX_BEATS):
        self.config = config
        self.pll = pll_ice40(12.0, clock_mhz)
        self.clock_hz = self.pll["f_out_hz"]
        self.baud = baud
        self.divisor = uart_divisor(self.clock_hz, baud)
        self.max_beats = max_beats

    def elaborate(self, platform):
        from hdl.link.board_core import BoardCore

        m = Module()
        clk12 = platform.request("clk12", dir="-")
        m.domains.sync = cd_sync = ClockDomain("sync")
        locked = Signal()
        clk = cd_sync.clk
        m.submodules.pll = Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH="SIMPLE",
            p_DIVR=self.pll["DIVR"], p_DIVF=self.pll["DIVF"], p_DIVQ=self.pll["DIVQ"],
            p_FILTER_RANGE=self.pll["FILTER_RANGE"],
            i_PACKAGEPIN=clk12.io,
            i_RESETB=1, i_BYPASS=0,
            o_PLLOUTGLOBAL=clk,
            o_LOCK=locked,
        )
        platform.add_clock_constraint(clk, self.clock_hz)

        m.submodules.button = button = io.Buffer("i", platform.request("button", 0, dir="-"))
        m.submodules.reset_sync = ResetSynchronizer(~locked | button.i, domain="sync")

        uart = platform.request("uart", 0, dir={"rx": "-", "tx": "-"})
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.submodules.board_core = core = BoardCore(
            self.config, divisor=self.divisor, max_beats=self.max_beats,
            clock_hz=self.clock_hz)
        m.d.comb += [core.i_rx.eq(rx.i), tx.o.eq(core.o_tx)]
        m.submodules.led_g = led_g = io.Buffer("o", platform.request("led_g", 0, dir="-"))
        m.submodules.led_r = led_r = io.Buffer("o", platform.request("led_r", 0, dir="-"))
        m.d.comb += [led_g.o.eq(core.o_running), led_r.o.eq(core.o_error)]
        return m


def _top(config: TPUConfig, *, clock_mhz: float, baud: int, part: str | None = None):
    return ICEBreakerTop(config, clock_mhz=clock_mhz, baud=baud)


#: The board for :mod:`boards.build`: its own build, and where a harness goes (the clock on
#: the 12 MHz oscillator's pin, input and reset on the UART's RX pin and the user button,
#: output on an LED).
BOARD = Board(
    name="icebreaker", title="iCEBreaker: iCE40UP5K SG48", family="ice40",
    parts={"UP5K": ICEBreakerPlatform}, dsps={"UP5K": 8}, top=_top,
    config=BOARD_CONFIG, clock_mhz=CLOCK_MHZ, baud=BAUD,
    synth_opts=SYNTH_OPTS, nextpnr_opts=NEXTPNR_OPTS, synth="synth_ice40",
    dsp_cell="SB_MAC16",
    # An iCE40 logic cell is a LUT4 and a flip-flop: nextpnr counts no flip-flops apart.
    util={"lut": "ICESTORM_LC", "ff": None, "dsp": "ICESTORM_DSP", "bram": "ICESTORM_RAM"},
    harness_pins={"clk": ("clk12", 0), "btn": ("button", 0), "din": ("uart", 0, "rx"),
                  "dout": ("led", 0)},
    global_reset=False,     # nextpnr-ice40 promotes resets and enables to globals itself
    array_config="small", harness_mhz=36.0,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m boards build --target board --board icebreaker`` with *argv*."""
    from boards import cli

    return cli.board_main("icebreaker", argv)


if __name__ == "__main__":
    sys.exit(main())
