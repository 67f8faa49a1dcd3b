"""What nextpnr reports (``--report``): each clock's achieved Fmax against its constraint,
the resources used and the critical path.

The worst paths into other registers, which nextpnr does not list, come from its SDF
(:mod:`boards.timing`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boards.tools import BuildError

__all__ = ["PnrReport", "clock_fmax", "clock_critical_path", "critical_path",
           "format_critical_path", "utilisation", "short_name"]


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


def critical_path(report: dict) -> dict[str, Any] | None:
    """Summary of the clock-to-clock critical path: total, logic and routing delay, logic
    levels, the longest route, and every step (``from``/``to`` as ``cell.port``)."""
    steps = clock_critical_path(report)
    if steps is None:
        return None
    hops = [{"type": step["type"],
             "from": f'{step["from"]["cell"]}.{step["from"]["port"]}',
             "to": f'{step["to"]["cell"]}.{step["to"]["port"]}',
             "net": step.get("net"), "delay_ns": round(step["delay"], 3)}
            for step in steps]
    logic = sum(s["delay"] for s in steps if s["type"] != "routing")
    routing = sum(s["delay"] for s in steps if s["type"] == "routing")
    longest = max((s for s in steps if s["type"] == "routing"), key=lambda s: s["delay"],
                  default=None)
    return {"total_ns": round(logic + routing, 3), "logic_ns": round(logic, 3),
            "routing_ns": round(routing, 3),
            "logic_levels": sum(1 for s in steps if s["type"] == "logic"),
            "longest_route": None if longest is None else {
                "net": longest.get("net"), "delay_ns": round(longest["delay"], 3)},
            "hops": hops}


def short_name(name: str, width: int = 70) -> str:
    """A cell or register name without the harness's prefix, shortened to *width*."""
    name = name.replace("\\", "")
    if name.startswith("harness."):
        name = name[len("harness."):]
    return name if len(name) <= width else name[:width - 24] + "..." + name[-21:]


def format_critical_path(path: dict[str, Any]) -> list[str]:
    """The lines of a :func:`critical_path` summary: one a cell, a carry chain (ECP5's
    ``FCI`` -> ``FCO``, iCE40's ``CIN`` -> ``COUT``) as one."""
    lines = [f"critical path (nextpnr): {path['total_ns']:.2f} ns ({path['logic_ns']:.2f} "
             f"logic, {path['routing_ns']:.2f} routing, {path['logic_levels']} logic levels)"]
    cells: list[list] = []
    for hop in path["hops"]:
        if hop["type"] == "routing":
            continue
        carry = (hop["from"].endswith(".FCI") and hop["to"].endswith(".FCO")
                 or hop["from"].endswith(".CIN") and hop["to"].endswith(".COUT"))
        if carry and cells and cells[-1][0] == "carry":
            cells[-1][1] += hop["delay_ns"]
            cells[-1][2] += 1
        else:
            cells.append(["carry" if carry else hop["type"], hop["delay_ns"], 1, hop])
    for kind, delay, count, hop in cells:
        if kind == "carry":
            lines.append(f"  carry    {delay:5.2f} ns  {count} carry cells after "
                         f"{short_name(hop['from'])}")
        else:
            lines.append(f"  {kind:<8} {delay:5.2f} ns  {short_name(hop['from'])} -> "
                         f"{hop['to'].rpartition('.')[2]}")
    if path.get("longest_route"):
        lines.append(f"  longest route {path['longest_route']['delay_ns']:.2f} ns: "
                     f"{short_name(str(path['longest_route']['net']))}")
    return lines


def utilisation(report: dict) -> dict[str, tuple[int, int]]:
    """nextpnr cell type -> (used, available)."""
    return {cell: (v["used"], v["available"])
            for cell, v in sorted(report.get("utilization", {}).items())}


@dataclass
class PnrReport:
    """One nextpnr run's figures: the slowest clock's achieved Fmax and its constraint, the
    resources and the critical path."""
    achieved_mhz: float
    constraint_mhz: float
    resources: dict[str, tuple[int, int]]
    critical_path: dict[str, Any] | None

    @property
    def met(self) -> bool:
        return self.achieved_mhz >= self.constraint_mhz

    @classmethod
    def parse(cls, report: dict) -> PnrReport:
        achieved, constraint = clock_fmax(report)
        return cls(achieved_mhz=achieved, constraint_mhz=constraint,
                   resources=utilisation(report), critical_path=critical_path(report))

    @classmethod
    def read(cls, path: Path) -> PnrReport:
        """The report nextpnr wrote at *path*; :class:`BuildError` naming the file if it is
        missing or has no clock."""
        if not path.exists():
            raise BuildError(f"nextpnr wrote no report ({path})")
        try:
            return cls.parse(json.loads(path.read_text()))
        except BuildError as error:
            raise BuildError(f"{path}: {error}") from None
