"""Coverage-driven random programs in volume: the RTL core (:class:`RtlDevice`, through the
fast transport) against the ISA simulator, every output beat compared with ``==`` (the
timing-dependent counters, ``None`` on the ISA side, match anything: ``beats_match``).

Programs come from :func:`progen.program_block`: blocks of :data:`BLOCK` programs back to back
from a reset (so a program inherits the weight queue, the active tile and the memories of
the ones before it), each drawn from its own seed. Every program must end halted with no
error, as the ISA simulator's does. :mod:`funcov` counts what the programs contain and, from
the RTL's coverage counters, which hazard rules stalled the core and which engines overlapped;
each test prints its table and fails if a point the generator promises for its configuration
was never hit. The tables also appear at the end of the pytest run.

None runs in ``make test``: a Verilator build of each configuration is 15 to 40 s, which it
cannot pay (it runs the per-cycle bench's random programs on every
pipeline on Icarus, ``test_core.py``, and the directed programs on the 3x5 fast core). The
first blocks of :data:`FIRST` (300 programs on nine configurations: three presets, one of
them non-square, the ULX3S's build for Fmax on a 3x5 array whose rows are not a power of two,
with memories so small that the ends of every memory come up in most programs, the same on
the reference and compact pipelines, the iCEBreaker's, an int8-only one on paired SB_MAC16
products, and MULT18X18D and LUT products in one array) and :data:`SLOW` (12,950 more, the
seeds after the first blocks', and five more configurations: one-row tiles, a tall array,
the default 8x8 core, the ULX3S's build for Fmax on ``wide`` and the 12x12 ULX3S build):
``make regression`` runs the first blocks and :data:`REGRESSION_SHARE` more of each, ``make
soak`` the rest. The simulator is Verilator: one build per configuration, then 8 to 25 times
Icarus's speed on these programs; ``AMTPU_VOLUME_SIM=icarus`` overrides it.

:func:`test_stall_bench_programs` measures the programs ``tb_core.py`` runs with random
valid/ready stalls (shorter transfers; the bridge here never stalls the host stream).

A failure names the configuration, the seed, the block it ran in (replay: the block's seeds
from a reset), the first differing beat and the instruction that sent it, and saves the
program's text under ``build/random_volume/``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

import numpy as np
import pytest
from funcov import Coverage, ProgramObserver, observe_rtl, promised_points
from progen import (
    counter_invariants,
    counter_reads,
    program_block,
    random_program,
    short_counts,
)
from tiers import SOAK

from firmware.asm import Program
from firmware.device import DeviceError
from firmware.transports.rtl import RtlDevice
from hdl.config import TPUConfig
from hdl.presets import get_config
from sim.models.isa_sim import IsaSim, beats_match
from sim.rtl.verilog import BUILD_ROOT

#: `edge` below, and the base of `edge-fast`, `edge-compact` and `edge-ecp5`.
_EDGE = TPUConfig(rows=3, cols=5, ub_depth=16, acc_depth=16, weight_mem_tiles=3,
                  weight_fifo_depth=2, param_slots=2, matmul_slots=1)

CONFIGS: dict[str, TPUConfig] = {
    "tiny": get_config("tiny"),
    "small": get_config("small"),
    "wide": get_config("wide"),
    # Odd array, the smallest memories allowed, three tiles (the queue holds them all), two
    # parameter slots: the first and last row of every memory in most programs.
    "edge": _EDGE,
    # make regression only: one-row tiles, a one-tile weight FIFO, one parameter slot; a tall array.
    "thin": TPUConfig(rows=1, cols=3, ub_depth=16, acc_depth=32, weight_mem_tiles=2,
                      weight_fifo_depth=1, param_slots=1),
    "tall": TPUConfig(rows=8, cols=2, ub_depth=32, acc_depth=16, weight_mem_tiles=7,
                      weight_fifo_depth=3, param_slots=8),
    "default": get_config("default"),
    # The iCEBreaker's core: 2x2, the serial activation unit, 32-bit counters.
    "icebreaker": get_config("icebreaker"),
    # int8 operands only, the products two to an SB_MAC16 (the model), an odd count (four
    # shared blocks and one alone), the serial activation unit.
    "int8": TPUConfig(rows=3, cols=3, ub_depth=32, acc_depth=32, weight_mem_tiles=5,
                      weight_fifo_depth=2, param_slots=2, multiplier="ice40",
                      operands="int8", activation_unit="serial", counter_bits=32),
    # The ULX3S preset's build on a small non-square core: the fast pipeline, the PEs on
    # MULT18X18D (the model) with the array's registered enable, the accumulators' registered
    # read.
    "wide-fast": get_config("wide").replace(pipeline="fast", multiplier="ecp5"),
    # An ECP5 array larger than the part's multipliers, on a small core: MULT18X18D and LUT
    # products in one array (the last 6 of 16 in LUTs, on their adder tree), the serial
    # activation unit, the fast pipeline.
    "mixed": get_config("small").replace(pipeline="fast", multiplier="ecp5",
                                         lut_multipliers=6, activation_unit="serial"),
    # The fast pipeline with rows not a power of two (3x5, the edge memories): LOAD_WEIGHTS
    # and READ_WEIGHTS scale their tiles to rows a cycle late (TPUConfig.scale_tiles_late).
    "edge-fast": _EDGE.replace(pipeline="fast", multiplier="ecp5"),
    # The compact pipeline (the iCEBreaker preset's) on the odd edge core, any operands.
    "edge-compact": _EDGE.replace(pipeline="compact"),
    # make regression only: the reference pipeline on MULT18X18D (the model).
    "edge-ecp5": _EDGE.replace(multiplier="ecp5"),
    # make regression only: the largest ULX3S build that meets timing (README), 12x12 with the last
    # 44 products in LUTs (about 9 minutes for 50 programs).
    "ulx3s-12x12": get_config("ulx3s").replace(rows=12, cols=12, lut_multipliers=44,
                                                activation_unit="serial", host_width=None),
}

#: Programs from one reset to the next.
BLOCK = 25
#: First seed of each configuration's programs; the first blocks, then the next ones.
SEED_BASE = {"tiny": 100_000, "small": 200_000, "wide": 300_000, "edge": 400_000,
             "default": 500_000, "thin": 600_000, "tall": 700_000, "icebreaker": 800_000,
             "int8": 900_000, "wide-fast": 1_000_000, "mixed": 1_100_000,
             "ulx3s-12x12": 1_300_000, "edge-fast": 1_400_000, "edge-compact": 1_500_000,
             "edge-ecp5": 1_600_000}
#: The first block of each configuration's programs (``make regression``).
FIRST = {"tiny": 50, "small": 50, "wide": 25, "edge": 50, "icebreaker": 25, "int8": 25,
         "mixed": 25, "edge-fast": 25, "edge-compact": 25}
SLOW = {"tiny": 1750, "small": 1450, "wide": 1475, "edge": 1750, "thin": 1000, "tall": 1000,
        "default": 500, "icebreaker": 975, "int8": 975, "wide-fast": 1000, "mixed": 975,
        "ulx3s-12x12": 50, "edge-fast": 975, "edge-compact": 975, "edge-ecp5": 500}

#: Of :data:`SLOW`'s programs, those ``make regression`` runs (the first ones, the same share of
#: every configuration: a block of 25 costs 15 to 60 s on Verilator and CI has minutes for the
#: whole regression); ``make soak`` runs the rest.
REGRESSION_SHARE = 25
#: Configurations whose programs all run in ``make soak``: the 12x12 ULX3S build (25 of its
#: programs took 568 s, most of the regression's tail).
SOAK_ONLY = ("ulx3s-12x12",)


def _more(key: str, n: int) -> list:
    first = SEED_BASE[key] + FIRST.get(key, 0)
    share = 0 if key in SOAK_ONLY else min(n, REGRESSION_SHARE)
    runs = [pytest.param(key, first, share, id=f"{key}-more-{share}", marks=pytest.mark.slow)
            ] if share else []
    if n > share:
        runs.append(pytest.param(key, first + share, n - share, id=f"{key}-soak-{n - share}",
                                 marks=SOAK))
    return runs


RUNS = ([pytest.param(key, SEED_BASE[key], n, id=f"{key}-{n}", marks=pytest.mark.slow)
         for key, n in FIRST.items()] +
        [run for key, n in SLOW.items() for run in _more(key, n)])

SIMULATOR = os.environ.get("AMTPU_VOLUME_SIM", "verilator")
OUT_DIR = BUILD_ROOT / "random_volume"

_DEVICES: dict[str, RtlDevice] = {}


@pytest.fixture(scope="module")
def device():
    """An RTL device per configuration (built once), reset by the test before each block."""
    def get(key: str) -> RtlDevice:
        if key not in _DEVICES:
            _DEVICES[key] = RtlDevice(CONFIGS[key], sim=SIMULATOR)
        return _DEVICES[key]
    yield get
    for dev in _DEVICES.values():
        dev.close()
    _DEVICES.clear()


def _failure(key: str, block: int, seed: int, program: Program, expected: Sequence,
             got: Sequence[int] | None, error: str | None = None) -> str:
    """What went wrong, where, and how to replay it; the program's text goes to a file."""
    cfg = CONFIGS[key]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{key}-seed{seed}.s"
    path.write_text(program.text() + "\n")
    after = f"after seeds {block}..{seed - 1}" if seed > block else "first"
    where = (f"config {key} ({cfg}), seed {seed}, run {after} from a reset (replay: "
             f"progen.program_block(config, range({block}, {seed + 1}))); program text: {path}")
    if error is not None:
        return f"{where}: {error}"
    assert got is not None
    if len(got) != len(expected):
        return f"{where}: {len(got)} output beats, the ISA simulator sent {len(expected)}"
    first = next(i for i, (e, g) in enumerate(zip(expected, got, strict=True))
                 if e is not None and e != g)
    # Which instruction sent that beat: replay the block on the ISA simulator.
    ref = IsaSim(cfg)
    for _ in program_block(cfg, range(block, seed), ref):
        pass
    start, instr_at = len(ref.output), 0
    for position, beat in enumerate(program.beats):
        if not ref.expecting_data:
            instr_at = position
        ref.feed([beat])
        if len(ref.output) - start > first:
            break
    text = Program(cfg)
    text.beats = program.beats[instr_at:instr_at + 1]
    return (f"{where}: output beat {first} is {got[first]:#x}, the ISA simulator sent "
            f"{expected[first]:#x}; sent by the instruction at beat {instr_at}: "
            f"{text.text().strip()}")


