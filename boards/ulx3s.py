"""ULX3S (ECP5 LFE5U-85F/45F/25F/12F, CABGA381): the whole core behind a UART, as a bitstream.

``python -m boards.ulx3s`` (``make bitstream BOARD=ulx3s``, the same as ``python -m boards
build --target board --board ulx3s``) builds
``build/boards/ulx3s-<part>/top.bit`` and prints the report (resources, clock asked for,
nextpnr's Fmax, peak GOPS). Program it with ``openFPGALoader -b ulx3s top.bit``; the host
reaches the core through the FT231X on the US1 port (``/dev/ttyUSB0`` on Linux):
``amtpu demo --transport serial --port /dev/ttyUSB0 --config <the board's config>``.

Top level: the 25 MHz oscillator through an ``EHXPLLL`` to the core clock; the core held in
reset until the PLL locks and while the FIRE1 button is pressed; :class:`hdl.link.board_core.
BoardCore` (UART, host link, core) on the FT231X UART pins; LED 0 lit while the core works,
LED 7 while it is stopped on an error, LED 1 when the PLL is locked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards import ulx3s

from boards.build import BUILD_ROOT, Board
from boards.clocks import pll_ecp5, uart_divisor
from hdl.config import TPUConfig

__all__ = ["ULX3STop", "PARTS", "BOARD", "BOARD_CONFIG", "CLOCK_MHZ", "main"]

PARTS = {
    "85F": ulx3s.ULX3S_85F_Platform,
    "45F": ulx3s.ULX3S_45F_Platform,
    "25F": ulx3s.ULX3S_25F_Platform,
    "12F": ulx3s.ULX3S_12F_Platform,
}
#: MULT18X18D blocks of each part (Lattice's ECP5 family data sheet).
DSPS = {"85F": 156, "45F": 72, "25F": 28, "12F": 28}
# The `ulx3s` preset: the 8x8 array and the activation unit's products on registered
# MULT18X18D, the front end pipelined, the block RAMs read through their output registers;
# this top registers every path between the link and the core and puts the core's reset on a
# global network (BoardCore with the fast pipeline, reset_buffer). The clocks it met and the paths
# that limit it are logged in docs/timing-closure.md; `--paths 40` lists them for a build.
BOARD_CONFIG = "ulx3s"
# nextpnr's placer weighs timing three times its default, for a higher Fmax. --tmg-ripup is
# left out: while timing fails it adds up to 50 rounds of rerouting, minutes each, so a build
# asked too much runs for hours.
NEXTPNR_OPTS = "--placer-heap-timingweight 30"
CLOCK_MHZ = 135.0
BAUD = 3_000_000      # the FT231X's highest standard rate
MAX_BEATS = 16


def global_reset(m: Module, reset: Signal) -> Signal:
    """*reset* on a global network through a ``DCCA``: nextpnr-ecp5 promotes only clocks, and
    the core's reset reaches thousands of flip-flops, too far for a net routed in the
    fabric at this clock."""
    buffered = Signal()
    m.submodules.core_reset_dcc = Instance("DCCA", i_CLKI=reset, i_CE=1, o_CLKO=buffered)
    return buffered


class ULX3STop(Elaboratable):
    """The ULX3S's top level around :class:`hdl.link.board_core.BoardCore`.

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
                 max_beats: int = MAX_BEATS, workdir: Path = BUILD_ROOT / "ulx3s-pll"):
        self.config = config
        self.pll = pll_ecp5(25.0, clock_mhz, workdir)
        self.clock_hz = self.pll["f_out_hz"]
        self.baud = baud
        self.divisor = uart_divisor(self.clock_hz, baud)
        self.max_beats = max_beats

    def elaborate(self, platform):
        from hdl.link.board_core import BoardCore

        m = Module()
        m.submodules.clk25 = clk25 = io.Buffer("i", platform.request("clk25", 0, dir="-"))
        m.domains.sync = cd_sync = ClockDomain("sync")
        locked = Signal()
        clkop = cd_sync.clk
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI="25",
            a_FREQUENCY_PIN_CLKOP=f"{self.clock_hz / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
            p_CLKI_DIV=self.pll["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=self.pll["CLKOP_DIV"], p_CLKOP_CPHASE=self.pll["CLKOP_CPHASE"],
            p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=self.pll["CLKFB_DIV"],
            i_RST=0, i_STDBY=0, i_CLKI=clk25.i, i_CLKFB=clkop,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clkop, o_LOCK=locked,
        )
        # nextpnr-ecp5 does not apply this ("net ... does not exist in design": the net is
        # named otherwise by then); it derives CLKOP's constraint from clk25's through the
        # PLL's dividers, which gives the same figure.
        platform.add_clock_constraint(clkop, self.clock_hz)

        m.submodules.fire = fire = io.Buffer("i", platform.request("button_fire", 0, dir="-"))
        m.submodules.reset_sync = ResetSynchronizer(~locked | fire.i, domain="sync")

        uart = platform.request("uart", 0, dir={"rx": "-", "tx": "-", "rts": "-", "dtr": "-"})
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.submodules.board_core = core = BoardCore(
            self.config, divisor=self.divisor, max_beats=self.max_beats,
            clock_hz=self.clock_hz, reset_buffer=global_reset)
        m.d.comb += [core.i_rx.eq(rx.i), tx.o.eq(core.o_tx)]
        for i, value in ((0, core.o_running), (1, locked), (7, core.o_error)):
            m.submodules[f"led{i}"] = led = io.Buffer("o", platform.request("led", i, dir="-"))
            m.d.comb += led.o.eq(value)
        return m


def _top(config: TPUConfig, *, clock_mhz: float, baud: int, part: str | None = None):
    return ULX3STop(config, clock_mhz=clock_mhz, baud=baud)


#: The board for :mod:`boards.build`: its own build, and where a harness goes (the clock on
#: the 25 MHz oscillator's pin, reset and input on two buttons, output on an LED).
BOARD = Board(
    name="ulx3s", title="ULX3S: LFE5U CABGA381, speed 6", family="ecp5",
    parts=PARTS, dsps=DSPS, top=_top, config=BOARD_CONFIG, clock_mhz=CLOCK_MHZ, baud=BAUD,
    synth_opts="", nextpnr_opts=NEXTPNR_OPTS, synth="synth_ecp5", dsp_cell="MULT18X18D",
    util={"lut": "TRELLIS_COMB", "ff": "TRELLIS_FF", "dsp": "MULT18X18D", "bram": "DP16KD"},
    harness_pins={"clk": ("clk25", 0), "btn": ("button", 0), "din": ("button", 1),
                  "dout": ("led", 0)},
    global_reset=True,      # nextpnr-ecp5 promotes only clocks to globals
    array_config="default", harness_mhz=100.0,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m boards build --target board --board ulx3s`` with *argv*."""
    from boards import cli

    return cli.board_main("ulx3s", argv)


if __name__ == "__main__":
    sys.exit(main())
