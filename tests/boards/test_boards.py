"""Board top levels: they elaborate for their platforms into build plans with the right pins,
clock constraints and PLL settings, and the build report reads nextpnr's figures. (Building
the bitstreams themselves is ``make bitstream``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from boards import icebreaker
from boards.build import (
    BuildError,
    BuildReport,
    _parse_report,
    pll_ecp5,
    pll_ice40,
    prepare,
    uart_divisor,
)
from boards.icebreaker import ICEBreakerTop
from boards.ulx3s import ULX3STop
from hdl.presets import get_config


def _plan_files(platform, top, **options) -> dict[str, str]:
    plan = prepare(platform, top, **options)
    return {name: (text.decode() if isinstance(text, bytes) else text)
            for name, text in plan.files.items()}


def test_uart_divisor():
    assert uart_divisor(24_000_000, 3_000_000) == 8
    assert uart_divisor(150_000_000, 3_000_000) == 50
    with pytest.raises(ValueError, match="at least 4 clocks per bit"):
        uart_divisor(6_000_000, 3_000_000)
    with pytest.raises(ValueError, match=r"off by .* allowed: within 2%"):
        uart_divisor(25_000_000, 3_000_000)       # 8.33 clocks a bit -> 8: 4.2 % off


def test_pll_parameters():
    assert pll_ice40(12, 24) == {"DIVR": 0, "DIVF": 63, "DIVQ": 5, "FILTER_RANGE": 1,
                                 "f_out_hz": 24_000_000}
    params = pll_ecp5(25, 150, Path("build/boards/test-pll"))
    assert params == {"CLKI_DIV": 1, "CLKFB_DIV": 6, "CLKOP_DIV": 4, "CLKOP_CPHASE": 2,
                      "f_out_hz": 150_000_000}


def test_icebreaker_plan():
    top = ICEBreakerTop(get_config("icebreaker"))
    assert (top.clock_hz, top.divisor) == (24_000_000, 8)
    files = _plan_files(ICEBreakerPlatform(), top, synth_opts=icebreaker.SYNTH_OPTS)
    pcf = files["top.pcf"]
    for pin in ("set_io uart_0__rx__io 6", "set_io uart_0__tx__io 9", "set_io clk12_0__io 35",
                "set_io led_r_0__io 11", "set_io led_g_0__io 37"):
        assert pin in pcf
    # The core clock (the PLL's output) is constrained, not only the 12 MHz pin.
    assert any(line.startswith("set_frequency ") and line.endswith(" 24.0")
               for line in pcf.splitlines()), pcf
    assert "SB_PLL40_PAD" in files["top.il"]
    script = files["build_top.sh"]
    assert "--report top.report.json" in script and "-dsp" in files["top.ys"]


def test_ulx3s_plan():
    top = ULX3STop(get_config("small"), workdir=Path("build/boards/test-pll"))
    assert (top.clock_hz, top.divisor) == (135_000_000, 45)
    files = _plan_files(ULX3S_85F_Platform(), top)
    lpf = files["top.lpf"]
    assert 'LOCATE COMP "uart_0__rx__io" SITE "M1"' in lpf
    assert 'LOCATE COMP "uart_0__tx__io" SITE "L4"' in lpf
    assert any(line.startswith("FREQUENCY NET") and "135000000" in line.replace(".0", "")
               for line in lpf.splitlines()), lpf
    assert "EHXPLLL" in files["top.il"]


def test_report_reads_nextpnr(tmp_path: Path):
    path = tmp_path / "top.report.json"
    path.write_text(json.dumps({
        "fmax": {"clk$7": {"achieved": 31.25, "constraint": 24.0}},
        "utilization": {"ICESTORM_LC": {"used": 4100, "available": 5280},
                        "ICESTORM_DSP": {"used": 4, "available": 8}},
    }))
    fmax, resources = _parse_report(path)
    assert fmax == 31.25e6 and resources["ICESTORM_LC"] == (4100, 5280)
    report = BuildReport(board="icebreaker", config="2x2", rows=2, cols=2, clock_hz=24_000_000,
                         fmax_hz=fmax, resources=resources, bitstream="top.bin", seconds=1.0,
                         baud=3_000_000)
    assert report.timing_met and report.peak_gops == pytest.approx(0.192)
    assert "ICESTORM_LC" in report.table() and "met" in report.table()
    slow = BuildReport(**{**report.__dict__, "fmax_hz": 20e6})
    assert not slow.timing_met and "NOT MET" in slow.table()
    path.write_text(json.dumps({"fmax": {}, "utilization": {}}))
    with pytest.raises(BuildError, match="reported no clock"):
        _parse_report(path)


def test_demo_clock_is_the_boards_clock():
    """The demo's images/s are at the clock the ULX3S build meets, and for the icebreaker
    preset at the iCEBreaker's (copies, as firmware does not import the boards)."""
    from boards import ulx3s
    from firmware import cli
    assert cli.DEFAULT_CLOCK_MHZ == ulx3s.CLOCK_MHZ
    assert cli.ICEBREAKER_CLOCK_MHZ == icebreaker.CLOCK_MHZ


def test_ulx3s_resized_config_is_checked(capsys):
    """--rows/--cols/--lut-multipliers resize the preset; a value the configuration does not
    allow is an error that says what is allowed, before anything is built."""
    from boards import ulx3s
    assert ulx3s.main(["--rows", "4", "--cols", "4", "--lut-multipliers", "17"]) == 1
    err = capsys.readouterr().err
    assert "lut_multipliers" in err and "0 to rows * cols = 16" in err, err
