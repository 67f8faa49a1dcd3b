"""Directed tests of the interlocks and of the address boundaries, on the RTL core against
the ISA simulator (:class:`rtl_pair.Pair`: every output beat ``==``, the same status).

For each rule of :data:`hdl.control.hazards.HAZARD_RULES` a short program makes that rule
hold an instruction back, and the core's coverage counters (``RtlDevice.coverage()``, since
the reset before the program) must show stall cycles on that rule and on no other: the test
provably exercises it. The same program with the second instruction's range moved one row
(or tile) past the first one's must not stall at all (ranges are half-open). Every program
ends with a read-back of the whole state (:func:`hoststreams.dump_program`).

The boundary tests, on the tiny core, touch the first and the last row of the unified buffer
and of the accumulators, the last weight tile and the last parameter slot, with single-row
transfers and ranges that end exactly at the end (no error), and ranges one past the end,
which must fail with the ISA simulator's code and index and change nothing.

The simulator is ``SIM`` (Icarus by default); one simulator process per configuration
(the ``rtl_device`` fixture).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hoststreams import load_weight_set
from rtl_pair import Pair, describe

from firmware.asm import Program
from hdl import isa
from hdl.config import TPUConfig
from hdl.control.hazards import HAZARD_RULES
from hdl.isa import Pool
from hdl.presets import get_config

SEED = 4242


@pytest.fixture
def pair(rtl_device):
    """``get(config_key)``: the RTL core of that configuration, reset, and an ISA simulator."""
    return lambda config_key: Pair(rtl_device(config_key))


def _setup(cfg: TPUConfig, rng: np.random.Generator) -> Program:
    """State for the scenarios, written without any hazard: every weight tile, buffer rows
    0..23, accumulator rows 0..15 (tile 0 active, the queue empty), parameter slot 0."""
    p = Program(cfg)
    load_weight_set(p, rng)
    p.read_host(0, rng.integers(-128, 128, (24, cfg.ub_row)))
    p.read_weights(0, 1)
    p.matmul(0, 0, 16, switch=True)
    p.load_params(0, rng.integers(-2**10, 2**10, cfg.cols), rng.integers(1, 2**12, cfg.cols),
                  shift=10, zp=-3, clamp=100)
    p.sync()
    return p


def _row(cfg: TPUConfig, value: int = 0x5A) -> np.ndarray:
    return np.full((1, cfg.ub_row), value)


# Each scenario: (rule, variant, build(program, config, hit)). With ``hit`` the second
# instruction's range ends in the first one's last row (or tile); without, it starts just
# past it. Ranges are chosen so that no other rule can hold.
Scenario = Callable[[Program, TPUConfig, bool], None]
SCENARIOS: list[tuple[str, str, Scenario]] = [
    ("read_host_war_matmul", "",
     lambda p, c, hit: (p.matmul(0, 32, 10), p.read_host(9 if hit else 10, _row(c)))),
    ("read_host_waw_activate", "",
     lambda p, c, hit: (p.activate(0, 30, 10), p.read_host(39 if hit else 40, _row(c)))),
    ("read_host_waw_activate", "max4",       # 8 rows pooled by 4: buffer rows 30 and 31
     lambda p, c, hit: (p.activate(0, 30, 8, pool=Pool.MAX4),
                        p.read_host(31 if hit else 32, _row(c)))),
    ("read_host_war_write_host", "",
     lambda p, c, hit: (p.write_host(0, 20), p.read_host(19 if hit else 20, _row(c)))),
    ("write_host_raw_activate", "",
     lambda p, c, hit: (p.activate(0, 30, 10), p.write_host(39 if hit else 40, 1))),
    ("write_host_raw_activate", "max2",      # 10 rows pooled by 2: buffer rows 30..34
     lambda p, c, hit: (p.activate(0, 30, 10, pool=Pool.MAX2),
                        p.write_host(34 if hit else 35, 1))),
    ("load_weights_war_read_weights", "",    # the queue's capacity: 5 tiles
     lambda p, c, hit: (p.read_weights(1, c.weight_fifo_depth + 1),
                        p.load_weights(c.weight_fifo_depth + (1 if hit else 2),
                                       np.full((c.rows, c.cols), 7)))),
    ("matmul_raw_activate", "",
     lambda p, c, hit: (p.activate(0, 30, 10), p.matmul(39 if hit else 40, 48, 1))),
    ("matmul_war_activate_acc", "",
     lambda p, c, hit: (p.activate(0, 30, 10), p.matmul(0, 9 if hit else 10, 1))),
    ("activate_raw_matmul_acc", "",
     lambda p, c, hit: (p.matmul(0, 32, 10), p.activate(41 if hit else 42, 50, 1))),
    ("activate_war_matmul", "",
     lambda p, c, hit: (p.matmul(0, 32, 10), p.activate(16, 9 if hit else 10, 1))),
    ("activate_war_matmul", "max4",          # 4 rows pooled into one buffer row
     lambda p, c, hit: (p.matmul(0, 32, 10),
                        p.activate(16, 9 if hit else 10, 4, pool=Pool.MAX4))),
    ("activate_war_write_host", "",
     lambda p, c, hit: (p.write_host(0, 20), p.activate(16, 19 if hit else 20, 1))),
    ("ub_to_weights_raw_activate", "",
     lambda p, c, hit: (p.activate(0, 30, 10), p.ub_to_weights(39 if hit else 40, 1, 1))),
    ("ub_to_weights_raw_activate", "transpose",   # its last row the ACTIVATE's first
     lambda p, c, hit: (p.activate(0, 30, 10),
                        p.ub_to_weights(30 - c.cols + (1 if hit else 0),
                                        1, c.cols, transpose=True))),
    ("ub_to_weights_war_read_weights", "",  # the queue's capacity: 5 tiles
     lambda p, c, hit: (p.read_weights(1, c.weight_fifo_depth + 1),
                        p.ub_to_weights(0, c.weight_fifo_depth + (1 if hit else 2), 2))),
]
assert {rule for rule, _, _ in SCENARIOS} == set(HAZARD_RULES)


def _scenario_params(configs: tuple[str, ...], slow: tuple[str, ...] = ()):
    """Every scenario on each configuration; those on *slow* in ``make regression``."""
    return [pytest.param(config, i, id=f"{config}-{rule}" + (f"-{variant}" if variant else ""),
                         marks=pytest.mark.slow if config in slow else ())
            for config in configs for i, (rule, variant, _) in enumerate(SCENARIOS)]


def _run_scenario(pair: Pair, index: int, hit: bool) -> tuple[dict[str, int], str]:
    rule, variant, build = SCENARIOS[index]
    cfg = pair.config
    seed = SEED + index
    print(f"seed {seed}, {cfg.name}, {rule} {variant}, {'hit' if hit else 'near miss'}")
    p = _setup(cfg, np.random.default_rng(seed))
    start = len(p.beats)
    build(p, cfg, hit)
    p.halt()
    what = (f"seed {seed}, {cfg.name}, {rule} {variant} ({'hit' if hit else 'near miss'}), "
            f"after the set-up:\n{describe(p.beats[start:], cfg)}")
    pair.run(p.beats, what)
    stalls = pair.stalls()
    pair.check_state(what)
    return stalls, what


@pytest.mark.parametrize("config_key, index", _scenario_params(("tiny", "wide"),
                                                             slow=("wide",)))
def test_rule_holds(pair, config_key: str, index: int):
    """The rule, and only it, stalls the core; the results equal the ISA simulator's."""
    stalls, what = _run_scenario(pair(config_key), index, hit=True)
    rule = SCENARIOS[index][0]
    assert stalls[rule] > 0, f"{what}\n{rule} never stalled the core: {stalls}"
    others = {name: n for name, n in stalls.items() if name != rule and n}
    assert not others, f"{what}\nother rules stalled the core too: {others}"


