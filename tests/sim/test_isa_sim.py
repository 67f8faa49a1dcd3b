"""The ISA-level simulator: each instruction, each error code, the counters."""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest

from firmware.asm import Program, encode
from hdl import isa
from hdl.beats import DONE_MAGIC
from hdl.config import OPTIONAL_FUNCS, TPUConfig
from hdl.presets import PRESETS
from sim.models import golden
from sim.models.isa_sim import (
    DETERMINISTIC_COUNTERS,
    POOL_WINDOW,
    IsaSim,
    beats_match,
    error_beat,
)

SEED = 20261201
DEFAULT = TPUConfig()
# rows > cols: unified-buffer rows are wider than ACTIVATE's output.
TALL = TPUConfig(rows=8, cols=4, ub_depth=64, acc_depth=64, weight_mem_tiles=8,
                 weight_fifo_depth=2, param_slots=2)


def rng_for(test: str) -> np.random.Generator:
    print(f"seed {SEED} ({test})")
    return np.random.default_rng([SEED, sum(map(ord, test))])


def done(n: int) -> int:
    return DONE_MAGIC << 32 | n


def snapshot(sim: IsaSim) -> dict:
    return {
        "ub": sim.ub.copy(), "acc": sim.acc.copy(), "weights": sim.weights.copy(),
        "signed": sim.weight_signed.copy(), "written": sim.weight_written.copy(),
        "queue": copy.deepcopy(sim.queue), "active": copy.deepcopy(sim.active),
        "params": copy.deepcopy(sim.params), "table": sim.table.copy(),
        "counters": sim.counters(),
        "output": list(sim.output),
    }


def assert_same_state(a: dict, b: dict):
    for key in ("ub", "acc", "weights", "signed", "written", "table"):
        assert np.array_equal(a[key], b[key]), key
    assert len(a["queue"]) == len(b["queue"])
    for (ta, sa), (tb, sb) in zip(a["queue"], b["queue"], strict=True):
        assert np.array_equal(ta, tb) and sa == sb
    assert (a["active"] is None) == (b["active"] is None)
    if a["active"] is not None:
        assert np.array_equal(a["active"][0], b["active"][0])
        assert a["active"][1] == b["active"][1]
    for pa, pb in zip(a["params"], b["params"], strict=True):
        assert np.array_equal(pa.bias, pb.bias)
        assert np.array_equal(pa.multiplier, pb.multiplier)
        assert np.array_equal(pa.shift, pb.shift)
        assert (pa.rounding, pa.zero_point, pa.clamp_hi) == \
            (pb.rounding, pb.zero_point, pb.clamp_hi)
    assert a["counters"] == b["counters"]
    assert a["output"] == b["output"]


def random_bytes(rng, shape, signed=True):
    lo, hi = golden.operand_range(signed)
    return rng.integers(lo, hi + 1, shape)


# Reset, host transfers, HALT -----------------------------------------------------------------

def test_reset_state_is_zero():
    sim = IsaSim(TALL)
    assert sim.ub.shape == (64, 8) and not sim.ub.any()
    assert sim.acc.shape == (64, 4) and not sim.acc.any()
    assert sim.weights.shape == (8, 8, 4) and not sim.weights.any()
    assert not sim.weight_written.any() and sim.queue == [] and sim.active is None
    assert all(not p.bias.any() and not p.multiplier.any() and not p.shift.any()
               and p.shift.shape == (4,) and p.rounding == isa.Rounding.HALF_UP
               and p.zero_point == p.clamp_hi == 0 for p in sim.params)
    assert sim.table.shape == (isa.TABLE_ENTRIES,) and not sim.table.any()
    assert sim.status.error is False and sim.status.code == isa.ErrorCode.NONE
    assert sim.status.instr_index == 0 and sim.status.halted is False
    assert sim.counters() == {name: 0 if name in DETERMINISTIC_COUNTERS else None
                              for name in isa.COUNTERS}


def test_read_host_write_host_round_trip():
    rng = rng_for("host")
    rows = random_bytes(rng, (5, DEFAULT.ub_row))
    p = Program(DEFAULT)
    data = p.read_host(3, rows)[1:]
    p.write_host(3, 5)
    p.halt()
    sim = IsaSim(DEFAULT)
    assert sim.feed(p.beats) == 0
    assert sim.output == data + [done(3)]
    assert np.array_equal(golden.from_raw(sim.ub[3:8], True), rows)
    assert not sim.ub[:3].any() and not sim.ub[8:].any()


def test_bits_above_a_row_are_ignored():
    p = Program(TALL)
    p.instr(isa.Opcode.READ_HOST, ub_addr=0, count=1)
    p.word(0xFF << 64 | 0x0102030405060708)   # ub_row = 8 bytes; the high byte is ignored
    p.write_host(0, 1)
    sim = IsaSim(TALL)
    sim.feed(p.beats)
    assert sim.output == [0x0102030405060708]


def test_halt_done_beat_and_index_restart():
    p = Program(DEFAULT)
    p.nop()
    p.sync()
    p.halt()
    p.halt()
    sim = IsaSim(DEFAULT)
    sim.feed(p.beats[:3])
    assert sim.output == [done(3)]
    assert sim.status.halted and sim.status.instr_index == 0
    sim.feed(p.beats[3:])
    assert sim.output == [done(3), done(1)]
    sim.feed(Program(DEFAULT).nop())
    assert not sim.status.halted and sim.status.instr_index == 1


def test_feed_in_pieces_equals_feed_at_once():
    rng = rng_for("pieces")
    p = Program(DEFAULT)
    p.read_host(0, random_bytes(rng, (3, 8)))
    p.load_weights(0, random_bytes(rng, (2, 8, 8)))
    p.load_params(1, rng.integers(-1000, 1000, 8), rng.integers(1, 100, 8), shift=4, zp=-5)
    p.read_weights(0, 2)
    p.matmul(0, 0, 3, switch=True)
    p.matmul(0, 0, 3, switch=True, accumulate=True)
    p.activate(0, 10, 3, func=isa.Func.RELU, slot=1)
    p.write_host(10, 3)
    p.halt()
    whole, pieces = IsaSim(DEFAULT), IsaSim(DEFAULT)
    whole.feed(p.beats)
    for beat in p.beats:
        assert pieces.feed([beat]) == 0
    assert_same_state(snapshot(whole), snapshot(pieces))
    assert whole.output[-1] == done(9)


# Weights and MATMUL --------------------------------------------------------------------------

@pytest.mark.parametrize("x_signed", [True, False])
@pytest.mark.parametrize("w_signed", [True, False])
def test_matmul_matches_golden(x_signed, w_signed):
    rng = rng_for(f"matmul{x_signed}{w_signed}")
    c = TALL
    x = random_bytes(rng, (6, c.rows), x_signed)
    x2 = random_bytes(rng, (6, c.rows), x_signed)
    tiles = random_bytes(rng, (2, c.rows, c.cols), w_signed)
    p = Program(c)
    p.read_host(0, x)
    p.read_host(6, x2)
    p.load_weights(3, tiles, signed=w_signed)
    p.read_weights(3, 2)
    p.matmul(0, 5, 6, switch=True, signed=x_signed)
    p.matmul(6, 5, 6, switch=True, accumulate=True, signed=x_signed)
    p.matmul(0, 20, 6, signed=x_signed)                 # no switch: the same tile again
    sim = IsaSim(c)
    assert sim.feed(p.beats) == 0 and not sim.status.error
    first = golden.matmul(x, tiles[0], x_signed=x_signed, w_signed=w_signed)
    second = golden.matmul(x2, tiles[1], x_signed=x_signed, w_signed=w_signed)
    assert np.array_equal(sim.acc[5:11], golden.wrap(first + second))
    assert np.array_equal(sim.acc[20:26],
                          golden.matmul(x, tiles[1], x_signed=x_signed, w_signed=w_signed))
    assert not sim.acc[:5].any() and not sim.acc[11:20].any()
    assert sim.weight_written.tolist() == [False] * 3 + [True] * 2 + [False] * 3
    assert sim.weight_signed[3:5].tolist() == [w_signed] * 2


def test_matmul_uses_first_rows_elements_only():
    c = TPUConfig(rows=2, cols=4, ub_depth=16, acc_depth=16, weight_mem_tiles=1)
    p = Program(c)
    p.read_host(0, [[1, 2, 99, 99]])
    p.load_weights(0, [[1, 10, 100, 1000 % 256], [2, 20, 0, 0]])
    p.read_weights(0)
    p.matmul(0, 0, 1, switch=True)
    sim = IsaSim(c)
    sim.feed(p.beats)
    assert sim.acc[0].tolist() == [1 + 4, 10 + 40, 100, 1000 % 256 - 256]


def test_read_weights_copies_the_tile_at_that_moment():
    c = TALL
    a = np.ones((c.rows, c.cols), dtype=np.int64)
    b = np.full((c.rows, c.cols), 2)
    p = Program(c)
    p.read_host(0, [[1] * c.rows])
    p.load_weights(0, a)
    p.read_weights(0)
    p.load_weights(0, b, signed=False)
    p.read_weights(0)
    p.matmul(0, 0, 1, switch=True)
    p.matmul(0, 1, 1, switch=True)
    sim = IsaSim(c)
    sim.feed(p.beats)
    assert sim.acc[0].tolist() == [c.rows] * c.cols
    assert sim.acc[1].tolist() == [2 * c.rows] * c.cols


