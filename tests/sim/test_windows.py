"""MATMUL's window mode at the ISA level: the ISA simulator's windows against the independent
references (:func:`sim.models.golden.conv_windows` for a convolution over a tensor stored
as it is, slices of the buffer's elements for every lane and step), the timing helpers of
:mod:`hdl.isa` against a brute-force count, and the checks the mode adds (BAD_FIELD,
UB_RANGE at the buffer's edge), each leaving the state as it was. The RTL core against the
ISA simulator: ``tests/hdl/test_matmul_windows.py``."""

from __future__ import annotations

import numpy as np
import pytest
from test_isa_sim import check_error

from firmware.asm import Program, encode
from hdl import isa
from hdl.config import TPUConfig
from hdl.presets import PRESETS, get_config
from sim.models import golden
from sim.models.isa_sim import IsaSim

SEED = 20261207
#: The presets with the window mode, ub_row 2, 4, 8 and 16 (wide: windows of 4 in rows of 8).
WINDOWED = ("tiny", "small", "wide", "default", "large")
E = isa.ErrorCode


def _rng(*key: int | str) -> tuple[np.random.Generator, str]:
    """A generator for ``key`` under :data:`SEED`, and the seed as failure messages name it."""
    seed = [SEED, *(sum(map(ord, k)) if isinstance(k, str) else int(k) for k in key)]
    return np.random.default_rng(seed), f"seed {seed}"


def _operands(rng: np.random.Generator, shape, signed: bool) -> np.ndarray:
    """Random operands with both extremes of the range planted."""
    lo, hi = golden.operand_range(signed)
    values = rng.integers(lo, hi + 1, shape)
    flat = values.reshape(-1)
    at = rng.choice(flat.size, min(flat.size, 8), replace=False)
    flat[at] = np.resize([lo, hi], len(at))
    return values


def _loaded(cfg: TPUConfig, buffer: np.ndarray, tile: np.ndarray) -> Program:
    """Set-up: ``buffer`` in the unified buffer from row 0 and ``tile`` switched in (by a
    one-row MATMUL into accumulator row 0)."""
    p = Program(cfg)
    p.read_host(0, buffer)
    p.load_weights(0, tile)
    p.read_weights(0)
    p.matmul(0, 0, 1, switch=True)
    return p


def _matmul(sim: IsaSim, ub: int, acc: int, count: int, window, *, signed: bool = True,
            accumulate: bool = False, switch: bool = False) -> None:
    q = Program(sim.config)
    q.matmul(ub, acc, count, window=window, signed=signed, accumulate=accumulate,
             switch=switch)
    sim.feed(q.beats)


# Convolutions over HWC tensors ---------------------------------------------------------------

def _conv_shape(cfg: TPUConfig, kernel: int, stride: int, channels: int) -> tuple[int, int]:
    """Output height and width (widest first, at most 3 by 4) whose input fits the buffer
    from any lane, with the last window's overrun past the tensor."""
    room = cfg.ub_depth * cfg.ub_row - cfg.ub_row - cfg.rows
    for wo in (4, 3, 2, 1):
        for ho in (3, 2, 1):
            h, w = kernel + stride * (ho - 1), kernel + stride * (wo - 1)
            if h * w * channels <= room:
                return ho, wo
    raise AssertionError(f"no {kernel}x{kernel} input of {channels} channels fits {cfg.name}")


def _direct_conv(x: np.ndarray, k: np.ndarray, stride: int) -> np.ndarray:
    """``out[oy, ox, n] = sum x[s oy + ky, s ox + kx, c] k[ky, kx, c, n]``, exact."""
    kh, kw = k.shape[:2]
    ho, wo = (x.shape[0] - kh) // stride + 1, (x.shape[1] - kw) // stride + 1
    out = np.zeros((ho, wo, k.shape[3]), dtype=np.int64)
    for oy in range(ho):
        for ox in range(wo):
            patch = x[stride * oy:stride * oy + kh, stride * ox:stride * ox + kw]
            out[oy, ox] = np.einsum("abc,abcn->n", patch, k)
    return out


