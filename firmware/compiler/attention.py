r"""Attention's two products on the core, with the activation that serves as weights moved on
chip.

The array's stationary operand is a weight tile, and attention multiplies two activations:
``q @ k.T`` and ``p @ v``. UB_TO_WEIGHTS builds the tile from unified-buffer rows, so neither
``k.T`` nor ``v`` needs a transposition on the host or a LOAD_WEIGHTS of it:

- :class:`ScoresExecutable` runs a :class:`firmware.graph.AttentionScores`: ``k``'s rows
  moved transposed (tile column ``s`` is key ``s``), and softmax's exp after it where the
  core has the programmable table (LOAD_TABLE);
- :class:`MixExecutable` runs a :class:`firmware.graph.AttentionMix`: ``v``'s rows moved as
  they are (tile row ``s`` is token ``s``), ``p`` (uint8) streamed through the array.

Both are :class:`firmware.runtime.Executable`\ s, run by :func:`firmware.runtime.run`.

Tiling, per sequence and head (a *unit*), with ``T`` tokens, head size ``d``, an array of
``rows x cols``, for the scores (the mix is the same with ``p``'s key chunks and ``v``'s
channel blocks, :class:`MixExecutable`):

- the head's channels split into ``KC = ceil(d / rows)`` chunks; ``q``'s chunk ``kc`` and
  ``k``'s are each ``T`` unified-buffer rows (token ``t`` a row; channels ``kc * rows ..`` in
  its first ``rows`` elements, zeros after the head's last channel);
- the keys split into ``SB = ceil(T / cols)`` blocks of up to ``cols`` tokens. A *job* is one
  key block of one unit: for each chunk, UB_TO_WEIGHTS of the block's ``k`` rows into a tile,
  READ_WEIGHTS, MATMUL of the chunk's ``T`` ``q`` rows (accumulating after the first chunk)
  into the job's accumulator region; then ACTIVATE (the operator's requantisation, one
  parameter slot) into the job's output region and WRITE_HOST.

The program is software-pipelined, as the core issues in order: each tile is moved and read
two MATMULs ahead of the one that uses it (it shifts into the array while the MATMUL before
runs), and a job's ACTIVATE and WRITE_HOST follow the next job's first MATMUL, so they
overlap the array's work instead of holding the front end while the MATMUL drains. Jobs
rotate through up to four accumulator and output regions, tiles through the whole weight
memory (a move never waits for the READ_WEIGHTS of its tile's previous use); the core's
interlocks order whatever still meets.

A program holds as many sequences as fit in the unified buffer beside the output regions.
What does not fit raises :class:`firmware.compiler.CompileError` naming the operator and the
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from firmware.asm import Program
from firmware.compiler.layout import CompileError
from firmware.runtime import Batch
from hdl.config import TPUConfig
from hdl.isa import Func

__all__ = ["ScoresExecutable", "MixExecutable"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Chunk:
    """One MATMUL of a job: ``fetch`` emits what puts its weight tile into the weight queue
    (a UB_TO_WEIGHTS or LOAD_WEIGHTS and the READ_WEIGHTS), ``matmul`` the MATMUL."""
    fetch: Callable[[], None]
    matmul: Callable[[], None]
    #: The MATMUL's rows.
    rows: int = 0


@dataclass
class Job:
    """MATMULs into one accumulator region (``chunks``, accumulating after the first), then
    ``finish`` (its ACTIVATE, and a WRITE_HOST or LOAD_PARAMS as it needs). ``needs``: the
    jobs whose ``finish`` writes what this one's tiles or activations read."""
    chunks: list[Chunk]
    finish: Callable[[], None]
    needs: tuple[int, ...] = ()


