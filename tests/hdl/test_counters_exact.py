"""The timing-dependent performance counters of the whole core, computed exactly
(``tb_counters_exact.py``): host gaps, RAW waits, weight stalls, the reference pipeline's
cycles."""

from __future__ import annotations

from pathlib import Path

import pytest

from hdl.core import Core
from hdl.presets import get_config
from sim.rtl.runner import run

HERE = Path(__file__).parent


@pytest.mark.parametrize("config_key", ["tiny", "small"])
def test_counters_exact(config_key: str):
    config = get_config(config_key)
    run("core", lambda: Core(config), config_key, "tb_counters_exact", HERE, config=config)
