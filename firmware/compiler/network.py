"""The compiled network and :func:`compile_stages`, which chooses its batching.

:class:`CompiledNetwork` holds a network's plan (:mod:`firmware.compiler.plan`) and tiles
for one configuration and implements the runtime's executable protocol: the setup program,
the batch programs (written by :mod:`firmware.compiler.emitter`), their decoding, and the
reports (estimate, profile, shape bounds, summary). :func:`compile_stages` checks its
arguments and picks the unit, the batch and the input ring, by the cycle model's estimates
(:func:`_choose`) unless given.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from firmware.asm import Program
from firmware.compiler.emitter import _Emitter
from firmware.compiler.layout import (
    CompileError,
    StageBound,
    _PairedConv,
    _stage_table,
    _sum_tables,
    _weight_tiles,
    window_form,
)
from firmware.compiler.plan import COUNT_LIMIT, MODES, _plan, _row_runs
from firmware.quant import QuantisedNetwork
from firmware.runtime import Batch
from hdl import isa
from hdl.config import TPUConfig

#: Batches in the program whose cycle model gives the estimate (:meth:`CompiledNetwork.estimate`).
TRIAL_BATCHES = 3

#: Most images one batch program takes by default (the runtime waits for a program's outputs
#: before it sends the next, so a program's first input transfer and last write-back are the
#: only ones the array does not hide).
PROGRAM_IMAGES = 1024


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
    pack : bool
        Whether a first convolution that a Dense reads may compute several positions an
        accumulator row (``compile_network``'s ``pack_positions``; the plan's first stage
        says whether it does).
    windows : bool
        Whether a first convolution reads its input as the tensor itself through window
        MATMULs where it can (``compile_network``'s ``windows``; the plan's first layout's
        ``tensor`` says whether it does).
    resident_weights, resident_params : bool
        Whether weights / parameters are loaded once by the setup program.
    tiles : ndarray, (n_tiles, rows, cols)
        Every weight tile, in tile-id order.
    """

    def __init__(self, config: TPUConfig, network: QuantisedNetwork, unit: int, units: int,
                 program_images: int = PROGRAM_IMAGES, ring: float = 2.0, pack: bool = True,
                 modes: tuple[str, ...] = MODES, windows: bool = True):
        self.config = config
        self.network = network
        self.unit, self.units = unit, units
        self.batch_size = unit * units
        self.program_images = max(program_images, self.batch_size)
        self.pack = pack
        self.modes = modes
        self.windows = windows
        self._plan = _plan(config, network, unit, units, ring=ring, pack=pack, modes=modes,
                           windows=windows)
        self.tiles, self._params, _, _ = _weight_tiles(
            config, [sp.stage for sp in self._plan.stages], self._plan.layouts)
        self.resident_weights = len(self.tiles) <= config.weight_mem_tiles
        #: Weight-memory slot of each tile the setup program loads (tile id -> slot): every
        #: tile at its id where all fit; else :func:`_resident_slots`'s, the rest streaming
        #: through the slots after them.
        self.tile_slots = _resident_slots(config, self._plan, self.tiles)
        #: The slots the streamed tiles take in turn (their loads wait for the reads).
        self.stream_slots = range(len(self.tile_slots) if not self.resident_weights else 0,
                                  config.weight_mem_tiles)
        self.resident_params = len(self._params) <= config.param_slots
        #: The programmable table the stages with function TABLE share (LOAD_TABLE in the
        #: setup program), or None.
        self.table = _stage_table(config, network)
        #: The sum tables the residual adds share (LOAD_TABLE in the setup program), or None
        #: (no add, or adds of other tables: each loads its own, :attr:`reload_sums`).
        self.sum_tables = _sum_tables(config, network)
        self.reload_sums = self.sum_tables is None and any(
            st.skip is not None for st in network.stages)

    # Setup ------------------------------------------------------------------------------

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_WEIGHTS and LOAD_PARAMS of what stays resident and the frames of padded
        tensors, then HALT; answers with the DONE beat only."""
        c = self.config
        p = Program(c)
        if self.resident_weights and len(self.tiles):
            p.load_weights(0, self.tiles, signed=True)
        elif self.tile_slots:
            for tile, slot in self.tile_slots.items():
                p.load_weights(slot, self.tiles[tile:tile + 1], signed=True)
        if self.resident_params:
            for slot, (bias, mult, shift, zp, clamp, rounding) in enumerate(self._params):
                p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                              rounding=rounding)
        if self.table is not None:
            p.load_table(self.table.tolist())
        if self.sum_tables is not None:
            for k, entries in enumerate(self.sum_tables):
                p.load_sum_table(k, entries.tolist())
        for sp in self._plan.stages:
            if sp.refresh:
                continue                 # its frame shares rows: each batch writes it
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
        if lay.tensor is not None:
            # The tensor itself, framed in its zero point, ub_row elements a row.
            top, bottom, left, right = lay.tensor.frame
            xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)),
                        constant_values=zp).reshape(unit, -1)
            size = lay.tensor.rows * c.ub_row
            flat = np.full((unit, size), zp, dtype=np.int64)
            flat[:, :xp.shape[1]] = xp
            return flat.reshape(-1, c.ub_row)
        if lay.host is None:
            flat = x.reshape(unit, -1)
            return np.concatenate([flat[:, ps.k_rows.clip(0)] * (ps.k_rows >= 0)
                                   for ps in lay.passes]).astype(np.int64)
        kh, kw, cin, _ = st.weight.shape
        ay, ax, ii = lay.host.anchors.T
        top, bottom, left, right = st.padding
        # The padded input, extended with the zero point past the anchors' reach.
        hpad = max(int(ay.max()) * st.stride + kh, x.shape[1] + top + bottom)
        wpad = max(int(ax.max()) * st.stride + kw, x.shape[2] + left + right)
        xp = np.full((unit, hpad, wpad, cin), zp, dtype=np.int64)
        xp[:, top:top + x.shape[1], left:left + x.shape[2]] = x
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
        the core (:class:`~.timing._Timing`): what a third batch adds to a program of two (the
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
        """Each stage's shape bound, per image (package notes, :mod:`firmware.compiler`)."""
        cells = self.config.rows * self.config.cols
        out = []
        for st, rows in zip(self.network.stages, self._trial.stage_rows, strict=True):
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
        weights = "resident" if self.resident_weights else \
            f"{len(self.tile_slots)} resident, the rest streamed per batch"
        lines = [f"{self.network.name} on {c.name}: {self.batch_size} images per batch "
                 f"({self.units} units of {self.unit}), {len(self.tiles)} weight tiles "
                 f"({weights}), "
                 f"{len(self._params)} parameter sets "
                 f"({'resident' if self.resident_params else 'loaded per ACTIVATE'}), "
                 f"{self.input_rows():g} input rows per image"]
        used = max([plan.ring] + [t.base + t.rows for sp in plan.stages for t in sp.outs])
        lines.append(f"  unified buffer: {plan.mode} layout, {used} of {c.ub_depth} rows: "
                     f"input ring 0..{plan.ring}, " + ", ".join(
                         f"{sp.stage.name} " + " and ".join(
                             f"{t.base}..{t.base + t.rows}" for t in sp.outs)
                         for sp in plan.stages))
        for st, sp, b in zip(self.network.stages, plan.stages, self.bounds(), strict=True):
            lay = sp.layout
            extra = " + maxpool 2x2" if st.pool else ""
            if st.kind == "conv" and st.stride > 1:
                extra += f", stride {st.stride}"
            if isinstance(sp.stage, _PairedConv):
                extra += f", {sp.stage.per_row} positions a row"
            if lay.tensor is not None:
                extra += ", its input the tensor itself (window MATMULs)"
            elif lay.host is not None:
                extra += ", its input the host's rows of taps"
            lines.append(f"  {st.name}: {st.kind} K={st.k} N={st.n}{extra} -> "
                         f"{len(lay.passes)} passes x {lay.col_blocks} column blocks, "
                         f"{st.func.name}; shape bound {100 * b.bound:.1f} % "
                         f"({b.useful_macs:,.0f} MACs in {b.slots:,.0f} slots per image)")
        lines.append(f"  network shape bound {100 * self.bound():.1f} %")
        return "\n".join(lines)


