"""Assembler and disassembler of the host stream, and a Python API for compilers.

Every instruction field, its width and its offset come from the layouts in :mod:`hdl.isa`
(iterated, never copied), so a change there changes the assembler with it.

Syntax
------
One instruction or data line per line; ``#`` or ``;`` starts a comment. An instruction is
its mnemonic (the :class:`~hdl.isa.Opcode` name in lower case) followed by its fields::

    read_host ub=0 count=2
    .row 1 2 3 4 5 6 7 -8
    .hex 01 02 03 04 05 06 07 f8
    load_weights tile=0 count=1 signed
    .row 1 0 0 0 0 0 0 0          # rows * count lines, element 0 first
    ...
    read_weights tile=0 count=1
    load_params slot=0 shift=12 zp=-3 clamp=127
    .bias 100 -100 0 0 0 0 0 0    # cols int32 values
    .mult 1 1 1 1 1 1 1 1
    load_params slot=1 zp=0 clamp=127 rounding=double
    .bias 0 0 0 0 0 0 0 0
    .mult 1 1 1 1 1 1 1 1
    .shift 40 40 38 41 39 40 40 42  # per-column shifts, 0 to 63 (sets column_shifts)
    matmul ub=0 acc=16 count=64 switch accumulate signed
    activate acc=0 ub=128 count=64 func=relu pool=max2 slot=0
    ub_to_weights ub=128 tile=1 count=8 transpose signed  # no data lines: rows from the buffer
    load_table                    # then table_beats(cols) lines of 4 * cols entries
    .table -128 -127 -126 ...     # entries 0 to 31 (8 columns)
    ...
    activate acc=64 ub=0 count=8 func=table pool=none slot=0
    load_table target=sum0        # then sum_table_beats(cols) lines of cols int32 entries
    .sums 0 1048576 2097152 ...   # entries 0 to 7 (8 columns)
    ...
    matmul_lookup ub=0 acc=0 count=16 switch signed table=0
    write_host ub=128 count=32
    halt

- Fields are ``name=value``; every field of the layout is required except the 1-bit flags,
  written as a bare name (``signed``) or ``name=0``/``name=1``, the fields with a default
  (:data:`DEFAULTS`: ``rounding``, default ``half_up``; MATMUL's ``lane`` and ``step``,
  default 0, which only a ``window`` MATMUL reads; LOAD_TABLE's ``target``, default
  ``activation``) and the reserved fields
  (``_flags=...``, default 0). Short names: ``ub`` = ``ub_addr``, ``acc`` = ``acc_addr``,
  ``zp`` = ``zero_point``, ``clamp`` = ``clamp_hi``.
- Values are decimal or ``0x`` hex, within the field's width; ``zp`` and ``clamp`` are int8
  (-128..127); ``func``, ``pool`` and ``rounding`` take an enum name (``relu``, ``max2``,
  ``half_even``) or a number (one the core refuses, such as ``rounding=3``, too: tests
  build failing programs with it).
- Data lines follow the instruction that takes them: ``count`` lines after ``read_host``
  (``ub_row`` bytes each), ``count * rows`` after ``load_weights`` (``cols`` bytes each),
  none after ``ub_to_weights`` (its rows come from the unified buffer),
  ``table_beats(cols)`` lines after ``load_table`` (:func:`hdl.isa.table_beats`: ``4 * cols``
  entries each, entry 0 first; the last line only the entries up to 255, so 16 of them when
  ``cols`` is 5), each ``.table`` (bytes) or ``.hex``; after ``load_table target=sum0``
  (or ``sum1``) ``sum_table_beats(cols)`` lines ``.sums`` of ``cols`` int32 entries (the
  last line the entries up to 255);
  ``.bias`` then ``.mult`` after ``load_params`` (``cols`` int32 each), then optionally
  ``.shift`` (``cols`` shifts, 0 to 63): per-column shifts, which set the ``column_shifts``
  flag and replace ``shift``, so ``shift=`` is then left out (given, it is an error: the
  core would ignore it). ``load_params`` needs either ``shift=`` or a ``.shift`` line; the
  flag may be written too (``column_shifts``), and then the third data line is required.
  A byte is -128..255 (int8 or uint8, the same raw bits); an int32 is -2**31..2**32-1.
  ``.hex`` gives a row as two hex digits per element, element 0 first.
- ``.word VALUE`` is one raw beat, anywhere: an instruction word the assembler would reject
  (unknown opcode, bits above bit 63, ``column_shifts`` with a non-zero ``shift``; the
  assembler expects no data lines after it, so the disassembler prints the data beats of
  such a word as ``.word`` too), or a data beat with bits set above its row (or, in the
  per-column shift beat, above a lane's six shift bits).

:func:`disassemble` prints canonical text: layout field order, value fields then flags, short
names, fields with a default only when they differ from it (after the others), reserved
fields only when non-zero, ``read_host`` rows and ``load_table`` entries as int8,
``load_weights`` rows as int8 or uint8 per the ``signed`` flag, per-column shifts as a
``.shift`` line (``column_shifts`` is printed only when that beat is a ``.word``; a
``load_params`` with ``column_shifts`` and a non-zero ``shift`` is a ``.word``).
``assemble(disassemble(beats)) == beats`` for any stream made of whole instructions.

Command line::

    python -m firmware.asm prog.s -o prog.bin [--config default] [--format bin|hex]
    python -m firmware.asm --disassemble prog.bin [-o prog.s]

A binary file holds each beat as ``host_width / 8`` little-endian bytes; a hex file one beat
per line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import data, enum

from hdl import isa
from hdl.beats import DATA_BITS, param_row_beat, ub_row_beat, weight_row_beat
from hdl.config import TPUConfig
from hdl.presets import get_config

__all__ = ["AsmError", "FieldSpec", "field_specs", "encode", "decode", "data_beats", "assemble",
           "instructions", "disassemble", "Program", "beats_to_bytes", "bytes_to_beats",
           "ALIASES", "DEFAULTS",
           "SHIFT_RANGE", "main"]

#: Short names the assembler prints (the layout names are accepted too).
ALIASES = {"ub_addr": "ub", "acc_addr": "acc", "zero_point": "zp", "clamp_hi": "clamp"}

#: Fields the text may leave out, and their value then (printed only when different).
DEFAULTS = {"rounding": isa.Rounding.HALF_UP.value, "lane": 0, "step": 0,
            "target": isa.TableTarget.ACTIVATION.value}

#: What a per-column shift (a lane of LOAD_PARAMS's third beat) may be: the lane's low six
#: bits are the shift, the core ignores the others.
SHIFT_RANGE = (0, (1 << data.Layout.cast(isa.LoadParams)["shift"].width) - 1)

#: 8-bit fields holding int8 values in two's complement (needed while hdl.isa declares them
#: unsigned; a field with a signed shape is treated the same way).
INT8_FIELDS = frozenset({"zero_point", "clamp_hi"})

_INSTR_MASK = (1 << isa.INSTR_BITS) - 1
_MNEMONICS = {op.name.lower(): op for op in isa.Opcode}


class AsmError(ValueError):
    """Invalid assembly text or instruction fields. Messages read
    ``line N: what is wrong; what is allowed``."""


@dataclass(frozen=True)
class FieldSpec:
    """One instruction field, as found in a :mod:`hdl.isa` layout.

    ``kind``: ``"int"`` (unsigned), ``"int8"`` (two's complement), ``"flag"`` (1 bit),
    ``"enum"`` (``enum`` holds the class) or ``"reserved"`` (``_``-prefixed).
    """
    name: str
    offset: int
    width: int
    kind: str
    enum: type | None = None

    @property
    def alias(self) -> str:
        return ALIASES.get(self.name, self.name)

    @property
    def range(self) -> tuple[int, int]:
        if self.kind == "int8":
            return -(1 << (self.width - 1)), (1 << (self.width - 1)) - 1
        return 0, (1 << self.width) - 1

    def allowed(self) -> str:
        lo, hi = self.range
        text = f"{lo} to {hi} ({self.width} bits)"
        if self.kind == "enum":
            names = ", ".join(m.name.lower() for m in self.enum)
            text = f"{names} or {text}"
        return text


def field_specs(opcode: isa.Opcode) -> list[FieldSpec]:
    """The fields of ``opcode``'s layout after the opcode, in layout (bit) order."""
    specs = []
    for name, field in data.Layout.cast(isa.FORMATS[opcode]):
        if name == "opcode":
            continue
        shape = field.shape
        if isinstance(shape, type) and issubclass(shape, enum.Enum):
            kind = "enum"
        elif name.startswith("_"):
            kind = "reserved"
        elif field.width == 1:
            kind = "flag"
        elif name in INT8_FIELDS or Shape.cast(shape).signed:
            kind = "int8"
        else:
            kind = "int"
        specs.append(FieldSpec(name, field.offset, field.width, kind,
                               shape if kind == "enum" else None))
    return specs


_SPECS = {op: field_specs(op) for op in isa.Opcode}


def _lookup(opcode: isa.Opcode, key: str) -> FieldSpec | None:
    for spec in _SPECS[opcode]:
        if key in (spec.name, spec.alias):
            return spec
    return None


def _check_value(opcode: isa.Opcode, spec: FieldSpec, value) -> int:
    """The field value as an int (enum members to their value), range-checked."""
    if spec.kind == "enum" and isinstance(value, spec.enum):
        value = value.value
    if isinstance(value, bool | np.bool_):
        value = int(value)
    if not isinstance(value, int | np.integer):
        raise AsmError(f"{opcode.name.lower()} field {spec.alias}={value!r} is not an "
                       f"integer; allowed: {spec.allowed()}")
    value = int(value)
    lo, hi = spec.range
    if not lo <= value <= hi:
        raise AsmError(f"{opcode.name.lower()} field {spec.alias}={value} is out of range; "
                       f"allowed: {spec.allowed()}")
    return value


def encode(opcode: isa.Opcode, **fields) -> int:
    """The instruction word of ``opcode`` with ``fields`` (layout or short names; missing
    fields are 0), packed with the layout's ``const``. Raises :class:`AsmError` for an
    unknown field or a value that does not fit."""
    # A compiler emits the same few words many times over, and packing one through the
    # layout's const() is slow: words are kept by their field values.
    try:
        key = (opcode, tuple((k, type(v), v.value if isinstance(v, enum.Enum) else int(v))
                             for k, v in fields.items()))
    except (TypeError, ValueError, AttributeError):
        return _encode(opcode, **fields)
    word = _WORDS.get(key)
    if word is None:
        word = _encode(opcode, **fields)
        if len(_WORDS) < 1 << 16:
            _WORDS[key] = word
    return word


_WORDS: dict = {}


def _encode(opcode: isa.Opcode, **fields) -> int:
    opcode = isa.Opcode(opcode)
    layout = data.Layout.cast(isa.FORMATS[opcode])
    values = {"opcode": opcode}
    extra = 0
    for key, value in fields.items():
        spec = _lookup(opcode, key)
        if spec is None:
            names = ", ".join(s.alias for s in _SPECS[opcode]) or "none"
            raise AsmError(f"{opcode.name.lower()} has no field {key!r}; allowed: {names}")
        value = _check_value(opcode, spec, value)
        if spec.kind == "enum" and value not in {m.value for m in spec.enum}:
            extra |= value << spec.offset   # not a member: const() cannot take it
        elif spec.kind == "int8" and not Shape.cast(layout[spec.name].shape).signed:
            values[spec.name] = value & ((1 << spec.width) - 1)
        else:
            values[spec.name] = value
    return layout.const(values).as_bits() | extra


def decode(word: int) -> tuple[isa.Opcode | int, dict[str, int]]:
    """``(opcode, fields)`` of an instruction word (its low 64 bits), with
    :func:`hdl.isa.decode` (the decoder the ISA simulator uses too). ``fields`` maps layout
    names to ints (int8 fields sign-extended, enums to their value) and is empty for an
    unknown opcode, which is returned as an int."""
    opcode, fields = isa.decode(word)
    return opcode, {name: value.value if isinstance(value, enum.Enum) else value
                    for name, value in fields.items()}


# Data beats ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Data:
    """What one data beat after an instruction carries."""
    kind: str        # "ub", "weight", "bias", "mult", "shift", "table", "sums"
    signed: bool = True
    first: int = 0   # "table", "sums": the beat's first entry
    entries: int = 0  # "table", "sums": the entries it holds (fewer in the last beat)

    def size(self, config: TPUConfig) -> tuple[int, int]:
        """(elements, bits per element), from the beat layouts of :mod:`hdl.beats`."""
        if self.kind == "table":
            return self.entries, DATA_BITS
        if self.kind == "sums":
            return self.entries, Shape.cast(param_row_beat(config.cols).elem_shape).width
        if self.kind == "ub":
            layout = ub_row_beat(config.ub_row)
        elif self.kind == "weight":
            layout = weight_row_beat(config.cols)
        else:
            layout = param_row_beat(config.cols)
        return layout.length, Shape.cast(layout.elem_shape).width

    def value_range(self, config: TPUConfig) -> tuple[int, int]:
        """The values a data line may give (raw patterns of either signedness)."""
        if self.kind == "shift":
            return SHIFT_RANGE
        return _value_range(self.size(config)[1])

    def what(self, config: TPUConfig) -> str:
        """What one value is, for error messages."""
        if self.kind == "shift":
            return "a per-column shift"
        return "a byte, int8 or uint8" if self.size(config)[1] == 8 else "int32 or uint32"

    def printable(self, beat: int, config: TPUConfig) -> bool:
        """Whether a data line can give ``beat`` (else it is printed as ``.word``)."""
        n, bits = self.size(config)
        if beat >> (n * bits):
            return False
        if self.kind == "shift":
            return all(v <= SHIFT_RANGE[1] for v in _unpack_row(beat, n, bits, False))
        return True

    @property
    def directives(self) -> tuple[str, ...]:
        return {"ub": (".row", ".hex"), "weight": (".row", ".hex"), "table": (".table", ".hex"),
                "bias": (".bias",), "mult": (".mult",), "shift": (".shift",),
                "sums": (".sums",)}[self.kind]

    def where(self) -> str:
        """Which values of the instruction the beat holds, for error messages."""
        if self.kind not in ("table", "sums"):
            return ""
        return f" (table entries {self.first} to {self.first + self.entries - 1})"


def _table_beats(config: TPUConfig) -> list[_Data]:
    """LOAD_TABLE's data beats: each a parameter row's bytes, entries ``4 * cols`` at a time
    (:func:`hdl.isa.table_beats`), the last beat only up to entry 255."""
    per_beat = data.Layout.cast(param_row_beat(config.cols)).size // DATA_BITS
    return [_Data("table", first=b * per_beat,
                  entries=min(per_beat, isa.TABLE_ENTRIES - b * per_beat))
            for b in range(isa.table_beats(config.cols))]


def _sum_table_beats(config: TPUConfig) -> list[_Data]:
    """LOAD_TABLE's data beats for a sum table: ``cols`` int32 entries each
    (:func:`hdl.isa.sum_table_beats`), the last beat only up to entry 255."""
    cols = config.cols
    return [_Data("sums", first=b * cols, entries=min(cols, isa.TABLE_ENTRIES - b * cols))
            for b in range(isa.sum_table_beats(cols))]


def _data_beats(opcode, fields: dict[str, int], config: TPUConfig) -> list[_Data]:
    if opcode == isa.Opcode.READ_HOST:
        return [_Data("ub")] * fields["count"]
    if opcode == isa.Opcode.LOAD_WEIGHTS:
        return [_Data("weight", bool(fields["signed"]))] * (fields["count"] * config.rows)
    if opcode == isa.Opcode.LOAD_PARAMS:
        return [_Data("bias"), _Data("mult")] + [_Data("shift")] * fields["column_shifts"]
    if opcode == isa.Opcode.LOAD_TABLE:
        # (A core without the sum tables decodes no target: the activation table's.)
        target = fields["target"] if config.sum_tables else isa.TableTarget.ACTIVATION.value
        if target == isa.TableTarget.ACTIVATION.value:
            return _table_beats(config)
        if target in (isa.TableTarget.SUM0.value, isa.TableTarget.SUM1.value):
            return _sum_table_beats(config)
        return []           # refused by the core (BAD_FIELD): it takes no data
    return []


def data_beats(word: int, config: TPUConfig) -> int:
    """How many data beats follow instruction word ``word`` (its low 64 bits) in the host
    stream of a core with ``config``: ``count`` (READ_HOST), ``count * rows`` (LOAD_WEIGHTS),
    2 or 3 (LOAD_PARAMS, with ``column_shifts``), ``table_beats(cols)`` (LOAD_TABLE), else 0
    (an unknown opcode too). For the core's own parse the opcode must be built: a core
    without the table refuses LOAD_TABLE (UNKNOWN_OPCODE) and takes no data for it."""
    opcode, fields = decode(word)
    return len(_data_beats(opcode, fields, config))


def instructions(beats: Sequence[int], config: TPUConfig) -> list[tuple]:
    """``(opcode, fields)`` (:func:`decode`'s) of each instruction of a host stream, its
    data beats (:func:`data_beats`) skipped."""
    out, i = [], 0
    while i < len(beats):
        out.append(decode(beats[i]))
        i += 1 + data_beats(beats[i], config)
    return out


def _pack_row(values: Sequence[int], bits: int) -> int:
    mask = (1 << bits) - 1
    beat = 0
    for i, value in enumerate(values):
        beat |= (int(value) & mask) << (bits * i)
    return beat


def _unpack_row(beat: int, n: int, bits: int, signed: bool) -> list[int]:
    mask = (1 << bits) - 1
    values = [(beat >> (bits * i)) & mask for i in range(n)]
    if signed:
        values = [v - (1 << bits) if v >> (bits - 1) else v for v in values]
    return values


def _value_range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << bits) - 1


