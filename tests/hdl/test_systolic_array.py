"""Systolic array: cocotb tests (tb_systolic_array.py) per configuration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tiers import group_tests, grouped, tiered

from hdl.datapath.systolic_array import SystolicArray
from hdl.presets import get_config
from sim.rtl.gtkw import fst_signals, gtkw_traces
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
CONFIGS = [*tiered(["tiny", "small", "wide", "default"], fast=["wide"]),
           pytest.param("large", marks=pytest.mark.slow)]
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "random": ["test_random", "test_random_mixed", "test_extremes"],
    "flow": ["test_back_to_back", "test_uneven_tiles", "test_shadow_interlock"],
    "stalls": ["test_stalls", "test_backpressure"],
}
# One PE's registers, grouped in the .gtkw written with WAVES=1.
PE_0_0 = ["core.pe_0_0." + name for name in ("active", "shadow", "a", "w", "product", "o_psum")]


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_systolic_array.py"))


@pytest.mark.parametrize("group", grouped(GROUPS))
@pytest.mark.parametrize("config_key", CONFIGS)
def test_systolic_array(config_key: str, group: str):
    config = get_config(config_key)
    run("systolic_array", lambda: SystolicArray(config), config_key, "tb_systolic_array", HERE,
        group_tests(GROUPS, group), label=group, gtkw_groups={"pe_0_0": PE_0_0})


def test_lut_multipliers():
    """The iCEBreaker's mix: half of a 4x4 array's PEs multiply in LUT logic (the config
    travels to the testbench as JSON, not as a preset name)."""
    config = get_config("small").replace(lut_multipliers=8)
    run("systolic_array", lambda: SystolicArray(config), "small-lut8", "tb_systolic_array",
        HERE, GROUPS["random"], label="random", config=config)


@pytest.mark.parametrize("group", grouped(GROUPS))
def test_ice40_dual_multipliers(group: str):
    """``multiplier="ice40"``: the products two to an ``SB_MAC16`` (the simulation model
    ``sim/rtl/vendor/SB_MAC16.v``), int8 operands only, under the same stimulus (extremes:
    -128 x -128 and 127 x 127 down every column), stalls and back-pressure."""
    config = get_config("small").replace(multiplier="ice40", operands="int8")
    run("systolic_array", lambda: SystolicArray(config), "small-ice40", "tb_systolic_array",
        HERE, group_tests(GROUPS, group), label=group, config=config, sim="icarus")


def test_ice40_odd_count():
    """Nine PEs: four shared blocks and one PE with a block of its own."""
    config = get_config("3x3").replace(multiplier="ice40", operands="int8")
    run("systolic_array", lambda: SystolicArray(config), "3x3-ice40", "tb_systolic_array",
        HERE, GROUPS["random"], label="random", config=config, sim="icarus")


@pytest.mark.parametrize("group", grouped(GROUPS))
def test_registered_enable(group: str):
    """The fast pipeline on MULT18X18D on a non-square array: PEs four cycles longer
    (``array_latency`` = rows + cols + 6, checked to the cycle by test_back_to_back) and the
    registered enable with its skid under the same stimulus, stalls and back-pressure (the
    testbench checks the stream rules on ``o_psum`` and the enable's invariants every
    cycle)."""
    config = get_config("wide").replace(multiplier="ecp5", pipeline="fast")
    assert config.array_latency == config.rows + config.cols + 6
    run("systolic_array", lambda: SystolicArray(config), "wide-ecp5", "tb_systolic_array",
        HERE, group_tests(GROUPS, group), label=group, config=config, sim="icarus")


def test_waves_gtkw():
    """WAVES=1 output: the .gtkw groups the streams and pe_0_0, and every trace it names
    exists in the waveform (GTKWave silently drops names it cannot find)."""
    if shutil.which("fst2vcd") is None:
        pytest.skip("fst2vcd (Debian package gtkwave) is needed to read the waveform's names")
    config = get_config("tiny")
    gtkw = run("systolic_array", lambda: SystolicArray(config), "tiny", "tb_systolic_array",
               HERE, "test_shadow_interlock", label="waves-check", waves=True,
               gtkw_groups={"pe_0_0": PE_0_0})
    assert gtkw is not None and gtkw.is_file()
    text = gtkw.read_text()
    fst = Path(text.split('[dumpfile] "', 1)[1].split('"', 1)[0])
    traces = gtkw_traces(text)
    groups = [line[1:] for line in text.splitlines() if line.startswith("-")]
    assert {"i_act", "i_weight", "o_psum", "pe_0_0"} <= set(groups)
    available = set(fst_signals(fst).values())
    missing = [trace for trace in traces if trace not in available]
    assert not missing, f"{gtkw} names signals not in {fst}: {missing}"
    assert any(trace.endswith("pe_0_0.shadow[8:0]") for trace in traces)
