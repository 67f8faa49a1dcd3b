"""MATMUL_LOOKUP and the sum tables at the ISA level: the ISA simulator against
:func:`sim.models.golden.lookup_sums`, the assembler's text and API, the configuration, and
every check the instruction and LOAD_TABLE's ``target`` add (the state unchanged after each
error). The RTL is ``tests/hdl/test_sum_tables.py``."""

from __future__ import annotations

import numpy as np
import pytest

from firmware.asm import AsmError, Program, assemble, disassemble
from hdl import isa
from hdl.config import ConfigError, TPUConfig
from hdl.presets import get_config
from sim.models import golden
from sim.models.isa_sim import IsaSim

SEED = 5150
E = isa.ErrorCode


def _tables(rng) -> np.ndarray:
    tables = rng.integers(-2**31, 2**31, (2, 256))
    tables[:, [0, 127, 128, 255]] = [[2**31 - 1, -2**31, 2**31 - 1, -1],
                                     [2**31 - 1, 2**31 - 1, -2**31, -2**31]]
    return tables


@pytest.mark.parametrize("preset", ["tiny", "small", "wide", "default"])
def test_lookups_equal_the_golden_model(preset):
    """Two tensors through both tables (int8 then uint8 readings of the same bytes), and a
    tile whose sums leave the byte: the accumulators equal ``lookup_sums`` of the plain
    MATMUL's sums, wrapped."""
    cfg = get_config(preset)
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}, {preset}")
    tables = _tables(rng)
    n = 24
    x = rng.integers(-128, 128, (n, cfg.ub_row))
    y = rng.integers(0, 256, (n, cfg.ub_row))
    w = rng.integers(-128, 128, (cfg.rows, cfg.cols))
    p = Program(cfg)
    p.load_sum_table(0, tables[0])
    p.load_sum_table(1, tables[1])
    p.read_host(0, x)
    p.read_host(n, y)
    p.load_weights(0, [np.eye(cfg.rows, cfg.cols, dtype=np.int64), w])
    p.read_weights(0, 2)
    p.matmul_lookup(0, 0, n, table=0, switch=True)
    p.matmul_lookup(n, 0, n, table=1, accumulate=True, signed=False)
    p.matmul_lookup(0, n, n, table=1, switch=True)
    p.halt()
    sim = IsaSim(cfg)
    sim.run(p.beats)
    eye = np.eye(cfg.rows, cfg.cols, dtype=np.int64)
    sums_x = golden.matmul(x[:, :cfg.rows], eye)
    sums_y = golden.matmul(y[:, :cfg.rows], eye, x_signed=False)
    want = golden.wrap(golden.lookup_sums(sums_x, tables[0]) +
                       golden.lookup_sums(sums_y, tables[1]))
    assert (sim.acc[:n] == want).all(), f"seed {SEED}: T0[x] + T1[y]"
    sums = golden.matmul(x[:, :cfg.rows], w)
    assert (np.abs(sums) > 127).any()
    assert (sim.acc[n:2 * n] == golden.lookup_sums(sums, tables[1])).all(), \
        f"seed {SEED}: sums past the byte index by their low byte"
    # Through the identity the int8 value -1 and the uint8 value 255 take the same entry.
    assert (golden.lookup_sums([[-1, 255, -128, 128]], tables[0]) ==
            tables[0][[255, 255, 128, 128]]).all()


def test_assembler_text_round_trips():
    """``load_table target=sum1`` with ``.sums`` lines and ``matmul_lookup``: the text the
    disassembler prints assembles to the same beats, on 8 columns and on 3 (a partial last
    beat)."""
    rng = np.random.default_rng(SEED + 1)
    for cfg in (get_config("default"), get_config("small").replace(cols=3, host_width=None)):
        p = Program(cfg)
        p.load_sum_table(1, _tables(rng)[1])
        p.matmul_lookup(5, 7, 9, table=1, accumulate=True, switch=True)
        p.matmul_lookup(5, 7, 9, table=0, signed=False)
        text = disassemble(p.beats, cfg)
        assert "load_table target=sum1" in text
        assert text.count(".sums") == isa.sum_table_beats(cfg.cols)
        assert assemble(text, cfg) == p.beats, text
    cfg = get_config("default")
    with pytest.raises(AsmError, match="256 entries"):
        Program(cfg).load_sum_table(0, [0] * 255)
    with pytest.raises(AsmError, match="not an int32"):
        Program(cfg).load_sum_table(0, [2**31] + [0] * 255)
    with pytest.raises(AsmError, match="allowed: 0 or 1"):
        Program(cfg).load_sum_table(2, [0] * 256)
    with pytest.raises(AsmError, match="allowed: exactly 8"):
        assemble("load_table target=sum0\n.sums 1 2 3\n", cfg)