def _row_beat(kind: _Data, values, config: TPUConfig) -> int:
    """A data beat from ``values`` (fewer than the row holds are zero-padded). Raises
    AsmError (without a line number) for a value out of range or too many values."""
    n, bits = kind.size(config)
    values = np.asarray(values, dtype=object).reshape(-1)
    if len(values) > n:
        raise AsmError(f"{kind.kind} row has {len(values)} values; allowed: at most {n}")
    lo, hi = kind.value_range(config)
    for value in values:
        if not isinstance(value, int | np.integer) or not lo <= value <= hi:
            raise AsmError(f"{kind.kind} row value {value!r} is out of range; "
                           f"allowed: {lo} to {hi}, {kind.what(config)}")
    return _pack_row(values, bits)


# Assembler -----------------------------------------------------------------------------------

def _parse_int(token: str) -> int:
    try:
        return int(token, 10)
    except ValueError:
        return int(token, 0)


class _Assembler:
    def __init__(self, config: TPUConfig):
        self.config = config
        self.beats: list[int] = []
        self.expect: list[_Data] = []
        self.owner: tuple[int, str, int] | None = None   # (line, mnemonic, data lines)
        # A load_params whose .bias and .mult are in and whose next line may be .shift:
        # (its line, its word's index in beats, whether shift= was given).
        self.open_shift: tuple[int, int, bool] | None = None
        self.pending_shift: tuple[int, int, bool] | None = None   # the same, before .mult

    def error(self, lineno: int, message: str):
        raise AsmError(f"line {lineno}: {message}")

    def close_shift(self):
        """The line after a load_params's .mult is not .shift: it needed shift=."""
        if self.open_shift is None:
            return
        line, _, given = self.open_shift
        self.open_shift = None
        if not given:
            required = ", ".join(s.alias for s in _SPECS[isa.Opcode.LOAD_PARAMS]
                                 if s.kind not in ("flag", "reserved") and s.name not in DEFAULTS)
            self.error(line, f"load_params is missing field shift; required: {required} (or "
                             f"per-column shifts: a .shift line after .mult)")

    def check_done(self, lineno: int):
        if self.expect:
            line, mnemonic, total = self.owner
            got = total - len(self.expect)
            kinds = "/".join(self.expect[0].directives)
            self.error(line, f"{mnemonic} needs {total} data lines ({kinds} or .word), "
                             f"got {got} before line {lineno}; allowed: exactly {total}")

    def line(self, lineno: int, text: str):
        for mark in "#;":
            text = text.split(mark, 1)[0]
        tokens = text.replace(",", " ").split()
        if not tokens:
            return
        head, args = tokens[0].lower(), tokens[1:]
        if head != ".shift":
            self.close_shift()
        if head == ".word":
            self.word(lineno, args)
        elif head.startswith("."):
            self.data(lineno, head, args)
        else:
            self.check_done(lineno)
            self.instruction(lineno, head, args)

    def word(self, lineno: int, args: list[str]):
        limit = (1 << self.config.host_width) - 1
        if len(args) != 1:
            self.error(lineno, f".word takes 1 value, got {len(args)}; allowed: one beat, "
                               f"0 to {limit:#x}")
        try:
            value = _parse_int(args[0])
        except ValueError:
            self.error(lineno, f".word value {args[0]!r} is not a number; allowed: decimal "
                               f"or 0x hex")
        if not 0 <= value <= limit:
            self.error(lineno, f".word value {args[0]} is out of range; allowed: 0 to "
                               f"{limit:#x} (host_width={self.config.host_width} bits)")
        if self.expect:
            self.expect.pop(0)
        self.beats.append(value)
        self.data_done()

    def data(self, lineno: int, head: str, args: list[str]):
        known = (".row", ".hex", ".table", ".sums", ".bias", ".mult", ".shift", ".word")
        if head not in known:
            self.error(lineno, f"unknown directive {head!r}; allowed: {', '.join(known)}")
        if head == ".shift" and self.open_shift is not None:
            # Per-column shifts after .bias and .mult: the third beat, column_shifts set.
            line, at, given = self.open_shift
            self.open_shift = None
            if given:
                self.error(lineno, f"load_params at line {line} gives shift= and a .shift "
                                   f"line; allowed: one of them (per-column shifts replace "
                                   f"shift, which the core then ignores)")
            self.beats[at] = encode(isa.Opcode.LOAD_PARAMS,
                                    **{**decode(self.beats[at])[1], "column_shifts": 1})
            self.expect = [_Data("shift")]
            self.owner = (line, "load_params", 3)
        if not self.expect:
            if self.owner is None:
                self.error(lineno, f"{head} without an instruction that takes data; allowed: "
                                   f"data lines after read_host, load_weights, load_params, "
                                   f"load_table")
            line, mnemonic, total = self.owner
            self.error(lineno, f"unexpected {head}: {mnemonic} at line {line} takes "
                               f"{total} data lines; allowed: exactly {total}")
        kind = self.expect[0]
        if head not in kind.directives:
            mnemonic = self.owner[1]
            self.error(lineno, f"{mnemonic} expects {'/'.join(kind.directives)} here, got "
                               f"{head}; allowed: {' or '.join(kind.directives)} or .word")
        n, bits = kind.size(self.config)
        if head == ".hex":
            digits = "".join(args)
            try:
                raw = bytes.fromhex(digits)
            except ValueError:
                self.error(lineno, f".hex {digits!r} is not hex bytes; allowed: {n} bytes "
                                   f"as 2 hex digits each, element 0 first")
            if len(raw) != n:
                self.error(lineno, f".hex has {len(raw)} bytes; allowed: exactly {n} "
                                   f"bytes{kind.where()}")
            values = list(raw)
        else:
            if len(args) != n:
                self.error(lineno, f"{head} has {len(args)} values; allowed: exactly "
                                   f"{n}{kind.where()}")
            values = []
            lo, hi = kind.value_range(self.config)
            for token in args:
                try:
                    value = _parse_int(token)
                except ValueError:
                    self.error(lineno, f"{head} value {token!r} is not a number; allowed: "
                                       f"{lo} to {hi}")
                if not lo <= value <= hi:
                    self.error(lineno, f"{head} value {value} is out of range; allowed: "
                                       f"{lo} to {hi} ({kind.what(self.config)})")
                values.append(value)
        self.expect.pop(0)
        self.beats.append(_pack_row(values, bits))
        self.data_done()

    def data_done(self):
        """After the .mult of a load_params without the column_shifts flag, a .shift line
        may follow."""
        if not self.expect and self.pending_shift is not None:
            self.open_shift, self.pending_shift = self.pending_shift, None

    def instruction(self, lineno: int, mnemonic: str, args: list[str]):
        opcode = _MNEMONICS.get(mnemonic)
        if opcode is None:
            self.error(lineno, f"unknown mnemonic {mnemonic!r}; allowed: "
                               f"{', '.join(_MNEMONICS)}, .word")
        specs = _SPECS[opcode]
        fields: dict[str, int] = {}
        for arg in args:
            key, eq, text = arg.partition("=")
            spec = _lookup(opcode, key.lower())
            if spec is None:
                names = ", ".join(s.alias for s in specs if s.kind != "reserved") or "none"
                self.error(lineno, f"{mnemonic} has no field {key!r}; allowed: {names}")
            if spec.name in fields:
                self.error(lineno, f"{mnemonic} field {spec.alias} given twice; allowed: once")
            if not eq:
                if spec.kind != "flag":
                    self.error(lineno, f"{mnemonic} field {spec.alias} needs a value "
                                       f"({spec.alias}=...); allowed: {spec.allowed()}")
                fields[spec.name] = 1
                continue
            value = None
            if spec.kind == "enum":
                member = {m.name.lower(): m.value for m in spec.enum}.get(text.lower())
                value = member
            if value is None:
                try:
                    value = _parse_int(text)
                except ValueError:
                    self.error(lineno, f"{mnemonic} field {spec.alias}={text!r} is not a "
                                       f"value; allowed: {spec.allowed()}")
            lo, hi = spec.range
            if not lo <= value <= hi:
                self.error(lineno, f"{mnemonic} field {spec.alias}={text} is out of range; "
                                   f"allowed: {spec.allowed()}")
            fields[spec.name] = value
        # load_params's shift may come as a .shift line after .mult instead (checked then).
        deferred = {"shift"} if opcode == isa.Opcode.LOAD_PARAMS else set()
        if fields.get("column_shifts") and "shift" in fields:
            self.error(lineno, f"{mnemonic} gives shift= and column_shifts; allowed: one of "
                               f"them (per-column shifts replace shift, which the core then "
                               f"ignores)")
        if opcode == isa.Opcode.LOAD_PARAMS and not fields.get("column_shifts"):
            self.pending_shift = (lineno, len(self.beats), "shift" in fields)
        required = [s for s in specs if s.kind not in ("flag", "reserved")
                    and s.name not in DEFAULTS]
        missing = [s.alias for s in required if s.name not in fields | dict.fromkeys(deferred)]
        if missing:
            self.error(lineno, f"{mnemonic} is missing field{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(missing)}; required: "
                               f"{', '.join(s.alias for s in required)}")
        word = encode(opcode, **fields)
        self.beats.append(word)
        self.expect = _data_beats(opcode, decode(word)[1], self.config)
        self.owner = (lineno, mnemonic, len(self.expect))


