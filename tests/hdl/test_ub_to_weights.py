"""UB_TO_WEIGHTS on the RTL core against the ISA simulator (:class:`rtl_pair.Pair`: every
output beat ``==``, the same status, then the whole state read back).

Directed programs move unified-buffer rows into weight tiles in both forms, at the extremes
(-128, 127, the first and last buffer rows, the last tile, a tile of one row or column and a
full one), and multiply with them on the array; the attention case computes ``A @ B.T`` from
two matrices that never leave the chip as weights and checks it against numpy too. The
errors (a count of 0 or past the tile, a range past the buffer or the weight memory, uint8
on an int8-only core, the opcode on a core built without it) stop the core with the ISA
simulator's code and change nothing. The interlocks are in :mod:`test_interlocks`.
"""

from __future__ import annotations

import numpy as np
import pytest
from rtl_pair import BARE, Pair, describe
from tiers import tiered

from firmware.asm import Program
from hdl.isa import ErrorCode, Opcode
from hdl.presets import get_config

SEED = 5151

#: The tiny core, and with the fast pipeline (registered memories: the mover's reads and
#: writes each take a cycle more).
CONFIGS = {"tiny": get_config("tiny"),
           "tiny-fast": get_config("tiny").replace(pipeline="fast")}


@pytest.fixture
def pair(rtl_device):
    return lambda config: Pair(rtl_device(CONFIGS.get(config, config)))


def _matmul_back(p: Program, tile: int, ub_in: int, rows: int, acc: int) -> None:
    """Multiply buffer rows ``ub_in..`` by ``tile`` into accumulators ``acc..`` (the state
    read-back sends them)."""
    p.read_weights(tile, 1)
    p.matmul(ub_in, acc, rows, switch=True)


@pytest.mark.parametrize("config_key", tiered(CONFIGS, fast=["tiny"]))
def test_forms_and_extremes(pair, config_key: str):
    """Plain and transposed moves, full and partial, from the first and the last buffer rows
    into the first and the last tile, of rows holding -128 and 127 (products near the
    accumulators' extremes after a run of MATMULs with accumulate), then used by MATMULs."""
    pair = pair(config_key)
    cfg = pair.config
    rows, cols, ub, tiles = cfg.rows, cfg.cols, cfg.ub_depth, cfg.weight_mem_tiles
    seed = SEED + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {cfg.name}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    extremes = np.where(rng.random((max(rows, cols), cfg.ub_row)) < 0.5, -128, 127)
    p.read_host(0, extremes)
    p.read_host(ub - cols, rng.integers(-128, 128, (cols, cfg.ub_row)))
    p.read_host(32, np.full((4, cfg.ub_row), -128))
    p.ub_to_weights(0, 0, rows)                             # plain, full
    p.ub_to_weights(ub - cols, tiles - 1, cols, transpose=True)   # transposed, last rows
    p.ub_to_weights(ub - 1, 1, 1)                           # one row: the rest zero
    p.ub_to_weights(ub - 1, 2, 1, transpose=True)           # one column
    p.ub_to_weights(0, 3, max(1, cols - 1), transpose=True)  # all but the last column
    p.ub_to_weights(0, 4, 2, signed=False, transpose=True)  # uint8 weights
    for i, tile in enumerate((0, tiles - 1, 1, 2, 3, 4)):
        _matmul_back(p, tile, 32 if tile == 0 else 0, 4, 8 * i)
    for _ in range(6):                                      # -128 * -128 * rows, 7 times
        p.matmul(32, 0, 4, accumulate=True)
    p.halt()
    what = f"seed {seed}, {cfg.name}:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    pair.check_state(what)


@pytest.mark.parametrize("config_key", tiered(CONFIGS, fast=["tiny"]))
def test_attention_scores_on_chip(pair, config_key: str):
    """Q @ K.T with K moved on chip (transposed) and S @ V with V moved as it is: the
    accumulators equal numpy's product of the int8 matrices, and the ISA simulator's."""
    pair = pair(config_key)
    cfg = pair.config
    rows, cols = cfg.rows, cfg.cols
    seed = SEED + 10 + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {cfg.name}")
    rng = np.random.default_rng(seed)
    d, n = min(rows, cfg.ub_row), min(cols, rows)    # head size, sequence length
    q = rng.integers(-128, 128, (n, d))
    k = rng.integers(-128, 128, (n, d))
    v = rng.integers(-128, 128, (n, cols))
    pad = np.zeros((n, cfg.ub_row), dtype=int)
    p = Program(cfg)
    p.read_host(0, _padded(q, pad))                     # Q: rows 0..n-1
    p.read_host(16, _padded(k, pad))                    # K: rows 16..
    p.read_host(32, _padded(v, pad))                    # V: rows 32..
    p.ub_to_weights(16, 0, n, transpose=True)           # tile 0 = K.T (d x n)
    p.ub_to_weights(32, 1, n)                           # tile 1 = V (n x cols)
    p.read_weights(0, 2)
    p.matmul(0, 0, n, switch=True)                      # Q @ K.T
    p.matmul(0, 16, n, switch=True)                     # Q[:, :n] @ V
    p.halt()
    what = f"seed {seed}, {cfg.name}: attention"
    pair.run(p.beats, what)
    acc = pair.sim.acc
    assert (acc[0:n, :n] == q @ k.T).all(), f"{what}: Q @ K.T differs from numpy"
    assert (acc[16:16 + n, :cols] == q[:, :n] @ v).all(), f"{what}: Q @ V differs from numpy"
    pair.check_state(what)


