"""Activation unit: cocotb tests (tb_activation.py) for rows of 2 and 4 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdl.activation import ActivationUnit
from hdl.activation_serial import SerialActivationUnit
from sim.runner import cocotb_test_names, run

HERE = Path(__file__).parent
COLS = {"c2": 2, "c4": 4}
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "function": ["test_function"],
    "directed": ["test_lut_sweep", "test_rounding_known_answers", "test_variable_windows",
                 "test_throughput"],
}


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_activation.py"))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("size", COLS)
def test_activation(size: str, group: str):
    cols = COLS[size]
    run("activation", lambda: ActivationUnit(cols=cols, acc_width=32), size,
        "tb_activation", HERE, GROUPS[group], label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": cols})})


@pytest.mark.parametrize("group", GROUPS)
def test_activation_ecp5(group: str):
    """The partial products on instantiated MULT18X18D blocks (their simulation model), as
    the ULX3S build has them: the same results and timing."""
    run("activation", lambda: ActivationUnit(cols=4, acc_width=32, multiplier="ecp5"),
        "c4-ecp5", "tb_activation", HERE, GROUPS[group], label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": 4})})


@pytest.mark.parametrize("group", ["function", "directed-serial"])
def test_serial_activation(group: str):
    """The serial unit (one datapath time-shared over 4 columns) against the same golden
    checks as the pipelined unit; the throughput test is the pipelined unit's alone."""
    tests = GROUPS["function"] if group == "function" else \
        [t for t in GROUPS["directed"] if t != "test_throughput"]
    run("activation_serial", lambda: SerialActivationUnit(cols=4, acc_width=32), "c4",
        "tb_activation", HERE, tests, label=group,
        extra_env={"AMTPU_ACT": json.dumps({"cols": 4, "serial": True})})
