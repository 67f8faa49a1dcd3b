"""Host streams for the core's tests: a read-back of the whole state, and fuzz streams.

:func:`dump_program` makes the core send everything it holds. :func:`fuzz_case` writes a
valid prefix that leaves state behind, then garbage that must stop the core with an error:
random beats, reserved opcodes, instructions with a field out of range or an operand the
state forbids, valid instructions (with reserved bits set), resynchronisation words while
no error is pending, and instructions whose data beats are cut short and followed by more
instructions (which the core, like the ISA simulator, takes as data). The garbage ends once
the ISA simulator has stopped on an error, followed by a few beats the core must discard.

Pure Python and numpy: usable from pytest and from cocotb testbenches.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from funcov import activate_functions

from firmware.asm import Program, encode, field_specs
from hdl import isa
from hdl.config import TPUConfig
from hdl.isa import Func, Opcode, Pool
from sim.models.isa_sim import POOL_WINDOW, IsaSim

__all__ = ["load_weight_set", "dump_program", "FuzzCase", "fuzz_case", "FUZZ_KINDS"]

_INSTR_MASK = (1 << isa.INSTR_BITS) - 1


def load_weight_set(p: Program, rng: np.random.Generator, tiles: int | None = None) -> None:
    """LOAD_WEIGHTS of random tiles ``0..tiles-1`` (all by default), alternately int8 and
    uint8."""
    cfg = p.config
    for t in range(cfg.weight_mem_tiles if tiles is None else tiles):
        signed = t % 2 == 0
        lo, hi = (-128, 128) if signed else (0, 256)
        p.load_weights(t, rng.integers(lo, hi, (cfg.rows, cfg.cols)), signed=signed)


def dump_program(sim: IsaSim) -> Program:
    """A program that makes the core send everything it holds, for the state ``sim`` is in
    (so it never fails): the unified buffer; every accumulator row through each parameter
    slot as it is, then through known parameters at shifts 0, 8, 16 and 24 (bias 0,
    multiplier 1); the counters; the active tile, each queued tile and each written tile,
    multiplied by unit vectors and sent twice (bias 0 and bias -128, so that int8 and uint8
    weights both come back exactly); on a core with the programmable table, every entry
    (ACTIVATE's function TABLE of accumulators holding -128..127). It overwrites the state
    as it goes."""
    cfg: TPUConfig = sim.config
    rows, cols = cfg.rows, cfg.cols
    assert cfg.ub_depth >= 3 * rows
    p = Program(cfg)
    p.write_host(0, cfg.ub_depth)
    chunk = min(cfg.acc_depth, cfg.ub_depth)

    def activations(slot: int) -> None:
        for base in range(0, cfg.acc_depth, chunk):
            n = min(chunk, cfg.acc_depth - base)
            p.activate(base, 0, n, slot=slot)
            p.write_host(0, n)

    for slot in range(cfg.param_slots):
        activations(slot)
    for slot in range(cfg.param_slots):
        p.load_params(slot, [0] * cols, [1] * cols, shift=(8 * slot) % 64)
        activations(slot)
    p.read_counters()
    # Weights: unit vectors in rows 0..rows-1, products in accumulator rows 0..rows-1.
    p.read_host(0, np.eye(rows, cfg.ub_row, dtype=np.int64))
    p.load_params(0, [0] * cols, [1] * cols)
    p.load_params(1, [-128] * cols, [1] * cols)

    def show(switch: bool) -> None:
        p.matmul(0, 0, rows, switch=switch)
        p.activate(0, rows, rows, slot=0)
        p.activate(0, 2 * rows, rows, slot=1)
        p.write_host(rows, 2 * rows)

    if sim.active is not None:
        show(switch=False)
    for _ in sim.queue:
        show(switch=True)
    for tile in np.flatnonzero(sim.weight_written):
        p.read_weights(int(tile), 1)
        show(switch=True)
    if cfg.lookup_table:
        # An identity tile copies min(rows, cols) bytes of a buffer row into accumulators;
        # slot 0 holds the identity parameters, so q = the byte: entry q + 128.
        per = min(rows, cols)
        values = np.resize(np.arange(-128, 128), -(-isa.TABLE_ENTRIES // per) * per)
        inputs = np.zeros((len(values) // per, cfg.ub_row), dtype=np.int64)
        inputs[:, :per] = values.reshape(-1, per)
        p.load_weights(0, np.eye(rows, cols, dtype=np.int64))
        p.read_weights(0, 1)
        for base in range(0, len(inputs), chunk):
            n = min(chunk, len(inputs) - base)
            p.read_host(0, inputs[base:base + n])
            p.matmul(0, 0, n, switch=base == 0)
            p.activate(0, 0, n, func=Func.TABLE, slot=0)
            p.write_host(0, n)
    p.halt()
    return p


# Fuzzing -------------------------------------------------------------------------------------

#: Kinds of garbage piece.
FUZZ_KINDS = ("random", "reserved", "bad_field", "valid", "resync", "truncated")


@dataclass
class FuzzCase:
    """A valid prefix, then garbage; ``pieces`` names each piece of the garbage
    (``(kind, first beat, end)``, positions in :attr:`garbage`), ``stop`` the piece the ISA
    simulator stopped in."""
    seed: int
    config: TPUConfig
    prefix: list[int]
    garbage: list[int] = field(default_factory=list)
    pieces: list[tuple[str, int, int]] = field(default_factory=list)
    stop: int = -1

    @property
    def beats(self) -> list[int]:
        return self.prefix + self.garbage

    def summary(self) -> str:
        kinds = ", ".join(f"{kind}[{a}:{b}]" for kind, a, b in self.pieces)
        return (f"seed {self.seed} ({self.config.name}): prefix of {len(self.prefix)} beats, "
                f"garbage {kinds}; the ISA simulator stops in piece {self.stop}")


def _reserved_mask(opcode: Opcode) -> int:
    mask = 0
    for spec in field_specs(opcode):
        if spec.kind == "reserved":
            mask |= ((1 << spec.width) - 1) << spec.offset
    return mask


class _Fuzzer:
    def __init__(self, config: TPUConfig, seed: int):
        self.cfg = config
        self.rng = np.random.default_rng(seed)
        self.bits = random.Random(seed)
        self.sim = IsaSim(config)

    def beat(self) -> int:
        """A random beat that is not the resynchronisation word."""
        while True:
            beat = self.bits.getrandbits(self.cfg.host_width)
            if beat & _INSTR_MASK != isa.RESYNC_WORD:
                return beat

    def high(self) -> int:
        """Random bits above the instruction word (ignored by the core), sometimes."""
        if self.cfg.host_width == isa.INSTR_BITS or self.rng.random() < 0.5:
            return 0
        return self.bits.getrandbits(self.cfg.host_width - isa.INSTR_BITS) << isa.INSTR_BITS

    def n(self, lo: int, hi: int) -> int:
        """An integer in ``lo..hi`` (inclusive)."""
        return int(self.rng.integers(lo, hi + 1))

    def shift(self, lo: int, hi: int):
        """A LOAD_PARAMS shift in ``lo..hi``: one for every column, or (half the time) one per
        column."""
        if self.rng.random() < 0.5:
            return self.n(lo, hi)
        return self.rng.integers(lo, hi + 1, self.cfg.cols)

    def rounding(self) -> isa.Rounding:
        return isa.Rounding(self.n(0, len(isa.Rounding) - 1))

    def func(self) -> Func:
        """A valid ACTIVATE function: TABLE and NORMALISE only on a core built with them."""
        funcs = activate_functions(self.cfg)
        return funcs[self.n(0, len(funcs) - 1)]

    def table(self) -> list[int]:
        """256 table entries (raw bytes), a quarter of them the byte's extremes."""
        entries = self.rng.integers(0, 256, isa.TABLE_ENTRIES)
        extreme = self.rng.random(isa.TABLE_ENTRIES) < 0.25
        return np.where(extreme, self.rng.choice([0x00, 0x7F, 0x80, 0xFF],
                                                 isa.TABLE_ENTRIES), entries).tolist()

    # Pieces ----------------------------------------------------------------------------------

    def prefix(self) -> Program:
        """A valid program that writes every kind of state."""
        cfg, rng, n = self.cfg, self.rng, self.n
        p = Program(cfg)
        tiles = n(2, cfg.weight_mem_tiles)
        load_weight_set(p, rng, tiles)
        ub_rows = n(4, min(cfg.ub_depth, 32))
        p.read_host(n(0, cfg.ub_depth - ub_rows), rng.integers(-128, 256, (ub_rows, cfg.ub_row)))
        cap = cfg.weight_fifo_depth + 1
        queued = n(1, min(cap, tiles))
        p.read_weights(0, queued)
        count = n(1, min(cfg.acc_depth, cfg.ub_depth) // 2)
        acc = n(0, cfg.acc_depth - count)
        p.matmul(n(0, cfg.ub_depth - count), acc, count, switch=True, signed=bool(n(0, 1)))
        p.matmul(n(0, cfg.ub_depth - count), acc, count, accumulate=True)
        slot = n(0, cfg.param_slots - 1)
        p.load_params(slot, rng.integers(-2**12, 2**12, cfg.cols),
                      rng.integers(1, 2**14, cfg.cols), shift=self.shift(4, 40),
                      zp=n(-128, 127), clamp=n(-128, 127), rounding=self.rounding())
        if cfg.lookup_table:
            p.load_table(self.table())
        pool = Pool(n(0, 2))
        window = POOL_WINDOW[pool]
        act = (count // window) * window
        if act:
            p.activate(acc, n(0, cfg.ub_depth - act // window), act, func=self.func(),
                       pool=pool, slot=slot)
        p.write_host(n(0, cfg.ub_depth - 4), 4)
        if queued < tiles and rng.random() < 0.5:
            p.read_weights(queued, 1)                 # a tile left in the queue
        if rng.random() < 0.5:
            p.halt()                                  # the garbage starts a new program
        return p

    def valid(self) -> list[int]:
        """One valid instruction for the state the ISA simulator is in, with its data; its
        reserved bits set at random."""
        cfg, sim, rng, n = self.cfg, self.sim, self.rng, self.n
        choices: list[Callable[[Program], object]] = [
            lambda p: p.nop(), lambda p: p.sync(), lambda p: p.clear_counters(),
            lambda p: p.read_counters(), lambda p: p.halt(),
        ]

        def span(depth: int, most: int = 8) -> tuple[int, int]:
            count = n(1, min(most, depth))
            return n(0, depth - count), count

        def read_host(p):
            ub, count = span(cfg.ub_depth)
            p.read_host(ub, rng.integers(-128, 256, (count, cfg.ub_row)))

        def write_host(p):
            p.write_host(*span(cfg.ub_depth))

        def load_weights(p):
            tile, count = span(cfg.weight_mem_tiles, 2)
            p.load_weights(tile, rng.integers(-128, 128, (count, cfg.rows, cfg.cols)),
                           signed=bool(n(0, 1)))

        def load_params(p):
            p.load_params(n(0, cfg.param_slots - 1), rng.integers(-2**31, 2**31, cfg.cols),
                          rng.integers(-2**31, 2**31, cfg.cols), shift=self.shift(0, 63),
                          zp=n(-128, 127), clamp=n(-128, 127), rounding=self.rounding())

        def activate(p):
            pool = Pool(n(0, 2))
            window = POOL_WINDOW[pool]
            count = window * n(1, 4)
            p.activate(n(0, cfg.acc_depth - count), n(0, cfg.ub_depth - count // window),
                       count, func=self.func(), pool=pool, slot=n(0, cfg.param_slots - 1))

        def ub_to_weights(p):
            transpose = bool(n(0, 1))
            count = n(1, cfg.cols if transpose else cfg.rows)
            p.ub_to_weights(n(0, cfg.ub_depth - count), n(0, cfg.weight_mem_tiles - 1), count,
                            transpose=transpose, signed=cfg.operands == "int8" or bool(n(0, 1)))

        choices += [read_host, write_host, load_weights, load_params, activate]
        if cfg.ub_to_weights:
            choices.append(ub_to_weights)
        if cfg.lookup_table:
            choices.append(lambda p: p.load_table(self.table()))
        if sim.queue or sim.active is not None:
            def matmul(p):
                ub, count = span(min(cfg.ub_depth, cfg.acc_depth))
                p.matmul(ub, n(0, cfg.acc_depth - count), count,
                         switch=bool(sim.queue) and (sim.active is None or bool(n(0, 1))),
                         accumulate=bool(n(0, 1)), signed=bool(n(0, 1)))
            choices.append(matmul)
        written = np.flatnonzero(sim.weight_written)
        room = cfg.weight_fifo_depth + 1 - len(sim.queue)
        if len(written) and room:
            choices.append(lambda p: p.read_weights(int(rng.choice(written)), 1))
        p = Program(cfg)
        choices[n(0, len(choices) - 1)](p)
        beats = list(p.beats)
        opcode = Opcode(beats[0] & 0xF)
        if rng.random() < 0.3:
            beats[0] |= self.bits.getrandbits(64) & _reserved_mask(opcode)
        beats[0] |= self.high()
        return beats

    def bad_field(self) -> list[int]:
        """An instruction word with a field out of range, or an operand the state forbids
        (the ISA simulator decides which error, if any)."""
        cfg, n = self.cfg, self.n
        ub, acc, tiles = cfg.ub_depth, cfg.acc_depth, cfg.weight_mem_tiles
        big = (1 << 16) - 1
        counted = [Opcode.READ_HOST, Opcode.WRITE_HOST, Opcode.LOAD_WEIGHTS,
                   Opcode.READ_WEIGHTS, Opcode.MATMUL, Opcode.ACTIVATE, Opcode.UB_TO_WEIGHTS]
        op = counted[n(0, len(counted) - 1)]
        makers: list[Callable[[], int]] = [
            lambda: encode(op, count=0),
            lambda: encode(Opcode.READ_HOST, ub_addr=n(ub - 3, big), count=n(4, big)),
            lambda: encode(Opcode.WRITE_HOST, ub_addr=n(0, big), count=n(ub + 1, big)),
            lambda: encode(Opcode.MATMUL, ub_addr=n(ub - 1, big), acc_addr=0, count=2),
            lambda: encode(Opcode.MATMUL, ub_addr=0, acc_addr=n(acc - 1, big), count=2),
            lambda: encode(Opcode.ACTIVATE, acc_addr=n(acc, big), ub_addr=0, count=1),
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=n(ub, big), count=1),
            # Function 7; NORMALISE (6) and TABLE: BAD_FIELD on a core without the row scale
            # or the table, else valid.
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=0, count=1, func=n(6, 7)),
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=0, count=1, func=Func.TABLE),
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=0, count=4, pool=3),
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=0, count=2 * n(0, 3) + 1,
                           pool=Pool.MAX2),
            lambda: encode(Opcode.ACTIVATE, acc_addr=0, ub_addr=0, count=1,
                           slot=n(cfg.param_slots, 7)),
            lambda: encode(Opcode.LOAD_PARAMS, slot=n(cfg.param_slots, 7)),
            lambda: encode(Opcode.LOAD_PARAMS, slot=n(0, cfg.param_slots - 1), rounding=3,
                           column_shifts=n(0, 1), shift=n(0, 63)),
            lambda: encode(Opcode.LOAD_WEIGHTS, tile=n(tiles - 1, big), count=n(2, big)),
            lambda: encode(Opcode.READ_WEIGHTS, tile=n(0, tiles), count=n(tiles, big)),
            lambda: encode(Opcode.READ_WEIGHTS, tile=n(0, tiles - 1), count=1),  # unwritten?
            lambda: encode(Opcode.READ_WEIGHTS, tile=0, count=cfg.weight_fifo_depth + 1),
            lambda: encode(Opcode.MATMUL, ub_addr=0, acc_addr=0, count=1, switch=1),  # empty?
            # UB_TO_WEIGHTS (UNKNOWN_OPCODE on a core without it): a count past the tile's
            # rows, or columns when transposed; rows past the buffer; a tile past the
            # weight memory; uint8 (refused by an int8-only core).
            lambda: encode(Opcode.UB_TO_WEIGHTS, ub_addr=0, tile=0, count=n(cfg.rows + 1, big)),
            lambda: encode(Opcode.UB_TO_WEIGHTS, ub_addr=0, tile=0, transpose=1,
                           count=n(cfg.cols + 1, big)),
            lambda: encode(Opcode.UB_TO_WEIGHTS, ub_addr=n(ub - 1, big), tile=0, count=2,
                           transpose=int(cfg.rows < 2)),
            lambda: encode(Opcode.UB_TO_WEIGHTS, ub_addr=0, tile=n(tiles, big), count=1),
            lambda: encode(Opcode.UB_TO_WEIGHTS, ub_addr=0, tile=0, count=1, signed=0),
            # LOAD_TABLE: UNKNOWN_OPCODE on a core without the table; on one with it, the
            # beats after it are its entries.
            lambda: encode(Opcode.LOAD_TABLE),
        ]
        return [makers[n(0, len(makers) - 1)]() | self.high()]

    def reserved(self) -> list[int]:
        # Opcode 15; 12 (UB_TO_WEIGHTS), 13 (LOAD_TABLE) and 14 (MATMUL_LOOKUP) on a core
        # without them.
        built = {o.value for o in self.cfg.opcodes}
        unknown = [o for o in range(12, 16) if o not in built]
        while True:
            word = (self.bits.getrandbits(60) << 4) | unknown[self.n(0, len(unknown) - 1)]
            if word != isa.RESYNC_WORD:
                return [word | self.high()]

    def truncated(self) -> list[int]:
        """An instruction that takes data, some of its data beats, then 1 to 3 more
        instructions (data to the core)."""
        cfg, rng, n = self.cfg, self.rng, self.n
        p = Program(cfg)
        kind = n(0, 3 if cfg.lookup_table else 2)
        if kind == 3:
            p.load_table(self.table())
        elif kind == 0:
            count = n(2, 6)
            p.read_host(n(0, cfg.ub_depth - count), rng.integers(-128, 256, (count, cfg.ub_row)))
        elif kind == 1:
            count = n(1, 2)
            p.load_weights(n(0, cfg.weight_mem_tiles - count),
                           rng.integers(-128, 128, (count, cfg.rows, cfg.cols)))
        elif kind == 2:
            p.load_params(n(0, cfg.param_slots - 1), rng.integers(-2**31, 2**31, cfg.cols),
                          rng.integers(-2**31, 2**31, cfg.cols), shift=self.shift(0, 63))
        beats = p.beats[:n(1, len(p.beats) - 1)]
        for _ in range(n(1, 3)):
            beats += [self.valid, self.bad_field, self.reserved][n(0, 2)]()
        return beats

    def piece(self, kind: str) -> list[int]:
        if kind == "random":
            return [self.beat() for _ in range(self.n(1, 3))]
        if kind == "resync":
            return [isa.RESYNC_WORD | self.high()]
        return getattr(self, kind)()


