"""The core: cocotb tests (tb_core.py) against the ISA simulator, run through sim.runner.

CI runs 200 constrained-random programs (8 blocks of 25 over three configurations);
``make test-all`` adds 16 more blocks, the default 8x8 and the 16x16 core.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hdl.config import get_config
from hdl.core import Core
from sim.runner import run

HERE = Path(__file__).parent
PROGRAMS_PER_BLOCK = 25


def run_core(config_key: str, testcase: str, **env):
    config = get_config(config_key)
    run("core", lambda: Core(config), config_key, "tb_core", HERE, testcase,
        extra_env={k: str(v) for k, v in env.items()}, config=config)


RANDOM_BLOCKS = (
    [pytest.param("tiny", b, id=f"tiny-{b}") for b in range(4)] +
    [pytest.param("small", b, id=f"small-{b}") for b in range(2)] +
    [pytest.param("wide", b, id=f"wide-{b}") for b in range(2)] +
    [pytest.param(key, b, id=f"{key}-{b}", marks=pytest.mark.slow)
     for key, blocks in (("tiny", 8), ("small", 4), ("wide", 2), ("default", 2))
     for b in range(10, 10 + blocks)] +
    [pytest.param("large", 20, id="large-20", marks=pytest.mark.slow)]
)


@pytest.mark.parametrize("config_key, block", RANDOM_BLOCKS)
def test_random_programs(config_key: str, block: int):
    run_core(config_key, "test_random_programs", AMTPU_PROGRAMS=PROGRAMS_PER_BLOCK,
             AMTPU_SEED=1000 + block * PROGRAMS_PER_BLOCK)


@pytest.mark.parametrize("config_key", ["tiny", "small", "wide", "default"])
def test_directed(config_key: str):
    run_core(config_key, "test_directed_each_instruction")


@pytest.mark.parametrize("config_key", ["tiny", "small"])
def test_errors(config_key: str):
    run_core(config_key, "test_error")


def test_gemm_64x64_default():
    run_core("default", "test_gemm", AMTPU_GEMM_SIZE=64)


@pytest.mark.parametrize("config_key, size", [("tiny", 3), ("wide", 13)])
def test_gemm_ragged(config_key: str, size: int):
    """Sizes that are not multiples of the array (tiny holds only 8 weight tiles)."""
    run_core(config_key, "test_gemm", AMTPU_GEMM_SIZE=size)
