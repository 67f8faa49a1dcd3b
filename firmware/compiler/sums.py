"""Sum tables: an elementwise function of two int8 tensors as ``T0[a] + T1[b]``, for
MATMUL_LOOKUP (:class:`hdl.isa.MatmulLookup`) and an ACTIVATE that divides by ``2**shift``.

TFLite's quantised ADD is such a sum by construction (each input's term is rounded on its
own, :func:`tflite_terms`). onnxruntime's QLinearAdd is not: it adds the two scaled inputs in
float32 and rounds the sum once. But its 65,536 results are known (its reference, evaluated
on every pair of bytes), and whether two tables reproduce all of them is a system of
difference constraints, ``lo(t) <= T0[a] + T1[b] <= hi(t)`` for the pair's result ``t``:
:func:`fit_tables` solves it exactly (Bellman-Ford on the 512 unknowns) or proves that no
tables exist at that precision. Nothing here knows networks; it imports none of the
package's modules.
"""

from __future__ import annotations

import numpy as np

from firmware import fixedpoint as fp

__all__ = ["BYTES", "tflite_terms", "fit_tables", "FIT_SHIFTS"]

#: Every int8 value, indexed by its byte (``x & 255``): the order of a sum table's entries.
BYTES = np.where(np.arange(256) > 127, np.arange(256) - 256, np.arange(256))

#: The shifts :func:`fit_tables` tries, in order: the precision of the tables' fraction.
FIT_SHIFTS = (16, 18, 20, 22)


def tflite_terms(zero_point: int, left_shift: int, multiplier: int, shift: int, *,
                 single: bool) -> np.ndarray:
    """TFLite ADD's term of one input for each byte: ``mbqm((x - zp) << left_shift, m, s)``."""
    return fp.mbqm((BYTES - zero_point) << left_shift, multiplier, shift, single=single)


def fit_tables(results: np.ndarray, *, shifts=FIT_SHIFTS, limit: int = 1 << 29
               ) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Two int32 tables and a shift ``s`` with ``clamp(round_half_even((T0[a] + T1[b]) /
    2**s), -128, 127) == results[a, b]`` for every pair of bytes (``results``: (256, 256)
    int8 values, indexed by the bytes), no sum on a tie and every entry within ``limit``;
    or None where no such tables exist at any of ``shifts`` (or they would exceed
    ``limit``). A result of -128 or 127 bounds the sum on one side only (the clamp)."""
    results = np.asarray(results, dtype=np.int64)
    if results.shape != (256, 256):
        raise ValueError(f"fit_tables takes (256, 256) results, got {results.shape}")
    for s in shifts:
        half = 1 << (s - 1)
        # The sum must lie strictly inside (t - 1/2, t + 1/2) * 2**s.
        lo = np.where(results > -128, (2 * results - 1) * half + 1, -np.inf)
        hi = np.where(results < 127, (2 * results + 1) * half - 1, np.inf)
        # x = T0, y = -T1: x_a - y_b <= hi, y_b - x_a <= -lo; shortest paths from a source
        # joined to every node by 0.
        x = np.zeros(256)
        y = np.zeros(256)
        for _ in range(1024):
            nx = np.minimum(x, (y[None, :] + hi).min(axis=1))
            ny = np.minimum(y, (nx[:, None] - lo).min(axis=0))
            if np.array_equal(nx, x) and np.array_equal(ny, y):
                break
            x, y = nx, ny
        else:
            continue                    # a negative cycle: no tables at this precision
        t0, t1 = x.astype(np.int64), (-y).astype(np.int64)
        if max(np.abs(t0).max(), np.abs(t1).max()) > limit:
            continue
        total = t0[:, None] + t1[None, :]
        got = np.clip(_round_half_even(total, s), -128, 127)
        if np.array_equal(got, results):
            return t0, t1, s
    return None


def _round_half_even(v: np.ndarray, s: int) -> np.ndarray:
    q, r = np.divmod(v, 1 << s)
    half = 1 << (s - 1)
    return q + ((r > half) | ((r == half) & (q % 2 == 1)))
