"""cocotb testbench: the systolic array against the golden model.

:class:`MatrixTestbench` and the ``scenario_*`` coroutines also drive the matrix unit
(``tb_matrix_unit.py``), which has the same ``i_weight`` / ``i_act`` / ``o_psum`` streams.
Every output row is compared with ``sim.models.golden.MatrixUnitModel`` with ``==``, in order; every
random test logs its seed and names it in failure messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly

from hdl.config import TPUConfig
from hdl.layouts import act_row_layout, psum_row_layout, weight_row_layout
from sim.models.golden import MatrixUnitModel, operand_range, to_raw
from sim.rtl.runner import config_from_env
from sim.rtl.scoreboard import Scoreboard
from sim.rtl.streams import (
    StreamDriver,
    StreamMonitor,
    burst_stalls,
    random_stalls,
    reset,
    start_clock,
)

CLOCK_NS = 10


class MatrixTestbench:
    """Clock, reset, weight and activation drivers, output monitor, golden model and
    scoreboard for a DUT with the matrix unit's streams."""

    def __init__(self, dut, config: TPUConfig, seed: int, *,
                 act_idle: Iterable[bool] | None = None,
                 weight_idle: Iterable[bool] | None = None,
                 backpressure: Iterable[bool] | None = None):
        self.dut = dut
        self.config = config
        self.seed = seed
        self.log = dut._log
        self.log.info("%s %s: seed %d", dut._name, config.name, seed)
        self.rng = np.random.default_rng(seed)
        self.model = MatrixUnitModel(config.rows, config.cols, config.acc_width)
        self.scoreboard = Scoreboard(f"{dut._name} {config.name}", seed, self.log)
        start_clock(dut, CLOCK_NS)
        clk = dut.clk
        self.weight = StreamDriver(dut, "i_weight", clk,
                                   weight_row_layout(config.cols, config.data_width),
                                   weight_idle)
        self.act = StreamDriver(dut, "i_act", clk,
                                act_row_layout(config.rows, config.data_width), act_idle)
        self.out = StreamMonitor(dut, "o_psum", clk,
                                 psum_row_layout(config.cols, config.acc_width),
                                 backpressure, callback=self.scoreboard.receive)
        # The matrix unit groups its status strobes as ``o_status``; the array has them bare.
        status = "o_status__" if hasattr(dut, "o_status__weight_stall") else "o_"
        self.weight_stall = getattr(dut, status + "weight_stall")
        self.weight_shift = getattr(dut, status + "weight_shift")
        self.weight_stall_cycles = 0
        self.weight_shift_cycles = 0
        self.expected_rows = 0
        self.weight_rows = 0
        self.counting = False
        self.rule_checks = 0
        self.violations: list[str] = []
        cocotb.start_soon(self._count())
        cocotb.start_soon(self._check_output())

    async def _count(self) -> None:
        """Performance-counter strobes, sampled like the streams."""
        while True:
            await FallingEdge(self.dut.clk)
            await ReadOnly()
            if not self.counting:
                continue
            self.weight_stall_cycles += int(self.weight_stall.value)
            self.weight_shift_cycles += int(self.weight_shift.value)

    def _enables(self) -> tuple[list, object | None, list]:
        """With the registered enable (see ``hdl/datapath/systolic_array.py``): every copy of the
        enable register, the skid's ``full``, and the register ``stop`` with the pipeline's
        last two valid stages, found in the generated Verilog's hierarchy; ``([], None, [])``
        otherwise."""
        array = getattr(self.dut, "array", self.dut)     # the matrix unit holds the array
        skid = getattr(array, "skid_full", None)
        if skid is None:
            return [], None, []
        cfg = self.config
        names = (["advance", "en_valid_pipe"]
                 + [f"en_pe_{r}_{c}" for r in range(cfg.rows) for c in range(cfg.cols)]
                 + [f"en_act_skew_{r}" for r in range(cfg.rows)]
                 + [f"en_wbus_skew_{c}" for c in range(cfg.cols)]
                 + [f"en_psum_deskew_{c}" for c in range(cfg.cols - 1)])
        copies = [getattr(array, name) for name in names]
        last = cfg.array_latency - 1
        return copies, skid, [array.stop, getattr(array, f"valid_pipe_d{last}"),
                              getattr(array, f"valid_pipe_d{last - 1}")]

    async def _check_output(self) -> None:
        """Stream rules on ``o_psum`` every cycle: a row offered and not taken is offered
        again, unchanged. With the registered enable also its invariants: the copies agree,
        the pipeline stops only while both the skid and the pipeline's output hold a row
        (so a row leaving the pipeline always has somewhere to go), and the register ``stop``
        is what it stands for (a row in the skid or the output, and one right behind)."""
        valid, ready, payload = (getattr(self.dut, f"o_psum__{name}")
                                 for name in ("valid", "ready", "payload"))
        copies, skid, stages = self._enables()
        held = None
        cycle = 0
        while True:
            await FallingEdge(self.dut.clk)
            await ReadOnly()
            cycle += 1
            now = payload.value.to_unsigned() if valid.value else None
            if held is not None and now != held:
                self.violations.append(f"cycle {cycle}: o_psum offered a row and changed it "
                                       f"(or dropped valid) before it was taken")
            held = now if valid.value and not ready.value else None
            if copies and not self.dut.rst.value:
                stop, last, behind = (int(signal.value) for signal in stages)
                full = int(skid.value)
                values = {int(en.value) for en in copies}
                if len(values) != 1:
                    self.violations.append(f"cycle {cycle}: enable copies disagree")
                elif values != {int(not (full and last))}:
                    self.violations.append(
                        f"cycle {cycle}: enable {values.pop()} with skid_full={full}, "
                        f"last valid stage={last}")
                if stop != ((full | last) & behind):
                    self.violations.append(
                        f"cycle {cycle}: stop={stop} with skid_full={full}, last two valid "
                        f"stages {last}, {behind}")
            self.rule_checks += 1

    async def reset(self) -> None:
        await reset(self.dut)
        self.counting = True

    # Stimulus -------------------------------------------------------------------------------

    def random_signed(self) -> bool:
        """A random signedness; int8 on a core for int8 only (``operands="int8"``)."""
        return self.config.operands == "int8" or bool(self.rng.integers(2))

    def operands(self, shape, signed: bool) -> np.ndarray:
        lo, hi = operand_range(signed, self.config.data_width)
        return self.rng.integers(lo, hi + 1, size=shape, dtype=np.int64)

    def queue_tile(self, weights, signed: bool) -> None:
        """Queue one ``rows x cols`` weight tile (operand values)."""
        weights = np.asarray(weights, dtype=np.int64)
        self.model.push_tile(weights, signed)
        for row in weights:
            self.weight.append({"data": to_raw(row).tolist(), "signed": int(signed)})
        self.weight_rows += len(weights)

    def queue_acts(self, acts, signed: bool | Sequence[bool], *, switch: bool = True) -> None:
        """Queue activation rows; the first carries ``switch`` (takes the next tile)."""
        acts = np.asarray(acts, dtype=np.int64)
        signs = [signed] * len(acts) if isinstance(signed, bool) else list(signed)
        for index, (row, row_signed) in enumerate(zip(acts, signs, strict=True)):
            first = switch and index == 0
            self.scoreboard.expect(self.model.push_act(row, row_signed, first))
            self.act.append({"data": to_raw(row).tolist(), "signed": int(row_signed),
                             "switch": int(first)})
            self.expected_rows += 1

    def queue_job(self, length: int, x_signed: bool | None = None,
                  w_signed: bool | None = None) -> None:
        """A random tile and *length* random activation rows for it; ``None`` signedness is
        drawn at random (per tile for weights, per row for activations). A core for int8
        only (``operands="int8"``) gets int8 whatever is asked."""
        cfg = self.config
        if cfg.operands == "int8":
            x_signed = w_signed = True
        if w_signed is None:
            w_signed = bool(self.rng.integers(2))
        self.queue_tile(self.operands((cfg.rows, cfg.cols), w_signed), w_signed)
        signs = ([x_signed] * length if x_signed is not None
                 else [bool(s) for s in self.rng.integers(2, size=length)])
        acts = np.stack([self.operands(cfg.rows, s) for s in signs])
        self.queue_acts(acts, signs)

    # Completion -----------------------------------------------------------------------------

    async def finish(self, slack: int = 3) -> None:
        """Wait for every expected row (bounded), then a while longer for any extra row, and
        check the scoreboard and that every queued beat was taken."""
        cfg = self.config
        limit = 100 + slack * (self.expected_rows + self.weight_rows + cfg.array_latency)
        waited = 0
        while self.scoreboard.outstanding and not self.scoreboard.errors and waited < limit:
            await ClockCycles(self.dut.clk, 16)
            waited += 16
        await ClockCycles(self.dut.clk, cfg.array_latency + cfg.rows + 8)
        self.scoreboard.check_done()
        assert self.act.pending() == 0 and self.weight.pending() == 0, (
            f"{self.act.pending()} activation and {self.weight.pending()} weight beats never "
            f"accepted (seed {self.seed})")
        assert len(self.out.received) == self.expected_rows, (
            f"received {len(self.out.received)} rows, expected {self.expected_rows} "
            f"(seed {self.seed})")
        assert self.rule_checks > 0
        assert not self.violations, (
            f"{len(self.violations)} violations, first {self.violations[:3]} (seed {self.seed})")
        self.log.info("%d rows checked, %d weight rows, %d activation stall cycles",
                      self.expected_rows, self.weight_rows, len(self.act.stalls))


