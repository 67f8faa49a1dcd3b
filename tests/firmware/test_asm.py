"""Assembler, disassembler and the Program API."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.lib import data

from firmware import asm
from firmware.asm import (
    AsmError,
    Program,
    assemble,
    data_beats,
    decode,
    disassemble,
    encode,
    field_specs,
)
from hdl import isa
from hdl.config import TPUConfig
from hdl.presets import PRESETS

SEED = 20261202
CONFIGS = [PRESETS["default"], PRESETS["tiny"], PRESETS["wide"],
           TPUConfig(rows=8, cols=4, host_width=320),   # beats wider than any row
           TPUConfig(rows=3, cols=5)]                    # LOAD_TABLE's last beat: 16 entries


def random_program(rnd: random.Random, config: TPUConfig, n: int) -> list[int]:
    """A stream of whole instructions: every opcode, random fields (reserved bits now and
    then), unknown opcodes, words with bits above 64, data beats with bits above the row."""
    beats = []
    for _ in range(n):
        choice = rnd.random()
        if choice < 0.04:
            beats.append(15 | rnd.getrandbits(60) << 4)
            continue
        opcode = rnd.choice(list(isa.Opcode))
        fields = {}
        for spec in field_specs(opcode):
            lo, hi = spec.range
            if spec.kind == "reserved" and rnd.random() < 0.8:
                continue
            if spec.name == "count" and opcode in (isa.Opcode.READ_HOST,
                                                   isa.Opcode.LOAD_WEIGHTS):
                hi = 2
            fields[spec.name] = rnd.randint(lo, hi)
        word = encode(opcode, **fields)
        if choice > 0.97:
            word |= rnd.getrandbits(config.host_width - 64) << 64
        beats.append(word)
        _, decoded = decode(word)
        n_data = {isa.Opcode.READ_HOST: decoded.get("count", 0),
                  isa.Opcode.LOAD_WEIGHTS: decoded.get("count", 0) * config.rows,
                  isa.Opcode.LOAD_PARAMS: 2 + decoded.get("column_shifts", 0),
                  isa.Opcode.LOAD_TABLE: data_beats(word, config)}.get(opcode, 0)
        per_beat = 4 * config.cols if decoded.get("target") == 0 else config.cols
        row_bits = {isa.Opcode.READ_HOST: 8 * config.ub_row,
                    isa.Opcode.LOAD_WEIGHTS: 8 * config.cols}.get(opcode, 32 * config.cols)
        for i in range(n_data):
            if opcode == isa.Opcode.LOAD_TABLE and i == n_data - 1:   # up to entry 255
                row_bits = (256 - per_beat * i) * (8 if per_beat > config.cols else 32)
            bits = config.host_width if rnd.random() < 0.05 else row_bits
            beats.append(rnd.getrandbits(bits))
    return beats


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.name}-{c.host_width}")
def test_round_trip_random_programs(config):
    print(f"seed {SEED}")
    rnd = random.Random(f"{SEED}-{config.name}-{config.host_width}")
    for _ in range(10):
        beats = random_program(rnd, config, 40)
        text = disassemble(beats, config)
        assert assemble(text, config) == beats
        assert disassemble(assemble(text, config), config) == text


def test_every_opcode_and_field_is_packed_by_its_layout():
    for opcode, layout in isa.FORMATS.items():
        shape = data.Layout.cast(layout)
        for spec in field_specs(opcode):
            lo, hi = spec.range
            for value in (lo, hi):
                word = encode(opcode, **{spec.name: value})
                assert word & 0xF == opcode.value
                raw = (word >> shape[spec.name].offset) & ((1 << spec.width) - 1)
                assert raw == value & ((1 << spec.width) - 1)
                assert decode(word) == (opcode, {s.name: value if s.name == spec.name else 0
                                                 for s in field_specs(opcode)})


EXAMPLE = """\
# comments with '#' or ';'
read_host ub=0 count=2        ; two rows
.row 1 2 3 4 5 6 7 -8
.hex 01 02 03 04 05 06 07 f8
load_weights tile=3 count=1 signed
.row -128 127 0 0 0 0 0 1
.row 0 0 0 0 0 0 0 0
.hex 0000000000000000
.row 0 0 0 0 0 0 0 0
.row 0 0 0 0 0 0 0 0
.row 0 0 0 0 0 0 0 0
.row 0 0 0 0 0 0 0 0
.row 255 0 0 0 0 0 0 0
read_weights tile=3 count=1
load_params slot=0 shift=12 zp=-3 clamp=127
.bias 1 -2 0 0 0 0 0 2147483647
.mult 0xffffffff 0 0 0 0 0 0 -2147483648
matmul ub=0 acc=16 count=64 switch accumulate signed
activate acc=0 ub=128 count=64 func=relu pool=max2 slot=0
write_host ub=128 count=32
read_counters
clear_counters
sync
nop
halt
"""


def test_example_program():
    p = Program(PRESETS["default"])
    p.read_host(0, [[1, 2, 3, 4, 5, 6, 7, -8], [1, 2, 3, 4, 5, 6, 7, 248]])
    tile = np.zeros((8, 8), dtype=np.int64)
    tile[0] = [-128, 127, 0, 0, 0, 0, 0, 1]
    tile[7, 0] = -1
    p.load_weights(3, tile)
    p.read_weights(3)
    p.load_params(0, [1, -2, 0, 0, 0, 0, 0, 2**31 - 1], [-1, 0, 0, 0, 0, 0, 0, -2**31],
                  shift=12, zp=-3, clamp=127)
    p.matmul(0, 16, 64, switch=True, accumulate=True)
    p.activate(0, 128, 64, func=isa.Func.RELU, pool=isa.Pool.MAX2, slot=0)
    p.write_host(128, 32)
    p.read_counters()
    p.clear_counters()
    p.sync()
    p.nop()
    p.halt()
    assert assemble(EXAMPLE) == p.beats
    assert p.instructions == 12
    matmul = data.Layout.cast(isa.Matmul).const({
        "opcode": isa.Opcode.MATMUL, "ub_addr": 0, "acc_addr": 16, "count": 64,
        "switch": 1, "accumulate": 1, "signed": 1}).as_bits()
    assert matmul in p.beats
    text = p.text()
    assert "matmul ub=0 acc=16 count=64 accumulate switch signed\n" in text
    assert "activate acc=0 ub=128 count=64 func=relu pool=max2 slot=0\n" in text
    assert "load_params slot=0 shift=12 zp=-3 clamp=127\n" in text
    assert ".bias 1 -2 0 0 0 0 0 2147483647\n.mult -1 0 0 0 0 0 0 -2147483648\n" in text
    assert ".row -128 127 0 0 0 0 0 1\n" in text           # signed tile: int8
    assert assemble(text) == p.beats


ROUNDING_EXAMPLE = """\
load_params slot=0 shift=12 zp=-3 clamp=127
.bias 0 0 0 0 0 0 0 0
.mult 1 1 1 1 1 1 1 1
load_params slot=1 shift=31 zp=0 clamp=127 rounding=half_even
.bias 0 0 0 0 0 0 0 0
.mult 1 1 1 1 1 1 1 1
load_params slot=2 zp=5 clamp=-1 rounding=double
.bias 1 2 3 4 5 6 7 8
.mult -2147483648 2147483647 0 0 0 0 0 1
.shift 0 31 32 62 63 1 2 3
load_params slot=3 zp=0 clamp=0
.bias 0 0 0 0 0 0 0 0
.mult 0 0 0 0 0 0 0 0
.shift 7 7 7 7 7 7 7 7
halt
"""


def test_rounding_and_per_column_shifts():
    """``rounding=`` defaults to half_up and prints only when it is not; a ``.shift`` line
    after ``.mult`` sets column_shifts and is the third beat (shift 0 in the word); the
    builder's per-column ``shift`` gives the same beats; canonical text round-trips."""
    config = PRESETS["default"]
    p = Program(config)
    p.load_params(0, [0] * 8, [1] * 8, shift=12, zp=-3, clamp=127)
    p.load_params(1, [0] * 8, [1] * 8, shift=31, zp=0, rounding=isa.Rounding.HALF_EVEN)
    p.load_params(2, [1, 2, 3, 4, 5, 6, 7, 8], [-2**31, 2**31 - 1, 0, 0, 0, 0, 0, 1],
                  shift=np.array([0, 31, 32, 62, 63, 1, 2, 3]), zp=5, clamp=-1,
                  rounding=isa.Rounding.DOUBLE)
    p.load_params(3, [], [], shift=[7] * 8, zp=0, clamp=0)
    p.halt()
    beats = assemble(ROUNDING_EXAMPLE, config)
    assert beats == p.beats
    assert len(beats) == 1 + 3 + 3 + 4 + 4
    assert p.text() == ROUNDING_EXAMPLE
    fields = decode(beats[6])[1]
    assert (fields["rounding"], fields["column_shifts"], fields["shift"]) == (2, 1, 0)
    assert decode(beats[3])[1]["rounding"] == isa.Rounding.HALF_EVEN.value
    assert decode(beats[0])[1]["rounding"] == isa.Rounding.HALF_UP.value
    assert beats[9] == sum(s << (32 * j) for j, s in enumerate([0, 31, 32, 62, 63, 1, 2, 3]))
    # The flag may be written too; the layout name and a number for rounding as well.
    assert assemble("load_params slot=2 zp=5 clamp=-1 rounding=2 column_shifts\n"
                    + "\n".join(ROUNDING_EXAMPLE.splitlines()[7:10]) + "\n", config) == \
        beats[6:10]
    # A short per-column row is zero-padded, like bias and multiplier.
    short = Program(config).load_params(0, [], [], shift=[5, 6])
    assert short[3] == 5 | 6 << 32


