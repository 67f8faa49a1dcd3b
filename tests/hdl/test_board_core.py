"""BoardCore (UART, host link, core) end to end through its UART pins: cocotb tests
(tb_board_core.py) on the tiny core with 4 clock cycles a bit, run through sim.rtl.runner
(``SIM`` picks Icarus or Verilator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hdl.link.board_core import BoardCore
from hdl.presets import get_config
from sim.rtl.runner import cocotb_test_names, run

HERE = Path(__file__).parent
CONFIG_KEY = "tiny"
DIVISOR = 4
MAX_BEATS = 4
CLOCK_HZ = 20_000           # what INFO_REPLY reports; the LED's epoch is 1,024 cycles
TESTS = cocotb_test_names(HERE / "tb_board_core.py")


def _config(register_link: bool):
    """The tiny core; with ``register_link``, with the fast pipeline, whose board core
    registers the paths between the link and the core."""
    config = get_config(CONFIG_KEY)
    return config.replace(pipeline="fast") if register_link else config


def _factory(register_link=False):
    return BoardCore(_config(register_link), divisor=DIVISOR, max_beats=MAX_BEATS,
                     clock_hz=CLOCK_HZ)


#: The error cases run in one simulation (each resets the board first): one simulator start.
ERROR_CASES = [name for name in TESTS if name != "test_program"]


def test_bench_lists_its_tests():
    assert "test_program" in TESTS and len(ERROR_CASES) >= 7


def _run(testcase, register_link=False):
    suffix = "-reg" if register_link else ""
    run("board_core", lambda: _factory(register_link),
        f"{CONFIG_KEY}-d{DIVISOR}-b{MAX_BEATS}{suffix}", "tb_board_core",
        HERE, testcase, config=_config(register_link),
        extra_env={"AMTPU_DIVISOR": str(DIVISOR), "AMTPU_MAX_BEATS": str(MAX_BEATS),
                   "AMTPU_CLOCK_HZ": str(CLOCK_HZ)})


def test_program():
    """A program end to end, INFO, STATUS, a retried DATA frame, the LEDs."""
    _run("test_program")


#: A few error cases at the pins, and all of them (both in make regression: make test checks
#: the link's every rule in amaranth.sim, test_host_link.py, and a program at the pins).
FAST_ERROR_CASES = ["test_bad_crc", "test_noise_then_status"]


@pytest.mark.parametrize("cases", [
    pytest.param(FAST_ERROR_CASES, id="fast", marks=pytest.mark.slow),
    pytest.param(ERROR_CASES, id="all", marks=pytest.mark.slow)])
def test_error_cases(cases):
    """Bad CRC, a truncated frame, garbage, oversize, instruction errors (CLEAR, RESYNC),
    RESET, noise then STATUS (the replies the link model gives) and RESYNC with no error
    pending, each followed by a read-back equal to IsaSim's."""
    assert set(cases) <= set(ERROR_CASES)
    _run(cases)


#: What make test runs with ``register_link``: the program and an instruction error (the reply
#: and the resync through the registers); ``make regression`` runs every case (make test
#: runs a few frame errors on the unregistered link, test_error_cases).
REGISTERED_FAST = ["test_program", "test_instruction_error_resync"]


@pytest.mark.parametrize("cases", [
    pytest.param(REGISTERED_FAST, id="fast", marks=pytest.mark.slow),
    pytest.param(["test_program", *ERROR_CASES], id="all", marks=pytest.mark.slow)])
def test_registered_beats(cases):
    """As the ULX3S builds it (the fast pipeline): the core's beats and reset through
    registers; the program, then error cases."""
    assert set(cases) <= set(TESTS)
    _run(cases, register_link=True)