@pytest.mark.parametrize("key, first, programs", RUNS)
def test_random_volume(device, record_property, key: str, first: int, programs: int):
    cfg = CONFIGS[key]
    start = time.perf_counter()
    rtl = device(key)
    built = time.perf_counter() - start
    coverage = Coverage()
    coverage.promise(promised_points(cfg))
    observer = ProgramObserver(cfg, coverage)
    seeds = range(first, first + programs)
    print(f"config {key} ({cfg}): {programs} programs, seeds {seeds[0]}..{seeds[-1]}, "
          f"blocks of {BLOCK} from a reset, simulator {rtl.sim} (build and start {built:.1f} s)")
    cycles = beats_in = beats_out = 0
    for block in range(seeds.start, seeds.stop, BLOCK):
        rtl.reset()
        observer.reset()
        before = rtl.cycles()
        for seed, program, expected in program_block(cfg, range(block, min(block + BLOCK,
                                                                            seeds.stop))):
            observer.observe(program.beats)
            rtl.send(program.beats)
            try:
                got = rtl.receive(len(expected))
            except DeviceError as exc:
                pytest.fail(_failure(key, block, seed, program, expected, None, str(exc)))
            if not beats_match(expected, got):
                pytest.fail(_failure(key, block, seed, program, expected, got))
            broken = [f"READ_COUNTERS {k}: {'; '.join(relations)}: {counts}"
                      for k, counts in enumerate(counter_reads(expected, got))
                      if (relations := counter_invariants(counts))]
            if broken:
                pytest.fail(_failure(key, block, seed, program, expected, got,
                                     "counters break " + " / ".join(broken)))
            status = rtl.status()
            if status.error or not status.halted or status.instr_index != 0:
                pytest.fail(_failure(key, block, seed, program, expected, got,
                                     f"status after the program: {status}"))
            beats_in += len(program.beats)
            beats_out += len(expected)
        observe_rtl(coverage, rtl.coverage())
        cycles += rtl.cycles() - before
    seconds = time.perf_counter() - start
    print(f"{programs} programs, {beats_in} beats in, {beats_out} out, {cycles} cycles, "
          f"{seconds:.1f} s ({programs / seconds:.0f} programs/s)")
    print(coverage.table())
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"coverage-{key}-{first}.txt").write_text(coverage.table() + "\n")
    record_property("coverage_table", json.dumps({
        "title": "random programs: coverage point (rtl.*: cycles)",
        "column": f"{key} {first}+{programs}", "counts": coverage.counts,
        "missed": coverage.missing()}))
    missing = coverage.missing()
    assert not missing, (f"config {key}, seeds {seeds[0]}..{seeds[-1]}: coverage points the "
                         f"generator promises were never hit: {', '.join(missing)}")


