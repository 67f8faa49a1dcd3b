"""gemmlowp's own fixed-point functions as the reference for :mod:`firmware.fixedpoint`.

``gemmlowp_ref.cc`` (beside this file) calls ``exp_on_negative_values``,
``one_over_one_plus_x_for_x_in_0_1``, ``SaturatingRoundingDoublingHighMul`` and
``RoundingDivideByPOT`` from gemmlowp's header (Debian's ``libgemmlowp-dev``, which ``make
setup`` installs where it can). :func:`build` compiles it, :func:`answer` runs queries through
it. The table ``data/gemmlowp_fixedpoint.npz`` holds its answers to :func:`table_queries`, so
the bit-for-bit test runs on machines without the header; regenerate it with
``python tests/firmware/gemmlowp.py`` (it prints the seed and the header it used).

Queries are ``(function, x, y)`` with ``function`` one of :data:`FUNCTIONS`: ``exp`` (``x``
the input's integer bits, ``y`` the raw input), ``recip`` (``x``; ``y`` unused), ``srdhm``
(``x``, ``y``), ``rdbpot`` (``x``, exponent ``y``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "gemmlowp_ref.cc"
TABLE = HERE / "data" / "gemmlowp_fixedpoint.npz"
HEADER = Path("/usr/include/gemmlowp/fixedpoint/fixedpoint.h")
FUNCTIONS = ("exp", "recip", "srdhm", "rdbpot")
#: The integer bits of the inputs the table's exp queries use: TFLite's softmax's 5, the
#: clamp's side (6 and more), and the ends.
EXP_BITS = (0, 1, 5, 6, 10)
TABLE_SEED = 20261207
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def missing() -> str | None:
    """Why the reference cannot be built here, or ``None``."""
    if not HEADER.is_file():
        return f"gemmlowp's header {HEADER} is absent (apt-get install libgemmlowp-dev)"
    if shutil.which("g++") is None:
        return "no g++ to compile gemmlowp's header with"
    return None


def build(out_dir: Path) -> Path:
    """Compile ``gemmlowp_ref.cc`` into *out_dir*; returns the binary."""
    binary = Path(out_dir) / "gemmlowp_ref"
    subprocess.run(["g++", "-O2", "-std=c++14", "-o", str(binary), str(SOURCE)], check=True,
                   capture_output=True, text=True)
    return binary


def answer(binary: Path, funcs: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """gemmlowp's answers to the queries ``(FUNCTIONS[funcs[i]], xs[i], ys[i])``."""
    lines = [f"{FUNCTIONS[f]} {x}" + ("" if FUNCTIONS[f] == "recip" else f" {y}")
             for f, x, y in zip(funcs.tolist(), xs.tolist(), ys.tolist(), strict=True)]
    done = subprocess.run([str(binary)], input="\n".join(lines) + "\n", check=True,
                          capture_output=True, text=True)
    out = np.array([int(v) for v in done.stdout.split()], dtype=np.int64)
    assert len(out) == len(lines), f"gemmlowp_ref answered {len(out)} of {len(lines)} queries"
    return out


def _edges(bits: int) -> list[int]:
    """Inputs at and beside every power of two below zero, the ends of int32."""
    out = [0, INT32_MIN, INT32_MIN + 1, INT32_MAX]
    for k in range(bits):
        out += [-(1 << k) - 1, -(1 << k), -(1 << k) + 1, (1 << k) - 1, 1 << k]
    return out


def queries(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edge cases of every function and *n* random queries of each (exp: *n* for each of
    :data:`EXP_BITS`, half of them uniform over the negative int32, half of a log-uniform
    size, where the barrel shifter's small steps are)."""
    funcs: list[int] = []
    xs: list[int] = []
    ys: list[int] = []

    def add(func: str, x, y) -> None:
        x, y = np.broadcast_arrays(np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64))
        funcs.extend([FUNCTIONS.index(func)] * x.size)
        xs.extend(x.ravel().tolist())
        ys.extend(y.ravel().tolist())

    negative = [v for v in _edges(31) if v <= 0]
    for bits in EXP_BITS:
        clamp = [-(1 << (36 - bits)) + d for d in (-1, 0, 1)] if bits > 5 else []
        add("exp", bits, negative + clamp)
        add("exp", bits, rng.integers(INT32_MIN, 1, n // 2))
        size = rng.uniform(0, 31, n - n // 2)
        add("exp", bits, -np.floor(2.0 ** size).astype(np.int64))
    in_0_1 = [v for v in _edges(31) if 0 <= v <= INT32_MAX]
    add("recip", in_0_1 + rng.integers(0, INT32_MAX, n, endpoint=True).tolist(), 0)
    ends = [INT32_MIN, INT32_MIN + 1, -1, 0, 1, 1 << 30, INT32_MAX]
    a, b = np.meshgrid(ends, ends)
    add("srdhm", a.ravel(), b.ravel())
    add("srdhm", rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True),
        rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True))
    # Products on a tie (an odd multiple of 2**30), where the rounding direction shows.
    odd = 2 * rng.integers(-(1 << 14), 1 << 14, n // 4) + 1
    add("srdhm", odd << 15, 1 << 15)
    exps = np.arange(32)
    add("rdbpot", np.repeat(ends + [5, -5, 6, -6, 7, -7], 32), np.tile(exps, len(ends) + 6))
    add("rdbpot", rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True),
        rng.integers(0, 32, n))
    return (np.array(funcs, dtype=np.int64), np.array(xs, dtype=np.int64),
            np.array(ys, dtype=np.int64))


def table_queries() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The committed table's queries (seed :data:`TABLE_SEED`)."""
    return queries(np.random.default_rng(TABLE_SEED), 1000)


def main() -> None:
    why = missing()
    if why is not None:
        sys.exit(f"gemmlowp.py: {why}")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        funcs, xs, ys = table_queries()
        out = answer(binary, funcs, xs, ys)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(TABLE, funcs=funcs, xs=xs, ys=ys, out=out)
    print(f"wrote {TABLE.relative_to(HERE.parents[1])}: {len(out)} answers of {HEADER} "
          f"(seed {TABLE_SEED})")


if __name__ == "__main__":
    main()
