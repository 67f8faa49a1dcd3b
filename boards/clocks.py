"""Clocks of a build: a platform's oscillator constrained to another frequency, the PLL
settings for a core clock, and the UART divisor that clock gives."""

from __future__ import annotations

import subprocess
from pathlib import Path

from boards.tools import BuildError, tool_env, tool_path

__all__ = ["with_clock", "pll_ice40", "pll_ecp5", "uart_divisor"]


def with_clock(platform_cls: type, frequency_hz: float, *, resource: str | None = None):
    """A ``platform_cls`` whose clock resource (default: its ``default_clk``) is constrained
    to ``frequency_hz`` instead of the oscillator's frequency.

    Pins, attributes and the constraint files stay the platform's own; only the frequency in
    its ``Clock`` changes. Harness builds use it: nextpnr reports a clock's achieved Fmax
    against the constraint it was placed and routed for, and a clock constrained in the
    PCF/LPF ignores nextpnr's ``--freq``."""
    from amaranth.build import Clock, Resource

    name = resource or platform_cls.default_clk
    resources = [Resource(r.name, r.number, *r.ios, Clock(frequency_hz), r.attrs)
                 if r.name == name and r.clock is not None else r
                 for r in platform_cls.resources]
    if not any(r.name == name and r.clock is not None for r in platform_cls.resources):
        raise ValueError(f"{platform_cls.__name__} has no clock resource {name!r}")
    return type(platform_cls.__name__, (platform_cls,), {"resources": resources})()


def uart_divisor(clock_hz: int, baud: int, *, tolerance: float = 0.02) -> int:
    """Clock cycles per UART bit; raises if the baud rate is off by more than ``tolerance``."""
    if baud <= 0:
        raise ValueError(f"baud rate {baud} is not supported; allowed: a positive rate")
    divisor = round(clock_hz / baud)
    if divisor < 4:
        raise ValueError(f"{baud} baud needs at least 4 clocks per bit; {clock_hz} Hz gives "
                         f"{clock_hz / baud:.2f}: lower the baud rate or raise the clock")
    error = abs(clock_hz / divisor - baud) / baud
    if error > tolerance:
        raise ValueError(f"{baud} baud from a {clock_hz} Hz clock is off by {error:.1%} "
                         f"(divisor {divisor}); allowed: within {tolerance:.0%}")
    return divisor


def pll_ice40(f_in_mhz: float, f_out_mhz: float) -> dict:
    """``SB_PLL40_*`` parameters from ``icepll`` for the closest achievable output clock:
    ``{"DIVR", "DIVF", "DIVQ", "FILTER_RANGE", "f_out_hz"}``."""
    out = subprocess.run([tool_path("yowasp-icepll"), "-i", str(f_in_mhz), "-o",
                          str(f_out_mhz)], check=True, capture_output=True, text=True,
                         env=tool_env()).stdout
    fields = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("DIVR", "DIVF", "DIVQ", "FILTER_RANGE"):
            fields[key] = int(value.split()[0])
        elif key == "F_PLLOUT" and "achieved" in value:
            fields["f_out_hz"] = round(float(value.split()[0]) * 1e6)
    if len(fields) != 5:
        raise BuildError(f"icepll gave no parameters for {f_in_mhz} -> {f_out_mhz} MHz:\n{out}")
    return fields


def pll_ecp5(f_in_mhz: float, f_out_mhz: float, workdir: Path) -> dict:
    """``EHXPLLL`` parameters from ``ecppll`` for the closest achievable output clock:
    ``{"CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "CLKOP_CPHASE", "f_out_hz"}``."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([tool_path("yowasp-ecppll"), "-i", str(f_in_mhz), "-o",
                          str(f_out_mhz), "-f", "pll.v"], check=True, capture_output=True,
                         text=True, cwd=workdir, env=tool_env()).stdout
    text = (workdir / "pll.v").read_text()
    fields = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(".CLK") and "(" in line:
            name = line[1:line.index("(")].strip()
            value = line[line.index("(") + 1:line.rindex(")")].strip()
            if name in ("CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "CLKOP_CPHASE") and \
                    value.isdigit():
                fields[name] = int(value)
    for line in out.splitlines():
        if line.startswith("clkout0 frequency:"):
            fields["f_out_hz"] = round(float(line.split(":")[1].split()[0]) * 1e6)
    if len(fields) != 5:
        raise BuildError(f"ecppll gave no parameters for {f_in_mhz} -> {f_out_mhz} MHz:\n"
                         f"{out}{text}")
    return fields