def assemble(text: str, config: TPUConfig | None = None) -> list[int]:
    """The beats of assembly ``text``; raises :class:`AsmError` at the first problem."""
    asm = _Assembler(config if config is not None else TPUConfig())
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        asm.line(lineno, line)
    asm.check_done(len(lines) + 1)
    asm.close_shift()
    return asm.beats


# Disassembler --------------------------------------------------------------------------------

def _format_instr(opcode: isa.Opcode, fields: dict[str, int], shift_line: bool = False) -> str:
    """``shift_line``: a .shift line follows, which says column_shifts."""
    parts = [opcode.name.lower()]
    defaults, flags, reserved = [], [], []
    for spec in _SPECS[opcode]:
        value = fields[spec.name]
        if spec.name == "column_shifts" and shift_line:
            continue                     # the .shift line says it
        if spec.name == "shift" and fields.get("column_shifts") and not value:
            continue                     # replaced by the per-column shifts
        if spec.kind == "flag":
            if value:
                flags.append(spec.alias)
        elif spec.kind == "reserved":
            if value:
                reserved.append(f"{spec.name}={value:#x}")
        elif spec.name in DEFAULTS and value == DEFAULTS[spec.name]:
            continue
        else:
            text = str(value)
            if spec.kind == "enum":
                text = {m.value: m.name.lower() for m in spec.enum}.get(value, text)
            (defaults if spec.name in DEFAULTS else parts).append(f"{spec.alias}={text}")
    return " ".join(parts + defaults + flags + reserved)


