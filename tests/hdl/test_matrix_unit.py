"""Matrix unit: cocotb tests (tb_matrix_unit.py) per configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import group_tests, grouped, tiered

from hdl.datapath.matrix_unit import MatrixUnit
from hdl.presets import get_config
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
CONFIGS = [*tiered(["tiny", "small", "wide", "default"], fast=["wide"]),
           pytest.param("large", marks=pytest.mark.slow)]
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "random": ["test_random", "test_random_mixed", "test_extremes"],
    "flow": ["test_back_to_back", "test_uneven_tiles", "test_prefetch"],
    "stalls": ["test_stalls", "test_backpressure"],
}
# One PE's registers, grouped in the .gtkw written with WAVES=1.
PE_0_0 = ["array.core.pe_0_0." + name for name in ("active", "shadow", "product", "o_psum")]


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_matrix_unit.py"))


@pytest.mark.parametrize("group", grouped(GROUPS))
@pytest.mark.parametrize("config_key", CONFIGS)
def test_matrix_unit(config_key: str, group: str):
    config = get_config(config_key)
    run("matrix_unit", lambda: MatrixUnit(config), config_key, "tb_matrix_unit", HERE,
        group_tests(GROUPS, group), label=group, gtkw_groups={"pe_0_0": PE_0_0})


@pytest.mark.parametrize("group", ["flow", "stalls"])
def test_matrix_unit_ecp5(group: str):
    """The weight FIFO in front of the fast pipeline's array on MULT18X18D (a cycle longer per PE,
    the registered enable: ``i_weight.ready`` from a register)."""
    config = get_config("small").replace(multiplier="ecp5", pipeline="fast")
    run("matrix_unit", lambda: MatrixUnit(config), "small-ecp5", "tb_matrix_unit", HERE,
        group_tests(GROUPS, group), label=group, config=config, sim="icarus")