@pytest.mark.parametrize("kernel", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("preset", ["tiny", "small", "default", "large"])
def test_convolution_windows(preset: str, stride: int, kernel: int):
    """A convolution over an HWC tensor stored as it is, ``ub_row`` elements a row from a
    random lane: for each output row, kernel row and chunk of ``rows`` of its ``kw * C``
    elements, one window MATMUL (``step`` = stride times channels) of a tile holding that
    chunk's weights (zero past the chunk). Each MATMUL adds ``golden.conv_windows``'s chunk
    times the tile (``golden.matmul``) to its accumulator rows, and the sums are the
    convolution. Channels 1 to 3, int8 and uint8 tensors with their extremes."""
    cfg = PRESETS[preset]
    for channels in (1, 2, 3):
        for signed in (True, False):
            rng, seed = _rng(preset, stride, kernel, channels, signed)
            ho, wo = _conv_shape(cfg, kernel, stride, channels)
            h, w = kernel + stride * (ho - 1), kernel + stride * (wo - 1)
            what = (f"{seed}: {preset}, {kernel}x{kernel} stride {stride} over {h}x{w}x"
                    f"{channels} {'int8' if signed else 'uint8'}")
            x = _operands(rng, (h, w, channels), signed)
            k = _operands(rng, (kernel, kernel, channels, cfg.cols), True)
            origin = int(rng.integers(cfg.ub_row))      # the tensor's first lane
            n_rows = -(-(origin + x.size + cfg.rows) // cfg.ub_row)
            base = int(rng.integers(cfg.ub_depth - n_rows + 1))
            elements = _operands(rng, n_rows * cfg.ub_row, signed)   # junk around it
            elements[origin:origin + x.size] = x.reshape(-1)
            p = Program(cfg)
            p.read_host(base, elements.reshape(n_rows, cfg.ub_row))
            sim = IsaSim(cfg)
            sim.feed(p.beats)
            windows = golden.conv_windows(x, (kernel, kernel), stride)
            taps = kernel * channels                # a kernel row's elements
            step = stride * channels
            for oy in range(ho):
                acc = slice(oy * wo, (oy + 1) * wo)
                want = np.zeros((wo, cfg.cols), dtype=np.int64)
                for ky in range(kernel):
                    for first in range(0, taps, cfg.rows):
                        n = min(cfg.rows, taps - first)
                        tile = np.zeros((cfg.rows, cfg.cols), dtype=np.int64)
                        tile[:n] = k[ky].reshape(taps, cfg.cols)[first:first + n]
                        chunk = np.zeros((wo, cfg.rows), dtype=np.int64)
                        chunk[:, :n] = windows[ky, oy][:, first:first + n]
                        start = base * cfg.ub_row + origin + \
                            (stride * oy + ky) * w * channels + first
                        ub, lane = divmod(start, cfg.ub_row)
                        q = Program(cfg)
                        q.load_weights(0, tile)
                        q.read_weights(0)
                        sim.feed(q.beats)
                        _matmul(sim, ub, acc.start, wo, (lane, step), signed=signed,
                                switch=True, accumulate=bool(ky or first))
                        want = golden.wrap(want + golden.matmul(chunk, tile, x_signed=signed))
                        assert not sim.status.error, f"{what}: {sim.status}"
                        assert np.array_equal(sim.acc[acc], want), \
                            (f"{what}: output row {oy}, kernel row {ky}, elements {first}.. "
                             f"(ub {ub} lane {lane} step {step} count {wo}): "
                             f"{sim.acc[acc].tolist()}, expected {want.tolist()}")
            assert np.array_equal(sim.acc[:ho * wo],
                                  _direct_conv(x, k, stride).reshape(ho * wo, cfg.cols)), what


# Every lane and step -------------------------------------------------------------------------

@pytest.mark.parametrize("preset", WINDOWED)
def test_every_lane_and_step(preset: str):
    """Every lane and every step 0..15, counts 1..9 where the buffer holds them, int8 and
    uint8 by turns, from random buffer rows: row ``i`` of the product is the ``rows``
    elements from ``lane + i * step`` of the buffer read as one run (a slice of its
    elements), times the tile."""
    cfg = PRESETS[preset]
    rng, seed = _rng("lanes", preset)
    buffer = _operands(rng, (cfg.ub_depth, cfg.ub_row), True)
    tile = _operands(rng, (cfg.rows, cfg.cols), True)
    sim = IsaSim(cfg)
    sim.feed(_loaded(cfg, buffer, tile).beats)
    flat = buffer.reshape(-1)
    for lane in range(cfg.ub_row):
        for step in range(16):
            signed = (lane + step) % 2 == 0
            count = int(rng.integers(1, 10))
            if step:
                count = min(count, (flat.size - lane - cfg.rows) // step + 1)
            span = isa.window_rows(lane, step, count, cfg.rows, cfg.ub_row)
            ub = int(rng.integers(cfg.ub_depth - span + 1))
            starts = ub * cfg.ub_row + lane + step * np.arange(count)
            x = np.array([flat[s:s + cfg.rows] for s in starts])
            x = golden.from_raw(golden.to_raw(x), signed)
            _matmul(sim, ub, 0, count, (lane, step), signed=signed)
            want = golden.matmul(x, tile, x_signed=signed)
            assert not sim.status.error and np.array_equal(sim.acc[:count], want), \
                (f"{seed}: {preset}, ub {ub} lane {lane} step {step} count {count} "
                 f"{'int8' if signed else 'uint8'}: {sim.status}, {sim.acc[:count].tolist()}, "
                 f"expected {want.tolist()}")


@pytest.mark.parametrize("windows", [True, False], ids=["with-mode", "without-mode"])
def test_lane_and_step_ignored_without_window(windows: bool):
    """A plain MATMUL with ``lane`` and ``step`` set reads its rows' first elements, as with
    them clear (no BAD_FIELD on a core without the window mode either); the assembler leaves
    them clear."""
    cfg = PRESETS["small"].replace(conv_windows=windows)
    rng, seed = _rng("plain")
    buffer = _operands(rng, (16, cfg.ub_row), True)
    tile = _operands(rng, (cfg.rows, cfg.cols), True)
    p = _loaded(cfg, buffer, tile)
    assert Program(cfg).matmul(3, 0, 5) == [encode(isa.Opcode.MATMUL, ub_addr=3, count=5,
                                                   signed=1)]
    want = golden.matmul(buffer[3:12, :cfg.rows], tile)
    for lane, step in [(0, 0), (1, 0), (3, 15), (15, 7), (2, 4)]:
        sim = IsaSim(cfg)
        sim.feed(p.beats + [encode(isa.Opcode.MATMUL, ub_addr=3, acc_addr=4, count=9,
                                   signed=1, lane=lane, step=step)])
        assert not sim.status.error and np.array_equal(sim.acc[4:13], want), \
            f"{seed}: lane {lane} step {step} without window: {sim.status}"


# Timing helpers ------------------------------------------------------------------------------

def _engine(lane: int, step: int, count: int, rows: int, ub_row: int):
    """The engine as its contract describes it, counted: rows read in order from row 0,
    each once a window needs it; a window sent in the cycle its last row is read, or in a
    cycle of its own when that row was read already. (rows read, each window's last row,
    cycles)."""
    read = cycles = 0
    ends = []
    for i in range(count):
        elements = range(lane + i * step, lane + i * step + rows)
        end = max(e // ub_row for e in elements)
        ends.append(end)
        if end < read:
            cycles += 1
        else:
            cycles += end + 1 - read
            read = end + 1
    touched = {e // ub_row for i in range(count)
               for e in range(lane + i * step, lane + i * step + rows)}
    assert touched <= set(range(read)) and max(touched) == read - 1
    return read, ends, cycles


@pytest.mark.parametrize("rows, ub_row", [(1, 2), (2, 2), (3, 4), (4, 4), (4, 8), (8, 8),
                                          (16, 16)])
def test_window_helpers_count_what_the_engine_does(rows: int, ub_row: int):
    """:func:`~hdl.isa.window_rows`, :func:`~hdl.isa.window_ends` and
    :func:`~hdl.isa.window_cycles` for every lane, step 0..15 and count 1..12 equal a
    brute-force count; with ``step <= ub_row`` a window a cycle, plus one when the first
    window spans two rows."""
    for lane in range(ub_row):
        for step in range(16):
            for count in range(1, 13):
                args = (lane, step, count, rows, ub_row)
                read, ends, cycles = _engine(*args)
                got = (isa.window_rows(*args), isa.window_ends(*args), isa.window_cycles(*args))
                assert got == (read, ends, cycles), f"{args}: {got}, counted {read, ends, cycles}"
                if step <= ub_row:
                    assert cycles == count + (lane + rows - 1 >= ub_row), args


# Checks ---------------------------------------------------------------------------------------

def _window_word(ub: int, count: int, lane: int, step: int, signed: int = 1, acc: int = 0):
    return encode(isa.Opcode.MATMUL, ub_addr=ub, acc_addr=acc, count=count, signed=signed,
                  window=1, lane=lane, step=step)


def _active_tile(p: Program) -> None:
    """Set-up: a tile active, accumulator rows written (what the word must not change)."""
    cfg = p.config
    p.load_weights(0, np.arange(cfg.rows * cfg.cols).reshape(cfg.rows, cfg.cols) - 7)
    p.read_weights(0)
    p.matmul(0, 0, 4, switch=True)


@pytest.mark.parametrize("name, config", [
    ("icebreaker", PRESETS["icebreaker"]), ("ulx3s", PRESETS["ulx3s"]),
    ("small-without", get_config("small").replace(conv_windows=False))])
def test_window_without_the_mode_is_bad_field(name: str, config: TPUConfig):
    """A core built with ``conv_windows=False``: a window MATMUL is BAD_FIELD, even one
    that would fit, before SIGNEDNESS (the iCEBreaker's int8-only core, signed clear) and
    UB_RANGE; the state is as before."""
    assert not config.conv_windows
    for k, word in enumerate([_window_word(0, 1, 0, 1), _window_word(2, 3, 1, 0),
                              _window_word(0, 1, 0, 1, signed=0),
                              _window_word(config.ub_depth, 9, 15, 15)]):
        check_error(config, f"{name}-{k}", _active_tile, word, E.BAD_FIELD)


def test_lane_past_the_row_is_bad_field():
    """The tiny core (``ub_row`` 2): lanes 2..15 are BAD_FIELD (before UB_RANGE), the state
    as before; lanes 0 and 1 run."""
    cfg = PRESETS["tiny"]
    for lane in range(cfg.ub_row, 16):
        check_error(cfg, f"lane-{lane}", _active_tile, _window_word(0, 1, lane, 1), E.BAD_FIELD)
        check_error(cfg, f"lane-{lane}-far", _active_tile,
                    _window_word(cfg.ub_depth - 1, 9, lane, 15), E.BAD_FIELD)
    for lane in range(cfg.ub_row):
        sim = IsaSim(cfg)
        p = Program(cfg)
        _active_tile(p)
        sim.feed(p.beats + [_window_word(0, 1, lane, 1)])
        assert not sim.status.error, (lane, sim.status)


@pytest.mark.parametrize("preset", WINDOWED)
def test_ub_range_at_the_edge(preset: str):
    """A window MATMUL whose last element is the buffer's last (row ``ub_depth - 1``)
    runs and reads it; moved on by one element (the next lane, or the next row's lane 0)
    it is UB_RANGE, with the state as before. UB_RANGE counts the rows the windows read,
    not ``count``: nine windows of step 0 in the last row run; a step past ``ub_row`` whose
    ``ub_addr + count`` fits but whose rows do not fails."""
    cfg = PRESETS[preset]
    rng, seed = _rng("edge", preset)
    buffer = _operands(rng, (cfg.ub_depth, cfg.ub_row), True)
    tile = _operands(rng, (cfg.rows, cfg.cols), True)
    flat = buffer.reshape(-1)
    setup = _loaded(cfg, buffer, tile)
    cases = [(1, 1), (min(cfg.ub_row, 15), 3), (15, 4), (7, 9), (int(rng.integers(1, 16)), 2)]
    for step, count in cases:
        last = cfg.ub_depth * cfg.ub_row - 1
        first = last - (count - 1) * step - (cfg.rows - 1)
        ub, lane = divmod(first, cfg.ub_row)
        what = f"{seed}: {preset}, ub {ub} lane {lane} step {step} count {count}"
        assert isa.window_rows(lane, step, count, cfg.rows, cfg.ub_row) == cfg.ub_depth - ub
        sim = IsaSim(cfg)
        sim.feed(setup.beats)
        _matmul(sim, ub, 0, count, (lane, step))
        x = np.array([flat[first + i * step:first + i * step + cfg.rows] for i in range(count)])
        assert not sim.status.error, f"{what}: {sim.status}"
        assert np.array_equal(sim.acc[:count], golden.matmul(x, tile)), what
        ub, lane = divmod(first + 1, cfg.ub_row)
        check_error(cfg, f"{what}, one element on", _active_tile,
                    _window_word(ub, count, lane, step), E.UB_RANGE)
    # step 0: nine windows of the last row's last lanes run (a plain MATMUL of 9 rows there
    # is UB_RANGE).
    sim = IsaSim(cfg)
    sim.feed(setup.beats)
    lane = cfg.ub_row - cfg.rows
    _matmul(sim, cfg.ub_depth - 1, 0, 9, (lane, 0))
    assert not sim.status.error, f"{seed}: step 0 in the last row: {sim.status}"
    assert np.array_equal(sim.acc[:9], golden.matmul(np.tile(buffer[-1, lane:], (9, 1)), tile))
    if cfg.ub_row == 16:
        return
    # A step past the row: count rows fit, the rows read do not.
    step, count = 15, 4
    rows = isa.window_rows(0, step, count, cfg.rows, cfg.ub_row)
    assert rows > count
    ub = cfg.ub_depth - rows + 1
    check_error(cfg, f"{seed}: {preset}, step 15 count 4 from row {ub}", _active_tile,
                _window_word(ub, count, 0, step), E.UB_RANGE)