def disassemble(beats: Iterable[int], config: TPUConfig | None = None) -> str:
    """Canonical assembly text of a host stream (see the module documentation). Raises
    :class:`ValueError` if the stream ends inside an instruction's data beats."""
    config = config if config is not None else TPUConfig()
    beats = [int(b) for b in beats]
    lines = []
    i = 0
    while i < len(beats):
        beat = beats[i]
        opcode, fields = decode(beat)
        if not isinstance(opcode, isa.Opcode):
            lines.append(f".word {beat:#x}")
            i += 1
            continue
        # Bits above the instruction, or a shift the assembler refuses to write beside
        # per-column shifts: a raw word, and raw words for its data beats too (the assembler
        # does not expect data after a .word).
        per_column = opcode == isa.Opcode.LOAD_PARAMS and fields["column_shifts"]
        raw = bool(beat >> isa.INSTR_BITS) or bool(per_column and fields["shift"])
        expect = _data_beats(opcode, fields, config)
        if i + 1 + len(expect) > len(beats):
            raise ValueError(f"beat {i}: the stream ends inside {opcode.name.lower()}: "
                             f"{len(beats) - i - 1} of {len(expect)} data beats")
        data_beats = beats[i + 1:i + 1 + len(expect)]
        shift_line = bool(per_column) and not raw and expect[-1].printable(data_beats[-1],
                                                                           config)
        text = _format_instr(opcode, fields, shift_line)
        lines.append(f".word {beat:#x}  # {text}" if raw else text)
        for kind, data_beat in zip(expect, data_beats, strict=True):
            n, bits = kind.size(config)
            if raw or not kind.printable(data_beat, config):
                lines.append(f".word {data_beat:#x}")
                continue
            values = _unpack_row(data_beat, n, bits, kind.signed)
            directive = kind.directives[0]
            lines.append(f"{directive} {' '.join(map(str, values))}")
        i += 1 + len(expect)
    return "".join(line + "\n" for line in lines)


