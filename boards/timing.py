"""Static timing of a placed and routed ECP5 design from the delays nextpnr back-annotates
(``--sdf``): the worst register-to-register paths into *different* registers.

nextpnr's own report gives one critical path per clock; fixing it only reveals the next.
:func:`worst_paths` lists the worst path into each of the N worst endpoints (the bits of one
register count once), so one build shows every path a faster clock has to shorten.
``python -m boards build --board ulx3s --paths 40`` prints them after the build report, for
the board's bitstream (``--target board``) or for the core or a block in the pin harness.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CLOCK_PINS", "Sdf", "worst_paths", "format_paths", "sdf_worst_paths"]

# Static timing from nextpnr's SDF ---------------------------------------------------------

#: Clock pins of the ECP5 cells nextpnr writes: an IOPATH from one of them launches a path.
CLOCK_PINS = frozenset({"CLK", "CLKA", "CLKB", "CLK0", "CLK1", "CLK2", "CLK3", "WCK"})

_INSTANCE = re.compile(r"\(INSTANCE ?([^)]*)\)")
_IOPATH = re.compile(r"\(IOPATH (\S+) (\S+) \(([^)]*)\) \(([^)]*)\)\)")
_INTERCONNECT = re.compile(r"\(INTERCONNECT (\S+) (\S+) \(([^)]*)\) \(([^)]*)\)\)")
_SETUPHOLD = re.compile(r"\(SETUPHOLD \((?:posedge|negedge) (\S+)\) \((?:posedge|negedge) "
                        r"(\S+)\) \(([^)]*)\) \(([^)]*)\)\)")


def _max_ps(*triples: str) -> float:
    """The largest max of SDF ``min:typ:max`` values, in picoseconds."""
    return max(float(t.split(":")[-1] or 0) for t in triples)


def _sdf_name(name: str) -> str:
    return name.replace("\\", "")


@dataclass
class Sdf:
    """The delays nextpnr back-annotates (``--sdf``), in picoseconds; pins are
    ``"<instance>/<port>"``: combinational arcs (cell arcs and interconnect), clock-to-output
    times and setup times."""

    arcs: dict[str, list[tuple[str, float]]]        # input pin -> [(output pin, delay)]
    launch: dict[str, float]                         # output pin -> clock-to-output
    setup: dict[str, float]                          # input pin -> setup time

    @classmethod
    def parse(cls, text: str) -> Sdf:
        """Parse nextpnr's SDF, which has one delay or check on a line."""
        arcs: dict[str, list[tuple[str, float]]] = defaultdict(list)
        launch: dict[str, float] = {}
        setup: dict[str, float] = {}
        inst = ""
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("(INTERCONNECT"):
                match = _INTERCONNECT.match(line)
                if match:
                    src, dst = (_sdf_name(match[i]) for i in (1, 2))
                    arcs[src].append((dst, _max_ps(match[3], match[4])))
            elif line.startswith("(IOPATH"):
                match = _IOPATH.match(line)
                if match:
                    src, dst = match[1], match[2]
                    delay = _max_ps(match[3], match[4])
                    if src in CLOCK_PINS:
                        key = f"{inst}/{dst}"
                        launch[key] = max(launch.get(key, 0.0), delay)
                    else:
                        arcs[f"{inst}/{src}"].append((f"{inst}/{dst}", delay))
            elif line.startswith("(SETUPHOLD"):
                match = _SETUPHOLD.match(line)
                if match:
                    key = f"{inst}/{match[1]}"
                    setup[key] = max(setup.get(key, 0.0), _max_ps(match[3]))
            elif line.startswith("(INSTANCE"):
                inst = _sdf_name(_INSTANCE.match(line)[1].strip())
        return cls(arcs=dict(arcs), launch=launch, setup=setup)


