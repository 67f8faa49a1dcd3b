"""Proof of the hazard tracker (:class:`hdl.control.hazards.HazardTracker`): an instruction
never reads a row before an earlier write to it has landed, nor writes a row an earlier
unfinished instruction still reads or writes.

The solver picks one row ``r`` (``AnyConst``; any unified-buffer row, accumulator row or
weight tile: the three spaces are checked separately). A shadow model follows, from the
tracker's inputs only (dispatches, MATMUL retirements, busy levels), which unfinished
instruction touches ``r`` and how, per :mod:`hdl.isa`:

- MATMUL reads buffer rows ``ub_addr..+count`` and writes accumulator rows
  ``acc_addr..+count``; unfinished from its dispatch until it retires (in order; the
  shadow keeps its own queue of in-flight MATMULs);
- ACTIVATE reads accumulator rows ``acc_addr..+count`` and writes buffer rows
  ``ub_addr..+count/window``; WRITE_HOST reads buffer rows ``ub_addr..+count``;
  READ_WEIGHTS reads tiles ``tile..+count``; each unfinished while its engine is busy;
- READ_HOST (buffer rows) and LOAD_WEIGHTS (tiles) write in the front end itself, and
  UB_TO_WEIGHTS (reads buffer rows ``ub_addr..+count``, writes tile ``tile``) runs while the
  front end waits for it, so they are finished before the next instruction is at the front
  end: as waiting instructions they are checked, as unfinished ones there is nothing to
  track.

Membership is ``lo <= r < lo + n`` on the instruction's fields, not the tracker's range
overlap compares. The property, every cycle, for the instruction at the front end: if it
reads ``r`` while an unfinished instruction writes it (RAW), writes ``r`` while one reads it
(WAR) or writes ``r`` while one writes it (WAW), then ``hazard`` is high. Two exceptions,
from the tracker's contract: a MATMUL's accumulator writes after an unfinished MATMUL's
(they land in order), and an ACTIVATE's buffer writes after an unfinished ACTIVATE's (the
engine runs one at a time, so the second is not dispatched while the first runs).

Also checked, for the front end's proof: ``hazard`` does not rise while the instruction at
the front end stays the same and nothing is dispatched (``no_rise``); and ``hazard_late``
(the tracker is built with ``late=True``) is ``hazard`` a cycle later (``late``).

Assumed of the environment (the front end and the engines; each is checked of them by
:mod:`sim.formal.engines` and the front end's dispatch rule):

- ``dispatch`` only while ``hazard`` is low;
- ``i_matmul_retire`` only while a MATMUL is in flight, and a MATMUL dispatched only while
  fewer than the tracker's slots are;
- each busy level (``i_activate_busy``, ``i_write_host_busy``, ``i_read_weights_busy``)
  rises exactly in the cycle after a dispatch of its engine's opcode, and its opcode is
  dispatched only while it is low (so it falls once per instruction); after a reset it may
  be high without a dispatch (the activation engine clears its parameter store).

Invariants tie the tracker's recorded ranges, slot pointers and valid bits to the shadow
model (through :class:`sim.formal.harness.Inside`). The proof is in parts (:data:`CHECKS`), each a
k-induction: ``ring`` (the slots' pointers and valid bits) and ``ranges`` prove invariants
inductive on their own, ``ring_ranges`` the ranges the live slots record, in every state
that satisfies ``ring``'s, ``rules`` proves RAW, WAR and WAW in every state that satisfies
them all (so in every reachable state), ``no_rise`` and ``late`` the properties for the front
end. In one piece the solver
does not finish in 10 minutes: it has to rediscover the invariants' range comparisons in
every step.

Every check but ``late`` runs on the tracker with its range compares written as ``>``
(:func:`word_compares`), where the tracker built with ``late=True`` compares with
:func:`~hdl.lib.compare.greater_than`'s trees; ``late`` proves, besides ``hazard_late``, that
``greater_than(x, y) == (x > y)`` for every pair of values of the tracker's width. The two
trackers differ in nothing else (the same function of the same two operands, in the same
places), so they have the same behaviours, and each check holds of the tracker built: the
same properties as before, of the same design (and of the tracker built without ``late``,
whose compares are ``<``). Why: ``no_rise`` compares ``hazard`` in two consecutive cycles, so
its induction step must show that two copies of each range compare agree when their
operands do. Written as ``>`` the copies are one word-level term each and the solver matches
them at once; as trees it must prove each pair equal bit by bit, which yices did not do in
23 minutes at the icebreaker's 9 bits, and z3 did in 16 s or not in 4 minutes depending on
nothing more than which assumptions the harness states. ``rules`` is the same kind of
problem (the tracker's compares against the shadow's ``lo <= row < lo + n``): its base case
ran more than 4 minutes at 17 bits with the trees, 20 s of processor time without. For the
same reason ``late`` is a check of its own: with both assertions in one induction the solver
is asked to break either, and no longer gets "nothing dispatched, the same instruction" as
facts to simplify with (yices: 140 s for the two together, 10 s each).
"""

