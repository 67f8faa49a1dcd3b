"""A cycle model of the core, which the emitter consults and which gives the estimates.

:class:`_Timing` follows a program as the emitter (:mod:`firmware.compiler.emitter`) writes
it: when each instruction would issue and when each engine is done, by rules and constants
measured on the RTL. :class:`_Timed` passes a program's calls on to the model as well, and
:class:`_Tally` stands in for the program when the emitter only estimates (choosing the
batching in :func:`firmware.compiler.compile_network`). It knows nothing of networks, so it
imports none of the package's other modules.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from hdl import isa
from hdl.config import TPUConfig


class _Timing:
    """A cycle model of the core running a program as the emitter writes it, for the
    emitter's choices and the estimates. Measured on the RTL (micro-programs of each kind of
    instruction on the 2x2 to 16x16 presets):

    - the front end issues one instruction at a time, in order, once the hazard rules and its
      engine allow; each holds it for a cycle plus its data beats (LOAD_PARAMS about four,
      ACTIVATE and WRITE_HOST two);
    - the matrix engine takes a MATMUL only as the one before issues its last row (the front
      end runs one MATMUL ahead of the array) and only into a free slot of the
      ``matmul_slots`` it has (a MATMUL holds one until its last row has been written to the
      accumulators); a MATMUL that switches tiles starts at the earliest ``rows + 3`` cycles after
      the last switch (the shadow tile shifts in a row a cycle) and costs its rows plus one;
    - the activation engine runs one ACTIVATE at a time, its rows plus 23 cycles, and
      LOAD_PARAMS waits for it; its output rows share the unified buffer's write port with
      READ_HOST's rows, round-robin, so a READ_HOST beside an ACTIVATE takes a cycle longer
      for each row the ACTIVATE writes meanwhile;
    - the weight loader runs one READ_WEIGHTS at a time, a tile row a cycle, and the next
      READ_WEIGHTS waits for it; a tile enters the weight FIFO only as the tile
      ``weight_fifo_depth`` before it leaves for the shadow registers (on the switch to the
      one before that), and a MATMUL switches to a tile only once it is whole in the shadow;
    - the host writer sends a WRITE_HOST's rows one a cycle after the front end lets it go,
      and the program ends when it has sent the last;
    - a MATMUL's accumulator rows are written ``rows + cols + 4`` cycles after its last row
      enters the array.

    Times are cycles from the program's start."""

    def __init__(self, config: TPUConfig):
        self.config = config
        self.slots = config.matmul_slots
        self.switch_period = config.rows + 1
        self.latency = config.rows + config.cols + 4
        self.fe = 0.0            # the front end: when its next instruction can issue
        self.arr = 0.0           # when the array has issued the last queued MATMUL's rows
        self.act = 0.0           # when the activation engine is free
        self.loader = 0.0        # when the weight loader is free
        self.writer = 0.0        # when the host writer has sent the last WRITE_HOST's rows
        self.rows = config.rows
        # When each MATMUL in flight retires (its last row written): a MATMUL takes a slot,
        # so short MATMULs go no faster than matmul_slots per array latency.
        self.retire: deque = deque(maxlen=config.matmul_slots)
        self.last_switch = -1e9  # when the last tile switch started
        # The tiles READ_WEIGHTS queues, in the order the MATMULs switch to them: when each
        # one's last row entered the weight FIFO, and when each was switched to (its shadow
        # registers free for the next); a tile enters the FIFO once the tile
        # ``weight_fifo_depth`` before it has left for the shadow registers.
        self.depth = config.weight_fifo_depth
        self.delivered: list = []
        self.switched: list = []
        self.idle = 0.0          # array cycles lost between MATMULs (after the first)
        self.started = False
        # Ranges an engine has yet to finish with: (lo, hi, done)
        self.ub_written: list = []   # unified-buffer rows an ACTIVATE writes
        self.ub_read: list = []      # unified-buffer rows a MATMUL or WRITE_HOST reads
        self.acc_written: list = []  # accumulator rows a MATMUL writes
        self.acc_read: list = []     # accumulator rows an ACTIVATE reads
        # ACTIVATEs still writing: [next cycle, rows left, rows a cycle, ub_written entry,
        # acc_read entry]; READ_HOST's rows take the write port from them (round-robin).
        self.act_writes: list = []

    @staticmethod
    def _after(ranges: list, lo: int, hi: int, t: float) -> float:
        for a, b, done in ranges:
            if a < hi and lo < b and done > t:
                t = done
        return t

    def _prune(self) -> None:
        now = min(self.fe, self.arr)
        for name in ("ub_written", "ub_read", "acc_written", "acc_read"):
            ranges = getattr(self, name)
            if len(ranges) > 64:
                setattr(self, name, [r for r in ranges if r[2] > now])

    def matmul_wait(self, ub: int, acc: int, count: int) -> float:
        """When a MATMUL would issue."""
        t = max(self.fe, self.arr - 1)
        if len(self.retire) == self.slots:
            t = max(t, self.retire[0])
        t = self._after(self.ub_written, ub, ub + count, t)
        return self._after(self.acc_read, acc, acc + count, t)

    def matmul(self, ub: int, acc: int, count: int, *, switch: bool = False,
               window: tuple[int, int] | None = None, **_) -> None:
        c = self.config
        # A window MATMUL reads window_rows rows and takes a cycle more for each row read
        # that completes no window.
        rows_read = count if window is None else isa.window_rows(*window, count, c.rows,
                                                                 c.ub_row)
        cycles = count if window is None else isa.window_cycles(*window, count, c.rows,
                                                                c.ub_row)
        t = self.matmul_wait(ub, acc, rows_read)
        start = max(t + 1, self.arr)
        if switch:
            start = max(start, self.last_switch + self.switch_period)
            k = len(self.switched)
            if k < len(self.delivered):     # the tile whole in the shadow registers
                start = max(start, self.delivered[k] + 3)
            self.last_switch = start
            self.switched.append(start)
        if self.started:
            self.idle += start - self.arr
        self.started = True
        self.arr = start + cycles + (1 if switch else 0.5)
        self.fe = t + 1
        self.acc_written.append((acc, acc + count, self.arr + self.latency))
        self.retire.append(self.arr + self.latency + 0.5)
        self.ub_read.append((ub, ub + rows_read, self.arr))
        self._prune()

    def matmul_lookup(self, ub: int, acc: int, count: int, *, switch: bool = False,
                      **_) -> None:
        """A MATMUL_LOOKUP: a MATMUL's timing."""
        self.matmul(ub, acc, count, switch=switch)

    def activate_wait(self, acc: int, count: int) -> float:
        """When an ACTIVATE (or the LOAD_PARAMS before it) would issue."""
        return self._after(self.acc_written, acc, acc + count, max(self.fe, self.act))

    def activate(self, acc: int, ub: int, count: int, *, pool=isa.Pool.NONE, **_) -> None:
        t = self.activate_wait(acc, count)
        self.fe = t + 2
        self.act = t + count + 23
        out = count // 4 if pool == isa.Pool.MAX4 else count
        written, read = [ub, ub + out, self.act], [acc, acc + count, self.act]
        self.ub_written.append(written)
        self.acc_read.append(read)
        self.act_writes = [w for w in self.act_writes if w[0] + w[1] / w[2] > self.fe] + [
            [t + 23, out, out / count, written, read]]

    def read_host(self, ub: int, rows) -> None:
        n = len(rows)
        t = self._after(self.ub_read, ub, ub + n, self.fe)
        t = self._after(self.ub_written, ub, ub + n, t)
        self.fe = self._host_end(t, n, commit=True)

    def _host_end(self, t: float, n: int, commit: bool = False) -> float:
        """When a READ_HOST of ``n`` rows issued at ``t`` frees the front end: its rows and
        the ACTIVATEs' output rows share the unified buffer's write port round-robin, so
        where both wait each gets every other cycle (an ACTIVATE that pools writes a row
        every fourth cycle and takes only those). With ``commit``, the ACTIVATEs it slows
        finish later."""
        t += 1
        for w in self.act_writes:
            nxt, left, rate = w[:3]
            if n == 0:
                break
            if nxt + left / rate <= t:
                continue
            if nxt > t:                      # the host's rows alone before it writes
                alone = min(n, nxt - t)
                t, n = t + alone, n - alone
                if n == 0:
                    break
            left -= (t - nxt) * rate         # its rows written alone until now
            nxt = t
            share = min(rate, 0.5)           # both waiting: its share of the port
            span = min(n / (1 - share), left / share)
            t, n, left, nxt = t + span, n - span * (1 - share), left - span * share, t + span
            if commit:
                w[0], w[1] = nxt, left
                done = nxt + left / rate
                w[3][2] = w[4][2] = done
                self.act = max(self.act, done)
        return t + n

    def host_rows_by(self, deadline: float) -> int:
        """Most rows a READ_HOST issued now can take and free the front end by
        ``deadline``."""
        lo, hi = 0, max(0, int(deadline - self.fe) - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._host_end(self.fe, mid) <= deadline else (lo, mid - 1)
        return lo

    def free_rows(self, lo: int, n: int) -> int:
        """How many rows from ``lo`` (of ``n``) no MATMUL or WRITE_HOST still reads when
        the front end issues its next instruction."""
        free = n
        for a, b, done in self.ub_read:
            if a < lo + n and lo < b and done > self.fe:
                free = min(free, max(0, a - lo))
        return free

    def write_host_wait(self, ub: int, count: int) -> float:
        return self._after(self.ub_written, ub, ub + count, self.fe)

    def write_host(self, ub: int, count: int) -> None:
        t = self.write_host_wait(ub, count)
        self.fe = t + 2
        self.writer = max(self.writer, t + 2) + count
        self.ub_read.append((ub, ub + count, self.writer))

    def load_params(self, *args, **kwargs) -> None:
        self.fe = max(self.fe, self.act) + 4

    def load_sum_table(self, table: int, values) -> None:
        """A sum table: every engine idle first, then an entry a cycle."""
        self.other()
        self.fe += len(values)

    def load_weights(self, tile, tiles, signed=True) -> None:
        self.fe += 1 + np.asarray(tiles).reshape(-1, np.shape(tiles)[-1]).shape[0]

    def read_weights(self, tile: int, count: int = 1) -> None:
        t = max(self.fe, self.loader)
        self.fe = t + 1
        end = t + 2
        for _ in range(count):
            k = len(self.delivered)
            room = k - self.depth - 1      # the tile whose move to the shadow frees room
            if 0 <= room < len(self.switched):
                end = max(end, self.switched[room] + 1)
            end += self.rows
            self.delivered.append(end)
        self.loader = end

    def other(self, *args, **kwargs) -> None:
        """SYNC, HALT and the counters: every engine idle first."""
        self.fe = max(self.fe, self.arr + self.latency, self.act) + 1

    halt = sync = read_counters = clear_counters = other

    def total(self) -> float:
        return max(self.fe, self.arr + self.latency, self.act, self.writer)


class _Timed:
    """A program (or tally) whose calls also advance a :class:`_Timing`."""

    def __init__(self, program, timing: _Timing):
        self._program, self.timing = program, timing

    def __getattr__(self, name):
        target = getattr(self._program, name)
        model = getattr(self.timing, name, None)
        if model is None or not callable(target):
            return target

        def call(*args, **kwargs):
            model(*args, **kwargs)
            return target(*args, **kwargs)
        return call


class _Tally:
    """The program an :class:`_Emitter` writes when it only estimates: every call is
    accepted and nothing is encoded (its :class:`_Timing` does the counting)."""

    beats: list = []
    instructions = 0

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
