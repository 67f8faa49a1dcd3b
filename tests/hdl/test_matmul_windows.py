"""MATMUL's window mode on the RTL core against the ISA simulator (:class:`rtl_pair.Pair`:
every output beat ``==``, the same status, then the whole state read back).

One test on the tiny core (``ub_row`` 2, so a window of its 2 elements spans two buffer rows
from lane 1 on), the build the interlock tests use: window MATMULs back to back (every lane,
steps 0, 1, ``ub_row``, 3, 5, 7, 9 and 15, counts 1 to 9, accumulating and not, int8 and
uint8, a plain MATMUL between them, one reading the buffer's last element), each the next
in the engine as the one before sends its last window; then the timing of a lone window
MATMUL (:func:`hdl.isa.window_cycles`), and the checks the window mode adds (a lane past
the row, a window one element past the buffer). The ISA level (every preset, the
convolutions, each error) is ``tests/sim/test_windows.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from rtl_pair import Pair, describe

from firmware.asm import Program
from hdl import isa
from hdl.config import TPUConfig

SEED = 6161

#: (lane, step, count, accumulate, signed) of the MATMULs sent back to back; ``None`` is a
#: plain MATMUL of 3 rows. Windows ending in a row already read (steps 0 and 1, and lane 1
#: with steps below ub_row) come out of the two rows the engine keeps; steps past ub_row
#: read rows that complete no window.
RUN = [(0, 0, 3, False, True), (1, 0, 4, False, True), (0, 1, 9, False, True),
       (1, 1, 5, False, False), (1, 2, 6, False, True), (0, 2, 2, True, True),
       (0, 5, 4, False, True), (1, 5, 3, True, False), (1, 15, 4, False, True),
       (0, 15, 2, True, True), None, (1, 3, 7, False, True), (0, 7, 1, True, True),
       (1, 9, 2, False, False), (1, 1, 8, True, True), (0, 0, 1, True, True)]

#: A lone MATMUL's (lane, step, count) for the timing check.
LONE = [(0, 0, 9), (1, 0, 9), (1, 1, 4), (1, 2, 5), (0, 5, 9), (1, 15, 4), (1, 3, 9)]


def test_window_matmuls(rtl_device):
    """The window MATMULs' accumulators, their ACTIVATE output and the counters equal the
    ISA simulator's (``array_active`` the sum of the counts); a lone window MATMUL takes
    :func:`~hdl.isa.window_cycles` cycles (as long as a plain MATMUL of that many rows); a
    lane of ``ub_row`` is BAD_FIELD, and a window whose last element is the buffer's last
    runs while one an element further is UB_RANGE, each stopping the core with nothing
    changed."""
    pair = Pair(rtl_device("tiny"))
    cfg = pair.config
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    p = Program(cfg)
    data = rng.integers(-128, 128, (cfg.ub_depth, cfg.ub_row))
    data[rng.choice(cfg.ub_depth, 12, replace=False)] = [[-128, 127], [127, -128], [-1, -128]] * 4
    p.read_host(0, data)
    p.load_weights(0, np.eye(cfg.rows, cfg.cols, dtype=np.int64))        # shows the windows
    p.load_weights(1, np.array([[-128, 127], [-128, -1]]))
    p.load_weights(2, np.array([[255, 0], [128, 255]]), signed=False)
    p.read_weights(0, 3)
    p.load_params(0, [0] * cfg.cols, [1] * cfg.cols, shift=0)
    acc, counts = 0, 0
    for k, matmul in enumerate(RUN):
        lane, step, count, accumulate, signed = matmul or (0, cfg.ub_row, 3, False, True)
        if accumulate:
            acc -= count // 2               # half into the rows just written
        last = lane + (count - 1) * step + cfg.rows - 1
        ub = int(rng.integers(0, cfg.ub_depth - last // cfg.ub_row))
        p.matmul(ub, acc, count, switch=k in (0, 6, 11), accumulate=accumulate,
                 signed=signed, window=matmul and (lane, step))
        acc, counts = acc + count, counts + count
    # The buffer's last element the last window's last element (row 55's lane 1 on).
    p.matmul(55, acc, 4, window=(1, 5))
    acc, counts = acc + 4, counts + 4
    assert acc <= cfg.acc_depth
    p.activate(0, 0, acc)
    p.write_host(0, acc)
    p.read_counters()
    p.halt()
    what = f"seed {SEED}: window MATMULs back to back:\n{describe(p.beats, cfg)}"
    got = pair.run(p.beats, what)
    counters = dict(zip(isa.COUNTERS, got[acc:acc + len(isa.COUNTERS)], strict=True))
    assert counters["array_active"] == counts, f"{what}\n{counters}, {counts} rows sent"
    pair.check_state(what)

    # A lone window MATMUL: from the DONE beat of the set-up to the next, as long as a plain
    # MATMUL of window_cycles rows.
    def lone(count: int, window: tuple[int, int] | None, ub: int = 0) -> int:
        q = Program(cfg)
        q.matmul(ub, 0, count, window=window)
        q.sync()
        q.halt()
        start = pair.rtl.cycles()
        pair.run(q.beats, f"seed {SEED}: a lone MATMUL of {count} rows, window {window}")
        return pair.rtl.cycles() - start

    # Windows that end in the buffer's last row, read already (the engine once compared the
    # next row to read with the window's last row plus one, a bit wider, so after the last
    # row it read the whole buffer again for each such window).
    edge = [(0, lane, step, count) for lane, step, count in LONE] + \
        [(cfg.ub_depth - 1, 0, 0, 4), (cfg.ub_depth - 2, 1, 0, 3), (cfg.ub_depth - 3, 0, 1, 3)]
    for ub, lane, step, count in edge:
        want = isa.window_cycles(lane, step, count, cfg.rows, cfg.ub_row)
        took, plain = lone(count, (lane, step), ub), lone(want, None)
        assert took == plain, (f"seed {SEED}: a lone window MATMUL (ub {ub}, lane {lane}, "
                               f"step {step}, "
                               f"count {count}) took {took} cycles, a plain MATMUL of "
                               f"window_cycles = {want} rows {plain}")

    # The checks, each stopping the core with nothing changed: lane ub_row; a window one
    # element past the buffer (the one above moved on by an element).
    E = isa.ErrorCode
    for k, (bad, code) in enumerate([
            (lambda q: q.matmul(0, 0, 1, window=(cfg.ub_row, 1)), E.BAD_FIELD),
            (lambda q: q.matmul(56, 0, 4, window=(0, 5)), E.UB_RANGE)]):
        pair.reset()
        pair.stop_on(bad, code, f"seed {SEED + 1 + k}: window check", seed=SEED + 1 + k)
    # Every lane past the row (the field's four bits, compared whole).
    for lane in range(cfg.ub_row + 1, 16):
        pair.reset()
        q = Program(cfg)
        q.matmul(0, 0, 1, window=(lane, 0))
        q.halt()
        pair.run(q.beats, f"a window MATMUL of lane {lane}")
        status = pair.rtl.status()
        assert (status.code, status.instr_index) == (E.BAD_FIELD, 0), f"lane {lane}: {status}"


#: Accumulators deeper than the buffer: a window MATMUL's count is bounded by the
#: accumulators alone (step 0 reads one buffer row for any count).
DEEP_ACC = TPUConfig(rows=2, cols=2, ub_depth=16, acc_depth=64, weight_mem_tiles=4)


@pytest.mark.slow           # a build of its own (make regression)
def test_more_windows_than_buffer_rows(rtl_device):
    """A window MATMUL of more windows than the buffer has rows (the engine once kept its
    counts as wide as the smaller memory, and sent count modulo it): every accumulator row
    equal to the ISA simulator's, and the timing of ``window_cycles``."""
    pair = Pair(rtl_device(DEEP_ACC))
    cfg = pair.config
    rng = np.random.default_rng(SEED + 20)
    p = Program(cfg)
    p.read_host(0, rng.integers(-128, 128, (cfg.ub_depth, cfg.ub_row)))
    p.load_weights(0, np.eye(cfg.rows, cfg.cols, dtype=np.int64))
    p.read_weights(0)
    p.matmul(cfg.ub_depth - 1, 0, 40, switch=True, window=(0, 0))
    p.matmul(3, 40, 24, window=(1, 0))
    p.halt()
    pair.run(p.beats, f"seed {SEED + 20}: 40 and 24 windows from one buffer row")
    pair.check_state(f"seed {SEED + 20}: more windows than buffer rows")