def pipeline(jobs: list[Job], ahead: int, cover: int = 0) -> None:
    """Emit ``jobs`` software-pipelined for a core that issues in order: each chunk's tile
    fetched ``ahead`` chunks before its MATMUL (it shifts into the array while the MATMULs
    before run), and a job's finish after the next job's MATMULs of ``cover`` rows (its
    first MATMUL at least, its last at most), so its ACTIVATE, which waits for the job's
    last MATMUL to leave the array, overlaps the array's work instead of holding the front
    end while the MATMUL drains.

    An instruction only waits for those issued before it, so a chunk is never fetched
    before the jobs it ``needs`` are finished: their finish is issued early when all their
    MATMULs are, and the fetch waits for its own MATMUL otherwise."""
    items = [(j, c) for j, job in enumerate(jobs) for c in range(len(job.chunks))]
    last_item = {}
    for m, (j, _) in enumerate(items):
        last_item[j] = m
    state = {"finished": 0, "fetched": 0, "issued": -1}

    def finish_before(k: int) -> None:
        while state["finished"] < k:
            jobs[state["finished"]].finish()
            state["finished"] += 1

    def fetch_until(limit: int) -> None:
        while state["fetched"] < limit:
            j, c = items[state["fetched"]]
            needs = jobs[j].needs
            if needs and max(needs) >= state["finished"]:
                if last_item[max(needs)] > state["issued"]:
                    return          # its producers' MATMULs are not all in yet
                finish_before(max(needs) + 1)
            jobs[j].chunks[c].fetch()
            state["fetched"] += 1

    covered = 0
    for m, (j, c) in enumerate(items):
        fetch_until(min(m + 1 + ahead, len(items)))
        assert state["fetched"] > m, "a job needs a later one"
        chunk = jobs[j].chunks[c]
        chunk.matmul()
        state["issued"] = m
        covered = chunk.rows if c == 0 else covered + chunk.rows
        if j > 0 and (covered >= cover or c == len(jobs[j].chunks) - 1):
            finish_before(j)
    finish_before(len(jobs))


