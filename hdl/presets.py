"""Named configurations: sizes for fast tests, the default, and the board builds."""

from hdl.config import ConfigError, TPUConfig

__all__ = ["PRESETS", "get_config"]

PRESETS: dict[str, TPUConfig] = {
    # Fast unit tests.
    "tiny": TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=8),
    "small": TPUConfig(rows=4, cols=4, ub_depth=256, acc_depth=128, weight_mem_tiles=16),
    # Non-square: a short reduction dimension and a wide output row.
    "wide": TPUConfig(rows=4, cols=8, ub_depth=256, acc_depth=128, weight_mem_tiles=16),
    # The default: fits an ECP5-85F's multipliers with room to spare.
    "default": TPUConfig(),
    # The default array with a unified buffer of 8,192 rows (64 KB) and 1,024 accumulator
    # rows: a 96x96 MobileNet's activations (person_detect) stay on chip from its input to
    # its classifier, one program. About 32 + 14 of the ECP5-85F's 208 DP16KD.
    "deep": TPUConfig(ub_depth=8192, acc_depth=1024),
    # Gemmini's and VTA's size; slow in simulation, marked slow in tests.
    "large": TPUConfig(rows=16, cols=16, ub_depth=2048, acc_depth=1024, weight_mem_tiles=64),
    # Board builds (boards/). iCEBreaker: what fits the iCE40UP5K's logic cells, 8 SB_MAC16
    # and 30 EBR next to the host link: a 4x4 array of int8 products two to an SB_MAC16, the
    # serial activation unit, 32-bit counters, two MATMUL slots, 8 weight tiles, and the
    # compact pipeline (the range compares out of the path into the dispatch, which limits
    # the clock there; docs/timing-closure.md), and none of UB_TO_WEIGHTS, the programmable
    # table, the row scale or the window mode (the logic cells for them are not there).
    "icebreaker": TPUConfig(rows=4, cols=4, ub_depth=256, acc_depth=256, weight_mem_tiles=8,
                            param_slots=2, weight_fifo_depth=2, operands="int8",
                            multiplier="ice40", activation_unit="serial", counter_bits=32,
                            pipeline="compact", matmul_slots=2, ub_to_weights=False,
                            lookup_table=False, row_scale=False, conv_windows=False),
    # ULX3S (ECP5-85F): the default array on MULT18X18D multipliers (the activation unit's
    # partial products too), the fast pipeline, and no UB_TO_WEIGHTS for now: with it the
    # build did not meet the board's clock (docs/timing-closure.md); with the programmable
    # table (a block RAM per column); without the row scale until a build with it has met
    # the clock; without the window mode and the sum tables until a build with them has met
    # the clock.
    "ulx3s": TPUConfig(multiplier="ecp5", pipeline="fast", ub_to_weights=False,
                       row_scale=False, conv_windows=False, sum_tables=False),
}


def get_config(name: str) -> TPUConfig:
    """The preset called *name*, or a ``RxC`` string such as ``"4x8"`` on top of the default."""
    if name in PRESETS:
        return PRESETS[name]
    rows, sep, cols = name.partition("x")
    if sep and rows.isdigit() and cols.isdigit():
        # host_width=None: the default's 256-bit beat is too narrow above 8 columns.
        return PRESETS["default"].replace(rows=int(rows), cols=int(cols), host_width=None)
    raise ConfigError(f"unknown configuration {name!r}; allowed: "
                      f"{', '.join(PRESETS)} or 'RxC' such as '4x8'")
