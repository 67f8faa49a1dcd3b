"""Compiler from a quantised network (:mod:`firmware.quant`) to programs for the core.

:func:`compile_network` plans a whole network for one :class:`~hdl.config.TPUConfig`: weight
tiles, parameter slots, unified-buffer and accumulator regions, and a batch size. The result,
:class:`CompiledNetwork`, gives a *setup* program that loads what stays resident (weights and
parameters when they fit) and, for any batch of quantised inputs, a *batch* program that reads
the inputs, runs every stage with activations kept in the unified buffer between stages, and
writes the outputs back. :func:`firmware.runtime.run` runs them on a device.

On-chip layout
--------------
A tensor of ``B`` images with ``P`` positions (``H * W``, 1 for a vector) and ``C`` channels is
stored as ``G`` channel groups of ``g`` channels: unified-buffer row
``base + (group * P + position) * B + image`` holds channels ``group * g ..`` of one position
of one image (element 0 first). Stage outputs use ``g = min(rows, cols)`` (ACTIVATE writes
``cols`` elements and MATMUL reads ``rows``) and the network's last stage ``g = cols``; the
network input uses ``g = rows``.

Stages
------
A stage is ``Y = act(requantise(X @ W))`` with optional 2x2 max-pooling. Its reduction runs
over *K chunks*, each ``M`` consecutive unified-buffer rows times one weight tile of
``rows x cols`` (zero-padded), summed in the accumulators; its output columns run in blocks of
``g`` columns.

- Dense after a spatial tensor (a Flatten): one chunk per (position, channel group): the
  rows of one position of all ``B`` images, ``M = B``. Weight rows follow the HWC flatten order.
- Dense on the network input: one chunk per ``rows`` input features, ``M = B``.
- Conv2D on the network input: the host lays out the ``kh * kw * C`` patches (im2col, padding
  with the input's zero point), one chunk per ``rows`` of them, ``M = B * positions``. With
  max-pooling fused, the rows are ordered window by window (the 4 positions of a 2x2 window
  next to each other) so that ACTIVATE's MAX4 over consecutive rows is the 2-D pooling.
- Conv2D on another stage's output runs on chip, TPU v1's way: one MATMUL per kernel
  position and input channel group over the whole input, shifted by that position's offset
  (``dy * pitch + dx`` positions), accumulating. The producing stage writes its output inside
  a frame of the padding's width whose rows hold the quantised zero (a READ_HOST of constant
  rows), so 'same' padding costs nothing in the MATMULs; the output rows that wrap around the
  frame's edge (``kw - 1`` per image row) are computed and not activated: ACTIVATE writes
  each output row's run of positions. Max-pooling after such a convolution is not supported
  (:class:`CompileError`).

``M`` is split into jobs of at most half the accumulators; jobs alternate between two
accumulator regions so that the ACTIVATE of one job overlaps the MATMULs of the next. A job is
``KC`` MATMULs, one weight tile each (``switch``; ``accumulate`` after the first), then one
ACTIVATE into the stage's output rows. READ_WEIGHTS run ahead of the MATMULs by the weight
FIFO's depth plus the shadow tile, so the next tile is always shifting in. Stage inputs and
outputs sit at opposite ends of the unified buffer, alternating, so consecutive stages never
overlap; the hardware interlocks order the rest (no NOP padding, no SYNC).

Weights stay resident (loaded once by the setup program) when all tiles fit
``weight_mem_tiles``; otherwise every batch program streams them through the weight memory as
a ring, each LOAD_WEIGHTS just before its READ_WEIGHTS. Parameters stay resident when every
(stage, column block) fits ``param_slots``; otherwise each ACTIVATE is preceded by its
LOAD_PARAMS.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from firmware import nn
from firmware.asm import Program
from firmware.quant import QuantisedNetwork, Stage
from firmware.runtime import Batch
from hdl import isa
from hdl.config import TPUConfig

__all__ = ["CompileError", "CompiledNetwork", "compile_network", "COUNT_LIMIT"]

#: Largest ``count`` field of an instruction.
COUNT_LIMIT = (1 << 16) - 1


class CompileError(ValueError):
    """The network does not fit the configuration (message names the stage and memory)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tensor:
    """A tensor's place in the unified buffer (see the module notes). A spatial tensor that
    a convolution with padding reads is stored inside a frame of ``frame`` rows/columns on
    each side holding the quantised zero; ``positions`` counts the framed positions."""
    base: int
    groups: int
    positions: int
    batch: int
    width: int          # g: channels per row
    channels: int
    height: int = 1     # interior height and width (1 x 1 for a vector)
    pitch: int = 1      # framed width
    frame: tuple[int, int] = (0, 0)

    def position(self, y, x):
        """Framed position of interior position (y, x)."""
        return (y + self.frame[0]) * self.pitch + x + self.frame[1]

    @property
    def rows(self) -> int:
        return self.groups * self.positions * self.batch

    def row(self, group: int, position: int) -> int:
        return self.base + (group * self.positions + position) * self.batch


