"""bench.ecp5_bram: the DP16KD's output register is applied and the report is read."""

import pytest

from bench.ecp5_bram import measure


def test_regmode_checked():
    with pytest.raises(ValueError, match="allowed: NOREG, OUTREG"):
        measure("REG")


@pytest.mark.slow       # a place and route, 5 s (make regression)
def test_output_register_shortens_the_read():
    """Without the output register the block's read data is the critical path (its clock to
    output alone is most of a 150 MHz cycle); with it the read data leaves a register."""
    plain, registered = measure("NOREG"), measure("OUTREG")
    assert plain["from"] == "ram" and plain["clk_to_out_ns"] > 4.0, plain
    assert registered["clk_to_out_ns"] < 2.0 < plain["clk_to_out_ns"], registered
    assert registered["fmax_mhz"] > 2 * plain["fmax_mhz"], (plain, registered)