def test_per_column_shift_words_the_text_cannot_write():
    """column_shifts with a non-zero shift field (the core ignores it; the assembler refuses
    to write both) comes out as raw words; a shift beat with bits set beyond the six shift
    bits of a lane as the flag and a .word; rounding=3 (the core refuses it) as a number.
    All assemble back to the same beats."""
    config = PRESETS["tiny"]                                   # 2 columns, host_width 64
    odd = encode(isa.Opcode.LOAD_PARAMS, slot=1, column_shifts=1, shift=9)
    text = disassemble([odd, 1, 2, 3], config)
    assert text.splitlines() == [
        f".word {odd:#x}  # load_params slot=1 shift=9 zp=0 clamp=0 column_shifts",
        ".word 0x1", ".word 0x2", ".word 0x3"]
    assert assemble(text, config) == [odd, 1, 2, 3]
    word = encode(isa.Opcode.LOAD_PARAMS, slot=1, column_shifts=1, rounding=3)
    junk = 5 | 1 << 6 | 63 << 32                                # bit 6 of lane 0 set
    text = disassemble([word, 0, 0, junk], config)
    assert text.splitlines() == ["load_params slot=1 zp=0 clamp=0 rounding=3 column_shifts",
                                 ".bias 0 0", ".mult 0 0", f".word {junk:#x}"]
    assert assemble(text, config) == [word, 0, 0, junk]
    assert disassemble([word, 0, 0, 5 | 63 << 32], config).splitlines() == [
        "load_params slot=1 zp=0 clamp=0 rounding=3", ".bias 0 0", ".mult 0 0", ".shift 5 63"]