def stall_patterns(name: str, seed: int) -> dict:
    """Named idle/backpressure patterns, reproducible from *seed*."""
    def stalls(make, act, weight, out) -> dict:
        return {"act_idle": make(seed + 1, act), "weight_idle": make(seed + 2, weight),
                "backpressure": make(seed + 3, out)}

    if name == "none":
        return {}
    if name == "light":
        return stalls(random_stalls, 0.2, 0.2, 0.2)
    if name == "heavy":
        return stalls(random_stalls, 0.5, 0.6, 0.6)
    if name == "bursts":
        return stalls(burst_stalls, 6, 10, 12)
    raise ValueError(f"unknown stall pattern {name!r}")


def alternate() -> Iterable[bool]:
    while True:
        yield True
        yield False


# Scenarios (shared with tb_matrix_unit) -------------------------------------------------------

async def scenario_random(dut, seed: int, x_signed: bool | None, w_signed: bool | None) -> None:
    """Random tiles and activations, back to back, for one signedness combination
    (``None``: random per tile / per row)."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed)
    await tb.reset()
    for length in (cfg.rows + 2, 2 * cfg.rows, cfg.rows + 5):
        tb.queue_job(length, x_signed, w_signed)
    await tb.finish()


EXTREMES = {
    # name: (activation value(s), activation signed, weight value(s), weight signed)
    "min_x_min": (-128, True, -128, True),
    "umax_x_umax": (255, False, 255, False),
    "all_127": (127, True, 127, True),
    "min_x_127": (-128, True, 127, True),
    "umax_x_min": (255, False, -128, True),
    "min_x_umax": (-128, True, 255, False),
    "alternating": ("alt", True, "alt", True),
}


async def scenario_extremes(dut) -> None:
    """Extreme operands summed over a whole column, one tile per case, back to back."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed=0)
    await tb.reset()
    r = np.arange(cfg.rows)[:, None]
    c = np.arange(cfg.cols)[None, :]
    int8_only = cfg.operands == "int8"
    for name, (x, x_signed, w, w_signed) in EXTREMES.items():
        if int8_only and not (x_signed and w_signed):
            continue
        if x == "alt":
            acts = np.stack([np.where(np.arange(cfg.rows) % 2 == k, 127, -128)
                             for k in (0, 1)])
            weights = np.where((r + c) % 2 == 0, -128, 127)
        else:
            acts = np.full((2, cfg.rows), x)
            weights = np.full((cfg.rows, cfg.cols), w)
        tb.log.info("case %s", name)
        tb.queue_tile(weights, w_signed)
        tb.queue_acts(acts, x_signed)
    # The sums the model predicts, written out for the plain cases: a whole column of products.
    assert tb.scoreboard.expected[0][0] == 16384 * cfg.rows
    if not int8_only:
        assert tb.scoreboard.expected[2][0] == 65025 * cfg.rows
    await tb.finish()


