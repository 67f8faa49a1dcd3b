"""A guided tour of one matmul: ``python -m sim.tour`` (``make tour``).

Runs one small program on the 4x4 core (:data:`TOUR_CONFIG`) under cocotb and Icarus with
an FST waveform, checks its output beats against the ISA simulator with ``==``, writes a
GTKWave save file that follows the data along its path, and opens GTKWave on it (without a
display or without GTKWave it prints the path and how to open it). docs/tour.md walks
through the waveform.

The program (:func:`tour_program`)::

    load_weights  tile 0            W, 4 x 4 int8 (4 beats)
    read_weights  tile 0            queue the tile for the matrix unit
    load_params   slot 0            bias 0, multiplier 1, shift 0: requantisation is a no-op
    read_host     ub 0, 6 rows      X, 6 x 4 int8 (6 beats)
    matmul        ub 0 -> acc 0     6 rows, switch to tile 0
    activate      acc 0 -> ub 8     6 rows, ReLU
    write_host    ub 8, 6 rows      6 beats back to the host
    halt                            the DONE beat

so the host gets ``relu(X @ W)`` (saturated to int8) and a DONE beat.

Signal names in the save file are read from the dump itself (:func:`sim.gtkw.fst_signals`);
a name that is not in the dump is an error, never silently dropped. The opcode traces show
names through a translate filter file written from :class:`hdl.isa.Opcode`
(:func:`sim.gtkw.write_opcode_filter`). ``--screenshot PNG`` takes a picture of GTKWave on the
save file under Xvfb (:mod:`sim.screenshot`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data

from hdl import isa
from hdl.config import TPUConfig, get_config
from hdl.isa import Func, Opcode, Pool

from .verilog import BUILD_ROOT, REPO_ROOT

__all__ = ["TOUR_CONFIG", "EVENTS", "TourProgram", "tour_program", "TourResult", "run_tour",
           "main"]

#: The tour's configuration: the 4x4 preset (its 256-row buffer clears in 256 cycles).
TOUR_CONFIG = "small"

#: Events the bench watches for the save file's markers: name -> (signals below the
#: toplevel that are all 1 in the event's first cycle, the marker's label).
EVENTS: dict[str, tuple[tuple[str, ...], str]] = {}

#: Where the tour writes its waveform, save file and filter.
TOUR_DIR = BUILD_ROOT / "tour"


def _word(layout, **fields) -> int:
    return data.Layout.cast(layout).const(fields).as_bits()


def _row(values: Sequence[int], elem, length: int) -> int:
    """A data beat: ``values`` packed in the low bits, element 0 lowest."""
    width = elem.width
    beat = 0
    for i, value in enumerate(list(values) + [0] * (length - len(values))):
        beat |= (int(value) & ((1 << width) - 1)) << (width * i)
    return beat


@dataclass
class TourProgram:
    """The tour's program and what it computes.

    Attributes
    ----------
    beats : list of int
        Every host beat, instructions and data.
    listing : list of (str, int)
        Each instruction's assembly-like text and its number of data beats.
    x, w : ndarray
        The activations (``m x rows``) and the weight tile (``rows x cols``), int8.
    expected : ndarray
        ``relu(x @ w)`` saturated to int8: the rows WRITE_HOST sends.
    expected_beats : int
        Beats the core sends: the rows and the DONE beat.
    """
    beats: list[int] = field(default_factory=list)
    listing: list[tuple[str, int]] = field(default_factory=list)
    x: np.ndarray | None = None
    w: np.ndarray | None = None
    expected: np.ndarray | None = None
    expected_beats: int = 0

    def add(self, text: str, word: int, rows: Sequence[int] = ()) -> None:
        self.beats += [word, *rows]
        self.listing.append((text, len(rows)))


def tour_program(config: TPUConfig, m: int = 6) -> TourProgram:
    """The tour's program for ``config`` with ``m`` activation rows (see the module's
    documentation). Instruction words are packed with :mod:`hdl.isa`'s layouts, as the
    assembler packs them."""
    rows, cols, ub = config.rows, config.cols, config.ub_row
    rng = np.random.default_rng(9)
    x = rng.integers(-4, 5, (m, rows))
    w = rng.integers(-3, 4, (rows, cols))
    byte = unsigned(isa.DATA_BITS)
    int32 = unsigned(32)
    p = TourProgram(x=x, w=w)
    p.add("load_weights tile=0 count=1 signed",
          _word(isa.LoadWeights, opcode=Opcode.LOAD_WEIGHTS, signed=1, tile=0, count=1),
          [_row(w[r], byte, cols) for r in range(rows)])
    p.add("read_weights tile=0 count=1",
          _word(isa.ReadWeights, opcode=Opcode.READ_WEIGHTS, tile=0, count=1))
    p.add("load_params slot=0 shift=0 zp=0 clamp=127",
          _word(isa.LoadParams, opcode=Opcode.LOAD_PARAMS, slot=0, shift=0, zero_point=0,
                clamp_hi=127),
          [_row([0] * cols, int32, cols), _row([1] * cols, int32, cols)])
    p.add(f"read_host ub=0 count={m}",
          _word(isa.ReadHost, opcode=Opcode.READ_HOST, ub_addr=0, count=m),
          [_row(x[i], byte, ub) for i in range(m)])
    p.add(f"matmul ub=0 acc=0 count={m} switch signed",
          _word(isa.Matmul, opcode=Opcode.MATMUL, ub_addr=0, acc_addr=0, count=m, switch=1,
                signed=1))
    p.add(f"activate acc=0 ub=8 count={m} func=relu slot=0",
          _word(isa.Activate, opcode=Opcode.ACTIVATE, acc_addr=0, ub_addr=8, count=m,
                func=Func.RELU, pool=Pool.NONE, slot=0))
    p.add(f"write_host ub=8 count={m}",
          _word(isa.WriteHost, opcode=Opcode.WRITE_HOST, ub_addr=8, count=m))
    p.add("halt", _word(isa.Halt, opcode=Opcode.HALT))
    p.expected = np.clip(np.maximum(x @ w, 0), -128, 127)
    p.expected_beats = m + 1
    return p


def decode_rows(beats: Sequence[int], n: int) -> np.ndarray:
    """int8 elements ``0..n-1`` of unified-buffer row beats."""
    out = np.array([[(beat >> (8 * i)) & 0xFF for i in range(n)] for beat in beats],
                   dtype=np.int64)
    return np.where(out >= 128, out - 256, out)


@dataclass
class TourResult:
    """What :func:`run_tour` made and checked."""
    fst: Path
    gtkw: Path
    filter: Path
    program: TourProgram
    received: list[int]
    expected: list[int]
    events: dict[str, int]
    start: int
    end: int
    traces: list[str]


def run_tour(config_key: str = TOUR_CONFIG, out_dir: Path = TOUR_DIR) -> TourResult:
    """Run the tour's program on the RTL core under Icarus with an FST waveform, check the
    output beats against :class:`sim.isa_sim.IsaSim` with ``==`` (raises
    :class:`AssertionError` if they differ) and write the save file; returns what it made."""
    from hdl.core import Core

    from .isa_sim import IsaSim
    from .runner import run

    config = get_config(config_key)
    program = tour_program(config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "tour.json"
    report.unlink(missing_ok=True)
    run("core", lambda: Core(config), config_key, "sim.tour_bench", REPO_ROOT, "tour",
        extra_env={"AMTPU_TOUR_OUT": str(report)}, label="tour", waves=True,
        sim="icarus", config=config)
    result = json.loads(report.read_text())
    fst = BUILD_ROOT / "waves" / f"core-{config_key}-tour.fst"
    received = result["received"]
    expected = IsaSim(config).run(program.beats)
    assert received == expected, \
        f"the core sent {[hex(b) for b in received]}, the ISA simulator {expected}"
    rows = decode_rows(received[:-1], config.cols)
    assert np.array_equal(rows, program.expected), f"relu(X @ W) is {program.expected}"
    return TourResult(fst=fst, gtkw=out_dir / "tour.gtkw", filter=out_dir / "opcode.txt",
                      program=program, received=received, expected=expected,
                      events=result["events"], start=result["start"], end=result["end"],
                      traces=[])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.tour", description=__doc__.split(
        "\n", 1)[0])
    parser.add_argument("--no-gui", action="store_true", help="do not open GTKWave")
    args = parser.parse_args(argv)
    result = run_tour()
    print(f"tour: {len(result.received)} beats from the core equal the ISA simulator's")
    print(f"tour: waveform {result.fst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