from __future__ import annotations

import operator
from typing import Literal
from unittest import mock

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume, Cat, Module, Mux, Signal
from amaranth.lib import data

import hdl.control.hazards as tracker_module
from hdl.control.hazards import ADDR_END_BITS, MATMUL_SLOTS, HazardTracker
from hdl.isa import Activate, Opcode, Pool
from hdl.lib.compare import greater_than
from sim.formal.harness import Harness, Inside, past, was_reset

__all__ = ["hazards_harness", "word_compares", "RuleDroppedTracker", "CHECKS"]


def word_compares(tracker_class: type[HazardTracker]) -> type[HazardTracker]:
    """*tracker_class* with its range compares written as ``>`` where the tracker built with
    ``late=True`` has :func:`~hdl.lib.compare.greater_than`'s trees (everything else as
    built). Every check but ``late`` proves this one, and ``late`` that the trees equal ``>``
    (see the module docstring)."""

    class WordCompares(tracker_class):
        def elaborate(self, platform):
            with mock.patch.object(tracker_module, "greater_than", operator.gt):
                return super().elaborate(platform)

    WordCompares.__name__ = WordCompares.__qualname__ = f"{tracker_class.__name__}WordCompares"
    return WordCompares


class RuleDroppedTracker(HazardTracker):
    """A broken tracker for the tests: READ_HOST never waits (its write-after-read and
    write-after-write rule dropped)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.i_query.instr.opcode == Opcode.READ_HOST):
            m.d.comb += self.i_query.hazard.eq(0)
        return m


#: The parts of the proof, each a k-induction of its own (together, the solver does not
#: finish in 10 minutes): the rules under the invariants, and the invariants.
CHECKS = ("rules", "ring", "ring_ranges", "ranges", "no_rise", "late")

Check = Literal["rules", "ring", "ring_ranges", "ranges", "no_rise", "late"]


def hazards_harness(check: Check = "rules", *, small: int | None = None,
                    end_bits: int | None = None, slots: int = MATMUL_SLOTS,
                    slot: int | None = None,
                    dut_class: type[HazardTracker] = HazardTracker) -> Harness:
    """Harness proving :class:`HazardTracker` (see the module docstring).

    Parameters
    ----------
    check : "rules", "ring", "ring_ranges", "ranges", "no_rise" or "late"
        ``"rules"``: RAW, WAR and WAW, assuming the invariants that tie the tracker to the
        shadow model. ``"ring"``: the invariants on the MATMUL slots' pointers and valid
        bits, inductive on their own. ``"ring_ranges"``: the ranges the live slots record,
        assuming ``"ring"``'s invariants (which hold in every reachable state). ``"ranges"``:
        those on the ACTIVATE, WRITE_HOST and READ_WEIGHTS ranges. ``"no_rise"``: ``hazard``
        does not rise for a waiting instruction. Each of these on :func:`word_compares` of
        the tracker. ``"late"``: ``hazard_late`` is ``hazard`` a cycle later, and the compare
        trees are ``>``. The
        rules hold in every reachable state because the invariants do; split, each part is
        a fast induction.
    small : int, optional
        Assume every address and count field below *small*: a smoke test (the fast forms
        in the tests), not a proof for 16-bit fields.
    end_bits : int, optional
        Build the tracker with this range width (as the core does for its memories) and
        assume what the front end's range checks then guarantee: every range the
        instruction names ends below ``2**end_bits`` (``a + count``; for MATMUL and
        ACTIVATE also ``b`` plus its rows at ``b``, for UB_TO_WEIGHTS its tile ``b`` + 1).
        The tracker's default (every 16-bit field) if not given.
    slots : int
        The tracker's MATMUL slots (as the core builds it for its ``matmul_slots``).
    slot : int, optional
        With ``"ring_ranges"``: the one slot whose ranges to prove (each slot's invariant is
        inductive on its own, given the ring's; all the slots in one induction took z3 over
        four minutes at 17 bits, one slot about two seconds). Every slot if not given.
    dut_class : type
        The design under test: :class:`HazardTracker`, or a deliberately broken variant
        (:class:`RuleDroppedTracker`) for the tests.
    """

    def properties(m: Module, hz: HazardTracker, inside: Inside) -> None:
        q = hz.i_query
        fresh = was_reset(m)
        row = Signal(ADDR_END_BITS, name="row")
        m.d.comb += row.eq(AnyConst(ADDR_END_BITS))

        def within(lo, n):
            return (row >= lo) & (row < lo + n)

        # What the instruction at the front end does to the row.
        instr = q.instr
        op = instr.opcode
        a, b, count = instr.a, instr.b, instr.count
        pool = data.View(Activate, instr.as_value()).pool
        windows = Mux(pool == Pool.MAX4, count[2:], Mux(pool == Pool.MAX2, count[1:], count))
        is_ = {o: (op == o) for o in Opcode}
        x = {name: Signal(name=f"x_{name}") for name in
             ("ub_read", "ub_write", "acc_read", "acc_write", "tile_read", "tile_write")}
        m.d.comb += [
            x["ub_read"].eq((is_[Opcode.WRITE_HOST] | is_[Opcode.MATMUL] |
                             is_[Opcode.UB_TO_WEIGHTS]) & within(a, count)),
            x["ub_write"].eq((is_[Opcode.READ_HOST] & within(a, count)) |
                             (is_[Opcode.ACTIVATE] & within(b, windows))),
            x["acc_read"].eq(is_[Opcode.ACTIVATE] & within(a, count)),
            x["acc_write"].eq(is_[Opcode.MATMUL] & within(b, count)),
            x["tile_read"].eq(is_[Opcode.READ_WEIGHTS] & within(a, count)),
            x["tile_write"].eq((is_[Opcode.LOAD_WEIGHTS] & within(a, count)) |
                               (is_[Opcode.UB_TO_WEIGHTS] & within(b, 1))),
        ]
        dispatch = {o: q.dispatch & is_[o] for o in Opcode}

        # Shadow: the in-flight MATMULs, a ring of `slots` entries with its own
        # pointers; dispatch fills the entry at `mm_tail`, a retirement empties the oldest,
        # at `mm_head`. Entry k: live, reads the row, writes the row.
        n = Signal(range(slots + 1), name="mm_in_flight")
        mm_head = Signal(range(slots), name="mm_head")
        mm_tail = Signal(range(slots), name="mm_tail")
        live = [Signal(name=f"mm{k}_live") for k in range(slots)]
        mm_ub = [Signal(name=f"mm{k}_reads_row") for k in range(slots)]
        mm_acc = [Signal(name=f"mm{k}_writes_row") for k in range(slots)]
        retire = hz.i_matmul_retire
        for k in range(slots):
            with m.If(retire & (mm_head == k)):
                m.d.sync += live[k].eq(0)
            with m.If(dispatch[Opcode.MATMUL] & (mm_tail == k)):
                m.d.sync += [live[k].eq(1), mm_ub[k].eq(within(a, count)),
                             mm_acc[k].eq(within(b, count))]
        with m.If(retire):
            m.d.sync += mm_head.eq((mm_head + 1) % slots)
        with m.If(dispatch[Opcode.MATMUL]):
            m.d.sync += mm_tail.eq((mm_tail + 1) % slots)
        m.d.sync += n.eq(n + dispatch[Opcode.MATMUL] - retire)

        # Shadow: the running ACTIVATE, WRITE_HOST and READ_WEIGHTS (recorded at dispatch,
        # unfinished while their engine is busy).
        act_acc = Signal(name="act_reads_row")
        act_ub = Signal(name="act_writes_row")
        ho_ub = Signal(name="write_host_reads_row")
        rw_tile = Signal(name="read_weights_reads_row")
        with m.If(dispatch[Opcode.ACTIVATE]):
            m.d.sync += [act_acc.eq(within(a, count)), act_ub.eq(within(b, windows))]
        with m.If(dispatch[Opcode.WRITE_HOST]):
            m.d.sync += ho_ub.eq(within(a, count))
        with m.If(dispatch[Opcode.READ_WEIGHTS]):
            m.d.sync += rw_tile.eq(within(a, count))

        # Environment. The front end computes the ranges' ends (no_rise holds whatever they
        # are, as long as they stay: its property says so, and the solver is spared the adders).
        if check != "no_rise":
            m.d.comb += [
                Assume(q.a_end == a + count),
                Assume(q.b_end == b + Mux(is_[Opcode.ACTIVATE], windows, count)),
            ]
        if small is not None:
            m.d.comb += Assume((a < small) & (b < small) & (count < small))
        if end_bits is not None:
            b_rows = Mux(is_[Opcode.ACTIVATE], windows, Mux(is_[Opcode.UB_TO_WEIGHTS], 1, count))
            m.d.comb += Assume((a + count < 1 << end_bits) &
                               (~(is_[Opcode.MATMUL] | is_[Opcode.ACTIVATE] |
                                  is_[Opcode.UB_TO_WEIGHTS]) |
                                (b + b_rows < 1 << end_bits)))
        m.d.comb += [
            Assume(~q.dispatch | ~q.hazard),
            Assume(~retire | (n != 0)),
            Assume(~dispatch[Opcode.MATMUL] | (n != slots)),
        ]
        engines = {Opcode.ACTIVATE: hz.i_activate_busy, Opcode.WRITE_HOST: hz.i_write_host_busy,
                   Opcode.READ_WEIGHTS: hz.i_read_weights_busy}
        for o, busy in engines.items():
            name = o.name.lower()
            busy_1 = past(m, busy, name=f"{name}_busy_1")
            took_1 = past(m, dispatch[o], name=f"{name}_dispatched_1")
            m.d.comb += [
                Assume(fresh | ~(busy & ~busy_1) | took_1),     # rises only after a dispatch
                Assume(fresh | ~took_1 | busy),                  # and does after each
                Assume(~dispatch[o] | ~busy),                    # one at a time
            ]

        # Unfinished instructions and the row.
        ub_read = Cat(*(live[i] & mm_ub[i] for i in range(slots)),
                      hz.i_write_host_busy & ho_ub).any()
        ub_write = hz.i_activate_busy & act_ub
        acc_read = hz.i_activate_busy & act_acc
        acc_write = Cat(*(live[i] & mm_acc[i] for i in range(slots))).any()
        tile_read = hz.i_read_weights_busy & rw_tile
        raw = Signal(name="raw")
        war = Signal(name="war")
        waw = Signal(name="waw")
        m.d.comb += [
            raw.eq((x["ub_read"] & ub_write) | (x["acc_read"] & acc_write)),
            war.eq((x["ub_write"] & ub_read) | (x["acc_write"] & acc_read) |
                   (x["tile_write"] & tile_read)),
            # MATMUL after MATMUL (accumulator writes in order) and ACTIVATE after ACTIVATE
            # (one at a time) are the exceptions.
            waw.eq(x["ub_write"] & ub_write & ~is_[Opcode.ACTIVATE]),
        ]
        rules = [(raw, "read after write: waits for the write to land"),
                 (war, "write after read: waits for the reader"),
                 (waw, "write after write: waits for the earlier writer")]

        # For the front end's stream rules: no new hazard for a waiting instruction.
        hazard_1 = past(m, q.hazard, name="hazard_1")
        dispatch_1 = past(m, q.dispatch, name="dispatch_1")
        asked = Cat(instr.as_value(), q.a_end, q.b_end)    # (the ends follow the word)
        asked_1 = past(m, asked, name="asked_1")
        no_rise = (fresh | ~(q.hazard & ~hazard_1) | dispatch_1 | (asked != asked_1))

        # Invariants: the tracker's slots are the shadow's ring, and its recorded ranges
        # hold the row exactly when the shadow says the instruction touches it.
        head, tail = inside.signal("head"), inside.signal("tail")

        def holds(range_name):
            lo = inside.signal(f"{range_name}_lo")
            hi = inside.signal(f"{range_name}_hi")
            return (lo <= row) & (row < hi)

        ring = [
            (n <= slots, "in flight: within the slots"),
            (head == mm_head, "the oldest MATMUL's slot"),
            (tail == mm_tail, "the next MATMUL's slot"),
            (mm_tail == (mm_head + n) % slots, "the ring's pointers"),
        ]
        for h in range(slots):
            for i in range(slots):
                ring.append(((mm_head != h) | (live[(h + i) % slots] == (i < n)),
                             "live entries: the n from the oldest on"))
        ring_ranges = []
        for k in range(slots):
            ring += [
                (inside.signal(f"mm{k}_ub_valid") == live[k], f"slot {k} valid"),
                (inside.signal(f"mm{k}_acc_valid") == live[k], f"slot {k} valid"),
            ]
            if slot is None or slot == k:
                ring_ranges += [
                    (~live[k] | (holds(f"mm{k}_ub") == mm_ub[k]), f"slot {k}'s buffer range"),
                    (~live[k] | (holds(f"mm{k}_acc") == mm_acc[k]),
                     f"slot {k}'s accumulator range"),
                ]
        ranges = [
            (holds("act_acc") == act_acc, "ACTIVATE's accumulator range"),
            (holds("act_ub") == act_ub, "ACTIVATE's buffer range"),
            (holds("ho_ub") == ho_ub, "WRITE_HOST's buffer range"),
            (holds("rw_tiles") == rw_tile, "READ_WEIGHTS' tile range"),
        ]
        invariants = {"ring": ring, "ring_ranges": ring_ranges, "ranges": ranges}

        if check in invariants:
            # The slots' ranges are proved on the ring the "ring" check proves, a slot at a
            # time: with the pointers and every slot's 17-bit ranges in one induction z3 took
            # 250 s alone (past its 300 s limit on a loaded machine); apart, seconds each.
            if check == "ring_ranges":
                m.d.comb += [Assume(holds_) for holds_, _ in ring]
            m.d.comb += [Assert(holds_, what) for holds_, what in invariants[check]]
        elif check == "no_rise":
            m.d.comb += Assert(no_rise, "hazard does not rise for an instruction that waits")
        elif check == "late":
            # The lemma that makes the tracker the other checks prove (word compares) the one
            # built.
            x = Signal(hz.end_bits, name="lemma_x")
            y = Signal(hz.end_bits, name="lemma_y")
            m.d.comb += [
                x.eq(AnySeq(hz.end_bits)), y.eq(AnySeq(hz.end_bits)),
                Assert(greater_than(x, y) == (x > y), "the tracker's compare trees are `>`"),
                # (the tracker is built with late=True: pipeline="fast" acts on it)
                Assert(fresh | (q.hazard_late == hazard_1), "hazard_late is hazard a cycle "
                       "later"),
            ]
        else:
            # Sound: the "ring" and "ranges" checks prove these in every reachable state.
            m.d.comb += [Assume(holds_) for group in invariants.values()
                         for holds_, _ in group]
            m.d.comb += [Assert(~conflict | q.hazard, what) for conflict, what in rules]

    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, not {check!r}")
    if slot is not None and (check != "ring_ranges" or not 0 <= slot < slots):
        raise ValueError(f"slot={slot!r} picks one of the {slots} slots of the ring_ranges "
                         f"check, not of {check!r}")
    if check != "late":
        dut_class = word_compares(dut_class)
    dut = dut_class(slots=slots, late=True) if end_bits is None else \
        dut_class(end_bits=end_bits, slots=slots, late=True)
    return Harness(dut, properties, reset="any")
