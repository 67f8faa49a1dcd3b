"""Constrained-random programs for the core.

:func:`random_program` writes a valid program (no instruction raises an error) that leans on
the interlocks: addresses come from small windows so that instructions overlap in the unified
buffer and accumulators, weight tiles are queued up to the FIFO's capacity, and operands
include the extremes (-128, 127, 255, sums near the int32 limits, saturation). It ends by
reading back every unified-buffer row it may have touched, the counters and a HALT, so the
host sees everything the program computed.

The generator keeps its own model of the state that decides validity (written tiles, queued
tiles, whether a tile is active); :class:`sim.isa_sim.IsaSim` computes the expected output.
"""

from __future__ import annotations

import numpy as np

from firmware.asm import Program
from hdl.config import TPUConfig
from hdl.isa import Func, Pool
from sim.isa_sim import IsaSim

__all__ = ["random_program", "random_bytes", "random_params"]

# Windows the random addresses fall in: small, so that ranges overlap often.
UB_WINDOW = 24
ACC_WINDOW = 16
TILE_WINDOW = 6


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


def random_params(rng: np.random.Generator, cols: int):
    """Bias, multiplier, shift, zero point, clamp: mostly sane scales, sometimes extreme."""
    if rng.random() < 0.2:
        bias = rng.choice([-2**31, 2**31 - 1, 0], cols)
        multiplier = rng.choice([-2**31, 2**31 - 1, 1], cols)
        shift = int(rng.choice([0, 1, 31, 62, 63]))
    else:
        bias = rng.integers(-2**20, 2**20, cols)
        multiplier = rng.integers(1, 2**16, cols) * rng.choice([1, -1], cols)
        shift = int(rng.integers(8, 32))
    zero_point = int(rng.integers(-128, 128))
    clamp = int(rng.integers(-128, 128))
    return bias, multiplier, shift, zero_point, clamp


def random_program(config: TPUConfig, rng: np.random.Generator, length: int = 30,
                   after: IsaSim | None = None) -> Program:
    """A valid random program of about ``length`` instructions plus its read-back tail.

    ``after``: the reference model as it stands before the program runs (programs that run
    back to back inherit queued weight tiles and the active tile); a fresh core if ``None``.
    """
    cfg = config
    prog = Program(cfg)
    ub_window = min(UB_WINDOW, cfg.ub_depth)
    acc_window = min(ACC_WINDOW, cfg.acc_depth)
    tile_window = min(TILE_WINDOW, cfg.weight_mem_tiles)
    max_rows = 2 * cfg.rows + 2
    written: set[int] = set()
    queued = 0
    have_active = False
    if after is not None:
        written = {int(t) for t in np.flatnonzero(after.weight_written)}
        queued = len(after.queue)
        have_active = after.active is not None
    capacity = cfg.weight_fifo_depth + 1

    def span(window: int, most: int) -> tuple[int, int]:
        count = int(rng.integers(1, min(most, window) + 1))
        return int(rng.integers(0, window - count + 1)), count

    # Start with something to multiply: a tile loaded and queued, rows in the buffer.
    prog.load_weights(0, random_bytes(rng, (1, cfg.rows, cfg.cols), True), signed=True)
    written.add(0)
    prog.read_host(0, random_bytes(rng, (ub_window, cfg.ub_row), True))

    for _ in range(length):
        kind = rng.choice(["read_host", "load_weights", "read_weights", "matmul", "matmul",
                           "matmul", "activate", "activate", "load_params", "write_host",
                           "nop", "sync"])
        if kind == "read_host":
            ub, count = span(ub_window, max_rows)
            prog.read_host(ub, random_bytes(rng, (count, cfg.ub_row), bool(rng.integers(2))))
        elif kind == "load_weights":
            tile, count = span(tile_window, 2)
            signed = bool(rng.integers(2))
            prog.load_weights(tile, random_bytes(rng, (count, cfg.rows, cfg.cols), signed),
                              signed=signed)
            written.update(range(tile, tile + count))
        elif kind == "read_weights":
            room = capacity - queued
            runs = [t for t in range(tile_window) if t in written]
            if room <= 0 or not runs:
                continue
            tile = int(rng.choice(runs))
            count = 1
            while count < room and tile + count in written and rng.random() < 0.5:
                count += 1
            prog.read_weights(tile, count)
            queued += count
        elif kind == "matmul":
            switch = queued > 0 and (not have_active or rng.random() < 0.6)
            if not switch and not have_active:
                continue
            ub, count = span(ub_window, max_rows)
            acc = int(rng.integers(0, acc_window - count + 1)) if count <= acc_window else 0
            count = min(count, acc_window)
            prog.matmul(ub, acc, count, switch=switch, accumulate=bool(rng.integers(2)),
                        signed=bool(rng.integers(2)))
            if switch:
                queued -= 1
                have_active = True
        elif kind == "activate":
            pool = Pool(int(rng.integers(0, 3)))
            window = 1 << pool.value
            blocks = int(rng.integers(1, max(1, acc_window // window // 2) + 1))
            count = blocks * window
            acc = int(rng.integers(0, acc_window - count + 1))
            ub = int(rng.integers(0, ub_window - blocks + 1))
            prog.activate(acc, ub, count, func=Func(int(rng.integers(0, 5))), pool=pool,
                          slot=int(rng.integers(0, cfg.param_slots)))
        elif kind == "load_params":
            bias, mult, shift, zp, clamp = random_params(rng, cfg.cols)
            prog.load_params(int(rng.integers(0, cfg.param_slots)), bias, mult, shift=shift,
                             zp=zp, clamp=clamp)
        elif kind == "write_host":
            ub, count = span(ub_window, max_rows)
            prog.write_host(ub, count)
        elif kind == "nop":
            prog.nop()
        else:
            prog.sync()

    # Read back the buffer window (every ACTIVATE result lands there) and the counters.
    prog.write_host(0, ub_window)
    prog.read_counters()
    prog.halt()
    return prog