@dataclass(frozen=True)
class StagePlan:
    """Everything the emitter needs for one stage, for one batch size."""
    stage: Stage
    index: int
    m: int                          # rows per K chunk
    chunks: list[int]               # unified-buffer row of each K chunk's first row
    window: int                     # 1, or 4 for fused max-pooling
    out: Tensor
    tiles: list[list[int]]          # tile ids [kc][nb]
    params: list[int]               # parameter-set ids per column block
    jobs: list[tuple[int, int, int]]  # (m0, rows, column block)
    targets: np.ndarray             # per output row m // window: its unified-buffer row
                                    # within column block 0 (-1: not an output, skipped)

    def activations(self, job: int) -> list[tuple[int, int, int]]:
        """``(acc offset, ub row, acc rows)`` of the ACTIVATEs of a job: one per run of
        output rows that are consecutive in the unified buffer."""
        m0, rows, nb = self.jobs[job]
        w = self.window
        shift = nb * self.out.positions * self.out.batch
        r0 = m0 // w
        targets = self.targets[r0:(m0 + rows) // w]
        runs = []
        i = 0
        while i < len(targets):
            if targets[i] < 0:
                i += 1
                continue
            j = i + 1
            while j < len(targets) and targets[j] == targets[j - 1] + 1:
                j += 1
            runs.append((i * w, int(targets[i]) + shift, (j - i) * w))
            i = j
        return runs

    def border_runs(self) -> list[tuple[int, int]]:
        """``(ub row, rows)`` of the output frame's border (every column block), which
        must hold the output's quantised zero."""
        out = self.out
        if out.frame == (0, 0):
            return []
        inner = np.zeros(out.positions, dtype=bool)
        for y in range(out.height):
            start = out.position(y, 0)
            inner[start:start + (out.pitch - 2 * out.frame[1])] = True
        runs = []
        for g in range(out.groups):
            p = 0
            while p < out.positions:
                if inner[p]:
                    p += 1
                    continue
                q = p
                while q < out.positions and not inner[q]:
                    q += 1
                runs.append((out.row(g, p), (q - p) * out.batch))
                p = q
        return runs


@dataclass(frozen=True)
class _Layout:
    """Batch-independent tiling of one stage."""
    k_rows: list[np.ndarray]        # per K chunk: indices into the weight matrix rows (-1: 0)
    out_width: int                  # g of the output
    col_blocks: int


class CompiledNetwork:
    """A network compiled for one configuration; implements the runtime's executable
    protocol (:meth:`setup_program`, :meth:`batches`).

    Attributes
    ----------
    config : TPUConfig
    network : QuantisedNetwork
    batch_size : int
        Images per batch program.
    resident_weights, resident_params : bool
        Whether weights / parameters are loaded once by the setup program.
    tiles : ndarray, (n_tiles, rows, cols)
        Every weight tile, in tile-id order.
    """

    def __init__(self, config: TPUConfig, network: QuantisedNetwork, batch_size: int,
                 layouts: list[_Layout], tiles: np.ndarray, params: list[tuple]):
        self.config = config
        self.network = network
        self.batch_size = batch_size
        self._layouts = layouts
        self.tiles = tiles
        self._params = params    # (bias, multiplier, shift, zp, clamp, rounding)
        self.resident_weights = len(tiles) <= config.weight_mem_tiles
        self.resident_params = len(params) <= config.param_slots

    # Setup ------------------------------------------------------------------------------

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_WEIGHTS and LOAD_PARAMS of what stays resident, then HALT; answers with the
        DONE beat only."""
        p = Program(self.config)
        if self.resident_weights and len(self.tiles):
            p.load_weights(0, self.tiles, signed=True)
        if self.resident_params:
            for slot, (bias, mult, shift, zp, clamp, rounding) in enumerate(self._params):
                p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                              rounding=rounding)
        p.halt()
        return p.beats, 1

    # Planning ---------------------------------------------------------------------------

    @functools.cache  # noqa: B019 (one plan per batch size, kept with the network)
    def plan(self, batch: int) -> list[StagePlan]:
        """Unified-buffer, accumulator and tile plan of a batch program for ``batch``
        images; raises :class:`CompileError` when it does not fit."""
        return _plan(self.config, self.network, self._layouts, batch)

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
        for start in range(0, len(inputs), self.batch_size):
            yield self.batch_program(inputs[start:start + self.batch_size])

    def batch_program(self, x_q: np.ndarray) -> Batch:
        """The program for one batch of quantised inputs."""
        b = len(x_q)
        plans = self.plan(b)
        beats, instructions = self._emit(plans, x_q)
        last = plans[-1]
        out_rows = last.out.rows

        def decode(out: list[int]) -> np.ndarray:
            return self._decode(last, out[:out_rows], b)

        return Batch(beats=beats, output_beats=out_rows + 1, instructions=instructions,
                     images=b, decode=decode)

    # Emission ---------------------------------------------------------------------------

    def _host_rows(self, plan: StagePlan, x_q: np.ndarray) -> np.ndarray:
        """The network input as unified-buffer rows (tensor order), ``rows`` wide."""
        c, st = self.config, plan.stage
        b = len(x_q)
        if st.kind == "dense":
            flat = x_q.reshape(b, -1)
            rows = [flat[:, idx.clip(0)] * (idx >= 0) for idx in self._layouts[0].k_rows]
            return np.concatenate(rows).astype(np.int64)
        kh, kw = st.weight.shape[:2]
        cols = nn.im2col(x_q, kh, kw, st.pad, pad_value=st.in_q.zero_point)
        _, ho, wo, k = cols.shape
        order = _conv_order(ho, wo, b, st.pool)          # (position y, x, image) per row m
        patches = cols[order[:, 2], order[:, 0], order[:, 1]]     # (M, K)
        padded = np.zeros((len(patches), len(self._layouts[0].k_rows) * c.rows), np.int64)
        padded[:, :k] = patches
        return padded.reshape(len(patches), -1, c.rows).transpose(1, 0, 2).reshape(-1, c.rows)

    def _emit(self, plans: list[StagePlan], x_q: np.ndarray) -> tuple[list[int], int]:
        c = self.config
        p = Program(c)
        first = plans[0]
        host_rows = self._host_rows(first, x_q)
        base = first.chunks[0]
        for start in range(0, len(host_rows), COUNT_LIMIT):
            p.read_host(base + start, host_rows[start:start + COUNT_LIMIT])

        uses = [plan.tiles[kc][nb] for plan in plans for _, _, nb in plan.jobs
                for kc in range(len(plan.chunks))]
        ahead = c.weight_fifo_depth + 1
        ring = c.weight_mem_tiles
        queued = 0

        def read_next():
            nonlocal queued
            if queued >= len(uses):
                return
            tile = uses[queued]
            if self.resident_weights:
                p.read_weights(tile, 1)
            else:
                slot = queued % ring
                p.load_weights(slot, self.tiles[tile], signed=True)
                p.read_weights(slot, 1)
            queued += 1

        for _ in range(min(ahead, len(uses))):
            read_next()
        jobs_done = 0

        def activate(plan: StagePlan, job: int, region: int):
            nonlocal jobs_done
            pid = plan.params[plan.jobs[job][2]]
            if self.resident_params:
                slot = pid
            else:
                slot = jobs_done % c.param_slots
                bias, mult, shift, zp, clamp, rounding = self._params[pid]
                p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                              rounding=rounding)
            pool = isa.Pool.MAX4 if plan.window == 4 else isa.Pool.NONE
            for acc, ub, rows in plan.activations(job):
                p.activate(region + acc, ub, rows, func=plan.stage.func, pool=pool, slot=slot)
            jobs_done += 1

        half = c.acc_depth // 2
        for plan in plans:
            zero = np.full(c.ub_row, plan.stage.out_q.zero_point, dtype=np.int64)
            for ub, rows in plan.border_runs():
                for start in range(0, rows, COUNT_LIMIT):
                    n = min(COUNT_LIMIT, rows - start)
                    p.read_host(ub + start, np.broadcast_to(zero, (n, c.ub_row)))
            pending = None
            for j, (m0, rows, _nb) in enumerate(plan.jobs):
                region = (j % 2) * half
                for kc, chunk in enumerate(plan.chunks):
                    p.matmul(chunk + m0, region, rows, switch=True, accumulate=kc > 0,
                             signed=plan.stage.in_q.signed)
                    read_next()
                    if kc == 0 and pending is not None:
                        activate(plan, *pending)
                        pending = None
                pending = (j, region)
            activate(plan, *pending)

        out = plans[-1].out
        for start in range(0, out.rows, COUNT_LIMIT):
            p.write_host(out.base + start, min(COUNT_LIMIT, out.rows - start))
        p.halt()
        return p.beats, p.instructions

    def _decode(self, plan: StagePlan, beats: list[int], b: int) -> np.ndarray:
        out, st = plan.out, plan.stage
        row_bytes = self.config.ub_row
        raw = np.frombuffer(b"".join(int(x).to_bytes(row_bytes, "little") for x in beats),
                            dtype=np.int8).reshape(out.groups, out.positions, b, row_bytes)
        values = raw[..., :out.width].astype(np.int64)            # (G, P, B, g)
        values = values.transpose(2, 1, 0, 3).reshape(b, out.positions, -1)[..., :st.n]
        return values.reshape(b, *st.out_shape)

    # Reporting --------------------------------------------------------------------------

    def summary(self) -> str:
        """A few lines on the plan: stages, tiles, batch size, residency."""
        c = self.config
        lines = [f"{self.network.name} on {c.name}: batch {self.batch_size} images, "
                 f"{len(self.tiles)} weight tiles "
                 f"({'resident' if self.resident_weights else 'streamed per batch'}), "
                 f"{len(self._params)} parameter sets "
                 f"({'resident' if self.resident_params else 'loaded per ACTIVATE'})"]
        for plan in self.plan(self.batch_size):
            st = plan.stage
            lines.append(f"  {st.name}: {st.kind} K={st.k} N={st.n} -> {len(plan.chunks)} "
                         f"chunks x {len(plan.tiles[0])} column blocks, {len(plan.jobs)} jobs "
                         f"of <= {max(r for _, r, _ in plan.jobs)} rows, {st.func.name}"
                         + (" + maxpool 2x2" if st.pool else ""))
        return "\n".join(lines)


def _conv_order(ho: int, wo: int, b: int, pool: bool) -> np.ndarray:
    """``(M, 3)`` (y, x, image) of each convolution output row ``m``: position-major,
    image-minor; with pooling, window by window with the window's 4 positions adjacent."""
    if not pool:
        y, x, n = np.meshgrid(np.arange(ho), np.arange(wo), np.arange(b), indexing="ij")
        return np.stack([y.ravel(), x.ravel(), n.ravel()], axis=1)
    hq, wq = ho // 2, wo // 2
    i, j, n, dy, dx = np.meshgrid(np.arange(hq), np.arange(wq), np.arange(b), np.arange(2),
                                  np.arange(2), indexing="ij")
    return np.stack([(2 * i + dy).ravel(), (2 * j + dx).ravel(), n.ravel()], axis=1)


def _layouts(config: TPUConfig, network: QuantisedNetwork) -> list[_Layout]:
    layouts = []
    width_in = config.rows                       # g of the current input tensor
    for index, st in enumerate(network.stages):
        where = f"stage {st.name}"
        last = index == len(network.stages) - 1
        out_width = config.cols if last else min(config.rows, config.cols)
        if index == 0:
            k = st.k
            chunks = _ceil_div(k, config.rows)
            k_rows = []
            for kc in range(chunks):
                idx = np.arange(kc * config.rows, (kc + 1) * config.rows)
                k_rows.append(np.where(idx < k, idx, -1))
        elif st.kind == "conv":
            kh, kw, cin, _ = st.weight.shape
            groups = _ceil_div(cin, width_in)
            k_rows = []
            for dy in range(kh):
                for dx in range(kw):
                    for g in range(groups):
                        ch = g * width_in + np.arange(config.rows)
                        valid = (ch < cin) & (np.arange(config.rows) < width_in)
                        k_rows.append(np.where(valid, (dy * kw + dx) * cin + ch, -1))
        else:
            prev = network.stages[index - 1].out_shape
            positions = int(np.prod(prev[:-1])) if len(prev) == 3 else 1
            channels = prev[-1]
            if positions * channels != st.k:
                raise CompileError(f"{where}: takes {st.k} features, the previous stage "
                                   f"gives {positions} x {channels}")
            groups = _ceil_div(channels, width_in)
            k_rows = []
            for pos in range(positions):
                for g in range(groups):
                    ch = g * width_in + np.arange(config.rows)
                    valid = (ch < channels) & (np.arange(config.rows) < width_in)
                    k_rows.append(np.where(valid, pos * channels + ch, -1))
        layouts.append(_Layout(k_rows, out_width, _ceil_div(st.n, out_width)))
        width_in = out_width
    return layouts


def _tiles_and_params(config: TPUConfig, network: QuantisedNetwork,
                      layouts: list[_Layout]) -> tuple[np.ndarray, list, list, list]:
    tiles, params, tile_ids, param_ids = [], [], [], []
    for st, lay in zip(network.stages, layouts, strict=True):
        w = st.weight_matrix
        ids = [[0] * lay.col_blocks for _ in lay.k_rows]
        pids = []
        for nb in range(lay.col_blocks):
            cols = nb * lay.out_width + np.arange(config.cols)
            col_ok = (np.arange(config.cols) < lay.out_width) & (cols < st.n)
            for kc, rows in enumerate(lay.k_rows):
                tile = np.zeros((config.rows, config.cols), dtype=np.int64)
                r_ok = rows >= 0
                tile[np.ix_(r_ok, col_ok)] = w[np.ix_(rows[r_ok], cols[col_ok])]
                ids[kc][nb] = len(tiles)
                tiles.append(tile)
            bias = np.zeros(config.cols, dtype=np.int64)
            mult = np.zeros(config.cols, dtype=np.int64)
            bias[col_ok] = st.bias[cols[col_ok]]
            mult[col_ok] = st.multiplier[cols[col_ok]]
            shift = st.shift
            if np.ndim(shift):                   # per column: sliced like the bias
                shift = np.zeros(config.cols, dtype=np.int64)
                shift[col_ok] = np.asarray(st.shift)[cols[col_ok]]
            pids.append(len(params))
            params.append((bias, mult, shift, st.zero_point, st.clamp_hi, st.rounding))
        tile_ids.append(ids)
        param_ids.append(pids)
    return np.array(tiles).reshape(-1, config.rows, config.cols), params, tile_ids, param_ids


def _plan(config: TPUConfig, network: QuantisedNetwork, layouts: list[_Layout],
          batch: int) -> list[StagePlan]:
    c = config
    _, _, tile_ids, param_ids = _tiles_and_params(c, network, layouts)
    half = c.acc_depth // 2
    stages = network.stages
    plans: list[StagePlan] = []
    at_top = False                     # which end of the unified buffer the input sits at
    first = stages[0]
    if first.kind == "conv":
        ho, wo = first.conv_out_hw
        m_in = batch * ((ho // 2) * (wo // 2) * 4 if first.pool else ho * wo)
    else:
        m_in = batch
    in_rows = len(layouts[0].k_rows) * m_in
    for index, (st, lay) in enumerate(zip(stages, layouts, strict=True)):
        where = f"stage {st.name}"
        window = 4 if st.pool else 1
        if st.kind == "conv" and index > 0 and st.pool:
            raise CompileError(f"{where}: MaxPool2D after a Conv2D that reads another stage's "
                               f"output is not supported; allowed: pooling fused into the "
                               f"first Conv2D (its rows are laid out window by window)")
        # The output tensor, framed with the padding of a convolution that reads it.
        nxt = stages[index + 1] if index + 1 < len(stages) else None
        frame = nxt.pad if nxt is not None and nxt.kind == "conv" else (0, 0)
        height, width = st.out_shape[:2] if len(st.out_shape) == 3 else (1, 1)
        pitch = width + 2 * frame[1]
        positions = (height + 2 * frame[0]) * pitch
        out_rows = lay.col_blocks * positions * batch
        if in_rows + out_rows > c.ub_depth:
            raise CompileError(
                f"{where}: needs {in_rows} unified-buffer rows for its input and {out_rows} "
                f"for its output with a batch of {batch}; the configuration has ub_depth="
                f"{c.ub_depth}")
        out_base = c.ub_depth - out_rows if not at_top else 0
        out = Tensor(out_base, lay.col_blocks, positions, batch, lay.out_width, st.n,
                     height, pitch, frame)
        if index == 0:
            m = m_in
            chunks = [kc * m for kc in range(len(lay.k_rows))]
            r = np.arange(m // window)
            pos, b = r // batch, r % batch
            targets = out.base + out.position(pos // width, pos % width) * batch + b
        elif st.kind == "conv":
            prev = plans[-1].out
            kh, kw = st.weight.shape[:2]
            ho, wo = st.conv_out_hw
            m = ((ho - 1) * prev.pitch + wo) * batch
            chunks = [prev.row(g, dy * prev.pitch + dx) for dy in range(kh)
                      for dx in range(kw) for g in range(prev.groups)]
            r = np.arange(m)
            q, b = r // batch, r % batch
            y, x = q // prev.pitch, q % prev.pitch
            targets = np.where(x < wo, out.base + out.position(y, x) * batch + b, -1)
        else:
            prev = plans[-1].out
            m = batch
            chunks = [prev.row(g, pos) for pos in range(prev.positions)
                      for g in range(prev.groups)]
            targets = out.base + np.arange(batch)
        if m * len(chunks) == 0 or max(chunks) + m > c.ub_depth:
            raise CompileError(f"{where}: reads past the unified buffer (ub_depth="
                               f"{c.ub_depth})")
        if index == 0 and in_rows > COUNT_LIMIT * 256:
            raise CompileError(f"{where}: {in_rows} input rows are too many for one program")
        step = (min(half, COUNT_LIMIT) // window) * window
        if step < window:
            raise CompileError(f"{where}: a pooling window of {window} rows does not fit "
                               f"half the accumulators (acc_depth={c.acc_depth})")
        jobs = [(m0, min(step, m - m0), nb) for m0 in range(0, m, step)
                for nb in range(lay.col_blocks)]
        plans.append(StagePlan(st, index, m, chunks, window, out, tile_ids[index],
                               param_ids[index], jobs, np.asarray(targets, dtype=np.int64)))
        in_rows = out_rows
        at_top = not at_top
    return plans


def compile_network(network: QuantisedNetwork, config: TPUConfig, *,
                    batch_size: int | None = None, max_batch: int = 256) -> CompiledNetwork:
    """Compile ``network`` for ``config``.

    ``batch_size``: images per batch program; by default the largest up to ``max_batch``
    whose tensors fit the unified buffer. Raises :class:`CompileError` naming the stage and
    the memory when even one image does not fit, for a graph the compiler cannot map, or for
    a uint8 network input on a core for int8 only (``operands="int8"``: quantise with
    ``input_signed=True``).
    """
    if config.operands == "int8" and not network.input_q.signed:
        raise CompileError(f"{network.name}: its input is uint8, but the {config.name} core "
                           f"takes int8 operands only (operands='int8'); quantise it with "
                           f"int8 input (firmware.quant.quantise(..., input_signed=True))")
    layouts = _layouts(config, network)
    tiles, params, _, _ = _tiles_and_params(config, network, layouts)
    if batch_size is not None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise CompileError(f"batch_size={batch_size!r}; allowed: an int >= 1")
        _plan(config, network, layouts, batch_size)
        return CompiledNetwork(config, network, batch_size, layouts, tiles, params)
    try:
        _plan(config, network, layouts, 1)
    except CompileError as error:
        raise CompileError(f"{network.name} does not fit {config.name} even one image at a "
                           f"time: {error}") from None
    lo, hi = 1, max_batch
    while lo < hi:                                  # the largest batch that fits
        mid = (lo + hi + 1) // 2
        try:
            _plan(config, network, layouts, mid)
            lo = mid
        except CompileError:
            hi = mid - 1
    return CompiledNetwork(config, network, lo, layouts, tiles, params)
