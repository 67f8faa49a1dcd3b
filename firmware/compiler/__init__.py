"""Compiler from a quantised network (:mod:`firmware.quant`) to programs for the core.

:func:`compile_network` plans a whole network for one :class:`~hdl.config.TPUConfig`: weight
tiles, parameter slots, unified-buffer and accumulator regions, and how many images go through
at a time. The result, :class:`CompiledNetwork`, gives a *setup* program that loads what stays
resident (weights and parameters when they fit, the constant frames of padded tensors) and, for
any number of quantised inputs, *batch* programs that stream the inputs in, run every stage with
activations kept in the unified buffer, and write the outputs back, the link's transfers
overlapping the array's work. :func:`firmware.runtime.run` runs them on a device.

Units and batches
-----------------
Images go through in *units* of ``unit`` images and *batches* of ``units`` units
(``batch_size = unit * units`` images). The first stage runs unit by unit: the host's rows of
unit ``n + 1`` go into one of two input buffers while the first stage's MATMULs read unit ``n``
from the other. The later stages run once per batch, over all its units, so a weight tile of a
later stage serves ``batch_size`` rows however small a unit is. A batch program holds several
batches; the last stage's output has two buffers, so the write-back of batch ``b`` overlaps
batch ``b + 1``.

On-chip layout
--------------
A tensor of ``P`` positions (``H * W``, 1 for a vector) and ``C`` channels is stored as ``G``
channel groups of ``g`` channels, unit by unit: unified-buffer row
``base + ((u * G + group) * P + position) * unit + image`` holds channels ``group * g ..`` of
one position of image ``image`` of unit ``u`` (element 0 first). Stage outputs use
``g = min(rows, cols)`` (ACTIVATE writes ``cols`` elements and MATMUL reads ``rows``) and the
network's last stage ``g = cols``. A tensor that a padded convolution reads is stored inside a
frame of the padding's width whose rows hold the quantised zero; the setup program writes the
frames, which no later instruction touches.

Stages
------
A stage is ``Y = act(requantise(X @ W))`` with optional 2x2 max-pooling. It runs as *passes*:
each pass is one weight tile (``rows x cols``, zero-padded) times one unified-buffer row per
accumulator row, the passes of a stage accumulating. An accumulator row is one output position
of one image (four in a row, one pooling window, when max-pooling is fused: ACTIVATE's MAX4
pools four consecutive rows). Where the rows a pass reads are consecutive in the unified
buffer, one MATMUL streams them; the compiler orders accumulator rows so that they are.

- Dense on the network input: one pass per ``rows`` input features.
- Dense after a spatial tensor (a Flatten): one pass per (position, channel group), weight
  rows in the HWC flatten order.
- Conv2D on the network input: the image crosses the link once, one row per position, and
  the row's spare elements carry the position's neighbours (as many kernel taps as fit,
  ``rows // C``), so one pass covers several kernel taps. A tap that no row holds is read from
  a row further on (a *shifted* pass: the taps of position ``p + d`` are taps of ``p``), so the
  host lays out a few positions past the output's edge (their outputs are not activated); only
  when no shift reaches a tap does another row per position cross the link.
- Conv2D on another stage's output runs on chip, TPU v1's way: one pass per kernel position
  and channel group, reading the input shifted by that position's offset. With stride 1 and
  no pooling, the rows that wrap around the frame's edge (``kw - 1`` per image row) are
  computed and not activated, so each pass is one MATMUL; with a stride or max-pooling each
  output position's rows are a MATMUL of their own (a unit's images are consecutive).

Each stage's accumulator rows are split into jobs of a quarter of the accumulators (half where
a pooling window needs it). A job's ACTIVATE is *released* once the next job of its stage has a
MATMUL queued (it waits for its own MATMULs, and the array has work meanwhile), and sent earlier
when a MATMUL is about to read its output or write its accumulator rows; jobs take accumulator
rows around the whole memory, clear of the ACTIVATEs not yet sent. The later stages of a batch
are interleaved one per job of the next batch's first stage. The host's rows are sent between
MATMULs into input rows no MATMUL still reads; a MATMUL about to read rows not yet sent has them
sent first. READ_WEIGHTS run ahead of the MATMULs by the weight FIFO's depth plus the shadow
tile, consecutive resident tiles in one instruction. Weights stay resident (loaded once by the
setup program) when all tiles fit ``weight_mem_tiles``; otherwise every batch program streams
them through the weight memory as a ring. Parameters stay resident when every (stage, column
block) fits ``param_slots``; otherwise an ACTIVATE whose set is not in a slot is preceded by
its LOAD_PARAMS into the slot used longest ago. The hardware interlocks order the rest (no NOP
padding, no SYNC).

Timing
------
The emitter keeps a cycle model of the core (:class:`_Timing`: the front end issuing in
order, the matrix engine one MATMUL ahead of the array, the activation engine one ACTIVATE at
a time, the hazard rules on the rows each instruction touches; its constants measured on the
RTL). The front end holds each instruction until the interlocks and its engine let it go, and
while it holds one, no later MATMUL reaches the array. So a released ACTIVATE (with its
LOAD_PARAMS) and the write-back go only when the model says the front end would issue them
before the array runs out of queued rows, and between MATMULs the host's rows go only as many
as the front end can send in that time (ACTIVATE's output rows share the unified buffer's
write port with them). The unit, the batch and the input ring are chosen by the model's cycles
for a batch in a long program (what a third batch adds to a program of two).

Shape bound
-----------
:meth:`CompiledNetwork.bounds` gives each stage's *shape bound*: its useful MACs over the MAC
slots its passes issue (``rows x cols`` for each accumulator row of each pass), which is the
array utilisation the stage reaches if the array never waits. What is lost below it is
scheduling (waits for the link, the weights, the interlocks); what is lost above it is the
layer's shape on this array.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from firmware.asm import Program
from firmware.quant import QuantisedNetwork, Stage
from firmware.runtime import Batch
from hdl import isa
from hdl.config import TPUConfig

__all__ = ["CompileError", "CompiledNetwork", "StageBound", "compile_network", "COUNT_LIMIT",
           "PROGRAM_IMAGES"]

#: Batches in the program whose cycle model gives the estimate (:meth:`CompiledNetwork.estimate`).
TRIAL_BATCHES = 3

#: Largest ``count`` field of an instruction.
COUNT_LIMIT = (1 << 16) - 1

#: Most images one batch program takes by default (the runtime waits for a program's outputs
#: before it sends the next, so a program's first input transfer and last write-back are the
#: only ones the array does not hide).
PROGRAM_IMAGES = 1024


class CompileError(ValueError):
    """The network does not fit the configuration (message names the stage and memory)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# Layout -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    """A tensor's place in the unified buffer (see the module notes): ``units`` blocks of
    ``unit`` images each; ``positions`` counts framed positions."""
    base: int
    groups: int
    positions: int
    unit: int
    units: int
    width: int          # g: channels per row
    channels: int
    height: int = 1     # interior height and width (1 x 1 for a vector)
    pitch: int = 1      # framed width
    frame: tuple[int, int] = (0, 0)

    def position(self, y, x):
        """Framed position of interior position (y, x)."""
        return (y + self.frame[0]) * self.pitch + x + self.frame[1]

    @property
    def block(self) -> int:
        """Rows of one unit."""
        return self.groups * self.positions * self.unit

    @property
    def rows(self) -> int:
        return self.block * self.units

    def row(self, group, position, image=0, block=0):
        """Row of (group, position) of image ``image`` of block ``block``."""
        return self.base + ((block * self.groups + group) * self.positions + position) \
            * self.unit + image

    def border(self) -> np.ndarray:
        """The frame's rows (every group and image), sorted."""
        if self.frame == (0, 0):
            return np.zeros(0, dtype=np.int64)
        inner = np.zeros(self.positions, dtype=bool)
        fx = self.frame[1]
        for y in range(self.height):
            start = self.position(y, 0)
            inner[start:start + self.pitch - 2 * fx] = True
        pos = np.flatnonzero(~inner)
        k, g, p, i = np.meshgrid(np.arange(self.units), np.arange(self.groups), pos,
                                 np.arange(self.unit), indexing="ij")
        return np.sort(self.row(g, p, i, k).ravel())


@dataclass(frozen=True)
class _Pass:
    """One weight tile's rows (indices into the stage's weight matrix rows, -1: zero) and,
    per accumulator row of a unit, the row it reads (offset in the input's unit block; -1:
    the accumulator row is not an output and may read anything)."""
    k_rows: np.ndarray
    sources: np.ndarray


@dataclass(frozen=True)
class _Layout:
    """Batch-independent tiling of one stage, for a unit of ``unit`` images."""
    m: int                      # accumulator rows per unit
    window: int                 # 1, or 4 for fused max-pooling
    passes: list[_Pass]
    outputs: np.ndarray         # per output row (m // window): (y, x, image) or y = -1
    out_width: int
    col_blocks: int
    host: _HostConv | None = None   # the network input's layout for a first convolution


@dataclass(frozen=True)
class _HostConv:
    """How the host lays out a first convolution's input: per chunk, the (tap, channel group)
    items of each row with their element offsets, over a grid of anchors ``(ah, aw)`` (the
    output positions and the few past its edge that shifted passes read)."""
    chunks: list[list[tuple[int, int, int, int]]]   # (tap, group, offset, width)
    anchors: np.ndarray         # per row of a chunk: (ay, ax, image)


@dataclass(frozen=True)
class StageBound:
    """A stage's shape bound (per image): useful MACs over the MAC slots its passes issue."""
    name: str
    useful_macs: float
    slots: float

    @property
    def bound(self) -> float:
        return self.useful_macs / self.slots if self.slots else 0.0


