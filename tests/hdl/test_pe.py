"""PE: cocotb lock-step tests (tb_pe.py) run through sim.rtl.runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from hdl.datapath.pe import PE
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "directed": ["test_weight_bus", "test_switch", "test_timing", "test_extremes",
                 "test_psum_wrap"],
    "random": ["test_random"],
}


def make_pe() -> PE:
    return PE(data_width=8, acc_width=32, row=1, row_bits=2)


def make_lut_pe() -> PE:
    """The shift-and-add multiplier that parts short of DSP blocks use."""
    return PE(data_width=8, acc_width=32, row=1, row_bits=2, multiplier="lut")


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == sorted(cocotb_test_names(HERE / "tb_pe.py"))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("multiplier", ["dsp", "lut"])
def test_pe(multiplier: str, group: str):
    factory = make_pe if multiplier == "dsp" else make_lut_pe
    run("pe", factory, f"row1-{multiplier}", "tb_pe", HERE, GROUPS[group], label=group)