def _group(instance: str) -> str:
    """The register a flip-flop, RAM or block belongs to: its name without the bit index and
    the suffixes synthesis and packing add."""
    name = instance.replace("\\", "")
    name = re.sub(r"\$(DPRAM|RAMW|CCU2)_\w*$", "", name)
    name = re.sub(r"(_TRELLIS_FF|_TRELLIS_COMB|_DP16KD|_MULT18X18D|_LUT4|_CCU2C|_DFF|_PFUMX|"
                  r"_L6MUX21)[A-Za-z0-9_$]*$", "", name)
    name = re.sub(r"\[\d+\]", "", name)
    name = re.sub(r"(\.\d+)+$", "", name)
    name = re.sub(r"(_\d+)+$", "", name)
    return name


def worst_paths(sdf: Sdf, *, period_ns: float, count: int = 10) -> list[dict[str, Any]]:
    """The worst register-to-register paths into *count* different endpoint groups (the bits
    of one register count once), each with its delay, slack against *period_ns* and cells.

    Longest-path arrival times over the SDF's arcs, from every clock-to-output to every pin
    with a setup check. Clock skew is not modelled (nextpnr's figure includes it), so the
    delays here can differ from nextpnr's by the skew of the global clock network."""
    arrival: dict[str, float] = {}
    pred: dict[str, str | None] = {}
    indegree: dict[str, int] = defaultdict(int)
    for outs in sdf.arcs.values():
        for dst, _ in outs:
            indegree[dst] += 1
    # Kahn's order over the combinational graph; launch pins and pins with no fan-in start.
    nodes = set(sdf.arcs) | {d for outs in sdf.arcs.values() for d, _ in outs}
    ready = [n for n in nodes if indegree.get(n, 0) == 0]
    for node in ready:
        if node in sdf.launch:
            arrival[node] = sdf.launch[node]
            pred[node] = None
    for node in sdf.launch:
        arrival.setdefault(node, sdf.launch[node])
        pred.setdefault(node, None)
    while ready:
        node = ready.pop()
        base = arrival.get(node)
        for dst, delay in sdf.arcs.get(node, ()):
            if base is not None and dst not in sdf.launch:
                if base + delay > arrival.get(dst, -math.inf):
                    arrival[dst] = base + delay
                    pred[dst] = node
            indegree[dst] -= 1
            if indegree[dst] == 0:
                ready.append(dst)
    ends = []
    for pin, setup in sdf.setup.items():
        if pin in arrival:
            ends.append((arrival[pin] + setup, pin))
    ends.sort(reverse=True)
    seen: set[str] = set()
    paths = []
    for total, pin in ends:
        group = _group(pin.rpartition("/")[0])
        if group in seen:
            continue
        seen.add(group)
        cells = []
        node: str | None = pin
        while node is not None:
            inst = node.rpartition("/")[0]
            if not cells or cells[-1] != inst:
                cells.append(inst)
            node = pred.get(node)
        cells.reverse()
        start = cells[0]
        paths.append({
            "delay_ns": round(total / 1000, 3),
            "slack_ns": round(period_ns - total / 1000, 3),
            "from": start, "to": pin.rpartition("/")[0], "to_group": group,
            "from_group": _group(start),
            "cells": len(cells), "via": cells,
        })
        if len(paths) >= count:
            break
    return paths


def format_paths(paths: list[dict[str, Any]], *, width: int = 60) -> str:
    """One line a path: delay, slack, cells, and the registers it runs from and into."""
    def short(name: str) -> str:
        return name if len(name) <= width else "..." + name[-(width - 3):]
    return "\n".join(f"  {p['delay_ns']:5.2f} ns (slack {p['slack_ns']:+.2f}) "
                     f"{p['cells']:2d} cells  {short(p['from_group'])} -> "
                     f"{short(p['to_group'])}" for p in paths)


def sdf_worst_paths(path: Path, *, period_ns: float, count: int) -> list[dict[str, Any]]:
    """:func:`worst_paths` of the SDF file at *path*."""
    return worst_paths(Sdf.parse(path.read_text()), period_ns=period_ns, count=count)