@pytest.mark.parametrize("config_key, index", _scenario_params(("tiny",)))
def test_adjacent_ranges_do_not_stall(pair, config_key: str, index: int):
    """The same instructions with ranges that touch but do not overlap: no stall at all."""
    stalls, what = _run_scenario(pair(config_key), index, hit=False)
    assert not any(stalls.values()), f"{what}\nstalled without a conflict: {stalls}"


# Boundaries (tiny: 64 buffer rows, 64 accumulator rows, 8 tiles, 4 parameter slots) -----

def test_first_and_last_rows(pair):
    """Single-row transfers at the first and the last row of the unified buffer and of the
    accumulators, the last weight tile and the last parameter slot, and ranges that end
    exactly at the last row (no error)."""
    pair = pair("tiny")
    cfg = pair.config
    ub, acc, tiles, slots = cfg.ub_depth, cfg.acc_depth, cfg.weight_mem_tiles, cfg.param_slots
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    p = Program(cfg)
    last_tile = rng.integers(-128, 128, (cfg.rows, cfg.cols))
    p.load_weights(tiles - 1, last_tile)                    # the last tile alone
    p.load_weights(0, rng.integers(0, 256, (tiles - 1, cfg.rows, cfg.cols)), signed=False)
    p.read_host(0, rng.integers(-128, 128, (1, cfg.ub_row)))          # first row
    p.read_host(ub - 1, rng.integers(-128, 128, (1, cfg.ub_row)))     # last row
    p.read_host(ub - 4, rng.integers(-128, 128, (3, cfg.ub_row)))     # ends at the last - 1
    p.write_host(0, 1)
    p.write_host(ub - 1, 1)
    p.read_weights(tiles - 1, 1)
    p.matmul(ub - 1, acc - 1, 1, switch=True)               # last row to last row
    p.matmul(0, 0, 1)                                       # first to first
    p.matmul(ub - 4, acc - 4, 4, accumulate=True)           # ends at the last rows
    p.load_params(slots - 1, rng.integers(-2**8, 2**8, cfg.cols),
                  rng.integers(1, 2**10, cfg.cols), shift=6, zp=1, clamp=50)
    p.activate(acc - 1, ub - 1, 1, slot=slots - 1)          # last to last
    p.activate(0, 0, 1, slot=slots - 1)
    p.activate(acc - 4, ub - 1, 4, pool=Pool.MAX4, slot=slots - 1)   # one pooled row, last
    p.activate(acc - 8, ub - 4, 8, pool=Pool.MAX2, slot=slots - 1)   # ends at the last row
    p.write_host(0, ub)                                     # the whole buffer
    p.read_weights(tiles - cfg.weight_fifo_depth - 1, cfg.weight_fifo_depth + 1)  # a full queue
    p.matmul(0, 0, acc, switch=True)                        # every accumulator row
    p.halt()
    pair.run(p.beats, f"seed {SEED}: first and last rows")
    pair.check_state(f"seed {SEED}: first and last rows")