#: Input ring sizes (in units' rows) the compiler tries: two buffers first.
RINGS = (2.0, 1.5, 1.25, 1.0)


#: Weight-memory slots kept for the streamed tiles where the weights do not all fit (at least
#: the weight FIFO and the shadow tile's, so that the loads run ahead of the MATMULs).
STREAM_SLOTS = 8


def _resident_slots(config: TPUConfig, plan, tiles: np.ndarray) -> dict[int, int]:
    """Tile id -> weight-memory slot of the tiles the setup program loads. All of them at
    their ids where they fit. Otherwise, where the memory has room beyond the streaming
    slots (``max(STREAM_SLOTS, weight_fifo_depth + 2)``), as many tiles as fit in it, the
    ones a batch switches to most first: the first stage's (once a unit), then the others
    in order; all-zero tiles (passes left out) take none. The rest stream, every batch."""
    c = config
    if len(tiles) <= c.weight_mem_tiles:
        return {t: t for t in range(len(tiles))}
    room = c.weight_mem_tiles - max(STREAM_SLOTS, c.weight_fifo_depth + 2)
    if room <= 0:
        return {}
    used = tiles.reshape(len(tiles), -1).any(axis=1)
    first = [t for row in plan.stages[0].tiles for t in row]
    order = [t for t in dict.fromkeys(first + list(range(len(tiles)))) if used[t]]
    return {t: slot for slot, t in enumerate(order[:room])}


