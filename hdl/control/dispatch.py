"""The front end's timing: whether the instruction at fetch issues, fails or waits, and in
which cycle the front end acts on what it sees."""

from amaranth.hdl import Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.isa import INSTR_BITS, ErrorCode, LoadTable, Opcode, TableTarget

__all__ = ["Dispatch", "ENGINE_OPCODES"]

#: The opcodes the front end hands to an engine on a dispatch stream, in ``i_engine_ready``
#: order.
ENGINE_OPCODES = (Opcode.READ_WEIGHTS, Opcode.MATMUL, Opcode.ACTIVATE, Opcode.WRITE_HOST,
                  Opcode.UB_TO_WEIGHTS)


class Dispatch(wiring.Component):
    """Decides, for the instruction waiting at the front end's fetch, whether it issues (its
    checks pass, the hazard tracker reports no conflict, and its engine can take it: for SYNC,
    HALT, READ_COUNTERS and CLEAR_COUNTERS every engine is idle, for LOAD_PARAMS and
    LOAD_TABLE no ACTIVATE runs) or fails a check. Which cycle is the config's
    :attr:`~hdl.config.TPUConfig.pipeline`'s, and this component owns every such decision of
    the front end (the checks register their own answers to suit,
    :class:`~hdl.control.checks.Checks`):

    - ``"reference"``: on this cycle's answers; a beat may issue in its first cycle.
    - ``"compact"``: the front end registers the beat's range ends and the word it asks the
      hazard tracker about (its checks and the tracker's answer are the beat's own from its
      second cycle), the answers are registered, and the part of the decision that depends on
      the opcode and the engines' readiness is registered too, taken a cycle ahead for the
      beat that stays: a beat issues or fails at the earliest in its third cycle, and the
      dispatch (and each opcode's) is one LUT of four flip-flops (that part, whether a check
      failed, the hazard, whether the beat was not taken last cycle), not a LUT cone from the
      instruction word and the engines' ``ready``. It relies on the engines: a ready engine
      stays ready until it takes an instruction, the activation engine becomes busy and the
      core stops being idle only as something is dispatched (each a proved property,
      :mod:`sim.formal.engines`). An instruction that waits for its engine issues a cycle
      after the engine is ready.
    - ``"fast"``: as ``"compact"``, and the front end registers its checks' answers before
      they are combined (``i_error`` and ``i_failed`` are the beat's own from its third
      cycle), the engines' readiness is registered, and the hazard tracker's answer comes a
      cycle late (``i_hazard`` is its ``hazard_late``), so that no check's logic (the range
      compares, the tile masks) runs into the dispatch's registers: a beat issues or fails at
      the earliest in its fourth cycle.

    ``o_dispatch`` and ``o_fail`` each imply a waiting beat that is not the resynchronisation
    word; the front end takes the beat in that cycle. With the compact and fast pipelines the
    front end also acts on the resynchronisation word in its second cycle (``o_resync``,
    from a register: the word was offered and not taken, so it is still there) and, stopped,
    takes each beat in its second cycle (``o_take_stopped``), so that the word's compare (a
    LUT tree over the instruction word) does not run into ``i_host``'s ready and what that
    drives; and the word the hazard tracker is asked about is registered with the checks'
    range ends.

    Members
    -------
    i_valid : In(1)
        A beat is offered to the front end.
    i_waiting : In(1)
        A beat waits at fetch.
    i_taken : In(1)
        The front end takes it this cycle.
    i_resync : In(1)
        It is the resynchronisation word.
    i_word : In(INSTR_BITS)
        Its instruction word.
    i_opcode : In(Opcode)
    i_error : In(ErrorCode)
        Its checks' answer, this cycle (the first that fails).
    i_failed : In(1)
        Some check fails (``i_error`` is not NONE), this cycle.
    i_hazard, i_hazard_late : In(1)
        The hazard tracker's answer, this cycle, and a cycle later (used with ``"fast"``).
    i_engine_ready : In(len(engine_opcodes))
        Each engine's ``ready`` (:attr:`engine_opcodes` order: :data:`ENGINE_OPCODES`, without
        UB_TO_WEIGHTS on a core built without it).
    i_activate_busy, i_idle : In(1)
    i_sums_busy : In(1)
        With the sum tables: their zeroing after a reset still runs (MATMUL_LOOKUP and a sum
        table's LOAD_TABLE wait for it; it only falls).
    o_error : Out(ErrorCode)
        The checks' answer acted on (registered but with ``"reference"``).
    o_dispatch, o_fail : Out(1)
        The instruction issues, or fails a check, this cycle.
    o_issue : Out(2 ** opcode width)
        ``o_dispatch``, one-hot by opcode (bit ``opcode.value``).
    o_raw_stall : Out(1)
        At fetch, the instruction waits on a conflict (the ``raw_stall`` counter's event).
    o_resync : Out(1)
        Act on the resynchronisation word now (restart the program, or leave ERROR).
    o_take_stopped : Out(1)
        Stopped on an error, take the beat offered now.
    o_query : Out(INSTR_BITS)
        The word the hazard tracker is asked about.
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        self.engine_opcodes = tuple(o for o in ENGINE_OPCODES if o in config.opcodes)
        super().__init__({
            "i_valid":         In(1),
            "i_waiting":       In(1),
            "i_taken":         In(1),
            "i_resync":        In(1),
            "i_word":          In(INSTR_BITS),
            "i_opcode":        In(Opcode),
            "i_error":         In(ErrorCode),
            "i_failed":        In(1),
            "i_hazard":        In(1),
            "i_hazard_late":   In(1),
            "i_engine_ready":  In(len(self.engine_opcodes)),
            "i_activate_busy": In(1),
            "i_idle":          In(1),
            **({"i_sums_busy": In(1)} if config.sum_tables else {}),
            "o_error":         Out(ErrorCode),
            "o_dispatch":      Out(1),
            "o_fail":          Out(1),
            "o_issue":         Out(1 << Shape.cast(Opcode).width),
            "o_raw_stall":     Out(1),
            "o_resync":        Out(1),
            "o_take_stopped":  Out(1),
            "o_query":         Out(INSTR_BITS),
        })

    def elaborate(self, platform):
        pipeline = self.config.pipeline
        m = Module()
        op = self.i_opcode
        # (A core without UB_TO_WEIGHTS or LOAD_TABLE decodes nothing of them: its netlist is
        # the one before the instruction.)
        opcodes = self.config.opcodes
        is_ = {o: op == o for o in opcodes}
        busy = Signal()         # the engine (or the whole core) cannot take it yet
        sums = self.config.sum_tables
        with m.Switch(op):
            for o, ready in zip(self.engine_opcodes, self.i_engine_ready, strict=True):
                with m.Case(o):
                    m.d.comb += busy.eq(~ready)
            if sums:        # MATMUL_LOOKUP: a MATMUL, once the tables are zeroed
                ready = self.i_engine_ready[self.engine_opcodes.index(Opcode.MATMUL)]
                with m.Case(Opcode.MATMUL_LOOKUP):
                    m.d.comb += busy.eq(~ready | self.i_sums_busy)
            # (The parameters and the table must not change under a running ACTIVATE, a sum
            # table under a MATMUL_LOOKUP's rows: those wait until the core is idle. A core
            # without the sum tables decodes no target: its netlist is the one before them.)
            with m.Case(*(o for o in (Opcode.LOAD_PARAMS, Opcode.LOAD_TABLE)
                          if o in opcodes and not (sums and o == Opcode.LOAD_TABLE))):
                m.d.comb += busy.eq(self.i_activate_busy)
            if sums:
                with m.Case(Opcode.LOAD_TABLE):
                    target = data.View(LoadTable, self.i_word).target
                    m.d.comb += busy.eq(Mux(target == TableTarget.ACTIVATION,
                                            self.i_activate_busy,
                                            ~self.i_idle | self.i_sums_busy))
            with m.Case(Opcode.SYNC, Opcode.HALT, Opcode.READ_COUNTERS, Opcode.CLEAR_COUNTERS):
                m.d.comb += busy.eq(~self.i_idle)
        waiting = self.i_waiting & ~self.i_resync
        if pipeline == "reference":
            m.d.comb += [
                self.o_error.eq(self.i_error),
                self.o_fail.eq(waiting & self.i_failed),
                self.o_dispatch.eq(waiting & ~self.i_failed & ~self.i_hazard & ~busy),
                self.o_raw_stall.eq(waiting & ~self.i_failed & self.i_hazard),
                self.o_resync.eq(self.i_valid & self.i_resync),
                self.o_take_stopped.eq(1),
                self.o_query.eq(self.i_word),
            ]
            for o in opcodes:
                m.d.comb += self.o_issue[o.value].eq(self.o_dispatch & is_[o])
        else:
            resync_q = Signal()
            stayed_offered = Signal()
            offered_stays = self.i_valid & ~self.i_taken
            m.d.sync += [resync_q.eq(offered_stays & self.i_resync),
                         stayed_offered.eq(offered_stays),
                         self.o_query.eq(self.i_word)]
            m.d.comb += [self.o_resync.eq(resync_q), self.o_take_stopped.eq(stayed_offered)]
            # ("fast": the hazard a cycle later, registered inside the tracker; the beat's
            # own from its third cycle, as its checks' answers.)
            hazard = self.i_hazard_late if pipeline == "fast" else self.i_hazard
            stays = Signal()    # offered and not taken: the same beat is there next cycle
            m.d.comb += stays.eq(self.i_waiting & ~self.i_taken)
            hazard_q = Signal()     # the hazard acted on
            m.d.sync += [self.o_error.eq(self.i_error), hazard_q.eq(hazard)]
            # The answers are the beat's own once it has stayed a cycle (`stayed`; with
            # "fast", whose checks' answers come a cycle later, two: `stayed2`):
            # registered then, they may be acted on a cycle later.
            stayed = Signal()
            failed_q = Signal()
            ready_go = Signal()     # it will issue next cycle, if it passes checks and hazard
            ready_issue = Signal.like(self.o_issue)
            # `held`: the beat is there and its answers are its own; `stays` (whether the front
            # end does not take it this cycle, a long path) goes into `stayed` alone, and is
            # ANDed in as that register.
            held = self.i_waiting & stayed & ~self.i_resync
            if pipeline == "fast":
                stayed2 = Signal()
                m.d.sync += stayed2.eq(stays & stayed)
                held = held & stayed2
                # The engines' readies registered too (a ready ran into `ready_go`). A ready
                # falls only as its engine takes an instruction, and the beat after that one
                # is held two cycles later at the soonest, when the register has the fall.
                busy_q = Signal()
                m.d.sync += busy_q.eq(busy)
                busy = busy_q
            settled = Signal()
            m.d.sync += [stayed.eq(stays), failed_q.eq(self.i_failed), settled.eq(held),
                         ready_go.eq(held & ~busy)]
            for o in opcodes:
                m.d.sync += ready_issue[o.value].eq(held & ~busy & is_[o])
            own = Signal()          # the answers are the beat's own and may be acted on
            m.d.comb += own.eq(settled & stayed)
            clear = ~failed_q & ~hazard_q & stayed
            m.d.comb += [
                self.o_fail.eq(own & failed_q),
                self.o_dispatch.eq(ready_go & clear),
                self.o_issue.eq(ready_issue & clear.replicate(len(ready_issue))),
                self.o_raw_stall.eq(~self.o_dispatch & ~self.o_fail & ~resync_q &
                                    own & hazard_q),
            ]
        return m