async def scenario_back_to_back(dut, seed: int) -> None:
    """Tiles of at least ``rows`` rows with no idle and no backpressure: after the first
    switch the array never stalls an activation, outputs leave one per cycle, and every row
    takes exactly ``array_latency`` cycles."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed)
    await tb.reset()
    lengths = [cfg.rows, cfg.rows, cfg.rows + 1, cfg.rows, 2 * cfg.rows]
    for length in lengths:
        tb.queue_job(length)
    await tb.finish()
    late = [i for i in tb.act.stalls if i != 0]
    assert not late, (f"activation rows {sorted(set(late))} stalled after the first switch "
                      f"({len(late)} cycles; seed {seed})")
    assert tb.weight_stall_cycles == len(tb.act.stalls), (
        f"{tb.weight_stall._name} high {tb.weight_stall_cycles} cycles, activation stalled "
        f"{len(tb.act.stalls)} (seed {seed})")
    assert tb.weight_shift_cycles == tb.weight_rows, (
        f"{tb.weight_shift._name} high {tb.weight_shift_cycles} cycles for {tb.weight_rows} "
        f"weight rows (seed {seed})")
    gaps = np.diff(tb.out.cycles)
    assert (gaps == 1).all(), f"output rows not back to back: gaps {gaps.tolist()} (seed {seed})"
    latency = np.array(tb.out.cycles) - np.array(tb.act.sent_cycles)
    assert (latency == cfg.array_latency).all(), (
        f"latency {sorted(set(latency.tolist()))}, expected {cfg.array_latency} (seed {seed})")


async def scenario_stalls(dut, seed: int, pattern: str) -> None:
    """Random input idle cycles and output backpressure."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed, **stall_patterns(pattern, seed))
    await tb.reset()
    for length in (cfg.rows + 1, 3, 2 * cfg.rows, 1, cfg.rows):
        tb.queue_job(length)
    await tb.finish(slack=12)


