"""GTKWave save files (``.gtkw``) for the testbenches' waveforms.

The signal names in a save file must match the dump exactly (GTKWave silently drops the
others): vectors carry their range (``o_psum__payload[63:0]``), Amaranth's payload fields are
escaped identifiers (``\\o_psum__payload[0][31:0]``, only in Icarus' dumps: Verilator
optimises them away), and Verilator adds a ``$rootio`` scope beside the design's. So the
names come from the dump itself, read with GTKWave's ``fst2vcd`` (only the header is read);
without it they are predicted from the generated Verilog's port list (top-level ports only).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from vcd.gtkw import GTKWSave

__all__ = ["fst_signals", "verilog_ports", "verilog_port_signals", "write_gtkw"]


def fst_signals(fst: Path) -> dict[str, str] | None:
    """Map of every signal's full dotted name to its trace name (with ``[msb:lsb]`` for
    vectors), read from the dump's header with ``fst2vcd``; ``None`` if that tool is missing.
    """
    tool = shutil.which("fst2vcd")
    if tool is None:
        return None
    signals: dict[str, str] = {}
    scope: list[str] = []
    with subprocess.Popen([tool, str(fst)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            if not words:
                continue
            if words[0] == "$scope" and len(words) >= 3:
                scope.append(words[2])
            elif words[0] == "$upscope":
                scope.pop()
            elif words[0] == "$var" and len(words) >= 5:
                # $var <type> <width> <id> <name> [<range>] $end
                name = words[4]
                rng = words[5] if len(words) > 6 and words[5].startswith("[") else ""
                full = ".".join([*scope, name])
                signals[full] = full + rng
            elif words[0] == "$enddefinitions":
                proc.kill()
                break
    return signals


_PORT = re.compile(r"^\s*(?:input|output)\s+(?:\[(\d+):(\d+)\]\s+)?([A-Za-z_][\w$]*)\s*;",
                   re.MULTILINE)


def verilog_ports(verilog: Path) -> dict[str, str]:
    """The top module's ports (the first module in *verilog*): name to range suffix
    (``"[63:0]"``, or ``""`` for one bit)."""
    body = Path(verilog).read_text().split("endmodule", 1)[0]
    return {name: f"[{msb}:{lsb}]" if msb else "" for msb, lsb, name in _PORT.findall(body)}


def verilog_port_signals(verilog: Path, top: str, root: Sequence[str]) -> dict[str, str]:
    """Predicted trace names of the top module's ports, for when the dump cannot be read."""
    prefix = ".".join([*root, top])
    return {f"{prefix}.{name}": f"{prefix}.{name}{rng}"
            for name, rng in verilog_ports(verilog).items()}


def _find_top(signals: Mapping[str, str], top: str) -> str | None:
    """Dotted path of the design's top scope (``top`` or ``TOP.top``)."""
    for name in signals:
        parts = name.split(".")
        if top in parts[:-1]:
            return ".".join(parts[:parts.index(top) + 1])
    return None


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def write_gtkw(dump: Path, gtkw: Path, top: str, *,
               signals: Mapping[str, str], ports: Sequence[str],
               extra_groups: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """Write a save file for *dump* with the design's signals grouped; returns the traces.

    ``clk`` and ``rst`` first, then one group per stream port ``i_x``/``o_x`` (valid, ready,
    payload, then the payload's fields as Amaranth names them, ``\\o_psum__payload[0]``),
    one ``ports`` group with the other top-level *ports*, then *extra_groups*, whose names are
    relative to the top module (``core.pe_0_0.active``). Names absent from *signals* (the
    dump's) are left out. int32 partial sums show as signed decimals.
    """
    top_path = _find_top(signals, top) or top
    # Top-scope signals: no dot in the relative name, except inside an escaped identifier
    # (`\i_act__payload.switch` is one name).
    local = {}
    for name, trace in signals.items():
        if name.startswith(top_path + "."):
            rel = name[len(top_path) + 1:]
            if rel.startswith("\\") or "." not in rel:
                local[rel] = trace
    streams = sorted({name[:-len("__valid")] for name in ports
                      if re.fullmatch(r"[io]_\w+__valid", name)})
    traces: list[str] = []

    with open(gtkw, "w") as f:
        save = GTKWSave(f)
        save.comment(f"{top}: clock/reset, stream ports, other ports, internals")
        save.dumpfile(str(Path(dump).resolve()))
        save.savefile(str(Path(gtkw).resolve()))
        # About 40 cycles of the 10 ns clock (1 ps timescale) across the wave pane; -6 showed
        # a fraction of one cycle.
        save.zoom_markers(-18.0)
        save.treeopen(top_path)
        save.signals_width(300)

        def add(trace: str, datafmt: str = "hex") -> None:
            save.trace(trace, datafmt=datafmt)
            traces.append(trace)

        def fmt(trace: str) -> str:
            # int32 array elements (`\o_psum__payload[3][31:0]`) and partial sums: signed.
            return "signed" if re.search(r"(\]|psum\w*)\[31:0\]$", trace) else "hex"

        used = set()
        for name in ("clk", "rst"):
            if name in local:
                add(local[name], "bin")
                used.add(name)
        for stream in streams:
            with save.group(stream):
                for member, datafmt in (("valid", "bin"), ("ready", "bin"), ("payload", "hex")):
                    name = f"{stream}__{member}"
                    if name in local:
                        add(local[name], datafmt)
                        used.add(name)
                fields = [name for name in local
                          if name.startswith((f"\\{stream}__payload.",
                                              f"\\{stream}__payload["))]
                for name in sorted(fields, key=_natural):
                    add(local[name], fmt(local[name]))
        rest = [name for name in ports if name not in used and name in local]
        if rest:
            with save.group("ports"):
                for name in rest:
                    add(local[name], fmt(local[name]))
        for group, names in (extra_groups or {}).items():
            found = [signals[f"{top_path}.{n}"] for n in names if f"{top_path}.{n}" in signals]
            if found:
                with save.group(group):
                    for trace in found:
                        add(trace, "signed")
    return traces
