"""The emitter: one batch program (or its tally) from a compiled network's plan.

:class:`_Emitter` orders the stages' jobs over the batches of a program, feeds the host's rows
between the MATMULs, keeps READ_WEIGHTS ahead of them, and sends each job's ACTIVATE (with
its LOAD_PARAMS) and the write-back when the cycle model (:mod:`firmware.compiler.timing`)
says the front end would not stall the array for them (package notes, "Stages" and
"Timing"). :class:`~firmware.compiler.network.CompiledNetwork` runs it for its programs and
its estimates.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from firmware.asm import Program
from firmware.compiler.layout import Tensor, _ceil_div
from firmware.compiler.plan import (
    COUNT_LIMIT,
    _jobs,
    _row_runs,
    _runs,
    _StagePlan,
    _window_runs,
)
from firmware.compiler.timing import _Tally, _Timed, _Timing
from hdl import isa


class _Emitter:
    """Writes one batch program. Order: the first stage unit by unit; the later stages of
    batch ``b`` once batch ``b + 1``'s first unit is out (so that its MATMULs fill the array
    while batch ``b``'s last ACTIVATE drains); the host's rows of the next unit fed in pieces
    between the MATMULs. With ``estimate``, tallies without encoding (no real input).
    ``compiled``: the :class:`~firmware.compiler.network.CompiledNetwork` (not
    annotated: this module sits below that one)."""

    def __init__(self, compiled, x_q: np.ndarray, estimate: bool = False,
                 profile: bool = False):
        self.cn = compiled
        self.profile = profile
        self.c = compiled.config
        self.plan = compiled._plan
        self.x_q = x_q
        self.batches = max(1, _ceil_div(len(x_q), compiled.batch_size))
        self.out_rows = sum(self._write_rows(b) for b in range(self.batches))
        self.estimate = estimate
        self.timing = _Timing(self.c)
        self.p = _Timed(_Tally() if estimate else Program(self.c), self.timing)
        self.uses: list[int] = []          # weight tiles in the order the MATMULs use them
        self.queued = 0                     # tiles READ_WEIGHTS has queued
        self.streamed = 0                   # of them, tiles a batch program loaded
        self.sums = None                    # the add stage whose sum tables are loaded
        self.used = 0                       # tiles MATMULs have switched to
        self.jobs_done = 0
        self.acc_next = 0                   # next free accumulator row
        self.feed: deque = deque()          # (ub row, rows) pieces of the next unit's input
        # ACTIVATEs not yet sent, oldest first: (job, its output rows [lo, hi), the input
        # rows its MATMULs read)
        self.pending: list = []
        self.pending_write = None
        slots = self.c.param_slots
        self.slots: list = [None] * slots   # parameter set in each slot (streamed params)
        self.slot_used = [-1] * slots
        self.stage_rows = [0] * len(self.plan.stages)    # rows each stage's MATMULs stream
        # (unit, first, end) of input rows that MATMULs sent or still to come read
        self.ring_live: list[tuple[int, int, int]] = []
        tiles = compiled.tiles
        #: Per weight tile, whether it is all zero (its passes add nothing and are left out).
        self.zero = ~tiles.reshape(len(tiles), -1).any(axis=1) if len(tiles) else \
            np.zeros(0, dtype=bool)

    # Where things are -------------------------------------------------------------------

    def _ring(self, b: int, u: int) -> int:
        """Block of the first stage's output that unit ``u`` of batch ``b`` uses."""
        return (b * self.plan.units + u) % self.plan.stages[0].outs[0].units

    def _src_base(self, sp: _StagePlan, b: int, u: np.ndarray, tensor: int | None = None
                  ) -> np.ndarray:
        """Where each of a job's rows' input starts (later stages); ``tensor``: a residual
        add's skip, the output of that stage."""
        if tensor is not None:
            block = self._ring(b, u) if tensor == 0 else u
            return sp.skip.base + block * sp.skip.block
        block = self._ring(b, u) if sp.index == 1 else u
        return sp.source.base + block * sp.source.block

    def _ring_offset(self, g: int) -> int:
        """Row of the input ring where unit ``g`` of the program starts."""
        return g * self.plan.in_rows % self.plan.ring

    def _dst(self, sp: _StagePlan, b: int, u: np.ndarray) -> tuple[Tensor, np.ndarray]:
        last = sp.index == len(self.plan.stages) - 1
        out = sp.outs[b % len(sp.outs)] if last else sp.outs[0]
        return out, (self._ring(b, u) if sp.index == 0 and not last else u)

    # Host input -------------------------------------------------------------------------

    def _queue_unit(self, n: int) -> None:
        """Queue the host's rows of unit ``n`` of the program into the input ring."""
        unit = self.cn.unit
        images = self.x_q[n * unit:(n + 1) * unit]
        if not len(images):
            return                           # a batch's missing images: nothing to send
        rows = (np.zeros((self.plan.in_rows, 0)) if self.estimate
                else self.cn._unit_rows(images))
        ring, off = self.plan.ring, self._ring_offset(n)
        k = 0
        while k < len(rows):
            pos = (off + k) % ring
            take = min(len(rows) - k, ring - pos, COUNT_LIMIT)
            self.feed.append((n, k, pos, rows[k:k + take]))
            k += take

    def _send(self, piece, take: int) -> None:
        n, k, ub, rows = piece
        self.p.read_host(ub, rows[:take])
        if take < len(rows):
            self.feed.appendleft((n, k + take, ub + take, rows[take:]))

    def _live(self, lo: int, hi: int, before: int | None = None) -> int:
        """Rows from ``lo`` (before ``hi``) that no MATMUL still to come reads (of units
        before ``before`` only, if given), nor, in the cycle model, one already sent that
        is still reading them (the front end would wait for it)."""
        free = self.timing.free_rows(lo, hi - lo)
        for g, a, b in self.ring_live:
            if a < hi and lo < b and (before is None or g < before):
                free = min(free, max(0, a - lo))
        return free

    def _feed(self, budget: int) -> int:
        """READ_HOST up to ``budget`` queued rows, stopping before a row that a first-stage
        MATMUL still to come or still running reads; returns the rows sent."""
        sent = 0
        while self.feed and budget > sent:
            piece = self.feed.popleft()
            g, _, ub, rows = piece
            take = min(budget - sent, len(rows), self._live(ub, ub + len(rows), g))
            if take <= 0:
                self.feed.appendleft(piece)
                break
            self._send(piece, take)
            sent += take
        return sent

    def _feed_for(self, g: int, k_end: int) -> None:
        """READ_HOST every queued row of unit ``g`` before its row ``k_end`` (and what is
        left of earlier units): a MATMUL is about to read them."""
        while self.feed and (self.feed[0][0] < g or
                             (self.feed[0][0] == g and self.feed[0][1] < k_end)):
            piece = self.feed.popleft()
            n, k, ub, rows = piece
            take = len(rows) if n < g else min(len(rows), k_end - k)
            self._send(piece, take)

    def _feed_all(self) -> None:
        while self.feed:
            piece = self.feed.popleft()
            self._send(piece, len(piece[3]))

    # Weights ----------------------------------------------------------------------------

    def _read_next(self, used: int) -> None:
        """Keep the weight FIFO and the shadow tile ahead of the MATMULs: ``used`` tiles
        have been switched to. Queues in groups of consecutive resident tiles (one
        READ_WEIGHTS each), at least two at a time while more follow, since every
        instruction costs the front end a dispatch."""
        room = self.c.weight_fifo_depth + 1 - (self.queued - used)
        left = len(self.uses) - self.queued
        if room <= 0 or left <= 0 or (room < 2 and left > 1 and self.queued > used):
            return
        slots = self.cn.tile_slots
        ring = self.cn.stream_slots
        while room > 0 and self.queued < len(self.uses):
            tile = self.uses[self.queued]
            slot = slots.get(tile)
            if slot is None:            # streamed: into the next of the streaming slots
                slot = ring[self.streamed % len(ring)]
                self.streamed += 1
                self.p.load_weights(slot, self.cn.tiles[tile], signed=True)
                self.p.read_weights(slot, 1)
                self.queued += 1
                room -= 1
                continue
            count = 1
            while (count < room and self.queued + count < len(self.uses)
                   and slots.get(self.uses[self.queued + count]) == slot + count):
                count += 1
            self.p.read_weights(slot, count)
            self.queued += count
            room -= count

    # Jobs -------------------------------------------------------------------------------

    def _activate(self, pending) -> None:
        sp, m0, rows, nb, region, b, u0 = pending
        c, lay = self.c, sp.layout
        pid = sp.params[nb]
        if self.cn.resident_params:
            slot = pid
        elif pid in self.slots:
            slot = self.slots.index(pid)         # still loaded
        else:
            # The slot used longest ago (LOAD_PARAMS waits for a running ACTIVATE, and every
            # earlier ACTIVATE has been issued, so no ACTIVATE still to come needs it).
            slot = min(range(c.param_slots), key=lambda k: self.slot_used[k])
            self.slots[slot] = pid
            bias, mult, shift, zp, clamp, rounding = self.cn._params[pid]
            self.p.load_params(slot, bias, mult, shift=shift, zp=zp, clamp=clamp,
                               rounding=rounding)
        self.slot_used[slot] = self.jobs_done
        pool = isa.Pool.MAX4 if lay.window == 4 else isa.Pool.NONE
        w = lay.window
        u, r = np.divmod(m0 + np.arange(0, rows, w), lay.m)
        y, x, i = lay.outputs[r // w].T
        out, block = self._dst(sp, b, u0 + u)
        target = np.where(y >= 0, out.row(nb, out.position(np.maximum(y, 0), x), i, block),
                          -1)
        # Rows of the images a last batch does not have need no ACTIVATE: a run's tail of
        # them is left out (a run is never split, which would add ACTIVATEs).
        present = (u0 + u) * self.plan.unit + i < len(self.x_q) - b * self.plan.batch
        limit = COUNT_LIMIT // w * w
        k = 0
        while k < len(target):
            if target[k] < 0:
                k += 1
                continue
            j = k + 1
            while j < len(target) and target[j] == target[j - 1] + 1:
                j += 1
            end = j
            while end > k and not present[end - 1]:
                end -= 1
            count = (end - k) * w
            for s in range(0, count, limit):
                self.p.activate(region + k * w + s, int(target[k]) + s // w,
                                min(limit, count - s), func=sp.stage.func, pool=pool,
                                slot=slot)
            k = j
        self.jobs_done += 1

    def _targets_range(self, pending) -> tuple[int, int]:
        """The unified-buffer rows a pending ACTIVATE writes, as [lo, hi)."""
        sp, m0, rows, nb, region, b, u0 = pending
        lay = sp.layout
        u, r = np.divmod(m0 + np.arange(0, rows, lay.window), lay.m)
        y, x, i = lay.outputs[r // lay.window].T
        out, block = self._dst(sp, b, u0 + u)
        t = out.row(nb, out.position(np.maximum(y, 0), x), i, block)[y >= 0]
        return (int(t.min()), int(t.max()) + 1) if len(t) else (0, 0)

    def _flush(self, which=None) -> None:
        """Send the pending ACTIVATEs ``which(k, job, span)`` selects (all by default) now,
        then the write-back if none of those still pending writes its rows."""
        keep = []
        for k, entry in enumerate(self.pending):
            job, span, live, _ = entry
            if which is not None and not which(k, job, span):
                keep.append(entry)
                continue
            self._send_activate(entry)
        self.pending = keep
        self._write()

    def _send_activate(self, entry) -> None:
        self._activate(entry[0])

    def _release(self, which=None) -> None:
        """The pending ACTIVATEs ``which(k, job, span)`` selects may go once the front end
        would not wait for them longer than the array has work queued
        (:meth:`_flush_due`)."""
        for k, entry in enumerate(self.pending):
            if which is None or which(k, entry[0], entry[1]):
                entry[3] = True
        self._flush_due()

    def _slack(self) -> int:
        """The latest cycle the front end may issue an instruction at and still issue the
        next MATMUL before the array runs dry."""
        return self.timing.arr - 3

    def _flush_due(self) -> None:
        """Send the released ACTIVATEs, oldest first, while each would issue without the
        front end waiting past :meth:`_slack` (for its MATMULs, or for the activation engine,
        which runs one ACTIVATE at a time: LOAD_PARAMS waits for it too); then the write-back
        on the same terms."""
        k = 0
        while k < len(self.pending):
            entry = self.pending[k]
            if not entry[3]:
                k += 1
                continue
            job = entry[0]
            if self.timing.activate_wait(job[4], job[2]) > self._slack():
                break
            self._send_activate(self.pending.pop(k))
        self._write()

    def _flush_activate(self) -> None:
        self._flush()

    def _write(self, force: bool = False) -> None:
        """The pending write-back, once no pending ACTIVATE writes its rows; unless
        ``force``, only when the front end would not wait for the ACTIVATEs sent to write
        them past :meth:`_slack`."""
        if self.pending_write is None:
            return
        ub, rows = self.pending_write
        if any(lo < ub + rows and ub < hi for _, (lo, hi), _, _ in self.pending):
            return
        if not force and self.timing.write_host_wait(ub, rows) > self._slack():
            return
        for s in range(0, rows, COUNT_LIMIT):
            self.p.write_host(ub + s, min(COUNT_LIMIT, rows - s))
        self.pending_write = None

    def _acc_region(self, rows: int) -> int:
        """First accumulator row of a job of ``rows`` rows: the next rows in turn, or the
        place where the ACTIVATEs still to be sent that these MATMULs would wait for (they
        read the same rows) are the shortest."""
        depth = self.c.acc_depth
        busy = [(job[4], job[4] + job[2]) for job, _, _, _ in self.pending]
        best = None
        for start in [self.acc_next, 0] + [hi for _, hi in busy]:
            if start + rows > depth:
                continue
            cost = sum(hi - lo for lo, hi in busy if lo < start + rows and start < hi)
            if best is None or cost < best[0]:
                best = (cost, start)
        return best[1]

    def _flush_for(self, test) -> None:
        """Send the pending ACTIVATEs ``test(job, span)`` holds for."""
        self._flush(lambda k, job, span: test(job, span))

    def _pass_runs(self, sp: _StagePlan, b: int, u0: int, m0: int, rows: int
                   ) -> list[tuple[np.ndarray, np.ndarray, list]]:
        """Per pass of the job ``m0..`` of a stage over units from ``u0`` of batch ``b``:
        the sources it reads (input-unit rows), which accumulator rows are real, and its
        MATMUL runs; the same for every column block, so worked out once."""
        lay = sp.layout
        first_stage = sp.index == 0
        u, r = np.divmod(m0 + np.arange(rows), lay.m)
        # Rows of images the program does not have (a last, partial unit) read nothing:
        # where they end a run, the run is shorter.
        have = len(self.x_q) - (b * self.plan.batch + (u0 + u) * self.plan.unit)
        real = lay.outputs[r // lay.window][:, 2] < have
        out = []
        for ps in lay.passes:
            src = ps.sources[r]
            keep = (src >= 0) & real
            if ps.step is not None:
                # Elements of the unit's block (whole units in the ring: no wrap). The
                # sources become the last row each window reads (what must be written).
                g = b * self.plan.units + u0
                absolute = self._ring_offset(g) * self.c.ub_row + src
                runs = _window_runs(np.where(keep, absolute, -1), ps.step, self.c)
                out.append(((src + self.c.rows - 1) // self.c.ub_row, keep, runs))
                continue
            if first_stage:
                g = b * self.plan.units + u0
                absolute = (self._ring_offset(g) + src) % self.plan.ring
            else:
                absolute = src + self._src_base(sp, b, u0 + u, ps.tensor)
            runs = _runs(np.where(keep, absolute, -1),
                         self.plan.ring if first_stage else self.c.ub_depth)
            out.append((src, keep, [(acc, ub, n, None, n) for acc, ub, n in runs]))
        return out

    def _stage(self, sp: _StagePlan, b: int, u0: int, units: int, emit: bool) -> None:
        """The jobs of a stage over ``units`` units of batch ``b`` from unit ``u0``."""
        c = self.c
        lay = sp.layout
        first_stage = sp.index == 0
        g = b * self.plan.units + u0                 # the program's unit (first stage)
        reads: dict = {}
        if emit and u0 == 0 and sp.refresh:
            self._refresh(sp)
        if emit and self.cn.reload_sums and sp.stage.skip is not None and \
                self.sums is not sp.stage:
            # Adds of other tables: this one's first (each load waits until the core is
            # idle, so no lookup of the last add is still in flight).
            for k, entries in enumerate(sp.stage.sum_tables):
                self.p.load_sum_table(k, entries.tolist())
            self.sums = sp.stage
        if first_stage and emit:
            # Every input row this unit's MATMULs will read stays live until the last job
            # that reads it has sent its MATMULs, so that the next unit's rows never land on
            # a row still to be read; after that the cycle model says when the array is done.
            for m0, rows in _jobs(sp, units, c):
                spans = [(g, ub, ub + n) for _, _, runs in self._pass_runs(sp, b, u0, m0, rows)
                         for _, ub, _, _, n in runs]
                for nb in range(lay.col_blocks):
                    reads[(m0, nb)] = list(spans)
                    self.ring_live += spans
        for m0, rows in _jobs(sp, units, c):
            u, r = np.divmod(m0 + np.arange(rows), lay.m)
            have = len(self.x_q) - (b * self.plan.batch + (u0 + u) * self.plan.unit)
            if not (lay.outputs[r // lay.window][:, 2] < have).any():
                continue                     # only images the program does not have
            passes = self._pass_runs(sp, b, u0, m0, rows) if emit else None
            for nb in range(lay.col_blocks):
                # Jobs take accumulator rows in turn around the whole memory, so that a short
                # job does not land on rows a long ACTIVATE is still reading.
                region = self._acc_region(rows)
                self.acc_next = region + rows
                if emit:
                    # A pending ACTIVATE of these accumulator rows goes first (these
                    # MATMULs then wait for it).
                    self._flush_for(lambda job, span, lo=region, hi=region + rows:
                                    job[4] < hi and lo < job[4] + job[2])
                issued = 0
                for step, kc in enumerate(self._passes(sp, nb)):
                    if not emit:
                        self.uses.append(sp.tiles[kc][nb])
                        continue
                    src, keep, runs = passes[kc]
                    if first_stage and keep.any():
                        self._feed_for(g, int(src[keep].max()) + 1)
                    # Every pass switches to its own tile, so none may be empty.
                    assert runs, (sp.stage.name, m0, kc)
                    # These MATMULs read what a pending ACTIVATE writes: it goes first.
                    self._flush_for(lambda job, span, runs=runs: any(
                        span[0] < ub + n and ub < span[1] for _, ub, _, _, n in runs))
                    lookup = sp.layout.passes[kc].lookup
                    for n, (acc, ub, count, window, _) in enumerate(runs):
                        if lookup is not None:      # a residual add's term (int8 both)
                            self.p.matmul_lookup(ub, region + acc, count, table=lookup,
                                                 switch=n == 0, accumulate=step > 0)
                        else:
                            self.p.matmul(ub, region + acc, count, switch=n == 0,
                                          accumulate=step > 0, signed=sp.stage.in_q.signed,
                                          window=window)
                        self.stage_rows[sp.index] += count
                        if n == 0:
                            self.used += 1
                            self._read_next(self.used)
                        issued += 1
                        if issued == 1:
                            # The previous job of this stage is done once this one's MATMUL
                            # is queued behind it: its ACTIVATE may go (a first-stage job
                            # also releases what later stages left), the array having work
                            # while it waits for those MATMULs to end.
                            self._release(None if first_stage else
                                          lambda k, job, span, s=sp.index: job[0].index == s)
                        else:
                            self._flush_due()
                        # Host rows for the time the queued MATMULs keep the array busy,
                        # less the dispatch of the next MATMUL.
                        self._feed(self.timing.host_rows_by(self._slack()))
                if emit:
                    job = (sp, m0, rows, nb, region, b, u0)
                    self.pending.append([job, self._targets_range(job), [], False])
                    # Its MATMULs are all sent: the interlocks keep a READ_HOST off the input
                    # rows they still read, and the cycle model says when that ends.
                    for piece in reads.get((m0, nb), ()):
                        self.ring_live.remove(piece)
                if sp.index == 0:
                    self._interleave(b, emit)

    def _refresh(self, sp: _StagePlan) -> None:
        """Write the frame of a stage's output that shares its rows with another tensor
        (the plan's ``refresh``) before the stage's first job of a batch: an ACTIVATE not yet
        sent that writes those rows (the other tensor's) and the write-back reading them go
        first."""
        zero = np.full(self.c.ub_row, sp.stage.out_q.zero_point, dtype=np.int64)
        for out in sp.outs:
            for start, count in _row_runs(out.border()):
                end = start + count
                self._flush_for(lambda job, span, lo=start, hi=end: span[0] < hi and lo < span[1])
                if self.pending_write is not None and \
                        self.pending_write[0] < end and start < sum(self.pending_write):
                    self._write(force=True)
                for s in range(0, count, COUNT_LIMIT):
                    n = min(COUNT_LIMIT, count - s)
                    self.p.read_host(start + s, np.broadcast_to(zero, (n, self.c.ub_row)))

    def _passes(self, sp: _StagePlan, nb: int) -> list[int]:
        """The passes column block ``nb`` of a stage runs: those whose weight tile is not all
        zero (a depthwise convolution's tiles off the diagonal; at least one pass, which
        writes the accumulators)."""
        kcs = [kc for kc in range(len(sp.layout.passes)) if not self.zero[sp.tiles[kc][nb]]]
        return kcs or [0]

    def _units(self, b: int) -> int:
        """Units batch ``b`` runs: the last batch only those holding images."""
        plan = self.plan
        images = max(1, min(plan.batch, len(self.x_q) - b * plan.batch))
        return _ceil_div(images, plan.unit)

    def _later(self, emit: bool) -> None:
        """Emit the oldest deferred later stage (and, after a batch's last stage, its
        write-back, deferred too)."""
        sp, b = self.deferred.popleft()
        units = self._units(b)
        self._stage(sp, b, 0, units, emit)
        if emit and sp.index == len(self.plan.stages) - 1:
            self._defer_write(b)

    def _interleave(self, b: int, emit: bool) -> None:
        """After a job of the first stage of batch ``b``: one later stage of an earlier
        batch, so that the MATMULs between two dependent stages hide the ACTIVATE the
        second waits for."""
        if self.deferred and self.deferred[0][1] < b:
            self._later(emit)

    def _defer_write(self, b: int) -> None:
        if self.pending_write is not None:
            self._flush_for(lambda job, span: span[0] < self.pending_write[0] +
                            self.pending_write[1] and self.pending_write[0] < span[1])
            self._write(force=True)
        outs = self.plan.stages[-1].outs
        out = outs[b % len(outs)]
        self.pending_write = (out.base, self._write_rows(b))

    def _write_rows(self, b: int) -> int:
        """The output rows batch ``b`` writes back: its units' blocks up to the last row of
        an image it has."""
        out = self.plan.stages[-1].outs[0]
        unit = self.plan.unit
        r = np.arange(out.block * self._units(b))
        images = (r // out.block) * unit + r % unit
        return int(np.flatnonzero(images < len(self.x_q) - b * self.plan.batch)[-1]) + 1

    def _program(self, emit: bool) -> None:
        plan = self.plan
        n_units = _ceil_div(len(self.x_q), plan.unit)
        sequential = plan.mode == "sequential"
        self.deferred = deque()
        if emit:
            self._queue_unit(0)
        g = 0                                   # unit of the program
        for b in range(self.batches):
            units = self._units(b)
            for u in range(units):
                # One batch after another (a sequential plan): the input ring shares rows
                # with the later stages' outputs, so the next batch's rows wait for them.
                if emit and g + 1 < n_units and not (sequential and u == units - 1):
                    self._queue_unit(g + 1)
                self._stage(plan.stages[0], b, u, 1, emit)
                g += 1
            if sequential and not self.profile:
                self.deferred.extend((sp, b) for sp in plan.stages[1:])
                while self.deferred:
                    self._later(emit)
                if emit:
                    if len(plan.stages) == 1:
                        self._defer_write(b)
                    if g < n_units:
                        # Every ACTIVATE and the write-back before the next batch's rows
                        # land on the rows they write or read.
                        self._flush()
                        self._write(force=True)
                        self._queue_unit(g)
                continue
            if self.profile:
                self._checkpoint()
                if len(plan.stages) == 1 and emit:
                    self._defer_write(b)
                for sp in plan.stages[1:]:
                    self.deferred.append((sp, b))
                    self._later(emit)
                    self._checkpoint()
                continue
            # An earlier batch's stages still deferred go now: the next batch's units
            # overwrite what they read.
            while self.deferred and self.deferred[0][1] < b:
                self._later(emit)
            if len(plan.stages) > 1:
                self.deferred.extend((sp, b) for sp in plan.stages[1:])
                if not plan.spare:          # the next batch's first unit overwrites them
                    while self.deferred:
                        self._later(emit)
            elif emit:
                self._defer_write(b)
        while self.deferred:
            self._later(emit)
        if emit:
            self._feed_all()
            self._flush_activate()
            self._write(force=True)

    def _checkpoint(self) -> None:
        """Profiling: every ACTIVATE sent, then the counters (READ_COUNTERS reports them
        once every earlier instruction has completed)."""
        if self.emitting:
            write, self.pending_write = self.pending_write, None   # the outputs go last
            self._flush()
            self.pending_write = write
            self.p.read_counters()

    def emit(self) -> tuple[list[int], int]:
        self.emitting = False
        self._program(emit=False)
        self.emitting = True
        self.jobs_done = self.acc_next = 0
        self._read_next(0)
        if self.profile:
            self.p.clear_counters()
        self._program(emit=True)
        self.p.halt()
        return self.p.beats, self.p.instructions
