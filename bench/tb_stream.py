"""cocotb bench: stream back-to-back weight tiles and activation rows through the matrix
unit (weight FIFO + systolic array), check every output row against the golden model, and
write the measured figures as JSON to ``AMTPU_BENCH_OUT``.

Environment: ``AMTPU_TILES`` tiles of ``AMTPU_ROWS`` activation rows each, seed
``AMTPU_SEED``.
"""

from __future__ import annotations

import json
import os
import time

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge

from hdl.layouts import act_row_layout, psum_row_layout, weight_row_layout
from sim.models.golden import matrix_unit_stream
from sim.rtl.runner import config_from_env
from sim.rtl.streams import StreamDriver, StreamMonitor, reset, start_clock


@cocotb.test()
async def test_stream(dut):
    cfg = config_from_env()
    tiles = int(os.environ.get("AMTPU_TILES", "16"))
    rows_per_tile = int(os.environ.get("AMTPU_ROWS", "256"))
    seed = int(os.environ.get("AMTPU_SEED", "1"))
    rng = np.random.default_rng(seed)
    dut._log.info(f"seed {seed}: {tiles} tiles x {rows_per_tile} rows on {cfg.name}")

    start_clock(dut)
    weights = StreamDriver(dut, "i_weight", dut.clk, weight_row_layout(cfg.cols))
    acts = StreamDriver(dut, "i_act", dut.clk, act_row_layout(cfg.rows))
    out = StreamMonitor(dut, "o_psum", dut.clk, psum_row_layout(cfg.cols))
    await reset(dut)

    weight_items, act_items, expected = matrix_unit_stream(cfg.rows, cfg.cols, tiles,
                                                           rows_per_tile, rng)
    weights.extend(weight_items)
    acts.extend(act_items)

    start = time.perf_counter()
    total = tiles * rows_per_tile
    cycles = 0
    while len(out.received) < total:
        await FallingEdge(dut.clk)
        cycles += 1
        assert cycles < 10 * total + 1000, "timeout"
    wall = time.perf_counter() - start

    got = np.array(out.received, dtype=np.int64)
    assert np.array_equal(got, np.array(expected)), f"seed {seed}: output differs from golden"

    first, last = acts.sent_cycles[0], acts.sent_cycles[-1]
    window = last - first + 1                       # cycles from first to last row accepted
    # Cycles inside the window in which no row entered: bubbles at the tile switches.
    bubbles = window - total
    useful = total * cfg.rows * cfg.cols
    result = {
        "config": cfg.name, "tiles": tiles, "rows_per_tile": rows_per_tile, "seed": seed,
        "rows": total, "window_cycles": window, "bubble_cycles": bubbles,
        "utilisation": useful / (cfg.rows * cfg.cols * window),
        "cycles_with_fill_and_drain": cycles,
        "utilisation_with_fill_and_drain": useful / (cfg.rows * cfg.cols * cycles),
        "stalls_before_first_row": sum(1 for s in acts.stalls if s == 0),
        "wall_seconds": wall, "cycles_per_second": cycles / wall,
    }
    dut._log.info(json.dumps(result))
    path = os.environ.get("AMTPU_BENCH_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(result, f)