@pytest.mark.parametrize("key", ["tiny", "small", "wide"])
def test_stall_bench_programs(record_property, key: str):
    """The programs ``tb_core.py``'s ``test_random_programs`` runs in CI (with random
    valid/ready stalls, on the per-cycle bench) hit every point the generator promises for
    its shorter transfers: regenerated here from the same seeds, on the ISA simulator."""
    from test_core import _FAST, PROGRAMS_PER_BLOCK

    cfg = CONFIGS[key]
    coverage = Coverage()
    coverage.promise(promised_points(cfg, rtl=False, max_count=short_counts(cfg)))
    observer = ProgramObserver(cfg, coverage)
    programs, seeds = 0, []
    for config_key, first, blocks in _FAST:
        if config_key != key:
            continue
        for block in range(first, first + blocks):
            base = 1000 + block * PROGRAMS_PER_BLOCK        # as test_core.py seeds its blocks
            ref = IsaSim(cfg)
            observer.reset()
            for seed in range(base, base + PROGRAMS_PER_BLOCK):
                program = random_program(cfg, np.random.default_rng(seed), after=ref)
                ref.run(program.beats)
                observer.observe(program.beats)
                programs += 1
                seeds.append(seed)
    assert programs, f"test_core.py runs no {key} programs in CI"
    print(coverage.table())
    record_property("coverage_table", json.dumps({
        "title": "stall-bench programs (tb_core.py, program side): coverage point",
        "column": f"{key} {min(seeds)}+{programs}", "counts": coverage.counts,
        "missed": coverage.missing()}))
    missing = coverage.missing()
    assert not missing, (f"{key}: tb_core.py's CI programs never hit {', '.join(missing)}")