def test_per_column_shift_errors():
    p = Program(PRESETS["tiny"])
    with pytest.raises(AsmError, match=r"^shift row value 64 is out of range; allowed: 0 to 63, "
                                       r"a per-column shift$"):
        p.load_params(0, [0], [0], shift=[1, 64])
    with pytest.raises(AsmError, match=r"^shift row value -1 is out of range; allowed: 0 to 63"):
        p.load_params(0, [0], [0], shift=np.array([-1]))
    with pytest.raises(AsmError, match=r"^shift row has 3 values; allowed: at most 2$"):
        p.load_params(0, [0], [0], shift=[1, 2, 3])
    with pytest.raises(AsmError, match=r"^load_params field shift=64 is out of range; "
                                       r"allowed: 0 to 63 \(6 bits\)$"):
        p.load_params(0, [0], [0], shift=64)
    with pytest.raises(AsmError, match=r"^load_params field rounding=4 is out of range; "
                                       r"allowed: half_up, half_even, double or 0 to 3 "
                                       r"\(2 bits\)$"):
        p.load_params(0, [0], [0], rounding=4)
    assert p.beats == [] and p.instructions == 0


def test_layout_names_flag_values_and_numbers():
    a = assemble("matmul ub_addr=0x10 acc_addr=3 count=1 signed=1 switch=0\n"
                 "load_params slot=1 shift=0x3f zero_point=-1 clamp_hi=-128\n"
                 ".bias 0 0 0 0 0 0 0 0\n.mult 0 0 0 0 0 0 0 0\n"
                 "activate acc=0 ub=0 count=007 func=3 pool=MAX4 slot=0 _flags=5\n"
                 "LOAD_WEIGHTS tile=0 count=0\n")
    assert decode(a[0]) == (isa.Opcode.MATMUL, {
        "accumulate": 0, "switch": 0, "signed": 1, "window": 0, "ub_addr": 16, "acc_addr": 3,
        "count": 1, "lane": 0, "step": 0})
    assert decode(a[1])[1] == {"_flags": 0, "slot": 1, "rounding": 0, "column_shifts": 0,
                               "_pad": 0, "shift": 63, "_pad2": 0, "zero_point": -1,
                               "clamp_hi": -128, "_pad3": 0}
    assert decode(a[4])[1] == {"_flags": 5, "acc_addr": 0, "ub_addr": 0, "count": 7,
                               "func": 3, "pool": 2, "slot": 0}
    assert len(a) == 6


def test_unsigned_tile_rows_print_as_uint8():
    p = Program(PRESETS["tiny"])
    p.load_weights(0, [[255, 0], [128, 1]], signed=False)
    assert p.text() == "load_weights tile=0 count=1\n.row 255 0\n.row 128 1\n"


def test_raw_words():
    config = PRESETS["tiny"]                      # host_width 64: instructions only
    beats = [0xF, encode(isa.Opcode.READ_HOST, ub_addr=1, count=1), 0xFFFF_FFFF_FFFF_0000]
    text = disassemble(beats, config)
    assert text == ".word 0xf\nread_host ub=1 count=1\n.word 0xffffffffffff0000\n"
    assert assemble(text, config) == beats
    wide = PRESETS["default"]
    word = encode(isa.Opcode.LOAD_PARAMS, slot=1) | 1 << 100
    text = disassemble([word, 1, 2], wide)
    assert text.splitlines() == [
        f".word {word:#x}  # load_params slot=1 shift=0 zp=0 clamp=0", ".word 0x1", ".word 0x2"]
    assert assemble(text, wide) == [word, 1, 2]


def test_truncated_stream_cannot_be_disassembled():
    beats = Program().read_host(0, np.zeros((3, 8), dtype=np.int64))
    with pytest.raises(ValueError, match=r"beat 0: the stream ends inside read_host: 2 of 3"):
        disassemble(beats[:3])


