"""The programmable table (LOAD_TABLE, ACTIVATE's function TABLE) on the RTL core against the
ISA simulator (:class:`rtl_pair.Pair`: every output beat ``==``, the same status, then the
whole state read back).

The directed programs look up every one of the 256 entries (requantised values -128..127,
and sums past them that saturate), with entries at the byte's extremes (0x00, 0x7f, 0x80,
0xff), through pooling, before any LOAD_TABLE (zeros after a reset), and after a second
LOAD_TABLE replaced the first. The timing rules: an ACTIVATE right behind a LOAD_TABLE
reads the new table (its last entry too), and a LOAD_TABLE right behind an ACTIVATE waits
for it, which a front end that did not would fail here. The errors (the opcode on a core
built without it, the function TABLE there) stop the core with the ISA simulator's code
(function 7: :mod:`test_normalise`).
"""

from __future__ import annotations

import numpy as np
import pytest
from rtl_pair import BARE, UNIT_BASE, Pair, describe, slow_variants, unit_variants

from firmware.asm import Program
from hdl.isa import ErrorCode, Func, Pool

SEED = 6161

#: The pipelined unit (a table per column) on the tiny array, with the fast pipeline, the
#: serial unit (the table beside the fixed ones in one memory), and 3 columns, whose last
#: table beat is partial (12 entries a beat: 22 beats, the last holding 4).
CONFIGS = unit_variants(UNIT_BASE)


@pytest.fixture
def pair(rtl_device):
    return lambda config: Pair(rtl_device(CONFIGS.get(config, config)))


def _table(rng: np.random.Generator) -> np.ndarray:
    """256 random bytes with the extremes at both ends of the index range."""
    table = rng.integers(0, 256, 256)
    table[[0, 1, 126, 127, 128, 129, 254, 255]] = [0x80, 0xff, 0x00, 0x7f,
                                                   0xff, 0x80, 0x7f, 0x00]
    return table


def _every_value(p: Program, cfg, ub: int) -> int:
    """Accumulator rows 0.. holding -128..127 (an identity tile times buffer rows from
    ``ub``), slot 0's parameters the identity (every int8 value once) and slot 1's times 3
    plus a zero point of 5 (most saturate). Returns the rows."""
    per = min(cfg.rows, cfg.cols)
    count = -(-256 // per)
    act = np.zeros((count, cfg.ub_row), dtype=int)
    act[:, :per] = np.resize(np.arange(-128, 128), count * per).reshape(count, per)
    p.load_weights(0, np.eye(cfg.rows, cfg.cols, dtype=int)[None])
    p.read_host(ub, act)
    p.read_weights(0, 1)
    p.matmul(ub, 0, count, switch=True)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols)
    p.load_params(1, [0] * cfg.cols, [3] * cfg.cols, zp=5)
    return count


@pytest.mark.parametrize("config_key", slow_variants(CONFIGS, ("tiny-fast", "tiny-serial",
                                                               "2x3")))
def test_every_entry(pair, config_key: str):
    """Every entry looked up, through pooling and saturation too; a second LOAD_TABLE
    replaces every entry of the first; after a reset the table holds zeros."""
    pair = pair(config_key)
    cfg = pair.config
    seed = SEED + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {cfg.name}, {config_key}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    ub_in = cfg.ub_depth - 256                      # the inputs at the end
    count = _every_value(p, cfg, ub_in)
    out = 0
    for table in (_table(rng), _table(rng)):
        p.load_table(table)
        plain = out
        p.activate(0, out, count, func=Func.TABLE)
        out += count
        p.activate(0, out, count & ~3, func=Func.TABLE, pool=Pool.MAX4)
        out += count // 4
        p.activate(0, out, count, func=Func.TABLE, slot=1)     # saturated lookups
        out += count
    p.halt()
    assert out <= ub_in, "the outputs run into the inputs"
    what = f"seed {seed}, {config_key}:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    # The ISA simulator looks up what numpy does (the last table, identity slot) ...
    q = np.clip(pair.sim.acc[:count, :cfg.cols], -128, 127)
    expect = table[q + 128]                                 # as the buffer's raw bytes
    got = pair.sim.ub[plain:plain + count, :cfg.cols].astype(np.int64)
    assert (got == expect).all(), f"seed {seed}: the ISA simulator's lookups differ from numpy"
    # ... and the RTL holds what it does.
    pair.check_state(what)
    # After a reset the table is zeros again (the RTL's table keeps the last program's
    # unless its scrub clears it).
    pair.reset()
    p = Program(cfg)
    _every_value(p, cfg, ub_in)
    p.read_host(0, np.full((count, cfg.ub_row), 0x55))
    p.activate(0, 0, count, func=Func.TABLE)
    p.halt()
    pair.run(p.beats, f"seed {seed}, {config_key}: after a reset")
    assert (pair.sim.ub[:count] == 0).all(), f"seed {seed}: the table is not zero"
    pair.check_state(f"seed {seed}, {config_key}: after a reset")


@pytest.mark.parametrize("config_key", slow_variants(["tiny", "tiny-fast", "tiny-serial"]))
def test_timing(pair, config_key: str):
    """An ACTIVATE right behind a LOAD_TABLE reads the new table, its last entry too (q =
    127, the last written); a LOAD_TABLE right behind a long ACTIVATE waits until it is
    done, so the ACTIVATE reads the old table to its last row."""
    pair = pair(config_key)
    cfg = pair.config
    seed = SEED + 10 + list(CONFIGS).index(config_key)
    print(f"seed {seed}, {config_key}")
    rng = np.random.default_rng(seed)
    p = Program(cfg)
    count = _every_value(p, cfg, cfg.ub_depth // 2)
    old, new = _table(rng), _table(rng)
    p.load_table(old)
    p.activate(0, 0, count, func=Func.TABLE)            # the whole range with the old table
    p.load_table(new)                                   # waits for it
    p.activate(count - 1, count, 1, func=Func.TABLE)    # at once: the last row, q = 127 ...
    p.activate(0, count + 1, count, func=Func.TABLE)    # ... and everything with the new
    p.halt()
    what = f"seed {seed}, {config_key}:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    pair.check_state(what)


def test_refused_where_not_built(pair):
    """A core built without the table (the boards' choice for now) reports UNKNOWN_OPCODE
    for LOAD_TABLE (its data beats are then discarded with the rest) and BAD_FIELD for the
    function TABLE."""
    without = pair(BARE)
    without.stop_on(lambda p: p.load_table(np.arange(256)), ErrorCode.UNKNOWN_OPCODE,
             f"seed {SEED}, LOAD_TABLE on a core without it", seed=SEED)
    without.reset()
    without.stop_on(lambda p: p.activate(0, 8, 4, func=Func.TABLE), ErrorCode.BAD_FIELD,
             f"seed {SEED}, ACTIVATE TABLE on a core without it", seed=SEED)
