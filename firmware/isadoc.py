"""Generates docs/isa.md, the instruction-set reference, from :mod:`hdl.isa`.

Layouts, widths and offsets come from the layouts themselves; descriptions from their
docstrings and from the comments beside enum members, counters and fields in hdl/isa.py; the
execution semantics from :mod:`sim.models.isa_sim`'s documentation. Nothing is written twice, so the
reference cannot drift from the definitions (``--check``, run by the tests, says when
docs/isa.md is stale).

Usage::

    python -m firmware.isadoc > docs/isa.md
    python -m firmware.isadoc -o docs/isa.md
    python -m firmware.isadoc --check        # exit 1 if docs/isa.md is stale
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
from pathlib import Path

from amaranth.hdl import Shape
from amaranth.lib import data, enum

import sim.models.isa_sim
from firmware.asm import ALIASES, DEFAULTS, SHIFT_RANGE, field_specs
from hdl import isa
from hdl.beats import DONE_MAGIC, ERROR_MAGIC, DoneBeat, ErrorBeat
from hdl.datapath.activation import ActivationUnit
from hdl.datapath.activation_serial import element_cycles
from hdl.presets import PRESETS

__all__ = ["generate", "DOC_PATH", "main"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "isa.md"

#: What the common fields mean (their widths and offsets come from the layouts).
FIELD_MEANINGS = {
    "ub_addr": "first unified-buffer row",
    "acc_addr": "first accumulator row",
    "count": "number of rows (tiles for LOAD_WEIGHTS and READ_WEIGHTS); 0 is BAD_FIELD",
    "tile": "first weight tile",
    "slot": "requantisation parameter slot, 0 to param_slots - 1",
    "shift": "rounding right shift after the multiply, 0 to 63, for every column; ignored "
             "when `column_shifts` is set",
    "column_shifts": "1: a third data beat holds a shift per column (column `j`'s in bits "
                     "`[32j, 32j+6)`), which replaces `shift`",
    "zero_point": "output zero point, int8 (two's complement)",
    "clamp_hi": "upper bound of CLAMP, int8 (two's complement)",
    "flags": "flags, per opcode",
    "a": "first operand, per opcode (an address or slot)",
    "b": "second operand, per opcode",
    "c": "third operand, per opcode",
    "error": "an instruction failed: `code` says why, `instr_index` which one",
}

#: Where one opcode's field means something else than :data:`FIELD_MEANINGS` says.
OPCODE_FIELD_MEANINGS = {
    (isa.Opcode.UB_TO_WEIGHTS, "tile"): "the weight tile written",
    (isa.Opcode.UB_TO_WEIGHTS, "count"): "number of unified-buffer rows, 1 to `cols` with "
                                         "`transpose`, 1 to `rows` without; else BAD_FIELD",
    (isa.Opcode.UB_TO_WEIGHTS, "transpose"): "1: buffer row `i` becomes column `i` of the "
                                             "tile; 0: row `i`",
}


def _md(text: str) -> str:
    """reST-flavoured docstring text to Markdown."""
    text = inspect.cleandoc(text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r":(?:class|mod|data|func|meth|attr):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("::\n", ":\n")
    return text


def _sections(text: str, level: str) -> str:
    """numpydoc section titles (a line underlined with dashes) to Markdown headings."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and re.fullmatch(r"-{3,}", lines[i + 1]):
            out += [f"{level} {lines[i].strip()}", ""]
            i += 2
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _code_blocks(text: str) -> str:
    """Indented literal blocks to fenced code blocks."""
    out, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("    ") and (block or (out and out[-1] == "")):
            block.append(line[4:])
            continue
        if block:
            while block and not block[-1].strip():
                block.pop()
            out += ["```"] + block + ["```", ""]
            block = []
        out.append(line)
    return "\n".join(out).rstrip("\n")


def _comments(source: str) -> dict[str, str]:
    """``name -> comment`` for lines like ``NAME = 1  # comment``, ``name: 4  # comment`` or
    ``"name",  # comment``, with comment-only continuation lines appended (those indented
    past column 20, or whose ``#`` lines up with the comment's)."""
    comments: dict[str, str] = {}
    last = None
    column = -1
    for line in source.splitlines():
        match = re.match(r'\s*"?(\w+)"?\s*(?:[:=][^#]*|,\s*)#\s*(.*)$', line)
        if match:
            last = match.group(1)
            comments[last] = match.group(2).strip()
            column = line.index("#")
            continue
        match = re.match(r"\s*#\s*(.*)$", line)
        if match and last is not None and (line.index("#") >= 20 or line.index("#") == column):
            comments[last] += " " + match.group(1).strip()
            continue
        last = None
    return comments


