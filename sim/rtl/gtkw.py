"""GTKWave save files (``.gtkw``) for the testbenches' waveforms.

The signal names in a save file must match the dump exactly (GTKWave silently drops the
others): vectors carry their range (``o_psum__payload[63:0]``), Amaranth's payload fields are
escaped identifiers (``\\o_psum__payload[0][31:0]``, only in Icarus' dumps: Verilator
optimises them away), and Verilator adds a ``$rootio`` scope beside the design's. So the
names come from the dump itself, read with GTKWave's ``fst2vcd`` (only the header is read);
without it they are predicted from the generated Verilog's port list (top-level ports only).

Fields of the instruction set's enumerations (:class:`hdl.isa.Opcode`, ``Func``, ``Pool``,
``ErrorCode``) show by name: :func:`write_enum_filters` writes a GTKWave translate filter file
per enumeration from :mod:`hdl.isa` itself (so a new opcode cannot be missing), and every save
file written here attaches the right one to each trace whose field name and width are an
enumeration's (``\\o_hazards__instr.opcode[3:0]``, ``\\i_activate__payload.func[2:0]``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from vcd.gtkw import GTKWSave

from hdl import isa
from sim.rtl.verilog import atomic_write

__all__ = ["fst_signals", "verilog_ports", "verilog_port_signals", "write_gtkw", "ENUM_FIELDS",
           "write_enum_filters", "enum_filter", "read_enum_filter", "gtkw_traces",
           "core_groups"]

#: The instruction set's enumerations, by the field name they have in the layouts of
#: :mod:`hdl.isa` (and in the control blocks' signals).
ENUM_FIELDS: dict[str, type] = {
    "opcode": isa.Opcode,
    "func": isa.Func,
    "pool": isa.Pool,
    "code": isa.ErrorCode,
}


def _hex_digits(width: int) -> int:
    return max(1, -(-width // 4))


def write_enum_filters(directory: Path) -> dict[str, Path]:
    """Write one GTKWave translate filter file per enumeration of :data:`ENUM_FIELDS` into
    *directory* (``opcode.gtkwfilter``, ...); returns field name -> file.

    Each line maps a value as GTKWave prints it in hex (every digit of the field's width) to
    the member's name; values no member has show as ``?N``, so a reserved opcode
    is visible as such. The files are rewritten only when they change."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for field, enum_type in ENUM_FIELDS.items():
        width = enum_type.as_shape().width
        names = {member.value: member.name for member in enum_type}
        lines = [f"# {enum_type.__module__}.{enum_type.__qualname__}: GTKWave translate "
                 f"filter ({width}-bit field, hex)"]
        for value in range(1 << width):
            lines.append(f"{value:0{_hex_digits(width)}X} {names.get(value, f'?{value}')}")
        path = directory / f"{field}.gtkwfilter"
        text = "\n".join(lines) + "\n"
        if not path.is_file() or path.read_text() != text:
            atomic_write(path, text)      # test workers may write the same file at once
        files[field] = path.resolve()
    return files


def read_enum_filter(path: Path) -> dict[int, str]:
    """A translate filter file read back: value -> text."""
    table = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, text = line.split(None, 1)
            table[int(key, 16)] = text.strip()
    return table


_FIELD = re.compile(r"\.(\w+)(?:\[(\d+):(\d+)\])?$")


def enum_filter(trace: str, filters: Mapping[str, Path]) -> Path | None:
    """The filter file of *trace* if its last name component is an enumeration's field name
    (:data:`ENUM_FIELDS`), alone or after an underscore (``fetch_opcode``), and its width is
    that enumeration's, else ``None``."""
    match = _FIELD.search(trace)
    if match is None:
        return None
    width = int(match[2]) - int(match[3]) + 1 if match[2] is not None else 1
    for field, enum_type in ENUM_FIELDS.items():
        named = match[1] == field or match[1].endswith("_" + field)
        if named and field in filters and width == enum_type.as_shape().width:
            return Path(filters[field])
    return None


def gtkw_traces(text: str) -> list[str]:
    """The signal names a save file's text shows (aliases and filters stripped)."""
    traces = []
    for line in text.splitlines():
        if not line or line[0] in "[*@-^#":
            continue
        if line.startswith("+{"):
            line = line.split("} ", 1)[1]
        traces.append(line)
    return traces


def core_groups(prefix: str = "") -> dict[str, list[tuple[str, str]]]:
    """Extra groups (:func:`write_gtkw`'s *extra_groups*) for a design that holds
    :class:`hdl.core.Core` at *prefix* (``""`` when the core is the top): the opcode of the
    instruction at fetch (NOP between instructions), the beat at the front end decoded into an
    instruction's fields (the opcode by name), its dispatch, and the status fields."""
    fe = f"{prefix}front_end."
    instr = fe + "\\o_hazards__instr."
    status = fe + "\\o_status."
    return {
        "instruction": [
            (fe + "fetching", "bin"), (fe + "fetch_opcode", "hex"),
            (instr + "opcode", "hex"), (instr + "flags", "bin"),
            (instr + "a", "dec"), (instr + "b", "dec"), (instr + "count", "dec"),
            (instr + "c", "hex"), (fe + "o_hazards__hazard", "bin"), (fe + "dispatch", "bin"),
        ],
        "status": [(status + "error", "bin"), (status + "code", "hex"),
                   (status + "halted", "bin"), (status + "instr_index", "dec")],
    }


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
               extra_groups: Mapping[str, Sequence[str | tuple[str, str]]] | None = None,
               filters: Mapping[str, Path] | None = None) -> list[str]:
    """Write a save file for *dump* with the design's signals grouped; returns the traces.

    ``clk`` and ``rst`` first, then one group per stream port ``i_x``/``o_x`` (valid, ready,
    payload, then the payload's fields as Amaranth names them, ``\\o_psum__payload[0]``),
    one ``ports`` group with the other top-level *ports*, then *extra_groups*, whose names are
    relative to the top module (``core.pe_0_0.active``), each a name (shown as a signed
    decimal) or ``(name, datafmt)``. Names absent from *signals* (the dump's) are left out.
    int32 partial sums show as signed decimals; enumeration fields (:data:`ENUM_FIELDS`) by
    name, through the translate filter files *filters* (default: :func:`write_enum_filters`
    beside *gtkw*). A design that holds the core (a ``front_end`` scope with the decoded
    instruction) gets :func:`core_groups` too, after *extra_groups*.
    """
    if filters is None:
        filters = write_enum_filters(Path(gtkw).parent)
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
            table = enum_filter(trace, filters)
            if table is not None:
                save.trace(trace, datafmt="hex", translate_filter_file=str(table))
            else:
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
        groups = dict(extra_groups or {})
        # Icarus keeps Verilog's escape of a dotted field name (`\\o_status.error`);
        # Verilator drops it (`o_status.error`): a name is looked up both ways.
        marker = "front_end.\\o_hazards__instr.opcode"
        for name in sorted(signals):
            if name.startswith(top_path + ".") and \
                    name.endswith(("." + marker, "." + marker.replace("\\", ""))):
                prefix = name[len(top_path) + 1:name.rindex("front_end.")]
                for group, entries in core_groups(prefix).items():
                    label = f"{prefix}{group}" if prefix else group
                    groups.setdefault(label, entries)
        for group, entries in groups.items():
            found = []
            for entry in entries:
                name, datafmt = (entry, "signed") if isinstance(entry, str) else entry
                for path in (f"{top_path}.{name}", f"{top_path}.{name}".replace("\\", "")):
                    if path in signals:
                        found.append((signals[path], datafmt))
                        break
            if found:
                with save.group(group):
                    for trace, datafmt in found:
                        add(trace, datafmt)
    return traces