async def scenario_uneven_tiles(dut, seed: int, pattern: str) -> None:
    """Tile switches in the middle of the stream: tiles with fewer rows than ``rows`` (the
    array waits for the next tile's shift), exactly ``rows`` and more."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed, **stall_patterns(pattern, seed))
    await tb.reset()
    lengths = [1, max(1, cfg.rows - 1), cfg.rows + 3, 2, cfg.rows, 1, 1, 2 * cfg.rows + 1]
    for length in lengths:
        tb.queue_job(length)
    await tb.finish(slack=12)


async def scenario_backpressure(dut, seed: int, pattern: str) -> None:
    """Output backpressure alone: every row arrives exactly once, in order."""
    cfg = config_from_env()
    backpressure = {"alternate": alternate(),
                    "random": random_stalls(seed, 0.7),
                    "bursts": burst_stalls(seed, 3 * cfg.array_latency)}[pattern]
    tb = MatrixTestbench(dut, cfg, seed, backpressure=backpressure)
    await tb.reset()
    for length in (2 * cfg.rows, cfg.rows + 3, 2):
        tb.queue_job(length)
    await tb.finish(slack=16)


# Tests ----------------------------------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(x_signed=[False, True], w_signed=[False, True])
async def test_random(dut, x_signed: bool, w_signed: bool):
    await scenario_random(dut, 100 + 2 * x_signed + w_signed, x_signed, w_signed)


@cocotb.test()
async def test_random_mixed(dut):
    """Signedness drawn per tile and per activation row."""
    await scenario_random(dut, 110, None, None)


@cocotb.test()
async def test_extremes(dut):
    await scenario_extremes(dut)


@cocotb.test()
async def test_back_to_back(dut):
    await scenario_back_to_back(dut, 120)


@cocotb.test()
@cocotb.parametrize(pattern=["light", "heavy", "bursts"])
async def test_stalls(dut, pattern: str):
    await scenario_stalls(dut, 130 + ["light", "heavy", "bursts"].index(pattern), pattern)


@cocotb.test()
@cocotb.parametrize(pattern=["none", "light"])
async def test_uneven_tiles(dut, pattern: str):
    await scenario_uneven_tiles(dut, 140 + ["none", "light"].index(pattern), pattern)


@cocotb.test()
@cocotb.parametrize(pattern=["alternate", "random", "bursts"])
async def test_backpressure(dut, pattern: str):
    await scenario_backpressure(dut, 150 + ["alternate", "random", "bursts"].index(pattern),
                                pattern)


@cocotb.test()
async def test_shadow_interlock(dut):
    """With no activations, the array takes exactly one tile into its shadow registers and
    then holds ``i_weight`` off; the next tile shifts in from the switch on."""
    cfg = config_from_env()
    tb = MatrixTestbench(dut, cfg, seed=160)
    await tb.reset()
    for _ in range(2):
        w_signed = tb.random_signed()
        tb.queue_tile(tb.operands((cfg.rows, cfg.cols), w_signed), w_signed)
    await ClockCycles(dut.clk, 4 * cfg.rows + 10)
    assert tb.weight.sent == cfg.rows, f"array took {tb.weight.sent} weight rows, not {cfg.rows}"
    await ReadOnly()
    assert dut.o_shadow_full.value == 1
    assert dut.i_weight__ready.value == 0
    await FallingEdge(dut.clk)
    for _ in range(2):
        tb.queue_acts(tb.operands((cfg.rows, cfg.rows), True), True)
    await tb.finish()