class _HeadsExecutable:
    """What both executables share: the checks, the regions, the parameter slot, and the
    software-pipelined program of *jobs*, each a few MATMULs (one per contraction chunk, its
    tile moved on chip) into an accumulator region, then ACTIVATE and WRITE_HOST."""

    #: What the operator's product needs (for the errors).
    product = ""

    def __init__(self, op, config: TPUConfig, tokens: int, channels: int, heads: int):

        self.op, self.config = op, config
        self.tokens, self.channels, self.heads = tokens, channels, heads
        name = op.name
        if not config.ub_to_weights:
            raise CompileError(f"{name}: the {config.name} core has no UB_TO_WEIGHTS "
                               f"(TPUConfig.ub_to_weights), which {self.product} on the "
                               f"core needs")
        if channels % heads:
            raise CompileError(f"{name}: {channels} channels do not split into {heads} heads")
        self.d = channels // heads
        req = op.requant
        if req.multiplier.size != 1 and not (req.multiplier == req.multiplier[0]).all():
            raise CompileError(f"{name}: one requantisation multiplier for every output is "
                               f"needed, not {req.multiplier.size}")
        t = tokens
        #: Tiles moved and read ahead of the MATMUL that uses them (within the weight
        #: queue), so the next tile is shifting in while a MATMUL runs.
        self.ahead = min(2, config.weight_fifo_depth)
        if 2 * t > config.acc_depth:
            raise CompileError(
                f"{name}: {t} tokens need two accumulator regions of {t} rows (a region per "
                f"job, two to overlap), {2 * t} rows; the {config.name} core's "
                f"accumulators hold {config.acc_depth}")
        self.unit_rows = self._unit_rows()
        seq_rows = heads * self.unit_rows
        #: Accumulator and output regions the jobs rotate through (up to 4: a job's
        #: ACTIVATE and WRITE_HOST run while the next ones' MATMULs do).
        self.regions = max(2, min(4, config.acc_depth // t,
                                  (config.ub_depth - seq_rows) // t))
        self.sequences_per_program = (config.ub_depth - self.regions * t) // seq_rows
        if self.sequences_per_program < 1:
            raise CompileError(
                f"{name}: one sequence needs {seq_rows} unified-buffer rows for its inputs "
                f"({heads} head(s) of {self.unit_rows} rows) and {2 * t} for the outputs, "
                f"{seq_rows + 2 * t}; the {config.name} core's unified buffer holds "
                f"{config.ub_depth}")

    #: A :class:`firmware.graph.Lookup` of the output, run by the activation unit's table.
    lookup = None

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_PARAMS of the requantisation into slot 0 (bias 0) and, with a lookup,
        LOAD_TABLE of its table; then HALT."""
        cfg, req = self.config, self.op.requant
        p = Program(cfg)
        p.load_params(0, [0] * cfg.cols, [int(req.multiplier[0])] * cfg.cols,
                      shift=int(req.shift[0]), zp=req.zero_point, clamp=req.clamp_hi,
                      rounding=req.rounding)
        if self.lookup is not None:
            p.load_table(self.lookup.table.tolist())
        p.halt()
        return p.beats, 1

    def _func(self) -> Func:
        """The jobs' ACTIVATE function: the operator's, or TABLE for a lookup."""
        return self.op.requant.func if self.lookup is None else Func.TABLE

    def _rows(self, values: np.ndarray) -> np.ndarray:
        """``(T, k)`` values as ``T`` buffer rows (zeros after them)."""
        rows = np.zeros((self.tokens, self.config.ub_row), dtype=np.int64)
        rows[:, :values.shape[1]] = values
        return rows

    def _emit(self, p: Program, units: int, jobs_per_unit: int, chunks: int, move,
              act_rows, signed: bool) -> int:
        """The pipelined jobs after the inputs are in: ``move(m, unit, job_in_unit, chunk,
        tile)`` emits item ``m``'s UB_TO_WEIGHTS, ``act_rows(unit, chunk)`` is the first
        buffer row of the MATMUL's activations. Returns the jobs."""
        cfg, t = self.config, self.tokens
        out_base = units * self.unit_rows
        regions, tiles = self.regions, cfg.weight_mem_tiles
        counter = iter(range(units * jobs_per_unit * chunks))

        def chunk(job: int, i: int, j: int, c: int) -> Chunk:
            def fetch() -> None:
                # Tile m mod the weight memory: a move never waits for its tile's
                # READ_WEIGHTS.
                m = next(counter)
                move(m, i, j, c, m % tiles)
                p.read_weights(m % tiles, 1)
            return Chunk(fetch, lambda: p.matmul(act_rows(i, c), (job % regions) * t, t,
                                                 switch=True, accumulate=c > 0,
                                                 signed=signed))

        def finish(job: int):
            def emit() -> None:
                out = out_base + (job % regions) * t
                p.activate((job % regions) * t, out, t, slot=0, func=self._func())
                p.write_host(out, t)
            return emit

        jobs = [Job([chunk(i * jobs_per_unit + j, i, j, c) for c in range(chunks)],
                    finish(i * jobs_per_unit + j))
                for i in range(units) for j in range(jobs_per_unit)]
        pipeline(jobs, self.ahead)
        p.halt()
        return len(jobs)

    def _out_rows(self, beats: list[int], jobs: int) -> np.ndarray:
        """The WRITE_HOST rows of ``jobs`` jobs: ``(jobs, T, cols)``, int8, or uint8 where a
        lookup's table holds values past 127."""
        cfg, t = self.config, self.tokens
        unsigned = self.lookup is not None and self.lookup.table.max() > 127
        raw = np.frombuffer(b"".join(int(v).to_bytes(cfg.ub_row, "little")
                                     for v in beats[:jobs * t]),
                            dtype=np.uint8 if unsigned else np.int8)
        return raw.reshape(jobs, t, cfg.ub_row)[..., :cfg.cols].astype(np.int64)


class ScoresExecutable(_HeadsExecutable):
    """:class:`firmware.graph.AttentionScores` ``op`` for ``tokens`` tokens of ``channels``
    channels (``heads`` of ``channels // heads``) on a core of ``config``. Its input, for
    :meth:`batches`, is ``q`` and ``k`` stacked: ``(n, 2, tokens, channels)`` int8; its
    output ``(n, heads, tokens, tokens)`` int8. With ``lookup`` (a
    :class:`firmware.graph.Lookup` of the scores, softmax's exp), the scores' ACTIVATE
    looks its table up (LOAD_TABLE in the setup program, function TABLE) and the output is
    the lookup's (uint8 where its table holds values past 127)."""

    product = "q @ k.T"

    def __init__(self, op, config: TPUConfig, tokens: int, channels: int, lookup=None):

        if lookup is not None:
            if not config.lookup_table:
                raise CompileError(f"{lookup.name}: the {config.name} core has no "
                                   f"programmable table (TPUConfig.lookup_table), which "
                                   f"running it with {op.name} needs")
            if op.requant.func != Func.IDENTITY:
                raise CompileError(f"{lookup.name}: {op.name}'s function is "
                                   f"{Func(op.requant.func).name}; a lookup after it on the "
                                   f"core needs IDENTITY (the table replaces the function)")
        self.lookup = lookup
        self.kc = _ceil_div(channels // max(op.heads, 1), config.rows)
        self.sb = _ceil_div(tokens, config.cols)
        super().__init__(op, config, tokens, channels, op.heads)

    def _unit_rows(self) -> int:
        return 2 * self.kc * self.tokens               # q's and k's chunks

    def batches(self, inputs: np.ndarray) -> Iterator[Batch]:
        x = np.asarray(inputs, dtype=np.int64)
        want = (2, self.tokens, self.channels)
        if x.shape[1:] != want:
            raise ValueError(f"{self.op.name}: inputs are {x.shape[1:]} per sequence; q and "
                             f"k stacked are {want}")
        if x.size and (x.min() < -128 or x.max() > 127):
            raise ValueError(f"{self.op.name}: q and k must be int8")
        per = self.sequences_per_program
        for start in range(0, len(x), per):
            yield self._program(x, [(b, h) for b in range(start, min(start + per, len(x)))
                                    for h in range(self.heads)])

    def _chunk(self, x: np.ndarray, b: int, which: int, h: int, kc: int) -> np.ndarray:
        """``T`` buffer rows of chunk ``kc`` of head ``h`` of q (``which`` 0) or k (1)."""
        rows = self.config.rows
        lo = h * self.d + kc * rows
        hi = min((h + 1) * self.d, lo + rows)
        return self._rows(x[b, which, :, lo:hi])

    def _program(self, x: np.ndarray, units: list[tuple[int, int]]) -> Batch:
        cfg = self.config
        t, kc_n, ur = self.tokens, self.kc, self.unit_rows
        p = Program(cfg)
        for i, (b, h) in enumerate(units):
            for kc in range(kc_n):
                p.read_host(i * ur + kc * t, self._chunk(x, b, 0, h, kc))
                p.read_host(i * ur + (kc_n + kc) * t, self._chunk(x, b, 1, h, kc))

        def move(m, i, sb, kc, tile):
            # k's rows of key block sb as the tile's columns: tile column s is key s.
            first = sb * cfg.cols
            p.ub_to_weights(i * ur + (kc_n + kc) * t + first, tile,
                            min(cfg.cols, t - first), transpose=True)

        jobs = self._emit(p, len(units), self.sb, kc_n, move,
                          lambda i, kc: i * ur + kc * t, signed=True)
        n_units = len(units)

        def decode(beats: list[int]) -> np.ndarray:
            rows = self._out_rows(beats, jobs).reshape(n_units, self.sb, t, cfg.cols)
            scores = rows.transpose(0, 2, 1, 3).reshape(n_units, t, self.sb * cfg.cols)
            return scores[..., :t].reshape(-1, self.heads, t, t)

        return Batch(beats=p.beats, output_beats=jobs * t + 1, instructions=p.instructions,
                     images=n_units // self.heads, decode=decode)


class MixExecutable(_HeadsExecutable):
    """:class:`firmware.graph.AttentionMix` ``op``: each head's ``p @ v`` with ``v`` moved
    into weight tiles on chip (as the tile's rows: tile row ``s`` is token ``s``), for
    ``tokens`` tokens and ``channels`` channels of ``v`` in ``heads`` heads. Its input, for
    :meth:`batches`, is ``p`` (uint8, ``(n, heads, tokens, tokens)``) and ``v`` (int8,
    ``(n, tokens, channels)``) flattened side by side, ``(n, heads * tokens**2 + tokens *
    channels)`` (:meth:`pack`); its output ``(n, tokens, channels)`` int8.

    Per head: ``p``'s keys split into ``ceil(T / rows)`` chunks (``T`` buffer rows each, the
    chunk's keys in a row's first ``rows`` elements) and ``v``'s channels into ``ceil(d /
    w)`` blocks of ``w = cols`` (``T`` buffer rows each, the block's channels first); a job
    is one block: per chunk, UB_TO_WEIGHTS of the chunk's tokens of the block (plain),
    READ_WEIGHTS and a MATMUL of ``p``'s chunk (uint8 activations).

    With the operator's ``normalise`` (``p`` is exp's weights ``e``), the blocks are ``w =
    cols - 1`` channels and each ``v`` row holds a 1 in its last element, so the tile's last
    column is ones and each accumulator row's last column sums its ``e`` row: the ACTIVATE's
    NORMALISE divides by it (the row scale, :attr:`~hdl.config.TPUConfig.row_scale`)."""

    product = "p @ v"

    def __init__(self, op, config: TPUConfig, tokens: int, channels: int, heads: int):

        if config.operands == "int8":
            raise CompileError(f"{op.name}: the probabilities are uint8, which the "
                               f"{config.name} core (operands='int8') refuses")
        self.normalise = op.normalise
        if self.normalise and not config.row_scale:
            raise CompileError(f"{op.name}: its division by the row sums needs NORMALISE, "
                               f"which the {config.name} core is built without "
                               f"(TPUConfig.row_scale)")
        if self.normalise and config.cols < 2:
            raise CompileError(f"{op.name}: NORMALISE divides by the row's last column, and "
                               f"the {config.name} core has one column; allowed: cols >= 2")
        #: Channels of v a job's block holds (the last column the row sums' with normalise).
        self.width = config.cols - 1 if self.normalise else config.cols
        self.sc = _ceil_div(tokens, config.rows)
        self.db = _ceil_div(channels // max(heads, 1), self.width)
        super().__init__(op, config, tokens, channels, heads)

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_PARAMS into slot 0 (bias 0; with ``normalise`` NORMALISE's shift and zero
        point, no multiplier), then HALT."""
        if not self.normalise:
            return super().setup_program()
        cfg, req = self.config, self.op.requant
        p = Program(cfg)
        p.load_params(0, [0] * cfg.cols, [0] * cfg.cols, shift=int(req.shift[0]),
                      zp=req.zero_point, clamp=req.clamp_hi, rounding=req.rounding)
        p.halt()
        return p.beats, 1

    def _func(self) -> Func:
        return Func.NORMALISE if self.normalise else super()._func()

    def _unit_rows(self) -> int:
        return (self.sc + self.db) * self.tokens       # p's chunks and v's blocks

    @staticmethod
    def pack(p: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``p`` and ``v`` as :meth:`batches` takes them."""
        p, v = np.asarray(p, np.int64), np.asarray(v, np.int64)
        return np.concatenate([p.reshape(len(p), -1), v.reshape(len(v), -1)], axis=1)

    def batches(self, inputs: np.ndarray) -> Iterator[Batch]:
        x = np.asarray(inputs, dtype=np.int64)
        t, c, h = self.tokens, self.channels, self.heads
        if x.ndim != 2 or x.shape[1] != h * t * t + t * c:
            raise ValueError(f"{self.op.name}: inputs are {x.shape[1:]} per sequence; p "
                             f"{(h, t, t)} and v {(t, c)} packed are ({h * t * t + t * c},)")
        p, v = x[:, :h * t * t].reshape(-1, h, t, t), x[:, h * t * t:].reshape(-1, t, c)
        if p.size and (p.min() < 0 or p.max() > 255):
            raise ValueError(f"{self.op.name}: p must be uint8")
        if v.size and (v.min() < -128 or v.max() > 127):
            raise ValueError(f"{self.op.name}: v must be int8")
        per = self.sequences_per_program
        for start in range(0, len(x), per):
            yield self._program(p, v, [(b, hh) for b in range(start, min(start + per, len(x)))
                                       for hh in range(h)])

    def _program(self, pr: np.ndarray, v: np.ndarray, units: list[tuple[int, int]]) -> Batch:
        cfg = self.config
        t, d, ur, sc_n = self.tokens, self.d, self.unit_rows, self.sc
        p = Program(cfg)
        for i, (b, h) in enumerate(units):
            for sc in range(sc_n):
                p.read_host(i * ur + sc * t,
                            self._rows(pr[b, h, :, sc * cfg.rows:(sc + 1) * cfg.rows]))
            for db in range(self.db):
                lo = h * d + db * self.width
                rows = self._rows(v[b, :, lo:min((h + 1) * d, lo + self.width)])
                if self.normalise:
                    rows[:, cfg.cols - 1] = 1       # the tile's column of ones: row sums
                p.read_host(i * ur + (sc_n + db) * t, rows)

        def move(m, i, db, sc, tile):
            # v's tokens of chunk sc, block db, as the tile's rows.
            first = sc * cfg.rows
            p.ub_to_weights(i * ur + (sc_n + db) * t + first, tile,
                            min(cfg.rows, t - first))

        jobs = self._emit(p, len(units), self.db, sc_n, move,
                          lambda i, sc: i * ur + sc * t, signed=False)
        n_units = len(units)

        def decode(beats: list[int]) -> np.ndarray:
            rows = self._out_rows(beats, jobs).reshape(n_units, self.db, t, cfg.cols)
            rows = rows[..., :self.width]
            out = rows.transpose(0, 2, 1, 3).reshape(n_units, t, self.db * self.width)[..., :d]
            out = out.reshape(-1, self.heads, t, d).transpose(0, 2, 1, 3)
            return out.reshape(-1, t, self.heads * d)

        return Batch(beats=p.beats, output_beats=jobs * t + 1, instructions=p.instructions,
                     images=n_units // self.heads, decode=decode)
