"""MATMUL_LOOKUP and the sum tables on the RTL core against the ISA simulator
(:class:`rtl_pair.Pair`: every output beat ``==``, the same status, then the state read back).

One program on the tiny array with a deep buffer (UNIT_BASE, the activation benches'
build): both sum tables loaded with random int32 entries and the
extremes (``-2**31``, ``2**31 - 1``, so that two terms wrap), every byte value looked up
through an identity tile in both tables (int8 and uint8 activations), lookups that overwrite
and that accumulate, back to back with plain MATMULs and with rows that add into the row
written the cycle before, a tile whose sums leave the byte (the low byte indexes), then
ACTIVATE of the sums. Then the interlock: a LOAD_TABLE of a sum table right behind a long
MATMUL_LOOKUP waits until its rows are written (else they would read the new entries), and
the checks (a table target of 3, MATMUL_LOOKUP on a core without the tables). The ISA level
is ``tests/sim/test_matmul_lookup.py``.
"""

from __future__ import annotations

import numpy as np
from rtl_pair import BARE, UNIT_BASE, Pair, describe

from firmware.asm import Program
from hdl import isa

SEED = 7311

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _tables(rng) -> np.ndarray:
    tables = rng.integers(INT32_MIN, INT32_MAX + 1, (2, 256))
    tables[0, [0, 127, 128, 255]] = [INT32_MAX, INT32_MIN, INT32_MAX, -1]
    tables[1, [0, 1, 128, 255]] = [INT32_MAX, INT32_MAX, INT32_MIN, INT32_MIN]
    return tables


def _lookups(pair: Pair, tables, rng) -> None:
    """Every byte through both tables, accumulating and not, beside plain MATMULs; the
    accumulators, their ACTIVATE and the counters equal the ISA simulator's."""
    cfg = pair.config
    p = Program(cfg)
    p.load_sum_table(0, tables[0])
    p.load_sum_table(1, tables[1])
    # Every byte value once, two to a row, shuffled; then the extremes side by side.
    values = rng.permutation(256).reshape(-1, cfg.ub_row)
    p.read_host(0, np.where(values > 127, values - 256, values))
    extremes = np.array([[-128, 127], [127, -128], [0, -1], [-1, 0]] * 2)
    p.read_host(128, extremes)
    p.load_weights(0, np.eye(cfg.rows, cfg.cols, dtype=np.int64))
    p.load_weights(1, np.array([[-128, 127], [-128, -1]]))      # sums past the byte
    p.read_weights(0, 2)
    n = len(values)
    p.matmul_lookup(0, 0, n, table=0, switch=True)                       # int8
    p.matmul_lookup(0, 0, n, table=1, accumulate=True, signed=False)     # uint8, added
    p.matmul_lookup(128, n, 8, table=1)
    p.matmul_lookup(128, n, 8, table=0, accumulate=True)
    # Rows that add into the row written the cycle before (the same accumulator row twice).
    for k in range(3):
        p.matmul_lookup(128 + k, n + 8, 1, table=k % 2, accumulate=k > 0)
    p.matmul(0, n + 9, 6)                                                # a plain MATMUL
    p.matmul_lookup(0, n + 9, 6, table=1, accumulate=True)
    p.matmul_lookup(8, n + 15, 12, table=0, switch=True)                # the second tile
    p.matmul(8, n + 15, 12, accumulate=True)
    total = n + 27
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols, shift=24)
    p.activate(0, 400, total)
    p.write_host(400, total)
    p.read_counters()
    p.halt()
    what = f"seed {SEED}: MATMUL_LOOKUPs:\n{describe(p.beats, cfg)}"
    pair.run(p.beats, what)
    acc = pair.ref.sim.acc.copy()
    pair.check_state(what)
    # The int8 and uint8 readings of a byte take the same entry: row i is T0[b] + T1[b].
    flat = values.reshape(-1, cfg.cols)
    want = (tables[0][flat] + tables[1][flat] + (1 << 31)) % (1 << 32) - (1 << 31)
    assert (acc[:n] == want).all(), f"seed {SEED}: the ISA simulator's own lookups"