ERRORS = [
    ("matmull ub=0", "line 1: unknown mnemonic 'matmull'; allowed: nop, halt, sync, "
     "read_host, write_host, load_weights, read_weights, matmul, activate, load_params, "
     "read_counters, clear_counters, ub_to_weights, load_table, matmul_lookup, .word"),
    ("ub_to_weights tile=0 count=1", "line 1: ub_to_weights is missing field ub; required: "
     "ub, tile, count"),
    ("ub_to_weights ub=0 tile=0 count=1 switch", "line 1: ub_to_weights has no field "
     "'switch'; allowed: signed, transpose, ub, tile, count"),
    ("ub_to_weights ub=0 tile=0 count=1 transpose=2", "line 1: ub_to_weights field "
     "transpose=2 is out of range; allowed: 0 to 1 (1 bits)"),
    ("ub_to_weights ub=0 tile=0x10000 count=1", "line 1: ub_to_weights field tile=0x10000 "
     "is out of range; allowed: 0 to 65535 (16 bits)"),
    ("ub_to_weights ub=0 tile=0 count=1\n.row 1 2 3 4 5 6 7 8", "line 2: unexpected .row: "
     "ub_to_weights at line 1 takes 0 data lines; allowed: exactly 0"),
    ("nop\nmatmul ub=0 acc=0 count=1 swtch", "line 2: matmul has no field 'swtch'; allowed: "
     "accumulate, switch, signed, window, ub, acc, count, lane, step"),
    ("halt x=1", "line 1: halt has no field 'x'; allowed: none"),
    ("matmul ub=0 count=1", "line 1: matmul is missing field acc; required: ub, acc, count"),
    ("activate count=1", "line 1: activate is missing fields acc, ub, func, pool, slot; "
     "required: acc, ub, count, func, pool, slot"),
    ("write_host ub=0 ub=1 count=1", "line 1: write_host field ub given twice; allowed: once"),
    ("write_host ub count=1", "line 1: write_host field ub needs a value (ub=...); "
     "allowed: 0 to 65535 (16 bits)"),
    ("write_host ub=65536 count=1", "line 1: write_host field ub=65536 is out of range; "
     "allowed: 0 to 65535 (16 bits)"),
    ("write_host ub=-1 count=1", "line 1: write_host field ub=-1 is out of range; "
     "allowed: 0 to 65535 (16 bits)"),
    ("read_weights tile=zero count=1", "line 1: read_weights field tile='zero' is not a "
     "value; allowed: 0 to 65535 (16 bits)"),
    ("load_params slot=8 shift=0 zp=0 clamp=0", "line 1: load_params field slot=8 is out "
     "of range; allowed: 0 to 7 (3 bits)"),
    ("load_params slot=0 shift=64 zp=0 clamp=0", "line 1: load_params field shift=64 is out "
     "of range; allowed: 0 to 63 (6 bits)"),
    ("load_params slot=0 shift=0 zp=128 clamp=0", "line 1: load_params field zp=128 is out "
     "of range; allowed: -128 to 127 (8 bits)"),
    ("matmul ub=0 acc=0 count=1 signed=2", "line 1: matmul field signed=2 is out of range; "
     "allowed: 0 to 1 (1 bits)"),
    ("activate acc=0 ub=0 count=1 func=gelu pool=none slot=0", "line 1: activate field "
     "func='gelu' is not a value; allowed: identity, relu, clamp, sigmoid, tanh, table, "
     "normalise or 0 to 7 (3 bits)"),
    ("activate acc=0 ub=0 count=1 func=relu pool=4 slot=0", "line 1: activate field pool=4 "
     "is out of range; allowed: none, max2, max4 or 0 to 3 (2 bits)"),
    ("read_host ub=0 count=2\n.row 1 2 3 4 5 6 7 8\nhalt", "line 1: read_host needs 2 data "
     "lines (.row/.hex or .word), got 1 before line 3; allowed: exactly 2"),
    ("read_host ub=0 count=1\n.row 1 2 3 4 5 6 7 8", None),
    ("read_host ub=0 count=1\n.row 1 2 3 4 5 6 7 8\n.row 1 2 3 4 5 6 7 8", "line 3: "
     "unexpected .row: read_host at line 1 takes 1 data lines; allowed: exactly 1"),
    ("load_weights tile=0 count=1\n.row 0 0 0 0 0 0 0 0", "line 1: load_weights needs 8 "
     "data lines (.row/.hex or .word), got 1 before line 3; allowed: exactly 8"),
    (".row 1 2", "line 1: .row without an instruction that takes data; allowed: data lines "
     "after read_host, load_weights, load_params, load_table"),
    ("read_host ub=0 count=1\n.row 1 2 3", "line 2: .row has 3 values; allowed: exactly 8"),
    ("read_host ub=0 count=1\n.row 1 2 3 4 5 6 7 256", "line 2: .row value 256 is out of "
     "range; allowed: -128 to 255 (a byte, int8 or uint8)"),
    ("read_host ub=0 count=1\n.row 1 2 3 4 5 6 7 -129", "line 2: .row value -129 is out of "
     "range; allowed: -128 to 255 (a byte, int8 or uint8)"),
    ("read_host ub=0 count=1\n.row 1 2 3 4 5 6 7 x", "line 2: .row value 'x' is not a "
     "number; allowed: -128 to 255"),
    ("read_host ub=0 count=1\n.hex 0102", "line 2: .hex has 2 bytes; allowed: exactly 8 bytes"),
    ("read_host ub=0 count=1\n.hex 01020304050607zz", "line 2: .hex '01020304050607zz' is "
     "not hex bytes; allowed: 8 bytes as 2 hex digits each, element 0 first"),
    ("read_host ub=0 count=1\n.bias 0 0 0 0 0 0 0 0", "line 2: read_host expects .row/.hex "
     "here, got .bias; allowed: .row or .hex or .word"),
    ("load_params slot=0 shift=0 zp=0 clamp=0\n.mult 0 0 0 0 0 0 0 0", "line 2: load_params "
     "expects .bias here, got .mult; allowed: .bias or .word"),
    ("load_params slot=0 shift=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 4294967296", "line 2: "
     ".bias value 4294967296 is out of range; allowed: -2147483648 to 4294967295 (int32 or "
     "uint32)"),
    ("load_params slot=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n.mult 0 0 0 0 0 0 0 0\nhalt",
     "line 1: load_params is missing field shift; required: slot, shift, zp, clamp (or "
     "per-column shifts: a .shift line after .mult)"),
    ("load_params slot=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n.mult 0 0 0 0 0 0 0 0",
     "line 1: load_params is missing field shift; required: slot, shift, zp, clamp (or "
     "per-column shifts: a .shift line after .mult)"),
    ("load_params slot=0 zp=0\n.bias 0 0 0 0 0 0 0 0", "line 1: load_params is missing "
     "field clamp; required: slot, shift, zp, clamp"),
    ("load_params slot=0 shift=3 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n"
     ".mult 0 0 0 0 0 0 0 0\n.shift 1 1 1 1 1 1 1 1", "line 4: load_params at line 1 gives "
     "shift= and a .shift line; allowed: one of them (per-column shifts replace shift, which "
     "the core then ignores)"),
    ("load_params slot=0 shift=3 zp=0 clamp=0 column_shifts", "line 1: load_params gives "
     "shift= and column_shifts; allowed: one of them (per-column shifts replace shift, which "
     "the core then ignores)"),
    ("load_params slot=0 zp=0 clamp=0 column_shifts\n.bias 0 0 0 0 0 0 0 0\n"
     ".mult 0 0 0 0 0 0 0 0\nhalt", "line 1: load_params needs 3 data lines (.shift or "
     ".word), got 2 before line 4; allowed: exactly 3"),
    ("load_params slot=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n.shift 1 1 1 1 1 1 1 1",
     "line 3: load_params expects .mult here, got .shift; allowed: .mult or .word"),
    ("load_params slot=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n.mult 0 0 0 0 0 0 0 0\n"
     ".shift 1 1 1 1 1 1 1 64", "line 4: .shift value 64 is out of range; allowed: 0 to 63 "
     "(a per-column shift)"),
    ("load_params slot=0 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n.mult 0 0 0 0 0 0 0 0\n"
     ".shift 1 1 1", "line 4: .shift has 3 values; allowed: exactly 8"),
    ("load_params slot=0 shift=1 zp=0 clamp=0\n.bias 0 0 0 0 0 0 0 0\n"
     ".mult 0 0 0 0 0 0 0 0\nhalt\n.shift 1 1 1 1 1 1 1 1", "line 5: unexpected .shift: "
     "halt at line 4 takes 0 data lines; allowed: exactly 0"),
    (".shift 1", "line 1: .shift without an instruction that takes data; allowed: data lines "
     "after read_host, load_weights, load_params, load_table"),
    ("load_params slot=0 shift=1 zp=0 clamp=0 rounding=nearest", "line 1: load_params field "
     "rounding='nearest' is not a value; allowed: half_up, half_even, double or 0 to 3 "
     "(2 bits)"),
    ("load_params slot=0 shift=1 zp=0 clamp=0 rounding=4", "line 1: load_params field "
     "rounding=4 is out of range; allowed: half_up, half_even, double or 0 to 3 (2 bits)"),
    (".rows 1", "line 1: unknown directive '.rows'; allowed: .row, .hex, .table, .sums, "
     ".bias, .mult, .shift, .word"),
    (".word 1 2", "line 1: .word takes 1 value, got 2; allowed: one beat, 0 to "
     "0xffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"),
    (".word -1", "line 1: .word value -1 is out of range; allowed: 0 to "
     "0xffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff "
     "(host_width=256 bits)"),
    (".word one", "line 1: .word value 'one' is not a number; allowed: decimal or 0x hex"),
]


