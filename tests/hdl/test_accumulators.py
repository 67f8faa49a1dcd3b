"""Accumulators: cocotb tests (tb_accumulators.py) for two small sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hdl.accumulators import Accumulators
from sim.runner import cocotb_test_names, run

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


@pytest.mark.parametrize("registered_read", [False, True], ids=["", "registered"])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("size", SIZES)
def test_accumulators(size: str, group: str, registered_read: bool):
    """Both pipelines (``registered_read``: the old sums registered out of the RAM, a cycle
    longer, the last write forwarded to the row behind it)."""
    depth, cols = SIZES[size]
    run("accumulators", lambda: Accumulators(depth=depth, cols=cols, acc_width=32,
                                             registered_read=registered_read),
        size + ("-registered" if registered_read else ""), "tb_accumulators", HERE,
        GROUPS[group], label=group,
        extra_env={"AMTPU_ACC": json.dumps({"depth": depth, "cols": cols,
                                            "registered_read": registered_read})})
