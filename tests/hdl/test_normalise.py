"""ACTIVATE's function NORMALISE on the RTL core against the ISA simulator
(:class:`rtl_pair.Pair`: every output beat ``==``, the same status, then the whole state read
back): each row divided by its last column's accumulator through the reciprocal table.

The directed program makes accumulator rows whose divisor is 1 (the largest reciprocal: the
row saturates), small (exact reciprocals), large enough to be cut (``e`` up to 9 on these
arrays; the models' own tests reach ``e = 22``), zero and negative (a reciprocal of 0), with
the other columns at the extremes; then normalises them with three parameter slots: the
plain ``t / d`` (shift 25), a shift that ``e`` pushes past 63 (clamped) in TFLite's double
rounding, and per-column shifts to even, through pooling too. The errors: NORMALISE on a
core built without the row scale, and function 7.
"""

from __future__ import annotations

import numpy as np
import pytest
from rtl_pair import BARE, UNIT_BASE, Pair, describe, slow_variants, unit_variants

from firmware.asm import Program
from hdl.isa import RECIPROCAL_SCALE, ErrorCode, Func, Pool, Rounding

SEED = 7171

#: The pipelined unit on the tiny array, with the fast pipeline, the serial unit, and a
#: wider row (the divisor in column 2).
CONFIGS = unit_variants(UNIT_BASE)


@pytest.fixture
def pair(rtl_device):
    return lambda config: Pair(rtl_device(CONFIGS.get(config, config)))


def _accumulators(p: Program, cfg, rng: np.random.Generator) -> int:
    """Accumulator rows 0.. with divisors of every kind in the last column; returns the
    rows. Tile 0 passes the buffer row through (identity), tile 1 adds every element into
    the last column (a row sum, as softmax's ones column does)."""
    rows, cols, last = cfg.rows, cfg.cols, cfg.cols - 1
    identity = np.eye(rows, cols, dtype=int)
    sums = identity.copy()
    sums[:, last] = 127
    p.load_weights(0, np.stack([identity, sums]))
    count = 32
    x = rng.integers(-128, 128, (count, cfg.ub_row))
    x[:4] = np.where(rng.random((4, cfg.ub_row)) < 0.5, -128, 127)   # the extremes
    p.read_host(cfg.ub_depth - count, x)
    p.read_weights(0, 2)
    p.matmul(cfg.ub_depth - count, 0, count // 2, switch=True)      # divisor x[last] (or 0)
    p.matmul(cfg.ub_depth - count // 2, count // 2, count // 2, switch=True)  # 127 * sum
    for _ in range(3):          # larger divisors: e > 0
        p.matmul(cfg.ub_depth - count // 4, count - count // 4, count // 4, accumulate=True)
    return count


@pytest.mark.parametrize("config_key", slow_variants(CONFIGS, ("tiny-fast", "tiny-serial",
                                                               "2x3")))
def test_divisors_of_every_kind(pair, config_key: str):
    pair = pair(config_key)
    cfg = pair.config
    seed = SEED + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {config_key}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    count = _accumulators(p, cfg, rng)
    cols = cfg.cols
    # A row whose divisor is 1 (the largest reciprocal) and one whose divisor is -1: the
    # buffer's last element passed to the last column too.
    rows = cfg.rows
    one = np.zeros((2, cfg.ub_row), dtype=int)
    one[0, :rows] = [127] * (rows - 1) + [1]
    one[1, :rows] = [-128] * (rows - 1) + [-1]
    tile = np.eye(rows, cols, dtype=int)
    tile[rows - 1, cols - 1] = 1
    p.load_weights(2, tile[None])
    p.read_host(cfg.ub_depth - 40, one)
    p.read_weights(2, 1)
    p.matmul(cfg.ub_depth - 40, count, 2, switch=True)
    count += 2
    bias, zp = rng.integers(100, 500, cols), int(rng.integers(-10, 10))   # d = 1: saturates
    p.load_params(0, bias, [0] * cols, shift=RECIPROCAL_SCALE, zp=zp)
    p.load_params(1, [0] * cols, [0] * cols, shift=60, rounding=Rounding.DOUBLE, zp=-3)
    p.load_params(2, [0] * cols, [0] * cols, shift=[18 + k for k in range(cols)],
                  rounding=Rounding.HALF_EVEN)
    out = 0
    for slot in range(3):
        p.activate(0, out, count, func=Func.NORMALISE, slot=slot)
        out += count
    p.activate(0, out, count & ~1, func=Func.NORMALISE, pool=Pool.MAX2)
    out += count // 2
    p.halt()
    what = f"seed {seed}, {config_key}:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    # Slot 0 is t / d + zp, rounded (the reciprocal's cut costs at most one): the meaning,
    # where it does not saturate, from the accumulators.
    acc = pair.sim.acc[:count, :cols].astype(np.int64)
    got = pair.sim.ub[:count, :cols].astype(np.int8).astype(np.int64)
    d = acc[:, -1:]
    kinds = {"d = 1": (d == 1).any(), "d <= 0": (d <= 0).any(),
             "exact, 1 < d < 512": ((d > 1) & (d < 512)).any(),
             "cut, d >= 2**12": (d >= 1 << 12).any()}
    assert all(kinds.values()), f"seed {seed}: divisors missing: {kinds}"
    meant = np.where(d > 0, (acc + bias) / np.maximum(d, 1), 0) + zp
    inside = (np.abs(meant) < 126) & (d > 0)
    assert (np.abs(got - meant)[inside] <= 1).all(), f"seed {seed}: slot 0 is not t / d"
    assert (got[d[:, 0] <= 0] == zp).all(), f"seed {seed}: d <= 0 is not the zero point"
    assert ((got == 127) | (got == -128)).any(), f"seed {seed}: nothing saturates"
    pair.check_state(what)


def test_refused_where_not_built(pair):
    """NORMALISE on a core without the row scale (the boards' choice for now), and
    function 7 on one with it: BAD_FIELD."""
    without = pair(BARE)
    without.stop_on(lambda p: p.activate(0, 8, 4, func=Func.NORMALISE), ErrorCode.BAD_FIELD,
             f"seed {SEED}, NORMALISE on a core without it", seed=SEED)
    pair("tiny").stop_on(lambda p: p.activate(0, 8, 4, func=7), ErrorCode.BAD_FIELD,
             f"seed {SEED}, function 7", seed=SEED)