def test_matmul_accumulate_wraps_at_int32():
    # 256 products of 255 * 255 per row: 16.6e6 a MATMUL, past 2**31 after 130 of them.
    c = TPUConfig(rows=256, cols=1, ub_depth=16, acc_depth=16, weight_mem_tiles=1)
    p = Program(c)
    p.read_host(0, [[255] * 256])
    p.load_weights(0, np.full((256, 1), 255), signed=False)
    p.read_weights(0)
    p.matmul(0, 0, 1, switch=True, signed=False)
    for _ in range(129):
        p.matmul(0, 0, 1, accumulate=True, signed=False)
    sim = IsaSim(c)
    sim.feed(p.beats)
    exact = 130 * 256 * 255 * 255
    assert exact > 2**31
    assert sim.acc[0, 0] == exact - 2**32


# UB_TO_WEIGHTS ----------------------------------------------------------------------------------

def expected_tile(ub_rows: np.ndarray, rows: int, cols: int, transpose: bool) -> np.ndarray:
    """The tile UB_TO_WEIGHTS makes of ``ub_rows`` (raw bytes), element by element."""
    tile = np.zeros((rows, cols), dtype=np.int64)
    for i, row in enumerate(ub_rows):
        if transpose:
            for r in range(rows):
                tile[r][i] = row[r]
        else:
            for c in range(cols):
                tile[i][c] = row[c]
    return tile


def as_int(raw: np.ndarray, signed: bool) -> np.ndarray:
    """Raw bytes as int8 (``signed``) or uint8 values, in int64."""
    raw = np.asarray(raw, dtype=np.int64)
    return np.where(raw >= 128, raw - 256, raw) if signed else raw


U2W_CONFIGS = {"default": DEFAULT, "wide": PRESETS["wide"], "tall": TALL}


@pytest.mark.parametrize("config_name", list(U2W_CONFIGS))
@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transpose"])
@pytest.mark.parametrize("size", ["one", "partial", "full"])
@pytest.mark.parametrize("signed", [True, False], ids=["int8", "uint8"])
def test_ub_to_weights(config_name, transpose, size, signed):
    """Buffer rows into a tile, as its columns (transpose) or its rows, the rest zero, with
    the instruction's signed flag; READ_WEIGHTS and MATMUL then multiply by it: the
    accumulators equal numpy's product of the rows and the tile built element by element.
    The tile is first loaded with other bytes of the other signedness (one, partial: the
    zero fill shows) or never written (full: the written flag shows)."""
    c = U2W_CONFIGS[config_name]
    rng = rng_for(f"u2w {config_name} {transpose} {size} {signed}")
    limit = c.cols if transpose else c.rows
    count = {"one": 1, "partial": int(rng.integers(2, limit)), "full": limit}[size]
    ub_addr, tile, acc_addr = 5, 2, 3
    src = rng.integers(0, 256, (count, c.ub_row))             # raw bytes, every element
    x = random_bytes(rng, (6, c.rows), signed)
    p = Program(c)
    p.read_host(ub_addr, src)
    p.read_host(40, x)
    if size != "full":
        p.load_weights(tile, rng.integers(1, 128, (c.rows, c.cols)), signed=not signed)
    p.load_weights(tile + 1, np.full((c.rows, c.cols), 9))
    p.ub_to_weights(ub_addr, tile, count, transpose=transpose, signed=signed)
    p.read_weights(tile)
    p.matmul(40, acc_addr, len(x), switch=True, signed=signed)
    sim = IsaSim(c)
    sim.run(p.beats)
    want = expected_tile(src, c.rows, c.cols, transpose)
    assert np.array_equal(sim.weights[tile], want)
    assert sim.weight_written[tile] and sim.weight_signed[tile] == signed
    assert (sim.weights[tile + 1] == 9).all() and sim.weight_signed[tile + 1]
    assert not sim.weights[:tile].any() and not sim.weights[tile + 2:].any()
    assert np.array_equal(sim.ub[ub_addr:ub_addr + count], src), "the buffer is only read"
    zero = np.ones((c.rows, c.cols), dtype=bool)
    if transpose:
        zero[:, :count] = False
    else:
        zero[:count, :] = False
    assert not want[zero].any() and not sim.weights[tile][zero].any()
    product = x.astype(np.int64) @ as_int(want, signed)
    assert np.array_equal(sim.acc[acc_addr:acc_addr + len(x)], product)
    assert not sim.acc[:acc_addr].any() and not sim.acc[acc_addr + len(x):].any()
    assert sim.counters()["instructions"] == p.instructions


