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
from boards.build import BuildReport, prepare
from boards.clocks import pll_ecp5, pll_ice40, uart_divisor
from boards.icebreaker import ICEBreakerTop
from boards.nextpnr import PnrReport, critical_path, format_critical_path
from boards.tools import BuildError
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
    top = ULX3STop(get_config("tiny"), workdir=Path("build/boards/test-pll"))
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
    pnr = PnrReport.read(path)
    assert pnr.achieved_mhz == 31.25 and pnr.resources["ICESTORM_LC"] == (4100, 5280)
    assert pnr.constraint_mhz == 24.0 and pnr.met and pnr.critical_path is None
    report = BuildReport(board="icebreaker", config="2x2", rows=2, cols=2, clock_hz=24_000_000,
                         fmax_hz=pnr.achieved_mhz * 1e6, resources=pnr.resources,
                         bitstream="top.bin", seconds=1.0, baud=3_000_000)
    assert report.timing_met and report.peak_gops == pytest.approx(0.192)
    assert "ICESTORM_LC" in report.table() and "met" in report.table()
    slow = BuildReport(**{**report.__dict__, "fmax_hz": 20e6})
    assert not slow.timing_met and "NOT MET" in slow.table()
    path.write_text(json.dumps({"fmax": {}, "utilization": {}}))
    with pytest.raises(BuildError, match="reported no clock"):
        PnrReport.read(path)
    with pytest.raises(BuildError, match="nextpnr wrote no report"):
        PnrReport.read(tmp_path / "missing.json")


def _step(kind: str, src: str, dst: str, delay: float, net: str | None = None) -> dict:
    (fc, _, fp), (tc, _, tp) = src.rpartition("."), dst.rpartition(".")
    step = {"type": kind, "from": {"cell": fc, "port": fp}, "to": {"cell": tc, "port": tp},
            "delay": delay}
    return {**step, "net": net} if net else step


#: A critical path as nextpnr-ecp5's ``--report`` writes one, after one from an input pin.
CRITICAL = {"fmax": {"clk": {"achieved": 120.0, "constraint": 100.0}}, "critical_paths": [
    {"from": "<async>", "to": "clk", "path": [_step("routing", "pin.O", "a.D", 9.0)]},
    {"from": "clk", "to": "clk", "path": [
        _step("clk-to-q", "harness.array.w.CLK", "harness.array.w.Q", 0.5),
        _step("routing", "harness.array.w.Q", "c0.A0", 1.5, net="w_q"),
        _step("logic", "c0.A0", "c0.FCO", 0.4),
        _step("logic", "c1.FCI", "c1.FCO", 0.1),
        _step("logic", "c2.FCI", "c2.FCO", 0.1),
        _step("routing", "c2.FCO", "harness.array.p.DI", 0.2, net="sum"),
        _step("setup", "harness.array.p.DI", "harness.array.p.CLK", 0.1)]}]}


def test_critical_path_from_report():
    """The clock-to-clock path (not the one from the pin): delays split into logic and
    routing, and a carry chain printed as one line."""
    path = critical_path(CRITICAL)
    assert (path["total_ns"], path["logic_ns"], path["routing_ns"], path["logic_levels"]) == \
        (2.9, 1.2, 1.7, 3)
    assert path["longest_route"] == {"net": "w_q", "delay_ns": 1.5}
    lines = format_critical_path(path)
    assert lines[0] == ("critical path (nextpnr): 2.90 ns (1.20 logic, 1.70 routing, "
                        "3 logic levels)")
    assert "  carry     0.20 ns  2 carry cells after c1.FCI" in lines
    assert "  clk-to-q  0.50 ns  array.w.CLK -> Q" in lines
    assert PnrReport.parse(CRITICAL).critical_path == path


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


def test_ice40_carry_chain_is_one_line():
    path = critical_path({"critical_paths": [{"from": "clk", "to": "clk", "path": [
        _step("clk-to-q", "q.CLK", "q.O", 1.0),
        _step("logic", "a.I1", "a.COUT", 0.7),
        _step("logic", "b.CIN", "b.COUT", 0.3),
        _step("logic", "c.CIN", "c.COUT", 0.3),
        _step("setup", "d.I3", "d.I3", 0.8)]}]})
    assert "  carry     0.60 ns  2 carry cells after b.CIN" in format_critical_path(path)


def test_harness_figures_as_text():
    """One run: its achieved Fmax against the clock asked; a search: the highest pass."""
    from boards import cli
    from boards.build import format_harness

    run = {"constraint_mhz": 36, "achieved_mhz": 33.89, "passed": False, "wall_s": 70}
    result = {"block": "array", "config_tag": "4x4-lut8", "pes": 16, "part": "UP5K", "seed": 1,
              "config": {"rows": 4, "cols": 4, "lut_multipliers": 8, "multiplier": "infer"},
              "runs": [run], "fmax": None, "best_achieved_mhz": 33.89, "stop_reason": "single",
              "utilization": {"ICESTORM_LC": {"used": 2651, "available": 5280}},
              "dsp_check": {"cell": "SB_MAC16", "mapped": 8, "expected": 8, "ok": True},
              "json": "a.json", "work_dir": "w", "errors": []}
    text = format_harness(result, cli.board("icebreaker"))
    assert "Fmax      33.89 MHz against 36 MHz asked: NOT MET" in text, text
    assert "LUT4      2,651 / 5,280 (50.2%)  (ICESTORM_LC)" in text
    assert "DSP check 8 SB_MAC16 mapped, 8 expected: OK" in text
    passed = {**run, "constraint_mhz": 32.8, "achieved_mhz": 33.1, "passed": True}
    result.update(runs=[run, passed], fmax={"achieved_mhz": 33.1, "constraint_mhz": 32.8},
                  best_achieved_mhz=33.89)
    text = format_harness(result, cli.board("icebreaker"))
    assert ("Fmax      33.10 MHz (constraint 32.8 MHz met); best achieved in any run "
            "33.89 MHz") in text, text