def _lookups_after_reset(pair: Pair, seed: int) -> None:
    """Reset, then at once lookups of the byte's extremes in both tables through an identity
    tile: the accumulators equal the ISA simulator's, whose tables are zero after a reset."""
    cfg = pair.config
    pair.reset()
    p = Program(cfg)
    p.read_host(0, np.array([[-128, 127], [127, -128], [0, -1], [-1, 0]])[:, :cfg.ub_row])
    p.load_weights(0, np.eye(cfg.rows, cfg.cols, dtype=np.int64))
    p.read_weights(0)
    p.matmul_lookup(0, 0, 4, table=1, switch=True)
    p.matmul_lookup(0, 0, 4, table=0, accumulate=True)
    p.halt()
    pair.run(p.beats, f"seed {seed}: lookups right after a reset")
    pair.check_state(f"seed {seed}: lookups right after a reset")


def test_sum_tables(rtl_device):
    """MATMUL_LOOKUP's accumulators equal the ISA simulator's for every byte in both tables;
    a sum-table LOAD_TABLE waits for the lookups in flight; after a reset the tables hold
    zeros again; BAD_FIELD for target 3, UB_RANGE one row past the buffer."""
    pair = Pair(rtl_device(UNIT_BASE))
    cfg = pair.config
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    tables = _tables(rng)
    _lookups(pair, tables, rng)

    # The interlock: a long MATMUL_LOOKUP, then at once new entries for its table. Its rows
    # are in the array as the LOAD_TABLE is fetched; they must take the old entries.
    p = Program(cfg)
    p.matmul_lookup(0, 0, 60, table=0)
    p.load_sum_table(0, rng.integers(INT32_MIN, INT32_MAX + 1, 256))
    p.matmul_lookup(0, 60, 4, table=0)
    p.halt()
    pair.run(p.beats, f"seed {SEED}: a sum-table LOAD_TABLE behind a MATMUL_LOOKUP")
    pair.check_state(f"seed {SEED}: a sum-table LOAD_TABLE behind a MATMUL_LOOKUP")

    # After a reset the tables hold zeros again (the tables are memories: the accumulators
    # zero them in the background, and a lookup right after the reset waits for that).
    _lookups_after_reset(pair, SEED)

    E = isa.ErrorCode
    pair.reset()
    pair.stop_on(lambda q: q.instr(isa.Opcode.LOAD_TABLE, target=3), E.BAD_FIELD,
                 f"seed {SEED + 1}: LOAD_TABLE target 3", seed=SEED + 1)
    # A MATMUL_LOOKUP checked as a MATMUL (the ISA level tries every check): past the
    # buffer.
    pair.reset()
    pair.stop_on(lambda q: q.matmul_lookup(cfg.ub_depth - 3, 0, 4, table=1), E.UB_RANGE,
                 f"seed {SEED + 2}: MATMUL_LOOKUP past the buffer", seed=SEED + 2)


def test_reset_zeroes_the_tables_before_a_lookup(rtl_device):
    """On the tiny core (a 64-row buffer: the core takes instructions some 70 cycles after a
    reset, before the 512 cycles of the tables' zeroing are over) a lookup right after a
    reset waits for the zeroing: it reads zeros, not the entries loaded before the reset,
    as the ISA simulator."""
    pair = Pair(rtl_device("tiny"))
    cfg = pair.config
    rng = np.random.default_rng(SEED + 5)
    print(f"seed {SEED + 5}")
    tables = _tables(rng)
    p = Program(cfg)
    p.load_sum_table(0, tables[0])
    p.load_sum_table(1, tables[1])
    p.halt()
    pair.run(p.beats, f"seed {SEED + 5}: tables loaded")
    _lookups_after_reset(pair, SEED + 5)


def test_no_sum_tables(rtl_device):
    """A core built without the sum tables (BARE, as the boards) refuses MATMUL_LOOKUP's
    opcode with nothing changed."""
    pair = Pair(rtl_device(BARE))
    pair.stop_on(lambda q: q.matmul_lookup(0, 0, 1, table=0), isa.ErrorCode.UNKNOWN_OPCODE,
                 f"seed {SEED + 4}: MATMUL_LOOKUP without the tables", seed=SEED + 4)
