"""The plan of a compiled network: where every stage's input, output and tiles go.

:func:`_plan` fits the layouts (:mod:`firmware.compiler.layout`) of a unit of ``unit`` images
and a batch of ``units`` units into the unified buffer and the accumulators (or raises
:class:`~firmware.compiler.layout.CompileError` naming the stage and the memory):
the input ring, each stage's output tensor, its weight-tile and parameter-set ids. The
helpers :func:`_runs` and :func:`_jobs` cut a stage's rows into MATMULs and jobs; the
emitter (:mod:`firmware.compiler.emitter`) writes programs from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware.compiler.layout import (
    CompileError,
    Tensor,
    _Layout,
    _paired,
    _PairedConv,
    _stage_layout,
)
from firmware.quant import QuantisedNetwork, Stage
from hdl.config import TPUConfig

#: Largest ``count`` field of an instruction.
COUNT_LIMIT = (1 << 16) - 1


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
          tile_ids=None, param_ids=None, ring: float = 2.0, pack: bool = True) -> _Plan:
    """The plan for ``unit`` images a unit and ``units`` a batch; the input ring holds
    ``ring`` units' rows (2: two buffers; less when later units may take the rows of the
    earlier passes of the unit being computed). A first convolution whose shifted passes
    make its input too large for the unified buffer gets a row per kernel tap group
    instead (the host's patches). ``pack``: a first convolution that a Dense reads computes
    several positions an accumulator row where they fit (:func:`_paired`); the plan's stages
    are the ones planned."""
    first_error = None
    paired = _paired(network, config) if pack else network
    for net in (paired, network) if paired is not network else (network,):
        # Shifted passes or not: a choice for a first convolution of one position a row
        # (a packed one has one pass, the same either way).
        first = net.stages[0]
        for shifts in ((True, False) if first.kind == "conv"
                       and not isinstance(first, _PairedConv) else (True,)):
            for spare in (True, False) if len(net.stages) > 1 else (False,):
                try:
                    return _plan_with(config, net, unit, units, ring, shifts, spare)
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