def _counter_comments() -> dict[str, str]:
    source = inspect.getsource(isa)
    block = source[source.index("COUNTERS = ("):]
    return _comments(block[:block.index("\n)")])


def _bits(offset: int, width: int) -> str:
    return f"{offset}" if width == 1 else f"{offset + width - 1}:{offset}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


def _enum_table(cls: type[enum.Enum]) -> str:
    comments = _comments(inspect.getsource(cls))
    rows = [[str(member.value), f"`{member.name}`", comments.get(member.name, "")]
            for member in cls]
    return _table(["Value", "Name", "Meaning"], rows)


def _enum_values(cls: type[enum.Enum]) -> str:
    return ", ".join(f"{m.value} `{m.name}`" for m in cls)


def _flag_meanings(doc: str) -> dict[str, str]:
    return {name: re.sub(r"\s+", " ", text).strip()
            for name, text in re.findall(r"``(\w+)``: ([^.]*\.)", doc)}


def _layout_table(layout: type[data.Struct], opcode: isa.Opcode | None = None) -> str:
    flags = _flag_meanings(layout.__doc__ or "")
    comments = _comments(inspect.getsource(layout))
    rows = []
    for name, field in data.Layout.cast(layout):
        shape = field.shape
        if name == "opcode" and opcode is not None:
            meaning = f"`Opcode.{opcode.name}` = {opcode.value}"
        elif isinstance(shape, type) and issubclass(shape, enum.Enum):
            meaning = f"`{shape.__name__}`: {_enum_values(shape)}"
        elif name.startswith("_"):
            meaning = "reserved: ignored, write 0"
        else:
            flag = flags.get(name) if field.width == 1 else None
            meaning = (OPCODE_FIELD_MEANINGS.get((opcode, name)) or comments.get(name)
                       or flag or FIELD_MEANINGS.get(name)
                       or ("signed" if Shape.cast(shape).signed else ""))
        if name in ALIASES:
            meaning += f" (assembler: `{ALIASES[name]}`)"
        rows.append([f"`{name}`", _bits(field.offset, field.width), str(field.width), meaning])
    return _table(["Field", "Bits", "Width", "Meaning"], rows)


def _syntax(opcode: isa.Opcode) -> str:
    parts, defaulted, flags = [opcode.name.lower()], [], []
    for spec in field_specs(opcode):
        if spec.kind == "flag":
            flags.append(f"[{spec.alias}]")
        elif spec.kind != "reserved":
            text = (f"{spec.alias}={'|'.join(m.name.lower() for m in spec.enum)}"
                    if spec.kind == "enum" else f"{spec.alias}=N")
            (defaulted if spec.name in DEFAULTS else parts).append(
                f"[{text}]" if spec.name in DEFAULTS else text)
    return " ".join(parts + defaulted + flags)


#: The data lines after the instruction, in the assembler's syntax (firmware/asm.py).
DATA_LINES = {
    isa.Opcode.READ_HOST: "then `count` lines `.row` (`ub_row` bytes) or `.hex`",
    isa.Opcode.LOAD_WEIGHTS: "then `count * rows` lines `.row` (`cols` bytes) or `.hex`",
    isa.Opcode.LOAD_PARAMS: (
        "then `.bias` and `.mult` (`cols` int32 each), and for per-column shifts a third "
        f"line `.shift` (`cols` shifts, {SHIFT_RANGE[0]} to {SHIFT_RANGE[1]}), which sets "
        "`column_shifts`; `shift=` is then left out. `rounding` defaults to `half_up`"),
    isa.Opcode.UB_TO_WEIGHTS: "no data lines (the rows come from the unified buffer)",
    isa.Opcode.MATMUL: "no data lines; `lane` and `step` default to 0",
    isa.Opcode.LOAD_TABLE: (
        "then `table_beats(cols)` lines `.table` (`4 * cols` entries each, a byte -128 to 255: "
        "int8 or its raw byte) or `.hex`, entry 0 first; the last line holds only the "
        "entries up to 255 (16 of them with 5 columns); `target` defaults to `activation`. "
        "With `target=sum0` or `sum1`, `sum_table_beats(cols)` lines `.sums` (`cols` int32 "
        "entries each, the last line the entries up to 255)"),
    isa.Opcode.MATMUL_LOOKUP: "no data lines; `table` (0 or 1) is written `table` or "
                              "`table=1` as a flag",
}


