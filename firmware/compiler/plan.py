"""The plan of a compiled network: where every stage's input, output and tiles go.

:func:`_plan` fits the layouts (:mod:`firmware.compiler.layout`) of a unit of ``unit`` images
and a batch of ``units`` units into the unified buffer and the accumulators (or raises
:class:`~firmware.compiler.layout.CompileError` naming the stage and the memory):
the input ring, each stage's output tensor, its weight-tile and parameter-set ids. The
helpers :func:`_runs` and :func:`_jobs` cut a stage's rows into MATMULs and jobs; the
emitter (:mod:`firmware.compiler.emitter`) writes programs from the plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from firmware.compiler.layout import (
    CompileError,
    Tensor,
    _Layout,
    _paired,
    _PairedConv,
    _stage_layout,
    window_form,
)
from firmware.quant import QuantisedNetwork, Stage
from hdl import isa
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
    refresh: bool = False           # its output shares rows: each batch writes its frame
    skip: Tensor | None = None      # a residual add: the earlier stage's output it reads


@dataclass(frozen=True)
class _Plan:
    unit: int
    units: int
    stages: list[_StagePlan]
    in_rows: int                    # rows of one unit of the network input
    ring: int                       # rows of the input ring
    layouts: list                   # every stage's _Layout
    spare: bool                     # the first stage's output has a block to spare
    mode: str = "resident"          # one of MODES

    @property
    def batch(self) -> int:
        return self.unit * self.units


def _layouts(config: TPUConfig, network: QuantisedNetwork, unit: int,
             shifts: bool | str = True) -> list[_Layout]:
    """Every stage's layout over one unit (``shifts``: a first convolution's taps that its
    rows do not hold come from shifted passes, else from more rows). Kept on the network:
    the plans of every batch, ring and mode the compiler tries share them."""
    cache = network.__dict__.setdefault("_layouts", {})
    key = (config, unit, shifts, tuple(map(id, network.stages)))
    if key not in cache:
        cache[key] = _stage_layouts(config, network, unit, shifts)
    return cache[key]


def _stage_layouts(config: TPUConfig, network: QuantisedNetwork, unit: int,
                   shifts: bool | str) -> list[_Layout]:
    layouts = []
    stages = network.stages
    width_in = config.rows
    prev = None
    outs = []           # every stage's output, as `prev` (a residual add's skip reads one)
    for index, st in enumerate(stages):
        last = index == len(stages) - 1
        skip = outs[st.skip] if st.skip is not None and st.skip < index else None
        lay = _stage_layout(config, st, index, unit, width_in, prev, last, shifts, skip)
        layouts.append(lay)
        frame = _frame(stages, index)
        h, w = st.out_shape[:2] if len(st.out_shape) == 3 else (1, 1)
        pitch = w + frame[2] + frame[3]
        prev = (lay.col_blocks, (h + frame[0] + frame[1]) * pitch, pitch, frame, st.n)
        outs.append(prev)
        width_in = lay.out_width
    return layouts


def _frame(stages: list[Stage], index: int) -> tuple[int, int, int, int]:
    """The frame around stage ``index``'s output (top, bottom, left, right): the padding of
    a convolution reading it."""
    nxt = stages[index + 1] if index + 1 < len(stages) else None
    return nxt.padding if nxt is not None and nxt.kind == "conv" else (0, 0, 0, 0)


#: How the plan places the tensors, tried in this order (package notes, "Buffer layout"):
#: ``resident``, every tensor in rows of its own; ``reuse``, the stages between the first and
#: the last share rows by liveness; ``sequential``, the input ring too, the batches one after
#: another.
MODES = ("resident", "reuse", "sequential")


def _plan(config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
          tile_ids=None, param_ids=None, ring: float = 2.0, pack: bool = True,
          modes: tuple[str, ...] = MODES, windows: bool = True) -> _Plan:
    """The plan for ``unit`` images a unit and ``units`` a batch; the input ring holds
    ``ring`` units' rows (2: two buffers; less when later units may take the rows of the
    earlier passes of the unit being computed). A first convolution whose shifted passes
    make its input too large for the unified buffer gets a row per kernel tap group
    instead (the host's patches). ``pack``: a first convolution that a Dense reads computes
    several positions an accumulator row where they fit (:func:`_paired`); the plan's stages
    are the ones planned. The first of ``modes`` (:data:`MODES`) that fits is the plan's;
    the error raised is the last mode's, whose rule is the loosest.

    ``windows``: a first convolution that can (:func:`~firmware.compiler.layout.window_form`)
    reads its input as the tensor itself, through window MATMULs, one image a unit: then no
    other form is tried, so that the input crosses the link as it is."""
    first = network.stages[0]
    if windows and first.kind == "conv" and window_form(config, first) is None:
        forms = [(network, "windows")]
    else:
        paired = network
        if pack:
            # The packed form, made once per configuration (its layouts are kept on it).
            cache = network.__dict__.setdefault("_paired", {})
            key = (config, tuple(map(id, network.stages)))
            if key not in cache:
                cache[key] = _paired(network, config)
            paired = cache[key]
        # Shifted passes or not: a choice for a first convolution of one position a row (a
        # packed one has one pass, the same either way).
        forms = [(net, shifts) for net in ((paired, network) if paired is not network
                                           else (network,))
                 for shifts in ((True, False) if net.stages[0].kind == "conv"
                                and not isinstance(net.stages[0], _PairedConv) else (True,))]
    error = None
    for mode in modes:
        first_error = None
        for net, shifts in forms:
            spares = (True, False) if len(net.stages) > 1 and mode != "sequential" \
                else (False,)
            for spare in spares:
                try:
                    return _plan_with(config, net, unit, units, ring, shifts, spare, mode)
                except CompileError as e:
                    first_error = first_error or e
        error = first_error
    raise error


def _place(chain: list[Tensor], lo: int, depth: int) -> list[Tensor]:
    """``chain``'s tensors placed in rows ``lo..depth`` where each one is live only beside
    its neighbours in the chain (the stage that writes it and the one that reads it): the
    even ones from ``lo`` up, the odd ones from ``depth`` down, so that each pair of
    neighbours shares no row if their rows add up to at most ``depth - lo``."""
    out = []
    for k, t in enumerate(chain):
        base = lo if k % 2 == 0 else depth - t.rows
        out.append(dataclasses.replace(t, base=base))
    return out


def _plan_with(config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
               ring: float, shifts: bool | str, spare: bool, mode: str = "resident") -> _Plan:
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
    n_stages = len(stages)
    first = layouts[0]
    if first.tensor is not None:
        # Whole units: a window MATMUL's rows do not wrap around the ring's end.
        in_rows = first.tensor.rows * unit
        ring_rows = in_rows * max(1, int(ring))
    else:
        in_rows = (len(first.host.chunks) * len(first.host.anchors)
                   if first.host is not None else len(first.passes) * unit)
        ring_rows = max(in_rows, int(np.ceil(ring * in_rows)))
    sequential = mode == "sequential"
    # Every stage's output tensor(s), placed at row 0 for now (the last stage's has two
    # buffers, so that a batch's write-back overlaps the next batch, unless the batches run
    # one after another).
    tensors: list[list[Tensor]] = []
    for index, (st, lay) in enumerate(zip(stages, layouts, strict=True)):
        last = index == n_stages - 1
        frame = _frame(stages, index)
        h, w = st.out_shape[:2] if len(st.out_shape) == 3 else (1, 1)
        pitch = w + frame[2] + frame[3]
        positions = (h + frame[0] + frame[1]) * pitch
        # The first stage's output is a ring of one block more than a batch (when it
        # fits), so that the next batch's first unit can run before the later stages
        # read this batch's; of two batches where a residual add reads it (its skip), so
        # that the next batch's first stage, which runs beside this batch's later stages,
        # writes none of this batch's blocks before the add has read them.
        skip_source = any(s.skip == index for s in stages)
        blocks = (2 * units if skip_source else units + 1) if index == 0 and spare else units
        tensors.append([Tensor(0, lay.col_blocks, positions, unit, blocks, lay.out_width,
                               st.n, h, pitch, frame)
                        for _ in range(2 if last and not sequential else 1)])
    ring_t = Tensor(0, 1, ring_rows, 1, 1, c.rows, c.rows)   # the input ring's rows

    def stack(items, top):
        placed = []
        for tensor in items:
            placed.append(dataclasses.replace(tensor, base=top))
            top += tensor.rows
        return placed, top

    def refuse(what: str, need: int) -> CompileError:
        parts = ", ".join(f"{st.name} {sum(x.rows for x in ts)}"
                          for st, ts in zip(stages, tensors, strict=True))
        return CompileError(
            f"{what}: the unified buffer needs {need} rows ({mode} layout: the input ring "
            f"{ring_rows} ({in_rows} rows for {unit} image(s) at a time), the stage outputs "
            f"for {batch} image(s): {parts}); the configuration has ub_depth={c.ub_depth}")

    if mode == "resident":
        top = ring_rows                            # the input ring at the bottom
        for index, st in enumerate(stages):
            tensors[index], top = stack(tensors[index], top)
            if top > c.ub_depth:
                raise refuse(f"stage {st.name}", top)
        shared = [False] * n_stages
    else:
        # Always live: the input ring (unless sequential), the first stage's output when the
        # next batch writes it before this one's second stage has read it (spare), the last
        # stage's two buffers. The rest form a chain, each live from the stage that writes
        # it to the one that reads it.
        if sequential:
            always, chain = [], list(range(-1, n_stages))
        else:
            always = ([0] if spare else []) + [n_stages - 1]
            chain = list(range(1 if spare else 0, n_stages - 1))
        # A residual add's skip tensor lives from its stage to the add: always, out of the
        # chain (its neighbours then share no rows with each other either, which is safe).
        sources = sorted({st.skip for st in stages if st.skip is not None} - set(always))
        always += sources
        chain = [i for i in chain if i not in sources]
        top = 0 if sequential else ring_rows
        for index in always:
            tensors[index], top = stack(tensors[index], top)
            if top > c.ub_depth:
                raise refuse(f"stage {stages[index].name}", top)
        members = [ring_t if i < 0 else tensors[i][0] for i in chain]
        sizes = [m.rows for m in members]
        for k, (i, rows) in enumerate(zip(chain, sizes, strict=True)):
            # A tensor and its reader's output share the rows left above the always-live.
            pair = rows + (sizes[k + 1] if k + 1 < len(sizes) else 0)
            if top + pair > c.ub_depth:
                what = ("the input ring" if i < 0 else f"stage {stages[i].name}") + \
                    ("" if k + 1 == len(sizes) else
                     f" and stage {stages[chain[k + 1]].name}")
                raise refuse(what, top + pair)
        placed = _place(members, top, c.ub_depth)
        for i, tensor in zip(chain, placed, strict=True):
            if i < 0:
                if tensor.base != 0:
                    raise CompileError("the input ring must start at row 0")
            else:
                tensors[i] = [tensor]
        # A tensor that shares rows with another has its frame written again before each
        # batch's stage writes it (the setup program's frame would not survive).
        spans = [(i, t.base, t.base + t.rows) for i, ts in enumerate(tensors) for t in ts]
        if sequential:
            spans.append((-1, 0, ring_rows))
        shared = [any(j != i and a < hi and lo_ < b for j, a, b in spans)
                  for i, lo_, hi in ((i, ts[0].base, ts[-1].base + ts[-1].rows)
                                     for i, ts in enumerate(tensors))]
    plans = []
    for index, (st, lay) in enumerate(zip(stages, layouts, strict=True)):
        step = min(c.acc_depth // 2, COUNT_LIMIT) // lay.window * lay.window
        if step < lay.window:
            raise CompileError(f"stage {st.name}: a pooling window of {lay.window} rows does "
                               f"not fit half the accumulators (acc_depth={c.acc_depth})")
        plans.append(_StagePlan(st, index, lay, ring_rows if index == 0 else None,
                                tensors[index - 1][0] if index else None, tensors[index],
                                tile_ids[index], param_ids[index], shared[index],
                                tensors[st.skip][0] if st.skip is not None else None))
    return _Plan(unit, units, plans, in_rows, ring_rows, layouts, spare, mode)


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


def _window_runs(elements: np.ndarray, step: int, config: TPUConfig
                 ) -> list[tuple[int, int, int, tuple[int, int], int]]:
    """``(first accumulator row, first unified-buffer row, rows, (lane, step), rows read)``
    of the window MATMULs whose windows start at ``elements`` (one per accumulator row,
    absolute, -1: none): runs of windows ``step`` elements apart."""
    c = config
    out = []
    n = len(elements)
    i = 0
    while i < n:
        if elements[i] < 0:
            i += 1
            continue
        j = i + 1
        while j < n and j - i < COUNT_LIMIT and elements[j] == elements[j - 1] + step:
            j += 1
        first = int(elements[i])
        lane = first % c.ub_row
        out.append((i, first // c.ub_row, j - i, (lane, step),
                    isa.window_rows(lane, step, j - i, c.rows, c.ub_row)))
        i = j
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


def _row_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Sorted rows as (first, count) runs of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][0] + runs[-1][1] == r:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((int(r), 1))
    return runs
