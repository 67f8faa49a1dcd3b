# amaranth: UnusedElaboratable=no
"""Accumulators: cocotb tests (tb_accumulators.py) for two small sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdl.datapath.accumulators import Accumulators
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
# (depth, cols): key -> sizes; small, so Icarus runs are quick.
SIZES = {"d16c2": (16, 2), "d32c4": (32, 4)}
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "all": ["test_wrap", "test_same_address", "test_read_during_write", "test_random"],
}


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_accumulators.py"))


#: The pipelines by name: ``registered`` or not.
PIPELINES = {"": False, "registered": True}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("size", SIZES)
def test_accumulators(size: str, group: str, pipeline: str):
    """Both pipelines (``registered``, the fast pipeline's: the old sums registered out of
    the RAM, a cycle longer, the last writes forwarded to the rows behind them; without it:
    the driver spaces a row that accumulates into the row sent just before it)."""
    depth, cols = SIZES[size]
    registered = PIPELINES[pipeline]
    run("accumulators", lambda: Accumulators(depth=depth, cols=cols, acc_width=32,
                                             registered=registered),
        size + (f"-{pipeline}" if pipeline else ""), "tb_accumulators", HERE,
        GROUPS[group], label=group,
        extra_env={"AMTPU_ACC": json.dumps({"depth": depth, "cols": cols,
                                            "registered": registered})})