@pytest.mark.parametrize("text, message", ERRORS)
def test_error_messages(text, message):
    if message is None:
        assemble(text)
        return
    with pytest.raises(AsmError) as info:
        assemble(text)
    assert str(info.value) == message


UB_TO_WEIGHTS_TEXT = """\
ub_to_weights ub=128 tile=1 count=8 transpose signed
ub_to_weights ub_addr=0x10 tile=63 count=1
ub_to_weights ub=65535 tile=65535 count=65535 signed=0 transpose=1 _flags=3
ub_to_weights ub=0 tile=0 count=9 transpose=0 signed=1   # past the tile: the core's check
"""


def test_ub_to_weights_text_and_builder():
    """Text (flags bare or as name=0/1, layout names, reserved bits) and the builder give the
    same words, with the fields where the layout puts them; canonical text round-trips and
    no data lines follow. Counts past the tile assemble: the core judges them
    (BAD_FIELD)."""
    config = PRESETS["wide"]
    beats = assemble(UB_TO_WEIGHTS_TEXT, config)
    p = Program(config)
    assert p.ub_to_weights(128, 1, 8, transpose=True) == beats[:1]
    p.ub_to_weights(0x10, 63, 1, signed=False)
    p.ub_to_weights(65535, 65535, 65535, transpose=True, signed=False)
    p.ub_to_weights(0, 0, 9)
    assert p.beats[:2] == beats[:2] and p.beats[3] == beats[3]
    assert beats[2] == p.beats[2] | 3 << 6                      # the reserved bits
    assert p.instructions == 4 and len(beats) == 4
    layout = data.Layout.cast(isa.UbToWeights)
    view = layout.from_bits(beats[0])
    assert (view.opcode, view.signed, view.transpose, view.ub_addr, view.tile, view.count) == \
        (isa.Opcode.UB_TO_WEIGHTS, 1, 1, 128, 1, 8)
    assert beats[0] == 12 | 1 << 4 | 1 << 5 | 128 << 8 | 1 << 24 | 8 << 40
    assert decode(beats[1]) == (isa.Opcode.UB_TO_WEIGHTS, {
        "signed": 0, "transpose": 0, "_flags": 0, "ub_addr": 16, "tile": 63, "count": 1,
        "_c": 0})
    text = disassemble(beats, config)
    assert text.splitlines() == [
        "ub_to_weights ub=128 tile=1 count=8 signed transpose",
        "ub_to_weights ub=16 tile=63 count=1",
        "ub_to_weights ub=65535 tile=65535 count=65535 transpose _flags=0x3",
        "ub_to_weights ub=0 tile=0 count=9 signed"]
    assert assemble(text, config) == beats
    assert p.text() == text.replace(" _flags=0x3", "")
    # No data beats: the next beat is the next instruction.
    mixed = Program(config)
    mixed.ub_to_weights(0, 0, 4)
    mixed.read_weights(0)
    mixed.halt()
    assert disassemble(mixed.beats, config).splitlines() == [
        "ub_to_weights ub=0 tile=0 count=4 signed", "read_weights tile=0 count=1", "halt"]


