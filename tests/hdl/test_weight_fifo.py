# amaranth: UnusedElaboratable=no
"""Weight FIFO: cocotb tests (tb_weight_fifo.py) per configuration's tile shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import group_tests, grouped, tiered

from hdl.datapath.weight_fifo import WeightFIFO
from hdl.presets import get_config
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
CONFIGS = tiered(["tiny", "small", "wide", "default"], fast=["wide"])
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "order": ["test_order"],
    "fill": ["test_fill", "test_partial_tile"],
}
DEPTH = 4   # tb_weight_fifo.DEPTH


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_weight_fifo.py"))


@pytest.mark.parametrize("registered", [False, True], ids=["plain", "registered"])
@pytest.mark.parametrize("group", grouped(GROUPS))
@pytest.mark.parametrize("config_key", CONFIGS)
def test_weight_fifo(config_key: str, group: str, registered: bool):
    cfg = get_config(config_key)
    run("weight_fifo",
        lambda: WeightFIFO(rows=cfg.rows, cols=cfg.cols, data_width=cfg.data_width, depth=DEPTH,
                           registered=registered),
        config_key, "tb_weight_fifo", HERE, group_tests(GROUPS, group),
        label=f"{group}-registered" if registered else group)


def test_registered_needs_room():
    with pytest.raises(ValueError, match="more than 2 rows"):
        WeightFIFO(rows=1, cols=4, depth=2, registered=True)
