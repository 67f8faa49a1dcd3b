"""cocotb testbench: the activation unit (requantise, function, max-pool) against the golden
model.

The DUT is ``ActivationUnit(cols=, acc_width=32)`` with ``cols`` from ``AMTPU_ACT`` (JSON,
set by ``test_activation.py``). Every burst of rows is predicted with ``golden.requantise``,
``golden.activate`` and ``golden.max_pool_rows`` (``last`` closes each window) and compared
with ``==``, in order, by a scoreboard. The parameters (the ``i_params`` struct: bias,
multiplier, a shift per column, the rounding mode, zero point, clamp_hi, function) are held
steady during a burst and changed only once ``o_row`` has delivered every expected row and
``o_busy`` is low.

Stimulus per burst: random "typical" scales with shifts that differ per column and a random
rounding mode, a sweep of every requantised value q in -128..127 (so the SIGMOID/TANH ROMs are
read at all 256 indices), the int32 limits of accumulator, bias and multiplier with shifts 0,
1, 31, 62, 63 and zero points / clamps at the int8 limits, and exact rounding ties ``p =
2**(shift-1) * odd`` of both signs with their neighbours in every rounding mode (for DOUBLE
also the first rounding's ties and the second's). A coverage count checks that each of those
corners was really produced.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

import cocotb
import numpy as np
from amaranth.hdl import signed
from amaranth.lib import data
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly

from hdl.datapath.activation import ActivationUnit
from hdl.datapath.activation_serial import element_cycles
from hdl.datapath.activation_table import lut_table
from hdl.isa import Func, Rounding
from hdl.layouts import acc_row_layout
from hdl.ports import requant_params_layout
from sim.models.golden import (
    SIGMOID_LUT,
    TANH_LUT,
    activate,
    max_pool_rows,
    reciprocals,
    requantise,
    requantise_normalised,
    rounding_shift,
    wrap,
)
from sim.rtl.scoreboard import Scoreboard
from sim.rtl.streams import (
    StreamDriver,
    StreamMonitor,
    burst_stalls,
    pack,
    random_stalls,
    reset,
    start_clock,
)

ENV = "AMTPU_ACT"
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
ACC_EXTREMES = [INT32_MIN, INT32_MIN + 1, -(1 << 30), -1, 0, 1, 1 << 30, INT32_MAX - 1,
                INT32_MAX]
PARAM_EXTREMES = [INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX]
EXTREME_SHIFTS = [0, 1, 31, 62, 63]
TIE_SHIFTS = [1, 2, 7, 31, 32, 33, 61, 62, 63]
#: The unit's functions in the sweeps: the bench builds it without the programmable table and
#: the row scale, whose functions (TABLE, NORMALISE) the core's benches test
#: (test_lookup_table.py, test_normalise.py), as the core builds them; a unit built with the
#: row scale runs test_normalise_divisors alone (divisors no core program reaches quickly).
UNIT_FUNCS = [f for f in Func if f not in (Func.TABLE, Func.NORMALISE)]
FUNCS = [f.name for f in UNIT_FUNCS]
WINDOWS = [1, 2, 4]
LUTS = {"SIGMOID": SIGMOID_LUT, "TANH": TANH_LUT}


def cols_from_env() -> int:
    return int(json.loads(os.environ.get(ENV, '{"cols": 2}'))["cols"])


def row_cycles_from_env() -> int:
    """Cycles the unit may take per row before a drain times out: a few for the pipelined
    unit, ``cols`` elements at the largest shift for the serial one."""
    env = json.loads(os.environ.get(ENV, '{"cols": 2}'))
    return element_cycles(63) * int(env["cols"]) + 10 if env.get("serial") else 20


@dataclass
class Params:
    """One setting of the unit's parameter inputs (``shift``: one for every column, or a
    list with one per column)."""
    bias: list[int]
    multiplier: list[int]
    shift: int | list[int]
    zero_point: int
    clamp_hi: int
    func: Func
    rounding: Rounding = Rounding.HALF_UP

    def shifts(self, cols: int) -> list[int]:
        return [int(s) for s in self.shift] if isinstance(self.shift, list) else \
            [int(self.shift)] * cols

    def __str__(self) -> str:
        return (f"{self.func.name} {self.rounding.name} bias={self.bias} "
                f"multiplier={self.multiplier} shift={self.shift} "
                f"zero_point={self.zero_point} clamp_hi={self.clamp_hi}")


class Testbench:
    """Clock, reset, row driver, output monitor, scoreboard, parameter inputs and the golden
    model of a burst."""

    def __init__(self, dut, seed: int, *, idle=None, backpressure=None):
        self.dut = dut
        self.cols = cols = cols_from_env()
        self.seed = seed
        self.log = dut._log
        self.log.info("activation cols=%d: seed %d", cols, seed)
        self.rng = np.random.default_rng(seed)
        self.in_layout = acc_row_layout(cols, 32)
        self.param_layout = requant_params_layout(cols)
        self.scoreboard = Scoreboard(f"activation cols={cols}", seed, self.log)
        start_clock(dut)
        # Defined from the start, as the core's parameter store is: the pipelined unit keeps
        # per-column copies of the parameters that would hold on to an undefined value.
        dut.i_params.value = 0
        self.source = StreamDriver(dut, "i_row", dut.clk, self.in_layout, idle)
        self.sink = StreamMonitor(dut, "o_row", dut.clk, data.ArrayLayout(signed(8), cols),
                                  backpressure, callback=self.scoreboard.receive)
        self.params: Params | None = None
        self.coverage: Counter[str] = Counter()
        self.rows_in = 0
        self.bursts = 0

    async def reset(self) -> None:
        await reset(self.dut)

    # Parameters and bursts ------------------------------------------------------------------

    async def set_params(self, params: Params) -> None:
        """Change the parameters once everything in flight has come out."""
        await self.drain()
        await FallingEdge(self.dut.clk)
        self.dut.i_params.value = pack(self.param_layout, {
            "bias": params.bias, "multiplier": params.multiplier,
            "shift": params.shifts(self.cols), "rounding": params.rounding,
            "zero_point": int(params.zero_point), "clamp_hi": int(params.clamp_hi),
            "func": params.func})
        self.params = params

    def expected(self, acc: np.ndarray, windows: list[int]) -> np.ndarray:
        """Golden output rows of *acc* under the current parameters, pooled over *windows*
        (row counts); fixed windows go through ``golden.max_pool_rows``."""
        p = self.params
        if p.func == Func.NORMALISE:
            act = requantise_normalised(acc, p.bias, p.shifts(self.cols), p.zero_point,
                                        p.rounding.value)
        else:
            q = requantise(acc, p.bias, p.multiplier, p.shifts(self.cols), p.zero_point,
                           p.rounding.value)
            act = activate(q, p.func.value, p.zero_point, p.clamp_hi)
        if len(set(windows)) == 1:
            return max_pool_rows(act, windows[0])
        bounds = np.cumsum([0, *windows])
        return np.stack([act[a:b].max(axis=0)
                         for a, b in zip(bounds[:-1], bounds[1:], strict=True)])

    def _cover(self, acc: np.ndarray) -> None:
        """Count the corners this burst exercises (recomputed from the golden steps)."""
        prm = self.params
        if prm.func == Func.NORMALISE:
            _, e = reciprocals(acc[:, -1])
            d = acc[:, -1]
            self.coverage["d>=2**30"] += int(np.sum(d >= 1 << 30))
            self.coverage["d<2**30, e=21"] += int(np.sum((d < 1 << 30) & (e == 21)))
            self.coverage["d<=0"] += int(np.sum(d <= 0))
            self.coverage["d<512"] += int(np.sum((d > 0) & (d < 512)))
            self.coverage["clamped at 63"] += int(np.sum(
                np.asarray(prm.shifts(self.cols))[None, :] + e[:, None] > 63))
            return
        bias = np.asarray(prm.bias, dtype=np.int64)
        mult = np.asarray(prm.multiplier, dtype=np.int64)
        s = np.asarray(prm.shifts(self.cols), dtype=np.int64)
        mode = prm.rounding.name
        for value in set(s.tolist()):
            self.coverage[f"shift{value}"] += 1
        self.coverage[mode] += 1
        self.coverage["column_shifts"] += int(len(set(s.tolist())) > 1)
        self.coverage["bias_wrap"] += int(np.any((acc + bias > INT32_MAX)
                                                 | (acc + bias < INT32_MIN)))
        t = wrap(acc + bias)
        p = t * mult
        low = p & ((np.int64(1) << np.maximum(s - 1, 0)) * 2 - 1)       # p mod 2**s
        tie = (s > 0) & (low == (np.int64(1) << np.maximum(s - 1, 0)))
        self.coverage["tie+"] += int(np.sum(tie & (p > 0)))
        self.coverage["tie-"] += int(np.sum(tie & (p < 0)))
        self.coverage[f"{mode}_tie"] += int(np.sum(tie))
        if prm.rounding == Rounding.DOUBLE:
            # The first rounding's ties (p / 2**31 = k + 1/2) and the second's (the first's
            # result an odd multiple of 2**(shift - 32)), where there are two.
            two = s >= 32
            first = rounding_shift(p, 31)
            e = np.maximum(s - 31, 1)
            self.coverage["DOUBLE_tie1"] += int(np.sum(two & ((p & ((1 << 31) - 1)) == 1 << 30)))
            self.coverage["DOUBLE_tie2"] += int(np.sum(
                two & ((first & ((np.int64(1) << e) - 1)) == (np.int64(1) << (e - 1)))))
        r = rounding_shift(p, s, prm.rounding.value)
        self.coverage["sat32_hi"] += int(np.sum(r > INT32_MAX))
        self.coverage["sat32_lo"] += int(np.sum(r < INT32_MIN))
        v = np.clip(r, INT32_MIN, INT32_MAX) + prm.zero_point
        self.coverage["sat8_hi"] += int(np.sum(v > 127))
        self.coverage["sat8_lo"] += int(np.sum(v < -128))
        self.coverage["in_range"] += int(np.sum((v >= -128) & (v <= 127)))
        self.coverage[f"zp{prm.zero_point}"] += 1
        self.coverage[f"clamp{prm.clamp_hi}"] += 1

    def queue(self, acc, window: int | list[int]) -> np.ndarray:
        """Queue the rows of *acc* (``(n, cols)``) with ``last`` closing each window and the
        expected output rows; returns them."""
        acc = np.asarray(acc, dtype=np.int64)
        n = acc.shape[0]
        windows = [window] * (n // window) if isinstance(window, int) else list(window)
        assert sum(windows) == n, f"{n} rows do not split into windows {windows}"
        out = self.expected(acc, windows)
        lasts = set(np.cumsum(windows) - 1)
        for k, row in enumerate(acc):
            self.source.append({"data": row.tolist(), "last": int(k in lasts)})
        for row in out:
            self.scoreboard.expect(row)
        self._cover(acc)
        self.rows_in += n
        self.bursts += 1
        return out

    async def burst(self, params: Params, acc, window: int | list[int]) -> np.ndarray:
        await self.set_params(params)
        return self.queue(acc, window)

    async def drain(self) -> None:
        """Wait until every queued row is in and every expected row out; then the pipeline
        must be empty."""
        limit = 100 + row_cycles_from_env() * (self.source.pending() +
                                                self.scoreboard.outstanding)
        waited = 0
        while waited < limit and not self.scoreboard.errors and (
                self.source.pending() or self.scoreboard.outstanding):
            await ClockCycles(self.dut.clk, 4)
            waited += 4
        if self.scoreboard.errors:
            raise AssertionError(self.scoreboard.errors[0])
        assert waited < limit, (
            f"timeout: {self.source.pending()} rows not taken, {self.scoreboard.outstanding} "
            f"output rows missing after {waited} cycles with {self.params} (seed {self.seed})")
        await ClockCycles(self.dut.clk, 2)
        await ReadOnly()
        assert self.dut.o_busy.value == 0, f"o_busy high after the burst (seed {self.seed})"
        assert self.dut.o_row__valid.value == 0, (
            f"o_row valid with no row expected ({self.params}) (seed {self.seed})")

    async def finish(self) -> None:
        await self.drain()
        self.scoreboard.check_done()
        assert len(self.sink.received) == self.scoreboard.matched
        self.log.info("%d bursts, %d rows in, %d rows out; coverage %s", self.bursts,
                      self.rows_in, self.scoreboard.matched, dict(sorted(self.coverage.items())))

    # Stimulus -------------------------------------------------------------------------------

    def int8(self) -> int:
        return int(self.rng.integers(-128, 128))

    def typical(self, func: Func, rows: int, per_column: bool | None = None
                ) -> tuple[Params, np.ndarray]:
        """Scales a quantised network would use: most outputs in range, some saturated."""
        cols, rng = self.cols, self.rng
        acc = rng.integers(-(1 << 20), (1 << 20) + 1, size=(rows, cols))
        bias = rng.integers(-(1 << 16), (1 << 16) + 1, size=cols)
        mult = rng.integers(1 << 8, 1 << 20, size=cols) * rng.choice([-1, 1], size=cols)
        # |t * m| reaches about 2**(20 + log2 m); shift it down to about 2**7, +-2, each
        # column its own shift half of the time.
        top = int(np.max(np.abs(mult))).bit_length() + 20
        if per_column is None:
            per_column = rng.random() < 0.5
        jitter = rng.permutation(np.arange(-2, 3))[:cols] if per_column else rng.integers(-2, 3)
        shift = np.clip(top - 7 + jitter, 0, 63)
        zp = self.int8()
        clamp = int(rng.integers(zp, 128)) if rng.random() < 0.8 else self.int8()
        rounding = Rounding(int(rng.integers(0, 3)))
        return Params(bias.tolist(), mult.tolist(),
                      [int(x) for x in np.broadcast_to(shift, cols)], zp, clamp, func,
                      rounding), acc

    def sweep(self, func: Func, zero_point: int | None = None
              ) -> tuple[Params, np.ndarray, np.ndarray]:
        """Rows whose requantised values q are each of -128..127 exactly once (random order,
        random bias, multiplier +-1, shift 4, every rounding offset); returns
        ``(params, acc, q)``."""
        cols, rng = self.cols, self.rng
        zp = self.int8() if zero_point is None else zero_point
        q = rng.permutation(np.arange(-128, 128)).reshape(-1, cols)
        sign = rng.choice([-1, 1], size=cols)
        bias = rng.integers(INT32_MIN, INT32_MAX, size=cols, endpoint=True)
        # p = t * sign must round to q - zp: p in [16 (q - zp) - 8, 16 (q - zp) + 7].
        p = 16 * (q - zp) + rng.integers(-8, 8, size=q.shape)
        acc = wrap(p * sign - bias)
        params = Params(bias.tolist(), sign.tolist(), 4, zp, self.int8(), func)
        assert np.array_equal(requantise(acc, bias, sign, 4, zp), q)
        return params, acc, q

    def extremes(self, func: Func, shift: int, rows: int, zero_point: int, clamp_hi: int
                 ) -> tuple[Params, np.ndarray]:
        """int32 limits for accumulator, bias and multiplier (mixed with random values)."""
        cols, rng = self.cols, self.rng
        acc = np.where(rng.random((rows, cols)) < 0.6,
                       rng.choice(ACC_EXTREMES, size=(rows, cols)),
                       rng.integers(INT32_MIN, INT32_MAX, size=(rows, cols), endpoint=True))
        bias = rng.choice(PARAM_EXTREMES, size=cols)
        mult = rng.choice(PARAM_EXTREMES, size=cols)
        mult[0] = rng.choice([INT32_MIN, INT32_MAX])     # at shift 0, 1: int32 saturation
        return Params(bias.tolist(), mult.tolist(), shift, zero_point, clamp_hi, func), acc

    def ties(self, func: Func, shift: int, rows: int, rounding: Rounding = Rounding.HALF_UP
             ) -> tuple[Params, np.ndarray]:
        """Products ``p = 2**(shift-1) * odd`` of both signs (where int32 operands can make
        them), and their neighbours ``p +- multiplier``; for DOUBLE with ``shift >= 32``
        half of the columns instead meet the two roundings' ties (see :meth:`double_ties`)."""
        cols, rng = self.cols, self.rng
        if rounding == Rounding.DOUBLE and shift >= 32 and rng.random() < 0.5:
            return self.double_ties(func, shift, rows)
        # multiplier +-2**a; t = 2**(shift-1-a) * odd must fit int32.
        a = min(max(0, shift - 1 - 30), 31)
        if a == 31:
            mult = np.full(cols, INT32_MIN)          # -2**31: the only int32 of that size
        else:
            mult = rng.choice([-1, 1], size=cols) * (1 << a)
        e = shift - 1 - a                            # t = 2**e * odd
        odd_max = max(1, ((1 << 31) >> e) - 1) if e < 31 else 1
        odd = 2 * rng.integers(-(odd_max // 2) - 1, odd_max // 2 + 1, size=(rows, cols)) + 1
        t = wrap(odd * (1 << e)) if e < 32 else np.full((rows, cols), INT32_MIN)
        t = t + rng.choice([0, 0, 0, 1, -1], size=(rows, cols))   # some neighbours
        t = np.clip(t, INT32_MIN, INT32_MAX)
        bias = rng.integers(INT32_MIN, INT32_MAX, size=cols, endpoint=True)
        acc = wrap(t - bias)
        zp = int(rng.choice([0, self.int8()]))
        return Params(bias.tolist(), mult.tolist(), shift, zp, 127, func, rounding), acc

    def double_ties(self, func: Func, shift: int, rows: int) -> tuple[Params, np.ndarray]:
        """DOUBLE at ``shift >= 32`` with a TFLite-like multiplier ``2**30``, so that ``p /
        2**31 = t / 2``: ``t = odd * 2**e + d`` (``e = shift - 31``, ``d`` in -1..1) puts the
        first rounding on its ties (t odd) and its result on the second rounding's ties."""
        cols, rng = self.cols, self.rng
        e = shift - 31
        odd_max = max(1, (1 << 31) >> e)
        odd = 2 * rng.integers(-(odd_max // 2) - 1, odd_max // 2 + 1, size=(rows, cols)) + 1
        t = np.clip(odd * (1 << e) + rng.integers(-1, 2, size=(rows, cols)),
                    INT32_MIN, INT32_MAX)
        bias = rng.integers(INT32_MIN, INT32_MAX, size=cols, endpoint=True)
        acc = wrap(t - bias)
        mult = [1 << 30] * cols
        return Params(bias.tolist(), mult, shift, 0, 127, func, Rounding.DOUBLE), acc


async def start(dut, seed: int, **stalls) -> Testbench:
    tb = Testbench(dut, seed, **stalls)
    await tb.reset()
    return tb


@cocotb.test()
@cocotb.parametrize(func=FUNCS, window=WINDOWS)
async def test_function(dut, func: str, window: int):
    """Each function with each pooling window: typical scales, a full q sweep (window 2),
    the int32 / int8 limits at shifts 0, 1, 31, 62, 63, and rounding ties at shifts 1 to 63,
    under random input idle and output backpressure; coverage of the corners asserted."""
    seed = 500 + 10 * FUNCS.index(func) + window
    f = Func[func]
    tb = await start(dut, seed, idle=random_stalls(seed + 1, 0.3),
                     backpressure=random_stalls(seed + 2, 0.3))
    for per_column in (True, False):
        await tb.burst(*tb.typical(f, 4 * window, per_column), window)
    if window == 2:
        # Pooled sweep of every q (window 1 is test_lut_sweep's).
        params, acc, _ = tb.sweep(f)
        await tb.burst(params, acc, window)
    # Zero point and clamp at the int8 limits (and one random pair), across the shifts.
    corners = [(-128, 127), (127, -128), (0, 127), (-128, -128), (tb.int8(), tb.int8())]
    for shift, (zp, clamp) in zip(EXTREME_SHIFTS, corners, strict=True):
        await tb.burst(*tb.extremes(f, shift, 4 * window, zp, clamp), window)
    for shift in TIE_SHIFTS:
        for rounding in Rounding:
            await tb.burst(*tb.ties(f, shift, 2 * window, rounding), window)
    await tb.finish()
    missing = [name for name in ("tie+", "tie-", "sat32_hi", "sat32_lo", "sat8_hi", "sat8_lo",
                                 "in_range", "bias_wrap", "zp-128", "zp127", "clamp-128",
                                 "clamp127", "HALF_UP_tie", "HALF_EVEN_tie", "DOUBLE_tie",
                                 "column_shifts",
                                 *(f"shift{s}" for s in EXTREME_SHIFTS))
               if not tb.coverage[name]]
    assert not missing, f"corners not exercised: {missing} (seed {seed})"


@cocotb.test()
@cocotb.parametrize(func=["SIGMOID", "TANH", "IDENTITY"])
async def test_lut_sweep(dut, func: str):
    """q sweeps -128..127 exactly once, pooling window 1: the outputs are the table at every
    index (SIGMOID/TANH: golden LUT, which equals the HDL's ROM contents) or q itself."""
    seed = 560 + ["SIGMOID", "TANH", "IDENTITY"].index(func)
    f = Func[func]
    tb = await start(dut, seed, idle=random_stalls(seed + 1, 0.2),
                     backpressure=random_stalls(seed + 2, 0.3))
    for zp in (0, tb.int8()):
        params, acc, q = tb.sweep(f, zp)
        first = len(tb.sink.received)
        await tb.burst(params, acc, 1)
        await tb.drain()
        got = np.asarray(tb.sink.received[first:], dtype=np.int64)
        if func in LUTS:
            table = LUTS[func]
            assert list(table) == lut_table(f), f"golden {func} LUT differs from the ROM's"
            want = table[q + 128]
        else:
            want = q
        bad = np.argwhere(got != want)
        assert not bad.size, (
            f"{func} zero_point={zp}: q={int(q[tuple(bad[0])])} gave {int(got[tuple(bad[0])])}, "
            f"expected {int(want[tuple(bad[0])])} ({len(bad)} wrong) (seed {seed})")
        seen = np.unique(q)
        assert seen.size == 256, f"sweep covered only {seen.size} q values (seed {seed})"
    await tb.finish()


@cocotb.test()
async def test_rounding_known_answers(dut):
    """Hand-computed results (independent of the golden model, which must agree): ties
    round towards +infinity, shifts 0, 1, 2, 62, 63, int32 and int8 saturation."""
    tb = await start(dut, 570)
    cols = tb.cols
    cases = [
        # (shift, multiplier, accumulator values, expected IDENTITY outputs, zero point 0)
        (1, 1, [1, -1, 3, -3, 5, -5, 2, -2], [1, 0, 2, -1, 3, -2, 1, -1]),
        (2, 1, [2, -2, 6, -6, 1, -1, 3, -3], [1, 0, 2, -1, 0, 0, 1, -1]),
        (0, 1, [127, 128, -128, -129, INT32_MAX, INT32_MIN, 0, -1],
         [127, 127, -128, -128, 127, -128, 0, -1]),
        (62, INT32_MIN, [1 << 30, -(1 << 30), 3 << 29, -(3 << 29), 0, 1, -1, INT32_MIN],
         [0, 1, -1, 1, 0, 0, 0, 1]),
        (63, INT32_MIN, [INT32_MIN, INT32_MAX, 1 << 30, -(1 << 30), 0, 1, -1, 2],
         [1, 0, 0, 0, 0, 0, 0, 0]),
        (63, INT32_MAX, [INT32_MIN, INT32_MAX, INT32_MIN + 1, 0, 1, -1, 1 << 30, -(1 << 30)],
         [0, 0, 0, 0, 0, 0, 0, 0]),
        (31, 1, [1 << 30, -(1 << 30), INT32_MIN, INT32_MAX, (1 << 30) - 1, -(1 << 30) - 1, 0,
                 -1], [1, 0, -1, 1, 0, -1, 0, 0]),
    ]
    for shift, mult, acc_values, want in cases:
        acc = np.repeat(np.asarray(acc_values, dtype=np.int64)[:, None], cols, axis=1)
        params = Params([0] * cols, [mult] * cols, shift, 0, 127, Func.IDENTITY)
        await tb.set_params(params)
        golden = tb.queue(acc, 1)[:, 0].tolist()
        assert golden == want, (
            f"golden requantise disagrees with the hand-computed values for shift {shift}, "
            f"multiplier {mult}: {golden} != {want}")
        first = len(tb.sink.received)
        await tb.drain()
        got = [row[0] for row in tb.sink.received[first:]]
        assert got == want, (
            f"shift {shift} multiplier {mult} acc {acc_values}: got {got}, expected {want} "
            f"(seed {tb.seed})")
    # int32 saturation before the zero point: r = 2**32 - 2 with zero point -128 gives
    # saturate_int8(2**31 - 1 - 128) = 127; r = -2**32 with zero point 127 gives -128.
    for mult, acc_value, zp, want in ((2, INT32_MAX, -128, 127), (2, INT32_MIN, 127, -128)):
        await tb.set_params(Params([0] * cols, [mult] * cols, 0, zp, 127, Func.IDENTITY))
        tb.queue(np.full((1, cols), acc_value), 1)
        first = len(tb.sink.received)
        await tb.drain()
        got = tb.sink.received[first:]
        assert got == [[want] * cols], f"got {got}, expected {[[want] * cols]} (seed {tb.seed})"
    await tb.finish()


@cocotb.test()
async def test_rounding_modes_known_answers(dut):
    """Hand-computed results of HALF_EVEN and DOUBLE (TFLite's two roundings), and of shifts
    that differ per column; then random DOUBLE ties of both roundings, every mode at every
    column's own extreme shift."""
    tb = await start(dut, 575)
    cols = tb.cols
    even, double = Rounding.HALF_EVEN, Rounding.DOUBLE
    cases = [
        # (rounding, shift, multiplier, accumulator values, expected IDENTITY outputs)
        (even, 1, 1, [1, -1, 3, -3, 5, -5, 2, -2], [0, 0, 2, -2, 2, -2, 1, -1]),
        (even, 2, 1, [2, -2, 6, -6, 1, -1, 3, -3], [0, 0, 2, -2, 0, 0, 1, -1]),
        # p / 2**31 = acc / 2, rounded with ties up, then halved with ties away from zero.
        (double, 32, 1 << 30, [1, -1, 3, -3, 5, -5, 2, -2], [1, 0, 1, -1, 2, -1, 1, -1]),
        (double, 33, 1 << 30, [2, -2, 6, -6, 1, -1, 3, -3], [0, 0, 1, -1, 0, 0, 1, 0]),
        # Up to 31, DOUBLE is HALF_UP.
        (double, 31, 1, [1 << 30, -(1 << 30), INT32_MIN, INT32_MAX, (1 << 30) - 1,
                         -(1 << 30) - 1, 0, -1], [1, 0, -1, 1, 0, -1, 0, 0]),
    ]
    for rounding, shift, mult, acc_values, want in cases:
        acc = np.repeat(np.asarray(acc_values, dtype=np.int64)[:, None], cols, axis=1)
        await tb.set_params(Params([0] * cols, [mult] * cols, shift, 0, 127, Func.IDENTITY,
                                   rounding))
        golden = tb.queue(acc, 1)[:, 0].tolist()
        assert golden == want, (
            f"golden requantise disagrees with the hand-computed values for {rounding.name} "
            f"shift {shift}, multiplier {mult}: {golden} != {want}")
        first = len(tb.sink.received)
        await tb.drain()
        got = [row[0] for row in tb.sink.received[first:]]
        assert got == want, (
            f"{rounding.name} shift {shift} multiplier {mult} acc {acc_values}: got {got}, "
            f"expected {want} (seed {tb.seed})")
    # A shift per column: 10 and 12 shifted by 0, 1, 2, 3.
    for rounding, want10 in ((Rounding.HALF_UP, [10, 5, 3, 1]), (even, [10, 5, 2, 1])):
        await tb.set_params(Params([0] * cols, [1] * cols, [0, 1, 2, 3][:cols], 0, 127,
                                   Func.IDENTITY, rounding))
        tb.queue(np.array([[10] * cols, [12] * cols]), 1)
        first = len(tb.sink.received)
        await tb.drain()
        got = tb.sink.received[first:]
        assert got == [want10[:cols], [12, 6, 3, 2][:cols]], (
            f"{rounding.name} shifts 0-3 per column: got {got} (seed {tb.seed})")
    for shift in (32, 33, 40, 55, 61):
        await tb.burst(*tb.double_ties(Func.IDENTITY, shift, 8), 1)
    for _ in range(3):
        for rounding in Rounding:
            params, acc = tb.extremes(Func.IDENTITY, 0, 6, 0, 127)
            params.shift = tb.rng.choice(EXTREME_SHIFTS + TIE_SHIFTS, size=cols).tolist()
            params.rounding = rounding
            await tb.burst(params, acc, 1)
    await tb.finish()
    missing = [name for name in ("DOUBLE_tie1", "DOUBLE_tie2", "column_shifts")
               if not tb.coverage[name]]
    assert not missing, f"corners not exercised: {missing} (seed {tb.seed})"


@cocotb.test()
async def test_variable_windows(dut):
    """Windows of random lengths 1 to 5 back to back (``last`` alone decides), every
    function, under burst stalls."""
    seed = 580
    tb = await start(dut, seed, idle=burst_stalls(seed + 1, 5),
                     backpressure=burst_stalls(seed + 2, 8))
    for f in UNIT_FUNCS:
        windows = tb.rng.integers(1, 6, size=12).tolist()
        params, acc = tb.typical(f, sum(windows))
        await tb.burst(params, acc, windows)
    await tb.finish()


@cocotb.test()
@cocotb.parametrize(window=WINDOWS)
async def test_throughput(dut, window: int):
    """No stalls: a row taken every cycle, and each output row ``STAGES`` cycles after the
    row that closes its window."""
    seed = 590 + window
    tb = await start(dut, seed)
    # Longer than the FIFO and the pipeline together, so that the credit reaches its bound.
    params, acc = tb.typical(Func.RELU, 2 * ActivationUnit.FIFO_DEPTH * window)
    await tb.set_params(params)
    first_in, first_out = tb.source.sent, len(tb.sink.received)
    tb.queue(acc, window)
    await tb.drain()
    sent = tb.source.sent_cycles[first_in:]
    assert sent == list(range(sent[0], sent[0] + len(sent))), (
        f"i_row stalled without backpressure (seed {seed})")
    closing = sent[window - 1::window]
    out = tb.sink.cycles[first_out:]
    want = [c + ActivationUnit.STAGES for c in closing]
    assert out == want, f"output cycles {out}, expected {want} (seed {seed})"
    await tb.finish()


@cocotb.test()
async def test_fill(dut):
    """With ``o_row`` stalled the unit takes rows until it owes exactly ``FIFO_DEPTH``
    windows (what its output FIFO holds), then holds ``i_row`` off; released, every row
    comes out, in order."""
    seed = 600
    depth = ActivationUnit.FIFO_DEPTH
    tb = await start(dut, seed, backpressure=iter(lambda: True, None))
    params, acc = tb.typical(Func.RELU, 2 * depth)
    await tb.set_params(params)
    first = tb.source.sent
    tb.queue(acc, 1)
    await ClockCycles(dut.clk, 2 * depth + ActivationUnit.STAGES + 20)
    await ReadOnly()
    taken = tb.source.sent - first
    assert taken == depth, (
        f"{taken} one-row windows taken with o_row stalled, not {depth} (seed {seed})")
    assert dut.i_row__ready.value == 0, f"i_row ready with the FIFO full (seed {seed})"
    assert dut.o_row__valid.value == 1, f"o_row not valid with rows owed (seed {seed})"
    await FallingEdge(dut.clk)
    tb.sink.set_backpressure_generator(None)
    await tb.finish()


#: Divisors of NORMALISE at the edges of its cut: bit 30 (the row sum's top bit below the
#: sign) and its neighbours, the cut's boundaries, the largest, the exact ones, none.
NORMALISE_DIVISORS = [(1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 30) + (1 << 21),
                      (1 << 30) + (1 << 21) - 1, 3 << 29, INT32_MAX - (1 << 22), INT32_MAX,
                      INT32_MAX - 1, (1 << 29) - 1, 1 << 29, 1 << 21, 511, 512, 513, 1, 2, 0,
                      -1, INT32_MIN]


@cocotb.test()
async def test_normalise_divisors(dut):
    """NORMALISE (a unit built with the row scale) on divisors of 2**30 and more, where the
    cut's priority encoder reads bit 30 and ``e`` is 22, beside 2**30 - 1 (``e`` 21), the
    largest int32, the exact reciprocals below 512 and divisors of 0 or less; each row's
    other columns a random fraction of its divisor (``t / d`` in [-2, 2], so shift 19 makes
    outputs of every size), at shifts 0, 19, 25, 41 and 63 (the clamp) and per column, in
    every rounding mode (the serial unit: one a shift), with bias and zero point, against
    ``golden.requantise_normalised`` with ``==``, under random stalls."""
    seed = 590
    tb = await start(dut, seed, idle=random_stalls(seed + 1, 0.2),
                     backpressure=random_stalls(seed + 2, 0.3))
    cols, rng = tb.cols, tb.rng
    d = np.concatenate([NORMALISE_DIVISORS,
                        rng.integers(1 << 30, INT32_MAX, 12, endpoint=True),
                        rng.integers(1 << 9, 1 << 30, 4)]).astype(np.int64)
    fraction = rng.uniform(-2, 2, (len(d), cols - 1))
    others = wrap(np.round(np.maximum(d, 1)[:, None] * fraction).astype(np.int64))
    others[:2] = [[INT32_MAX] * (cols - 1), [INT32_MIN] * (cols - 1)]
    acc = np.concatenate([others, d[:, None]], axis=1)
    shifts = [0, 19, 25, 41, 63, [19 + 11 * k for k in range(cols)]]
    runs = [(i, shift, rounding) for i, shift in enumerate(shifts) for rounding in Rounding]
    if json.loads(os.environ.get(ENV, "{}")).get("serial"):
        # A serial element takes 37 to 99 cycles: one rounding mode a shift, each mode twice.
        runs = [(i, shift, list(Rounding)[i % 3]) for i, shift in enumerate(shifts)]
    for i, shift, rounding in runs:
        bias = [0] * cols if i % 2 else rng.integers(-1000, 1000, cols).tolist()
        zp = 0 if i % 2 else tb.int8()
        params = Params(bias, [0] * cols, shift, zp, 127, Func.NORMALISE, rounding)
        await tb.burst(params, acc, 1)
    await tb.finish()
    # The divisors reached what they are there for; outputs of every size at shift 19.
    missing = [name for name in ("d>=2**30", "d<2**30, e=21", "d<=0", "d<512", "clamped at 63")
               if not tb.coverage[name]]
    assert not missing, f"NORMALISE corners not exercised: {missing} (seed {seed})"
