"""ULX3S (ECP5 LFE5U-85F/45F/25F/12F, CABGA381): the whole core behind a UART, as a bitstream.

``python -m boards.ulx3s`` (``make bitstream BOARD=ulx3s``) builds
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

import argparse
import sys
from pathlib import Path

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards import ulx3s

from boards.build import BUILD_ROOT, BuildError, build, pll_ecp5, uart_divisor
from hdl.config import ACTIVATION_UNITS, ConfigError, TPUConfig
from hdl.presets import PRESETS, get_config

__all__ = ["ULX3STop", "PARTS", "BOARD_CONFIG", "main"]

PARTS = {
    "85F": ulx3s.ULX3S_85F_Platform,
    "45F": ulx3s.ULX3S_45F_Platform,
    "25F": ulx3s.ULX3S_25F_Platform,
    "12F": ulx3s.ULX3S_12F_Platform,
}
# The `ulx3s` preset: the 8x8 array and the activation unit's products on registered
# MULT18X18D, the front end's dispatch pipelined, the hazard tracker's answer registered, the
# block RAMs read through their output registers; this top registers every path between the
# link and the core and puts the core's reset on a global network (BoardCore register_link,
# reset_buffer). At 135 MHz it meets timing (nextpnr's Fmax 144.40 MHz, seed 1,
# NEXTPNR_OPTS, with the PEs' second registers). Builds of this netlist and the ones just
# before it, asked / reached: 150 / 140.71, 140 / 133.60, 135 / 137.44, 140 / 139.24,
# 140 / 132.63, 150 / 140.75, 150 / 128.27 MHz; earlier netlists 125 / 130.01,
# 135 / 129.27, 115 / 125.71, 105 / 115.34 MHz. The target is 150 MHz; `--paths 40` lists
# what limits it (README).
BOARD_CONFIG = "ulx3s"
# nextpnr's placer weighs timing three times its default (102.23 MHz instead of 94.45 MHz on
# the netlist it was measured on). --tmg-ripup is left out: while timing fails it adds up to
# 50 rounds of rerouting, minutes each, so a build asked too much runs for hours.
NEXTPNR_OPTS = "--placer-heap-timingweight 30"
CLOCK_MHZ = 135.0
BAUD = 3_000_000      # the FT231X's highest standard rate
MAX_BEATS = 16


def global_reset(m: Module, reset: Signal) -> Signal:
    """*reset* on a global network through a ``DCCA``: nextpnr-ecp5 promotes only clocks, and
    the core's reset reaches thousands of flip-flops (routed in the fabric it took 8-9 ns)."""
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
        # PLL's dividers, which gives the same figure. Over-constraining (clk25 declared
        # faster, CLKOP derived at 160 or 170 MHz) gave the very placement and Fmax of the
        # 150 MHz build, 140.71 MHz: while timing fails, nextpnr's criticalities are relative.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boards.ulx3s", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=PARTS, default="85F", help="the board's ECP5")
    parser.add_argument("--config", default=BOARD_CONFIG,
                        help=f"core configuration (default {BOARD_CONFIG}; presets: "
                             f"{', '.join(PRESETS)})")
    parser.add_argument("--clock", type=float, default=CLOCK_MHZ, help="core clock, MHz")
    parser.add_argument("--baud", type=int, default=BAUD, help="UART baud rate")
    parser.add_argument("--seed", type=int, default=1,
                        help="nextpnr's placement seed (default 1, nextpnr's own); "
                             "Fmax moves by a few per cent from seed to seed")
    parser.add_argument("--rows", type=int, help="the configuration's array rows, resized")
    parser.add_argument("--cols", type=int, help="the configuration's array columns, resized")
    parser.add_argument("--lut-multipliers", type=int,
                        help="products built in LUTs instead of MULT18X18D (the part has 156)")
    parser.add_argument("--activation-unit", choices=ACTIVATION_UNITS,
                        help="the configuration's activation unit (serial: no multipliers)")
    parser.add_argument("--router", choices=("router1", "router2"), default="router1",
                        help="nextpnr's router (router2 for large arrays; default router1)")
    parser.add_argument("--paths", type=int, default=0, metavar="N",
                        help="also list the worst paths into N different registers, from "
                             "nextpnr's SDF (what a faster clock must shorten)")
    args = parser.parse_args(argv)
    config = get_config(args.config)
    changes = {field: value for field, value in (
        ("rows", args.rows), ("cols", args.cols), ("lut_multipliers", args.lut_multipliers),
        ("activation_unit", args.activation_unit)) if value is not None}
    board = f"ulx3s-{args.part.lower()}"
    if changes:
        try:
            # host_width=None: the beat widens with the rows.
            config = config.replace(**changes, host_width=None)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        board += "-" + "-".join(f"{k}{v}" for k, v in changes.items())
    top = ULX3STop(config, clock_mhz=args.clock, baud=args.baud)
    # router1 is nextpnr's default: left off, so the command is the one measured before.
    router = "" if args.router == "router1" else f" --router {args.router}"
    try:
        report = build(PARTS[args.part](), top, board=board, config=config,
                       clock_hz=top.clock_hz, baud=args.baud,
                       nextpnr_opts=f"{NEXTPNR_OPTS} --seed {args.seed}{router}",
                       paths=args.paths)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(report.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