@pytest.mark.parametrize("signed", [True, False], ids=["int8", "uint8"])
@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transpose"])
def test_ub_to_weights_extremes(signed, transpose):
    """The extreme bytes (-128 and 127 as int8, 255 and 0 as uint8) through UB_TO_WEIGHTS
    and MATMUL against extreme activations, equal to numpy's exact product."""
    c = DEFAULT
    lo, hi = (-128, 127) if signed else (0, 255)
    src = np.array([[lo, hi] * (c.ub_row // 2), [hi] * c.ub_row, [lo] * c.ub_row,
                    [hi, lo] * (c.ub_row // 2)] * 2)             # 8 rows
    x = np.array([[lo] * c.rows, [hi] * c.rows, [lo, hi] * (c.rows // 2)])
    p = Program(c)
    p.read_host(0, src)
    p.read_host(10, x)
    p.ub_to_weights(0, 0, len(src), transpose=transpose, signed=signed)
    p.read_weights(0)
    p.matmul(10, 0, len(x), switch=True, signed=signed)
    sim = IsaSim(c)
    sim.run(p.beats)
    w = src.T if transpose else src                     # 8 x 8: every element moved
    assert np.array_equal(as_int(sim.weights[0], signed), w)
    assert np.array_equal(sim.acc[:len(x)], x @ w)
    if transpose:                                      # tile columns 1, 2: all hi, all lo
        assert sim.acc[1, 1] == c.rows * hi * hi and sim.acc[0, 2] == c.rows * lo * lo


def test_ub_to_weights_leaves_queued_and_active_tiles_alone():
    """READ_WEIGHTS copies a tile: a UB_TO_WEIGHTS into it afterwards changes neither the
    queued copy nor the active one; the next READ_WEIGHTS takes the new content."""
    c = TALL
    old = np.arange(c.rows * c.cols).reshape(c.rows, c.cols) % 7 - 3
    new_rows = np.arange(6 * c.ub_row).reshape(6, c.ub_row) % 11 - 5
    x = np.array([[1, -2, 3, -4, 5, -6, 7, -8]])
    p = Program(c)
    p.read_host(0, new_rows)
    p.read_host(20, x)
    p.load_weights(0, old)
    p.read_weights(0)
    p.read_weights(0)
    p.ub_to_weights(0, 0, c.cols, transpose=True)     # into tile 0, twice queued
    sim = IsaSim(c)
    sim.run(p.beats)
    assert np.array_equal(as_int(sim.weights[0], True), new_rows[:c.cols, :c.rows].T)
    assert len(sim.queue) == 2
    assert all(np.array_equal(as_int(t, True), old) and s for t, s in sim.queue)
    p2 = Program(c)
    p2.matmul(20, 0, 1, switch=True)                    # the first copy: old
    p2.ub_to_weights(4, 0, 2, signed=False)             # again, while it is active
    p2.read_weights(0)                                  # now the tile of the second move
    p2.matmul(20, 1, 1)                                 # still the active (old) tile
    p2.matmul(20, 2, 1, switch=True)                    # the second copy: old
    p2.matmul(20, 3, 1, switch=True)                    # the new tile
    sim.run(p2.beats)
    new = np.zeros((c.rows, c.cols), dtype=np.int64)
    new[:2] = new_rows[4:6, :c.cols] % 256              # uint8
    assert np.array_equal(sim.weights[0], new)
    assert sim.acc[0].tolist() == (x @ old)[0].tolist()
    assert sim.acc[1].tolist() == (x @ old)[0].tolist()
    assert sim.acc[2].tolist() == (x @ old)[0].tolist()
    assert sim.acc[3].tolist() == (x @ new)[0].tolist()


# ACTIVATE and LOAD_PARAMS --------------------------------------------------------------------

@pytest.mark.parametrize("func", list(isa.Func))
@pytest.mark.parametrize("pool", list(isa.Pool))
def test_activate_matches_golden(func, pool):
    rng = rng_for(f"act{func.value}{pool.value}")
    c = TALL
    count = 8
    x = random_bytes(rng, (count, c.rows))
    tile = random_bytes(rng, (c.rows, c.cols))
    bias = rng.integers(-2**31, 2**31, c.cols)
    mult = rng.integers(-2**31, 2**31, c.cols)
    shift, zp, clamp = 40, -7, 60
    window = POOL_WINDOW[pool]
    p = Program(c)
    p.read_host(0, x)
    p.read_host(30, np.full((count, c.ub_row), -1))        # stale bytes ACTIVATE overwrites
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, 4, count, switch=True)
    p.load_params(1, bias, mult, shift=shift, zp=zp, clamp=clamp)
    table = rng.integers(0, 256, isa.TABLE_ENTRIES)
    p.load_table(table)
    p.activate(4, 30, count, func=func, pool=pool, slot=1)
    sim = IsaSim(c)
    sim.feed(p.beats)
    assert not sim.status.error
    acc = golden.matmul(x, tile)
    if func == isa.Func.NORMALISE:
        f = golden.requantise_normalised(acc, bias, shift, zp)
    else:
        f = golden.activate(golden.requantise(acc, bias, mult, shift, zp), func.value, zp,
                            clamp, table=table)
    want = golden.max_pool_rows(f, window)
    n = count // window
    assert np.array_equal(golden.from_raw(sim.ub[30:30 + n, :c.cols], True), want)
    assert not sim.ub[30:30 + n, c.cols:].any()
    assert (sim.ub[30 + n:30 + count] == 255).all()


def test_load_params_fields():
    c = TALL
    p = Program(c)
    p.load_params(1, [-2**31, 2**31 - 1, -1, 5], [7, -7, 2**31 - 1, -2**31], shift=63,
                  zp=-128, clamp=-1)
    sim = IsaSim(c)
    sim.feed(p.beats)
    slot = sim.params[1]
    assert slot.bias.tolist() == [-2**31, 2**31 - 1, -1, 5]
    assert slot.multiplier.tolist() == [7, -7, 2**31 - 1, -2**31]
    assert slot.shift.tolist() == [63] * 4
    assert (slot.rounding, slot.zero_point, slot.clamp_hi) == (isa.Rounding.HALF_UP, -128, -1)
    assert not sim.params[0].bias.any() and not sim.params[0].shift.any()
    # Per-column shifts (the third beat) and a rounding mode; the lanes' bits above the six
    # shift bits are ignored, and a later scalar LOAD_PARAMS sets every column again.
    p = Program(c)
    p.load_params(1, [1, 2, 3, 4], [5, 6, 7, 8], shift=[0, 31, 62, 63], zp=3, clamp=4,
                  rounding=isa.Rounding.DOUBLE)
    p.beats[-1] |= sum(((1 << 26) - 1) << (32 * j + 6) for j in range(4))
    p.beats[-1] |= ((1 << c.host_width) - 1) >> (32 * 4) << (32 * 4)    # above the row
    sim.feed(p.beats)
    assert sim.params[1].shift.tolist() == [0, 31, 62, 63]
    assert sim.params[1].rounding == isa.Rounding.DOUBLE
    assert sim.params[1].bias.tolist() == [1, 2, 3, 4]
    assert sim.params[0].rounding == isa.Rounding.HALF_UP
    sim.feed(Program(c).load_params(1, [], [], shift=9, rounding=isa.Rounding.HALF_EVEN))
    assert sim.params[1].shift.tolist() == [9] * 4
    assert sim.params[1].rounding == isa.Rounding.HALF_EVEN
    assert sim.expecting_data == 0 and not sim.status.error


def test_load_params_per_column_shifts_wait_for_the_third_beat():
    """With column_shifts the instruction completes after its third beat (``instructions``
    counts it then); without, after its second; the word's shift field is ignored."""
    c = TALL
    sim = IsaSim(c)
    word = encode(isa.Opcode.LOAD_PARAMS, slot=0, column_shifts=1, shift=50)
    sim.feed([word, 0, 0])
    assert sim.expecting_data == 1
    assert sim.counters()["instructions"] == 0
    sim.feed([7 | 8 << 32 | 9 << 64 | 10 << 96])
    assert sim.expecting_data == 0
    assert sim.params[0].shift.tolist() == [7, 8, 9, 10]
    assert sim.counters()["instructions"] == 1
    sim.feed([encode(isa.Opcode.LOAD_PARAMS, slot=0, shift=50), 0, 0])
    assert sim.expecting_data == 0 and sim.params[0].shift.tolist() == [50] * 4
    assert sim.counters()["instructions"] == 2


ROUNDINGS = list(isa.Rounding)


@pytest.mark.parametrize("rounding", ROUNDINGS, ids=lambda r: r.name)
@pytest.mark.parametrize("per_column", [False, True], ids=["scalar", "per-column"])
def test_rounding_modes_and_per_column_shifts_match_golden(rounding, per_column):
    """Every rounding mode, with one shift or a shift per column (the extremes 0, 31, 32, 62,
    63 among them), on accumulators and multipliers chosen so that ties, near-ties and
    saturation all occur: the unified buffer holds golden.requantise's values. Two slots
    with different modes are loaded, so each ACTIVATE must use its own slot's mode."""
    rng = rng_for(f"rounding{rounding.value}{per_column}")
    c = TPUConfig(rows=2, cols=8, ub_depth=64, acc_depth=64, weight_mem_tiles=2,
                  param_slots=2)
    rows = 48
    # x @ [[1, 0...], [0, 1...]] puts x's two columns into accumulator columns 0 and 1; the
    # bias then makes the int32 sum t each column needs (acc + bias wraps, as the core's).
    x = rng.integers(-128, 128, (rows, c.rows))
    tile = np.zeros((c.rows, c.cols), dtype=np.int64)
    tile[0, :] = 1
    tile[1, ::2] = -1
    acc = golden.matmul(x, tile)
    # Column 2 (shift 32, multiplier -2**31, bias 0) tells the modes apart: p = -t * 2**31,
    # an exact tie for odd t, which HALF_UP rounds up, HALF_EVEN to even and DOUBLE away from
    # zero.
    shift = np.array([0, 31, 32, 62, 63, 1, 16, 40]) if per_column else np.full(c.cols, 32)
    # Multipliers that make exact ties at each column's shift for some rows: t * m an odd
    # multiple of 2**(s-1) when t is odd and m = 2**(s-1) (s <= 32); the int32 extremes
    # elsewhere (saturation, and p = 2**62 at s = 63).
    mult = np.array([int(m) for m in rng.choice([-2**31, 2**31 - 1, -1, 1, 3], c.cols)])
    for j, sj in enumerate(shift):
        if 1 <= sj <= 32 and rng.random() < 0.7:
            mult[j] = 1 << (sj - 1) if sj <= 31 else -2**31
    bias = rng.integers(-2**31, 2**31, c.cols)
    bias[rng.random(c.cols) < 0.5] = 0
    mult[2], bias[2] = -2**31, 0
    zp = int(rng.integers(-128, 128))
    p = Program(c)
    p.read_host(0, x)
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, 0, rows, switch=True)
    other = ROUNDINGS[(rounding.value + 1) % len(ROUNDINGS)]
    p.load_params(0, bias, mult, shift=shift if per_column else int(shift[0]), zp=zp,
                  clamp=127, rounding=rounding)
    p.load_params(1, bias, mult, shift=(shift + 1) % 64 if per_column else 5, zp=zp,
                  rounding=other)
    p.activate(0, 0, rows, slot=0)
    p.write_host(0, rows)
    p.halt()
    sim = IsaSim(c)
    out = sim.run(p.beats)
    got = golden.from_raw(sim.ub[:rows, :c.cols], True)
    want = golden.requantise(acc, bias, mult, shift, zp, rounding.value)
    assert np.array_equal(got, want)
    assert out[:rows] == [int.from_bytes(r.tobytes(), "little") for r in sim.ub[:rows]]
    # The case has teeth: the other modes give other bytes here.
    for r in ROUNDINGS:
        if r != rounding:
            assert not np.array_equal(
                want, golden.requantise(acc, bias, mult, shift, zp, r.value)), r


# LOAD_TABLE and ACTIVATE's TABLE --------------------------------------------------------------

def as_int8(raw) -> np.ndarray:
    """Raw bytes as int8 values, in int64 (written out, not golden's)."""
    raw = np.asarray(raw, dtype=np.int64) & 0xFF
    return np.where(raw >= 128, raw - 256, raw)


def random_table(rng) -> np.ndarray:
    """256 raw bytes with the extremes planted: 0x80 (-128), 0xff (-1), 0x7f, 0x00 at both
    ends of the table and in the middle (q = -128, 127, 0)."""
    table = rng.integers(0, 256, isa.TABLE_ENTRIES)
    table[[0, 255, 128, 1, 254, 127]] = [0x80, 0xFF, 0x7F, 0x7F, 0x00, 0x80]
    return table


def table_reference(acc, bias, mult, shift, zp, table, window: int) -> np.ndarray:
    """numpy's ACTIVATE with function TABLE: requantise, ``table[q + 128]`` as int8, then
    the maximum over each window of rows."""
    q = golden.requantise(acc, bias, mult, shift, zp)
    f = as_int8(np.asarray(table)[q + 128])
    return f.reshape(-1, window, f.shape[1]).max(axis=1)


#: Columns 1 (64 beats of 4 entries), 3 and 5 (a partial last beat: 4 and 16 entries), 4
#: (rows > cols) and 8 (8 beats of 32).
TABLE_CONFIGS = {"1col": TPUConfig(rows=2, cols=1), "3col": TPUConfig(rows=4, cols=3),
                 "5col": TPUConfig(rows=3, cols=5), "tall": TPUConfig(rows=8, cols=4),
                 "default": DEFAULT}


@pytest.mark.parametrize("config_name", list(TABLE_CONFIGS))
@pytest.mark.parametrize("entries", ["bytes", "int8"])
def test_load_table_then_activate_table(config_name, entries):
    """Every requantised value -128..127 through a random table (extremes planted): column 0
    sees each q once (bias 0, multiplier 1, shift 0, so q = the activation), the others
    random requantisations that saturate at both ends; slot 1 adds a zero point. The
    unified buffer equals numpy's lookup, the table is the bytes sent (int8 entries are
    sent as their bytes), and the program has ``1 + table_beats(cols)`` beats for it."""
    c = TABLE_CONFIGS[config_name]
    rng = rng_for(f"table {config_name} {entries}")
    table = random_table(rng)
    sent = as_int8(table) if entries == "int8" else table
    rows = 256
    x = np.zeros((rows, c.rows), dtype=np.int64)
    x[:, 0] = rng.permutation(np.arange(-128, 128))
    tile = np.zeros((c.rows, c.cols), dtype=np.int64)
    tile[0, :] = 1                                  # every column: acc = x[:, 0]
    bias = rng.integers(-300, 300, c.cols)
    mult = rng.integers(1, 2**20, c.cols)
    shift = rng.integers(0, 21, c.cols)
    bias[0], mult[0], shift[0] = 0, 1, 0
    acc_row, ub_out = 0, rows
    p = Program(c)
    p.read_host(0, x)
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, acc_row, rows, switch=True)
    p.load_params(0, bias, mult, shift=shift.tolist())
    p.load_params(1, bias, mult, shift=shift.tolist(), zp=-37)
    table_beats = p.load_table(sent)
    p.activate(acc_row, ub_out, rows, func=isa.Func.TABLE, slot=0)
    p.activate(acc_row, ub_out + rows, rows, func=isa.Func.TABLE, slot=1)
    p.halt()
    assert len(table_beats) == 1 + isa.table_beats(c.cols)
    assert isa.table_beats(c.cols) == -(-256 // (4 * c.cols))
    sim = IsaSim(c)
    sim.run(p.beats)
    assert sim.table.tolist() == (np.asarray(table) & 0xFF).tolist()
    acc = golden.matmul(x, tile)
    for slot, zp in ((0, 0), (1, -37)):
        got = as_int8(sim.ub[ub_out + slot * rows:ub_out + (slot + 1) * rows, :c.cols])
        want = table_reference(acc, bias, mult, shift, zp, table, 1)
        assert np.array_equal(got, want), slot
    q = golden.requantise(acc, bias, mult, shift, 0)
    assert sorted(q[:, 0].tolist()) == list(range(-128, 128)), "column 0 sees every q"
    got0 = as_int8(sim.ub[ub_out:ub_out + rows, 0])
    assert np.array_equal(got0, as_int8(table[x[:, 0] + 128]))
    # The extremes: q = -128 reads entry 0 (0x80: -128), q = 127 entry 255 (0xff: -1).
    assert got0[x[:, 0] == -128].tolist() == [-128] and got0[x[:, 0] == 127].tolist() == [-1]
    if c.cols > 1:
        assert (q == -128).any() and (q == 127).any(), "saturated at both ends"


@pytest.mark.parametrize("func, lut", [(isa.Func.SIGMOID, golden.SIGMOID_LUT),
                                       (isa.Func.TANH, golden.TANH_LUT)],
                         ids=["sigmoid", "tanh"])
def test_sigmoid_and_tanh_are_tables_like_any_other(func, lut):
    """The fixed functions are 256-entry tables of the requantised int8: the programmable
    table loaded with theirs gives their outputs on every q (-128..127, with and without a
    zero point), so a core's or a model's own sigmoid or tanh is a LOAD_TABLE away."""
    c = TPUConfig(rows=4, cols=3, ub_depth=2048)
    rows = 256
    x = np.zeros((rows, c.rows), dtype=np.int64)
    x[:, 0] = np.arange(-128, 128)
    tile = np.zeros((c.rows, c.cols), dtype=np.int64)
    tile[0, :] = 1
    p = Program(c)
    p.read_host(0, x)
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, 0, rows, switch=True)
    p.load_params(0, [0] * c.cols, [1] * c.cols, shift=0)
    p.load_params(1, [0] * c.cols, [1] * c.cols, shift=0, zp=-37)
    p.load_table(np.asarray(lut).tolist())
    for slot in (0, 1):
        p.activate(0, rows * (1 + 2 * slot), rows, func=func, slot=slot)
        p.activate(0, rows * (2 + 2 * slot), rows, func=isa.Func.TABLE, slot=slot)
    p.halt()
    sim = IsaSim(c)
    sim.run(p.beats)
    assert not sim.status.error
    for slot in (0, 1):
        fixed = sim.ub[rows * (1 + 2 * slot):rows * (2 + 2 * slot)]
        table = sim.ub[rows * (2 + 2 * slot):rows * (3 + 2 * slot)]
        assert np.array_equal(fixed, table), slot
    assert len(set(as_int8(sim.ub[rows:2 * rows, 0]).tolist())) > 50, "not a constant"


def test_table_output_is_pooled_as_int8():
    """Pooling compares the table's outputs as int8 and comes after the lookup: windows of
    outputs {-1, 1, -128, 127} give 127 (0xff would win unsigned), {-128, -1, -128, -128}
    give -1, all -128 give -128; a table that falls (q = 10 -> 50, q = 20 -> -50) gives 50,
    which pooling the q first (20) and looking up after would not."""
    c = TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=2)
    table = np.zeros(isa.TABLE_ENTRIES, dtype=np.int64)
    for q, out in {-3: 0xFF, 1: 0x01, -128: 0x80, 127: 0x7F, 10: 50, 20: 256 - 50}.items():
        table[q + 128] = out
    x = np.array([[-3, 0], [1, 0], [-128, 0], [127, 0],
                  [-128, 0], [-3, 0], [-128, 0], [-128, 0],
                  [-128, 0], [-128, 0], [-128, 0], [-128, 0],
                  [10, 0], [20, 0], [20, 0], [20, 0]])
    p = Program(c)
    p.read_host(0, x)
    p.load_weights(0, [[1, 1], [0, 0]])
    p.read_weights(0)
    p.matmul(0, 0, len(x), switch=True)
    p.load_params(0, [0, 0], [1, 1], shift=0)
    p.load_table(table)
    p.activate(0, 32, len(x), func=isa.Func.TABLE, pool=isa.Pool.MAX4)
    p.activate(0, 40, len(x), func=isa.Func.TABLE, pool=isa.Pool.MAX2)
    sim = IsaSim(c)
    sim.run(p.beats)
    assert as_int8(sim.ub[32:36, 0]).tolist() == [127, -1, -128, 50]
    assert as_int8(sim.ub[40:48, 0]).tolist() == [1, 127, -1, -128, -128, -128, 50, -50]
    assert as_int8(sim.ub[32:36, :c.cols]).tolist() == \
        table_reference(x[:, [0, 0]], [0, 0], [1, 1], [0, 0], 0, table, 4).tolist()
    assert (sim.ub[32:36, 0] != np.asarray(golden.to_raw(x[:, 0])).reshape(4, 4).max(1)).any()


@pytest.mark.parametrize("config_name", ["1col", "3col", "5col"])
def test_load_table_beats_one_by_one(config_name):
    """``table_beats(cols)`` data beats (64 for one column), entries ``4 * cols`` a beat in
    order; each beat's bits past its entries (past entry 255 in the last, and past the row
    of ``4 * cols`` bytes) are ignored; the instruction completes (``instructions``) with
    its last beat, and the beat after it is an instruction again."""
    c = TABLE_CONFIGS[config_name]
    per_beat = 4 * c.cols
    n = isa.table_beats(c.cols)
    table = np.arange(isa.TABLE_ENTRIES) * 7 % 256
    beats = Program(c).load_table(table)
    assert len(beats) == 1 + n and n == {1: 64, 3: 22, 5: 13}[c.cols]
    for b, beat in enumerate(beats[1:]):
        entries = table[b * per_beat:(b + 1) * per_beat]
        assert beat == int.from_bytes(bytes(entries.tolist()), "little")
    last = isa.TABLE_ENTRIES - (n - 1) * per_beat
    assert last == {1: 4, 3: 4, 5: 16}[c.cols]
    junk = list(beats)
    top = (1 << c.host_width) - 1
    junk[-1] |= top >> (8 * last) << (8 * last)             # past entry 255
    for b in range(1, n):
        junk[b] |= top >> (8 * per_beat) << (8 * per_beat)   # above the row, if any
    assert junk[-1] != beats[-1]
    sim = IsaSim(c)
    sim.feed(junk[:1])
    assert sim.expecting_data == n and sim.status.instr_index == 1
    for b, beat in enumerate(junk[1:]):
        assert sim.counters()["instructions"] == 0
        sim.feed([beat])
        assert sim.expecting_data == n - 1 - b
        assert sim.table[:(b + 1) * per_beat].tolist() == table[:(b + 1) * per_beat].tolist()
    assert sim.counters()["instructions"] == 1
    assert sim.table.tolist() == table.tolist()
    sim.feed(Program(c).halt())
    assert sim.output == [done(2)] and not sim.status.error


def test_load_table_replaces_the_whole_table_and_reserved_bits_are_ignored():
    c = TALL
    first, second = np.full(256, 0x55), np.arange(256)[::-1]
    p = Program(c)
    p.load_table(first)
    p.load_table(second)
    p.beats[1 + isa.table_beats(c.cols)] |= ((1 << 58) - 1) << 6   # the word's _pad
    sim = IsaSim(c)
    sim.run(p.beats)
    assert sim.table.tolist() == second.tolist()


def test_table_is_zero_after_reset_and_kept_across_halt_clear_and_resync():
    """Before any LOAD_TABLE the function TABLE gives 0; a loaded table stays through a
    HALT, an error cleared by ``i_clear`` or by the resynchronisation word, and a resync
    without an error; :meth:`IsaSim.reset` zeroes it."""
    c = TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=2)
    table = (np.arange(256) * 3 + 1) % 256

    def activate_table(sim: IsaSim) -> list[int]:
        """ACTIVATE TABLE of accumulator rows 0..3 (q = -128, -1, 0, 127) into rows 8..11."""
        sim.run(Program(c).activate(0, 8, 4, func=isa.Func.TABLE))
        return as_int8(sim.ub[8:12, 0]).tolist()

    setup = Program(c)
    setup.read_host(0, [[-128, 0], [-1, 0], [0, 0], [127, 0]])
    setup.load_weights(0, [[1, 1], [0, 0]])
    setup.read_weights(0)
    setup.matmul(0, 0, 4, switch=True)
    setup.load_params(0, [0, 0], [1, 1], shift=0)
    loaded = as_int8(table[[0, 127, 128, 255]]).tolist()
    sim = IsaSim(c)
    sim.run(setup.beats)
    assert activate_table(sim) == [0, 0, 0, 0]
    sim.run(Program(c).load_table(table) + Program(c).halt())
    assert activate_table(sim) == loaded
    sim.feed([15])                                         # UNKNOWN_OPCODE
    assert sim.status.error
    sim.clear()
    assert activate_table(sim) == loaded
    sim.feed([15, isa.RESYNC_WORD])
    assert not sim.status.error and activate_table(sim) == loaded
    sim.feed([isa.RESYNC_WORD])
    assert activate_table(sim) == loaded
    sim.reset()
    assert not sim.table.any()
    sim.run(setup.beats)
    assert activate_table(sim) == [0, 0, 0, 0]


# ACTIVATE's NORMALISE -------------------------------------------------------------------------

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def planted_acc(rng, rows: int, cols: int) -> np.ndarray:
    """Random int32 accumulator rows, the extremes planted in every column; the last column
    (the divisor) cycles through 1, 2**31 - 1, 0, -1, -2**31, the edges of the 9-bit cut
    (255 .. 513), powers of two and their neighbours, and random positive ones of every
    size (a third of the rows); a third of the rows hold elements within 3 times their
    divisor."""
    acc = rng.integers(INT32_MIN, INT32_MAX + 1, (rows, cols))
    acc[rng.random((rows, cols)) < 0.1] = INT32_MIN
    acc[rng.random((rows, cols)) < 0.1] = INT32_MAX
    small = rng.random((rows, cols)) < 0.3
    acc[small] = rng.integers(-5000, 5000, small.sum())
    planted = [1, INT32_MAX, 0, -1, INT32_MIN, 255, 256, 511, 512, 513, 2, 3, 1 << 30,
               (1 << 30) - 1, (1 << 30) + 1, 1 << 20, (1 << 20) + 1]
    d = [planted[i] if i < len(planted) else int(rng.integers(1, 2 ** rng.integers(1, 32)))
         for i in range(rows)]
    acc[:, -1] = rng.permutation(d)
    # A third of the rows: elements within a few times their divisor, for mid-range quotients.
    near = rng.random(rows) < 0.35
    ratio = rng.uniform(-3, 3, (near.sum(), cols - 1))
    acc[near, :-1] = np.clip(np.round(acc[near, -1:] * ratio), INT32_MIN, INT32_MAX)
    return acc


#: One column (the divisor alone), rows > cols and five columns.
NORMALISE_CONFIGS = {"1col": TPUConfig(rows=2, cols=1), "tall": TALL,
                     "5col": TPUConfig(rows=3, cols=5, param_slots=2)}


@pytest.mark.parametrize("config_name", list(NORMALISE_CONFIGS))
@pytest.mark.parametrize("rounding", ROUNDINGS, ids=lambda r: r.name)
def test_activate_normalise_matches_golden(config_name, rounding):
    """ACTIVATE NORMALISE of accumulator rows with planted extremes (divisors 1, 2**31 - 1,
    0 and below, the cut's edges; t from -2**31 to 2**31 - 1, sums that wrap) and per-column
    shifts from 0 to 63 (past 63 with the cut): the unified buffer holds
    golden.requantise_normalised's rows, the accumulators are untouched, and a second slot
    that differs only in its multipliers gives the same bytes (NORMALISE does not read
    them). The ordinary requantisation of the same rows gives other bytes."""
    c = NORMALISE_CONFIGS[config_name]
    rng = rng_for(f"normalise {config_name} {rounding.name}")
    rows = 32                                            # TALL: 64 buffer rows
    acc = planted_acc(rng, rows, c.cols)
    bias = rng.integers(INT32_MIN, INT32_MAX + 1, c.cols)
    bias[rng.random(c.cols) < 0.4] = 0
    shift = rng.choice([0, 17, 19, 25, 32, 42, 63], c.cols)
    # Column 0 (with more columns) where the quotients spread over int8: a small bias and
    # 2**(25 - shift) from 1 to 64.
    bias[0] = rng.integers(-1000, 1000)
    shift[0] = rng.choice([19, 21, 25])
    mult = rng.integers(INT32_MIN, INT32_MAX + 1, c.cols)
    zp = int(rng.integers(-128, 128))
    sim = IsaSim(c)
    sim.acc[:rows] = acc
    p = Program(c)
    p.read_host(0, np.full((2 * rows, c.ub_row), -1))   # stale bytes ACTIVATE overwrites
    p.load_params(0, bias, mult, shift=shift.tolist(), zp=zp, clamp=5, rounding=rounding)
    p.load_params(1, bias, mult ^ 0x5A5A5A5, shift=shift.tolist(), zp=zp, clamp=-9,
                  rounding=rounding)
    p.activate(0, 0, rows, func=isa.Func.NORMALISE, slot=0)
    p.activate(0, rows, rows, func=isa.Func.NORMALISE, slot=1)
    p.write_host(0, rows)
    p.halt()
    out = sim.run(p.beats)
    want = golden.requantise_normalised(acc, bias, shift, zp, rounding.value)
    for ub in (0, rows):
        assert np.array_equal(golden.from_raw(sim.ub[ub:ub + rows, :c.cols], True), want), ub
        assert not sim.ub[ub:ub + rows, c.cols:].any()
    assert out[:rows] == [int.from_bytes(r.tobytes(), "little") for r in sim.ub[:rows]]
    assert np.array_equal(sim.acc[:rows], acc)
    assert (want[acc[:, -1] <= 0] == zp).all()
    if c.cols > 1:
        assert len(set(want[:, 0].tolist())) > 6, "the quotients spread over int8"
    assert not np.array_equal(
        want, golden.requantise(acc, bias, mult, shift, zp, rounding.value))


def test_normalise_uses_the_slots_rounding_mode():
    """Each slot's rounding mode applies to NORMALISE's shift: with d = 1 and shift 32 an
    element is ``t / 128`` exactly, so t = +-64, +-192, 320 are ties and t = 32 rounds to 1
    in DOUBLE alone (``t / 64`` ties up, then ``1 / 2`` away from zero); three slots, one
    mode each, on the same rows."""
    c = TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=2)
    t = [64, -64, 32, -32, 192, 320, -192]
    want = {isa.Rounding.HALF_UP: [1, 0, 0, 0, 2, 3, -1],
            isa.Rounding.HALF_EVEN: [0, 0, 0, 0, 2, 2, -2],
            isa.Rounding.DOUBLE: [1, -1, 1, 0, 2, 3, -2]}
    sim = IsaSim(c)
    sim.acc[:len(t)] = [[v, 1] for v in t]
    p = Program(c)
    for slot, rounding in enumerate(want):
        p.load_params(slot, [0, 0], [1, 1], shift=32, rounding=rounding)
        p.activate(0, 8 * slot, len(t), func=isa.Func.NORMALISE, slot=slot)
    sim.run(p.beats)
    for slot, (rounding, column) in enumerate(want.items()):
        got = golden.from_raw(sim.ub[8 * slot:8 * slot + len(t), :2], True)
        assert got[:, 0].tolist() == column, rounding
        assert got[:, 1].tolist() == [0] * len(t), rounding          # 1 / 128


def test_normalise_of_a_weighted_sum():
    """Softmax's division on the core: ``e @ [v | 1]`` puts ``sum(e * v)`` in the first
    columns and ``sum(e)`` in the last, and NORMALISE at shift 25 (``RECIPROCAL_SCALE``)
    leaves the weighted mean of ``v``, within 1 of the exact rational one; the last column
    is ``sum(e) / sum(e) = 1``. Through READ_HOST, MATMUL and WRITE_HOST."""
    c = TPUConfig(rows=8, cols=4)
    rng = rng_for("normalise weighted sum")
    n = 32
    e = rng.integers(0, 128, (n, c.rows))
    e[0] = 0                                             # d = 0: the zero point
    e[1] = [127] + [0] * (c.rows - 1)
    v = rng.integers(-128, 128, (c.rows, c.cols - 1))
    tile = np.concatenate([v, np.ones((c.rows, 1), dtype=np.int64)], axis=1)
    p = Program(c)
    p.read_host(0, e)
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, 0, n, switch=True)
    p.load_params(2, [0] * c.cols, [0] * c.cols, shift=isa.RECIPROCAL_SCALE, zp=0)
    p.activate(0, 100, n, func=isa.Func.NORMALISE, slot=2)
    p.halt()
    sim = IsaSim(c)
    sim.run(p.beats)
    got = golden.from_raw(sim.ub[100:100 + n, :c.cols], True)
    acc = golden.matmul(e, tile)
    assert np.array_equal(got, golden.requantise_normalised(acc, [0] * c.cols,
                                                            isa.RECIPROCAL_SCALE, 0))
    assert got[0].tolist() == [0] * c.cols
    assert got[1].tolist() == v[0].tolist() + [1]
    for i in range(1, n):
        assert got[i, -1] == 1
        for j in range(c.cols - 1):
            exact = Fraction(int(acc[i, j]), int(acc[i, -1]))
            assert abs(got[i, j] - exact) <= 1, (i, j, exact)


