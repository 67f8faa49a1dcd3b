"""Tiled GEMM for the core: ``Y = activate(requantise(X @ W))`` as one program.

:func:`gemm_program` turns int8 (or uint8) ``X`` (M x K) and ``W`` (K x N) with per-column
bias and multiplier into the host beats of a program; :meth:`GemmProgram.decode` turns the
beats the core answers with into the M x N int8 result, and :func:`gemm_reference` computes
the same result with :mod:`sim.models.golden` alone.

Tiling
------
``K`` splits into ``KC = ceil(K / rows)`` chunks and ``N`` into ``NB = ceil(N / cols)`` column
blocks, zero-padded. Weight tile ``nb * KC + kc`` holds ``W[kc*rows:, nb*cols:]``; all tiles
are loaded once. ``M`` is processed in batches of at most ``mb`` rows, the largest that lets
the batch's ``KC`` chunks of ``X`` (``KC * mb`` unified-buffer rows from 0) and at least one
output region fit in the unified buffer. A *job* is one column block of one batch: ``KC``
MATMULs of ``mb`` rows each, one weight tile each (``switch``; ``accumulate`` after the first
chunk), into the job's accumulator region, then ACTIVATE into its output region and
WRITE_HOST. Jobs use accumulator and output regions in rotation, as many as fit (separate
regions per job when they all fit, as for 64x64 @ 64x64 on the default 8x8 core).

Ordering
--------
- READ_WEIGHTS run ahead of the MATMULs by ``weight_fifo_depth + 1`` tiles (the FIFO plus the
  shadow registers) and never further: one at the start for the first tiles, then one after
  each MATMUL, so the tile of the next MATMUL is always queued and MATMULs can run back to
  back.
- The ACTIVATE of job ``j - 1`` follows the first MATMUL of job ``j``, and the WRITE_HOST of
  job ``j - 2`` precedes it, so activation and host transfers overlap the matrix unit's work
  on other accumulator and unified-buffer rows.
- Parameters: one slot per column block, loaded at the start when ``NB <= param_slots``,
  else loaded into slot ``j % param_slots`` just before each ACTIVATE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.asm import Program
from hdl import isa
from hdl.beats import done_beat
from hdl.config import TPUConfig
from sim.models import golden

__all__ = ["GemmProgram", "gemm_program", "gemm_reference"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _column_param(name: str, value, n: int) -> np.ndarray:
    array = np.broadcast_to(np.asarray(value, dtype=np.int64), (n,)).copy()
    if array.size and (array.min() < -(1 << 31) or array.max() >= 1 << 31):
        raise ValueError(f"{name} holds values outside the int32 range")
    return array


def _check_scalars(shift: int, zero_point: int, clamp_hi: int, func) -> isa.Func:
    if not 0 <= shift <= 63:
        raise ValueError(f"shift={shift} is out of range; allowed: 0 to 63")
    for name, value in (("zero_point", zero_point), ("clamp_hi", clamp_hi)):
        if not -128 <= value <= 127:
            raise ValueError(f"{name}={value} is out of range; allowed: -128 to 127")
    return isa.Func(func)


def gemm_reference(x, w, *, bias=0, multiplier=1, shift: int = 0, zero_point: int = 0,
                   func=isa.Func.IDENTITY, clamp_hi: int = 127, x_signed: bool = True,
                   w_signed: bool = True) -> np.ndarray:
    """The M x N int8 result from :mod:`sim.models.golden` alone."""
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    n = w.shape[1]
    func = _check_scalars(shift, zero_point, clamp_hi, func)
    acc = golden.matmul(x, w, x_signed=x_signed, w_signed=w_signed)
    q = golden.requantise(acc, _column_param("bias", bias, n),
                          _column_param("multiplier", multiplier, n), shift, zero_point)
    return golden.activate(q, func.value, zero_point, clamp_hi)


@dataclass
class GemmProgram:
    """A GEMM program's beats and what is needed to decode the core's answer."""
    config: TPUConfig
    m: int
    k: int
    n: int
    batch_rows: int                 # mb: rows of X per batch
    k_chunks: int                   # KC
    col_blocks: int                 # NB
    acc_regions: int
    out_regions: int
    measure: bool = False           # counters cleared before the first MATMUL, read at the end
    beats: list[int] = field(default_factory=list)
    instructions: int = 0           # instructions in the program, the HALT included

    @property
    def jobs(self) -> list[tuple[int, int, int]]:
        """``(first row, rows, column block)`` of each job, in program order."""
        jobs = []
        for m0 in range(0, self.m, self.batch_rows):
            rows = min(self.batch_rows, self.m - m0)
            jobs.extend((m0, rows, nb) for nb in range(self.col_blocks))
        return jobs

    @property
    def output_beats(self) -> int:
        """Beats the core sends: one per output row and block, the counters when
        measuring, and the DONE beat."""
        return self.m * self.col_blocks + (len(isa.COUNTERS) if self.measure else 0) + 1

    def counters(self, output) -> dict[str, int]:
        """The counters read at the end of a measured program: they cover everything from
        the first MATMUL until all of the program's work is done."""
        if not self.measure:
            raise ValueError("the program was not built with measure=True")
        values = [int(b) for b in output][-1 - len(isa.COUNTERS):-1]
        return dict(zip(isa.COUNTERS, values, strict=True))

    def decode(self, output) -> np.ndarray:
        """The M x N int8 result from the beats the core sent (WRITE_HOST rows, then the
        DONE beat, which is checked)."""
        output = [int(b) for b in output]
        if len(output) != self.output_beats:
            raise ValueError(f"expected {self.output_beats} output beats, got {len(output)}")
        done = done_beat(self.instructions)
        if output[-1] != done:
            raise ValueError(f"last beat {output[-1]:#x} is not the DONE beat {done:#x}")
        cols = self.config.cols
        result = np.zeros((self.m, self.n), dtype=np.int64)
        position = 0
        for m0, rows, nb in self.jobs:
            width = min(cols, self.n - nb * cols)
            for i in range(rows):
                raw = output[position].to_bytes(self.config.ub_row, "little")[:width]
                result[m0 + i, nb * cols:nb * cols + width] = \
                    golden.from_raw(np.frombuffer(raw, dtype=np.uint8), signed=True)
                position += 1
        return result


