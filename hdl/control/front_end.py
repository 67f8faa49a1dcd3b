"""The front end: fetch, decode, error checks, dispatch, host transfers and status."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import (
    DONE_MAGIC,
    ERROR_MAGIC,
    ErrorBeat,
    param_row_beat,
    ub_row_beat,
    weight_row_beat,
)
from hdl.config import TPUConfig
from hdl.control.checks import Checks
from hdl.control.dispatch import ENGINE_OPCODES, Dispatch
from hdl.control.hazards import HazardQuerySignature
from hdl.control.param_store import ParamKind, param_write_layout
from hdl.isa import (
    COUNTER_BITS,
    COUNTERS,
    INSTR_BITS,
    RESYNC_WORD,
    Activate,
    ErrorCode,
    Instr,
    LoadParams,
    LoadWeights,
    Matmul,
    Opcode,
    ReadWeights,
    Status,
    WriteHost,
)
from hdl.layouts import weight_row_layout
from hdl.lib.arith import times_constant
from hdl.ports import MemWriteSignature, addr_bits

__all__ = ["FrontEnd"]

_INDEX = data.Layout.cast(Status)["instr_index"].width


class FrontEnd(wiring.Component):
    """Takes the host's beats one instruction at a time, checks each before it has any
    effect, and either runs it (host transfers, which own the input stream: READ_HOST,
    LOAD_WEIGHTS, LOAD_PARAMS; READ_COUNTERS, CLEAR_COUNTERS, HALT, SYNC, NOP) or hands it
    to its engine on a dispatch stream (READ_WEIGHTS, MATMUL, ACTIVATE, WRITE_HOST).

    Contract:

    - an instruction issues (dispatch) when it passes every check, the hazard tracker
      reports no conflict, and its engine takes it (or, for SYNC, HALT, READ_COUNTERS and
      CLEAR_COUNTERS, every engine is idle; for LOAD_PARAMS, no ACTIVATE runs); until then
      it waits, counting ``raw_stall`` cycles while the tracker reports a conflict. In
      which cycle is the :attr:`~hdl.config.TPUConfig.pipeline`'s, decided by
      :class:`~hdl.control.dispatch.Dispatch`: with ``"reference"`` in its first cycle at
      the front end at the earliest, with ``"compact"`` in its third, with ``"fast"`` in
      its fourth;
    - a dispatch stream's ``valid`` rises only with the instruction's checks passed and no
      conflict, and stays until the engine takes it;
    - a failing check (:class:`~hdl.isa.ErrorCode`, first failing in priority order;
      :class:`~hdl.control.checks.Checks`) sets
      the sticky status before the instruction has any effect; the front end then sends an
      error beat (:class:`~hdl.beats.ErrorBeat`) once no WRITE_HOST runs, and discards every
      beat until :data:`~hdl.isa.RESYNC_WORD` or ``i_clear``, which restart the program.
      While stopped it issues nothing and writes no memory;
    - the resynchronisation word at instruction fetch restarts the program;
    - after a reset it writes zeros to every unified-buffer row and waits until every
      engine is idle (they clear their own memories) before it takes the first beat.

    Members
    -------
    i_host : In(stream.Signature(unsigned(host_width)))
        Instructions and data beats.
    o_beat : Out(stream.Signature(unsigned(host_width)))
        Counter, DONE and error beats (to the host writer).
    o_status : Out(Status)
    i_clear : In(1)
        Clears a pending error (out of band).
    o_hazards : Out(HazardQuerySignature())
        The instruction at the front end, its dispatch, and the tracker's answer.
    o_read_weights, o_matmul, o_activate, o_write_host : Out(stream.Signature(layout))
        Dispatch to the engines (the instruction word in its opcode's layout).
    o_ub_write : Out(MemWriteSignature(ub_bits, ub_row))
        READ_HOST rows into the unified buffer.
    o_wm_write : Out(MemWriteSignature(wm_bits, weight_row_layout))
        LOAD_WEIGHTS rows into the weight memory.
    o_param_write : Out(stream.Signature(param_write_layout))
        LOAD_PARAMS into the activation engine's parameter store.
    i_idle : In(1)
        Every engine is idle.
    i_activate_busy, i_write_host_busy : In(1)
    o_counter_select : Out(range(len(COUNTERS)))
    i_counter_valid : In(1)
    i_counter_value : In(COUNTER_BITS)
        The counter the front end samples next, and its value when valid
        (:class:`~hdl.control.counters.PerfCounters` shows each in turn). READ_COUNTERS
        samples each counter in the first cycle it is shown after the instruction issues
        (the first) or the previous beat is taken; a beat holds its sampled value while the
        host stalls.
    o_instruction, o_raw_stall, o_host_stall, o_clear_counters, o_host_work : Out(1)
        Counter events: an instruction completed; waiting on a conflict; waiting for a beat;
        CLEAR_COUNTERS; a host transfer moved a beat.
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        self.ub_bits = addr_bits(cfg.ub_depth)
        self.wm_bits = addr_bits(cfg.weight_mem_tiles * cfg.rows)
        ub_row = ub_row_beat(cfg.ub_row)
        host = stream.Signature(unsigned(cfg.host_width))
        super().__init__({
            "i_host":            In(host),
            "o_beat":            Out(host),
            "o_status":          Out(Status),
            "i_clear":           In(1),
            "o_hazards":         Out(HazardQuerySignature()),
            "o_read_weights":    Out(stream.Signature(ReadWeights)),
            "o_matmul":          Out(stream.Signature(Matmul)),
            "o_activate":        Out(stream.Signature(Activate)),
            "o_write_host":      Out(stream.Signature(WriteHost)),
            "o_ub_write":        Out(MemWriteSignature(self.ub_bits, ub_row)),
            "o_wm_write":        Out(MemWriteSignature(
                self.wm_bits, weight_row_layout(cfg.cols, cfg.data_width))),
            "o_param_write":     Out(stream.Signature(param_write_layout(cfg.cols,
                                                                         cfg.param_slots))),
            "i_idle":            In(1),
            "i_activate_busy":   In(1),
            "i_write_host_busy": In(1),
            "o_counter_select":  Out(range(len(COUNTERS))),
            "i_counter_valid":   In(1),
            "i_counter_value":   In(COUNTER_BITS),
            "o_instruction":     Out(1),
            "o_raw_stall":       Out(1),
            "o_host_stall":      Out(1),
            "o_clear_counters":  Out(1),
            "o_host_work":       Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        m = Module()

        # Decode-level state (changes only as instructions issue).
        written = Signal(cfg.weight_mem_tiles)     # tiles LOAD_WEIGHTS has written
        queued = Signal(range(cfg.weight_fifo_depth + 2))  # tiles read, not switched in
        have_active = Signal()                     # a tile has been switched in
        index = Signal(_INDEX)                     # instruction index in the program
        halted = Signal()
        status = self.o_status
        m.d.comb += [status.halted.eq(halted), status.instr_index.eq(index)]

        # Decode.
        beat = self.i_host.payload
        word = beat[:INSTR_BITS]
        # The data beats, each in the low bits of the beat.
        ub_beat = data.View(ub_row_beat(cfg.ub_row),
                            beat[:data.Layout.cast(ub_row_beat(cfg.ub_row)).size])
        weight_beat = data.View(weight_row_beat(cols),
                                beat[:data.Layout.cast(weight_row_beat(cols)).size])
        param_beat = data.View(param_row_beat(cols),
                               beat[:data.Layout.cast(param_row_beat(cols)).size])
        instr = data.View(Instr, word)
        op = instr.opcode
        mm = data.View(Matmul, word)
        lw = data.View(LoadWeights, word)
        lp = data.View(LoadParams, word)
        a, count = instr.a, instr.count
        # The checks (but with the reference pipeline they answer from the beat's second or
        # third cycle; Dispatch waits for that). The word the hazard tracker is asked about
        # is registered with their range ends, which it takes too.
        m.submodules.checks = checks = Checks(cfg)
        m.d.comb += [checks.i_word.eq(word), checks.i_written.eq(written),
                     checks.i_queued.eq(queued), checks.i_have_active.eq(have_active),
                     self.o_hazards.a_end.eq(checks.o_a_end),
                     self.o_hazards.b_end.eq(checks.o_b_end)]
        decided_ahead = cfg.pipeline != "reference"     # see Dispatch
        ahead = m.d.sync if decided_ahead else m.d.comb
        ahead += self.o_hazards.instr.eq(word)
        is_ = {o: Signal(name=f"is_{o.name.lower()}") for o in Opcode}
        for o in Opcode:
            m.d.comb += is_[o].eq(op == o)

        resync = Signal()       # the beat at the front end is the resynchronisation word
        m.d.comb += resync.eq(word == RESYNC_WORD)
        # With the dispatch decided ahead, the front end acts on the resynchronisation word
        # in its second cycle (`resync_q`: it was offered and not taken, so it is still
        # there), and in ERROR takes each beat in its second cycle (`stayed`), so that the
        # word's compare (a LUT tree over the instruction word) does not run into i_host's
        # ready and what that drives. (A beat every other cycle while stopped.)
        resync_q = Signal()
        stayed = Signal()
        if decided_ahead:
            m.d.sync += [resync_q.eq(self.i_host.valid & ~self.i_host.ready & resync),
                         stayed.eq(self.i_host.valid & ~self.i_host.ready)]
        fetching = Signal()

        # Dispatch: whether the instruction at fetch issues or fails now (see Dispatch).
        engines = {Opcode.READ_WEIGHTS: self.o_read_weights, Opcode.MATMUL: self.o_matmul,
                   Opcode.ACTIVATE: self.o_activate, Opcode.WRITE_HOST: self.o_write_host}
        m.submodules.dispatch = decide = Dispatch(cfg)
        m.d.comb += [
            decide.i_waiting.eq(fetching & self.i_host.valid),
            decide.i_taken.eq(self.i_host.ready),
            decide.i_resync.eq(resync),
            decide.i_opcode.eq(op),
            decide.i_error.eq(checks.o_error),
            decide.i_failed.eq(checks.o_failed),
            # ("fast": the answer a cycle later, registered inside the tracker; the beat's
            # own from its third cycle, as its checks' answers.)
            decide.i_hazard.eq(self.o_hazards.hazard_late if cfg.pipeline == "fast"
                               else self.o_hazards.hazard),
            decide.i_engine_ready.eq(Cat(*(engines[o].ready for o in ENGINE_OPCODES))),
            decide.i_activate_busy.eq(self.i_activate_busy),
            decide.i_idle.eq(self.i_idle),
        ]
        settled, error_code, hazard = decide.o_settled, decide.o_error, decide.o_hazard
        dispatch = Signal()     # the instruction issues (as the front end takes it)
        fail = Signal()         # the instruction fails a check (as the front end takes it)
        issue = {o: Signal(name=f"issue_{o.name.lower()}") for o in Opcode}
        m.d.comb += [dispatch.eq(decide.o_dispatch), fail.eq(decide.o_fail),
                     self.o_hazards.dispatch.eq(dispatch)]
        for o in Opcode:
            m.d.comb += issue[o].eq(decide.o_issue[o.value])
        for o, port in engines.items():
            m.d.comb += [port.valid.eq(issue[o]), port.payload.eq(word)]
        # For waveforms only (nothing reads it): the opcode of the instruction waiting at
        # i_host, NOP while data beats stream or no beat waits (`o_hazards.instr` decodes every
        # beat, data too).
        fetch_opcode = Signal(Opcode)
        with m.If(fetching & self.i_host.valid):
            m.d.comb += fetch_opcode.eq(op)

        # Host transfers.
        addr = Signal(max(self.ub_bits, self.wm_bits))   # a row, or tile * rows + row
        left = Signal(range((1 << instr.count.shape().width) * rows + 1))
        signed_ = Signal()
        slot = Signal.like(self.o_param_write.payload.slot)
        counter = Signal(range(len(COUNTERS)))
        # A counter beat's payload is held in a register: the counters keep counting while
        # the host stalls, and a stream's payload must not change before the transfer. It is
        # sampled when the counter bank shows the counter, then offered. With the fast
        # pipeline the DONE and error beats are loaded into it too, as their states are
        # entered, so that the beat is a register and no state decode runs into its 64 bits
        # (and on into the host writer's queue).
        beat_in_register = cfg.pipeline == "fast"
        scale_late = cfg.scale_tiles_late
        beat_word = Signal(64 if beat_in_register else COUNTER_BITS)

        def done_beat(count):
            return Cat(count[:_INDEX], Const(0, 32 - _INDEX), Const(DONE_MAGIC, 32))

        def error_beat(code):
            return (data.Layout.cast(ErrorBeat).const({"magic": ERROR_MAGIC}).as_value() |
                    Cat(index, code.as_value()))
        counter_held = Signal()
        beat_out = self.o_beat
        scrubbing = Signal()
        scrub_addr = Signal(range(cfg.ub_depth))
        m.d.comb += [
            self.o_ub_write.payload.addr.eq(Mux(scrubbing, scrub_addr, addr)),
            self.o_ub_write.payload.data.eq(Mux(scrubbing, 0, ub_beat.as_value())),
            self.o_wm_write.payload.addr.eq(addr),
            self.o_wm_write.payload.data.data.eq(weight_beat),
            self.o_wm_write.payload.data.signed.eq(signed_),
            self.o_param_write.payload.row.eq(param_beat),
            self.o_param_write.payload.shift.eq(lp.shift),
            self.o_param_write.payload.zero_point.eq(lp.zero_point.as_signed()),
            self.o_param_write.payload.clamp_hi.eq(lp.clamp_hi.as_signed()),
            self.o_counter_select.eq(counter),
            beat_out.payload.eq(beat_word),
            self.o_host_work.eq(self.o_ub_write.valid | self.o_wm_write.valid |
                                beat_out.valid),
        ]

        host_wait = Signal()

        def resync_actions():
            # Restart the program; not an instruction.
            m.d.comb += self.i_host.ready.eq(1)
            m.d.sync += [halted.eq(0), index.eq(0)]

        def fail_actions():
            m.d.comb += self.i_host.ready.eq(1)
            m.d.sync += [status.error.eq(1), status.code.eq(error_code), halted.eq(0)]
            if beat_in_register:
                m.d.sync += beat_word.eq(error_beat(error_code))
            m.next = "ERROR_BEAT"

        def issue_actions():
            m.d.comb += self.i_host.ready.eq(1)
            m.d.sync += [halted.eq(0), index.eq(index + 1)]
            if decided_ahead:   # each opcode's from its own register
                m.d.comb += self.o_instruction.eq(~issue[Opcode.READ_COUNTERS] &
                                                  ~issue[Opcode.CLEAR_COUNTERS])
                for o in Opcode:
                    with m.If(issue[o]):
                        opcode_actions(o)
            else:
                m.d.comb += self.o_instruction.eq(~is_[Opcode.READ_COUNTERS] &
                                                  ~is_[Opcode.CLEAR_COUNTERS])
                with m.Switch(op):
                    for o in Opcode:
                        with m.Case(o):
                            opcode_actions(o)

        def opcode_actions(o):
            if o == Opcode.READ_HOST:
                m.d.sync += [addr.eq(a), left.eq(count)]
                m.next = "HOST_ROWS"
            elif o == Opcode.LOAD_WEIGHTS:
                late = scale_late               # in tiles now, rows in WEIGHT_SCALE
                m.d.sync += [
                    addr.eq(a if late else times_constant(a, rows)),
                    left.eq(count if late else times_constant(count, rows)),
                    signed_.eq(lw.signed), written.eq(written | checks.o_tile_mask),
                ]
                m.next = "WEIGHT_SCALE" if late else "WEIGHT_ROWS"
            elif o == Opcode.LOAD_PARAMS:
                m.d.comb += [
                    self.o_param_write.valid.eq(1),
                    self.o_param_write.payload.slot.eq(lp.slot),
                    self.o_param_write.payload.kind.eq(ParamKind.SCALARS),
                ]
                m.d.sync += slot.eq(lp.slot)
                m.next = "PARAM_BIAS"
            elif o == Opcode.READ_COUNTERS:
                m.d.sync += [counter.eq(0), counter_held.eq(0)]
                m.next = "SEND_COUNTERS"
            elif o == Opcode.CLEAR_COUNTERS:
                m.d.comb += self.o_clear_counters.eq(1)
            elif o == Opcode.HALT:
                if beat_in_register:    # the DONE beat counts the HALT (index + 1)
                    m.d.sync += beat_word.eq(done_beat(index + 1))
                m.next = "SEND_DONE"
            elif o == Opcode.READ_WEIGHTS:
                m.d.sync += queued.eq(queued + count)
            elif o == Opcode.MATMUL:
                with m.If(mm.switch):
                    m.d.sync += [queued.eq(queued - 1), have_active.eq(1)]

        with m.FSM(name="front_end"):
            with m.State("SCRUB"):
                m.d.comb += [scrubbing.eq(1), self.o_ub_write.valid.eq(1)]
                with m.If(self.o_ub_write.ready):
                    m.d.sync += scrub_addr.eq(scrub_addr + 1)
                    with m.If(scrub_addr == cfg.ub_depth - 1):
                        m.next = "SETTLE"
            with m.State("SETTLE"):      # the engines clear their own memories meanwhile
                with m.If(self.i_idle):
                    m.next = "FETCH"
            with m.State("FETCH"):
                m.d.comb += [fetching.eq(1), host_wait.eq(~self.i_host.valid)]
                if decided_ahead:
                    # dispatch and fail imply a valid beat that is not the resynchronisation
                    # word: tested first, they take the beat straight from their registers.
                    with m.If(dispatch):
                        issue_actions()
                    with m.Elif(fail):
                        fail_actions()
                    with m.Elif(resync_q):
                        resync_actions()
                    with m.Else():
                        m.d.comb += self.o_raw_stall.eq(settled & hazard)
                else:
                    with m.If(self.i_host.valid):
                        with m.If(resync):
                            resync_actions()
                        with m.Elif(fail):
                            fail_actions()
                        with m.Elif(dispatch):
                            issue_actions()
                        with m.Else():
                            m.d.comb += self.o_raw_stall.eq(settled & hazard)
            if scale_late:
                # LOAD_WEIGHTS's tile and count scaled to rows, from the registers (a multiply
                # by rows, from adders, straight from the host beat is a long path).
                with m.State("WEIGHT_SCALE"):
                    m.d.sync += [addr.eq(times_constant(addr, rows)),
                                 left.eq(times_constant(left, rows))]
                    m.next = "WEIGHT_ROWS"
            # Data beats of READ_HOST and LOAD_WEIGHTS, one row a beat.
            for state, rows_out in (("HOST_ROWS", self.o_ub_write),
                                    ("WEIGHT_ROWS", self.o_wm_write)):
                with m.State(state):
                    m.d.comb += [
                        host_wait.eq(~self.i_host.valid),
                        rows_out.valid.eq(self.i_host.valid),
                        self.i_host.ready.eq(rows_out.ready),
                    ]
                    with m.If(self.i_host.valid & rows_out.ready):
                        m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
                        with m.If(left == 1):
                            m.next = "FETCH"
            for state, kind, after in (("PARAM_BIAS", ParamKind.BIAS, "PARAM_MULT"),
                                       ("PARAM_MULT", ParamKind.MULTIPLIER, "FETCH")):
                with m.State(state):
                    m.d.comb += [
                        host_wait.eq(~self.i_host.valid),
                        self.o_param_write.valid.eq(self.i_host.valid),
                        self.o_param_write.payload.slot.eq(slot),
                        self.o_param_write.payload.kind.eq(kind),
                        self.i_host.ready.eq(self.o_param_write.ready),
                    ]
                    with m.If(self.i_host.valid & self.o_param_write.ready):
                        m.next = after
            with m.State("SEND_COUNTERS"):
                with m.If(counter_held):
                    m.d.comb += beat_out.valid.eq(1)
                    with m.If(beat_out.ready):
                        m.d.sync += [counter.eq(counter + 1), counter_held.eq(0)]
                        with m.If(counter == len(COUNTERS) - 1):
                            m.d.comb += self.o_instruction.eq(1)
                            m.next = "FETCH"
                with m.Elif(self.i_counter_valid):
                    m.d.sync += [beat_word.eq(self.i_counter_value), counter_held.eq(1)]
            with m.State("SEND_DONE"):
                m.d.comb += beat_out.valid.eq(1)
                if not beat_in_register:
                    m.d.comb += beat_out.payload.eq(done_beat(index))
                with m.If(beat_out.ready):
                    m.d.sync += [halted.eq(1), index.eq(0)]
                    m.next = "FETCH"
            # The error beat follows the output of every earlier instruction.
            with m.State("ERROR_BEAT"):
                with m.If(~self.i_write_host_busy):
                    m.d.comb += beat_out.valid.eq(1)
                    if not beat_in_register:
                        m.d.comb += beat_out.payload.eq(error_beat(status.code))
                    with m.If(beat_out.ready):
                        m.next = "ERROR"
            # Stopped: every beat is discarded until the resynchronisation word or i_clear.
            with m.State("ERROR"):
                if decided_ahead:
                    m.d.comb += self.i_host.ready.eq(stayed)
                    restart = self.i_clear | resync_q
                else:
                    m.d.comb += self.i_host.ready.eq(1)
                    restart = self.i_clear | (self.i_host.valid & resync)
                with m.If(restart):
                    m.d.sync += [status.error.eq(0), status.code.eq(ErrorCode.NONE),
                                 index.eq(0)]
                    m.next = "FETCH"
        m.d.comb += self.o_host_stall.eq(host_wait)
        return m