# Python API ----------------------------------------------------------------------------------

class Program:
    """Builds a host stream without text: each method appends an instruction and its data
    beats to :attr:`beats` and returns the beats it appended.

    Field values are checked against their widths only (an :class:`AsmError` if one does not
    fit); whether the instruction makes sense (count 0, addresses out of range) is for the
    core to judge, so tests can build failing programs too. :attr:`instructions` counts the
    instructions the methods added (not the raw beats of :meth:`word`).
    """

    def __init__(self, config: TPUConfig | None = None):
        self.config = config if config is not None else TPUConfig()
        self.beats: list[int] = []
        self.instructions = 0

    def __len__(self) -> int:
        return len(self.beats)

    def __iter__(self):
        return iter(self.beats)

    def text(self) -> str:
        """The program as canonical assembly text."""
        return disassemble(self.beats, self.config)

    def _emit(self, beats: list[int], instructions: int = 1) -> list[int]:
        self.beats.extend(beats)
        self.instructions += instructions
        return beats

    def instr(self, opcode: isa.Opcode, **fields) -> list[int]:
        """Any instruction word (no data beats), fields by layout or short name."""
        return self._emit([encode(opcode, **fields)])

    def word(self, beat: int) -> list[int]:
        """One raw beat."""
        if not 0 <= beat < 1 << self.config.host_width:
            raise AsmError(f"beat {beat:#x} is out of range; allowed: 0 to "
                           f"{(1 << self.config.host_width) - 1:#x}")
        return self._emit([int(beat)], instructions=0)

    def nop(self) -> list[int]:
        return self.instr(isa.Opcode.NOP)

    def halt(self) -> list[int]:
        return self.instr(isa.Opcode.HALT)

    def sync(self) -> list[int]:
        return self.instr(isa.Opcode.SYNC)

    def read_counters(self) -> list[int]:
        return self.instr(isa.Opcode.READ_COUNTERS)

    def clear_counters(self) -> list[int]:
        return self.instr(isa.Opcode.CLEAR_COUNTERS)

    def read_host(self, ub: int, rows) -> list[int]:
        """READ_HOST of ``rows`` (a 2-D array of bytes -128..255, at most ``ub_row``
        columns, zero-padded) into unified-buffer rows ``ub..``."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2:
            raise AsmError(f"read_host rows must be 2-D (count, elements), got {rows.shape}")
        kind = _Data("ub")
        data_beats = [_row_beat(kind, row.tolist(), self.config) for row in rows]
        return self._emit([encode(isa.Opcode.READ_HOST, ub_addr=ub, count=len(rows))]
                          + data_beats)

    def write_host(self, ub: int, count: int) -> list[int]:
        return self.instr(isa.Opcode.WRITE_HOST, ub_addr=ub, count=count)

    def load_weights(self, tile: int, tiles, signed: bool = True) -> list[int]:
        """LOAD_WEIGHTS of ``tiles`` (``(count, rows, cols)`` or one ``(rows, cols)`` tile,
        bytes -128..255; a smaller tile is zero-padded) into tiles ``tile..``."""
        tiles = np.asarray(tiles, dtype=np.int64)
        if tiles.ndim == 2:
            tiles = tiles[None]
        rows, cols = self.config.rows, self.config.cols
        if tiles.ndim != 3 or tiles.shape[1] > rows or tiles.shape[2] > cols:
            raise AsmError(f"load_weights tiles must be (count, <= {rows}, <= {cols}), "
                           f"got {tiles.shape}")
        padded = np.zeros((len(tiles), rows, cols), dtype=np.int64)
        padded[:, :tiles.shape[1], :tiles.shape[2]] = tiles
        kind = _Data("weight", signed)
        data_beats = [_row_beat(kind, row.tolist(), self.config)
                      for t in padded for row in t]
        return self._emit([encode(isa.Opcode.LOAD_WEIGHTS, tile=tile, count=len(tiles),
                                  signed=signed)] + data_beats)

    def read_weights(self, tile: int, count: int = 1) -> list[int]:
        return self.instr(isa.Opcode.READ_WEIGHTS, tile=tile, count=count)

    def ub_to_weights(self, ub: int, tile: int, count: int, *, transpose: bool = False,
                      signed: bool = True) -> list[int]:
        """UB_TO_WEIGHTS of unified-buffer rows ``ub..ub+count-1`` into weight tile
        ``tile``: with ``transpose`` as its columns (the core takes ``count`` up to ``cols``),
        else as its rows (up to ``rows``); the rest of the tile zero. ``signed``: the tile
        holds int8, else uint8. No data beats."""
        return self.instr(isa.Opcode.UB_TO_WEIGHTS, ub_addr=ub, tile=tile, count=count,
                          transpose=transpose, signed=signed)

    def matmul(self, ub: int, acc: int, count: int, *, switch: bool = False,
               accumulate: bool = False, signed: bool = True,
               window: tuple[int, int] | None = None) -> list[int]:
        """MATMUL; ``window=(lane, step)``: the window mode, row ``i`` the ``rows`` elements
        from element ``lane + i * step`` of the buffer from row ``ub`` on."""
        lane, step = window or (0, 0)
        return self.instr(isa.Opcode.MATMUL, ub_addr=ub, acc_addr=acc, count=count,
                          switch=switch, accumulate=accumulate, signed=signed,
                          window=window is not None, lane=lane, step=step)

    def matmul_lookup(self, ub: int, acc: int, count: int, *, table: int,
                      switch: bool = False, accumulate: bool = False,
                      signed: bool = True) -> list[int]:
        """MATMUL_LOOKUP: as :meth:`matmul`, each sum replaced by its entry in sum table
        ``table`` (0 or 1)."""
        return self.instr(isa.Opcode.MATMUL_LOOKUP, ub_addr=ub, acc_addr=acc, count=count,
                          switch=switch, accumulate=accumulate, signed=signed, table=table)

    def activate(self, acc: int, ub: int, count: int, *, func=isa.Func.IDENTITY,
                 pool=isa.Pool.NONE, slot: int = 0) -> list[int]:
        return self.instr(isa.Opcode.ACTIVATE, acc_addr=acc, ub_addr=ub, count=count,
                          func=func, pool=pool, slot=slot)

    def load_params(self, slot: int, bias, multiplier, *, shift=0, zp: int = 0,
                    clamp: int = 127, rounding=isa.Rounding.HALF_UP) -> list[int]:
        """LOAD_PARAMS: ``bias`` and ``multiplier`` are up to ``cols`` int32 values each
        (zero-padded); ``zp`` and ``clamp`` int8; ``rounding`` a :class:`hdl.isa.Rounding`
        (or its value, 3 too: the core refuses it). ``shift`` (0 to 63) is one int for every
        column, or a sequence of up to ``cols`` per-column shifts (zero-padded): those set
        ``column_shifts`` and go in a third data beat, the word's ``shift`` field left 0."""
        per_column = np.ndim(shift) > 0
        word = encode(isa.Opcode.LOAD_PARAMS, slot=slot, rounding=rounding,
                      column_shifts=per_column, shift=0 if per_column else shift,
                      zero_point=zp, clamp_hi=clamp)
        beats = [word, _row_beat(_Data("bias"), np.asarray(bias).tolist(), self.config),
                 _row_beat(_Data("mult"), np.asarray(multiplier).tolist(), self.config)]
        if per_column:
            beats.append(_row_beat(_Data("shift"), np.asarray(shift).tolist(), self.config))
        return self._emit(beats)

    def load_table(self, values) -> list[int]:
        """LOAD_TABLE of the programmable table that ACTIVATE's ``func=TABLE`` reads:
        ``values`` holds its 256 entries (:data:`hdl.isa.TABLE_ENTRIES`), entry ``k`` the
        output for the requantised value ``q = k - 128``, each an int8 (-128..127) or its
        raw byte (0..255; ``bytes`` too), sent in :func:`hdl.isa.table_beats` data beats.
        Raises :class:`AsmError` (a ValueError) for another number of entries or a value
        out of range."""
        if isinstance(values, bytes | bytearray):
            values = list(values)
        entries = np.asarray(values, dtype=object)
        if entries.shape != (isa.TABLE_ENTRIES,):
            raise AsmError(f"load_table takes {isa.TABLE_ENTRIES} entries, got "
                           f"{entries.shape[0] if entries.ndim == 1 else entries.shape}; "
                           f"allowed: exactly {isa.TABLE_ENTRIES} (entry k for q = k - 128)")
        lo, hi = _value_range(DATA_BITS)
        for k, value in enumerate(entries):
            if not isinstance(value, int | np.integer):
                raise AsmError(f"load_table entry {k} = {value!r} is not an integer; "
                               f"allowed: {lo} to {hi} (a byte, int8 or uint8)")
            if not lo <= value <= hi:
                raise AsmError(f"load_table entry {k} = {value} is out of range; allowed: "
                               f"{lo} to {hi} (a byte, int8 or uint8)")
        beats = [encode(isa.Opcode.LOAD_TABLE)]
        for kind in _table_beats(self.config):
            beats.append(_pack_row(entries[kind.first:kind.first + kind.entries].tolist(),
                                   DATA_BITS))
        return self._emit(beats)

    def load_sum_table(self, table: int, values) -> list[int]:
        """LOAD_TABLE of sum table ``table`` (0 or 1) that MATMUL_LOOKUP reads: ``values``
        holds its 256 int32 entries, entry ``k`` for a sum whose low byte is ``k``, sent in
        :func:`hdl.isa.sum_table_beats` data beats. Raises :class:`AsmError` for another
        number of entries or a value out of range."""
        if table not in (0, 1):
            raise AsmError(f"load_sum_table table={table!r}; allowed: 0 or 1")
        entries = np.asarray(values, dtype=object)
        if entries.shape != (isa.TABLE_ENTRIES,):
            raise AsmError(f"load_sum_table takes {isa.TABLE_ENTRIES} entries, got "
                           f"{entries.shape[0] if entries.ndim == 1 else entries.shape}; "
                           f"allowed: exactly {isa.TABLE_ENTRIES} (entry k for a sum whose "
                           f"low byte is k)")
        lo, hi = -(1 << 31), (1 << 31) - 1
        for k, value in enumerate(entries):
            if not isinstance(value, int | np.integer) or not lo <= value <= hi:
                raise AsmError(f"load_sum_table entry {k} = {value!r} is not an int32; "
                               f"allowed: {lo} to {hi}")
        target = (isa.TableTarget.SUM0, isa.TableTarget.SUM1)[table]
        beats = [encode(isa.Opcode.LOAD_TABLE, target=target.value)]
        bits = Shape.cast(param_row_beat(self.config.cols).elem_shape).width
        for kind in _sum_table_beats(self.config):
            beats.append(_pack_row(entries[kind.first:kind.first + kind.entries].tolist(),
                                   bits))
        return self._emit(beats)