def _past_end(cfg: TPUConfig) -> list[tuple[str, Callable[[Program], object], isa.ErrorCode]]:
    ub, acc, tiles, slots = cfg.ub_depth, cfg.acc_depth, cfg.weight_mem_tiles, cfg.param_slots
    row = np.zeros((1, cfg.ub_row))
    tile = np.ones((cfg.rows, cfg.cols))
    full = cfg.weight_fifo_depth + 1
    E = isa.ErrorCode
    return [
        ("read_host one row past", lambda p: p.read_host(ub, row), E.UB_RANGE),
        ("read_host range one past", lambda p: p.read_host(ub - 3, np.zeros((4, cfg.ub_row))),
         E.UB_RANGE),
        ("write_host one row past", lambda p: p.write_host(ub, 1), E.UB_RANGE),
        ("write_host all rows and one", lambda p: p.write_host(0, ub + 1), E.UB_RANGE),
        ("matmul buffer one past", lambda p: p.matmul(ub - 3, 0, 4), E.UB_RANGE),
        ("matmul accumulators one past", lambda p: p.matmul(0, acc - 3, 4), E.ACC_RANGE),
        ("activate accumulators one past", lambda p: p.activate(acc - 3, 0, 4), E.ACC_RANGE),
        ("activate buffer one past", lambda p: p.activate(0, ub - 3, 4), E.UB_RANGE),
        ("activate max4 buffer one past",
         lambda p: p.activate(0, ub - 1, 8, pool=Pool.MAX4), E.UB_RANGE),
        ("activate max2 accumulators one past",
         lambda p: p.activate(acc - 7, 0, 8, pool=Pool.MAX2), E.ACC_RANGE),
        ("load_weights one tile past", lambda p: p.load_weights(tiles, tile), E.WEIGHT_RANGE),
        ("load_weights range one past",
         lambda p: p.load_weights(tiles - 1, np.ones((2, cfg.rows, cfg.cols))),
         E.WEIGHT_RANGE),
        ("read_weights range one past", lambda p: p.read_weights(tiles - 1, 2), E.WEIGHT_RANGE),
        ("read_weights one tile more than the queue holds",    # one tile is queued
         lambda p: p.read_weights(0, full), E.WEIGHT_OVERFLOW),
        ("load_params slot past", lambda p: p.load_params(slots, [1] * cfg.cols,
                                                          [1] * cfg.cols), E.BAD_FIELD),
        ("activate slot past", lambda p: p.activate(0, 0, 1, slot=slots), E.BAD_FIELD),
    ]


PAST_END = [name for name, _, _ in _past_end(get_config("tiny"))]


