"""Attention's first product on the core: each head's ``q @ k.T``, with ``k.T`` made on chip.

:class:`ScoresExecutable` runs a :class:`firmware.graph.AttentionScores` operator as core
programs (it is an :class:`firmware.runtime.Executable`, run by :func:`firmware.runtime.run`).
The array's stationary operand is a weight tile, so ``q @ k.T`` needs ``k.T`` in the weight
memory; UB_TO_WEIGHTS with ``transpose`` builds it from ``k``'s unified-buffer rows, so ``k``
goes through the array without a transposition on the host or a LOAD_WEIGHTS of it.

Tiling, per sequence and head (a *unit*), with ``T`` tokens, head size ``d``, an array of
``rows x cols``:

- the head's channels split into ``KC = ceil(d / rows)`` chunks; ``q``'s chunk ``kc`` and
  ``k``'s are each ``T`` unified-buffer rows (token ``t`` a row; channels ``kc * rows ..`` in
  its first ``rows`` elements, zeros after the head's last channel);
- the keys split into ``SB = ceil(T / cols)`` blocks of up to ``cols`` tokens. A *job* is one
  key block of one unit: for each chunk, UB_TO_WEIGHTS of the block's ``k`` rows into a tile
  (transposed: tile column ``s`` is key ``s``), READ_WEIGHTS, MATMUL of the chunk's ``T``
  ``q`` rows (accumulating after the first chunk) into the job's accumulator region; then
  ACTIVATE (the operator's requantisation, one parameter slot) into the job's output region
  and WRITE_HOST.

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

from collections.abc import Iterator

import numpy as np

from firmware.asm import Program
from firmware.runtime import Batch
from hdl.config import TPUConfig

__all__ = ["ScoresExecutable"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class ScoresExecutable:
    """:class:`firmware.graph.AttentionScores` ``op`` for ``tokens`` tokens of ``channels``
    channels (``heads`` of ``channels // heads``) on a core of ``config``. Its input, for
    :meth:`batches`, is ``q`` and ``k`` stacked: ``(n, 2, tokens, channels)`` int8; its
    output ``(n, heads, tokens, tokens)`` int8."""

    def __init__(self, op, config: TPUConfig, tokens: int, channels: int):
        from firmware.compiler import CompileError

        self.op, self.config = op, config
        self.tokens, self.channels, self.heads = tokens, channels, op.heads
        name = op.name
        if not config.ub_to_weights:
            raise CompileError(f"{name}: the {config.name} core has no UB_TO_WEIGHTS "
                               f"(TPUConfig.ub_to_weights), which q @ k.T on the core needs")
        if channels % self.heads:
            raise CompileError(f"{name}: {channels} channels do not split into "
                               f"{self.heads} heads")
        self.d = channels // self.heads
        self.kc = _ceil_div(self.d, config.rows)
        self.sb = _ceil_div(tokens, config.cols)
        req = op.requant
        if req.multiplier.size != 1 and not (req.multiplier == req.multiplier[0]).all():
            raise CompileError(f"{name}: one requantisation multiplier for every score is "
                               f"needed, not {req.multiplier.size}")
        t = tokens
        #: Tiles moved and read ahead of the MATMUL that uses them (within the weight
        #: queue), so the next tile is shifting in while a MATMUL runs.
        self.ahead = min(2, config.weight_fifo_depth)
        if 2 * t > config.acc_depth:
            raise CompileError(
                f"{name}: {t} tokens need two accumulator regions of {t} rows (a region per "
                f"key block, two to overlap), {2 * t} rows; the {config.name} core's "
                f"accumulators hold {config.acc_depth}")
        self.unit_rows = 2 * self.kc * t               # q's and k's chunks
        seq_rows = self.heads * self.unit_rows
        #: Accumulator and output regions the jobs rotate through (up to 4: a job's
        #: ACTIVATE and WRITE_HOST run while the next ones' MATMULs do).
        self.regions = max(2, min(4, config.acc_depth // t,
                                  (config.ub_depth - seq_rows) // t))
        self.sequences_per_program = (config.ub_depth - self.regions * t) // seq_rows
        if self.sequences_per_program < 1:
            raise CompileError(
                f"{name}: one sequence needs {seq_rows} unified-buffer rows for q and k "
                f"({self.heads} head(s) of {self.kc} chunk(s) of {t} tokens, each twice) and "
                f"{2 * t} for the scores, {seq_rows + 2 * t}; the {config.name} core's "
                f"unified buffer holds {config.ub_depth}")

    # Executable --------------------------------------------------------------------------

    def setup_program(self) -> tuple[list[int], int]:
        """LOAD_PARAMS of the requantisation into slot 0 (bias 0), then HALT."""
        cfg, req = self.config, self.op.requant
        p = Program(cfg)
        p.load_params(0, [0] * cfg.cols, [int(req.multiplier[0])] * cfg.cols,
                      shift=int(req.shift[0]), zp=req.zero_point, clamp=req.clamp_hi,
                      rounding=req.rounding)
        p.halt()
        return p.beats, 1

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

    # The program -------------------------------------------------------------------------

    def _chunk(self, x: np.ndarray, b: int, which: int, h: int, kc: int) -> np.ndarray:
        """``T`` buffer rows of chunk ``kc`` of head ``h`` of q (``which`` 0) or k (1)."""
        cfg = self.config
        lo = h * self.d + kc * cfg.rows
        hi = min((h + 1) * self.d, lo + cfg.rows)
        rows = np.zeros((self.tokens, cfg.ub_row), dtype=np.int64)
        rows[:, :hi - lo] = x[b, which, :, lo:hi]
        return rows

    def _program(self, x: np.ndarray, units: list[tuple[int, int]]) -> Batch:
        cfg = self.config
        t, kc_n = self.tokens, self.kc
        p = Program(cfg)
        for i, (b, h) in enumerate(units):
            base = i * self.unit_rows
            for kc in range(kc_n):
                p.read_host(base + kc * t, self._chunk(x, b, 0, h, kc))
                p.read_host(base + (kc_n + kc) * t, self._chunk(x, b, 1, h, kc))
        out_base = len(units) * self.unit_rows
        regions = self.regions
        # Every MATMUL of the program in order: (job, unit, key block, chunk).
        items = [(i * self.sb + sb, i, sb, kc) for i in range(len(units))
                 for sb in range(self.sb) for kc in range(kc_n)]
        jobs = len(units) * self.sb
        ahead = self.ahead
        tiles = cfg.weight_mem_tiles

        def move(m: int) -> None:
            """UB_TO_WEIGHTS and READ_WEIGHTS of item ``m``'s tile (tile ``m`` mod the
            weight memory's tiles: a move never waits for the READ_WEIGHTS before it)."""
            _, i, sb, kc = items[m]
            first = sb * cfg.cols
            p.ub_to_weights(i * self.unit_rows + (kc_n + kc) * t + first, m % tiles,
                            min(cfg.cols, t - first), transpose=True)
            p.read_weights(m % tiles, 1)

        def finish(job: int) -> None:
            acc, out = (job % regions) * t, out_base + (job % regions) * t
            p.activate(acc, out, t, func=self.op.requant.func, slot=0)
            p.write_host(out, t)

        for m in range(min(ahead, len(items))):
            move(m)
        for m, (job, i, _, kc) in enumerate(items):
            if m + ahead < len(items):
                move(m + ahead)
            p.matmul(i * self.unit_rows + kc * t, (job % regions) * t, t, switch=True,
                     accumulate=kc > 0)
            # The job before this one's results, once this one's first MATMUL is in.
            if kc == 0 and job > 0:
                finish(job - 1)
        finish(jobs - 1)
        p.halt()
        n_units = len(units)

        def decode(beats: list[int]) -> np.ndarray:
            raw = np.frombuffer(b"".join(int(v).to_bytes(cfg.ub_row, "little")
                                         for v in beats[:jobs * t]), dtype=np.int8)
            rows = raw.reshape(n_units, self.sb, t, cfg.ub_row).astype(np.int64)
            scores = rows[..., :cfg.cols].transpose(0, 2, 1, 3).reshape(
                n_units, t, self.sb * cfg.cols)[..., :t]
            return scores.reshape(-1, self.heads, t, t)

        return Batch(beats=p.beats, output_beats=jobs * t + 1, instructions=p.instructions,
                     images=n_units // self.heads, decode=decode)
