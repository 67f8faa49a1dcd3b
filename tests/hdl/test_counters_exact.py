"""The timing-dependent performance counters of the whole core, computed exactly
(``tb_counters_exact.py``): host gaps, RAW waits, weight stalls, cycles, on each pipeline
(the compact and fast pipelines' counters move a cycle or more later, and an off-by-one in
their events passes the random programs' bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import tiered

from hdl.core import Core
from hdl.presets import get_config
from sim.rtl.runner import run

HERE = Path(__file__).parent


#: The reference pipeline on two arrays (the 4x4 in make regression), the compact and the
#: fast pipeline on the tiny one (the same configurations as test_core's, so the same builds).
CONFIGS = {"tiny": get_config("tiny"), "small": get_config("small"),
           "tiny-compact": get_config("tiny").replace(pipeline="compact"),
           "tiny-fast": get_config("tiny").replace(pipeline="fast")}


@pytest.mark.parametrize("config_key", tiered(CONFIGS, fast=["tiny", "tiny-compact",
                                                             "tiny-fast"]))
def test_counters_exact(config_key: str):
    config = CONFIGS[config_key]
    run("core", lambda: Core(config), config_key, "tb_counters_exact", HERE, config=config)