# Files and command line ----------------------------------------------------------------------

def beats_to_bytes(beats: Iterable[int], config: TPUConfig) -> bytes:
    """Beats as ``host_width / 8`` little-endian bytes each."""
    size = config.host_width // 8
    return b"".join(int(b).to_bytes(size, "little") for b in beats)


def bytes_to_beats(raw: bytes, config: TPUConfig) -> list[int]:
    size = config.host_width // 8
    if len(raw) % size:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {size}-byte beats")
    return [int.from_bytes(raw[i:i + size], "little") for i in range(0, len(raw), size)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m firmware.asm",
        description="Assemble amtpu assembly into host beats, or disassemble beats.")
    parser.add_argument("input", help="assembly text (or beats with --disassemble); - for stdin")
    parser.add_argument("-o", "--output", help="output file (default: stdout)")
    parser.add_argument("-d", "--disassemble", action="store_true",
                        help="input is beats; print canonical assembly")
    parser.add_argument("--config", default="default",
                        help="configuration preset or RxC (default: %(default)s)")
    parser.add_argument("--format", choices=("bin", "hex"), default="bin",
                        help="beat file format: little-endian binary or one hex beat a line")
    args = parser.parse_args(argv)
    config = get_config(args.config)

    def read(binary: bool):
        if args.input == "-":
            return sys.stdin.buffer.read() if binary else sys.stdin.read()
        with open(args.input, "rb" if binary else "r") as f:
            return f.read()

    def write(payload):
        if args.output is None:
            if isinstance(payload, bytes):
                sys.stdout.buffer.write(payload)
            else:
                sys.stdout.write(payload)
            return
        with open(args.output, "wb" if isinstance(payload, bytes) else "w") as f:
            f.write(payload)

    try:
        if args.disassemble:
            if args.format == "bin":
                beats = bytes_to_beats(read(True), config)
            else:
                beats = [int(line, 16) for line in read(False).split()]
            write(disassemble(beats, config))
        else:
            beats = assemble(read(False), config)
            if args.format == "bin":
                write(beats_to_bytes(beats, config))
            else:
                width = config.host_width // 4
                write("".join(f"{b:0{width}x}\n" for b in beats))
    except ValueError as error:   # AsmError, or a malformed beat file
        print(f"{args.input}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