def _modes(config: TPUConfig, network: QuantisedNetwork, pack: bool,
           windows: bool = True) -> tuple[str, ...]:
    """The plan modes to choose among: the resident layout alone where one image fits it
    (its programs need no frame written per batch) and the weights stay resident, else every
    mode (where the weights stream through the weight memory, every batch sends them again,
    so the sharing layouts' larger batches may be worth their frames: the estimates
    decide)."""
    if not _fits(config, network, 1, 1, min(RINGS), pack, ("resident",), windows):
        return MODES
    one = CompiledNetwork(config, network, 1, 1, ring=min(RINGS), pack=pack,
                          modes=("resident",), windows=windows)
    return ("resident",) if one.resident_weights else MODES


def _choose(config: TPUConfig, network: QuantisedNetwork, max_batch: int,
            pack: bool = True, modes: tuple[str, ...] = MODES,
            windows: bool = True) -> tuple[int, int, float]:
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
                lo, hi = (mid, hi) if _fits(config, network, mid, 1, ring, pack, modes, windows) \
                    else (lo, mid - 1)
            if lo:
                return lo, 1, ring
    candidates = sorted({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                         config.rows, 2 * config.rows})
    seen: set = set()
    for ring in RINGS:
        fitting = []
        for unit in (u for u in candidates if u <= max_batch):
            if not _fits(config, network, unit, 1, ring, pack, modes, windows):
                break
            fitting.append(unit)
        for unit in fitting[-3:]:           # the largest units: longer MATMULs
            lo, hi = 1, max_batch // unit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _fits(config, network, unit, mid, ring, pack, modes, windows):
                    lo = mid
                else:
                    hi = mid - 1
            # Fewer units a batch may keep a spare block; more make a later stage's MATMULs
            # longer (a tile switch costs the array a row per array row).
            flat = 0            # window form: candidates in a row that did not improve
            for units in sorted({u for u in candidates if u < lo} | {lo}):
                cn = CompiledNetwork(config, network, unit, units, ring=ring, pack=pack,
                                     modes=modes, windows=windows)
                # A ring that gives the same rows as a larger one (the window form takes
                # whole units) is the same plan: its estimate would be the same, and the tie
                # goes to the larger ring, seen first.
                plan = cn._plan
                same = (unit, units, plan.ring, plan.mode, plan.spare)
                if same in seen:
                    continue
                seen.add(same)
                # Estimates within a per cent of each other count as a tie (the model's
                # error): then a spare block, a larger unit, ring and batch.
                key = (round(math.log(cn.estimate()) / math.log(1.01)), -plan.spare,
                       -unit, -ring, -cn.batch_size)
                if best is None or key < best[0]:
                    flat = 0 if best is None or key[0] < best[0][0] else flat + 1
                    best = (key, unit, units, ring)
                else:
                    flat += 1
                # The window form has one image a unit, so its batches grow to hundreds of
                # units, each estimate longer than the last: once two in a row gain nothing
                # the larger batches are not tried (a tie, at best).
                if plan.layouts[0].tensor is not None and flat >= 2:
                    break
    return best[1], best[2], best[3]