def _table_text(config: TPUConfig, table) -> str:
    """load_table and its .table lines, ``4 * cols`` entries each, written out here."""
    per_beat = 4 * config.cols
    lines = ["load_table"] + [".table " + " ".join(map(str, table[i:i + per_beat]))
                              for i in range(0, 256, per_beat)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("cols", [1, 2, 3, 5, 8, 64, 100])
def test_load_table_text_and_builder(cols):
    """The builder and the text give the same beats: the word, then ``table_beats(cols)``
    beats of ``4 * cols`` entries (entry 0 in the low byte), the last only up to entry 255
    (one beat for 64 columns and more); raw bytes and int8 values give the same beats; the
    disassembler prints the entries as int8 and its text assembles back."""
    config = TPUConfig(rows=2, cols=cols)
    raw = [(k * 29 + 3) % 256 for k in range(256)]
    raw[0], raw[255], raw[128] = 0x80, 0xFF, 0x7F
    int8 = [v - 256 if v >= 128 else v for v in raw]
    p = Program(config)
    beats = p.load_table(raw)
    assert p.instructions == 1 and beats == p.beats
    assert Program(config).load_table(int8) == beats
    assert Program(config).load_table(np.array(int8, dtype=np.int8)) == beats
    assert Program(config).load_table(bytes(raw)) == beats
    n = isa.table_beats(cols)
    assert len(beats) == 1 + n
    assert beats[0] == encode(isa.Opcode.LOAD_TABLE) == isa.Opcode.LOAD_TABLE.value
    per_beat = 4 * cols
    for b, beat in enumerate(beats[1:]):
        assert beat == int.from_bytes(bytes(raw[b * per_beat:(b + 1) * per_beat]), "little")
    assert beats[-1] >> (8 * (256 - (n - 1) * per_beat)) == 0
    text = _table_text(config, int8)
    assert p.text() == text
    assert assemble(text, config) == beats
    assert assemble(_table_text(config, raw), config) == beats
    hex_text = "load_table\n" + "".join(
        ".hex " + bytes(raw[i:i + per_beat]).hex() + "\n" for i in range(0, 256, per_beat))
    assert assemble(hex_text, config) == beats
    assert asm.data_beats(beats[0], config) == n


def test_load_table_in_a_program():
    """LOAD_TABLE between other instructions (5 columns: 13 beats, the last of 16 entries),
    ``func=table`` by name or number; a last beat with bits set past entry 255 comes out
    as a ``.word`` and assembles back."""
    config = TPUConfig(rows=3, cols=5)
    table = list(range(-128, 128))
    p = Program(config)
    p.load_params(0, [0] * 5, [1] * 5, shift=0)
    p.load_table(table)
    p.activate(0, 8, 4, func=isa.Func.TABLE, pool=isa.Pool.MAX2)
    p.halt()
    text = p.text()
    lines = text.splitlines()
    assert lines[3] == "load_table"
    assert lines[4] == ".table " + " ".join(map(str, range(-128, -108)))
    assert lines[16] == ".table " + " ".join(map(str, range(112, 128)))
    assert lines[17:] == ["activate acc=0 ub=8 count=4 func=table pool=max2 slot=0", "halt"]
    assert assemble(text, config) == p.beats
    assert assemble(text.replace("func=table", "func=5"), config) == p.beats
    beats = list(p.beats)
    beats[16] |= 1 << 128                               # past entry 255
    odd = disassemble(beats, config)
    assert odd.splitlines()[16] == f".word {beats[16]:#x}"
    assert assemble(odd, config) == beats


def test_activate_normalise_round_trip():
    """ACTIVATE's function NORMALISE (6) is ``func=normalise`` in text, by name or number,
    through pooling and every slot; the word is the one Program.activate encodes; 7, no
    function, disassembles as a number and assembles back."""
    config = PRESETS["default"]
    p = Program(config)
    p.activate(3, 200, 8, func=isa.Func.NORMALISE, pool=isa.Pool.MAX4, slot=3)
    p.activate(0, 0, 1, func=isa.Func.NORMALISE)
    p.halt()
    text = p.text()
    assert text.splitlines() == [
        "activate acc=3 ub=200 count=8 func=normalise pool=max4 slot=3",
        "activate acc=0 ub=0 count=1 func=normalise pool=none slot=0",
        "halt"]
    assert assemble(text, config) == p.beats
    assert assemble(text.replace("func=normalise", "func=6"), config) == p.beats
    assert assemble(text.replace("func=normalise", "func=NORMALISE"), config) == p.beats
    assert decode(p.beats[0]) == (isa.Opcode.ACTIVATE, {
        "_flags": 0, "acc_addr": 3, "ub_addr": 200, "count": 8, "func": 6, "pool": 2,
        "slot": 3})
    assert p.beats[0] == encode(isa.Opcode.ACTIVATE, acc_addr=3, ub_addr=200, count=8,
                                func=6, pool=2, slot=3)
    seven = [encode(isa.Opcode.ACTIVATE, count=1, func=7)]
    assert disassemble(seven, config) == \
        "activate acc=0 ub=0 count=1 func=7 pool=none slot=0\n"
    assert assemble(disassemble(seven, config), config) == seven


LOAD_TABLE_ERRORS = [
    ("load_table\n.table 1 2 3", "line 2: .table has 3 values; allowed: exactly 32 (table "
     "entries 0 to 31)"),
    ("load_table\n.table " + "0 " * 32 + "\n.table " + "0 " * 31 + "256", "line 3: .table "
     "value 256 is out of range; allowed: -128 to 255 (a byte, int8 or uint8)"),
    ("load_table\n" + (".table " + "0 " * 32 + "\n") * 7 + ".table " + "0 " * 31 + "-129",
     "line 9: .table value -129 is out of range; allowed: -128 to 255 (a byte, int8 or "
     "uint8)"),
    ("load_table\n" + (".table " + "0 " * 32 + "\n") * 7 + ".hex 00", "line 9: .hex has 1 "
     "bytes; allowed: exactly 32 bytes (table entries 224 to 255)"),
    ("load_table\n" + (".table " + "0 " * 32 + "\n") * 3 + "halt", "line 1: load_table "
     "needs 8 data lines (.table/.hex or .word), got 3 before line 5; allowed: exactly 8"),
    ("load_table\n" + (".table " + "0 " * 32 + "\n") * 9, "line 10: unexpected .table: "
     "load_table at line 1 takes 8 data lines; allowed: exactly 8"),
    ("load_table\n.row " + "0 " * 32, "line 2: load_table expects .table/.hex here, got "
     ".row; allowed: .table or .hex or .word"),
    ("read_host ub=0 count=1\n.table 1 2 3 4 5 6 7 8", "line 2: read_host expects .row/.hex "
     "here, got .table; allowed: .row or .hex or .word"),
    (".table 1", "line 1: .table without an instruction that takes data; allowed: data lines "
     "after read_host, load_weights, load_params, load_table"),
    ("load_table slot=0", "line 1: load_table has no field 'slot'; allowed: target"),
]


@pytest.mark.parametrize("text, message", LOAD_TABLE_ERRORS)
def test_load_table_error_messages(text, message):
    with pytest.raises(AsmError) as info:
        assemble(text)
    assert str(info.value) == message


def test_load_table_odd_columns_error_says_the_entries():
    """With 5 columns the last line holds entries 240 to 255: 16 values, and the message
    says so."""
    config = TPUConfig(rows=3, cols=5)
    text = "load_table\n" + (".table " + "0 " * 20 + "\n") * 12 + ".table " + "0 " * 20
    with pytest.raises(AsmError, match=r"^line 14: \.table has 20 values; allowed: exactly "
                                       r"16 \(table entries 240 to 255\)$"):
        assemble(text, config)


@pytest.mark.parametrize("values, message", [
    (list(range(255)), r"^load_table takes 256 entries, got 255; allowed: exactly 256 "
                       r"\(entry k for q = k - 128\)$"),
    (list(range(257)), r"^load_table takes 256 entries, got 257; allowed: exactly 256"),
    ([], r"^load_table takes 256 entries, got 0; allowed"),
    (np.zeros((16, 16), dtype=np.int64), r"^load_table takes 256 entries, got \(16, 16\); "
                                         r"allowed: exactly 256"),
    ([0] * 100 + [256] + [0] * 155, r"^load_table entry 100 = 256 is out of range; allowed: "
                                    r"-128 to 255 \(a byte, int8 or uint8\)$"),
    ([-129] + [0] * 255, r"^load_table entry 0 = -129 is out of range; allowed: -128 to 255"),
    ([0] * 255 + [0.5], r"^load_table entry 255 = 0.5 is not an integer; allowed: -128 to "
                        r"255 \(a byte, int8 or uint8\)$"),
])
def test_load_table_builder_errors(values, message):
    p = Program(PRESETS["tiny"])
    with pytest.raises(AsmError, match=message):
        p.load_table(values)
    with pytest.raises(ValueError):
        p.load_table(values)
    assert p.beats == [] and p.instructions == 0


def test_data_beats():
    """How many data beats follow each instruction: the count the assembler expects."""
    config = TPUConfig(rows=4, cols=3)
    assert asm.data_beats(encode(isa.Opcode.READ_HOST, count=5), config) == 5
    assert asm.data_beats(encode(isa.Opcode.LOAD_WEIGHTS, count=2), config) == 8
    assert asm.data_beats(encode(isa.Opcode.LOAD_PARAMS), config) == 2
    assert asm.data_beats(encode(isa.Opcode.LOAD_PARAMS, column_shifts=1), config) == 3
    assert asm.data_beats(encode(isa.Opcode.LOAD_TABLE), config) == 22
    assert asm.data_beats(encode(isa.Opcode.LOAD_TABLE), TPUConfig(rows=2, cols=1)) == 64
    assert asm.data_beats(encode(isa.Opcode.UB_TO_WEIGHTS, count=3), config) == 0
    assert asm.data_beats(14, config) == asm.data_beats(encode(isa.Opcode.HALT), config) == 0


def test_program_api_errors():
    p = Program(PRESETS["tiny"])
    with pytest.raises(AsmError, match=r"matmul field count=65536 is out of range"):
        p.matmul(0, 0, 65536)
    with pytest.raises(AsmError, match=r"matmul has no field 'bogus'"):
        p.instr(isa.Opcode.MATMUL, bogus=1)
    with pytest.raises(AsmError, match=r"ub row value 256 is out of range"):
        p.read_host(0, [[256]])
    with pytest.raises(AsmError, match=r"ub row has 3 values; allowed: at most 2"):
        p.read_host(0, [[1, 2, 3]])
    with pytest.raises(AsmError, match=r"load_weights tiles must be"):
        p.load_weights(0, np.zeros((3, 2)))
    with pytest.raises(AsmError, match=r"bias row value 2147483648000 is out of range"):
        p.load_params(0, [2**31 * 1000], [0])
    with pytest.raises(AsmError, match=r"beat 0x1" + "0" * 16 + " is out of range"):
        p.word(1 << 64)
    for kwargs, message in [
            (dict(ub=-1, tile=0, count=1), r"^ub_to_weights field ub=-1 is out of range; "
                                           r"allowed: 0 to 65535 \(16 bits\)$"),
            (dict(ub=0, tile=1 << 16, count=1), r"^ub_to_weights field tile=65536 is out of "
                                                r"range; allowed: 0 to 65535 \(16 bits\)$"),
            (dict(ub=0, tile=0, count=65536), r"^ub_to_weights field count=65536 is out of "
                                              r"range; allowed: 0 to 65535 \(16 bits\)$"),
            (dict(ub=0, tile=0, count=1, transpose=2), r"^ub_to_weights field transpose=2 is "
                                                       r"out of range; allowed: 0 to 1 "
                                                       r"\(1 bits\)$"),
            (dict(ub=0, tile=0, count=1, signed="yes"), r"^ub_to_weights field "
                                                        r"signed='yes' is not an integer; "
                                                        r"allowed: 0 to 1 \(1 bits\)$"),
            (dict(ub=0.5, tile=0, count=1), r"^ub_to_weights field ub=0.5 is not an "
                                            r"integer; allowed: 0 to 65535 \(16 bits\)$")]:
        with pytest.raises(AsmError, match=message):
            p.ub_to_weights(**kwargs)
    assert p.beats == [] and p.instructions == 0


def test_cli_round_trip(tmp_path, capsys):
    source = tmp_path / "prog.s"
    source.write_text(EXAMPLE)
    binary = tmp_path / "prog.bin"
    assert asm.main([str(source), "-o", str(binary)]) == 0
    beats = assemble(EXAMPLE)
    assert binary.read_bytes() == asm.beats_to_bytes(beats, PRESETS["default"])
    assert len(binary.read_bytes()) == len(beats) * 32
    assert asm.main(["--disassemble", str(binary)]) == 0
    assert capsys.readouterr().out == disassemble(beats)
    hex_file = tmp_path / "prog.hex"
    assert asm.main([str(source), "-o", str(hex_file), "--format", "hex",
                     "--config", "tiny"]) == 1      # rows of 8 do not fit a 2x2 core
    assert "line 3: .row has 8 values; allowed: exactly 2" in capsys.readouterr().err
    assert asm.main([str(source), "-o", str(hex_file), "--format", "hex"]) == 0
    assert [int(line, 16) for line in hex_file.read_text().split()] == beats
    assert asm.main(["-d", str(hex_file), "--format", "hex"]) == 0
    assert capsys.readouterr().out == disassemble(beats)


def test_window_matmul_round_trips():
    """A window MATMUL's lane and step are written only with it (0 by default), and the text,
    the builder and the word agree."""
    config = PRESETS["default"]
    text = "matmul ub=2 acc=7 count=5 lane=3 step=9 switch signed window"
    p = Program(config)
    p.matmul(2, 7, 5, switch=True, window=(3, 9))
    assert assemble(text, config) == p.beats
    assert disassemble(p.beats, config) == text + "\n"
    opcode, fields = decode(p.beats[0])
    assert (fields["window"], fields["lane"], fields["step"]) == (1, 3, 9)
    # Without window the fields are left out of the text (and may be given: the core
    # ignores them).
    plain = Program(config)
    plain.matmul(2, 7, 5)
    assert disassemble(plain.beats, config) == "matmul ub=2 acc=7 count=5 signed\n"
    assert decode(assemble("matmul ub=2 acc=7 count=5 signed lane=1", config)[0])[1]["lane"] == 1
