"""A guided tour of one matmul: ``python -m sim.waves.tour`` (``make tour``).

Runs one small program on the 4x4 core (:data:`TOUR_CONFIG`) under cocotb and Icarus with
an FST waveform, checks its output beats against the ISA simulator with ``==``, writes a
GTKWave save file that follows the data along its path, and opens GTKWave on it (without a
display or without GTKWave it prints the path and how to open it). docs/tour.md walks
through the waveform.

The program (:func:`tour_program`, in the assembler's syntax)::

    load_weights tile=0 count=1 signed         W, a 4 x 4 int8 tile (4 data beats)
    read_weights tile=0 count=1                queue the tile for the matrix unit
    load_params slot=0 shift=0 zp=0 clamp=127  bias 0, multiplier 1 (2 data beats)
    read_host ub=0 count=6                     X, 6 x 4 int8 (6 data beats)
    matmul ub=0 acc=0 count=6 switch signed
    activate acc=0 ub=8 count=6 func=relu pool=none slot=0
    write_host ub=8 count=6
    halt

so the host gets ``relu(X @ W)`` (requantisation with bias 0, multiplier 1 and shift 0 only
saturates to int8) and a DONE beat. The other stops (``--stop``, :data:`TOURS`): ``attention``
(:func:`attention_program`, k.T made on chip) and ``windows`` (:func:`windows_program`, a
convolution kernel row over the image itself through MATMUL's window mode).

Signal names in the save file are read from the dump itself (:func:`sim.rtl.gtkw.fst_signals`);
a name that is not in the dump is an error, never silently dropped. Enumeration fields (the
opcode) show by name through the translate filter files :func:`sim.rtl.gtkw.write_enum_filters`
writes from :mod:`hdl.isa`. ``--screenshot PNG`` takes a picture of GTKWave on the save file
under Xvfb (:mod:`sim.waves.screenshot`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data
from vcd.gtkw import GTKWFlag, GTKWSave

from hdl import isa
from hdl.beats import DATA_BITS
from hdl.config import TPUConfig
from hdl.isa import Func, Opcode, Pool
from hdl.presets import get_config
from sim.rtl.gtkw import enum_filter, fst_signals, write_enum_filters
from sim.rtl.verilog import BUILD_ROOT, REPO_ROOT

__all__ = ["TOUR_CONFIG", "TOUR_DIR", "EVENTS", "MARKERS", "ATTENTION_EVENTS", "WINDOWS_EVENTS",
           "WINDOWS_IMAGE", "WINDOWS_KERNEL", "TOURS", "TourStop", "markers",
           "attention_program", "attention_stages", "windows_program", "windows_stages", "Trace",
           "tour_stages",
           "TourProgram", "tour_program", "decode_rows", "write_tour_gtkw", "TourResult",
           "run_tour", "open_gtkwave", "main"]

#: The tour's configuration: the 4x4 preset (its 256-row buffer clears in 256 cycles).
TOUR_CONFIG = "small"

#: Events the bench watches for the save file's markers, in marker order: name -> (the
#: marker's label, the values signals below the toplevel have in the event's first cycle).
#: The markers sit at the falling clock edge of that cycle, where the values are stable.
EVENTS: dict[str, tuple[str, dict[str, int]]] = {
    "load_weights": ("LOAD_WEIGHTS", {"front_end.dispatch": 1,
                                      "front_end.is_load_weights": 1}),
    "read_host": ("READ_HOST", {"unified_buffer.w__0__valid": 1,
                                "front_end.transfers.scrubbing": 0}),
    "tile_ready": ("tile ready", {"matrix_unit.array.o_shadow_full": 1}),
    "matmul": ("MATMUL", {"matrix_unit.array.valid_in": 1}),
    "row_out": ("row 0 out", {"matrix_unit.array.o_psum__valid": 1,
                              "matrix_engine.o_acc__valid": 1,
                              "matrix_engine.scrubbing": 0}),
    "activate": ("ACTIVATE", {"activation_engine.o_ub__valid": 1,
                              "activation_engine.o_ub__ready": 1}),
    "write_host": ("WRITE_HOST", {"o_host__valid": 1, "o_host__ready": 1}),
}

#: The save file's markers A, B, ... in order: (event name, label); the last, ``done``, is
#: the DONE beat (the last beat the core sends).
MARKERS: list[tuple[str, str]] = [*((name, label) for name, (label, _) in EVENTS.items()),
                                  ("done", "DONE")]


@dataclass(frozen=True)
class Trace:
    """One trace of the tour's save file: a signal below the toplevel (as the Verilog
    hierarchy names it, without its ``[msb:lsb]``), the name GTKWave shows, its format."""
    path: str
    alias: str | None = None
    fmt: str = "hex"
    invert: bool = False


def _t(path: str, alias: str | None = None, fmt: str | None = None, **kw) -> Trace:
    """A trace; one-bit signals default to binary, others to hex."""
    return Trace(path, alias, fmt or "hex", **kw)


_ARRAY = "matrix_unit.array."
_CORE = _ARRAY + "core."
_PE = _CORE + "pe_1_1."


def _host_stream(port: str) -> list[Trace]:
    """A host stream's handshake and beat (``i_host`` or ``o_host``)."""
    return [_t(f"{port}__valid", "valid", "bin"), _t(f"{port}__ready", "ready", "bin"),
            _t(f"{port}__payload", "beat")]