def fuzz_case(config: TPUConfig, seed: int, pieces: int = 8) -> FuzzCase:
    """The fuzz stream of ``seed``: a valid prefix, then garbage pieces until the ISA
    simulator stops on an error (at most ``pieces``, then reserved opcodes until it stops),
    then 0 to 4 random beats after the error. Run from reset."""
    fuzzer = _Fuzzer(config, seed)
    prefix = fuzzer.prefix().beats
    fuzzer.sim.feed(prefix)
    assert fuzzer.sim.error == isa.ErrorCode.NONE, "the prefix must be valid"
    case = FuzzCase(seed, config, prefix)
    weights = [2, 1, 3, 5, 1, 3]                   # FUZZ_KINDS order
    while fuzzer.sim.error == isa.ErrorCode.NONE:
        if len(case.pieces) < pieces:
            kind = fuzzer.bits.choices(FUZZ_KINDS, weights)[0]
        else:
            kind = "reserved"
        beats = fuzzer.piece(kind)
        # Only the beats up to the error matter to the simulator; the rest is discarded.
        fuzzer.sim.feed(beats)
        case.pieces.append((kind, len(case.garbage), len(case.garbage) + len(beats)))
        case.garbage += beats
    case.stop = len(case.pieces) - 1
    after = [fuzzer.beat() for _ in range(fuzzer.n(0, 4))]
    if after:
        case.pieces.append(("after the error", len(case.garbage), len(case.garbage) + len(after)))
        case.garbage += after
    return case
