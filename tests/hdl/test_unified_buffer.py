"""Unified buffer: cocotb tests (tb_unified_buffer.py) for two small sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiers import group_tests, grouped

from hdl.memory.unified_buffer import UnifiedBuffer
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
# (depth, row_elems): key -> sizes; small, so Icarus runs are quick.
SIZES = {"d16e2": (16, 2), "d32e4": (32, 4)}
# Tests sharing a simulation (each simulator start costs about 2 s).
GROUPS = {
    "random": ["test_random"],
    "directed": ["test_read_during_write", "test_fairness", "test_throughput"],
}


def test_groups_cover_testbench():
    assert sorted(sum(GROUPS.values(), [])) == \
        sorted(cocotb_test_names(HERE / "tb_unified_buffer.py"))


#: The read ports by name: pipelined or not.
PORTS = {"": False, "pipelined": True}


@pytest.mark.parametrize("ports", PORTS)
@pytest.mark.parametrize("group", grouped(GROUPS))
@pytest.mark.parametrize("size", SIZES)
def test_unified_buffer(size: str, group: str, ports: str):
    """Both kinds of read port: the registered asynchronous read whose same-cycle collisions
    are left to the block RAM (the reference and compact pipelines'); the block RAM's output
    register, a cycle later (``pipelined``, the fast pipeline's DP16KD and its model)."""
    depth, row_elems = SIZES[size]
    pipelined = PORTS[ports]
    run("unified_buffer", lambda: UnifiedBuffer(depth=depth, row_elems=row_elems,
                                                pipelined=pipelined),
        size + (f"-{ports}" if ports else ""), "tb_unified_buffer", HERE,
        group_tests(GROUPS, group), label=group,
        extra_env={"AMTPU_UB": json.dumps({"depth": depth, "row_elems": row_elems,
                                           "pipelined": pipelined})})