def tour_stages(config: TPUConfig) -> list[tuple[str, str, list[Trace]]]:
    """The save file's stages along the data's path: (group name, the comment line that
    names the stage, its traces). Every name must be in the dump (:func:`write_tour_gtkw`
    raises otherwise)."""
    rows, cols = config.rows, config.cols
    return [
        ("i_host", "1  host -> core: instructions, data", [
            *_host_stream("i_host"),
        ]),
        ("front_end", "2  front end: decode, issue", [
            _t("front_end.fetch_opcode", "instruction"),
            _t("front_end.\\o_hazards__instr.a", "a (ub/acc/tile)", "dec"),
            _t("front_end.\\o_hazards__instr.b", "b (acc/ub)", "dec"),
            _t("front_end.\\o_hazards__instr.count", "count", "dec"),
            _t("front_end.o_hazards__hazard", "waits on a hazard", "bin"),
            _t("front_end.dispatch", "dispatch", "bin"),
        ]),
        ("busy", "3  engines busy", [
            _t("front_end.o_host_work", "front end: host beat", "bin"),
            _t("weight_loader.o_busy", "weight loader", "bin"),
            _t("matrix_engine.o_idle", "matrix engine", "bin", invert=True),
            _t("activation_engine.o_busy", "activation engine", "bin"),
            _t("host_writer.o_busy", "host writer", "bin"),
        ]),
        ("unified_buffer", "4  unified buffer: writes, reads", [
            _t("unified_buffer.w__0__valid", "write: READ_HOST", "bin"),
            _t("unified_buffer.w__1__valid", "write: ACTIVATE", "bin"),
            _t("unified_buffer.wr__addr", "write row", "dec"),
            _t("unified_buffer.wr__data", "write data (bytes)"),
            _t("unified_buffer.r__0__addr__valid", "read: MATMUL", "bin"),
            _t("unified_buffer.r__0__addr__payload", "MATMUL row", "dec"),
            _t("unified_buffer.r__1__addr__valid", "read: WRITE_HOST", "bin"),
            _t("unified_buffer.r__1__addr__payload", "WRITE_HOST row", "dec"),
        ]),
        ("weights", "5  weights -> shadow registers", [
            _t("weight_loader.o_weight__valid", "row into FIFO", "bin"),
            _t("matrix_unit.o_tiles", "tiles in FIFO", "dec"),
            _t(_ARRAY + "o_weight_shift", "row shifts in", "bin"),
            _t(_ARRAY + "shifted", "rows shifted", "dec"),
            _t(_ARRAY + "\\i_weight__payload.data", "weight row (bytes)"),
            _t(_ARRAY + "o_shadow_full", "shadow tile full", "bin"),
        ]),
        ("act_in", "6  activations in, skewed", [
            _t(_ARRAY + "valid_in", "row accepted", "bin"),
            _t(_ARRAY + "\\i_act__payload.switch", "switch", "bin"),
            _t(_ARRAY + "o_weight_stall", "weight stall", "bin"),
            *[_t(_CORE + f"act_skew_{r}_d{r}", f"into PE row {r}", "signed")
              for r in range(rows)],
        ]),
        ("pe_1_1", "7  one PE: (1,1)", [
            _t(_PE + "shadow", "shadow weight", "signed"),
            _t(_PE + "active", "active weight", "signed"),
            _t(_PE + "a", "a (activation)", "signed"),
            _t(_PE + "w", "w (weight)", "signed"),
            _t(_PE + "product", "a * w", "signed"),
            _t(_PE + "psum", "psum (+ sum from above)", "signed"),
        ]),
        ("o_psum", "8  output rows, de-skewed", [
            *[_t(_CORE + f"pe_{rows - 1}_{c}.psum", f"bottom PE ({rows - 1},{c})", "signed")
              for c in range(cols)],
            _t(_ARRAY + "o_psum__valid", "output row", "bin"),
            *[_t(_ARRAY + f"\\o_psum__payload[{c}]", f"column {c}", "signed")
              for c in range(cols)],
        ]),
        ("accumulators", "9  accumulator writes", [
            _t("matrix_engine.o_acc__valid", "write", "bin"),
            _t("matrix_engine.\\o_acc__payload.addr", "row", "dec"),
            *[_t(f"matrix_engine.\\o_acc__payload.data[{c}]", f"column {c}", "signed")
              for c in range(cols)],
        ]),
        ("activation", "10 activation: ReLU out", [
            _t("activation_engine.o_acc__addr__valid", "accumulator read", "bin"),
            _t("activation.o_row__valid", "output row", "bin"),
            *[_t(f"activation.\\o_row__payload[{c}]", f"column {c}", "signed")
              for c in range(cols)],
            _t("activation_engine.\\o_ub__payload.addr", "into buffer row", "dec"),
        ]),
        ("o_host", "11 core -> host", [
            *_host_stream("o_host"),
        ]),
    ]


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
        The activations (``m x rows``; the windows stop: the image, height x width) and the
        weight tile (``rows x cols``), int8.
    expected : ndarray
        ``relu(x @ w)`` saturated to int8: the rows WRITE_HOST sends.
    expected_beats : int
        Beats the core sends: the rows and the DONE beat.
    conv : dict of int to ndarray
        The windows stop: by stride, which of the rows WRITE_HOST sends are the
        convolution's outputs (an ``(oy, ox)`` array of row indices); the others are
        windows the run passes over.
    """
    beats: list[int] = field(default_factory=list)
    listing: list[tuple[str, int]] = field(default_factory=list)
    x: np.ndarray | None = None
    w: np.ndarray | None = None
    expected: np.ndarray | None = None
    expected_beats: int = 0
    conv: dict[int, np.ndarray] = field(default_factory=dict)

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
    byte = unsigned(DATA_BITS)
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
    p.add(f"activate acc=0 ub=8 count={m} func=relu pool=none slot=0",
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


# The attention stop: k.T built on chip --------------------------------------------------

#: The attention stop's events (as :data:`EVENTS`): the move, its buffer reads, its tile
#: rows into the weight memory, then the product as in the matmul tour.
ATTENTION_EVENTS: dict[str, tuple[str, dict[str, int]]] = {
    "read_host": ("READ_HOST", {"unified_buffer.w__0__valid": 1,
                                "front_end.transfers.scrubbing": 0}),
    "move": ("UB_TO_WEIGHTS", {"weight_mover.i_move__valid": 1}),
    "move_read": ("k row read", {"weight_mover.o_ub__data__valid": 1}),
    "move_write": ("tile row 0", {"weight_mover.o_wm__valid": 1}),
    "tile_ready": ("tile ready", {"matrix_unit.array.o_shadow_full": 1}),
    "matmul": ("MATMUL", {"matrix_unit.array.valid_in": 1}),
    "write_host": ("WRITE_HOST", {"o_host__valid": 1, "o_host__ready": 1}),
}


def attention_program(config: TPUConfig) -> TourProgram:
    """The attention stop's program: ``q @ k.T`` with ``k.T`` made on chip, for ``rows``
    tokens of ``rows`` channels (one tile)::

        read_host ub=0 count=R                  Q, R tokens (R data beats)
        read_host ub=8 count=R                  K, R tokens (R data beats)
        load_params slot=0 shift=0 zp=0 clamp=127
        ub_to_weights ub=8 tile=0 count=R signed transpose
        read_weights tile=0 count=1
        matmul ub=0 acc=0 count=R switch signed
        activate acc=0 ub=16 count=R func=identity pool=none slot=0
        write_host ub=16 count=R
        halt

    The scores come back as ``Q @ K.T`` (bias 0, multiplier 1, shift 0: saturation only)."""
    rows, cols, ub = config.rows, config.cols, config.ub_row
    t = min(rows, cols)                   # tokens: keys are the tile's columns
    rng = np.random.default_rng(11)
    q = rng.integers(-3, 4, (t, rows))
    k = rng.integers(-3, 4, (t, rows))
    byte = unsigned(DATA_BITS)
    int32 = unsigned(32)
    p = TourProgram(x=q, w=k)
    p.add(f"read_host ub=0 count={t}",
          _word(isa.ReadHost, opcode=Opcode.READ_HOST, ub_addr=0, count=t),
          [_row(q[i], byte, ub) for i in range(t)])
    p.add(f"read_host ub=8 count={t}",
          _word(isa.ReadHost, opcode=Opcode.READ_HOST, ub_addr=8, count=t),
          [_row(k[i], byte, ub) for i in range(t)])
    p.add("load_params slot=0 shift=0 zp=0 clamp=127",
          _word(isa.LoadParams, opcode=Opcode.LOAD_PARAMS, slot=0, shift=0, zero_point=0,
                clamp_hi=127),
          [_row([0] * cols, int32, cols), _row([1] * cols, int32, cols)])
    p.add(f"ub_to_weights ub=8 tile=0 count={t} signed transpose",
          _word(isa.UbToWeights, opcode=Opcode.UB_TO_WEIGHTS, signed=1, transpose=1,
                ub_addr=8, tile=0, count=t))
    p.add("read_weights tile=0 count=1",
          _word(isa.ReadWeights, opcode=Opcode.READ_WEIGHTS, tile=0, count=1))
    p.add(f"matmul ub=0 acc=0 count={t} switch signed",
          _word(isa.Matmul, opcode=Opcode.MATMUL, ub_addr=0, acc_addr=0, count=t, switch=1,
                signed=1))
    p.add(f"activate acc=0 ub=16 count={t} func=identity pool=none slot=0",
          _word(isa.Activate, opcode=Opcode.ACTIVATE, acc_addr=0, ub_addr=16, count=t,
                func=Func.IDENTITY, pool=Pool.NONE, slot=0))
    p.add(f"write_host ub=16 count={t}",
          _word(isa.WriteHost, opcode=Opcode.WRITE_HOST, ub_addr=16, count=t))
    p.add("halt", _word(isa.Halt, opcode=Opcode.HALT))
    scores = np.zeros((t, cols), dtype=np.int64)
    scores[:, :t] = q @ k.T
    p.expected = np.clip(scores, -128, 127)
    p.expected_beats = t + 1
    return p


def attention_stages(config: TPUConfig) -> list[tuple[str, str, list[Trace]]]:
    """The attention stop's save file (as :func:`tour_stages`): the host, the front end
    waiting while the mover runs, the mover's buffer reads and tile buffer, its rows into
    the weight memory, the tile into the array, the scores out."""
    rows, cols = config.rows, config.cols
    mv = "weight_mover."
    return [
        ("i_host", "1  host -> core: Q, K, the program", [
            *_host_stream("i_host"),
        ]),
        ("front_end", "2  front end: issues UB_TO_WEIGHTS, waits for the mover", [
            _t("front_end.fetch_opcode", "instruction"),
            _t("front_end.\\o_hazards__instr.a", "a (ub)", "dec"),
            _t("front_end.\\o_hazards__instr.b", "b (tile)", "dec"),
            _t("front_end.\\o_hazards__instr.count", "count", "dec"),
            _t("front_end.dispatch", "dispatch", "bin"),
            _t("front_end.i_ub_to_weights_busy", "mover busy", "bin"),
        ]),
        ("mover_read", "3  mover: K's rows out of the unified buffer", [
            _t(mv + "i_move__valid", "UB_TO_WEIGHTS taken", "bin"),
            _t(mv + "transpose", "transpose", "bin"),
            _t(mv + "o_ub__addr__valid", "row request", "bin"),
            _t(mv + "o_ub__addr__payload", "buffer row", "dec"),
            _t(mv + "o_ub__data__valid", "row arrives", "bin"),
            _t(mv + "o_ub__data__payload", "K row (bytes)"),
            _t(mv + "recv", "rows received", "dec"),
        ]),
        ("mover_tile", "4  mover: the tile buffer, K's rows as its columns", [
            *[_t(mv + f"\\buf[{r}]", f"tile row {r} (bytes)") for r in range(rows)],
        ]),
        ("mover_write", "5  mover: tile rows into the weight memory", [
            _t(mv + "o_wm__valid", "row write", "bin"),
            _t(mv + "\\o_wm__payload.addr", "weight memory row", "dec"),
            _t(mv + "\\o_wm__payload.data.data", "row (bytes)"),
        ]),
        ("weights", "6  the tile -> shadow registers", [
            _t("weight_loader.o_weight__valid", "row into FIFO", "bin"),
            _t(_ARRAY + "o_weight_shift", "row shifts in", "bin"),
            _t(_ARRAY + "\\i_weight__payload.data", "weight row (bytes)"),
            _t(_ARRAY + "o_shadow_full", "shadow tile full", "bin"),
        ]),
        ("o_psum", "7  Q's rows in, scores out", [
            _t(_ARRAY + "valid_in", "Q row accepted", "bin"),
            _t(_ARRAY + "o_psum__valid", "score row", "bin"),
            *[_t(_ARRAY + f"\\o_psum__payload[{c}]", f"key {c}", "signed")
              for c in range(cols)],
        ]),
        ("o_host", "8  core -> host: the scores", [
            *_host_stream("o_host"),
        ]),
    ]


# The windows stop: a convolution over the image itself -----------------------------------

#: The windows stop's image, one int8 channel (height, width), and its kernel (3 x 3).
WINDOWS_IMAGE = (5, 6)
WINDOWS_KERNEL = (3, 3)

#: The windows stop's events (as :data:`EVENTS`): LOAD_WEIGHTS issues (where the cycles are
#: counted from, as in the matmul stop), the matrix engine's first buffer read, the first
#: window into the array, the first window sent from the kept rows alone (no read), and the
#: first output row.
WINDOWS_EVENTS: dict[str, tuple[str, dict[str, int]]] = {
    "load_weights": EVENTS["load_weights"],
    "read": ("first read", {"matrix_engine.o_ub__addr__valid": 1,
                            "matrix_engine.o_ub__addr__ready": 1}),
    "window": ("window 0", {"matrix_engine.o_act__valid": 1,
                            "matrix_engine.o_act__ready": 1}),
    "emit_only": ("window, no read", {"matrix_engine.o_act__valid": 1,
                                      "matrix_engine.o_act__ready": 1,
                                      "matrix_engine.o_ub__data__ready": 0}),
    "row_out": EVENTS["row_out"],
}


def windows_program(config: TPUConfig) -> TourProgram:
    """The windows stop's program: the first kernel row of four 3 x 3 filters over a 5 x 6
    int8 image (:data:`WINDOWS_IMAGE`) read as the tensor itself, ``ub_row`` elements a
    buffer row (on the 4x4 core, 30 elements in 8 rows), at strides 1 and 2::

        load_weights tile=0 count=1 signed      W: row kx = tap (0, kx) of each filter
        read_weights tile=0 count=1
        load_params slot=0 shift=0 zp=0 clamp=127
        read_host ub=0 count=8                  the image, packed (8 data beats)
        matmul ub=0 acc=0 count=16 step=1 switch signed window       stride 1
        matmul ub=0 acc=16 count=8 step=2 signed window              stride 2
        activate acc=0 ub=8 count=24 func=identity pool=none slot=0
        write_host ub=8 count=24
        halt

    Window ``i`` of a MATMUL is the ``rows`` elements from element ``i * step``; the tile's
    last row is zero, so a window's fourth element (the next pixel) adds nothing. Each stride
    is one run along the image's width, as the compiler's window layout makes it: window
    ``q = oy * w + ox`` at element ``stride * q``, for every ``ox`` of the width, so the
    windows whose ``ox`` is past the output's edge (they run into the next image row, or
    sit on the rows a stride of 2 skips) are computed and not the convolution's. The host
    gets each window times W (identity requantisation: saturation only);
    :attr:`TourProgram.conv` says which rows are the convolution's."""
    rows, cols, ub = config.rows, config.cols, config.ub_row
    h, w = WINDOWS_IMAGE
    kh, kw = WINDOWS_KERNEL
    assert kw <= rows, "a kernel row is one window of the array's rows"
    rng = np.random.default_rng(5)
    image = rng.integers(-4, 5, (h, w))
    kernels = rng.integers(-3, 4, (cols, kh, kw))       # one filter a column
    tile = np.zeros((rows, cols), dtype=np.int64)
    tile[:kw] = kernels[:, 0, :].T                      # kernel row 0; the rest zero
    flat = image.reshape(-1)
    ub_rows = -(-flat.size // ub)
    elements = np.zeros(ub_rows * ub + rows, dtype=np.int64)   # past the image: zero
    elements[:flat.size] = flat
    byte = unsigned(DATA_BITS)
    int32 = unsigned(32)
    p = TourProgram(x=image, w=tile)
    p.add("load_weights tile=0 count=1 signed",
          _word(isa.LoadWeights, opcode=Opcode.LOAD_WEIGHTS, signed=1, tile=0, count=1),
          [_row(tile[r], byte, cols) for r in range(rows)])
    p.add("read_weights tile=0 count=1",
          _word(isa.ReadWeights, opcode=Opcode.READ_WEIGHTS, tile=0, count=1))
    p.add("load_params slot=0 shift=0 zp=0 clamp=127",
          _word(isa.LoadParams, opcode=Opcode.LOAD_PARAMS, slot=0, shift=0, zero_point=0,
                clamp_hi=127),
          [_row([0] * cols, int32, cols), _row([1] * cols, int32, cols)])
    p.add(f"read_host ub=0 count={ub_rows}",
          _word(isa.ReadHost, opcode=Opcode.READ_HOST, ub_addr=0, count=ub_rows),
          [_row(elements[i * ub:(i + 1) * ub], byte, ub) for i in range(ub_rows)])
    acc, windows = 0, []
    for stride in (1, 2):
        ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
        count = (ho - 1) * w + wo
        p.add(f"matmul ub=0 acc={acc} count={count} step={stride}"
              f"{' switch' if acc == 0 else ''} signed window",
              _word(isa.Matmul, opcode=Opcode.MATMUL, ub_addr=0, acc_addr=acc, count=count,
                    switch=acc == 0, signed=1, window=1, lane=0, step=stride))
        windows += [elements[stride * q:stride * q + rows] for q in range(count)]
        oy, ox = np.mgrid[:ho, :wo]
        p.conv[stride] = acc + oy * w + ox
        acc += count
    p.add(f"activate acc=0 ub=8 count={acc} func=identity pool=none slot=0",
          _word(isa.Activate, opcode=Opcode.ACTIVATE, acc_addr=0, ub_addr=8, count=acc,
                func=Func.IDENTITY, pool=Pool.NONE, slot=0))
    p.add(f"write_host ub=8 count={acc}",
          _word(isa.WriteHost, opcode=Opcode.WRITE_HOST, ub_addr=8, count=acc))
    p.add("halt", _word(isa.Halt, opcode=Opcode.HALT))
    p.expected = np.clip(np.array(windows) @ tile, -128, 127)
    p.expected_beats = acc + 1
    return p


def windows_stages(config: TPUConfig) -> list[tuple[str, str, list[Trace]]]:
    """The windows stop's save file (as :func:`tour_stages`): the host, the front end with
    MATMUL's window fields, the matrix engine's tokens and buffer reads, the rows it keeps
    and the one arriving, the window into the array, the output rows, the host beats."""
    rows, cols = config.rows, config.cols
    me = "matrix_engine."
    return [
        ("i_host", "1  host -> core: the image, the program", [
            *_host_stream("i_host"),
        ]),
        ("front_end", "2  front end: MATMUL's window fields", [
            _t("front_end.fetch_opcode", "instruction"),
            _t("front_end.\\o_matmul__payload.ub_addr", "ub", "dec"),
            _t("front_end.\\o_matmul__payload.acc_addr", "acc", "dec"),
            _t("front_end.\\o_matmul__payload.count", "count", "dec"),
            _t("front_end.\\o_matmul__payload.window", "window", "bin"),
            _t("front_end.\\o_matmul__payload.lane", "lane", "dec"),
            _t("front_end.\\o_matmul__payload.step", "step", "dec"),
            _t("front_end.o_hazards__hazard", "waits on a hazard", "bin"),
            _t("front_end.dispatch", "dispatch", "bin"),
        ]),
        ("tokens", "3  matrix engine: a token a cycle, the buffer reads", [
            _t(me + "win_row", "window row", "dec"),
            _t(me + "lane", "window lane", "dec"),
            _t(me + "need_read", "need_read", "bin"),
            _t(me + "emit", "emit", "bin"),
            _t(me + "o_ub__addr__valid", "read", "bin"),
            _t(me + "o_ub__addr__payload", "buffer row", "dec"),
        ]),
        ("kept_rows", "4  matrix engine: the rows kept and the row arriving", [
            _t(me + "o_ub__data__valid", "row arrives", "bin"),
            _t(me + "o_ub__data__payload", "arriving (bytes)"),
            _t(me + "upper", "upper (bytes)"),
            _t(me + "lower", "lower (bytes)"),
        ]),
        ("window", "5  the window into the array", [
            _t(me + "o_act__valid", "window sent", "bin"),
            _t(me + "o_ub__data__ready", "with a read", "bin"),
            *[_t(me + f"\\o_act__payload.data[{r}]", f"element {r}", "signed")
              for r in range(rows)],
        ]),
        ("o_psum", "6  output rows into the accumulators", [
            _t(_ARRAY + "o_psum__valid", "output row", "bin"),
            *[_t(_ARRAY + f"\\o_psum__payload[{c}]", f"filter {c}", "signed")
              for c in range(cols)],
            _t(me + "\\o_acc__payload.addr", "accumulator row", "dec"),
        ]),
        ("o_host", "7  core -> host: the windows times W", [
            *_host_stream("o_host"),
        ]),
    ]


@dataclass(frozen=True)
class TourStop:
    """One stop of the tour: its program, its save file's stages and markers (the first
    event's marker, A, is where docs/tour.md counts the stop's cycles from), and what the
    host gets (as :func:`main` prints it)."""
    title: str
    program: object            # (config) -> TourProgram
    stages: object             # (config) -> stages, as tour_stages
    events: dict
    result: str


#: The tour's stops by name (``--stop``): ``matmul`` (docs/tour.md's main walk),
#: ``attention`` (k.T made on chip, docs/tour.md's attention section) and ``windows`` (a
#: convolution kernel row over the image itself, docs/tour.md's windows section).
TOURS: dict[str, TourStop] = {
    "matmul": TourStop("one matmul", tour_program, tour_stages, EVENTS, "relu(X @ W)"),
    "attention": TourStop("q @ k.T with k.T made on chip", attention_program,
                          attention_stages, ATTENTION_EVENTS, "Q @ K.T"),
    "windows": TourStop("a convolution over the image itself", windows_program,
                        windows_stages, WINDOWS_EVENTS, "each window @ W"),
}


def markers(stop: str = "matmul") -> list[tuple[str, str]]:
    """The save file's markers for ``stop`` (as :data:`MARKERS`)."""
    return [*((name, label) for name, (label, _) in TOURS[stop].events.items()),
            ("done", "DONE")]


#: GTKWave's window (and the screenshot's) size in pixels, and the signal pane's width.
WINDOW = (1800, 2050)
SIGNALS_WIDTH = 300
#: GTKWave's zoom ``z`` shows ``2 ** -z`` time units per 200 pixels (its default zoom base
#: and frame; checked on GTKWave 3.3.118, whose time unit here is the dump's 1 ps).
ZOOM_FRAME = 200


def _zoom(span_ps: float, pixels: int) -> float:
    """The GTKWave zoom that shows *span_ps* across *pixels*."""
    return -math.log2(span_ps / pixels * ZOOM_FRAME)


def write_tour_gtkw(fst: Path, gtkw: Path, config: TPUConfig, *, events: dict[str, float],
                    start: float, end: float, signals: dict[str, str] | None = None,
                    filters: dict[str, Path] | None = None, stop: str = "matmul"
                    ) -> list[str]:
    """Write the tour's save file for the waveform *fst*: the clock, then each stage of
    :func:`tour_stages` (a comment line naming it and a group of its traces), the named
    markers at *events* (times in ps, by :data:`MARKERS` name), the view from *start* to *end*
    (ps); ``events["done"]`` marks the DONE beat. Returns the traces, as named in the dump.
    Raises :class:`ValueError` if a trace is not in the dump (GTKWave would silently drop
    it), or if the dump cannot be read."""
    if signals is None:
        signals = fst_signals(fst)
        if signals is None:
            raise ValueError("fst2vcd (Debian package gtkwave) is needed to read the "
                             "waveform's signal names")
    if filters is None:
        filters = write_enum_filters(Path(gtkw).parent)
    top = "core"
    stages = TOURS[stop].stages(config)
    missing = [trace.path for _, _, traces in stages for trace in traces
               if f"{top}.{trace.path}" not in signals]
    if missing:
        raise ValueError(f"not in {fst}: {', '.join(missing)}")
    traces: list[str] = []
    width, height = WINDOW
    labels = [(label, events[name]) for name, label in markers(stop) if name in events]
    with open(gtkw, "w") as f:
        save = GTKWSave(f)
        save.comment(f"amtpu guided tour: {TOURS[stop].title} on the {config.name} core "
                     f"(docs/tour.md)")
        # The dump by its path from the save file, which GTKWave resolves from [savefile].
        save.dumpfile(os.path.relpath(Path(fst).resolve(), Path(gtkw).resolve().parent),
                      abspath=False)
        save.savefile(str(Path(gtkw).resolve()))
        save.size(width, height)
        save.pos(0, 0)
        save.timestart(int(start))
        save.zoom_markers(_zoom(end - start, width - SIGNALS_WIDTH - 40), -1,
                          **{chr(ord("a") + i): int(t) for i, (_, t) in enumerate(labels)})
        for i, (label, _) in enumerate(labels):
            f.write(f"[markername] {chr(ord('A') + i)}{label}\n")
        save.treeopen(f"{top}.")
        save.signals_width(SIGNALS_WIDTH)
        save.trace(signals[f"{top}.clk"], alias="clk", datafmt="bin")
        traces.append(signals[f"{top}.clk"])
        for group, line, stage in stages:
            save.blank(line)
            with save.group(group):
                for trace in stage:
                    name = signals[f"{top}.{trace.path}"]
                    table = enum_filter(name, filters)
                    save.trace(name, alias=trace.alias,
                               datafmt="hex" if table else trace.fmt,
                               extraflags=GTKWFlag.invert if trace.invert else GTKWFlag(0),
                               translate_filter_file=str(table) if table else None)
                    traces.append(name)
    return traces


@dataclass
class TourResult:
    """What :func:`run_tour` made and checked."""
    fst: Path
    gtkw: Path | None           # None without fst2vcd (GTKWave not installed)
    filters: dict[str, Path]
    program: TourProgram
    received: list[int]
    expected: list[int]
    events: dict[str, int]
    start: int
    end: int
    traces: list[str]
    period: int = 10_000        # the clock period, ps
    stop: str = "matmul"

    def cycles(self) -> dict[str, int]:
        """The events (:attr:`events`, by marker name) in cycles counted from marker A (the
        matmul and windows stops: LOAD_WEIGHTS issues; the attention stop: Q's first row is
        written), as docs/tour.md counts them."""
        first = self.events[next(iter(TOURS[self.stop].events))]
        return {name: (time - first) // self.period for name, time in self.events.items()}


def run_tour(config_key: str = TOUR_CONFIG, out_dir: Path = TOUR_DIR,
             stop: str = "matmul") -> TourResult:
    """Run the tour's program on the RTL core under Icarus with an FST waveform, check the
    output beats against :class:`sim.models.isa_sim.IsaSim` with ``==`` (raises
    :class:`AssertionError` if they differ) and write the save file; returns what it made."""
    from hdl.core import Core
    from sim.models.isa_sim import IsaSim
    from sim.rtl.runner import run

    config = get_config(config_key)
    program = TOURS[stop].program(config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "tour.json"
    report.unlink(missing_ok=True)
    name = "tour" if stop == "matmul" else f"tour-{stop}"
    fst = out_dir / f"{name}.fst"
    # The simulation's build folder and its waveform's path are shared by every run of the
    # tour (two test workers, or `make tour` beside the tests): one at a time.
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with open(BUILD_ROOT / "tour.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        generic = run("core", lambda: Core(config), config_key, "sim.waves.tour_bench", REPO_ROOT,
                      "tour", extra_env={"AMTPU_TOUR_OUT": str(report), "AMTPU_TOUR": stop},
                      label=name, waves=True, sim="icarus", config=config)
        if generic is not None:
            generic.unlink()          # the runner's own save file: the tour writes its own
        # The waveform beside the save file, which names it by a relative path (the folder
        # can move).
        shutil.move(BUILD_ROOT / "waves" / f"core-{config_key}-{name}.fst", fst)
    result = json.loads(report.read_text())
    received = result["received"]
    expected = IsaSim(config).run(program.beats)
    assert received == expected, \
        f"the core sent {[hex(b) for b in received]}, the ISA simulator {expected}"
    rows = decode_rows(received[:-1], config.cols)
    assert np.array_equal(rows, program.expected), f"the rows should be {program.expected}"
    # The view: from two cycles before the first beat is taken to four after the last one
    # sent (the dump goes on for longer).
    period = result["period"]
    start = result["taken_at"][0] - 2 * period
    end = result["received_at"][-1] + 4 * period
    gtkw = out_dir / f"{name}.gtkw"
    filters = write_enum_filters(out_dir)
    # The bench's events, and the DONE beat (the last beat the core sends).
    events = {**result["events"], "done": result["received_at"][-1]}
    if shutil.which("fst2vcd") is None:
        # Without GTKWave's fst2vcd the names cannot be checked against the dump: no save
        # file rather than one whose unknown names GTKWave would silently drop.
        gtkw, traces = None, []
    else:
        traces = write_tour_gtkw(fst, gtkw, config, events=events, start=start, end=end,
                                 filters=filters, stop=stop)
    return TourResult(fst=fst, gtkw=gtkw, filters=filters, program=program,
                      received=received, expected=expected, events=events,
                      start=start, end=end, traces=traces, period=period, stop=stop)


def open_gtkwave(gtkw: Path) -> bool:
    """Open GTKWave on *gtkw* (without waiting) when there is a display and GTKWave; else
    print how to open it. Returns whether it started."""
    how = f"gtkwave {gtkw}"
    if shutil.which("gtkwave") is None:
        print(f"tour: GTKWave is not installed (apt-get install gtkwave); then: {how}")
        return False
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        print(f"tour: no display; on a machine with one: {how}")
        return False
    subprocess.Popen(["gtkwave", str(gtkw)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    print(f"tour: opened {how}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.waves.tour",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-gui", action="store_true", help="do not open GTKWave")
    parser.add_argument("--stop", choices=sorted(TOURS), default="matmul",
                        help="which stop: one matmul (default), q @ k.T with k.T made on "
                             "chip, or a convolution over the image itself (docs/tour.md)")
    parser.add_argument("--screenshot", type=Path, metavar="PNG",
                        help="also save a picture of GTKWave on the save file (under Xvfb)")
    args = parser.parse_args(argv)
    result = run_tour(stop=args.stop)
    program = result.program
    print(f"tour: {len(program.listing)} instructions, {len(program.beats)} beats in; "
          f"{len(result.received)} beats out, equal to the ISA simulator's")
    for text, data_beats in program.listing:
        print(f"    {text}" + (f"   + {data_beats} data beats" if data_beats else ""))
    print(f"tour: {TOURS[args.stop].result} =\n{program.expected}")
    # The markers, with cycles counted from the first instruction's (as docs/tour.md does).
    print("tour: markers (10 ns clock)")
    cycles = result.cycles()
    for i, (name, label) in enumerate(markers(args.stop)):
        if name in result.events:
            print(f"    {chr(ord('A') + i)} {label:15} {result.events[name] / 1000:6.0f} ns  "
                  f"cycle {cycles[name]}")
    print(f"tour: waveform {result.fst}")
    if result.gtkw is None:
        print("tour: no save file: GTKWave is not installed (its fst2vcd reads the dump's "
              "signal names); apt-get install gtkwave, then run this again")
        return 0 if args.screenshot is None else 1
    print(f"tour: save file {result.gtkw}")
    if args.screenshot is not None:
        from sim.waves.screenshot import screenshot
        try:
            png = screenshot(result.gtkw, args.screenshot)
        except RuntimeError as exc:
            print(f"tour: no screenshot: {exc}", file=sys.stderr)
            return 1
        print(f"tour: screenshot {png} ({png.stat().st_size // 1024} KiB)")
    if not args.no_gui:
        open_gtkwave(result.gtkw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
