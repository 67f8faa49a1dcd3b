"""Bit-exact numpy golden model of the matrix unit.

Everything the hardware computes is written out here with its exact integer semantics, so
the RTL's results compare with ``==``:

- operands are 8-bit, each stream (activations) or tile (weights) either signed (int8,
  -128..127) or unsigned (uint8, 0..255); on the wire they are the same 8 raw bits;
- products and sums are exact integers reduced modulo 2**32 into int32 (two's complement
  wrap-around, no saturation), which is what a 32-bit adder chain does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["wrap", "to_raw", "from_raw", "operand_range", "matmul", "MatrixUnitModel"]


def operand_range(signed: bool, width: int = 8) -> tuple[int, int]:
    """Inclusive range of an operand."""
    return (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)


def _check_operands(name: str, values: np.ndarray, signed: bool, width: int = 8):
    lo, hi = operand_range(signed, width)
    if values.size and (values.min() < lo or values.max() > hi):
        kind = "signed" if signed else "unsigned"
        raise ValueError(f"{name} holds values outside {lo}..{hi} ({kind} {width}-bit): "
                         f"min {values.min()}, max {values.max()}")


def wrap(values, bits: int = 32) -> np.ndarray:
    """Reduce integers modulo ``2**bits`` into the signed range (two's complement)."""
    values = np.asarray(values, dtype=object if bits > 62 else np.int64)
    mask = (1 << bits) - 1
    half = 1 << (bits - 1)
    return (((values + half) & mask) - half).astype(np.int64)


def to_raw(values, width: int = 8) -> np.ndarray:
    """Operands (signed or unsigned) to their raw ``width``-bit patterns."""
    return (np.asarray(values, dtype=np.int64) & ((1 << width) - 1)).astype(np.int64)


def from_raw(raw, signed: bool, width: int = 8) -> np.ndarray:
    """Raw ``width``-bit patterns to operand values."""
    raw = np.asarray(raw, dtype=np.int64) & ((1 << width) - 1)
    if signed:
        raw = np.where(raw >= 1 << (width - 1), raw - (1 << width), raw)
    return raw


def matmul(x, w, *, x_signed: bool = True, w_signed: bool = True,
           acc_width: int = 32) -> np.ndarray:
    """``x @ w`` with ``acc_width``-bit wrap-around, as the systolic array computes it.

    ``x`` is ``(M, K)`` and ``w`` is ``(K, N)``, both holding operand values (not raw bits)
    in the range their signedness allows. Returns ``(M, N)`` int64 holding int32 values.
    """
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N), got {x.shape} @ {w.shape}")
    _check_operands("x", x, x_signed)
    _check_operands("w", w, w_signed)
    # |product| <= 2**16 and K <= 2**16 here, so int64 sums are exact before the wrap.
    return wrap(x @ w, acc_width)


@dataclass
class MatrixUnitModel:
    """Transaction model of the matrix unit (weight FIFO + systolic array).

    Feed it the same weight tiles and activation rows as the hardware; it returns the output
    rows the hardware must produce, in order. A row with ``switch`` set takes the oldest
    queued tile; rows before the first switch have no weights and are rejected.
    """

    rows: int
    cols: int
    acc_width: int = 32
    _tiles: list = field(default_factory=list)
    _active: tuple | None = None

    def push_tile(self, tile, signed: bool):
        tile = np.asarray(tile, dtype=np.int64)
        if tile.shape != (self.rows, self.cols):
            raise ValueError(f"weight tile must be {self.rows}x{self.cols}, got {tile.shape}")
        _check_operands("weight tile", tile, signed)
        self._tiles.append((tile, signed))

    def push_act(self, act_row, signed: bool, switch: bool) -> np.ndarray:
        """Output row for one activation row."""
        if switch:
            if not self._tiles:
                raise ValueError("switch with no weight tile queued")
            self._active = self._tiles.pop(0)
        if self._active is None:
            raise ValueError("activation row before the first tile switch")
        tile, w_signed = self._active
        act_row = np.asarray(act_row, dtype=np.int64).reshape(1, self.rows)
        return matmul(act_row, tile, x_signed=signed, w_signed=w_signed,
                      acc_width=self.acc_width)[0]
