"""The core: cocotb tests (tb_core.py) against the ISA simulator, run through sim.rtl.runner.

``make test`` runs 75 constrained-random programs (a block of 25 on each pipeline, the tiny
core); ``make regression`` adds the other first blocks (the 4x4, the 4x8, the ULX3S build and
MULT18X18D) and 7 more (275 programs); ``make soak`` 17 more blocks (425 programs), including
the 8x8 and 16x16 cores.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tiers import SOAK, tiered

from hdl.config import TPUConfig
from hdl.core import Core
from hdl.isa import Opcode
from hdl.presets import get_config
from sim.rtl.gtkw import fst_signals, gtkw_traces, read_enum_filter
from sim.rtl.runner import run

HERE = Path(__file__).parent
PROGRAMS_PER_BLOCK = 25


#: Configurations that are no preset: the tiny core with each pipeline (the iCEBreaker
#: preset's "compact", the ULX3S preset's "fast"), the fast pipeline on MULT18X18D (the whole
#: ULX3S build: its MULT18X18D model, registered memories, buffered beats) and the reference
#: pipeline on MULT18X18D, under the bench's stalls.
CONFIGS = {"tiny-compact": get_config("tiny").replace(pipeline="compact"),
           "tiny-fast": get_config("tiny").replace(pipeline="fast"),
           "tiny-ulx3s": get_config("tiny").replace(pipeline="fast", multiplier="ecp5"),
           "tiny-ecp5": get_config("tiny").replace(multiplier="ecp5"),
           # The fast pipeline with 3 rows (not a power of two): LOAD_WEIGHTS and READ_WEIGHTS
           # scale their tiles to rows a cycle late (TPUConfig.scale_tiles_late).
           "3x2-fast": TPUConfig(rows=3, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=8,
                                 pipeline="fast"),
           # Both of the last two in one build, make test's directed core on the fast
           # pipeline: the ULX3S build's choices with the late scaling of 3 rows.
           "3x2-ulx3s": TPUConfig(rows=3, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=8,
                                  pipeline="fast", multiplier="ecp5")}


def run_core(config_key: str, testcase: str, **env):
    config = CONFIGS.get(config_key) or get_config(config_key)
    run("core", lambda: Core(config), config_key, "tb_core", HERE, testcase,
        extra_env={k: str(v) for k, v in env.items()}, config=config)


# (configuration, first block, blocks): block b runs seeds 1000 + 25 b .. 1000 + 25 b + 24,
# so every block has seeds of its own. _FAST: the first blocks, whose programs'
# coverage test_random_volume.test_stall_bench_programs checks; make test runs those of
# FAST_TIER_BLOCKS (one per pipeline), make regression the others (a wide block is 34 s to
# 48 s) and _SLOW's, make soak _SOAK's.
_FAST = (("tiny", 0, 2), ("small", 4, 1), ("wide", 6, 1), ("tiny-compact", 8, 1),
         ("tiny-fast", 27, 1), ("tiny-ulx3s", 29, 1), ("tiny-ecp5", 31, 1))
FAST_TIER_BLOCKS = (("tiny", 0), ("tiny-compact", 8), ("tiny-fast", 27))
_SLOW = (("tiny", 2, 2), ("small", 5, 1), ("wide", 7, 1), ("tiny-compact", 9, 1),
         ("tiny-fast", 28, 1), ("tiny-ulx3s", 30, 1))
#: The blocks of make soak: the tiny core's eight, the 4x4's four, the 4x8's two, the 8x8's
#: and the 16x16's (a minute or more each on Icarus).
_SOAK = (("tiny", 10, 8), ("small", 18, 4), ("wide", 22, 2), ("default", 24, 2),
         ("large", 26, 1))
RANDOM_BLOCKS = (
    [pytest.param(key, b, id=f"{key}-{b}",
                  marks=() if (key, b) in FAST_TIER_BLOCKS else pytest.mark.slow)
     for key, first, blocks in _FAST for b in range(first, first + blocks)] +
    [pytest.param(key, b, id=f"{key}-{b}", marks=marks)
     for blocks_of, marks in ((_SLOW, pytest.mark.slow), (_SOAK, SOAK))
     for key, first, blocks in blocks_of for b in range(first, first + blocks)]
)


@pytest.mark.parametrize("config_key, block", RANDOM_BLOCKS)
def test_random_programs(config_key: str, block: int):
    run_core(config_key, "test_random_programs", AMTPU_PROGRAMS=PROGRAMS_PER_BLOCK,
             AMTPU_SEED=1000 + block * PROGRAMS_PER_BLOCK)


@pytest.mark.parametrize("config_key", tiered(
    ["tiny", "small", "wide", "default", "tiny-compact", "tiny-fast", "tiny-ulx3s", "tiny-ecp5",
     "3x2-fast", "3x2-ulx3s"],
    fast=["tiny", "3x2-ulx3s"]))
def test_directed(config_key: str):
    run_core(config_key, "test_directed_each_instruction")


@pytest.mark.parametrize("config_key", tiered(
    ["tiny", "small", "tiny-compact", "tiny-fast", "tiny-ulx3s"],
    fast=["tiny", "tiny-fast"]))
def test_errors(config_key: str):
    run_core(config_key, ["test_error", "test_error_priority"])


@pytest.mark.parametrize("config_key", tiered(["tiny", "wide", "tiny-compact", "tiny-ulx3s"],
                                              fast=["tiny"]))
def test_status_clear_and_reset(config_key: str):
    """D1 (halted cleared by an error), D4 (i_clear without an error), D2 (reset clears the
    memories)."""
    run_core(config_key, ["test_error_clears_halted", "test_clear_without_error_does_nothing",
                          "test_reset_clears_memories"])


@pytest.mark.slow          # 40 s: 2,049 weight tiles
def test_weight_address_past_16_bits():
    """D3: 2049 tiles of 32 rows: LOAD_WEIGHTS to tile 2048 writes row 65536 and up, not
    tile 0 (the front end's address register once held only 16 bits)."""
    config = TPUConfig(rows=32, cols=1, ub_depth=16, acc_depth=16, weight_mem_tiles=2049)
    run("core", lambda: Core(config), "d3-32x1-2049", "tb_core", HERE,
        "test_far_weight_tile", config=config)


@pytest.mark.slow          # 54 s; bench/ measures it, test_gemm_ragged runs the GEMM in CI
def test_gemm_64x64_default():
    run_core("default", "test_gemm", AMTPU_GEMM_SIZE=64)


@pytest.mark.parametrize("config_key, size", tiered([("tiny", 3), ("wide", 13)],
                                                   fast=[("tiny", 3)]))
def test_gemm_ragged(config_key: str, size: int):
    """Sizes that are not multiples of the array (tiny holds only 8 weight tiles)."""
    run_core(config_key, "test_gemm", AMTPU_GEMM_SIZE=size)


@pytest.mark.slow          # make test checks the tour's .gtkw against its waveform
def test_waves_gtkw():
    """WAVES=1 output: the core's .gtkw shows the instruction at the front end decoded into
    its fields, the opcode and the error code by name (GTKWave translate filters written from
    hdl.isa), and every trace it names exists in the waveform."""
    if shutil.which("fst2vcd") is None:
        pytest.skip("fst2vcd (Debian package gtkwave) is needed to read the waveform's names")
    config = get_config("tiny")
    gtkw = run("core", lambda: Core(config), "tiny", "tb_core", HERE,
               "test_clear_without_error_does_nothing", label="waves-check", waves=True,
               config=config)
    assert gtkw is not None and gtkw.is_file()
    text = gtkw.read_text()
    fst = Path(re.search(r'^\[dumpfile\] "([^"]+)"', text, re.MULTILINE)[1])
    groups = [line[1:] for line in text.splitlines() if line.startswith("-")]
    assert {"i_host", "o_host", "instruction", "status"} <= set(groups)
    traces = gtkw_traces(text)
    missing = [trace for trace in traces if trace not in set(fst_signals(fst).values())]
    assert not missing, f"{gtkw} names signals not in {fst}: {missing}"
    lines = text.splitlines()
    for field in ("fetch_opcode[3:0]", ".opcode[3:0]", ".code[3:0]"):
        at = next(i for i, line in enumerate(lines) if line.endswith(field))
        table = Path(lines[at - 1].split(" ", 1)[1])
        assert lines[at - 1].startswith("^") and table.is_file(), f"{field}: no filter"
    opcodes = read_enum_filter(gtkw.parent / "opcode.gtkwfilter")
    assert all(opcodes[op.value] == op.name for op in Opcode)
