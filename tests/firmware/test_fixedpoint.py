"""firmware.fixedpoint equals gemmlowp bit for bit: exp_on_negative_values (TFLite's softmax),
one_over_one_plus_x_for_x_in_0_1, SaturatingRoundingDoublingHighMul and RoundingDivideByPOT,
against the answers of gemmlowp's own header (:mod:`gemmlowp`): the committed table on every
machine, a fresh random sweep where the header is installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gemmlowp import FUNCTIONS, TABLE, answer, build, missing, queries, table_queries

from firmware import fixedpoint as fp


def _ours(funcs: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """firmware.fixedpoint's answers to the same queries."""
    out = np.empty_like(xs)
    for f, name in enumerate(FUNCTIONS):
        pick = funcs == f
        x, y = xs[pick], ys[pick]
        if name == "exp":
            got = np.empty_like(x)
            for bits in np.unique(x):
                at = x == bits
                got[at] = fp.exp_on_negative_values(y[at], integer_bits=int(bits))
        elif name == "recip":
            got = fp.one_over_one_plus_x(x)
        elif name == "srdhm":
            got = fp.srdhm(x, y)
        else:
            got = np.array([fp.rdbpot(xi, yi) for xi, yi in zip(x, y, strict=True)])
        out[pick] = got
    return out


def _compare(funcs, xs, ys, want, what: str) -> None:
    got = _ours(funcs, xs, ys)
    wrong = np.flatnonzero(got != want)
    shown = [f"{FUNCTIONS[funcs[i]]}({xs[i]}, {ys[i]}): {got[i]}, gemmlowp {want[i]}"
             for i in wrong[:8]]
    assert not len(wrong), (f"{what}: {len(wrong)} of {len(want)} answers differ from "
                            f"gemmlowp's:\n" + "\n".join(shown))


def test_equals_gemmlowp_table():
    """Every answer of the committed table (9,271 of gemmlowp's: exp at 0, 1, 5, 6 and 10
    integer bits, at every power of two and the clamp, uniform and log-uniform inputs; the
    reciprocal; the doubling high multiply with its saturation and ties; the rounding
    divide at every exponent) equals firmware.fixedpoint's."""
    table = np.load(TABLE)
    funcs, xs, ys = table_queries()
    assert np.array_equal(table["funcs"], funcs) and np.array_equal(table["xs"], xs) and \
        np.array_equal(table["ys"], ys), \
        f"{TABLE} was not written for these queries: python tests/firmware/gemmlowp.py"
    _compare(funcs, xs, ys, table["out"], f"the table {TABLE.name}")
    # The table covers what softmax uses: exp(0) is One, exp(-1) and below.
    exp5 = (funcs == 0) & (xs == 5)
    assert (table["out"][exp5 & (ys == 0)] == fp.INT32_MAX).all()
    assert (table["out"][exp5 & (ys == fp.INT32_MIN)] == 0).all()


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_equals_gemmlowp_header(tmp_path: Path):
    """A fresh random sweep (seed printed) through gemmlowp's header compiled here, and the
    committed table is still what the header answers."""
    binary = build(tmp_path)
    seed = 4242
    print(f"seed {seed}")
    funcs, xs, ys = queries(np.random.default_rng(seed), 20_000)
    _compare(funcs, xs, ys, answer(binary, funcs, xs, ys), f"seed {seed}")
    funcs, xs, ys = table_queries()
    assert np.array_equal(answer(binary, funcs, xs, ys), np.load(TABLE)["out"]), \
        f"{TABLE} differs from the installed header's answers: python tests/firmware/gemmlowp.py"