def test_configuration():
    """The sum tables follow the programmable table unless told; both boards have none; a
    core without the table cannot have them."""
    assert get_config("default").sum_tables
    assert not get_config("icebreaker").sum_tables and not get_config("ulx3s").sum_tables
    assert not TPUConfig(lookup_table=False).sum_tables
    assert not get_config("default").replace(lookup_table=False).sum_tables
    assert isa.Opcode.MATMUL_LOOKUP not in get_config("ulx3s").opcodes
    with pytest.raises(ConfigError, match="sum_tables=True is not supported"):
        TPUConfig(lookup_table=False, sum_tables=True)


def _stops(cfg, build, code) -> None:
    """``build(program)`` after a set-up stops the ISA simulator with ``code`` at its index,
    with every memory and both tables as they were (``E.NONE``: it runs)."""
    rng = np.random.default_rng(SEED + 2)
    p = Program(cfg)
    p.load_sum_table(0, _tables(rng)[0])
    p.read_host(0, rng.integers(-128, 128, (4, cfg.ub_row)))
    p.load_weights(0, [np.eye(cfg.rows, cfg.cols, dtype=np.int64)])
    p.read_weights(0)
    p.matmul_lookup(0, 0, 4, table=0, switch=True)
    good = p.instructions
    sim = IsaSim(cfg)
    sim.run(p.beats)
    before = (sim.ub.copy(), sim.acc.copy(), sim.sum_tables.copy(), sim.table.copy())
    q = Program(cfg)
    build(q)
    q.matmul_lookup(0, 4, 4, table=0)          # discarded: the core has stopped
    sim.feed(q.beats)
    assert sim.error == code, f"{disassemble(q.beats, cfg)}: {sim.error}, expected {code}"
    if code == E.NONE:      # (the range's edge: it ran)
        return
    assert sim.status.instr_index == good, sim.status
    after = (sim.ub, sim.acc, sim.sum_tables, sim.table)
    assert all((a == b).all() for a, b in zip(before, after, strict=True))


def test_errors():
    """Target 3 is BAD_FIELD (no data beats taken); a core without the sum tables decodes no
    target; MATMUL_LOOKUP is UNKNOWN_OPCODE without the tables, and is checked as a MATMUL:
    count 0, past the buffer or the accumulators, uint8 on an int8 core, no tile."""
    cfg = get_config("small")
    _stops(cfg, lambda q: q.instr(isa.Opcode.LOAD_TABLE, target=3), E.BAD_FIELD)
    _stops(cfg, lambda q: q.matmul_lookup(0, 0, 0, table=1), E.BAD_FIELD)
    _stops(cfg, lambda q: q.matmul_lookup(cfg.ub_depth - 3, 0, 4, table=1), E.UB_RANGE)
    _stops(cfg, lambda q: q.matmul_lookup(cfg.ub_depth - 4, 0, 4, table=1), E.NONE)
    _stops(cfg, lambda q: q.matmul_lookup(0, cfg.acc_depth - 1, 2, table=0), E.ACC_RANGE)
    # A core without the sum tables decodes no target: every LOAD_TABLE is the activation
    # table's (its data beats too), as its netlist is the one before the sum tables.
    no_sums = cfg.replace(sum_tables=False)
    for target in (1, 2, 3):
        sim = IsaSim(no_sums)
        p = Program(no_sums)
        p.instr(isa.Opcode.LOAD_TABLE, target=target)
        p.beats.extend(Program(no_sums).load_table(list(range(256)))[1:])
        p.halt()
        sim.run(p.beats)
        assert sim.table.tolist() == list(range(256)), target
    sim = IsaSim(no_sums)
    sim.feed(Program(no_sums).matmul_lookup(0, 0, 1, table=0))
    assert sim.error == E.UNKNOWN_OPCODE
    int8 = cfg.replace(operands="int8")
    _stops(int8, lambda q: q.matmul_lookup(0, 0, 1, table=0, signed=False), E.SIGNEDNESS)
    sim = IsaSim(cfg)
    sim.feed(Program(cfg).matmul_lookup(0, 0, 1, table=0))
    assert sim.error == E.WEIGHT_EMPTY