def _fits(config, network, unit, units, ring: float = 2.0, pack: bool = True,
          modes: tuple[str, ...] = MODES, windows: bool = True) -> bool:
    try:
        _plan(config, network, unit, units, ring=ring, pack=pack, modes=modes,
              windows=windows)
        return True
    except CompileError:
        return False


def compile_stages(network: QuantisedNetwork, config: TPUConfig, *,
                    batch_size: int | None = None, max_batch: int = 256,
                    unit: int | None = None, ring: float | None = None,
                    program_images: int = PROGRAM_IMAGES,
                    pack_positions: bool = True, windows: bool | None = None
                    ) -> CompiledNetwork:
    """Compile the stages of ``network`` for ``config`` as one chain in the unified buffer
    (:func:`firmware.compiler.compile_network` reaches it through the graph's lowering).

    ``batch_size``: images per batch, ``unit``: images per unit (a divisor of the batch);
    by default the compiler picks both, the batch up to ``max_batch`` images.
    ``program_images``: most images per batch program. ``pack_positions``: a first
    convolution that a Dense reads computes several output positions an accumulator row when
    its channels leave the columns room (fewer array rows and host rows; False: one position
    a row, the layout before it). ``windows``: a first convolution reads its input as the
    tensor itself through window MATMULs, one image a unit, where the core has them
    (``TPUConfig.conv_windows``) and the convolution's step fits (None, the default: so,
    unless it is max-pooled, whose windows would run two rows a MATMUL; False: the host's
    rows of taps, the layout before it; True: so, or a CompileError saying why not).
    Raises :class:`CompileError` naming the stage and the memory when even one image does
    not fit, for a graph the compiler cannot map, or for a uint8 network input on a core
    for int8 only (``operands="int8"``: quantise with ``input_signed=True``).
    """
    pack = bool(pack_positions)
    first = network.stages[0]
    if windows is True and first.kind == "conv":
        reason = window_form(config, first)
        if reason is not None:
            raise CompileError(f"{network.name}: windows=True, but stage {first.name} cannot "
                               f"read its input through window MATMULs: {reason}")
    # By default not under a fused max-pooling: its four positions must be consecutive
    # accumulator rows, so its window MATMULs would be two rows long (about five times the
    # cycles of the host's rows of taps on the digits CNN).
    windows = windows is True or (windows is None and not (first.kind == "conv" and first.pool))
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
        _plan(config, network, 1, 1, ring=min(RINGS), pack=pack, windows=windows)
    except CompileError as error:
        raise CompileError(f"{network.name} does not fit {config.name} even one image at a "
                           f"time: {error}") from None
    rings = RINGS if ring is None else (ring,)
    modes = _modes(config, network, pack, windows)
    if batch_size is not None:
        if unit is not None and batch_size % unit:
            raise CompileError(f"batch_size={batch_size} is not a multiple of unit={unit}")
        units_of = [unit] if unit is not None else \
            [u for u in range(min(batch_size, 4 * config.rows), 0, -1) if batch_size % u == 0]
        # The resident layout where it fits this batch, else the modes sharing rows.
        for ms in dict.fromkeys((modes, MODES)):
            for r in rings:                  # the largest unit at the largest ring that fits
                for u in units_of:
                    if _fits(config, network, u, batch_size // u, r, pack, ms, windows):
                        return CompiledNetwork(config, network, u, batch_size // u,
                                               program_images, r, pack, ms, windows)
        _plan(config, network, units_of[-1], batch_size // units_of[-1], ring=rings[-1],
              pack=pack, windows=windows)
    if unit is not None:
        for ms in dict.fromkeys((modes, MODES)):
            r = next((r for r in rings
                      if _fits(config, network, unit, 1, r, pack, ms, windows)), None)
            if r is not None:
                break
        else:
            _plan(config, network, unit, 1, ring=rings[-1], pack=pack, windows=windows)
        units = max(u for u in range(1, max(1, max_batch // unit) + 1)
                    if _fits(config, network, unit, u, r, pack, ms, windows))
        return CompiledNetwork(config, network, unit, units, program_images, r, pack, ms,
                               windows)
    unit, units, ring = _choose(config, network, max_batch, pack, modes, windows)
    return CompiledNetwork(config, network, unit, units, program_images, ring, pack, modes,
                           windows)
