""":func:`hdl.isa.decode` (integer shifts, cached) equals the instruction layouts' own views,
field for field, on every opcode, on random words, on the extremes of every field and on
words whose enum fields hold no member."""

from __future__ import annotations

import enum

import numpy as np
import pytest
from amaranth.lib import data

from hdl import isa

SEED = 5151


def _by_views(word: int):
    """The fields as the layout's view reads them (what decode did before it was cut by
    shifts): the reference."""
    word &= (1 << isa.INSTR_BITS) - 1
    raw = word & ((1 << isa.Opcode.as_shape().width) - 1)
    try:
        opcode = isa.Opcode(raw)
    except ValueError:
        return raw, {}
    layout = data.Layout.cast(isa.FORMATS[opcode])
    view = layout.from_bits(word)
    fields = {}
    for name, field in layout:
        if name == "opcode":
            continue
        try:
            value = view[name]
        except ValueError:
            value = (word >> field.offset) & ((1 << field.width) - 1)
        fields[name] = value if isinstance(value, enum.Enum) else int(value)
    return opcode, fields


def _words(rng: np.random.Generator) -> list[int]:
    """Per opcode value (the unknown ones too): all zeros, all ones, random fields, and each
    field at 1, its largest value and its sign bit."""
    width = isa.Opcode.as_shape().width
    known = {opcode.value: opcode for opcode in isa.FORMATS}
    words = []
    for code in range(1 << width):
        words += [code, code | ((1 << isa.INSTR_BITS) - 1) >> width << width]
        words += [code | int(rng.integers(0, 1 << 60)) << width for _ in range(200)]
        if code in known:
            for _, field in data.Layout.cast(isa.FORMATS[known[code]]):
                for value in (1, (1 << field.width) - 1, 1 << (field.width - 1)):
                    words.append(code | value << field.offset)
    return words


def test_decode_equals_the_layout_views():
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    for word in _words(rng):
        want = _by_views(word)
        got = isa.decode(word)
        assert got == want, f"word {word:#018x}: {got} != {want}"
        assert [type(v) for v in got[1].values()] == [type(v) for v in want[1].values()]
        assert list(got[1]) == list(want[1])          # layout order
    # Bits past the instruction's are ignored, and the caller's dict is its own.
    assert isa.decode(1 << 70 | 5) == isa.decode(5)
    first = isa.decode(isa.Opcode.MATMUL.value)[1]
    first["count"] = 99
    assert isa.decode(isa.Opcode.MATMUL.value)[1]["count"] != 99


@pytest.mark.parametrize("opcode", list(isa.FORMATS))
def test_every_opcode_round_trips(opcode):
    """An instruction built from its layout decodes to its fields."""
    layout = data.Layout.cast(isa.FORMATS[opcode])
    word = layout.const({"opcode": opcode}).as_bits()
    assert isa.decode(word)[0] is opcode