@pytest.mark.parametrize("config_key", tiered(CONFIGS, fast=["tiny"]))
def test_next_instruction_waits(pair, config_key: str):
    """The instruction right behind a UB_TO_WEIGHTS sees it done: a READ_WEIGHTS of the
    tile it writes reads the new rows (read after write through the weight memory), and a
    READ_HOST or an ACTIVATE into the rows it reads does not change what it moves (write
    after read through the unified buffer). The front end waits for the mover (no rule of
    the tracker covers these), which a front end that did not would fail here."""
    pair = pair(config_key)
    cfg = pair.config
    rows, cols = cfg.rows, cfg.cols
    seed = SEED + 20 + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {cfg.name}")
    rng = np.random.default_rng(seed)
    n = max(rows, cols)
    p = Program(cfg)
    p.load_weights(0, rng.integers(-128, 128, (3, rows, cols)))
    p.read_host(0, rng.integers(-128, 128, (n + 8, cfg.ub_row)))
    p.read_weights(0, 1)
    p.matmul(0, 0, 4, switch=True)                      # accumulator rows for the ACTIVATE
    p.load_params(0, [0] * cols, [1] * cols)
    p.sync()
    p.ub_to_weights(0, 1, rows)                         # tile 1, then read at once
    p.read_weights(1, 1)
    p.ub_to_weights(0, 2, cols, transpose=True)         # rows 0.. moved, then overwritten
    p.read_host(0, np.full((n, cfg.ub_row), 0x55))
    p.ub_to_weights(0, 0, rows)                         # and overwritten by an ACTIVATE
    p.activate(0, 0, 4)
    p.read_weights(0, 1)
    p.read_weights(2, 1)
    for i in range(3):
        p.matmul(n, 8 + 8 * i, 8, switch=True)
    p.halt()
    what = f"seed {seed}, {cfg.name}:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    pair.check_state(what)


def _padded(x: np.ndarray, pad: np.ndarray) -> np.ndarray:
    out = pad.copy()
    out[:, :x.shape[1]] = x
    return out


def _move_after(p: Program) -> None:
    """The instruction after a bad one (discarded): a move."""
    p.ub_to_weights(0, 1, 1)


def _bad_cases(cfg):
    rows, cols, ub, tiles = cfg.rows, cfg.cols, cfg.ub_depth, cfg.weight_mem_tiles
    E = ErrorCode
    return [
        ("count 0", lambda p: p.ub_to_weights(0, 0, 0), E.BAD_FIELD),
        ("count past the rows", lambda p: p.ub_to_weights(0, 0, rows + 1), E.BAD_FIELD),
        ("count past the columns",
         lambda p: p.ub_to_weights(0, 0, cols + 1, transpose=True), E.BAD_FIELD),
        ("buffer one row past", lambda p: p.ub_to_weights(ub - 1, 0, 2), E.UB_RANGE),
        ("tile one past", lambda p: p.ub_to_weights(0, tiles, 1), E.WEIGHT_RANGE),
    ]


BAD = [name for name, _, _ in _bad_cases(get_config("tiny"))]


@pytest.mark.parametrize("case", BAD)
def test_bad_fields(pair, case: str):
    """Each bad field stops the core with the ISA simulator's code at its index, and the
    tile it names keeps what it held."""
    pair = pair("tiny")
    index = BAD.index(case)
    _, bad, code = _bad_cases(pair.config)[index]
    print(f"seed {SEED}, {case}")
    pair.stop_on(bad, code, f"seed {SEED}, {case}",
                 seed=SEED, after=_move_after)


def test_refused_where_not_built(pair):
    """A core built without it (the iCEBreaker's choice) reports UNKNOWN_OPCODE; an
    int8-only core refuses uint8 (SIGNEDNESS)."""
    without = BARE
    pair(without).stop_on(lambda p: p.ub_to_weights(0, 0, 1), ErrorCode.UNKNOWN_OPCODE,
             f"seed {SEED}, {Opcode.UB_TO_WEIGHTS.name} on a core without it",
                 seed=SEED, after=_move_after)
    int8 = get_config("tiny").replace(multiplier="ice40", operands="int8")
    pair(int8).stop_on(lambda p: p.ub_to_weights(0, 0, 1, signed=False),
             ErrorCode.SIGNEDNESS, f"seed {SEED}, uint8 on an int8-only core",
                 seed=SEED, after=_move_after)
