"""Coverage-driven constrained-random programs for the core.

:func:`random_program` writes a valid program (no instruction raises an error), deterministic
from its random generator, that

- draws every length, address and flag over its whole legal range for the configuration,
  with the edges over-represented: single rows, the first and the last row (or tile, or
  parameter slot) of every memory, transfers of the whole memory, ACTIVATEs longer than a
  MATMUL's latency;
- sets up overlaps between in-flight instructions on purpose: about half of its steps are
  *motifs*, a long instruction followed by one whose rows meet its rows (one motif per rule
  of :data:`hdl.control.hazards.HAZARD_RULES`: a short MATMUL into the last accumulator rows
  of a long ACTIVATE, a READ_HOST into rows a WRITE_HOST still sends, a LOAD_WEIGHTS into a
  tile a READ_WEIGHTS still reads, a UB_TO_WEIGHTS of rows an ACTIVATE still writes, ...),
  the target row being the producer's first, its last or any; or two long instructions for
  two different engines; or bursts of MATMULs, a weight queue filled and drained, a
  LOAD_PARAMS behind an ACTIVATE of the same slot, a LOAD_TABLE right behind a long
  ACTIVATE of the function TABLE (it waits: the ACTIVATE looks up the old table to its last
  row), an ACTIVATE of the function TABLE right behind a LOAD_TABLE (it reads the new
  table), rows with divisors of every kind normalised (below);
- sometimes sets bits the core must ignore: reserved instruction fields, instruction bits
  above 64, data bits above the row, the bits above each per-column shift; and sends the
  resynchronisation word mid-program;
- loads parameters with every rounding mode, one shift or (some of the time) a shift per
  column, the extreme shifts 0, 31, 32, 62, 63 and multipliers at the int32 limits or
  powers of two among them, so that exact ties and saturation occur;
- on a core with the programmable table (:attr:`~hdl.config.TPUConfig.lookup_table`), loads
  random tables with the byte's extremes over-represented, at the first and last entries
  too, and draws the function TABLE among the others (never on a core without it);
- on a core with the row scale (:attr:`~hdl.config.TPUConfig.row_scale`), draws NORMALISE
  among the functions, and now and then makes rows whose divisor (the last accumulator
  column) is 1, small (an exact reciprocal), 0, negative or large (cut), through a tile whose
  last column sums the row or picks one element of it (times 1 or 127), and normalises them
  with a shift near 25 or one that the cut takes past 63 (clamped);
- ends by reading back what it touched: the unified-buffer rows it wrote, the accumulator
  rows it wrote (through an ACTIVATE with an identity requantisation, a random rounding mode
  and a random shift, sometimes one per column), the counters, and a HALT.

Lengths span the whole legal range with ``max_count=None`` (:func:`program_block`, the volume
test through the fast transport); by default they stop at :func:`short_counts`, a little over
a MATMUL's latency, so that the per-cycle bench (``tb_core.py``) stays quick. Addresses span
every memory either way.

Operands include the extremes (-128, 127, 255, sums near the int32 limits, saturation).
The generator keeps its own model of the state that decides validity (written tiles, queued
tiles, whether a tile is active); :class:`sim.models.isa_sim.IsaSim` computes the expected output.
:class:`funcov.ProgramObserver` measures what the programs contain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from funcov import RESERVED_BITS, activate_functions

from firmware.asm import Program
from hdl import isa
from hdl.config import TPUConfig
from hdl.control.hazards import HAZARD_RULES
from hdl.core import ACTIVITY
from hdl.isa import Func, Pool
from sim.models.isa_sim import DETERMINISTIC_COUNTERS, POOL_WINDOW, IsaSim

__all__ = ["random_program", "random_bytes", "random_params", "program_block", "short_counts",
           "MOTIFS", "counter_positions", "counter_reads", "counter_invariants",
           "check_counter_invariants", "check_counter_timing"]


def random_bytes(rng: np.random.Generator, shape, signed: bool) -> np.ndarray:
    """Operands with the extremes over-represented."""
    lo, hi = (-128, 127) if signed else (0, 255)
    values = rng.integers(lo, hi + 1, shape)
    kind = rng.integers(0, 6)
    if kind == 0:
        values[...] = rng.choice([lo, hi], shape)           # all extremes
    elif kind == 1:
        values[...] = hi                                     # all maximum
    elif kind == 2 and signed:
        values[...] = np.where(np.indices(values.shape).sum(axis=0) % 2, lo, hi)  # alternating
    return values


#: Shifts where the rounding modes part ways: none, the first, the last of DOUBLE's single
#: rounding, its first double rounding, the largest.
EXTREME_SHIFTS = (0, 1, 31, 32, 62, 63)


def random_params(rng: np.random.Generator, cols: int):
    """Bias, multiplier, shift, zero point, clamp, rounding mode: mostly sane scales,
    sometimes extreme. The shift is an int, or (half the time) an array of one per column
    with the extremes over-represented; the rounding mode is any of the three. 40% of the
    time the multipliers make exact ties: ``2**(s-1)`` at a column's shift ``s <= 31`` (an odd
    ``t`` is a tie), ``-2**31`` above (``t`` with the right low bits), or the int32 limits."""
    per_column = rng.random() < 0.5
    if rng.random() < 0.2:
        bias = rng.choice([-2**31, 2**31 - 1, 0], cols)
        multiplier = rng.choice([-2**31, 2**31 - 1, 1, 2**30, 1 - 2**31], cols)
        shift = rng.choice(EXTREME_SHIFTS, cols)
    else:
        bias = rng.integers(-2**20, 2**20, cols)
        multiplier = rng.integers(1, 2**16, cols) * rng.choice([1, -1], cols)
        shift = rng.integers(8, 32, cols)
    if per_column:
        extreme = rng.random(cols) < 0.4
        shift = np.where(extreme, rng.choice(EXTREME_SHIFTS, cols),
                         np.where(rng.random(cols) < 0.5, rng.integers(0, 64, cols), shift))
    else:
        shift = np.full(cols, shift[0])
    if rng.random() < 0.4:
        bias = np.where(rng.random(cols) < 0.5, 0, rng.integers(-2**8, 2**8, cols))
        multiplier = np.where(shift == 0, rng.choice([-2**31, 2**31 - 1], cols),
                              np.where(shift <= 31, np.int64(1) << np.maximum(shift - 1, 0),
                                       -2**31))
    zero_point = int(rng.integers(-128, 128))
    clamp = int(rng.integers(-128, 128))
    rounding = isa.Rounding(int(rng.integers(0, len(isa.Rounding))))
    return (bias, multiplier, shift if per_column else int(shift[0]), zero_point, clamp,
            rounding)


Ranges = dict[str, tuple[int, int]]     # memory ("ub", "acc", "tile") -> (first, count)


class _Generator:
    """One program: the validity model, the instruction emitters and the motifs."""

    def __init__(self, config: TPUConfig, rng: np.random.Generator, after: IsaSim | None,
                 max_count: int | None):
        cfg = self.cfg = config
        self.rng = rng
        self.max_count = max_count
        self.prog = Program(cfg)
        self.capacity = cfg.weight_fifo_depth + 1
        self.written: set[int] = set()
        self.queued = 0
        self.have_active = False
        if after is not None:
            self.written = {int(t) for t in np.flatnonzero(after.weight_written)}
            self.queued = len(after.queue)
            self.have_active = after.active is not None
        self.touched = {"ub": np.zeros(cfg.ub_depth, bool), "acc": np.zeros(cfg.acc_depth, bool)}
        # A third of the programs set bits the core must ignore, now and then.
        self.junk = rng.random() < 1 / 3
        self.latency = cfg.rows + cfg.cols + 4      # a MATMUL row's, buffer to accumulator
        self.funcs = activate_functions(cfg)    # TABLE, NORMALISE only where built

    # Drawing numbers -----------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def integer(self, lo: int, hi: int) -> int:
        """Uniform in ``lo..hi`` (inclusive)."""
        return int(self.rng.integers(lo, hi + 1))

    def count(self, most: int, long: bool = False) -> int:
        """A length in ``1..most``: single rows, short runs, anything, all of them; ``long``:
        at least a MATMUL's latency where possible."""
        if self.max_count is not None:
            most = min(most, self.max_count)
        r = self.rng.random()
        if long:
            return most if r < 0.3 else self.integer(min(most, self.latency + 1), most)
        if r < 0.2:
            return 1
        if r < 0.5:
            return self.integer(1, min(most, 2 * self.cfg.rows + 2))
        if r < 0.85:
            return self.integer(1, most)
        return most

    def start(self, depth: int, count: int) -> int:
        """A first row for ``count`` rows of ``depth``: the first, the last possible, any."""
        r = self.rng.random()
        if r < 0.2:
            return 0
        if r < 0.4:
            return depth - count
        return self.integer(0, depth - count)

    def around(self, row: int, count: int, depth: int) -> int:
        """A first row for ``count`` rows of ``depth`` that include ``row``: starting there,
        ending there, or anywhere around it."""
        lo, hi = max(0, row - count + 1), min(row, depth - count)
        r = self.rng.random()
        if r < 0.35:
            return hi
        if r < 0.7:
            return lo
        return self.integer(lo, hi)

    def target(self, first: int, count: int) -> int:
        """A row of a producer's range for a consumer to meet: its last, its first, any."""
        r = self.rng.random()
        if r < 0.4:
            return first + count - 1
        if r < 0.7:
            return first
        return self.integer(first, first + count - 1)

    def _random_bits(self, width: int) -> int:
        return int.from_bytes(self.rng.bytes((width + 7) // 8), "little") & ((1 << width) - 1)

    # Emitting ------------------------------------------------------------------------------

    def _emit(self, emit: Callable[[], list[int]], opcode: isa.Opcode,
              row_bits: int | None = None) -> None:
        """Append an instruction (and its data beats), sometimes with bits set that the core
        ignores."""
        beats = self.prog.beats
        at = len(beats)
        emit()
        if not self.junk:
            return
        width = self.cfg.host_width
        if RESERVED_BITS[opcode] and self.chance(0.3):
            beats[at] |= self._random_bits(isa.INSTR_BITS) & RESERVED_BITS[opcode]
        if width > isa.INSTR_BITS and self.chance(0.2):
            beats[at] |= self._random_bits(width - isa.INSTR_BITS) << isa.INSTR_BITS
        if row_bits is not None and row_bits < width and self.chance(0.3):
            for i in range(at + 1, len(beats)):
                beats[i] |= self._random_bits(width - row_bits) << row_bits

    def _touch(self, memory: str, first: int, count: int) -> None:
        self.touched[memory][first:first + count] = True

    def read_host(self, ub: int | None = None, count: int | None = None,
                  long: bool = False, rows: np.ndarray | None = None) -> Ranges:
        cfg = self.cfg
        count = len(rows) if rows is not None else count or self.count(cfg.ub_depth, long)
        ub = self.start(cfg.ub_depth, count) if ub is None else ub
        if rows is None:
            rows = random_bytes(self.rng, (count, cfg.ub_row), self.chance(0.5))
        self._emit(lambda: self.prog.read_host(ub, rows), isa.Opcode.READ_HOST, 8 * cfg.ub_row)
        self._touch("ub", ub, count)
        return {"ub": (ub, count)}

    def write_host(self, ub: int | None = None, count: int | None = None,
                   long: bool = False) -> Ranges:
        count = count or self.count(self.cfg.ub_depth, long)
        ub = self.start(self.cfg.ub_depth, count) if ub is None else ub
        self._emit(lambda: self.prog.write_host(ub, count), isa.Opcode.WRITE_HOST)
        return {"ub": (ub, count)}

    def load_weights(self, tile: int | None = None, count: int | None = None) -> Ranges:
        cfg = self.cfg
        count = count or self.count(cfg.weight_mem_tiles)
        tile = self.start(cfg.weight_mem_tiles, count) if tile is None else tile
        signed = cfg.operands == "int8" or self.chance(0.5)
        tiles = random_bytes(self.rng, (count, cfg.rows, cfg.cols), signed)
        self._emit(lambda: self.prog.load_weights(tile, tiles, signed=signed),
                   isa.Opcode.LOAD_WEIGHTS, 8 * cfg.cols)
        self.written.update(range(tile, tile + count))
        return {"tile": (tile, count)}

    def read_weights(self, most: bool = False) -> Ranges | None:
        """READ_WEIGHTS of written tiles that fit in the queue (None if none can); ``most``:
        as many as fit."""
        room = self.capacity - self.queued
        if room <= 0 or not self.written:
            return None
        last = self.cfg.weight_mem_tiles - 1
        r = self.rng.random()
        if r < 0.25 and last in self.written:        # a run ending at the last tile
            count = 1
            while count < room and last - count in self.written:
                count += 1
            count = count if most else self.count(count)
            tile = last + 1 - count
        else:
            if r < 0.5 and 0 in self.written:
                tile = 0
            else:
                tile = int(self.rng.choice(sorted(self.written)))
            count = 1
            while count < room and tile + count in self.written:
                count += 1
            count = count if most else self.count(count)
        self._emit(lambda: self.prog.read_weights(tile, count), isa.Opcode.READ_WEIGHTS)
        self.queued += count
        return {"tile": (tile, count)}

    def ub_to_weights(self, ub: int | None = None, count: int | None = None,
                      tile: int | None = None) -> Ranges:
        """A UB_TO_WEIGHTS, transposed or not, of ``count`` buffer rows (drawn up to the
        tile's columns or rows) into ``tile``."""
        cfg = self.cfg
        transpose = self.chance(0.5)
        count = count or self.count(cfg.cols if transpose else cfg.rows)
        if count > (cfg.cols if transpose else cfg.rows):
            transpose = not transpose       # a count given for the other form
        ub = self.start(cfg.ub_depth, count) if ub is None else ub
        tile = self.start(cfg.weight_mem_tiles, 1) if tile is None else tile
        signed = cfg.operands == "int8" or self.chance(0.5)
        self._emit(lambda: self.prog.ub_to_weights(ub, tile, count, transpose=transpose,
                                                   signed=signed), isa.Opcode.UB_TO_WEIGHTS)
        self.written.add(tile)
        return {"ub": (ub, count), "tile": (tile, 1)}

    def prime_weights(self) -> None:
        """Make a MATMUL possible: a tile queued or active."""
        if self.have_active or self.queued:
            return
        if not self.written:
            self.load_weights()
        self.read_weights()

    def matmul(self, ub: int | None = None, acc: int | None = None, count: int | None = None,
               long: bool = False, switch: bool | None = None,
               accumulate: bool | None = None, signed: bool | None = None) -> Ranges:
        """A MATMUL; ``ub``/``acc`` given with ``count``; ``accumulate`` and ``signed`` drawn
        if not given."""
        cfg = self.cfg
        self.prime_weights()
        if switch is None or (switch and not self.queued):
            switch = self.queued > 0 and (not self.have_active or self.chance(0.5))
        if not switch and not self.have_active:
            switch = True
        window = None
        if ub is None and count is None and cfg.conv_windows and self.chance(0.3):
            # The window mode: any lane, steps from 0 (one window again and again) through
            # ub_row (a row's lanes each step: a plain MATMUL's pattern) to 15 (rows read
            # that complete no window where ub_row is smaller).
            lane = self.integer(0, cfg.ub_row - 1)
            step = self.integer(0, 15) if self.chance(0.3) else \
                self.integer(1, min(15, cfg.ub_row))
            window = (lane, step)
        count = count or self.count(min(cfg.ub_depth, cfg.acc_depth), long)
        span = count
        if window is not None:
            elements = cfg.ub_depth * cfg.ub_row - window[0] - cfg.rows
            if window[1]:
                count = min(count, elements // window[1] + 1)
            span = isa.window_rows(*window, count, cfg.rows, cfg.ub_row)
        ub = self.start(cfg.ub_depth, span) if ub is None else ub
        acc = self.start(cfg.acc_depth, count) if acc is None else acc
        if accumulate is None:
            accumulate = self.chance(0.5)
        if signed is None:
            signed = cfg.operands == "int8" or self.chance(0.5)
        at = len(self.prog.beats)
        if window is None and cfg.sum_tables and self.chance(0.2):
            # MATMUL_LOOKUP instead (the same fields, `table` where MATMUL has `window`).
            table = self.integer(0, 1)
            self._emit(lambda: self.prog.matmul_lookup(ub, acc, count, table=table,
                                                       switch=switch, accumulate=accumulate,
                                                       signed=signed),
                       isa.Opcode.MATMUL_LOOKUP)
        else:
            self._emit(lambda: self.prog.matmul(ub, acc, count, switch=switch,
                                                accumulate=accumulate, signed=signed,
                                                window=window),
                       isa.Opcode.MATMUL)
            if window is None and self.junk and self.chance(0.3):
                # lane and step, ignored without window.
                self.prog.beats[at] |= self._random_bits(8) << 56
        if switch:
            self.queued -= 1
            self.have_active = True
        self._touch("acc", acc, count)
        return {"ub": (ub, span), "acc": (acc, count)}

    def activate(self, acc: int | None = None, ub: int | None = None,
                 blocks: int | None = None, pool: Pool | None = None,
                 long: bool = False, slot: int | None = None,
                 func: Func | None = None) -> Ranges:
        """An ACTIVATE of ``blocks`` pooling windows (``count = blocks * window``)."""
        cfg = self.cfg
        pool = Pool(self.integer(0, 2)) if pool is None else pool
        window = POOL_WINDOW[pool]
        most = min(cfg.acc_depth // window, cfg.ub_depth)
        if self.max_count is not None:
            most = min(most, max(1, self.max_count // window))
        if blocks is None:
            if long:
                blocks = most if self.chance(0.3) else self.integer(
                    min(most, -(-(self.latency + 1) // window)), most)
            else:
                blocks = self.count(most)
        count = blocks * window
        acc = self.start(cfg.acc_depth, count) if acc is None else acc
        ub = self.start(cfg.ub_depth, blocks) if ub is None else ub
        slot = self.slot() if slot is None else slot
        if func is None:
            func = self.funcs[self.integer(0, len(self.funcs) - 1)]
        self._emit(lambda: self.prog.activate(acc, ub, count, func=func, pool=pool, slot=slot),
                   isa.Opcode.ACTIVATE)
        self._touch("ub", ub, blocks)
        return {"acc": (acc, count), "ub": (ub, blocks)}

    def slot(self) -> int:
        r = self.rng.random()
        if r < 0.3:
            return 0
        if r < 0.6:
            return self.cfg.param_slots - 1
        return self.integer(0, self.cfg.param_slots - 1)

    def load_params(self, slot: int | None = None) -> None:
        slot = self.slot() if slot is None else slot
        bias, mult, shift, zp, clamp, rounding = random_params(self.rng, self.cfg.cols)
        # The extreme shifts, for every column or (half the per-column rows) in two of them:
        # rare enough otherwise that a block of short programs can miss them.
        if self.chance(0.3):
            shift = int(self.rng.choice([0, 63]))
        elif np.ndim(shift) and self.chance(0.5):
            shift[self.rng.permutation(self.cfg.cols)[:2]] = [0, 63][:self.cfg.cols]
        beats = self.prog.beats
        at = len(beats)
        self._emit(lambda: self.prog.load_params(slot, bias, mult, shift=shift, zp=zp,
                                                 clamp=clamp, rounding=rounding),
                   isa.Opcode.LOAD_PARAMS, 32 * self.cfg.cols)
        if self.junk and np.ndim(shift) and self.chance(0.5):
            # The per-column shift lanes' bits above the six shift bits: ignored.
            lanes = sum(self._random_bits(26) << (32 * j + 6) for j in range(self.cfg.cols))
            beats[at + 3] |= lanes

    def normalise_params(self, slot: int, clamp: bool) -> None:
        """LOAD_PARAMS for NORMALISE (which ignores the multiplier): a shift near 25 (``t /
        d`` times ``2**(25 - shift)``), or with ``clamp`` one of 58..63 (the cut of a divisor
        of ``2**(72 - shift)`` or more takes it past 63: any cut at 63); one shift, or one
        per column; the bias 0 or small."""
        cfg = self.cfg
        lo, hi = (58, 63) if clamp else (17, 27)
        if self.chance(0.5):
            shift = self.rng.integers(lo, hi + 1, cfg.cols)
        elif clamp:
            shift = 63 if self.chance(0.5) else self.integer(lo, hi)
        else:
            shift = 25 if self.chance(0.5) else self.integer(lo, hi)
        bias = np.where(self.rng.random(cfg.cols) < 0.5, 0,
                        self.rng.integers(-2**8, 2**8, cfg.cols))
        mult = self.rng.integers(-2**31, 2**31, cfg.cols)
        zp, clamp_hi = self.integer(-128, 127), self.integer(-128, 127)
        rounding = isa.Rounding(self.integer(0, len(isa.Rounding) - 1))
        self._emit(lambda: self.prog.load_params(slot, bias, mult, shift=shift, zp=zp,
                                                 clamp=clamp_hi, rounding=rounding),
                   isa.Opcode.LOAD_PARAMS, 32 * cfg.cols)

    def load_table(self) -> None:
        """LOAD_TABLE of 256 random entries, int8 or raw bytes (:func:`random_bytes`: all
        extremes, all one extreme, alternating, or any), half the time with the byte's
        extremes (0x00, 0x7f, 0x80, 0xff) at the entries of ``q`` = -128, -1, 0 and 127."""
        cfg = self.cfg
        table = random_bytes(self.rng, isa.TABLE_ENTRIES, self.chance(0.5)) & 0xFF
        if self.chance(0.5):
            table[[0, 127, 128, 255]] = self.rng.permutation([0x00, 0x7F, 0x80, 0xFF])
        self._emit(lambda: self.prog.load_table(table.tolist()), isa.Opcode.LOAD_TABLE,
                   32 * cfg.cols)
        per_beat = 4 * cfg.cols
        last = isa.TABLE_ENTRIES % per_beat         # entries in a partial last beat
        if self.junk and last and self.chance(0.8):
            # The last beat's bits past entry 255 (still in its row): ignored.
            self.prog.beats[-1] |= self._random_bits(8 * (per_beat - last)) << (8 * last)

    def load_sum_table(self, table: int | None = None) -> None:
        """LOAD_TABLE of a sum table: 256 random int32 entries, half the time with the int32
        extremes at the byte's extremes' entries (0x00, 0x7f, 0x80, 0xff)."""
        cfg = self.cfg
        table = self.integer(0, 1) if table is None else table
        entries = self.rng.integers(-2**31, 2**31, isa.TABLE_ENTRIES)
        if self.chance(0.5):
            entries[[0, 127, 128, 255]] = self.rng.choice([-2**31, 2**31 - 1], 4)
        self._emit(lambda: self.prog.load_sum_table(table, entries.tolist()),
                   isa.Opcode.LOAD_TABLE, 32 * cfg.cols)

    def sum_table_behind_lookup(self) -> None:
        """A sum-table LOAD_TABLE right behind a long MATMUL_LOOKUP of that table (it waits
        until the core is idle: the lookups read the old entries to the last row)."""
        cfg = self.cfg
        self.prime_weights()
        count = self.count(min(cfg.ub_depth, cfg.acc_depth), long=True)
        ub, acc = self.start(cfg.ub_depth, count), self.start(cfg.acc_depth, count)
        switch = self.queued > 0 and (not self.have_active or self.chance(0.5))
        table = self.integer(0, 1)
        self._emit(lambda: self.prog.matmul_lookup(ub, acc, count, table=table, switch=switch,
                                                   signed=True), isa.Opcode.MATMUL_LOOKUP)
        if switch:
            self.queued -= 1
            self.have_active = True
        self._touch("acc", acc, count)
        self.load_sum_table(table)

    def simple(self, opcode: isa.Opcode) -> None:
        self._emit(lambda: self.prog.instr(opcode), opcode)

    def resync(self) -> None:
        """The resynchronisation word with no error pending: restarts the instruction index."""
        word = isa.RESYNC_WORD
        if self.junk and self.cfg.host_width > isa.INSTR_BITS:
            word |= self._random_bits(self.cfg.host_width - isa.INSTR_BITS) << isa.INSTR_BITS
        self.prog.word(word)

    # Single instructions -------------------------------------------------------------------

    def random_instruction(self) -> None:
        # (The rare kinds often enough that a block of 25 short programs has each.)
        kinds = {"read_host": 0.1, "load_weights": 0.06, "read_weights": 0.08, "matmul": 0.3,
                 "activate": 0.2, "load_params": 0.06, "write_host": 0.11, "nop": 0.04,
                 "sync": 0.035, "read_counters": 0.035, "clear_counters": 0.035, "resync": 0.035}
        if self.cfg.ub_to_weights:
            kinds["ub_to_weights"] = 0.05
        if self.cfg.lookup_table:
            kinds["load_table"] = 0.03
        if self.cfg.sum_tables:
            # (A table is 256 entries, 256 / cols beats: rarer where the columns are few.)
            kinds["load_sum_table"] = min(0.04, 0.01 * self.cfg.cols)
        weights = np.array(list(kinds.values()))
        kind = self.rng.choice(list(kinds), p=weights / weights.sum())
        if kind == "read_weights":
            if self.read_weights() is None:
                self.load_weights()
        elif kind in ("nop", "sync", "read_counters", "clear_counters"):
            self.simple(isa.Opcode[kind.upper()])
        else:
            getattr(self, kind)()

    # Motifs --------------------------------------------------------------------------------

    def hazard(self, rule: str) -> None:
        """A long producer, then a consumer whose rows meet the producer's (first, last or
        any row), as ``rule`` names them: the consumer must wait for the producer."""
        cfg = self.cfg
        ub_most = cfg.ub_depth
        pair_most = min(cfg.ub_depth, cfg.acc_depth)

        def ub_row(ranges: Ranges) -> int:
            return self.target(*ranges["ub"])

        if rule == "read_host_war_matmul":
            t = ub_row(self.matmul(long=True))
            count = self.count(ub_most)
            self.read_host(self.around(t, count, ub_most), count)
        elif rule == "read_host_waw_activate":
            t = ub_row(self.activate(long=True))
            count = self.count(ub_most)
            self.read_host(self.around(t, count, ub_most), count)
        elif rule == "read_host_war_write_host":
            t = ub_row(self.write_host(long=True))
            count = self.count(ub_most)
            self.read_host(self.around(t, count, ub_most), count)
        elif rule == "write_host_raw_activate":
            t = ub_row(self.activate(long=True))
            count = self.count(ub_most)
            self.write_host(self.around(t, count, ub_most), count)
        elif rule == "load_weights_war_read_weights":
            t = self._tile_being_read()
            count = self.count(cfg.weight_mem_tiles)
            self.load_weights(self.around(t, count, cfg.weight_mem_tiles), count)
        elif rule == "matmul_raw_activate":
            t = ub_row(self.activate(long=True))
            count = self.count(pair_most)
            self.matmul(ub=self.around(t, count, cfg.ub_depth), count=count)
        elif rule == "matmul_war_activate_acc":
            t = self.target(*self.activate(long=True)["acc"])
            count = self.count(pair_most)
            self.matmul(acc=self.around(t, count, cfg.acc_depth), count=count)
        elif rule == "activate_raw_matmul_acc":
            t = self.target(*self.matmul(long=True)["acc"])
            pool = Pool(self.integer(0, 2))
            window = POOL_WINDOW[pool]
            blocks = self.count(min(cfg.acc_depth // window, cfg.ub_depth))
            self.activate(acc=self.around(t, blocks * window, cfg.acc_depth), blocks=blocks,
                          pool=pool)
        elif rule == "activate_war_matmul":
            t = ub_row(self.matmul(long=True))
            self._activate_into(t)
        elif rule == "activate_war_write_host":
            t = ub_row(self.write_host(long=True))
            self._activate_into(t)
        elif rule == "ub_to_weights_raw_activate":
            t = ub_row(self.activate(long=True))
            count = self.count(max(cfg.rows, cfg.cols))
            self.ub_to_weights(ub=self.around(t, count, ub_most), count=count)
        elif rule == "ub_to_weights_war_read_weights":
            self.ub_to_weights(tile=self._tile_being_read())
        else:
            raise ValueError(rule)

    def _tile_being_read(self) -> int:
        """A READ_WEIGHTS (after a MATMUL that makes room, a LOAD_WEIGHTS if no tile is
        written), and a tile of its range for a writer to meet: its first, last or any."""
        if self.queued == self.capacity:
            self.matmul(switch=True)             # room for the READ_WEIGHTS
        if not self.written:
            self.load_weights()
        ranges = self.read_weights(most=self.chance(0.5))
        assert ranges is not None
        return self.target(*ranges["tile"])

    def _activate_into(self, row: int) -> None:
        """An ACTIVATE whose output rows include unified-buffer row ``row``."""
        cfg = self.cfg
        pool = Pool(self.integer(0, 2))
        window = POOL_WINDOW[pool]
        blocks = self.count(min(cfg.acc_depth // window, cfg.ub_depth))
        self.activate(ub=self.around(row, blocks, cfg.ub_depth), blocks=blocks, pool=pool)

    def overlap(self, engines: tuple[str, str]) -> None:
        """Long work for two engines, one after the other, in different halves of the
        memories where they share one (so that they run at once)."""
        cfg = self.cfg
        half, acc_half = cfg.ub_depth // 2, cfg.acc_depth // 2
        low = self.chance(0.5)
        for engine in engines:
            count = self.count(half, long=True)
            ub = (0 if low else half) + self.integer(0, half - count)
            acc_base = 0 if low else acc_half
            low = not low
            if engine == "front_end":
                choice = self.integer(0, 2)
                if choice == 0:
                    self.read_host(ub, count)
                elif choice == 1:
                    self.load_weights()
                else:
                    self.load_params()
            elif engine == "weight_loader":
                if self.read_weights(most=True) is None:
                    self.load_weights()
            elif engine == "matrix":
                count = min(count, acc_half)
                self.matmul(ub=ub, count=count,
                            acc=acc_base + self.integer(0, acc_half - count))
            elif engine == "activation":
                pool = Pool(self.integer(0, 2))
                window = POOL_WINDOW[pool]
                blocks = max(1, min(count, acc_half // window))
                self.activate(acc=acc_base + self.integer(0, acc_half - blocks * window),
                              ub=ub, blocks=blocks, pool=pool)
            else:
                self.write_host(ub, count)

    def matmul_run(self) -> None:
        """More MATMULs in a row than the engine has slots, short ones, some switching
        tiles, then an ACTIVATE of the first one's rows (it waits for the oldest slot)."""
        first = None
        short = min(2 * self.cfg.rows, self.cfg.ub_depth, self.cfg.acc_depth)
        slots = self.cfg.matmul_slots
        for _ in range(self.integer(slots + 1, slots + 3)):
            if self.queued and self.chance(0.3):
                ranges = self.matmul(count=self.count(short), switch=True)
            else:
                if self.chance(0.3):
                    self.read_weights()
                ranges = self.matmul(count=self.count(short), switch=False)
            first = first or ranges
        acc, count = first["acc"]
        self.activate(acc=acc, blocks=count, pool=Pool.NONE)

    def weight_queue(self) -> None:
        """Fill the weight queue, then drain it with short switching MATMULs (weight stalls:
        the next tile is still shifting in)."""
        if not self.written:
            self.load_weights()
        while self.queued < self.capacity and self.read_weights(most=True):
            pass
        while self.queued:
            self.matmul(count=self.count(min(self.cfg.rows, self.cfg.acc_depth)), switch=True)

    def params_behind_activate(self) -> None:
        """LOAD_PARAMS into the slot a long ACTIVATE uses (it waits for the ACTIVATE)."""
        slot = self.slot()
        self.activate(long=True, slot=slot)
        self.load_params(slot)

    def table_behind_activate(self) -> None:
        """A LOAD_TABLE right behind a long ACTIVATE of the function TABLE (the LOAD_TABLE
        waits until it is done: the ACTIVATE reads the old table to its last row)."""
        self.activate(long=True, func=Func.TABLE)
        self.load_table()

    def activate_behind_table(self) -> None:
        """An ACTIVATE of the function TABLE right behind a LOAD_TABLE (it reads the new
        table, the entries written last too)."""
        self.load_table()
        self.activate(func=Func.TABLE, long=self.chance(0.5))

    def normalise(self) -> None:
        """Rows with divisors of every kind, then NORMALISE of them. A tile whose last
        column sums the row (softmax's column of ones), or picks its element ``k`` (times 1
        or 127); buffer rows whose element ``k`` is 1, small, 0, negative (above 127 when
        unsigned) or an extreme (through the summing tile, half the rows hold only it); a
        MATMUL through the tile (the queue drained first, so that it switches to it),
        sometimes a second accumulating one (twice the divisor); then NORMALISE of them
        with a slot whose shift is near 25, and again with another whose shift the cut
        takes past 63."""
        cfg, rng = self.cfg, self.rng
        rows, last = cfg.rows, cfg.cols - 1
        while self.queued:
            self.matmul(count=self.count(min(rows, cfg.acc_depth)), switch=True)
        w_signed = cfg.operands == "int8" or self.chance(0.5)
        weights = random_bytes(rng, (rows, cfg.cols), w_signed)
        k = self.integer(0, rows - 1)
        column = int(rng.choice(3, p=[0.25, 0.5, 0.25]))   # sums x, picks x[k], 127 x[k]
        weights[:, last] = 1 if column == 0 else 0
        if column:
            weights[k, last] = 1 if column == 1 else 127
        tile = self.start(cfg.weight_mem_tiles, 1)
        self._emit(lambda: self.prog.load_weights(tile, weights, signed=w_signed),
                   isa.Opcode.LOAD_WEIGHTS, 8 * cfg.cols)
        self.written.add(tile)
        self._emit(lambda: self.prog.read_weights(tile, 1), isa.Opcode.READ_WEIGHTS)
        self.queued += 1
        count = self.count(min(cfg.ub_depth, cfg.acc_depth))
        signed = cfg.operands == "int8" or self.chance(0.5)
        x = random_bytes(rng, (count, cfg.ub_row), signed)
        lo, hi = (-128, 127) if signed else (0, 255)
        # Each kind in turn (in a random order): 1, small, 0, negative (or above 127),
        # an extreme.
        kinds = np.resize(rng.permutation(5), count)
        picks = np.choose(kinds, [
            np.ones(count, dtype=np.int64), rng.integers(2, 128, count),
            np.zeros(count, dtype=np.int64),
            rng.integers(-128, 0, count) if signed else rng.integers(128, 256, count),
            rng.choice([lo, hi], count)])
        if column == 0:
            alone = rng.random(count) < 0.5
            x[alone, :rows] = 0
        x[:, k] = picks
        ub = self.start(cfg.ub_depth, count)
        acc = self.start(cfg.acc_depth, count)
        self.read_host(ub, rows=x)
        self.matmul(ub=ub, acc=acc, count=count, switch=True, accumulate=False, signed=signed)
        if self.chance(0.25):
            self.matmul(ub=ub, acc=acc, count=count, switch=False, accumulate=True,
                        signed=signed)
        slot = self.slot()
        slots = cfg.param_slots
        for clamp in (False, True):
            self.normalise_params(slot, clamp=clamp)
            pool = Pool(self.integer(0, 2))
            if count < POOL_WINDOW[pool]:
                pool = Pool.NONE
            self.activate(acc=acc, blocks=count // POOL_WINDOW[pool], pool=pool, slot=slot,
                          func=Func.NORMALISE)
            slot = (slot + self.integer(1, slots - 1)) % slots if slots > 1 else slot

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.45:
            rules = [rule for rule in HAZARD_RULES
                     if self.cfg.ub_to_weights or not rule.startswith("ub_to_weights")]
            self.hazard(rules[self.integer(0, len(rules) - 1)])
        elif r < 0.55:
            a, b = self.rng.choice(len(ACTIVITY), 2, replace=False)
            self.overlap((ACTIVITY[a], ACTIVITY[b]))
        elif r < 0.6:
            motifs = [self.matmul_run, self.weight_queue, self.params_behind_activate]
            if self.cfg.lookup_table:
                motifs += [self.table_behind_activate, self.activate_behind_table]
            if self.cfg.sum_tables:
                motifs += [self.sum_table_behind_lookup]
            motifs[self.integer(0, len(motifs) - 1)]()
        elif r < 0.64 and self.cfg.row_scale:
            self.normalise()
        else:
            self.random_instruction()

    # Whole programs ------------------------------------------------------------------------

    def program(self, length: int) -> Program:
        if self.chance(0.7):
            self.read_host()
        if self.chance(0.7):
            self.load_weights()
        for _ in range(length):
            self.step()
        self.read_back()
        return self.prog

    def read_back(self) -> None:
        """Every unified-buffer row written, then every accumulator row written (through an
        identity ACTIVATE with a random rounding mode and a random shift, sometimes one per
        column and sometimes halving every value, ties included, into buffer rows 0..), now
        and then a SYNC, the counters, HALT."""
        cfg = self.cfg
        for first, count in _runs(self.touched["ub"]):
            self.prog.write_host(first, count)
        acc_runs = _runs(self.touched["acc"])
        if acc_runs:
            slot = self.integer(0, cfg.param_slots - 1)
            shifts = [0, 4, 8, 12, 16, 20, 24]
            mult = np.ones(cfg.cols, dtype=np.int64)
            if self.chance(0.3):
                shift = self.rng.choice(shifts, cfg.cols)
                if self.chance(0.5):
                    # acc / 2 at each column: every odd accumulator value is an exact tie.
                    shift = np.maximum(shift, 1)
                    mult = np.int64(1) << (shift - 1)
            else:
                shift = int(self.rng.choice(shifts))
            rounding = isa.Rounding(self.integer(0, len(isa.Rounding) - 1))
            self.prog.load_params(slot, [0] * cfg.cols, mult, shift=shift, zp=0, clamp=127,
                                  rounding=rounding)
        for run_first, run_count in acc_runs:
            for first in range(run_first, run_first + run_count, cfg.ub_depth):
                count = min(cfg.ub_depth, run_first + run_count - first)
                self.prog.activate(first, 0, count, func=Func.IDENTITY, slot=slot)
                self.prog.write_host(0, count)
        if self.chance(0.2):
            self.prog.sync()
        self.prog.read_counters()
        self.prog.halt()


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(first, count)`` of each run of set entries."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


#: Motif names, for documentation and coverage tables.
MOTIFS = (*(f"hazard.{rule}" for rule in HAZARD_RULES), "overlap", "matmul_run",
          "weight_queue", "params_behind_activate", "table_behind_activate",
          "activate_behind_table", "sum_table_behind_lookup", "normalise")


def short_counts(config: TPUConfig) -> int:
    """The longest transfer :func:`random_program` draws by default: a little over a
    MATMUL's latency (so that an ACTIVATE can outlast one), and at least ``2 * rows + 2``."""
    return max(config.rows + config.cols + 6, 2 * config.rows + 2)


def random_program(config: TPUConfig, rng: np.random.Generator, length: int = 12,
                   after: IsaSim | None = None, max_count: int | None | str = "short"
                   ) -> Program:
    """A valid random program of ``length`` steps (an instruction or a motif of a few) plus
    its read-back tail; see the module documentation.

    ``after``: the reference model as it stands before the program runs (programs that run
    back to back inherit written tiles, queued weight tiles and the active tile); a fresh
    core if ``None``.

    ``max_count``: the longest transfer drawn (rows, or tiles). ``None``: the whole legal
    range, up to all of a memory (the volume test through the fast transport). The default,
    ``"short"``, is :func:`short_counts`, which keeps programs short enough for the per-cycle
    bench (``tb_core.py``); addresses still span every memory, first and last rows included.
    """
    if max_count == "short":
        max_count = short_counts(config)
    return _Generator(config, rng, after, max_count).program(length)


def program_block(config: TPUConfig, seeds, ref: IsaSim | None = None,
                  lengths: tuple[int, int] = (5, 40), max_count: int | None | str = None):
    """Programs back to back from a reset (or from ``ref``'s state): yields ``(seed, program,
    expected output beats)`` and runs each on ``ref`` (a fresh :class:`IsaSim` if ``None``)
    before the next is drawn. Each program's length is drawn from ``lengths`` with its seed,
    so a block replays exactly from its seeds."""
    ref = IsaSim(config) if ref is None else ref
    for seed in seeds:
        rng = np.random.default_rng(seed)
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        program = random_program(config, rng, length=length, after=ref, max_count=max_count)
        yield seed, program, ref.run(program.beats)


# Invariants of the timing-dependent counters ------------------------------------------------

#: The counters the ISA simulator leaves open (``None`` in its output).
_OPEN = tuple(name for name in isa.COUNTERS if name not in DETERMINISTIC_COUNTERS)
#: A READ_COUNTERS's beats that have surely left when ``non_matrix`` is sampled: all before
#: it but the last (which may still be offered, ``LAG`` cycles after the events counted).
_BEATS_BEFORE_NON_MATRIX = isa.COUNTERS.index("non_matrix") - 1


def counter_positions(expected: Sequence[int | None]) -> list[int]:
    """Where each READ_COUNTERS's beats start in ``expected`` (the ISA simulator's output),
    found by its ``None`` counters."""
    positions = []
    n = len(isa.COUNTERS)
    i = 0
    while i < len(expected):
        if expected[i] is None:
            beats = expected[i:i + n]
            assert len(beats) == n and all(
                (beats[k] is None) == (name in _OPEN) for k, name in enumerate(isa.COUNTERS)), \
                f"beat {i}: a None beat that does not start the counters"
            positions.append(i)
            i += n
        else:
            i += 1
    return positions


def counter_reads(expected: Sequence[int | None], got: Sequence[int]) -> list[dict[str, int]]:
    """The values of every READ_COUNTERS in ``got`` (the core's beats), found where
    ``expected`` (the ISA simulator's) has its ``None`` counters."""
    n = len(isa.COUNTERS)
    return [dict(zip(isa.COUNTERS, got[i:i + n], strict=True))
            for i in counter_positions(expected) if i + n <= len(got)]


def counter_invariants(counts: dict[str, int]) -> list[str]:
    """The relations one READ_COUNTERS's values hold in every program, as text, each with
    the values that break it (an empty list: all hold).

    READ_COUNTERS samples the counters one after another, each ``LAG`` = 3 cycles behind its
    events (:class:`~hdl.control.counters.PerfCounters`), ``cycles`` first, in a cycle after
    READ_COUNTERS issues (``r``). So with ``c`` the cycle the counters were cleared (or reset),
    ``cycles`` counts the cycles ``c + 1 .. t - 3`` for some ``t > r``, at least ``c + 1 ..
    r - 2``; every counter sampled after it counts its events up to ``r - 1`` at least, and
    those that stop before READ_COUNTERS issues (it waits until every unit is idle) count all
    their events. Hence:

    - ``array_active + weight_stall <= cycles``: a ``switch`` row either waits or enters the
      array, and the matrix engine is idle some cycles before READ_COUNTERS issues;
    - ``raw_stall + host_stall + instructions <= cycles + 1``: each is a cycle of the front
      end of its own kind (an instruction waiting on a conflict, the front end waiting for a
      beat, an instruction issuing or a READ_COUNTERS's last beat leaving), all before
      ``r``; the one cycle is ``r - 1``, which ``cycles`` may not count yet (a host gap right
      before READ_COUNTERS is in ``host_stall``, not yet in ``cycles``);
    - ``non_matrix >= 5``: the READ_COUNTERS's own first five beats (``cycles`` ..
      ``weight_stall``) are host work while the array is idle, each offered at least a
      cycle, and all left more than ``LAG`` cycles before ``non_matrix`` is sampled.
    """
    c = counts
    broken = []
    if not c["array_active"] + c["weight_stall"] <= c["cycles"]:
        broken.append("array_active + weight_stall <= cycles")
    if not c["raw_stall"] + c["host_stall"] + c["instructions"] <= c["cycles"] + 1:
        broken.append("raw_stall + host_stall + instructions <= cycles + 1")
    if not c["non_matrix"] >= _BEATS_BEFORE_NON_MATRIX:
        broken.append(f"non_matrix >= {_BEATS_BEFORE_NON_MATRIX}")
    return broken


def check_counter_invariants(expected: Sequence[int | None], got: Sequence[int],
                             what: str) -> int:
    """Assert :func:`counter_invariants` for every READ_COUNTERS in the core's beats ``got``;
    returns how many were checked."""
    reads = counter_reads(expected, got)
    for k, counts in enumerate(reads):
        broken = counter_invariants(counts)
        assert not broken, (f"{what}: READ_COUNTERS {k} of {len(reads)} breaks "
                            f"{'; '.join(broken)}: {counts}")
    return len(reads)


def check_counter_timing(stream: Sequence[int], starts: Sequence[int], taken: Sequence[int],
                         sent: Sequence[int], expected: Sequence[int | None],
                         got: Sequence[int], what: str) -> int:
    """The timed counters of every READ_COUNTERS after a CLEAR_COUNTERS, against the cycles
    the testbench saw: ``stream`` the beats given to the core, ``starts`` the positions of
    its instruction words, ``taken`` the cycle each beat was taken, ``sent`` the cycle each
    output beat left. For a stream whose instructions all ran (no error discarded any).
    Returns how many reads were checked.

    An instruction is taken in the cycle it issues. With CLEAR_COUNTERS issued in ``c`` and
    READ_COUNTERS in ``r``, a counter sampled in ``t`` counts its events of ``c + 1 .. t - 3``
    (:func:`counter_invariants`), and its beat leaves after ``t``: ``cycles`` is at least
    ``r - 2 - c`` and below the cycle its beat left less ``3 + c``; the front end's kinds of
    cycle (``raw_stall``, ``host_stall``, ``instructions``) fit in ``c + 1 .. r - 1``, as do
    ``array_active`` and ``weight_stall``; ``array_active + non_matrix`` fit before
    ``non_matrix``'s beat left, less three.
    """
    ops = []
    for s in starts:
        if s < len(taken):
            opcode = int(stream[s]) & 0xF
            if opcode in (isa.Opcode.CLEAR_COUNTERS.value, isa.Opcode.READ_COUNTERS.value):
                ops.append((isa.Opcode(opcode), taken[s]))
    reads = [cycle for opcode, cycle in ops if opcode == isa.Opcode.READ_COUNTERS]
    positions = counter_positions(expected)
    assert len(reads) >= len(positions), \
        f"{what}: {len(positions)} READ_COUNTERS answered, {len(reads)} taken"
    checked = 0
    clear = None
    n = len(isa.COUNTERS)
    reads_seen = 0
    for opcode, cycle in ops:
        if opcode == isa.Opcode.CLEAR_COUNTERS:
            clear = cycle
            continue
        k = reads_seen
        reads_seen += 1
        if clear is None or k >= len(positions) or positions[k] + n > len(got):
            continue
        at = positions[k]
        c, r = clear, cycle
        v = dict(zip(isa.COUNTERS, got[at:at + n], strict=True))
        left = {name: sent[at + i] for i, name in enumerate(isa.COUNTERS)}
        bounds = {
            "cycles >= r - 2 - c": v["cycles"] >= r - 2 - c,
            "cycles <= (cycles's beat left) - 4 - c": v["cycles"] <= left["cycles"] - 4 - c,
            "raw_stall + host_stall + instructions <= r - 1 - c":
                v["raw_stall"] + v["host_stall"] + v["instructions"] <= r - 1 - c,
            "array_active + weight_stall <= r - 1 - c":
                v["array_active"] + v["weight_stall"] <= r - 1 - c,
            "array_active + non_matrix <= (non_matrix's beat left) - 4 - c":
                v["array_active"] + v["non_matrix"] <= left["non_matrix"] - 4 - c,
        }
        broken = [text for text, ok in bounds.items() if not ok]
        assert not broken, (f"{what}: READ_COUNTERS {k} (CLEAR_COUNTERS taken in cycle {c}, "
                            f"READ_COUNTERS in {r}, its beats left in "
                            f"{list(left.values())}) breaks {'; '.join(broken)}: {v}")
        checked += 1
    return checked