def _stage_layout(config: TPUConfig, st: Stage, index: int, images: int, width_in: int,
                  prev_out: tuple | None, last: bool, shifts: bool = True) -> _Layout:
    """The passes of stage ``st`` over ``images`` images. ``prev_out``: the input tensor's
    (groups, positions, pitch, frame, channels) when another stage made it (holding ``images``)."""
    c = config
    out_width = c.cols if last else min(c.rows, c.cols)
    col_blocks = _ceil_div(st.n, out_width)
    where = f"stage {st.name}"
    stride = st.stride
    i = np.arange(images)
    zeros = np.zeros(images, np.int64)
    if st.kind == "dense" and index == 0:
        passes = []
        for kc in range(_ceil_div(st.k, c.rows)):
            idx = np.arange(kc * c.rows, (kc + 1) * c.rows)
            passes.append(_Pass(np.where(idx < st.k, idx, -1), kc * images + i))
        return _Layout(images, 1, passes, np.stack([zeros, zeros, i], axis=1), out_width,
                       col_blocks)
    if st.kind == "dense":
        groups, positions, _, _, channels = prev_out
        if positions * channels != st.k:
            raise CompileError(f"{where}: takes {st.k} features, the previous stage gives "
                               f"{positions} x {channels}")
        passes = []
        for pos in range(positions):
            for g in range(groups):
                ch = g * width_in + np.arange(c.rows)
                valid = (ch < channels) & (np.arange(c.rows) < width_in)
                passes.append(_Pass(np.where(valid, pos * channels + ch, -1),
                                     (g * positions + pos) * images + i))
        return _Layout(images, 1, passes, np.stack([zeros, zeros, i], axis=1), out_width,
                       col_blocks)

    ho, wo = st.conv_out_hw
    if st.pool and (ho < 2 or wo < 2):
        raise CompileError(f"{where}: max-pooling needs a 2x2 output, got {ho}x{wo}")
    if index == 0:
        return _host_conv_layout(config, st, images, out_width, col_blocks, shifts)
    kh, kw, cin, _ = st.weight.shape
    groups, positions, pitch, frame, _ = prev_out
    if frame != tuple(st.pad):
        raise CompileError(f"{where}: its input is framed by {frame}, it pads by {st.pad}")
    if stride == 1 and not st.pool:
        # The rows that wrap around the frame's edge are computed and not activated, so
        # each pass is one run: accumulator row (q * images + image) reads input position
        # q + (dy * pitch + dx).
        q, ii = np.meshgrid(np.arange((ho - 1) * pitch + wo), i, indexing="ij")
        y, x = q // pitch, q % pitch
        outputs = np.stack([np.where(x < wo, y, -1).ravel(), x.ravel(), ii.ravel()], axis=1)
        m = len(outputs)
        window = 1

        def sources(g, dy, dx):
            return (g * positions + dy * pitch + dx) * images + np.arange(m)
    else:
        if st.pool:
            # One pooling window's four positions in consecutive rows (MAX4).
            wy, wx, ii, ky, kx = np.meshgrid(np.arange(ho // 2), np.arange(wo // 2), i,
                                             np.arange(2), np.arange(2), indexing="ij")
            oy, ox, ii = (2 * wy + ky).ravel(), (2 * wx + kx).ravel(), ii.ravel()
            outputs = np.stack([wy.ravel()[::4], wx.ravel()[::4], ii[::4]], axis=1)
            window = 4
        else:
            yy, xx, ii = np.meshgrid(np.arange(ho), np.arange(wo), i, indexing="ij")
            oy, ox, ii = yy.ravel(), xx.ravel(), ii.ravel()
            outputs = np.stack([oy, ox, ii], axis=1)
            window = 1
        m = len(oy)

        def sources(g, dy, dx):
            pos = (stride * oy + dy) * pitch + stride * ox + dx
            return (g * positions + pos) * images + ii
    passes = []
    for dy in range(kh):
        for dx in range(kw):
            for g in range(groups):
                ch = g * width_in + np.arange(c.rows)
                valid = (ch < cin) & (np.arange(c.rows) < width_in)
                passes.append(_Pass(np.where(valid, (dy * kw + dx) * cin + ch, -1),
                                    np.asarray(sources(g, dy, dx), dtype=np.int64)))
    return _Layout(m, window, passes, outputs, out_width, col_blocks)


def _host_conv_layout(config: TPUConfig, st: Stage, unit: int, out_width: int,
                      col_blocks: int, shifts: bool = True) -> _Layout:
    """A first convolution: the host's rows carry as many kernel taps as fit; the taps no
    row holds come from shifted passes or, failing that, from another chunk of rows."""
    c = config
    kh, kw, cin, _ = st.weight.shape
    ho, wo = st.conv_out_hw
    stride = st.stride
    taps = [(dy, dx) for dy in range(kh) for dx in range(kw)]
    tap_index = {t: n for n, t in enumerate(taps)}
    groups = _ceil_div(cin, c.rows)
    items = [(t, g) for t in range(len(taps)) for g in range(groups)]

    def width(g):
        return min(c.rows, cin - g * c.rows)

    chunks: list[list[tuple[int, int, int, int]]] = []
    passes_spec: list[tuple[int, tuple[int, int], dict]] = []   # chunk, shift, item -> target
    covered: set = set()
    step = 2 if st.pool else 1                # shifts in anchors; whole windows when pooling
    ext = [0, 0]

    def new_chunk():
        row, offset = [], 0
        for t, g in items:
            if (t, g) in covered or offset + width(g) > c.rows:
                continue
            row.append((t, g, offset, width(g)))
            offset += width(g)
        chunks.append(row)
        cover = {(t, g): (t, g) for t, g, _, _ in row}
        passes_spec.append((len(chunks) - 1, (0, 0), cover))
        covered.update(cover)

    new_chunk()
    while len(covered) < len(items):
        if not shifts:                       # every tap in a row of its own chunk (im2col)
            new_chunk()
            continue
        best = None
        for ci, row in enumerate(chunks):
            for t1, g1, _, _ in row:
                for t2, g2 in items:
                    if (t2, g2) in covered or g2 != g1:
                        continue
                    dy = taps[t2][0] - taps[t1][0]
                    dx = taps[t2][1] - taps[t1][1]
                    if dy < 0 or dx < 0 or dy % stride or dx % stride:
                        continue
                    a, b = dy // stride, dx // stride
                    if a % step or b % step:
                        continue
                    cover = {}
                    for t3, g3, _, _ in row:
                        t = (taps[t3][0] + a * stride, taps[t3][1] + b * stride)
                        if t in tap_index and (tap_index[t], g3) not in covered:
                            cover[(t3, g3)] = (tap_index[t], g3)
                    # More taps first, then the fewest anchors added past the edge.
                    cost = (max(ext[0], a) - ext[0]) * wo + (max(ext[1], b) - ext[1]) * ho
                    key = (-len(cover), cost)
                    if best is None or key < best[0]:
                        best = (key, ci, (a, b), cover)
        if best is None or best[0][1] >= ho * wo:    # another chunk of rows is cheaper
            new_chunk()
            continue
        _, ci, (a, b), cover = best
        passes_spec.append((ci, (a, b), cover))
        covered.update(cover.values())
        ext = [max(ext[0], a), max(ext[1], b)]
    ah, aw = ho + ext[0], wo + ext[1]
    i = np.arange(unit)
    if st.pool:
        hq, wq = ho // 2, wo // 2
        wh, ww = _ceil_div(ah, 2), _ceil_div(aw, 2)
        wy, wx, ii, ky, kx = np.meshgrid(np.arange(wh), np.arange(ww), i, np.arange(2),
                                         np.arange(2), indexing="ij")
        ay, ax, ii = (2 * wy + ky).ravel(), (2 * wx + kx).ravel(), ii.ravel()
        m = ((hq - 1) * ww + wq) * 4 * unit
        oyy, oxx, oii = wy.ravel()[::4], wx.ravel()[::4], ii[::4]
        valid = (oyy < hq) & (oxx < wq)
        outputs = np.stack([np.where(valid, oyy, -1), oxx, oii], axis=1)[:m // 4]

        def shift_rows(a, b):
            return ((a // 2) * ww + b // 2) * 4 * unit
    else:
        yy, xx, ii = np.meshgrid(np.arange(ah), np.arange(aw), i, indexing="ij")
        ay, ax, ii = yy.ravel(), xx.ravel(), ii.ravel()
        m = ((ho - 1) * aw + wo) * unit
        valid = (ay < ho) & (ax < wo)
        outputs = np.stack([np.where(valid, ay, -1), ax, ii], axis=1)[:m]

        def shift_rows(a, b):
            return (a * aw + b) * unit
    per_chunk = len(ay)
    passes = []
    for ci, (a, b), cover in passes_spec:
        k_rows = np.full(c.rows, -1, dtype=np.int64)
        for t1, g1, offset, w in chunks[ci]:
            if (t1, g1) in cover:
                t3, g3 = cover[(t1, g1)]
                k_rows[offset:offset + w] = t3 * cin + g3 * c.rows + np.arange(w)
        src = ci * per_chunk + np.arange(m) + shift_rows(a, b)
        passes.append(_Pass(k_rows, src))
    host = _HostConv(chunks, np.stack([ay, ax, ii], axis=1))
    return _Layout(m, 4 if st.pool else 1, passes, outputs, out_width, col_blocks, host)


def _stage_table(config: TPUConfig, network: QuantisedNetwork) -> np.ndarray | None:
    """The one table the network's TABLE stages look up: the core has one."""
    tables = [(st.name, np.asarray(st.table, dtype=np.int64)) for st in network.stages
              if st.func == isa.Func.TABLE]
    if not tables:
        return None
    name, table = tables[0]
    if not config.lookup_table:
        raise CompileError(f"{name}: its function is a table, and the {config.name} core has "
                           f"no programmable table (TPUConfig.lookup_table)")
    for other, t in tables[1:]:
        if not np.array_equal(t, table):
            raise CompileError(f"{other}: a second table in {network.name} (after {name}'s); "
                               f"the core holds one, so a network's stages share it")
    if table.shape != (isa.TABLE_ENTRIES,):
        raise CompileError(f"{name}: its table has {table.size} entries; allowed: "
                           f"{isa.TABLE_ENTRIES}")
    return table


def _weight_tiles(config: TPUConfig, network: QuantisedNetwork, layouts: list[_Layout]):
    """Every weight tile and parameter set; tile ids ``[stage][pass][column block]`` and
    parameter-set ids ``[stage][column block]``."""
    c = config
    tiles, params, tile_ids, param_ids = [], [], [], []
    for st, lay in zip(network.stages, layouts, strict=True):
        w = st.weight_matrix
        ids = [[0] * lay.col_blocks for _ in lay.passes]
        pids = []
        for nb in range(lay.col_blocks):
            cols = nb * lay.out_width + np.arange(c.cols)
            col_ok = (np.arange(c.cols) < lay.out_width) & (cols < st.n)
            for kc, ps in enumerate(lay.passes):
                tile = np.zeros((c.rows, c.cols), dtype=np.int64)
                r_ok = ps.k_rows >= 0
                tile[np.ix_(r_ok, col_ok)] = w[np.ix_(ps.k_rows[r_ok], cols[col_ok])]
                ids[kc][nb] = len(tiles)
                tiles.append(tile)
            bias = np.zeros(c.cols, dtype=np.int64)
            mult = np.zeros(c.cols, dtype=np.int64)
            bias[col_ok] = st.bias[cols[col_ok]]
            mult[col_ok] = st.multiplier[cols[col_ok]]
            shift = st.shift
            if np.ndim(shift):                   # per column: sliced like the bias
                shift = np.zeros(c.cols, dtype=np.int64)
                shift[col_ok] = np.asarray(st.shift)[cols[col_ok]]
            pids.append(len(params))
            params.append((bias, mult, shift, st.zero_point, st.clamp_hi, st.rounding))
        tile_ids.append(ids)
        param_ids.append(pids)
    return np.array(tiles).reshape(-1, c.rows, c.cols), params, tile_ids, param_ids


# Planning ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _StagePlan:
    stage: Stage
    index: int
    layout: _Layout
    inputs: int | None              # first stage: the input ring's size (it starts at row 0)
    source: Tensor | None           # later stages: the tensor read
    outs: list[Tensor]              # the output tensor (two buffers for the last stage)
    tiles: list[list[int]]
    params: list[int]


@dataclass(frozen=True)
class _Plan:
    unit: int
    units: int
    stages: list[_StagePlan]
    in_rows: int                    # rows of one unit of the network input
    ring: int                       # rows of the input ring
    layouts: list                   # every stage's _Layout
    spare: bool                     # the first stage's output has a block to spare

    @property
    def batch(self) -> int:
        return self.unit * self.units


def _layouts(config: TPUConfig, network: QuantisedNetwork, unit: int,
             shifts: bool = True) -> list[_Layout]:
    """Every stage's layout over one unit (``shifts``: a first convolution's taps that its
    rows do not hold come from shifted passes, else from more rows)."""
    layouts = []
    stages = network.stages
    width_in = config.rows
    prev = None
    for index, st in enumerate(stages):
        last = index == len(stages) - 1
        lay = _stage_layout(config, st, index, unit, width_in, prev, last, shifts)
        layouts.append(lay)
        frame = _frame(stages, index)
        h, w = st.out_shape[:2] if len(st.out_shape) == 3 else (1, 1)
        pitch = w + 2 * frame[1]
        prev = (lay.col_blocks, (h + 2 * frame[0]) * pitch, pitch, frame, st.n)
        width_in = lay.out_width
    return layouts


def _frame(stages: list[Stage], index: int) -> tuple[int, int]:
    """The frame around stage ``index``'s output: the padding of a convolution reading it."""
    nxt = stages[index + 1] if index + 1 < len(stages) else None
    return tuple(nxt.pad) if nxt is not None and nxt.kind == "conv" else (0, 0)


def _plan(config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
          tile_ids=None, param_ids=None, ring: float = 2.0) -> _Plan:
    """The plan for ``unit`` images a unit and ``units`` a batch; the input ring holds
    ``ring`` units' rows (2: two buffers; less when later units may take the rows of the
    earlier passes of the unit being computed). A first convolution whose shifted passes
    make its input too large for the unified buffer gets a row per kernel tap group
    instead (the host's patches)."""
    first_error = None
    for shifts in (True, False) if network.stages[0].kind == "conv" else (True,):
        for spare in (True, False) if len(network.stages) > 1 else (False,):
            try:
                return _plan_with(config, network, unit, units, ring, shifts, spare)
            except CompileError as error:
                first_error = first_error or error
    raise first_error


def _plan_with(config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
               ring: float, shifts: bool, spare: bool) -> _Plan:
    c = config
    batch = unit * units
    layouts = _layouts(config, network, unit, shifts)
    tile_ids, param_ids, t, p = [], [], 0, 0          # the ids alone (the tiles' order)
    for lay in layouts:
        tile_ids.append([[t + nb * len(lay.passes) + kc for nb in range(lay.col_blocks)]
                         for kc in range(len(lay.passes))])
        param_ids.append(list(range(p, p + lay.col_blocks)))
        t += len(lay.passes) * lay.col_blocks
        p += lay.col_blocks
    stages = network.stages
    first = layouts[0]
    in_rows = (len(first.host.chunks) * len(first.host.anchors) if first.host is not None
               else len(first.passes) * unit)
    ring_rows = max(in_rows, int(np.ceil(ring * in_rows)))
    top = ring_rows                                # the input ring at the bottom
    tensors = []
    for index, (st, lay) in enumerate(zip(stages, layouts, strict=True)):
        last = index == len(stages) - 1
        frame = _frame(stages, index)
        h, w = st.out_shape[:2] if len(st.out_shape) == 3 else (1, 1)
        pitch = w + 2 * frame[1]
        positions = (h + 2 * frame[0]) * pitch
        outs = []
        # The first stage's output is a ring of one block more than a batch (when it
        # fits), so that the next batch's first unit can run before the later stages
        # read this batch's.
        blocks = units + 1 if index == 0 and spare else units
        for _ in range(2 if last else 1):
            t = Tensor(top, lay.col_blocks, positions, unit, blocks, lay.out_width, st.n, h,
                       pitch, frame)
            top += t.rows
            outs.append(t)
        tensors.append(outs)
        if top > c.ub_depth:
            raise CompileError(
                f"stage {st.name}: the unified buffer needs {top} rows up to its output "
                f"({ring_rows} for the input, {in_rows} rows for {unit} image(s) at a time, "
                f"the stage outputs for {batch}); the configuration has ub_depth="
                f"{c.ub_depth}")
    plans = []
    for index, (st, lay) in enumerate(zip(stages, layouts, strict=True)):
        step = min(c.acc_depth // 2, COUNT_LIMIT) // lay.window * lay.window
        if step < lay.window:
            raise CompileError(f"stage {st.name}: a pooling window of {lay.window} rows does "
                               f"not fit half the accumulators (acc_depth={c.acc_depth})")
        plans.append(_StagePlan(st, index, lay, ring_rows if index == 0 else None,
                                tensors[index - 1][0] if index else None, tensors[index],
                                tile_ids[index], param_ids[index]))
    return _Plan(unit, units, plans, in_rows, ring_rows, layouts, spare)


def _runs(sources: np.ndarray, ub_depth: int) -> list[tuple[int, int, int]]:
    """``(first accumulator row, first unified-buffer row, rows)`` of the MATMULs that read
    ``sources`` (one per accumulator row, -1: any row): runs of consecutive rows, through the
    rows that may read anything, without the ones at a run's ends."""
    n = len(sources)
    if n and sources[0] >= 0 and sources[-1] - sources[0] == n - 1 and (
            n < 2 or (np.diff(sources) == 1).all()):
        runs = [(0, int(sources[0]), n)]         # the common case: one run
        i = n
    else:
        runs = []
        i = 0
    while i < n:
        if sources[i] < 0:
            i += 1
            continue
        # Rows that continue the run: the expected row, or any row (-1) still in range.
        want = sources[i] + np.arange(n - i)
        ok = (sources[i:] == want) | ((sources[i:] < 0) & (want < ub_depth))
        stop = i + (int(np.argmin(ok)) if not ok.all() else n - i)
        real = np.flatnonzero(sources[i:stop] >= 0)
        last = i + int(real[-1])
        runs.append((i, int(sources[i]), last - i + 1))
        i = last + 1
    out = []
    for acc, ub, rows in runs:          # the count field's limit
        for start in range(0, rows, COUNT_LIMIT):
            out.append((acc + start, ub + start, min(COUNT_LIMIT, rows - start)))
    return out


def _jobs(sp: _StagePlan, units: int, config: TPUConfig) -> list[tuple[int, int]]:
    """``(first accumulator row, rows)`` of a stage's jobs over ``units`` units."""
    total = sp.layout.m * units
    # A quarter of the accumulators: two jobs of a stage (one accumulating, one waiting for
    # or in its ACTIVATE) leave half of them to the later stages' jobs interleaved between,
    # so that those never wait for an ACTIVATE to free their rows.
    step = max(min(config.acc_depth // 4, COUNT_LIMIT) // sp.layout.window, 1) * \
        sp.layout.window
    return [(m0, min(step, total - m0)) for m0 in range(0, total, step)]


# The compiled network ---------------------------------------------------------------------

class CompiledNetwork:
    """A network compiled for one configuration; implements the runtime's executable
    protocol (:meth:`setup_program`, :meth:`batches`).

    Attributes
    ----------
    config : TPUConfig
    network : QuantisedNetwork
    unit, units : int
        Images per unit (the first stage's step) and units per batch.
    batch_size : int
        Images per batch (``unit * units``); a batch program holds several batches.
    program_images : int
        Most images per batch program.
    resident_weights, resident_params : bool
        Whether weights / parameters are loaded once by the setup program.
    tiles : ndarray, (n_tiles, rows, cols)
        Every weight tile, in tile-id order.
    """

    def __init__(self, config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
                 program_images: int = PROGRAM_IMAGES, ring: float = 2.0):
        self.config = config
        self.network = network
        self.unit, self.units = unit, units
        self.batch_size = unit * units
        self.program_images = max(program_images, self.batch_size)
        self._plan = _plan(config, network, unit, units, ring=ring)
        self.tiles, self._params, _, _ = _weight_tiles(config, network, self._plan.layouts)
        self.resident_weights = len(self.tiles) <= config.weight_mem_tiles
        self.resident_params = len(self._params) <= config.param_slots
        #: The programmable table the stages with function TABLE share (LOAD_TABLE in the
        #: setup program), or None.
        self.table = _stage_table(config, network)

    # Setup ------------------------------------------------------------------------------

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_WEIGHTS and LOAD_PARAMS of what stays resident and the frames of padded
        tensors, then HALT; answers with the DONE beat only."""
        c = self.config
        p = Program(c)
        if self.resident_weights and len(self.tiles):
            p.load_weights(0, self.tiles, signed=True)
        if self.resident_params:
            for slot, (bias, mult, shift, zp, clamp, rounding) in enumerate(self._params):
                p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                              rounding=rounding)
        if self.table is not None:
            p.load_table(self.table.tolist())
        for sp in self._plan.stages:
            zero = np.full(c.ub_row, sp.stage.out_q.zero_point, dtype=np.int64)
            for t in sp.outs:
                for start, count in _row_runs(t.border()):
                    for s in range(0, count, COUNT_LIMIT):
                        n = min(COUNT_LIMIT, count - s)
                        p.read_host(start + s, np.broadcast_to(zero, (n, c.ub_row)))
        p.halt()
        return p.beats, 1

    # Programs ---------------------------------------------------------------------------

    def batches(self, inputs: np.ndarray) -> Iterator[Batch]:
        """Batch programs for quantised ``inputs`` (``(n, *input_shape)``, integers)."""
        inputs = np.asarray(inputs)
        if inputs.dtype.kind not in "iub":
            nonfinite = inputs.dtype.kind in "fc" and not np.isfinite(inputs).all()
            lo, hi = self.network.input_q.range
            raise ValueError(
                f"inputs are {inputs.dtype}{' with NaN or infinity' if nonfinite else ''}; "
                f"batches take quantised integers in {lo}..{hi} (quantise float inputs with "
                f"the network's quantise_input first)")
        inputs = inputs.astype(np.int64)
        if inputs.shape[1:] != self.network.input_shape:
            raise ValueError(f"inputs have shape {inputs.shape[1:]} per item, the network "
                             f"takes {self.network.input_shape}")
        lo, hi = self.network.input_q.range
        if inputs.size and (inputs.min() < lo or inputs.max() > hi):
            raise ValueError(f"quantised inputs must lie in {lo}..{hi}")
        step = self.program_images // self.batch_size * self.batch_size
        for start in range(0, len(inputs), step):
            yield self.batch_program(inputs[start:start + step])

    def batch_program(self, x_q: np.ndarray) -> Batch:
        """The program for quantised inputs ``x_q`` (any number of images: the last batch's
        missing images are computed from whatever the buffers hold, and dropped)."""
        n = len(x_q)
        em = _Emitter(self, x_q)
        beats, instructions = em.emit()
        out_rows = em.out_rows

        def decode(out: list[int]) -> np.ndarray:
            return self._decode(out[:out_rows], n)

        return Batch(beats=beats, output_beats=out_rows + 1, instructions=instructions,
                     images=n, decode=decode)

    def _decode(self, beats: list[int], n: int) -> np.ndarray:
        last = self._plan.stages[-1]
        out, st = last.outs[0], last.stage
        row_bytes = self.config.ub_row
        # The last batch's write-back ends at its last image's row: the rest are zeros.
        beats = list(beats) + [0] * (-len(beats) % out.block)
        raw = np.frombuffer(b"".join(int(x).to_bytes(row_bytes, "little") for x in beats),
                            dtype=np.int8)
        raw = raw.reshape(-1, out.groups, out.positions, out.unit, row_bytes)
        values = raw[..., :out.width].astype(np.int64)     # (blocks, G, P, unit, g)
        if not st.out_q.signed:
            values &= 0xff                                  # uint8 (a table's bytes)
        values = values.transpose(0, 3, 2, 1, 4).reshape(-1, out.positions,
                                                         out.groups * out.width)
        return values[:n, :, :st.n].reshape(n, *st.out_shape)

    # Host rows --------------------------------------------------------------------------

    def _unit_rows(self, x_q: np.ndarray) -> np.ndarray:
        """The network input of one unit (``(<= unit, *input_shape)``) as unified-buffer
        rows, ``rows`` wide (missing images: the input's zero point)."""
        c = self.config
        sp = self._plan.stages[0]
        st, lay = sp.stage, sp.layout
        unit = self.unit
        zp = st.in_q.zero_point
        x = np.full((unit, *self.network.input_shape), zp, dtype=np.int64)
        x[:len(x_q)] = x_q
        if lay.host is None:
            flat = x.reshape(unit, -1)
            return np.concatenate([flat[:, ps.k_rows.clip(0)] * (ps.k_rows >= 0)
                                   for ps in lay.passes]).astype(np.int64)
        kh, kw, cin, _ = st.weight.shape
        ay, ax, ii = lay.host.anchors.T
        py, px = st.pad
        # The padded input, extended with the zero point past the anchors' reach.
        hpad = max(int(ay.max()) * st.stride + kh, x.shape[1] + 2 * py)
        wpad = max(int(ax.max()) * st.stride + kw, x.shape[2] + 2 * px)
        xp = np.full((unit, hpad, wpad, cin), zp, dtype=np.int64)
        xp[:, py:py + x.shape[1], px:px + x.shape[2]] = x
        out = np.zeros((len(lay.host.chunks), len(ay), c.rows), dtype=np.int64)
        taps = [(dy, dx) for dy in range(kh) for dx in range(kw)]
        for ci, row in enumerate(lay.host.chunks):
            for t, g, offset, w in row:
                dy, dx = taps[t]
                out[ci, :, offset:offset + w] = xp[ii, ay * st.stride + dy,
                                                   ax * st.stride + dx,
                                                   g * c.rows:g * c.rows + w]
        return out.reshape(-1, c.rows)

    # Reporting --------------------------------------------------------------------------

    def _trial_program(self, batches: int) -> _Emitter:
        """The emitter after a program of ``batches`` full batches, encoding nothing."""
        em = _Emitter(self, np.zeros((batches * self.batch_size, *self.network.input_shape),
                                     dtype=np.int64), estimate=True)
        em.emit()
        return em

    @functools.cached_property
    def _trial(self) -> _Emitter:
        """A program of three batches: the third is the first to meet a batch before it
        and a batch after it, as every batch of a long program does."""
        return self._trial_program(TRIAL_BATCHES)

    def estimate(self) -> float:
        """Predicted cycles per image in a long program, from the emitter's cycle model of
        the core (:class:`_Timing`): what a third batch adds to a program of two (the
        first batch's start and the last one's drain come once a program, and a second
        batch can still run in the first one's shadow, faster than the steady state)."""
        before = self._trial_program(TRIAL_BATCHES - 1).timing.total()
        return (self._trial.timing.total() - before) / self.batch_size

    def profile(self, device, x_q: np.ndarray) -> list[dict]:
        """Load the resident state and run one batch of ``x_q`` (its first ``batch_size``
        images) stage by stage on ``device`` (each stage waits for the one before, the
        counters read after each) and return per stage: its name, cycles, array-active
        cycles, useful MACs, measured utilisation (useful MACs over cycles x array cells)
        and shape bound. The normal programs overlap the stages, so only this one can tell
        them apart."""
        from firmware.runtime import decode_counters, run_program

        x_q = np.asarray(x_q, dtype=np.int64)[:self.batch_size]
        setup, setup_out = self.setup_program()
        run_program(device, setup, setup_out)
        em = _Emitter(self, x_q, profile=True)
        beats, instructions = em.emit()
        per = len(isa.COUNTERS)
        stages = self._plan.stages
        out = run_program(device, beats, per * len(stages) + em.out_rows + 1,
                          instructions=instructions)
        cells = self.config.rows * self.config.cols
        rows = []
        before = {"cycles": 0, "array_active": 0}
        for k, (sp, bound) in enumerate(zip(stages, self.bounds(), strict=True)):
            now = decode_counters(out[k * per:(k + 1) * per])
            cycles = None if now["cycles"] is None else now["cycles"] - before["cycles"]
            useful = bound.useful_macs * len(x_q)
            rows.append({"name": sp.stage.name, "useful_macs": useful, "cycles": cycles,
                         "array_active": now["array_active"] - before["array_active"],
                         "utilisation": useful / (cycles * cells) if cycles else None,
                         "bound": bound.bound})
            before = now
        return rows

    def matmul_rows(self, images: int) -> int:
        """Rows the MATMULs of the batch programs for ``images`` images stream (what the
        core's ``array_active`` counter counts for them)."""
        rows = 0
        for start in range(0, images, self.program_images // self.batch_size *
                           self.batch_size):
            n = min(images - start, self.program_images)
            em = _Emitter(self, np.zeros((n, *self.network.input_shape), dtype=np.int64),
                          estimate=True)
            em.emit()
            rows += sum(em.stage_rows)
        return rows

    def bounds(self) -> list[StageBound]:
        """Each stage's shape bound, per image (module notes)."""
        cells = self.config.rows * self.config.cols
        out = []
        for sp, rows in zip(self._plan.stages, self._trial.stage_rows, strict=True):
            st = sp.stage
            if st.kind == "conv":
                ho, wo = st.conv_out_hw
                positions = 4 * (ho // 2) * (wo // 2) if st.pool else ho * wo
            else:
                positions = 1
            out.append(StageBound(st.name, float(positions * st.k * st.n),
                                  rows * cells / (TRIAL_BATCHES * self.batch_size)))
        return out

    def bound(self) -> float:
        """The whole network's shape bound."""
        b = self.bounds()
        return sum(s.useful_macs for s in b) / sum(s.slots for s in b)

    def useful_macs(self) -> int:
        """The network's multiply-accumulates per image."""
        return int(sum(s.useful_macs for s in self.bounds()))

    def input_rows(self) -> float:
        """Unified-buffer rows the host sends per image."""
        return self._plan.in_rows / self.unit

    def summary(self) -> str:
        """A few lines on the plan: stages, passes, batch, residency, shape bounds."""
        c = self.config
        plan = self._plan
        lines = [f"{self.network.name} on {c.name}: {self.batch_size} images per batch "
                 f"({self.units} units of {self.unit}), {len(self.tiles)} weight tiles "
                 f"({'resident' if self.resident_weights else 'streamed per batch'}), "
                 f"{len(self._params)} parameter sets "
                 f"({'resident' if self.resident_params else 'loaded per ACTIVATE'}), "
                 f"{self.input_rows():g} input rows per image"]
        for sp, b in zip(plan.stages, self.bounds(), strict=True):
            st, lay = sp.stage, sp.layout
            extra = " + maxpool 2x2" if st.pool else ""
            if st.kind == "conv" and st.stride > 1:
                extra += f", stride {st.stride}"
            lines.append(f"  {st.name}: {st.kind} K={st.k} N={st.n}{extra} -> "
                         f"{len(lay.passes)} passes x {lay.col_blocks} column blocks, "
                         f"{st.func.name}; shape bound {100 * b.bound:.1f} % "
                         f"({b.useful_macs:,.0f} MACs in {b.slots:,.0f} slots per image)")
        lines.append(f"  network shape bound {100 * self.bound():.1f} %")
        return "\n".join(lines)


def _row_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Sorted rows as (first, count) runs of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][0] + runs[-1][1] == r:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((int(r), 1))
    return runs


class _Emitter:
    """Writes one batch program. Order: the first stage unit by unit; the later stages of
    batch ``b`` once batch ``b + 1``'s first unit is out (so that its MATMULs fill the array
    while batch ``b``'s last ACTIVATE drains); the host's rows of the next unit fed in pieces
    between the MATMULs. With ``estimate``, tallies without encoding (no real input)."""

    def __init__(self, compiled: CompiledNetwork, x_q: np.ndarray, estimate: bool = False,
                 profile: bool = False):
        self.cn = compiled
        self.profile = profile
        self.c = compiled.config
        self.plan = compiled._plan
        self.x_q = x_q
        self.batches = max(1, _ceil_div(len(x_q), compiled.batch_size))
        self.out_rows = sum(self._write_rows(b) for b in range(self.batches))
        self.estimate = estimate
        self.timing = _Timing(self.c)
        self.p = _Timed(_Tally() if estimate else Program(self.c), self.timing)
        self.uses: list[int] = []          # weight tiles in the order the MATMULs use them
        self.queued = 0                     # tiles READ_WEIGHTS has queued
        self.used = 0                       # tiles MATMULs have switched to
        self.jobs_done = 0
        self.acc_next = 0                   # next free accumulator row
        self.feed: deque = deque()          # (ub row, rows) pieces of the next unit's input
        # ACTIVATEs not yet sent, oldest first: (job, its output rows [lo, hi), the input
        # rows its MATMULs read)
        self.pending: list = []
        self.pending_write = None
        slots = self.c.param_slots
        self.slots: list = [None] * slots   # parameter set in each slot (streamed params)
        self.slot_used = [-1] * slots
        self.stage_rows = [0] * len(self.plan.stages)    # rows each stage's MATMULs stream
        # (unit, first, end) of input rows that MATMULs sent or still to come read
        self.ring_live: list[tuple[int, int, int]] = []

    # Where things are -------------------------------------------------------------------

    def _ring(self, b: int, u: int) -> int:
        """Block of the first stage's output that unit ``u`` of batch ``b`` uses."""
        return (b * self.plan.units + u) % self.plan.stages[0].outs[0].units

    def _src_base(self, sp: _StagePlan, b: int, u: np.ndarray) -> np.ndarray:
        """Where each of a job's rows' input starts (later stages)."""
        block = self._ring(b, u) if sp.index == 1 else u
        return sp.source.base + block * sp.source.block

    def _ring_offset(self, g: int) -> int:
        """Row of the input ring where unit ``g`` of the program starts."""
        return g * self.plan.in_rows % self.plan.ring

    def _dst(self, sp: _StagePlan, b: int, u: np.ndarray) -> tuple[Tensor, np.ndarray]:
        last = sp.index == len(self.plan.stages) - 1
        out = sp.outs[b % 2] if last else sp.outs[0]
        return out, (self._ring(b, u) if sp.index == 0 and not last else u)

    # Host input -------------------------------------------------------------------------

    def _queue_unit(self, n: int) -> None:
        """Queue the host's rows of unit ``n`` of the program into the input ring."""
        unit = self.cn.unit
        images = self.x_q[n * unit:(n + 1) * unit]
        if not len(images):
            return                           # a batch's missing images: nothing to send
        rows = (np.zeros((self.plan.in_rows, 0)) if self.estimate
                else self.cn._unit_rows(images))
        ring, off = self.plan.ring, self._ring_offset(n)
        k = 0
        while k < len(rows):
            pos = (off + k) % ring
            take = min(len(rows) - k, ring - pos, COUNT_LIMIT)
            self.feed.append((n, k, pos, rows[k:k + take]))
            k += take

    def _send(self, piece, take: int) -> None:
        n, k, ub, rows = piece
        self.p.read_host(ub, rows[:take])
        if take < len(rows):
            self.feed.appendleft((n, k + take, ub + take, rows[take:]))

    def _live(self, lo: int, hi: int, before: int | None = None) -> int:
        """Rows from ``lo`` (before ``hi``) that no MATMUL still to come reads (of units
        before ``before`` only, if given), nor, in the cycle model, one already sent that
        is still reading them (the front end would wait for it)."""
        free = self.timing.free_rows(lo, hi - lo)
        for g, a, b in self.ring_live:
            if a < hi and lo < b and (before is None or g < before):
                free = min(free, max(0, a - lo))
        return free

    def _feed(self, budget: int) -> int:
        """READ_HOST up to ``budget`` queued rows, stopping before a row that a first-stage
        MATMUL still to come or still running reads; returns the rows sent."""
        sent = 0
        while self.feed and budget > sent:
            piece = self.feed.popleft()
            g, _, ub, rows = piece
            take = min(budget - sent, len(rows), self._live(ub, ub + len(rows), g))
            if take <= 0:
                self.feed.appendleft(piece)
                break
            self._send(piece, take)
            sent += take
        return sent

    def _feed_for(self, g: int, k_end: int) -> None:
        """READ_HOST every queued row of unit ``g`` before its row ``k_end`` (and what is
        left of earlier units): a MATMUL is about to read them."""
        while self.feed and (self.feed[0][0] < g or
                             (self.feed[0][0] == g and self.feed[0][1] < k_end)):
            piece = self.feed.popleft()
            n, k, ub, rows = piece
            take = len(rows) if n < g else min(len(rows), k_end - k)
            self._send(piece, take)

    def _feed_all(self) -> None:
        while self.feed:
            piece = self.feed.popleft()
            self._send(piece, len(piece[3]))

    # Weights ----------------------------------------------------------------------------

    def _read_next(self, used: int) -> None:
        """Keep the weight FIFO and the shadow tile ahead of the MATMULs: ``used`` tiles
        have been switched to. Queues in groups of consecutive resident tiles (one
        READ_WEIGHTS each), at least two at a time while more follow, since every
        instruction costs the front end a dispatch."""
        room = self.c.weight_fifo_depth + 1 - (self.queued - used)
        left = len(self.uses) - self.queued
        if room <= 0 or left <= 0 or (room < 2 and left > 1 and self.queued > used):
            return
        while room > 0 and self.queued < len(self.uses):
            tile = self.uses[self.queued]
            if not self.cn.resident_weights:
                slot = self.queued % self.c.weight_mem_tiles
                self.p.load_weights(slot, self.cn.tiles[tile], signed=True)
                self.p.read_weights(slot, 1)
                self.queued += 1
                room -= 1
                continue
            count = 1
            while (count < room and self.queued + count < len(self.uses)
                   and self.uses[self.queued + count] == tile + count):
                count += 1
            self.p.read_weights(tile, count)
            self.queued += count
            room -= count

    # Jobs -------------------------------------------------------------------------------

    def _activate(self, pending) -> None:
        sp, m0, rows, nb, region, b, u0 = pending
        c, lay = self.c, sp.layout
        pid = sp.params[nb]
        if self.cn.resident_params:
            slot = pid
        elif pid in self.slots:
            slot = self.slots.index(pid)         # still loaded
        else:
            # The slot used longest ago (LOAD_PARAMS waits for a running ACTIVATE, and every
            # earlier ACTIVATE has been issued, so no ACTIVATE still to come needs it).
            slot = min(range(c.param_slots), key=lambda k: self.slot_used[k])
            self.slots[slot] = pid
            bias, mult, shift, zp, clamp, rounding = self.cn._params[pid]
            self.p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                               rounding=rounding)
        self.slot_used[slot] = self.jobs_done
        pool = isa.Pool.MAX4 if lay.window == 4 else isa.Pool.NONE
        w = lay.window
        u, r = np.divmod(m0 + np.arange(0, rows, w), lay.m)
        y, x, i = lay.outputs[r // w].T
        out, block = self._dst(sp, b, u0 + u)
        target = np.where(y >= 0, out.row(nb, out.position(np.maximum(y, 0), x), i, block),
                          -1)
        # Rows of the images a last batch does not have need no ACTIVATE: a run's tail of
        # them is left out (a run is never split, which would add ACTIVATEs).
        present = (u0 + u) * self.plan.unit + i < len(self.x_q) - b * self.plan.batch
        limit = COUNT_LIMIT // w * w
        k = 0
        while k < len(target):
            if target[k] < 0:
                k += 1
                continue
            j = k + 1
            while j < len(target) and target[j] == target[j - 1] + 1:
                j += 1
            end = j
            while end > k and not present[end - 1]:
                end -= 1
            count = (end - k) * w
            for s in range(0, count, limit):
                self.p.activate(region + k * w + s, int(target[k]) + s // w,
                                min(limit, count - s), func=sp.stage.func, pool=pool,
                                slot=slot)
            k = j
        self.jobs_done += 1

    def _targets_range(self, pending) -> tuple[int, int]:
        """The unified-buffer rows a pending ACTIVATE writes, as [lo, hi)."""
        sp, m0, rows, nb, region, b, u0 = pending
        lay = sp.layout
        u, r = np.divmod(m0 + np.arange(0, rows, lay.window), lay.m)
        y, x, i = lay.outputs[r // lay.window].T
        out, block = self._dst(sp, b, u0 + u)
        t = out.row(nb, out.position(np.maximum(y, 0), x), i, block)[y >= 0]
        return (int(t.min()), int(t.max()) + 1) if len(t) else (0, 0)

    def _flush(self, which=None) -> None:
        """Send the pending ACTIVATEs ``which(k, job, span)`` selects (all by default) now,
        then the write-back if none of those still pending writes its rows."""
        keep = []
        for k, entry in enumerate(self.pending):
            job, span, live, _ = entry
            if which is not None and not which(k, job, span):
                keep.append(entry)
                continue
            self._send_activate(entry)
        self.pending = keep
        self._write()

    def _send_activate(self, entry) -> None:
        self._activate(entry[0])

    def _release(self, which=None) -> None:
        """The pending ACTIVATEs ``which(k, job, span)`` selects may go once the front end
        would not wait for them longer than the array has work queued
        (:meth:`_flush_due`)."""
        for k, entry in enumerate(self.pending):
            if which is None or which(k, entry[0], entry[1]):
                entry[3] = True
        self._flush_due()

    def _slack(self) -> int:
        """The latest cycle the front end may issue an instruction at and still issue the
        next MATMUL before the array runs dry."""
        return self.timing.arr - 3

    def _flush_due(self) -> None:
        """Send the released ACTIVATEs, oldest first, while each would issue without the
        front end waiting past :meth:`_slack` (for its MATMULs, or for the activation engine,
        which runs one ACTIVATE at a time: LOAD_PARAMS waits for it too); then the write-back
        on the same terms."""
        k = 0
        while k < len(self.pending):
            entry = self.pending[k]
            if not entry[3]:
                k += 1
                continue
            job = entry[0]
            if self.timing.activate_wait(job[4], job[2]) > self._slack():
                break
            self._send_activate(self.pending.pop(k))
        self._write()

    def _flush_activate(self) -> None:
        self._flush()

    def _write(self, force: bool = False) -> None:
        """The pending write-back, once no pending ACTIVATE writes its rows; unless
        ``force``, only when the front end would not wait for the ACTIVATEs sent to write
        them past :meth:`_slack`."""
        if self.pending_write is None:
            return
        ub, rows = self.pending_write
        if any(lo < ub + rows and ub < hi for _, (lo, hi), _, _ in self.pending):
            return
        if not force and self.timing.write_host_wait(ub, rows) > self._slack():
            return
        for s in range(0, rows, COUNT_LIMIT):
            self.p.write_host(ub + s, min(COUNT_LIMIT, rows - s))
        self.pending_write = None

    def _acc_region(self, rows: int) -> int:
        """First accumulator row of a job of ``rows`` rows: the next rows in turn, or the
        place where the ACTIVATEs still to be sent that these MATMULs would wait for (they
        read the same rows) are the shortest."""
        depth = self.c.acc_depth
        busy = [(job[4], job[4] + job[2]) for job, _, _, _ in self.pending]
        best = None
        for start in [self.acc_next, 0] + [hi for _, hi in busy]:
            if start + rows > depth:
                continue
            cost = sum(hi - lo for lo, hi in busy if lo < start + rows and start < hi)
            if best is None or cost < best[0]:
                best = (cost, start)
        return best[1]

    def _flush_for(self, test) -> None:
        """Send the pending ACTIVATEs ``test(job, span)`` holds for."""
        self._flush(lambda k, job, span: test(job, span))

    def _pass_runs(self, sp: _StagePlan, b: int, u0: int, m0: int, rows: int
                   ) -> list[tuple[np.ndarray, np.ndarray, list]]:
        """Per pass of the job ``m0..`` of a stage over units from ``u0`` of batch ``b``:
        the sources it reads (input-unit rows), which accumulator rows are real, and its
        MATMUL runs; the same for every column block, so worked out once."""
        lay = sp.layout
        first_stage = sp.index == 0
        u, r = np.divmod(m0 + np.arange(rows), lay.m)
        # Rows of images the program does not have (a last, partial unit) read nothing:
        # where they end a run, the run is shorter.
        have = len(self.x_q) - (b * self.plan.batch + (u0 + u) * self.plan.unit)
        real = lay.outputs[r // lay.window][:, 2] < have
        out = []
        for ps in lay.passes:
            src = ps.sources[r]
            keep = (src >= 0) & real
            if first_stage:
                g = b * self.plan.units + u0
                absolute = (self._ring_offset(g) + src) % self.plan.ring
            else:
                absolute = src + self._src_base(sp, b, u0 + u)
            out.append((src, keep, _runs(np.where(keep, absolute, -1),
                                         self.plan.ring if first_stage else self.c.ub_depth)))
        return out

    def _stage(self, sp: _StagePlan, b: int, u0: int, units: int, emit: bool) -> None:
        """The jobs of a stage over ``units`` units of batch ``b`` from unit ``u0``."""
        c = self.c
        lay = sp.layout
        first_stage = sp.index == 0
        g = b * self.plan.units + u0                 # the program's unit (first stage)
        reads: dict = {}
        if first_stage and emit:
            # Every input row this unit's MATMULs will read stays live until the last job
            # that reads it has sent its MATMULs, so that the next unit's rows never land on
            # a row still to be read; after that the cycle model says when the array is done.
            for m0, rows in _jobs(sp, units, c):
                spans = [(g, ub, ub + n) for _, _, runs in self._pass_runs(sp, b, u0, m0, rows)
                         for _, ub, n in runs]
                for nb in range(lay.col_blocks):
                    reads[(m0, nb)] = list(spans)
                    self.ring_live += spans
        for m0, rows in _jobs(sp, units, c):
            u, r = np.divmod(m0 + np.arange(rows), lay.m)
            have = len(self.x_q) - (b * self.plan.batch + (u0 + u) * self.plan.unit)
            if not (lay.outputs[r // lay.window][:, 2] < have).any():
                continue                     # only images the program does not have
            passes = self._pass_runs(sp, b, u0, m0, rows) if emit else None
            for nb in range(lay.col_blocks):
                # Jobs take accumulator rows in turn around the whole memory, so that a short
                # job does not land on rows a long ACTIVATE is still reading.
                region = self._acc_region(rows)
                self.acc_next = region + rows
                if emit:
                    # A pending ACTIVATE of these accumulator rows goes first (these
                    # MATMULs then wait for it).
                    self._flush_for(lambda job, span, lo=region, hi=region + rows:
                                    job[4] < hi and lo < job[4] + job[2])
                issued = 0
                for kc in range(len(lay.passes)):
                    if not emit:
                        self.uses.append(sp.tiles[kc][nb])
                        continue
                    src, keep, runs = passes[kc]
                    if first_stage and keep.any():
                        self._feed_for(g, int(src[keep].max()) + 1)
                    # Every pass switches to its own tile, so none may be empty.
                    assert runs, (sp.stage.name, m0, kc)
                    # These MATMULs read what a pending ACTIVATE writes: it goes first.
                    self._flush_for(lambda job, span, runs=runs: any(
                        span[0] < ub + n and ub < span[1] for _, ub, n in runs))
                    for n, (acc, ub, count) in enumerate(runs):
                        self.p.matmul(ub, region + acc, count, switch=n == 0,
                                      accumulate=kc > 0, signed=sp.stage.in_q.signed)
                        self.stage_rows[sp.index] += count
                        if n == 0:
                            self.used += 1
                            self._read_next(self.used)
                        issued += 1
                        if issued == 1:
                            # The previous job of this stage is done once this one's MATMUL
                            # is queued behind it: its ACTIVATE may go (a first-stage job
                            # also releases what later stages left), the array having work
                            # while it waits for those MATMULs to end.
                            self._release(None if first_stage else
                                          lambda k, job, span, s=sp.index: job[0].index == s)
                        else:
                            self._flush_due()
                        # Host rows for the time the queued MATMULs keep the array busy,
                        # less the dispatch of the next MATMUL.
                        self._feed(self.timing.host_rows_by(self._slack()))
                if emit:
                    job = (sp, m0, rows, nb, region, b, u0)
                    self.pending.append([job, self._targets_range(job), [], False])
                    # Its MATMULs are all sent: the interlocks keep a READ_HOST off the input
                    # rows they still read, and the cycle model says when that ends.
                    for piece in reads.get((m0, nb), ()):
                        self.ring_live.remove(piece)
                if sp.index == 0:
                    self._interleave(b, emit)

    def _units(self, b: int) -> int:
        """Units batch ``b`` runs: the last batch only those holding images."""
        plan = self.plan
        images = max(1, min(plan.batch, len(self.x_q) - b * plan.batch))
        return _ceil_div(images, plan.unit)

    def _later(self, emit: bool) -> None:
        """Emit the oldest deferred later stage (and, after a batch's last stage, its
        write-back, deferred too)."""
        sp, b = self.deferred.popleft()
        units = self._units(b)
        self._stage(sp, b, 0, units, emit)
        if emit and sp.index == len(self.plan.stages) - 1:
            self._defer_write(b)

    def _interleave(self, b: int, emit: bool) -> None:
        """After a job of the first stage of batch ``b``: one later stage of an earlier
        batch, so that the MATMULs between two dependent stages hide the ACTIVATE the
        second waits for."""
        if self.deferred and self.deferred[0][1] < b:
            self._later(emit)

    def _defer_write(self, b: int) -> None:
        if self.pending_write is not None:
            self._flush_for(lambda job, span: span[0] < self.pending_write[0] +
                            self.pending_write[1] and self.pending_write[0] < span[1])
            self._write(force=True)
        out = self.plan.stages[-1].outs[b % 2]
        self.pending_write = (out.base, self._write_rows(b))

    def _write_rows(self, b: int) -> int:
        """The output rows batch ``b`` writes back: its units' blocks up to the last row of
        an image it has."""
        out = self.plan.stages[-1].outs[0]
        unit = self.plan.unit
        r = np.arange(out.block * self._units(b))
        images = (r // out.block) * unit + r % unit
        return int(np.flatnonzero(images < len(self.x_q) - b * self.plan.batch)[-1]) + 1

    def _program(self, emit: bool) -> None:
        plan = self.plan
        n_units = _ceil_div(len(self.x_q), plan.unit)
        self.deferred = deque()
        if emit:
            self._queue_unit(0)
        g = 0                                   # unit of the program
        for b in range(self.batches):
            units = self._units(b)
            for u in range(units):
                if emit and g + 1 < n_units:
                    self._queue_unit(g + 1)
                self._stage(plan.stages[0], b, u, 1, emit)
                g += 1
            if self.profile:
                self._checkpoint()
                if len(plan.stages) == 1 and emit:
                    self._defer_write(b)
                for sp in plan.stages[1:]:
                    self.deferred.append((sp, b))
                    self._later(emit)
                    self._checkpoint()
                continue
            # An earlier batch's stages still deferred go now: the next batch's units
            # overwrite what they read.
            while self.deferred and self.deferred[0][1] < b:
                self._later(emit)
            if len(plan.stages) > 1:
                self.deferred.extend((sp, b) for sp in plan.stages[1:])
                if not plan.spare:          # the next batch's first unit overwrites them
                    while self.deferred:
                        self._later(emit)
            elif emit:
                self._defer_write(b)
        while self.deferred:
            self._later(emit)
        if emit:
            self._feed_all()
            self._flush_activate()
            self._write(force=True)

    def _checkpoint(self) -> None:
        """Profiling: every ACTIVATE sent, then the counters (READ_COUNTERS reports them
        once every earlier instruction has completed)."""
        if self.emitting:
            write, self.pending_write = self.pending_write, None   # the outputs go last
            self._flush()
            self.pending_write = write
            self.p.read_counters()

    def emit(self) -> tuple[list[int], int]:
        self.emitting = False
        self._program(emit=False)
        self.emitting = True
        self.jobs_done = self.acc_next = 0
        self._read_next(0)
        if self.profile:
            self.p.clear_counters()
        self._program(emit=True)
        self.p.halt()
        return self.p.beats, self.p.instructions


class _Timing:
    """A cycle model of the core running a program as the emitter writes it, for the
    emitter's choices and the estimates. Measured on the RTL (micro-programs of each kind of
    instruction on the 2x2 to 16x16 presets):

    - the front end issues one instruction at a time, in order, once the hazard rules and its
      engine allow; each holds it for a cycle plus its data beats (LOAD_PARAMS about four,
      ACTIVATE and WRITE_HOST two);
    - the matrix engine takes a MATMUL only as the one before issues its last row (the front
      end runs one MATMUL ahead of the array) and only into a free slot of the
      ``matmul_slots`` it has (a MATMUL holds one until its last row has been written to the
      accumulators); a MATMUL that switches tiles starts at the earliest ``rows + 3`` cycles after
      the last switch (the shadow tile shifts in a row a cycle) and costs its rows plus one;
    - the activation engine runs one ACTIVATE at a time, its rows plus 23 cycles, and
      LOAD_PARAMS waits for it; its output rows share the unified buffer's write port with
      READ_HOST's rows, round-robin, so a READ_HOST beside an ACTIVATE takes a cycle longer
      for each row the ACTIVATE writes meanwhile;
    - the weight loader runs one READ_WEIGHTS at a time, a tile row a cycle, and the next
      READ_WEIGHTS waits for it; a tile enters the weight FIFO only as the tile
      ``weight_fifo_depth`` before it leaves for the shadow registers (on the switch to the
      one before that), and a MATMUL switches to a tile only once it is whole in the shadow;
    - the host writer sends a WRITE_HOST's rows one a cycle after the front end lets it go,
      and the program ends when it has sent the last;
    - a MATMUL's accumulator rows are written ``rows + cols + 4`` cycles after its last row
      enters the array.

    Times are cycles from the program's start."""

    def __init__(self, config: TPUConfig):
        self.slots = config.matmul_slots
        self.switch_period = config.rows + 1
        self.latency = config.rows + config.cols + 4
        self.fe = 0.0            # the front end: when its next instruction can issue
        self.arr = 0.0           # when the array has issued the last queued MATMUL's rows
        self.act = 0.0           # when the activation engine is free
        self.loader = 0.0        # when the weight loader is free
        self.writer = 0.0        # when the host writer has sent the last WRITE_HOST's rows
        self.rows = config.rows
        # When each MATMUL in flight retires (its last row written): a MATMUL takes a slot,
        # so short MATMULs go no faster than matmul_slots per array latency.
        self.retire: deque = deque(maxlen=config.matmul_slots)
        self.last_switch = -1e9  # when the last tile switch started
        # The tiles READ_WEIGHTS queues, in the order the MATMULs switch to them: when each
        # one's last row entered the weight FIFO, and when each was switched to (its shadow
        # registers free for the next); a tile enters the FIFO once the tile
        # ``weight_fifo_depth`` before it has left for the shadow registers.
        self.depth = config.weight_fifo_depth
        self.delivered: list = []
        self.switched: list = []
        self.idle = 0.0          # array cycles lost between MATMULs (after the first)
        self.started = False
        # Ranges an engine has yet to finish with: (lo, hi, done)
        self.ub_written: list = []   # unified-buffer rows an ACTIVATE writes
        self.ub_read: list = []      # unified-buffer rows a MATMUL or WRITE_HOST reads
        self.acc_written: list = []  # accumulator rows a MATMUL writes
        self.acc_read: list = []     # accumulator rows an ACTIVATE reads
        # ACTIVATEs still writing: [next cycle, rows left, rows a cycle, ub_written entry,
        # acc_read entry]; READ_HOST's rows take the write port from them (round-robin).
        self.act_writes: list = []

    @staticmethod
    def _after(ranges: list, lo: int, hi: int, t: float) -> float:
        for a, b, done in ranges:
            if a < hi and lo < b and done > t:
                t = done
        return t

    def _prune(self) -> None:
        now = min(self.fe, self.arr)
        for name in ("ub_written", "ub_read", "acc_written", "acc_read"):
            ranges = getattr(self, name)
            if len(ranges) > 64:
                setattr(self, name, [r for r in ranges if r[2] > now])

    def matmul_wait(self, ub: int, acc: int, count: int) -> float:
        """When a MATMUL would issue."""
        t = max(self.fe, self.arr - 1)
        if len(self.retire) == self.slots:
            t = max(t, self.retire[0])
        t = self._after(self.ub_written, ub, ub + count, t)
        return self._after(self.acc_read, acc, acc + count, t)

    def matmul(self, ub: int, acc: int, count: int, *, switch: bool = False, **_) -> None:
        t = self.matmul_wait(ub, acc, count)
        start = max(t + 1, self.arr)
        if switch:
            start = max(start, self.last_switch + self.switch_period)
            k = len(self.switched)
            if k < len(self.delivered):     # the tile whole in the shadow registers
                start = max(start, self.delivered[k] + 3)
            self.last_switch = start
            self.switched.append(start)
        if self.started:
            self.idle += start - self.arr
        self.started = True
        self.arr = start + count + (1 if switch else 0.5)
        self.fe = t + 1
        self.acc_written.append((acc, acc + count, self.arr + self.latency))
        self.retire.append(self.arr + self.latency + 0.5)
        self.ub_read.append((ub, ub + count, self.arr))
        self._prune()

    def activate_wait(self, acc: int, count: int) -> float:
        """When an ACTIVATE (or the LOAD_PARAMS before it) would issue."""
        return self._after(self.acc_written, acc, acc + count, max(self.fe, self.act))

    def activate(self, acc: int, ub: int, count: int, *, pool=isa.Pool.NONE, **_) -> None:
        t = self.activate_wait(acc, count)
        self.fe = t + 2
        self.act = t + count + 23
        out = count // 4 if pool == isa.Pool.MAX4 else count
        written, read = [ub, ub + out, self.act], [acc, acc + count, self.act]
        self.ub_written.append(written)
        self.acc_read.append(read)
        self.act_writes = [w for w in self.act_writes if w[0] + w[1] / w[2] > self.fe] + [
            [t + 23, out, out / count, written, read]]

    def read_host(self, ub: int, rows) -> None:
        n = len(rows)
        t = self._after(self.ub_read, ub, ub + n, self.fe)
        t = self._after(self.ub_written, ub, ub + n, t)
        self.fe = self._host_end(t, n, commit=True)

    def _host_end(self, t: float, n: int, commit: bool = False) -> float:
        """When a READ_HOST of ``n`` rows issued at ``t`` frees the front end: its rows and
        the ACTIVATEs' output rows share the unified buffer's write port round-robin, so
        where both wait each gets every other cycle (an ACTIVATE that pools writes a row
        every fourth cycle and takes only those). With ``commit``, the ACTIVATEs it slows
        finish later."""
        t += 1
        for w in self.act_writes:
            nxt, left, rate = w[:3]
            if n == 0:
                break
            if nxt + left / rate <= t:
                continue
            if nxt > t:                      # the host's rows alone before it writes
                alone = min(n, nxt - t)
                t, n = t + alone, n - alone
                if n == 0:
                    break
            left -= (t - nxt) * rate         # its rows written alone until now
            nxt = t
            share = min(rate, 0.5)           # both waiting: its share of the port
            span = min(n / (1 - share), left / share)
            t, n, left, nxt = t + span, n - span * (1 - share), left - span * share, t + span
            if commit:
                w[0], w[1] = nxt, left
                done = nxt + left / rate
                w[3][2] = w[4][2] = done
                self.act = max(self.act, done)
        return t + n

    def host_rows_by(self, deadline: float) -> int:
        """Most rows a READ_HOST issued now can take and free the front end by
        ``deadline``."""
        lo, hi = 0, max(0, int(deadline - self.fe) - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._host_end(self.fe, mid) <= deadline else (lo, mid - 1)
        return lo

    def free_rows(self, lo: int, n: int) -> int:
        """How many rows from ``lo`` (of ``n``) no MATMUL or WRITE_HOST still reads when
        the front end issues its next instruction."""
        free = n
        for a, b, done in self.ub_read:
            if a < lo + n and lo < b and done > self.fe:
                free = min(free, max(0, a - lo))
        return free

    def write_host_wait(self, ub: int, count: int) -> float:
        return self._after(self.ub_written, ub, ub + count, self.fe)

    def write_host(self, ub: int, count: int) -> None:
        t = self.write_host_wait(ub, count)
        self.fe = t + 2
        self.writer = max(self.writer, t + 2) + count
        self.ub_read.append((ub, ub + count, self.writer))

    def load_params(self, *args, **kwargs) -> None:
        self.fe = max(self.fe, self.act) + 4

    def load_weights(self, tile, tiles, signed=True) -> None:
        self.fe += 1 + np.asarray(tiles).reshape(-1, np.shape(tiles)[-1]).shape[0]

    def read_weights(self, tile: int, count: int = 1) -> None:
        t = max(self.fe, self.loader)
        self.fe = t + 1
        end = t + 2
        for _ in range(count):
            k = len(self.delivered)
            room = k - self.depth - 1      # the tile whose move to the shadow frees room
            if 0 <= room < len(self.switched):
                end = max(end, self.switched[room] + 1)
            end += self.rows
            self.delivered.append(end)
        self.loader = end

    def other(self, *args, **kwargs) -> None:
        """SYNC, HALT and the counters: every engine idle first."""
        self.fe = max(self.fe, self.arr + self.latency, self.act) + 1

    halt = sync = read_counters = clear_counters = other

    def total(self) -> float:
        return max(self.fe, self.arr + self.latency, self.act, self.writer)


class _Timed:
    """A program (or tally) whose calls also advance a :class:`_Timing`."""

    def __init__(self, program, timing: _Timing):
        self._program, self.timing = program, timing

    def __getattr__(self, name):
        target = getattr(self._program, name)
        model = getattr(self.timing, name, None)
        if model is None or not callable(target):
            return target

        def call(*args, **kwargs):
            model(*args, **kwargs)
            return target(*args, **kwargs)
        return call


class _Tally:
    """The program an :class:`_Emitter` writes when it only estimates: every call is
    accepted and nothing is encoded (its :class:`_Timing` does the counting)."""

    beats: list = []
    instructions = 0

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


#: Input ring sizes (in units' rows) the compiler tries: two buffers first.
RINGS = (2.0, 1.5, 1.25, 1.0)


def _choose(config: TPUConfig, network: QuantisedNetwork,
            max_batch: int) -> tuple[int, int, float]:
    """Images per unit, units per batch and the input ring: the choice whose program the
    emitter's tallies predict the fewest cycles per image for; on a tie the one whose first
    stage's output has a block to spare (later stages overlap the next batch), then the
    larger unit (longer MATMULs, fewer instructions), the larger ring, the larger batch."""
    best = None
    if len(network.stages) == 1:
        # One stage: nothing runs behind a batch, so the largest unit that fits with two
        # input buffers (or the ring) is the choice, without estimates.
        for ring in RINGS:
            lo, hi = 0, max_batch
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if _fits(config, network, mid, 1, ring) else (lo, mid - 1)
            if lo:
                return lo, 1, ring
    candidates = sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                         config.rows, 2 * config.rows})
    for ring in RINGS:
        fitting = []
        for unit in (u for u in candidates if u <= max_batch):
            if not _fits(config, network, unit, 1, ring):
                break
            fitting.append(unit)
        for unit in fitting[-3:]:           # the largest units: longer MATMULs
            lo, hi = 1, max_batch // unit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _fits(config, network, unit, mid, ring):
                    lo = mid
                else:
                    hi = mid - 1
            # Fewer units a batch may keep a spare block; more make a later stage's MATMULs
            # longer (a tile switch costs the array a row per array row).
            for units in sorted({u for u in candidates if u < lo} | {lo}):
                cn = CompiledNetwork(config, network, unit, units, ring=ring)
                # Estimates within a per cent of each other count as a tie (the model's
                # error): then a spare block, a larger unit, ring and batch.
                key = (round(math.log(cn.estimate()) / math.log(1.01)), -cn._plan.spare,
                       -unit, -ring, -cn.batch_size)
                if best is None or key < best[0]:
                    best = (key, unit, units, ring)
    return best[1], best[2], best[3]


def _fits(config, network, unit, units, ring: float = 2.0) -> bool:
    try:
        _plan(config, network, unit, units, ring=ring)
        return True
    except CompileError:
        return False


def compile_network(network: QuantisedNetwork, config: TPUConfig, *,
                    batch_size: int | None = None, max_batch: int = 256,
                    unit: int | None = None, ring: float | None = None,
                    program_images: int = PROGRAM_IMAGES) -> CompiledNetwork:
    """Compile ``network`` for ``config``.

    ``batch_size``: images per batch, ``unit``: images per unit (a divisor of the batch);
    by default the compiler picks both, the batch up to ``max_batch`` images.
    ``program_images``: most images per batch program. Raises :class:`CompileError` naming
    the stage and the memory when even one image does not fit, for a graph the compiler
    cannot map, or for a uint8 network input on a core for int8 only (``operands="int8"``:
    quantise with ``input_signed=True``).
    """
    if config.operands == "int8" and not network.input_q.signed:
        raise CompileError(f"{network.name}: its input is uint8, but the {config.name} core "
                           f"takes int8 operands only (operands='int8'); quantise it with "
                           f"int8 input (firmware.quant.quantise(..., input_signed=True))")
    for name, value in (("batch_size", batch_size), ("unit", unit), ("max_batch", max_batch),
                        ("program_images", program_images)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise CompileError(f"{name}={value!r}; allowed: an int >= 1")
    if ring is not None and not (isinstance(ring, int | float) and ring >= 1):
        raise CompileError(f"ring={ring!r}; allowed: a number >= 1 (the input ring's size "
                           f"in units' rows)")
    try:
        _plan(config, network, 1, 1, ring=min(RINGS))
    except CompileError as error:
        raise CompileError(f"{network.name} does not fit {config.name} even one image at a "
                           f"time: {error}") from None
    rings = RINGS if ring is None else (ring,)
    if batch_size is not None:
        if unit is not None and batch_size % unit:
            raise CompileError(f"batch_size={batch_size} is not a multiple of unit={unit}")
        units_of = [unit] if unit is not None else \
            [u for u in range(min(batch_size, 4 * config.rows), 0, -1) if batch_size % u == 0]
        for r in rings:                      # the largest unit at the largest ring that fits
            for u in units_of:
                if _fits(config, network, u, batch_size // u, r):
                    return CompiledNetwork(config, network, u, batch_size // u,
                                           program_images, r)
        _plan(config, network, units_of[-1], batch_size // units_of[-1], ring=rings[-1])
    if unit is not None:
        r = next((r for r in rings if _fits(config, network, unit, 1, r)), rings[-1])
        _plan(config, network, unit, 1, ring=r)
        units = max(u for u in range(1, max(1, max_batch // unit) + 1)
                    if _fits(config, network, unit, u, r))
        return CompiledNetwork(config, network, unit, units, program_images, r)
    unit, units, ring = _choose(config, network, max_batch)
    return CompiledNetwork(config, network, unit, units, program_images, ring)