def _activation_depth() -> str:
    """ACTIVATE's timing from the gateware's own figures, so the reference cannot state a
    depth the activation units do not have (their testbenches check these figures)."""
    shift_max = 2 ** Shape.cast(data.Layout.cast(isa.LoadParams)["shift"].shape).width - 1
    return textwrap.fill(
        f"Depth: the pipelined activation unit (`hdl/datapath/activation.py`) takes a row "
        f"every cycle and offers a pooling window's output row "
        f"`ActivationUnit.STAGES` = {ActivationUnit.STAGES} cycles after taking the row that "
        f"closes the window. The serial unit of small parts (`activation_unit=\"serial\"`, "
        f"`hdl/datapath/activation_serial.py`) works through a row's columns one after "
        f"another, `element_cycles(shift)` = {element_cycles(0)} to "
        f"{element_cycles(shift_max)} cycles an element (`shift` 0 to {shift_max}).",
        width=92, break_long_words=False, break_on_hyphens=False)


def _normalise_constants() -> str:
    """NORMALISE's reciprocal in figures, from :mod:`hdl.isa`'s constants, so the reference
    cannot state a precision the definition does not have (tests/firmware/test_isadoc.py
    checks the figures against :func:`hdl.isa.reciprocal`)."""
    bits, scale = isa.RECIPROCAL_BITS, isa.RECIPROCAL_SCALE
    exact = 1 << bits
    text = (
        f"Function NORMALISE (a core built with `row_scale`): `RECIPROCAL_BITS` = {bits} and "
        f"`RECIPROCAL_SCALE` = {scale}, so a row with divisor `d` (its last column's "
        f"accumulator, before the bias) has the multiplier `recip = round(2**{scale} / m)` "
        f"(to nearest, ties up), `m` the top {bits} bits of `d`, and the shift "
        f"`min(63, shift + e)`, `e` the bits cut: `q` is about "
        f"`z + t / d * 2**({scale} - shift)`. `recip` runs from "
        f"{isa.reciprocal(1)[0]} (`d` = 1) down to {isa.reciprocal(exact - 1)[0]} "
        f"(`m` = {exact - 1}); `recip / 2**e` is `2**{scale} / d` rounded to the nearest "
        f"integer for `d` < {exact}, and within a relative `2**-{bits - 1}` of it for "
        f"larger `d` (the cut). A divisor of 0 or less gives 0, so the row's outputs are "
        f"the zero point.")
    # Wrap between code spans, not inside them.
    text = re.sub(r"`[^`]+`", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(text, width=92, break_long_words=False,
                         break_on_hyphens=False).replace("\0", " ")


def generate() -> str:
    """The text of docs/isa.md."""
    out = [
        "# amtpu instruction set",
        "",
        "<!-- Generated by `python -m firmware.isadoc` from hdl/isa.py and sim/models/isa_sim.py. "
        "Do not edit: change those and regenerate. -->",
        "",
        _md(isa.__doc__),
        "",
        "## Configurations",
        "",
        "Data rows depend on the configuration; `ub_row = max(rows, cols)` and the beat is "
        "`host_width` bits; without `ub_to_weights` opcode 12 is UNKNOWN_OPCODE, without "
        "`lookup_table` opcode 13 (LOAD_TABLE) is UNKNOWN_OPCODE and ACTIVATE's function "
        "TABLE is BAD_FIELD, without `row_scale` ACTIVATE's function NORMALISE is BAD_FIELD. "
        "LOAD_TABLE takes `table_beats(cols)` data beats. The presets in `hdl/presets.py`:",
        "",
        _table(["Preset", "rows x cols", "ub_row", "host_width", "ub_depth", "acc_depth",
                "weight_mem_tiles", "weight_fifo_depth", "param_slots", "ub_to_weights",
                "lookup_table", "table_beats", "row_scale"],
               [[f"`{name}`", f"{c.rows} x {c.cols}", str(c.ub_row), str(c.host_width),
                 str(c.ub_depth), str(c.acc_depth), str(c.weight_mem_tiles),
                 str(c.weight_fifo_depth), str(c.param_slots),
                 "yes" if c.ub_to_weights else "no", "yes" if c.lookup_table else "no",
                 str(isa.table_beats(c.cols)) if c.lookup_table else "-",
                 "yes" if c.row_scale else "no"]
                for name, c in PRESETS.items()]),
        "",
        "## Semantics",
        "",
        _code_blocks(_sections(_md(sim.models.isa_sim.__doc__), "###")),
        "",
        "## Instruction word",
        "",
        f"Every instruction is {isa.INSTR_BITS} bits, bit 0 the least significant. "
        "The generic view the decoder uses (`Instr`):",
        "",
        _layout_table(isa.Instr),
        "",
        "## Opcodes",
        "",
        _md(isa.Opcode.__doc__),
        "",
        _enum_table(isa.Opcode),
        "",
    ]
    for opcode, layout in isa.FORMATS.items():
        out += [
            f"### {opcode.value}: `{opcode.name.lower()}`",
            "",
            _md(layout.__doc__),
            "",
            *([_activation_depth(), "", _normalise_constants(), ""]
              if opcode == isa.Opcode.ACTIVATE else []),
            f"Assembler: `{_syntax(opcode)}`"
            + (f", {DATA_LINES[opcode]}." if opcode in DATA_LINES else ""),
            "",
            _layout_table(layout, opcode),
            "",
        ]
    for cls in (isa.Func, isa.Rounding, isa.Pool, isa.ErrorCode):
        out += [f"## {cls.__name__}", "", _md(cls.__doc__), "", _enum_table(cls), ""]
    comments = _counter_comments()
    out += [
        "## Performance counters",
        "",
        f"READ_COUNTERS sends one {isa.COUNTER_BITS}-bit beat per counter, in this order. "
        "Deterministic ones (exactly predicted by the ISA simulator): "
        + ", ".join(f"`{name}`" for name in sim.models.isa_sim.DETERMINISTIC_COUNTERS) + ".",
        "",
        _table(["Beat", "Counter", "Meaning"],
               [[str(i), f"`{name}`", comments.get(name, "")]
                for i, name in enumerate(isa.COUNTERS)]),
        "",
        "## Status",
        "",
        _md(isa.Status.__doc__),
        "",
        _layout_table(isa.Status),
        "",
        "## DONE beat",
        "",
        f"HALT sends `DONE_MAGIC << 32 | n` with `DONE_MAGIC = {DONE_MAGIC:#010x}` "
        f"(\"{DONE_MAGIC.to_bytes(4, 'big').decode()}\") and `n` the number of "
        "instructions in the program, the HALT included (`DoneBeat`, in the low 64 bits):",
        "",
        _layout_table(DoneBeat),
        "",
        "## Error beat",
        "",
        _md(ErrorBeat.__doc__) + f" `ERROR_MAGIC = {ERROR_MAGIC:#010x}` "
        f"(\"{ERROR_MAGIC.to_bytes(4, 'big').decode()}\").",
        "",
        _layout_table(ErrorBeat),
        "",
        "## Resynchronisation word",
        "",
        f"`RESYNC_WORD = {isa.RESYNC_WORD:#018x}`. " + _md(
            "After an error the core discards every beat until this word (the low 64 bits "
            "of a beat; higher bits are ignored), which clears the error and restarts the "
            "program at instruction 0. Sent with no error pending it restarts the program "
            "and is not an instruction. Its opcode, 15, is reserved, so no valid "
            "instruction equals it; a host that does not know the core's state sends it "
            "before a new program. The out-of-band `i_clear` input does the same as the "
            "word when an error is pending, and nothing otherwise."),
    ]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m firmware.isadoc",
                                     description="Generate docs/isa.md from hdl/isa.py.")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {DOC_PATH.name} differs from the generated text")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = DOC_PATH.read_text() if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is stale; regenerate it with "
                  f"`python -m firmware.isadoc -o docs/isa.md`", file=sys.stderr)
            return 1
        return 0
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
