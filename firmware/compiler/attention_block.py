r"""Attention in one program: the q, k and v projections, each head's scores with softmax's
exp, and the normalised mix, with nothing crossing the host link between the projections
and the attention output.

:class:`AttentionBlockExecutable` runs what :func:`firmware.compiler.lowering.lower` fuses
into an :class:`~firmware.compiler.lowering.AttentionBlockStep`: three
:class:`~firmware.graph.FullyConnected` projections of one input, an
:class:`~firmware.graph.AttentionScores` of ``q`` and ``k``, a :class:`~firmware.graph.Lookup`
of the scores (exp, the activation unit's table) and a
normalised :class:`~firmware.graph.AttentionMix` of ``e`` and ``v``. Its input is the
projections' input ``(n, T, K)``, its output the attention output ``(n, T, H * d)``.

Each program holds ``S`` sequences (:attr:`~AttentionBlockExecutable.sequences_per_program`)
and runs three kinds of job (:class:`firmware.compiler.attention.Job`, emitted by
:func:`firmware.compiler.attention.pipeline`), with an array of ``rows x cols``:

- **Projection blocks**: the input's ``ceil(K / rows)`` channel chunks are each ``S * T``
  buffer rows; a block is one MATMUL per chunk of all ``S * T`` token rows with a resident
  weight tile, and its ACTIVATE writes ``S * T`` rows where the attention reads them. ``q``
  and ``k`` blocks hold ``kw = min(rows, cols)`` channels of a head (a scores chunk: the
  array's rows contract them); ``v`` blocks ``cols - 1`` channels and, in the last column, a
  1 (a zero weight column, bias 1, multiplier 1, shift 0), the column of ones that makes the
  mix's last accumulator column the row sum of ``e``.
- **Scores jobs**, per unit (sequence and head) and block of ``kb = min(rows, cols)`` keys:
  ``k``'s rows of the block moved transposed into a tile (UB_TO_WEIGHTS), ``q``'s rows through it,
  ACTIVATE with the table (exp) into ``e``'s buffer rows: the block's keys in a row's first
  ``kb`` elements, which is the layout the mix reads as its activations.
- **Mix jobs**, per unit and block of ``v``'s channels: per key block, ``v``'s rows
  of those keys moved into a tile as its rows and ``e``'s rows of those keys through it;
  ACTIVATE with NORMALISE (each row divided by its last column) and WRITE_HOST.

Scores and mix jobs each take a group of units (a sequence's head), about
:attr:`~AttentionBlockExecutable.JOB_ROWS` accumulator rows, requantised by one ACTIVATE: the
activation unit runs one at a time and each pays its pipeline's depth. The jobs run in the
order projections, then each group's scores a group ahead of its mix; each tile is fetched
two MATMULs ahead and a job's ACTIVATE follows the next job's first MATMULs
(:attr:`~AttentionBlockExecutable.COVER` rows); the core's interlocks order the rest.
The parameter sets of the scores and the mix stay in two slots loaded by the setup
program, with the table; the projections' sets take the other slots (in the setup program
too when they fit, else loaded during the projections). What does not fit (the sets' slots,
the tiles, the buffer, the accumulators) raises :class:`firmware.compiler.CompileError`
naming the block and the memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from firmware.asm import Program
from firmware.compiler.attention import Chunk, Job, _ceil_div, pipeline
from firmware.compiler.layout import CompileError
from firmware.runtime import Batch
from hdl.config import TPUConfig
from hdl.isa import Func

__all__ = ["AttentionBlockExecutable"]


class _Params:
    """A parameter set per projection block: bias, multiplier and per-column shifts for the
    ``cols`` columns, and the slot's scalars."""

    def __init__(self, cols: int, fc, columns: np.ndarray, ones: bool):
        req = fc.requant
        w = fc.weight[:, columns]
        folded = fc.bias[columns] - fc.input_zp * w.sum(axis=0)
        n = len(columns)
        self.bias = np.zeros(cols, np.int64)
        self.mult = np.zeros(cols, np.int64)
        self.shift = np.zeros(cols, np.int64)
        self.bias[:n], self.mult[:n] = folded, req.multiplier[columns]
        self.shift[:n] = req.shift[columns]
        if ones:        # the last column: 0 + 1, times 1, shift 0: the ones v carries
            self.bias[-1], self.mult[-1] = 1, 1
        self.uniform = bool((self.shift[:n] == self.shift[0]).all()) and not ones
        self.zp, self.clamp, self.rounding = req.zero_point, req.clamp_hi, req.rounding
        self.func = req.func

    def load(self, p: Program, slot: int) -> None:
        p.load_params(slot, self.bias, self.mult,
                      shift=int(self.shift[0]) if self.uniform else self.shift,
                      zp=self.zp, clamp=self.clamp, rounding=self.rounding)


