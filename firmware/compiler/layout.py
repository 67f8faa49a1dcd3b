"""Where a compiled network's data lives: tensors in the unified buffer, each stage's tiling.

The ground of :mod:`firmware.compiler` (nothing here imports the package's other modules):
:class:`CompileError`; :class:`Tensor`, a tensor's place in the unified buffer; a stage's
*layout* (:class:`_Layout`), its passes over one unit of images and, for a first convolution,
the host's rows (:class:`_HostConv`); :class:`StageBound`; and the weight tiles and parameter
sets the layouts imply. The package notes (:mod:`firmware.compiler`) describe the layout and
the passes; :mod:`firmware.compiler.plan` places the layouts in the memories.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from firmware.quant import QuantisedNetwork, Stage
from hdl import isa
from hdl.config import TPUConfig


class CompileError(ValueError):
    """The network does not fit the configuration (message names the stage and memory)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tensor:
    """A tensor's place in the unified buffer (see the package notes): ``units`` blocks of
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
    frame: tuple[int, int, int, int] = (0, 0, 0, 0)     # top, bottom, left, right

    def position(self, y, x):
        """Framed position of interior position (y, x)."""
        return (y + self.frame[0]) * self.pitch + x + self.frame[2]

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
        if not any(self.frame):
            return np.zeros(0, dtype=np.int64)
        inner = np.zeros(self.positions, dtype=bool)
        width = self.pitch - self.frame[2] - self.frame[3]
        for y in range(self.height):
            start = self.position(y, 0)
            inner[start:start + width] = True
        pos = np.flatnonzero(~inner)
        k, g, p, i = np.meshgrid(np.arange(self.units), np.arange(self.groups), pos,
                                 np.arange(self.unit), indexing="ij")
        return np.sort(self.row(g, p, i, k).ravel())


@dataclass(frozen=True)
class _Pass:
    """One weight tile's rows (indices into the stage's weight matrix rows, -1: zero) and,
    per accumulator row of a unit, the row it reads (offset in the input's unit block; -1:
    the accumulator row is not an output and may read anything). With ``step`` (a first
    convolution over the tensor itself, :class:`_HostTensor`), the sources are elements of
    the unit block instead, each row's window the ``rows`` elements from there, read by
    window MATMULs of that step. A residual add's passes (:attr:`Stage.skip
    <firmware.quant.Stage.skip>`) are MATMUL_LOOKUPs of sum table ``lookup``; ``tensor``: the
    stage whose output the pass reads (its skip), if not the stage's input."""
    k_rows: np.ndarray
    sources: np.ndarray
    step: int | None = None
    lookup: int | None = None
    tensor: int | None = None


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
    tensor: _HostTensor | None = None   # or the input as the tensor itself (window MATMULs)


@dataclass(frozen=True)
class _HostConv:
    """How the host lays out a first convolution's input: per chunk, the (tap, channel group)
    items of each row with their element offsets, over a grid of anchors ``(ah, aw)`` (the
    output positions and the few past its edge that shifted passes read)."""
    chunks: list[list[tuple[int, int, int, int]]]   # (tap, group, offset, width)
    anchors: np.ndarray         # per row of a chunk: (ay, ax, image)


@dataclass(frozen=True)
class _HostTensor:
    """A first convolution's input as the tensor itself, read by window MATMULs: each image
    framed by the convolution's padding (top, bottom, left, right) in its zero point, its
    (height, width, channels) elements in that order, ``ub_row`` a unified-buffer row from
    the first row of the image's block of ``rows`` rows (elements past the tensor, which only
    windows of no output or the zero weights past a kernel row read, are the zero point)."""
    frame: tuple[int, int, int, int]
    shape: tuple[int, int, int]     # framed height, width, channels
    rows: int


@dataclass(frozen=True)
class StageBound:
    """A stage's shape bound (per image): useful MACs over the MAC slots its passes issue."""
    name: str
    useful_macs: float
    slots: float

    @property
    def bound(self) -> float:
        return self.useful_macs / self.slots if self.slots else 0.0


@dataclass(eq=False)
class _PairedConv(Stage):
    """A first convolution computed ``per_row`` output positions to an accumulator row,
    ``spacing`` apart along x: 2 with max-pooling, so that MAX4's four rows (the window's
    four positions) pool ``per_row`` windows side by side in the row's column groups; else 1.
    Its weight is the wide kernel over those positions (``kw + (per_row - 1) * spacing *
    stride`` columns of taps; column ``q * n + c`` is position ``q``'s channel ``c``, zero
    outside its own taps), so one host row carries the taps of ``per_row`` positions and one
    pass computes them. Its ``out_shape`` folds the row's positions into the channels,
    ``(h, w / per_row, per_row * n)``: the original's HWC flatten order, so the Dense after it
    reads the tensor as it is."""
    per_row: int = 1
    spacing: int = 1
    original: Stage | None = None

    @property
    def conv_out_hw(self) -> tuple[int, int]:
        return self.original.conv_out_hw


def _paired(network: QuantisedNetwork, config: TPUConfig) -> QuantisedNetwork:
    """``network`` with its first stage a :class:`_PairedConv` of as many positions a row as
    fit, when it is a convolution whose output a Dense reads: its ``n`` output channels leave
    room for two or more positions in a stage output's ``min(rows, cols)`` columns, the wide
    kernel's taps fit one host row (``rows``), and the positions a row divide the output's
    width (after pooling). Otherwise ``network`` itself."""
    stages = network.stages
    if len(stages) < 2 or stages[0].kind != "conv" or stages[1].kind != "dense":
        return network
    st = stages[0]
    kh, kw, cin, n = st.weight.shape
    ho, wo = st.conv_out_hw
    if st.pool and (ho < 2 or wo < 2):
        return network                  # the layout names the error
    spacing = 2 if st.pool else 1
    width = wo // 2 if st.pool else wo
    per_row = 1
    for p in range(2, min(config.rows, config.cols) // n + 1):
        if kh * (kw + (p - 1) * spacing * st.stride) * cin <= config.rows and width % p == 0:
            per_row = p
    if per_row == 1:
        return network
    wide = kw + (per_row - 1) * spacing * st.stride
    weight = np.zeros((kh, wide, cin, per_row * n), dtype=np.asarray(st.weight).dtype)
    for q in range(per_row):
        dx = q * spacing * st.stride
        weight[:, dx:dx + kw, :, q * n:(q + 1) * n] = st.weight
    kwargs = {f.name: getattr(st, f.name) for f in fields(Stage)}
    h, w = st.out_shape[:2]
    kwargs.update(weight=weight, bias=np.tile(st.bias, per_row),
                  multiplier=np.tile(st.multiplier, per_row),
                  shift=np.tile(st.shift, per_row) if np.ndim(st.shift) else st.shift,
                  out_shape=(h, w // per_row, per_row * n))
    paired = _PairedConv(**kwargs, per_row=per_row, spacing=spacing, original=st)
    return QuantisedNetwork(network.name, network.input_shape, network.input_q,
                            [paired, *stages[1:]])


def _paired_conv_layout(config: TPUConfig, st: _PairedConv, unit: int, out_width: int,
                        col_blocks: int) -> _Layout:
    """A :class:`_PairedConv`: one host row per accumulator row, holding the wide kernel's
    taps at its anchor (the row's first position); one pass reads it. With pooling the rows
    go window by window (MAX4's four rows consecutive), ``per_row`` windows a row."""
    c = config
    kh, kw, cin, _ = st.weight.shape
    ho, wo = st.conv_out_hw
    p = st.per_row
    i = np.arange(unit)
    if st.pool:
        wy, xx, ii, ky, kx = np.meshgrid(np.arange(ho // 2), np.arange(wo // 2 // p), i,
                                         np.arange(2), np.arange(2), indexing="ij")
        ay, ax = (2 * wy + ky).ravel(), (2 * p * xx + kx).ravel()
        outputs = np.stack([wy.ravel()[::4], xx.ravel()[::4], ii.ravel()[::4]], axis=1)
    else:
        yy, xx, ii = np.meshgrid(np.arange(ho), np.arange(wo // p), i, indexing="ij")
        ay, ax = yy.ravel(), (p * xx).ravel()
        outputs = np.stack([yy.ravel(), xx.ravel(), ii.ravel()], axis=1)
    m = len(ay)
    k = kh * kw * cin
    chunk = [(t, 0, t * cin, cin) for t in range(kh * kw)]
    k_rows = np.where(np.arange(c.rows) < k, np.arange(c.rows), -1)
    host = _HostConv([chunk], np.stack([ay, ax, ii.ravel()], axis=1))
    return _Layout(m, 4 if st.pool else 1, [_Pass(k_rows, np.arange(m))], outputs, out_width,
                   col_blocks, host)


def _stage_layout(config: TPUConfig, st: Stage, index: int, images: int, width_in: int,
                  prev_out: tuple | None, last: bool, shifts: bool | str = True,
                  skip_out: tuple | None = None) -> _Layout:
    """The passes of stage ``st`` over ``images`` images. ``prev_out``: the input tensor's
    (groups, positions, pitch, frame, channels) when another stage made it (holding
    ``images``); ``skip_out``: the same of a residual add's skip tensor (holding
    ``images``). ``shifts``: how a first convolution reads its input: ``"windows"``, the
    tensor itself through window MATMULs; True, host rows of taps with shifted passes;
    False, host rows of taps only."""
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

    if isinstance(st, _PairedConv):
        return _paired_conv_layout(config, st, images, out_width, col_blocks)
    ho, wo = st.conv_out_hw
    if st.pool and (ho < 2 or wo < 2):
        raise CompileError(f"{where}: max-pooling needs a 2x2 output, got {ho}x{wo}")
    if index == 0:
        if shifts == "windows":
            return _window_conv_layout(config, st, images, out_width, col_blocks)
        return _host_conv_layout(config, st, images, out_width, col_blocks, shifts)
    kh, kw, cin, _ = st.weight.shape
    groups, positions, pitch, frame, _ = prev_out
    if frame != st.padding:
        raise CompileError(f"{where}: its input is framed by {frame}, it pads by "
                           f"{st.padding}")
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
    if st.skip is not None:
        passes = _add_passes(config, st, images, width_in, prev_out, skip_out, passes, m)
    return _Layout(m, window, passes, outputs, out_width, col_blocks)


def _add_passes(config: TPUConfig, st: Stage, images: int, width_in: int, prev_out: tuple,
                skip_out: tuple | None, passes: list[_Pass], m: int) -> list[_Pass]:
    """A residual add's passes: its input's (a 1x1 convolution of identity weights over the
    unframed input, ``passes``) as MATMUL_LOOKUPs of sum table 1, after the same over its
    skip tensor (its own frame and pitch: a position's row found through both) with table
    0, so that each accumulator row holds ``T0[a] + T1[x]``."""
    where = f"stage {st.name}"
    groups, positions, pitch, frame, channels = prev_out
    if skip_out is None or st.weight.shape[:2] != (1, 1) or st.stride != 1 or st.pool \
            or any(frame):
        raise CompileError(f"{where}: a residual add reads two unpooled tensors of its shape")
    s_groups, s_positions, s_pitch, s_frame, s_channels = skip_out
    if (s_groups, s_channels) != (groups, channels):
        raise CompileError(f"{where}: its skip tensor has {s_channels} channels in "
                           f"{s_groups} groups, its input {channels} in {groups}")
    q = np.arange(m) // images
    ii = np.arange(m) % images
    y, x = q // pitch, q % pitch
    skip_pos = (y + s_frame[0]) * s_pitch + x + s_frame[2]
    skips = []
    for g in range(groups):
        ch = g * width_in + np.arange(config.rows)
        valid = (ch < channels) & (np.arange(config.rows) < width_in)
        skips.append(_Pass(np.where(valid, ch, -1),
                           ((g * s_positions + skip_pos) * images + ii).astype(np.int64),
                           lookup=0, tensor=st.skip))
    return skips + [_Pass(ps.k_rows, ps.sources, lookup=1) for ps in passes]


#: Largest window step (channels times stride) a window MATMUL's ``step`` field holds.
WINDOW_STEP_LIMIT = 15


def window_form(config: TPUConfig, st: Stage) -> str | None:
    """Why a first convolution cannot read its input as the tensor itself (window MATMULs),
    or None when it can."""
    if not config.conv_windows:
        return f"the {config.name} core has no window mode (TPUConfig.conv_windows)"
    step = st.weight.shape[2] * st.stride
    if step > WINDOW_STEP_LIMIT:
        return (f"its windows step {step} elements (channels x stride); a window MATMUL's "
                f"step is at most {WINDOW_STEP_LIMIT}")
    return None


def _window_conv_layout(config: TPUConfig, st: Stage, unit: int, out_width: int,
                        col_blocks: int) -> _Layout:
    """A first convolution over its input as the tensor itself (:class:`_HostTensor`): one
    pass per kernel row and chunk of ``rows`` of its ``kw * C`` elements, each accumulator
    row the window of one output position, read by window MATMULs. Stride 1 without pooling:
    the positions along the framed width, the ones past the output's edge computed and not
    activated, so each pass is one MATMUL of step ``C``. Otherwise the output positions in
    order (with pooling, window by window for MAX4): runs along a row at step ``C *
    stride``."""
    c = config
    where = f"stage {st.name}"
    reason = window_form(config, st)
    if reason is not None:
        raise CompileError(f"{where}: {reason}")
    if unit != 1:
        raise CompileError(f"{where}: its window MATMULs read one image a unit (the windows "
                           f"of one MATMUL step through one image), not {unit}")
    kh, kw, cin, _ = st.weight.shape
    ho, wo = st.conv_out_hw
    stride = st.stride
    top, bottom, left, right = st.padding
    h, w = st.in_shape[0] + top + bottom, st.in_shape[1] + left + right
    if stride == 1 and not st.pool:
        q = np.arange((ho - 1) * w + wo)
        oy, ox = q // w, q % w
        outputs = np.stack([np.where(ox < wo, oy, -1), ox, np.zeros_like(q)], axis=1)
        window = 1
    elif st.pool:
        wy, wx, ky, kx = np.meshgrid(np.arange(ho // 2), np.arange(wo // 2), np.arange(2),
                                     np.arange(2), indexing="ij")
        oy, ox = (2 * wy + ky).ravel(), (2 * wx + kx).ravel()
        outputs = np.stack([wy.ravel()[::4], wx.ravel()[::4],
                            np.zeros(len(oy) // 4, np.int64)], axis=1)
        window = 4
    else:
        oy, ox = (v.ravel() for v in np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij"))
        outputs = np.stack([oy, ox, np.zeros_like(oy)], axis=1)
        window = 1
    run = kw * cin
    passes = []
    for dy in range(kh):
        for c0 in range(0, run, c.rows):
            j = c0 + np.arange(c.rows)
            k_rows = np.where(j < run, dy * run + j, -1)
            sources = ((stride * oy + dy) * w + stride * ox) * cin + c0
            passes.append(_Pass(k_rows, sources.astype(np.int64), step=cin * stride))
    end = max(int(ps.sources.max()) for ps in passes) + c.rows
    rows = _ceil_div(max(end, h * w * cin), c.ub_row)
    return _Layout(len(oy), window, passes, outputs, out_width, col_blocks,
                   tensor=_HostTensor((top, bottom, left, right), (h, w, cin), rows))


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


def _shared(tables: list[tuple[str, np.ndarray]], built: bool, missing: str,
            second: str) -> np.ndarray | None:
    """The table every stage of ``tables`` ((stage name, table) pairs, in order) looks up,
    or None where there are none; a CompileError naming the first stage where the core is
    not ``built`` with it (``missing``), or the stage whose table differs from the first's
    (``second``, its ``{first}`` the first stage's name)."""
    if not tables:
        return None
    name, table = tables[0]
    if not built:
        raise CompileError(f"{name}: {missing}")
    for other, t in tables[1:]:
        if not np.array_equal(t, table):
            raise CompileError(f"{other}: {second.format(first=name)}")
    return table


def _stage_table(config: TPUConfig, network: QuantisedNetwork) -> np.ndarray | None:
    """The one table the network's TABLE stages look up: the core has one."""
    table = _shared(
        [(st.name, np.asarray(st.table, dtype=np.int64)) for st in network.stages
         if st.func == isa.Func.TABLE], config.lookup_table,
        f"its function is a table, and the {config.name} core has no programmable table "
        f"(TPUConfig.lookup_table)",
        f"a second table in {network.name} (after {{first}}'s); the core holds one, so a "
        f"network's stages share it")
    if table is not None and table.shape != (isa.TABLE_ENTRIES,):
        name = next(st.name for st in network.stages if st.func == isa.Func.TABLE)
        raise CompileError(f"{name}: its table has {table.size} entries; allowed: "
                           f"{isa.TABLE_ENTRIES}")
    return table


def _sum_tables(config: TPUConfig, network: QuantisedNetwork) -> np.ndarray | None:
    """The two sum tables every residual add of the network looks up (MATMUL_LOOKUP;
    LOAD_TABLE in the setup program), or None: where there is no add, or where the adds
    differ (then each add's batch loads its own first, :class:`~.emitter._Emitter`)."""
    adds = [(st.name, np.asarray(st.sum_tables, dtype=np.int64)) for st in network.stages
            if st.skip is not None]
    if adds and not config.sum_tables:
        raise CompileError(f"{adds[0][0]}: a residual add, and the {config.name} core has no "
                           f"sum tables (TPUConfig.sum_tables)")
    if any(not np.array_equal(t, adds[0][1]) for _, t in adds[1:]):
        return None
    return adds[0][1] if adds else None


def _weight_tiles(config: TPUConfig, stages: list[Stage], layouts: list[_Layout]):
    """Every weight tile and parameter set of the planned ``stages``; tile ids
    ``[stage][pass][column block]`` and parameter-set ids ``[stage][column block]``."""
    c = config
    tiles, params, tile_ids, param_ids = [], [], [], []
    for st, lay in zip(stages, layouts, strict=True):
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