@pytest.mark.parametrize("pool", [isa.Pool.MAX2, isa.Pool.MAX4], ids=lambda p: p.name)
def test_normalise_is_pooled_after_the_division(pool):
    """Pooling compares the rows' quotients, each over its own divisor: rows (t, d) =
    (10, 10) and (10, 20) at shift 19 give 64 and 32, so 64; (-30, 10) (saturates to -128)
    and (5, 0) (the zero point, 3) give 3. Random planted rows equal golden's pooled rows."""
    c = TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=2)
    window = POOL_WINDOW[pool]
    rng = rng_for(f"normalise pool {pool.name}")
    hand = np.array([[10, 10], [10, 20], [10, 10], [10, 20],
                     [-30, 10], [5, 0], [-30, 10], [5, 0]])
    acc = np.concatenate([hand, planted_acc(rng, 24, c.cols)])
    sim = IsaSim(c)
    sim.acc[:len(acc)] = acc
    p = Program(c)
    p.load_params(0, [0, 0], [1, 1], shift=19, zp=3)
    p.activate(0, 0, len(acc), func=isa.Func.NORMALISE, pool=pool)
    sim.run(p.beats)
    got = golden.from_raw(sim.ub[:len(acc) // window, :c.cols], True)
    q = golden.requantise_normalised(acc, [0, 0], 19, 3)
    assert q[:8, 0].tolist() == [67, 35, 67, 35, -128, 3, -128, 3]
    assert np.array_equal(got, golden.max_pool_rows(q, window))
    assert got[:8 // window, 0].tolist() == {2: [67, 67, 3, 3], 4: [67, 3]}[window]
    # Dividing the pooled accumulators instead would give 35 for the first window.
    pooled_first = golden.requantise_normalised(golden.max_pool_rows(acc[:window], window),
                                                [0, 0], 19, 3)
    assert pooled_first[0, 0] == 35


# Counters ------------------------------------------------------------------------------------

def counter_beats(**values) -> list[int | None]:
    return [values.get(name, 0) if name in DETERMINISTIC_COUNTERS else None
            for name in isa.COUNTERS]


def test_counters():
    c = TALL    # rows 8, cols 4, weight FIFO 2 (+1 shadow)
    p = Program(c)
    p.read_host(0, np.ones((4, c.rows), dtype=np.int64))
    p.load_weights(0, np.ones((3, c.rows, c.cols), dtype=np.int64))
    p.read_counters()                                 # 2 instructions before it
    p.read_weights(0, 3)                              # first tile enters the shadow registers
    p.matmul(0, 0, 4, switch=True)                    # switch: the next one shifts in
    p.matmul(0, 0, 3, switch=True)
    p.matmul(0, 0, 2, switch=True)                    # queue now empty: no shift
    p.read_counters()
    p.clear_counters()
    p.read_counters()
    p.read_weights(1, 1)
    p.matmul(0, 0, 1)                                 # no switch
    p.read_counters()
    p.halt()
    sim = IsaSim(c)
    sim.feed(p.beats)
    macs = c.rows * c.cols
    want = (counter_beats(instructions=2)
            + counter_beats(instructions=7, array_active=9, useful_macs=9 * macs,
                            weight_shift=3 * c.rows)
            + counter_beats()
            + counter_beats(instructions=3, array_active=1, useful_macs=macs,
                            weight_shift=c.rows)
            + [done(14)])
    assert beats_match(want, sim.output)
    assert sim.output == want
    assert sim.counters()["instructions"] == 5
    assert not beats_match(want[:-1] + [done(13)], sim.output)


def test_failed_instructions_are_not_counted():
    sim = IsaSim(DEFAULT)
    p = Program(DEFAULT)
    p.nop()
    p.write_host(0, 0)          # BAD_FIELD
    sim.feed(p.beats)
    assert sim.status.code == isa.ErrorCode.BAD_FIELD
    sim.clear()
    sim.feed(Program(DEFAULT).read_counters())
    assert sim.output == [error_beat(isa.ErrorCode.BAD_FIELD, 1)] + \
        counter_beats(instructions=1)


# Errors --------------------------------------------------------------------------------------

def _loaded(p: Program, tiles: int = 1):
    """Set-up: tiles 0..tiles-1 written."""
    p.load_weights(0, np.ones((tiles, p.config.rows, p.config.cols), dtype=np.int64))


def _queued(p: Program, n: int):
    _loaded(p)
    for _ in range(n):
        p.read_weights(0)


c = TALL
E = isa.ErrorCode
# (name, set-up, failing instruction word, expected error). TALL: ub_depth 64, acc_depth 64,
# 8 weight tiles, FIFO depth 2 (queue limit 3), 2 parameter slots.
ERROR_CASES = [
    ("opcode14_count0", None, 14, E.BAD_FIELD),        # MATMUL_LOOKUP of 0 rows
    ("opcode15", None, 0xFFFF_FFFF_FFFF_FFFF, E.UNKNOWN_OPCODE),
    ("read_host_count0", None, encode(isa.Opcode.READ_HOST, ub_addr=0, count=0), E.BAD_FIELD),
    ("write_host_count0", None, encode(isa.Opcode.WRITE_HOST, ub_addr=99, count=0),
     E.BAD_FIELD),
    ("load_weights_count0", None, encode(isa.Opcode.LOAD_WEIGHTS, tile=9, count=0),
     E.BAD_FIELD),
    ("read_weights_count0", None, encode(isa.Opcode.READ_WEIGHTS, tile=9, count=0),
     E.BAD_FIELD),
    ("matmul_count0", None, encode(isa.Opcode.MATMUL, count=0, switch=1), E.BAD_FIELD),
    ("activate_count0", None, encode(isa.Opcode.ACTIVATE, count=0, ub_addr=999), E.BAD_FIELD),
    ("activate_func7", None, encode(isa.Opcode.ACTIVATE, count=1, func=7), E.BAD_FIELD),
    ("activate_pool3", None, encode(isa.Opcode.ACTIVATE, count=4, pool=3), E.BAD_FIELD),
    ("activate_window", None, encode(isa.Opcode.ACTIVATE, count=6, pool=isa.Pool.MAX4),
     E.BAD_FIELD),
    ("activate_slot", None, encode(isa.Opcode.ACTIVATE, count=1, slot=2, acc_addr=999),
     E.BAD_FIELD),
    ("load_params_slot", None, encode(isa.Opcode.LOAD_PARAMS, slot=7), E.BAD_FIELD),
    ("load_params_rounding3", None, encode(isa.Opcode.LOAD_PARAMS, slot=1, rounding=3),
     E.BAD_FIELD),
    ("load_params_rounding3_columns", None,
     encode(isa.Opcode.LOAD_PARAMS, slot=0, rounding=3, column_shifts=1), E.BAD_FIELD),
    ("read_host_ub", None, encode(isa.Opcode.READ_HOST, ub_addr=60, count=5), E.UB_RANGE),
    ("write_host_ub", None, encode(isa.Opcode.WRITE_HOST, ub_addr=64, count=1), E.UB_RANGE),
    ("matmul_ub", None, encode(isa.Opcode.MATMUL, ub_addr=63, acc_addr=64, count=2),
     E.UB_RANGE),
    ("activate_ub", None, encode(isa.Opcode.ACTIVATE, ub_addr=63, acc_addr=60, count=4,
                                 pool=isa.Pool.MAX2), E.UB_RANGE),
    ("matmul_acc", None, encode(isa.Opcode.MATMUL, ub_addr=0, acc_addr=63, count=2),
     E.ACC_RANGE),
    ("activate_acc", None, encode(isa.Opcode.ACTIVATE, ub_addr=62, acc_addr=61, count=4,
                                  pool=isa.Pool.MAX2), E.ACC_RANGE),
    ("load_weights_range", None, encode(isa.Opcode.LOAD_WEIGHTS, tile=7, count=2),
     E.WEIGHT_RANGE),
    ("read_weights_range", None, encode(isa.Opcode.READ_WEIGHTS, tile=8, count=1),
     E.WEIGHT_RANGE),
    ("read_weights_unwritten", lambda p: _loaded(p),
     encode(isa.Opcode.READ_WEIGHTS, tile=0, count=2), E.WEIGHT_UNWRITTEN),
    ("unwritten_before_overflow", lambda p: _queued(p, 3),
     encode(isa.Opcode.READ_WEIGHTS, tile=1, count=1), E.WEIGHT_UNWRITTEN),
    ("matmul_switch_empty", lambda p: _queued(p, 1) or p.matmul(0, 0, 1, switch=True),
     encode(isa.Opcode.MATMUL, count=1, switch=1), E.WEIGHT_EMPTY),
    ("matmul_no_active", lambda p: _queued(p, 1),
     encode(isa.Opcode.MATMUL, count=1), E.WEIGHT_EMPTY),
    ("read_weights_overflow", lambda p: _queued(p, 3),
     encode(isa.Opcode.READ_WEIGHTS, tile=0, count=1), E.WEIGHT_OVERFLOW),
    ("read_weights_overflow2", lambda p: _loaded(p, 2) or p.read_weights(0, 2),
     encode(isa.Opcode.READ_WEIGHTS, tile=0, count=2), E.WEIGHT_OVERFLOW),
]


def check_error(config: TPUConfig, name: str, setup, word: int, code: isa.ErrorCode):
    """After a set-up (buffer rows 0..3 random, a parameter slot, then ``setup``), ``word``
    fails with ``code``: the error beat, the status, every later beat discarded until the
    clear, and the state exactly as before the word."""
    rng = rng_for(name)
    p = Program(config)
    p.read_host(0, random_bytes(rng, (4, config.ub_row)))
    p.load_params(0, rng.integers(-9, 9, config.cols), rng.integers(-9, 9, config.cols), zp=3)
    p.nop()
    if setup is not None:
        setup(p)
    index = p.instructions
    sim = IsaSim(config)
    assert sim.feed(p.beats) == 0 and not sim.status.error
    before = snapshot(sim)
    trailing = Program(config).read_host(0, np.full((2, config.ub_row), 7))   # 3 beats
    assert sim.feed([word] + trailing) == 3
    status = sim.status
    assert (status.error, status.code, status.instr_index, status.halted) == \
        (True, code, index, False)
    after = snapshot(sim)
    assert after.pop("output") == before.pop("output") + [error_beat(code, index)]
    assert_same_state(before | {"output": []}, after | {"output": []})
    assert sim.feed(Program(config).halt()) == 1        # discarded until cleared
    sim.clear()
    assert not sim.status.error and sim.status.instr_index == 0
    sim.feed(Program(config).halt())
    assert sim.output[-1] == done(1)


@pytest.mark.parametrize("case", ERROR_CASES, ids=[case[0] for case in ERROR_CASES])
def test_error(case):
    name, setup, word, code = case
    check_error(TALL, name, setup, word, code)


def _u2w(**fields) -> int:
    return encode(isa.Opcode.UB_TO_WEIGHTS, **fields)


ICEBREAKER, WIDE = PRESETS["icebreaker"], PRESETS["wide"]
# (name, config, failing word, expected error). The set-up has written tile 0 and queued it
# (buffer rows 0..3 random), so a word that ran would change tile 0. WIDE: rows 4, cols 8,
# ub_depth 256, 16 tiles; ICEBREAKER: built without UB_TO_WEIGHTS, int8 operands only.
UB_TO_WEIGHTS_ERRORS = [
    ("u2w_not_built", ICEBREAKER, _u2w(tile=0, count=1, signed=1), E.UNKNOWN_OPCODE),
    ("u2w_not_built_transpose", ICEBREAKER, _u2w(tile=0, count=4, signed=1, transpose=1),
     E.UNKNOWN_OPCODE),
    ("u2w_not_built_before_bad_field", ICEBREAKER, _u2w(count=0, tile=99), E.UNKNOWN_OPCODE),
    ("u2w_opcode15_built", WIDE, 15 | _u2w(tile=0, count=1, signed=1) & ~0xF,
     E.UNKNOWN_OPCODE),
    ("u2w_count0", WIDE, _u2w(tile=0, count=0, signed=1), E.BAD_FIELD),
    ("u2w_count0_transpose", WIDE, _u2w(tile=0, count=0, transpose=1, signed=1), E.BAD_FIELD),
    # Past the tile: transposed, count is the tile's columns (8); else its rows (4).
    ("u2w_transpose_count_past_cols", WIDE, _u2w(tile=0, count=9, transpose=1, signed=1),
     E.BAD_FIELD),
    ("u2w_count_past_rows", WIDE, _u2w(tile=0, count=5, signed=1), E.BAD_FIELD),
    ("u2w_count_cols_not_transposed", WIDE, _u2w(tile=0, count=8, signed=1), E.BAD_FIELD),
    ("u2w_bad_field_before_ranges", WIDE, _u2w(ub_addr=999, tile=99, count=9, transpose=1),
     E.BAD_FIELD),
    ("u2w_signedness", ICEBREAKER.replace(ub_to_weights=True), _u2w(tile=0, count=1),
     E.SIGNEDNESS),
    ("u2w_signedness_before_ranges", ICEBREAKER.replace(ub_to_weights=True),
     _u2w(ub_addr=256, tile=8, count=1), E.SIGNEDNESS),
    ("u2w_ub_range", WIDE, _u2w(ub_addr=253, tile=0, count=4, signed=1), E.UB_RANGE),
    ("u2w_ub_range_transpose", WIDE, _u2w(ub_addr=250, tile=0, count=7, transpose=1),
     E.UB_RANGE),
    ("u2w_ub_range_before_weight_range", WIDE, _u2w(ub_addr=256, tile=16, count=1),
     E.UB_RANGE),
    ("u2w_weight_range", WIDE, _u2w(ub_addr=0, tile=16, count=1, signed=1), E.WEIGHT_RANGE),
    ("u2w_weight_range_far", WIDE, _u2w(ub_addr=0, tile=0xFFFF, count=8, transpose=1),
     E.WEIGHT_RANGE),
]


@pytest.mark.parametrize("case", UB_TO_WEIGHTS_ERRORS,
                         ids=[case[0] for case in UB_TO_WEIGHTS_ERRORS])
def test_ub_to_weights_error(case):
    """Each check of UB_TO_WEIGHTS, in ErrorCode order, before any effect: tile 0 (written
    and queued), its flags and the buffer stay as they were."""
    name, config, word, code = case
    check_error(config, name, lambda p: _queued(p, 1), word, code)


def test_ub_to_weights_limits_are_inclusive():
    """The largest fields each check lets through run: count = cols transposed and rows not
    (WIDE: 8 and 4), the last buffer rows, the last tile; and on the int8-only core with the
    opcode built, a signed one."""
    for config, word in [
            (WIDE, _u2w(ub_addr=248, tile=15, count=8, transpose=1, signed=1)),
            (WIDE, _u2w(ub_addr=252, tile=15, count=4)),
            (ICEBREAKER.replace(ub_to_weights=True), _u2w(ub_addr=252, tile=7, count=4,
                                                          transpose=1, signed=1))]:
        sim = IsaSim(config)
        sim.feed([word])
        assert not sim.status.error, (config.name, sim.status)
        assert sim.weight_written.tolist() == [False] * (config.weight_mem_tiles - 1) + [True]


NO_TABLE = TALL.replace(lookup_table=False)


def _table_word(**fields) -> int:
    return encode(isa.Opcode.LOAD_TABLE, **fields)


def _act(**fields) -> int:
    return encode(isa.Opcode.ACTIVATE, **{"count": 1, **fields})


# (name, config, failing word, expected error). The set-up has loaded a table; TALL: ub_depth
# 64, 2 parameter slots.
TABLE_ERRORS = [
    ("load_table_not_built", NO_TABLE, _table_word(), E.UNKNOWN_OPCODE),
    ("load_table_not_built_pad", NO_TABLE, _table_word(_pad=(1 << 58) - 1), E.UNKNOWN_OPCODE),
    ("func_table_not_built", NO_TABLE, _act(func=isa.Func.TABLE), E.BAD_FIELD),
    ("func_table_not_built_before_ub_range", NO_TABLE, _act(func=isa.Func.TABLE, ub_addr=64),
     E.BAD_FIELD),
    ("func_table_built_ub_range", TALL, _act(func=isa.Func.TABLE, ub_addr=64), E.UB_RANGE),
    ("func_table_built_slot", TALL, _act(func=isa.Func.TABLE, slot=2), E.BAD_FIELD),
    ("func_table_built_count0", TALL, _act(func=isa.Func.TABLE, count=0), E.BAD_FIELD),
    ("func7_built", TALL, _act(func=7), E.BAD_FIELD),
    ("func7_not_built", NO_TABLE, _act(func=7), E.BAD_FIELD),
    ("opcode14_not_built", NO_TABLE, 14, E.UNKNOWN_OPCODE),
    ("opcode15_not_built", NO_TABLE, 15, E.UNKNOWN_OPCODE),
]


@pytest.mark.parametrize("case", TABLE_ERRORS, ids=[case[0] for case in TABLE_ERRORS])
def test_table_error(case):
    """LOAD_TABLE on a core without the table is an unknown opcode (its would-be data beats
    discarded with the rest); the function TABLE there is a bad field, checked before the
    ranges; 7 is a bad field on either core. Nothing changes, the table included."""
    name, config, word, code = case
    table = np.arange(256)[::-1]

    def setup(p: Program) -> None:
        if config.lookup_table:
            p.load_table(table)

    check_error(config, name, setup, word, code)


def test_table_limits_run():
    """On a core with the table, ACTIVATE TABLE into the last buffer row with the last slot
    runs; on one without, every other function still runs."""
    for config, word in [(TALL, _act(func=isa.Func.TABLE, ub_addr=63, acc_addr=63, slot=1))] + \
            [(NO_TABLE, _act(func=f)) for f in isa.Func if f != isa.Func.TABLE]:
        sim = IsaSim(config)
        sim.feed([word])
        assert not sim.status.error, (config.lookup_table, word, sim.status)


NO_ROW_SCALE = TALL.replace(row_scale=False)
NEITHER = TALL.replace(row_scale=False, lookup_table=False)
NORMALISE = isa.Func.NORMALISE

# (name, config, failing word, expected error). TALL: ub_depth 64, acc_depth 64, 2 slots.
NORMALISE_ERRORS = [
    ("normalise_not_built", NO_ROW_SCALE, _act(func=NORMALISE), E.BAD_FIELD),
    ("normalise_not_built_max4", NO_ROW_SCALE, _act(func=NORMALISE, count=4, pool=2),
     E.BAD_FIELD),
    ("normalise_not_built_before_ub_range", NO_ROW_SCALE, _act(func=NORMALISE, ub_addr=64),
     E.BAD_FIELD),
    ("normalise_not_built_before_acc_range", NO_ROW_SCALE,
     _act(func=NORMALISE, acc_addr=64), E.BAD_FIELD),
    ("normalise_neither", NEITHER, _act(func=NORMALISE), E.BAD_FIELD),
    ("table_neither", NEITHER, _act(func=isa.Func.TABLE), E.BAD_FIELD),
    ("normalise_icebreaker", ICEBREAKER, _act(func=NORMALISE), E.BAD_FIELD),
    ("normalise_ulx3s", PRESETS["ulx3s"], _act(func=NORMALISE), E.BAD_FIELD),
    ("normalise_built_ub_range", TALL, _act(func=NORMALISE, ub_addr=64), E.UB_RANGE),
    ("normalise_built_acc_range", TALL, _act(func=NORMALISE, acc_addr=64), E.ACC_RANGE),
    ("normalise_built_slot", TALL, _act(func=NORMALISE, slot=2), E.BAD_FIELD),
    ("normalise_built_window", TALL, _act(func=NORMALISE, count=3, pool=1), E.BAD_FIELD),
    ("normalise_built_count0", TALL, _act(func=NORMALISE, count=0), E.BAD_FIELD),
    ("func7_built", TALL, _act(func=7), E.BAD_FIELD),
    ("func7_not_built", NO_ROW_SCALE, _act(func=7), E.BAD_FIELD),
    ("func7_neither", NEITHER, _act(func=7), E.BAD_FIELD),
]


@pytest.mark.parametrize("case", NORMALISE_ERRORS, ids=[case[0] for case in NORMALISE_ERRORS])
def test_normalise_error(case):
    """NORMALISE on a core without the row scale (the board presets' choice for now) is a
    bad field, checked before the ranges; on one with it the other checks stand; 7 is a bad
    field on every core. Nothing changes."""
    name, config, word, code = case
    check_error(config, name, None, word, code)


def test_normalise_limits_run():
    """On a core with the row scale, NORMALISE from the last accumulator row into the last
    buffer row with the last slot runs; on one without, every other function still runs."""
    runs = [(TALL, _act(func=NORMALISE, ub_addr=63, acc_addr=63, slot=1)),
            (TALL, _act(func=NORMALISE, ub_addr=60, acc_addr=60, count=4, pool=2))]
    runs += [(NO_ROW_SCALE, _act(func=f)) for f in isa.Func if f != NORMALISE]
    runs += [(NEITHER, _act(func=f)) for f in isa.Func if f not in OPTIONAL_FUNCS]
    for config, word in runs:
        sim = IsaSim(config)
        sim.feed([word])
        assert not sim.status.error, (config.row_scale, word, sim.status)
    assert set(OPTIONAL_FUNCS) == {isa.Func.TABLE, NORMALISE}


def test_resync_word_recovers_in_band():
    """After an error every beat is discarded until the resynchronisation word, which is
    consumed, clears the error and restarts the program; nothing in between has effect."""
    sim = IsaSim(TALL)
    p = Program(TALL)
    p.nop()
    p.word(15)                                               # UNKNOWN_OPCODE at index 1
    junk = Program(TALL)
    junk.read_host(0, np.full((3, TALL.ub_row), 5))
    junk.halt()
    assert sim.feed(p.beats + junk.beats + [isa.RESYNC_WORD]) == len(junk.beats)
    assert not sim.status.error and sim.status.instr_index == 0
    assert not sim.ub.any(), "a discarded READ_HOST must not write"
    sim.feed(Program(TALL).halt())
    assert sim.output == [error_beat(isa.ErrorCode.UNKNOWN_OPCODE, 1), done(1)]


def test_resync_word_without_error_restarts_the_program():
    sim = IsaSim(TALL)
    p = Program(TALL)
    p.nop()
    p.nop()
    sim.feed(p.beats + [isa.RESYNC_WORD | (0xAB << 64)])     # bits above 64 are ignored
    assert sim.status.instr_index == 0 and not sim.status.error
    sim.feed(Program(TALL).halt())
    assert sim.output == [done(1)]
    assert sim.counters()["instructions"] == 3, "the resync word is not an instruction"


def test_error_clears_halted():
    """D1: nop, halt, a reserved opcode: status 0x03 (error, UNKNOWN_OPCODE, not halted),
    then 0x00 after the clear."""
    sim = IsaSim(TALL)
    p = Program(TALL)
    p.nop()
    p.halt()
    sim.feed(p.beats)
    assert sim.status.halted
    sim.feed([15])
    assert sim.status.as_bits() == 0x03
    sim.clear()
    assert sim.status.as_bits() == 0x00


def test_clear_without_error_does_nothing():
    """D4: 3 x nop, an i_clear pulse with no error pending, halt: the DONE beat counts 4."""
    sim = IsaSim(TALL)
    p = Program(TALL)
    for _ in range(3):
        p.nop()
    sim.feed(p.beats)
    sim.clear()
    assert sim.status.instr_index == 3
    sim.feed(Program(TALL).halt())
    assert sim.output == [done(4)]


def test_status_bits():
    sim = IsaSim(DEFAULT)
    p = Program(DEFAULT)
    p.nop()
    p.nop()
    p.matmul(0, 0, 1)       # WEIGHT_EMPTY at index 2
    sim.feed(p.beats)
    bits = sim.status.as_bits()
    from amaranth.lib import data
    view = data.Layout.cast(isa.Status).from_bits(bits)
    assert (view.error, view.code, view.instr_index, view.halted) == \
        (1, isa.ErrorCode.WEIGHT_EMPTY, 2, 0)


def test_beat_wider_than_host_width_is_rejected():
    with pytest.raises(ValueError, match="host_width"):
        IsaSim(TALL).feed([1 << TALL.host_width])


def test_requantise_shift_63_extreme():
    # Exact: (2**62 + 2**62) >> 63 == 1.
    got = golden.requantise([-2**31], [0], [-2**31], 63, 0)
    assert got.tolist() == [1]


@pytest.mark.parametrize("case", ["load_weights", "matmul", "count0_first", "ub_range_after",
                                  "ub_to_weights", "ub_to_weights_count_first",
                                  "ub_to_weights_ub_range_after"])
def test_signedness_on_int8_core(case: str):
    """``operands="int8"``: LOAD_WEIGHTS, UB_TO_WEIGHTS or MATMUL with ``signed`` clear fails
    with SIGNEDNESS before any effect; BAD_FIELD (count 0, or past the tile) is checked
    before it, UB_RANGE after it. The same instructions on a core for both kinds run."""
    cfg = TPUConfig(rows=2, cols=2, ub_depth=16, acc_depth=16, weight_mem_tiles=2,
                    operands="int8")
    E = isa.ErrorCode
    setup = Program(cfg)
    setup.load_weights(0, np.full((1, 2, 2), -128))
    setup.read_host(0, np.full((2, cfg.ub_row), 127))
    setup.read_weights(0, 1)
    bad, code = {
        "load_weights": (encode(isa.Opcode.LOAD_WEIGHTS, tile=1, count=1, signed=0),
                         E.SIGNEDNESS),
        "matmul": (encode(isa.Opcode.MATMUL, ub_addr=0, acc_addr=0, count=2, switch=1,
                          signed=0), E.SIGNEDNESS),
        "count0_first": (encode(isa.Opcode.MATMUL, count=0, switch=1, signed=0), E.BAD_FIELD),
        "ub_range_after": (encode(isa.Opcode.MATMUL, ub_addr=15, count=2, switch=1, signed=0),
                           E.SIGNEDNESS),
        "ub_to_weights": (encode(isa.Opcode.UB_TO_WEIGHTS, ub_addr=0, tile=1, count=2,
                                 transpose=1, signed=0), E.SIGNEDNESS),
        "ub_to_weights_count_first": (encode(isa.Opcode.UB_TO_WEIGHTS, tile=1, count=3,
                                             signed=0), E.BAD_FIELD),
        "ub_to_weights_ub_range_after": (encode(isa.Opcode.UB_TO_WEIGHTS, ub_addr=16, tile=1,
                                                count=1, signed=0), E.SIGNEDNESS),
    }[case]
    sim = IsaSim(cfg)
    sim.feed(setup.beats + [bad])
    assert (sim.status.error, sim.status.code, sim.status.instr_index) == (True, code, 3)
    assert sim.queue and sim.active is None and not sim.weight_written[1]
    if case in ("load_weights", "matmul", "ub_to_weights"):
        both = IsaSim(cfg.replace(operands="any"))
        both.feed(setup.beats + [bad])
        assert not both.status.error


def _float32_multiplier(scale: np.float32) -> tuple[int, int]:
    """A positive normal float32 as ``(m, s)``, ``scale == m / 2**s``, ``m`` its 24-bit
    significand (docs/isa.md, Rounding modes)."""
    mantissa, exponent = np.frexp(np.float64(scale))     # scale = mantissa * 2**exponent
    m = int(mantissa * 2**24)
    return m, 24 - int(exponent)


def test_half_even_reproduces_a_float32_scale_as_documented():
    """The argument in docs/isa.md: HALF_EVEN with a float32 scale's significand as the
    multiplier equals ``nearbyint(float32(t) * scale)`` in float32 except (1) where the
    float32 product is a half-integer the exact product is not, or (2) ``|t| > 2**24``.
    Checked on random scales and accumulators, near-ties planted."""
    rng = rng_for("float32 scale")
    checked = exceptions = 0
    for _ in range(300):
        scale = np.float32(2.0 ** rng.uniform(-30, -2) * rng.uniform(1, 2))
        m, s = _float32_multiplier(scale)
        assert 0 <= s <= 63 and 2**23 <= m < 2**24 and m / 2**s == float(scale)
        t = rng.integers(-2**31, 2**31, 200)
        t[:100] //= 2 ** rng.integers(0, 31, 100)                # small ones too
        # Near-ties: t with t * scale close to k + 1/2.
        k = rng.integers(-200, 200, 50) + 0.5
        t[100:150] = np.clip(np.round(k / float(scale)), -2**31, 2**31 - 1).astype(np.int64)
        x32 = np.float32(t.astype(np.float32) * scale)           # float32 product
        ort = np.rint(x32).astype(np.int64)
        ours = golden.rounding_shift(t * m, s, golden.HALF_EVEN)
        inside = np.abs(x32) < 2**22
        for ti, o, r, x in zip(t[inside], ours[inside], ort[inside], x32[inside], strict=True):
            checked += 1
            if o == r:
                continue
            exceptions += 1
            exact_twice = 2 * int(ti) * m                           # 2x, times 2**s
            lands_on_tie = float(x) * 2 % 2 == 1 and exact_twice != int(float(x) * 2) << s
            assert lands_on_tie or abs(int(ti)) > 2**24, (int(ti), m, s, float(x), o, r)
    assert checked > 40_000
    print(f"{checked} products, {exceptions} documented exceptions")