@pytest.mark.parametrize("case", PAST_END)
def test_one_past_the_end(pair, case: str):
    """A range one row (tile, slot) past the end fails with the ISA simulator's code and
    index, after the earlier instructions' output, and changes nothing: after the resynchronisation
    word the whole state equals the ISA simulator's."""
    pair = pair("tiny")
    cfg = pair.config
    index = PAST_END.index(case)
    seed = SEED + 100 + index
    print(f"seed {seed}, {case}")
    rng = np.random.default_rng(seed)
    _, bad, code = _past_end(cfg)[index]
    p = Program(cfg)
    load_weight_set(p, rng)
    p.read_host(0, rng.integers(-128, 128, (8, cfg.ub_row)))
    p.read_host(cfg.ub_depth - 2, rng.integers(-128, 128, (2, cfg.ub_row)))
    p.read_weights(0, 2)
    p.matmul(0, cfg.acc_depth - 8, 8, switch=True)
    p.load_params(cfg.param_slots - 1, [3] * cfg.cols, [5] * cfg.cols, shift=2)
    p.write_host(cfg.ub_depth - 2, 2)            # in flight when the bad instruction comes
    good = p.instructions
    start = len(p.beats)
    bad(p)
    text = describe(p.beats[start:], cfg).splitlines()[0]
    p.read_host(0, np.full((1, cfg.ub_row), 0x33))   # discarded: the core has stopped
    p.halt()
    what = f"seed {seed}, {case}: {text}"
    pair.run(p.beats, what)
    status = pair.rtl.status()
    assert (status.error, status.code, status.instr_index) == (True, code, good), \
        f"{what}: status {status}, expected {code.name} at {good}"
    pair.check_state(what, resync=True)


#: A core for int8 only, its products two to an SB_MAC16 (the iCE40's dual 8x8 mode).
INT8_ONLY = get_config("tiny").replace(multiplier="ice40", operands="int8")


@pytest.mark.parametrize("case", ["load_weights", "matmul"])
def test_uint8_refused_on_int8_core(pair, case: str):
    """``operands="int8"``: a LOAD_WEIGHTS or MATMUL with ``signed`` clear stops the core
    with SIGNEDNESS at its index, before it has any effect (no data beat of the refused
    LOAD_WEIGHTS is written); the int8 work before it is done, and after the
    resynchronisation word the whole state equals the ISA simulator's."""
    pair = pair(INT8_ONLY)
    cfg = pair.config
    seed = SEED + 300 + (case == "matmul")
    print(f"seed {seed}, {case}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    p.load_weights(0, rng.integers(-128, 128, (2, cfg.rows, cfg.cols)))
    p.read_host(0, np.array([[-128] * cfg.ub_row, [127] * cfg.ub_row]))
    p.read_weights(0, 1)
    p.matmul(0, 0, 2, switch=True)
    good = p.instructions
    if case == "load_weights":
        p.load_weights(1, rng.integers(0, 256, (1, cfg.rows, cfg.cols)), signed=False)
    else:
        p.matmul(0, 2, 2, signed=False)
    p.halt()
    what = f"seed {seed}, {case} signed=0 on an int8-only core"
    pair.run(p.beats, what)
    status = pair.rtl.status()
    assert (status.error, status.code, status.instr_index) == \
        (True, isa.ErrorCode.SIGNEDNESS, good), f"{what}: status {status}"
    pair.check_state(what, resync=True)


@pytest.mark.parametrize("config_key", ["tiny", "small"])
def test_back_to_back_accumulation_into_one_row(pair, config_key: str):
    """MATMULs whose first row accumulates into the row the one before wrote last, issued
    back to back (one-row MATMULs into one row, and longer ones overlapping by a row): the
    accumulators of these cores have no read-during-write bypass, so the matrix engine must
    leave a cycle between such rows (the reference and compact pipelines); every sum
    equals the ISA simulator's."""
    pair = pair(config_key)
    cfg = pair.config
    seed = SEED + 400
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    p.load_weights(0, rng.integers(-128, 128, (1, cfg.rows, cfg.cols)))
    p.read_host(0, rng.integers(-128, 128, (16, cfg.ub_row)))
    p.read_weights(0, 1)
    p.matmul(0, 5, 1, switch=True)
    for ub in range(1, 6):
        p.matmul(ub, 5, 1, accumulate=True)         # five more into row 5
    p.matmul(6, 8, 3, accumulate=True)              # rows 8..10
    p.matmul(9, 10, 3, accumulate=True)             # its first row is the last one's
    p.matmul(12, 12, 1, accumulate=True)
    p.matmul(13, 12, 2, accumulate=False)           # overwrites: no wait needed
    p.halt()
    what = f"seed {seed}: back-to-back accumulation into one row ({config_key})"
    pair.run(p.beats, what)
    pair.check_state(what)