def gemm_program(config: TPUConfig, x, w, *, bias=0, multiplier=1, shift: int = 0,
                 zero_point: int = 0, func=isa.Func.IDENTITY, clamp_hi: int = 127,
                 x_signed: bool = True, w_signed: bool = True,
                 measure: bool = False) -> GemmProgram:
    """The program computing :func:`gemm_reference` of the same arguments on the core.

    ``x`` is M x K and ``w`` K x N, int8 (or uint8 with ``x_signed``/``w_signed`` False);
    ``bias`` and ``multiplier`` are per-column int32 (or scalars); ``shift`` (0..63),
    ``zero_point`` and ``clamp_hi`` (int8) apply to every column. Raises ValueError if the
    weights or one batch row per chunk do not fit the configuration's memories, or for a uint8
    operand on a core for int8 only (``operands="int8"``).

    ``measure``: after the loads, SYNC and CLEAR_COUNTERS before the first MATMUL, and
    READ_COUNTERS (which waits until every unit is idle) before the HALT, so
    :meth:`GemmProgram.counters` gives the matrix phase's counters.
    """
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0] or 0 in x.shape + w.shape:
        raise ValueError(f"gemm needs non-empty (M, K) @ (K, N), got {x.shape} @ {w.shape}")
    m, k = x.shape
    n = w.shape[1]
    for name, values, signed in (("x", x, x_signed), ("w", w, w_signed)):
        if not signed and config.operands == "int8":
            raise ValueError(f"{name} is uint8 ({name}_signed=False), but the {config.name} "
                             f"core takes int8 operands only (operands='int8'); allowed: "
                             f"{name}_signed=True")
        lo, hi = golden.operand_range(signed)
        if values.min() < lo or values.max() > hi:
            raise ValueError(f"{name} holds values outside {lo}..{hi}")
    func = _check_scalars(shift, zero_point, clamp_hi, func)
    bias = _column_param("bias", bias, n)
    multiplier = _column_param("multiplier", multiplier, n)

    c = config
    kc_count, nb_count = _ceil_div(k, c.rows), _ceil_div(n, c.cols)
    tiles = kc_count * nb_count
    if tiles > c.weight_mem_tiles:
        raise ValueError(f"W needs {tiles} weight tiles ({kc_count} x {nb_count}); the "
                         f"configuration holds {c.weight_mem_tiles}")
    count_limit = (1 << 16) - 1
    for batches in range(1, m + 1):
        mb = _ceil_div(m, batches)
        jobs = _ceil_div(m, mb) * nb_count
        out_regions = min(jobs, (c.ub_depth - kc_count * mb) // mb)
        acc_regions = min(jobs, c.acc_depth // mb)
        if (out_regions >= 1 and acc_regions >= min(jobs, 2)
                and kc_count * mb <= count_limit and mb <= count_limit):
            break
    else:
        raise ValueError(f"K={k} needs {kc_count} unified-buffer rows per row of X, plus "
                         f"one output row; the configuration has {c.ub_depth}")

    plan = GemmProgram(config=c, m=m, k=k, n=n, batch_rows=mb, k_chunks=kc_count,
                       col_blocks=nb_count, acc_regions=acc_regions, out_regions=out_regions,
                       measure=measure)
    p = Program(c)

    # Weights: tile nb * KC + kc, zero-padded.
    w_padded = np.zeros((kc_count * c.rows, nb_count * c.cols), dtype=np.int64)
    w_padded[:k, :n] = w
    w_tiles = (w_padded.reshape(kc_count, c.rows, nb_count, c.cols)
               .transpose(2, 0, 1, 3).reshape(tiles, c.rows, c.cols))
    p.load_weights(0, w_tiles, signed=w_signed)

    # Parameters, one slot per column block.
    cols_padded = nb_count * c.cols
    bias_p = np.zeros(cols_padded, dtype=np.int64)
    bias_p[:n] = bias
    mult_p = np.zeros(cols_padded, dtype=np.int64)
    mult_p[:n] = multiplier
    params_once = nb_count <= c.param_slots

    def load_params(nb: int, slot: int):
        block = slice(nb * c.cols, (nb + 1) * c.cols)
        p.load_params(slot, bias_p[block], mult_p[block], shift=shift, zp=zero_point,
                      clamp=clamp_hi)

    if params_once:
        for nb in range(nb_count):
            load_params(nb, nb)

    # Weight tiles in the order the MATMULs use them, and the READ_WEIGHTS running ahead.
    jobs = plan.jobs
    sequence = [nb * kc_count + kc for _, _, nb in jobs for kc in range(kc_count)]
    ahead = c.weight_fifo_depth + 1
    first = sequence[:ahead]
    start = 0
    for i in range(1, len(first) + 1):     # consecutive tiles in one READ_WEIGHTS
        if i == len(first) or first[i] != first[i - 1] + 1:
            p.read_weights(first[start], i - start)
            start = i

    x_padded = np.zeros((m, kc_count * c.rows), dtype=np.int64)
    x_padded[:, :k] = x
    acc_base = [(j % acc_regions) * mb for j in range(len(jobs))]
    out_base = [(kc_count + j % out_regions) * mb for j in range(len(jobs))]

    def activate(j: int):
        _, rows, nb = jobs[j]
        slot = nb if params_once else j % c.param_slots
        if not params_once:
            load_params(nb, slot)
        p.activate(acc_base[j], out_base[j], rows, func=func, slot=slot)

    def write_host(j: int):
        p.write_host(out_base[j], jobs[j][1])

    mm = 0
    for j, (m0, rows, nb) in enumerate(jobs):
        if nb == 0:
            for kc in range(kc_count):
                p.read_host(kc * mb, x_padded[m0:m0 + rows, kc * c.rows:(kc + 1) * c.rows])
        if measure and j == 0:
            p.sync()
            p.clear_counters()
        for kc in range(kc_count):
            p.matmul(kc * mb, acc_base[j], rows, switch=True, accumulate=kc > 0,
                     signed=x_signed)
            if mm + ahead < len(sequence):
                p.read_weights(sequence[mm + ahead], 1)
            mm += 1
            if kc == 0:
                if j >= 2:
                    write_host(j - 2)
                if j >= 1:
                    activate(j - 1)
    if len(jobs) >= 2:
        write_host(len(jobs) - 2)
    activate(len(jobs) - 1)
    write_host(len(jobs) - 1)
    if measure:
        p.read_counters()
    p.halt()

    plan.beats = p.beats
    plan.instructions = p.instructions
    return plan

