"""Activation unit: cocotb tests (tb_activation.py) for rows of 2 and 4 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from amaranth.hdl import Module, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from tiers import tiered

from hdl.datapath.activation import ActivationUnit
from hdl.datapath.activation_serial import SerialActivationUnit
from hdl.layouts import acc_row_layout
from hdl.ports import ColumnWord, requant_params_layout
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
COLS = {"c2": 2, "c4": 4}
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "function": ["test_function"],
    "directed": ["test_lut_sweep", "test_rounding_known_answers",
                 "test_rounding_modes_known_answers", "test_variable_windows",
                 "test_throughput", "test_fill"],
}


#: The bench's test of a unit built with the row scale (NORMALISE), run on that build alone.
NORMALISE_TESTS = ["test_normalise_divisors"]


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), NORMALISE_TESTS)) == \
        sorted(cocotb_test_names(HERE / "tb_activation.py"))


@pytest.mark.parametrize("size, group", tiered(
    [(size, group) for size in COLS for group in GROUPS], fast=[("c4", "directed")]))
def test_activation(size: str, group: str):
    cols = COLS[size]
    run("activation", lambda: ActivationUnit(cols=cols, acc_width=32), size,
        "tb_activation", HERE, GROUPS[group], label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": cols})})


@pytest.mark.parametrize("group", tiered(GROUPS, fast=["directed"]))
def test_activation_ecp5(group: str):
    """The partial products on instantiated MULT18X18D blocks (their simulation model), as
    the ULX3S build has them: the same results and timing."""
    run("activation", lambda: ActivationUnit(cols=4, acc_width=32, multiplier="ecp5"),
        "c4-ecp5", "tb_activation", HERE, GROUPS[group], label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": 4})})


class SerialWithParamRows(wiring.Component):
    """The serial unit behind the pipelined unit's ports, so that the same bench drives both:
    its ``params`` words read from whole parameter rows on ``i_params`` with the activation
    engine's store's timing (the word selected in one cycle is there the next)."""

    def __init__(self, cols: int, *, row_scale: bool = False):
        self.cols = cols
        self.row_scale = row_scale
        super().__init__({
            "i_row":    In(stream.Signature(acc_row_layout(cols, 32))),
            "o_row":    Out(stream.Signature(data.ArrayLayout(signed(8), cols))),
            "i_params": In(requant_params_layout(cols)),
            "o_busy":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = SerialActivationUnit(cols=self.cols, acc_width=32,
                                                        row_scale=self.row_scale)
        wiring.connect(m, wiring.flipped(self.i_row), unit.i_row)
        wiring.connect(m, unit.o_row, wiring.flipped(self.o_row))
        p, sel = self.i_params, unit.params
        # Each column's shift from its own word (column_shifts), as the store gives it.
        m.d.comb += [
            self.o_busy.eq(unit.o_busy),
            sel.shift.eq(0), sel.column_shifts.eq(1), sel.rounding.eq(p.rounding),
            sel.zero_point.eq(p.zero_point), sel.clamp_hi.eq(p.clamp_hi), sel.func.eq(p.func),
        ]
        with m.Switch(sel.kind):
            with m.Case(ColumnWord.BIAS):
                m.d.sync += sel.word.eq(p.bias[sel.col])
            with m.Case(ColumnWord.MULTIPLIER):
                m.d.sync += sel.word.eq(p.multiplier[sel.col])
            with m.Case(ColumnWord.SHIFT):
                m.d.sync += sel.word.eq(p.shift[sel.col])
        return m


@pytest.mark.parametrize("group", [pytest.param("function", marks=pytest.mark.slow),
                                   "directed-serial"])
def test_serial_activation(group: str):
    """The serial unit (one datapath time-shared over 4 columns) against the same golden
    checks as the pipelined unit; the throughput and fill tests are the pipelined unit's
    alone (its timing and output FIFO). The function sweep (every function and window, at
    the limits) is ``slow``, at four times the pipelined unit's cycles; in CI the known
    answers and the ``icebreaker`` random programs check the serial unit."""
    tests = GROUPS["function"] if group == "function" else \
        [t for t in GROUPS["directed"] if t not in ("test_throughput", "test_fill")]
    run("activation_serial", lambda: SerialWithParamRows(4), "c4",
        "tb_activation", HERE, tests, label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": 4, "serial": True})})


@pytest.mark.parametrize("unit", ["pipelined", "serial"])
def test_normalise_divisors(unit: str):
    """NORMALISE on divisors of 2**30 and more (bit 30 of the row sum: a core program needs
    some 16,000 MATMULs to accumulate one), on both units built with the row scale."""
    if unit == "pipelined":
        factory, top = (lambda: ActivationUnit(cols=4, acc_width=32, row_scale=True)), \
            "activation"
    else:
        factory, top = (lambda: SerialWithParamRows(4, row_scale=True)), "activation_serial"
    run(top, factory, "c4-row-scale", "tb_activation", HERE, NORMALISE_TESTS,
        label="normalise",
        extra_env={"AMTPU_ACT": json.dumps({"cols": 4, "serial": unit == "serial"})})