class AttentionBlockExecutable:
    """The fused attention of :class:`~firmware.compiler.lowering.AttentionBlockStep`
    ``step`` (see the module notes) for ``tokens`` tokens of ``in_channels`` input
    channels, ``in_signed`` the input's type (int8, else uint8), on a core of ``config``. A
    :class:`firmware.runtime.Executable`: input ``(n, tokens, in_channels)``, output
    ``(n, tokens, channels)``."""

    #: Accumulator rows an attention job aims at (a few activation-unit depths).
    JOB_ROWS = 64
    #: MATMUL rows of the next job issued before a job's ACTIVATE (about the array's
    #: latency: the ACTIVATE waits for the job's last row to leave the array).
    COVER = 16

    def __init__(self, step, config: TPUConfig, tokens: int, in_channels: int,
                 in_signed: bool = True):

        q_fc, k_fc, v_fc = step.projections
        scores, mix = step.scores, step.mix
        self.step, self.config, self.tokens = step, config, tokens
        self.in_channels, self.in_signed = in_channels, in_signed
        name = step.name
        rows, cols = config.rows, config.cols
        need = [(config.ub_to_weights, "UB_TO_WEIGHTS (TPUConfig.ub_to_weights)"),
                (config.lookup_table, "the programmable table (TPUConfig.lookup_table)"),
                (config.row_scale, "NORMALISE (TPUConfig.row_scale)"),
                (config.operands != "int8", "uint8 operands (operands='int8' refuses e)"),
                (cols >= 2, "two columns or more (NORMALISE's divisor is the last)"),
                (config.param_slots >= 3, "three parameter slots or more (the scores', "
                                          "the mix's and a projection's)")]
        missing = [what for ok, what in need if not ok]
        if missing:
            raise CompileError(f"{name}: the {config.name} core lacks {', '.join(missing)}, "
                               f"which attention in one program needs")
        if not mix.normalise:
            raise CompileError(f"{name}: {mix.name} is not normalised; one program runs "
                               f"softmax's division after the product (NORMALISE)")
        table = step.lookup.table
        if table.min() < 0:
            raise CompileError(f"{name}: {step.lookup.name}'s table holds {table.min()}; the "
                               f"mix multiplies e as uint8 (0..255), so its entries must be "
                               f"non-negative")
        if scores.requant.func != Func.IDENTITY:
            raise CompileError(f"{name}: {scores.name}'s function is "
                               f"{Func(scores.requant.func).name}; the table replaces it "
                               f"(IDENTITY allowed)")
        m = scores.requant.multiplier
        if m.size != 1 and not (m == m[0]).all():
            raise CompileError(f"{name}: {scores.name} needs one requantisation multiplier")
        for fc in (q_fc, k_fc, v_fc):
            if fc.weight.shape[0] != in_channels:
                raise CompileError(f"{name}: {fc.name} takes {fc.weight.shape[0]} channels, "
                                   f"the input has {in_channels}")
            if fc.requant.zero_point != 0:
                raise CompileError(f"{name}: {fc.name}'s output zero point is "
                                   f"{fc.requant.zero_point}; attention's products take 0")
        if v_fc.requant.clamp_hi < 1:
            raise CompileError(f"{name}: {v_fc.name} clamps at {v_fc.requant.clamp_hi}, "
                               f"below the 1 its column of ones needs")
        c = q_fc.weight.shape[1]
        heads = scores.heads
        if k_fc.weight.shape[1] != c or v_fc.weight.shape[1] != c or c % heads:
            raise CompileError(f"{name}: q, k and v have {q_fc.weight.shape[1]}, "
                               f"{k_fc.weight.shape[1]} and {v_fc.weight.shape[1]} channels; "
                               f"equal and a multiple of {heads} heads needed")
        self.channels, self.heads, self.d = c, heads, c // heads
        t, d = tokens, self.d
        self.kw = self.kb = min(rows, cols)         # a chunk's channels; a block's keys
        self.ic = _ceil_div(in_channels, rows)      # the input's chunks
        self.kc = _ceil_div(d, self.kw)             # q's and k's chunks per head
        self.sb = _ceil_div(t, self.kb)             # key blocks
        self.width = cols - 1                       # v's channels per block
        self.db = _ceil_div(d, self.width)           # v's blocks per head
        self.ahead = min(2, config.weight_fifo_depth)

        # The projection blocks: (kind, fc, head, block, columns); v's carry a column of ones.
        self.blocks = []
        for kind, fc, width, per in (("q", q_fc, self.kw, self.kc), ("k", k_fc, self.kw, self.kc),
                                     ("v", v_fc, self.width, self.db)):
            for h in range(heads):
                for blk in range(per):
                    lo = h * d + blk * width
                    columns = np.arange(lo, min(lo + width, (h + 1) * d))
                    self.blocks.append((kind, fc, h, blk, columns))
        self.params = [_Params(cols, fc, columns, kind == "v")
                       for kind, fc, _, _, columns in self.blocks]
        tiles_used = len(self.blocks) * self.ic
        if tiles_used + 2 * self.ahead + 2 > config.weight_mem_tiles:
            raise CompileError(
                f"{name}: the projections' {tiles_used} weight tiles and {2 * self.ahead + 2} "
                f"for the moved ones need {tiles_used + 2 * self.ahead + 2}; the "
                f"{config.name} core's weight memory holds {config.weight_mem_tiles}")
        self.tiles_used = tiles_used
        #: Projection sets resident (loaded by the setup program) when they fit.
        self.proj_slots = config.param_slots - 2
        self.resident_params = len(self.blocks) <= self.proj_slots

        per_seq = t * (self.ic + heads * (2 * self.kc + self.db + self.sb))
        #: Units (a sequence's head) per attention job: its MATMULs write consecutive
        #: accumulator regions and one ACTIVATE (the activation unit takes one at a time, and
        #: each pays its pipeline's depth) requantises them all.
        self.group = max(1, _ceil_div(self.JOB_ROWS, t * max(self.sb, self.db)))
        while True:
            g_rows = self.group * max(self.sb, self.db) * t     # an attention job's rows
            out_rows = 2 * self.group * self.db * t             # two output regions
            s = min((config.ub_depth - out_rows) // per_seq,
                    (config.acc_depth - 2 * g_rows) // (2 * t))
            if s >= 1 or self.group == 1:
                break
            self.group = 1
        if s < 1:
            raise CompileError(
                f"{name}: one sequence needs {per_seq} unified-buffer rows (the input, q, k, "
                f"v and e) and {out_rows} for the outputs, {per_seq + out_rows}, and "
                f"{2 * t + 2 * g_rows} accumulator rows; the {config.name} core has "
                f"{config.ub_depth} and {config.acc_depth}")
        self.sequences_per_program = s
        self.per_sequence_rows = per_seq

    # Layout --------------------------------------------------------------------------------

    def _bases(self, s: int) -> dict[str, int]:
        """First buffer row of each region for ``s`` sequences."""
        t, h = self.tokens, self.heads
        sizes = {"in": self.ic, "q": h * self.kc, "k": h * self.kc, "v": h * self.db,
                 "e": h * self.sb}
        bases, row = {}, 0
        for key, chunks in sizes.items():
            bases[key] = row
            row += chunks * s * t
        bases["out"] = row
        return bases

    # The executable ------------------------------------------------------------------------

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_PARAMS of the scores' set (slot ``P - 2``, bias 0) and the mix's (``P - 1``,
        NORMALISE's shift and zero point), the projections' when they fit, LOAD_TABLE of
        exp's table; then HALT."""
        cfg, p = self.config, Program(self.config)
        slots = cfg.param_slots
        sreq, mreq = self.step.scores.requant, self.step.mix.requant
        p.load_params(slots - 2, [0] * cfg.cols, [int(sreq.multiplier[0])] * cfg.cols,
                      shift=int(sreq.shift[0]), zp=sreq.zero_point, clamp=sreq.clamp_hi,
                      rounding=sreq.rounding)
        p.load_params(slots - 1, [0] * cfg.cols, [0] * cfg.cols, shift=int(mreq.shift[0]),
                      zp=mreq.zero_point, clamp=mreq.clamp_hi, rounding=mreq.rounding)
        if self.resident_params:
            for slot, params in enumerate(self.params):
                params.load(p, slot)
        p.load_table(self.step.lookup.table.tolist())
        tiles = np.zeros((self.tiles_used, cfg.rows, cfg.cols), np.int64)
        for b, (_, fc, _, _, columns) in enumerate(self.blocks):
            for ic in range(self.ic):
                w = fc.weight[ic * cfg.rows:(ic + 1) * cfg.rows, columns]
                tiles[b * self.ic + ic, :w.shape[0], :w.shape[1]] = w
        p.load_weights(0, tiles, signed=True)
        p.halt()
        return p.beats, 1

    def batches(self, inputs: np.ndarray) -> Iterator[Batch]:
        x = np.asarray(inputs, dtype=np.int64)
        want = (self.tokens, self.in_channels)
        if x.ndim != 3 or x.shape[1:] != want:
            raise ValueError(f"{self.step.name}: inputs are {x.shape[1:]} per sequence; "
                             f"{want} wanted")
        lo, hi = (-128, 127) if self.in_signed else (0, 255)
        if x.size and (x.min() < lo or x.max() > hi):
            raise ValueError(f"{self.step.name}: the input must be "
                             f"{'int8' if self.in_signed else 'uint8'}")
        per = self.sequences_per_program
        for start in range(0, len(x), per):
            yield self._program(x[start:start + per])

    def _program(self, x: np.ndarray) -> Batch:
        cfg = self.config
        rows, t, heads = cfg.rows, self.tokens, self.heads
        s = len(x)
        st = s * t
        base = self._bases(s)
        p = Program(cfg)
        for ic in range(self.ic):
            chunk = np.zeros((st, cfg.ub_row), np.int64)
            part = x[:, :, ic * rows:(ic + 1) * rows].reshape(st, -1)
            chunk[:, :part.shape[1]] = part
            p.read_host(base["in"] + ic * st, chunk)

        def block_row(kind: str, h: int, blk: int, b: int) -> int:
            per = self.db if kind == "v" else self.kc
            return base[kind] + ((h * per + blk) * s + b) * t

        jobs: list[Job] = []
        # Projection blocks: accumulator regions 0 and 1, S*T rows each.
        where: dict[tuple[str, int, int], int] = {}     # (kind, head, block) -> job
        for b_i, (kind, _, h, blk, _) in enumerate(self.blocks):
            where[(kind, h, blk)] = len(jobs)
            acc = (b_i % 2) * st

            def chunk(ic, b_i=b_i, acc=acc) -> Chunk:
                return Chunk(lambda: p.read_weights(b_i * self.ic + ic, 1),
                             lambda: p.matmul(base["in"] + ic * st, acc, st, switch=True,
                                              accumulate=ic > 0, signed=self.in_signed), st)

            dst = block_row(kind, h, blk, 0)

            def finish(b_i=b_i, acc=acc, dst=dst) -> None:
                # Each set is used once a program, in order: when they do not all fit, the
                # sets take the slots round-robin, each loaded just before its ACTIVATE.
                if self.resident_params:
                    slot = b_i
                else:
                    slot = b_i % self.proj_slots
                    self.params[b_i].load(p, slot)
                p.activate(acc, dst, st, slot=slot, func=self.params[b_i].func)

            jobs.append(Job([chunk(ic) for ic in range(self.ic)], finish))

        # Attention: jobs of `group` units, in accumulator regions after the projections'.
        units = [(b, h) for b in range(s) for h in range(heads)]
        group = min(self.group, len(units))
        groups = [range(g, min(g + group, len(units))) for g in range(0, len(units), group)]
        region = group * max(self.sb, self.db) * t
        acc_base = 2 * st
        acc_regions = (cfg.acc_depth - acc_base) // region
        score_slot, mix_slot = cfg.param_slots - 2, cfg.param_slots - 1
        counter = iter(range(1 << 30))
        free = cfg.weight_mem_tiles - self.tiles_used

        def moved(src: int, count: int, transpose: bool) -> None:
            tile = self.tiles_used + next(counter) % free
            p.ub_to_weights(src, tile, count, transpose=transpose)
            p.read_weights(tile, 1)

        scores_job: dict[int, int] = {}
        mix_count = [0]

        def scores(g: int) -> None:
            job = len(jobs)
            acc = acc_base + (job % acc_regions) * region
            chunks = []
            for n, i in enumerate(groups[g]):
                b, h = units[i]
                for sb in range(self.sb):
                    first = sb * self.kb
                    row = acc + (n * self.sb + sb) * t
                    chunks += [Chunk(lambda kc=kc, b=b, h=h, first=first: moved(
                                         block_row("k", h, kc, b) + first,
                                         min(self.kb, t - first), True),
                                     lambda kc=kc, b=b, h=h, row=row: p.matmul(
                                         block_row("q", h, kc, b), row, t, switch=True,
                                         accumulate=kc > 0, signed=True), t)
                               for kc in range(self.kc)]
            heads_in = {units[i][1] for i in groups[g]}
            needs = tuple(where[(kind, h, kc)] for kind in "qk" for h in sorted(heads_in)
                          for kc in range(self.kc))
            dst, count = base["e"] + groups[g][0] * self.sb * t, len(groups[g]) * self.sb * t
            jobs.append(Job(chunks, lambda: p.activate(acc, dst, count, slot=score_slot,
                                                       func=Func.TABLE), needs))
            scores_job[g] = job

        def mixes(g: int) -> None:
            job = len(jobs)
            acc = acc_base + (job % acc_regions) * region
            chunks = []
            for n, i in enumerate(groups[g]):
                b, h = units[i]
                for db in range(self.db):
                    row = acc + (n * self.db + db) * t
                    chunks += [Chunk(lambda sc=sc, b=b, h=h, db=db: moved(
                                         block_row("v", h, db, b) + sc * self.kb,
                                         min(self.kb, t - sc * self.kb), False),
                                     lambda sc=sc, i=i, row=row: p.matmul(
                                         base["e"] + (i * self.sb + sc) * t, row, t,
                                         switch=True, accumulate=sc > 0, signed=False), t)
                               for sc in range(self.sb)]
            count = len(groups[g]) * self.db * t

            def finish() -> None:
                out = base["out"] + (mix_count[0] % 2) * group * self.db * t
                mix_count[0] += 1
                p.activate(acc, out, count, slot=mix_slot, func=Func.NORMALISE)
                p.write_host(out, count)

            heads_in = {units[i][1] for i in groups[g]}
            jobs.append(Job(chunks, finish, (scores_job[g], *(
                where[("v", h, db)] for h in sorted(heads_in) for db in range(self.db)))))

        # Each group's scores a group ahead of its mix, so that e has been through the
        # activation unit by the time the mix's MATMULs issue.
        for g in range(len(groups) + 1):
            if g < len(groups):
                scores(g)
            if g > 0:
                mixes(g - 1)
        pipeline(jobs, self.ahead, self.COVER)
        p.halt()
        mix_jobs = len(units) * self.db

        def decode(beats: list[int]) -> np.ndarray:
            raw = np.frombuffer(b"".join(int(v).to_bytes(cfg.ub_row, "little")
                                         for v in beats[:mix_jobs * t]), dtype=np.int8)
            out = raw.reshape(len(units), self.db, t, cfg.ub_row)[..., :self.width]
            out = out.astype(np.int64).transpose(0, 2, 1, 3).reshape(
                len(units), t, self.db * self.width)[..., :self.d]
            out = out.reshape(s, heads, t, self.d).transpose(0, 2, 1, 3)
            return out.reshape(s, t, self.channels)

        return Batch(beats=p.beats, output_beats=mix_jobs * t + 1,
                     instructions=p.instructions, images=s, decode=decode)

    def host_rows(self) -> tuple[int, int]:
        """Buffer rows a sequence sends to the core (its input) and gets back (the attention
        output): nothing else of the block crosses the link."""
        return self.ic * self.tokens, self.heads * self.db * self.tokens
