"""The front end: fetch, decode, error checks, dispatch, host transfers and status."""

from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import ub_row_beat
from hdl.config import TPUConfig
from hdl.control.checks import Checks
from hdl.control.dispatch import Dispatch
from hdl.control.hazards import HazardQuerySignature
from hdl.control.host_transfers import INDEX_BITS, TRANSFER_OPCODES, HostTransfers
from hdl.control.param_store import param_write_layout
from hdl.isa import (
    COUNTER_BITS,
    COUNTERS,
    INSTR_BITS,
    RESYNC_WORD,
    Activate,
    ErrorCode,
    Instr,
    Matmul,
    Opcode,
    ReadWeights,
    Status,
    UbToWeights,
    WriteHost,
)
from hdl.layouts import weight_row_layout
from hdl.ports import MemWriteSignature, addr_bits

__all__ = ["FrontEnd"]

class FrontEnd(wiring.Component):
    """Takes the host's beats one instruction at a time, checks each before it has any
    effect, and either runs it (host transfers, which own the input stream: READ_HOST,
    LOAD_WEIGHTS, LOAD_PARAMS, LOAD_TABLE; READ_COUNTERS, CLEAR_COUNTERS, HALT, SYNC, NOP)
    or hands it to its engine on a dispatch stream (READ_WEIGHTS, MATMUL, ACTIVATE,
    WRITE_HOST; and UB_TO_WEIGHTS, which it waits for in its MOVE state: the next instruction
    is taken once the weight mover is done, so that nothing needs to wait on the mover's
    ranges).

    Contract:

    - an instruction issues (dispatch) when it passes every check, the hazard tracker
      reports no conflict, and its engine takes it (or, for SYNC, HALT, READ_COUNTERS and
      CLEAR_COUNTERS, every engine is idle; for LOAD_PARAMS and LOAD_TABLE, no ACTIVATE
      runs); until then
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

    Its parts: :class:`~hdl.control.checks.Checks` (the error checks),
    :class:`~hdl.control.dispatch.Dispatch` (when it issues, and every other decision of
    which cycle the front end acts in) and :class:`~hdl.control.host_transfers.HostTransfers`
    (the data beats of the host transfers, the beats to the host, the reset scrub).

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
    o_read_weights, o_matmul, o_activate, o_write_host, o_ub_to_weights : Out(stream)
        Dispatch to the engines: ``stream.Signature`` of the instruction word in its
        opcode's layout.
    i_ub_to_weights_busy : In(1)
        The weight mover still runs the UB_TO_WEIGHTS it took (low on a core built without
        it).
    o_ub_write : Out(MemWriteSignature(ub_bits, ub_row))
        READ_HOST rows into the unified buffer.
    o_wm_write : Out(MemWriteSignature(wm_bits, weight_row_layout))
        LOAD_WEIGHTS rows into the weight memory.
    o_param_write : Out(stream.Signature(param_write_layout))
        LOAD_PARAMS into the activation engine's parameter store, LOAD_TABLE's beats into its
        table.
    o_sum_table : Out(MemWriteSignature(9, signed(acc_width)))
        With :attr:`~hdl.config.TPUConfig.sum_tables`: LOAD_TABLE's sum-table entries into
        the accumulators' tables, one a cycle.
    i_idle : In(1)
        Every engine is idle.
    i_sums_busy : In(1)
        With :attr:`~hdl.config.TPUConfig.sum_tables`: the accumulators still zero the sum
        tables after a reset (MATMUL_LOOKUP and a sum table's LOAD_TABLE wait).
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
            "o_ub_to_weights":   Out(stream.Signature(UbToWeights)),
            "i_ub_to_weights_busy": In(1),
            "o_ub_write":        Out(MemWriteSignature(self.ub_bits, ub_row)),
            "o_wm_write":        Out(MemWriteSignature(
                self.wm_bits, weight_row_layout(cfg.cols, cfg.data_width))),
            "o_param_write":     Out(stream.Signature(param_write_layout(cfg.cols,
                                                                         cfg.param_slots))),
            **({"o_sum_table":   Out(MemWriteSignature(9, signed(cfg.acc_width)))}
               if cfg.sum_tables else {}),
            "i_idle":            In(1),
            "i_activate_busy":   In(1),
            **({"i_sums_busy":   In(1)} if cfg.sum_tables else {}),
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
        m = Module()

        # Decode-level state (changes only as instructions issue).
        written = Signal(cfg.weight_mem_tiles)     # tiles LOAD_WEIGHTS has written
        queued = Signal(range(cfg.weight_fifo_depth + 2))  # tiles read, not switched in
        have_active = Signal()                     # a tile has been switched in
        index = Signal(INDEX_BITS)                 # instruction index in the program
        halted = Signal()
        status = self.o_status
        m.d.comb += [status.halted.eq(halted), status.instr_index.eq(index)]

        # Decode.
        word = self.i_host.payload[:INSTR_BITS]
        instr = data.View(Instr, word)
        op = instr.opcode
        mm = data.View(Matmul, word)
        # (A core without UB_TO_WEIGHTS or LOAD_TABLE decodes nothing of them.)
        opcodes = cfg.opcodes
        is_ = {o: Signal(name=f"is_{o.name.lower()}") for o in opcodes}
        for o in opcodes:
            m.d.comb += is_[o].eq(op == o)
        resync = Signal()       # the beat at the front end is the resynchronisation word
        m.d.comb += resync.eq(word == RESYNC_WORD)
        fetching = Signal()

        # The checks, and the hazard tracker's query with their range ends.
        m.submodules.checks = checks = Checks(cfg)
        m.d.comb += [checks.i_word.eq(word), checks.i_written.eq(written),
                     checks.i_queued.eq(queued), checks.i_have_active.eq(have_active),
                     self.o_hazards.a_end.eq(checks.o_a_end),
                     self.o_hazards.b_end.eq(checks.o_b_end)]

        # The tile a UB_TO_WEIGHTS writes, one-hot (a decode of its field: a mask shared with
        # LOAD_WEIGHTS' range, selected by the opcode, ran too long into `written` at the
        # ULX3S's clock).
        moved_tile = Signal(cfg.weight_mem_tiles)
        if cfg.ub_to_weights:
            tile_bits = cfg.weight_mem_tiles.bit_length()
            m.d.comb += moved_tile.eq((Const(1, cfg.weight_mem_tiles) << instr.b[:tile_bits])
                                      [:cfg.weight_mem_tiles])

        # Dispatch: whether the instruction at fetch issues or fails now, and in which cycle
        # the front end acts on what it sees (see Dispatch).
        m.submodules.dispatch = decide = Dispatch(cfg)
        engines = {Opcode.READ_WEIGHTS: self.o_read_weights, Opcode.MATMUL: self.o_matmul,
                   Opcode.ACTIVATE: self.o_activate, Opcode.WRITE_HOST: self.o_write_host,
                   Opcode.UB_TO_WEIGHTS: self.o_ub_to_weights}
        engines = {o: engines[o] for o in decide.engine_opcodes}
        m.d.comb += [
            decide.i_valid.eq(self.i_host.valid),
            decide.i_waiting.eq(fetching & self.i_host.valid),
            decide.i_taken.eq(self.i_host.ready),
            decide.i_resync.eq(resync),
            decide.i_word.eq(word),
            decide.i_opcode.eq(op),
            decide.i_error.eq(checks.o_error),
            decide.i_failed.eq(checks.o_failed),
            decide.i_hazard.eq(self.o_hazards.hazard),
            decide.i_hazard_late.eq(self.o_hazards.hazard_late),
            decide.i_engine_ready.eq(Cat(*(port.ready for port in engines.values()))),
            decide.i_activate_busy.eq(self.i_activate_busy),
            decide.i_idle.eq(self.i_idle),
            *([decide.i_sums_busy.eq(self.i_sums_busy)] if cfg.sum_tables else []),
            self.o_hazards.instr.eq(decide.o_query),
        ]
        dispatch = Signal()     # the instruction issues (as the front end takes it)
        fail = Signal()         # the instruction fails a check (as the front end takes it)
        issue = {o: Signal(name=f"issue_{o.name.lower()}") for o in opcodes}
        m.d.comb += [dispatch.eq(decide.o_dispatch), fail.eq(decide.o_fail),
                     self.o_hazards.dispatch.eq(dispatch)]
        for o in opcodes:
            m.d.comb += issue[o].eq(decide.o_issue[o.value])
        for o, port in engines.items():
            m.d.comb += [port.valid.eq(issue[o]), port.payload.eq(word)]
        # MATMUL_LOOKUP goes to the matrix engine as the word it is (the engine tells the
        # two apart by the opcode).
        switches = issue[Opcode.MATMUL] & mm.switch
        if cfg.sum_tables:
            m.d.comb += self.o_matmul.valid.eq(issue[Opcode.MATMUL] |
                                               issue[Opcode.MATMUL_LOOKUP])
            switches = (issue[Opcode.MATMUL] | issue[Opcode.MATMUL_LOOKUP]) & mm.switch
        # For waveforms only (nothing reads it): the opcode of the instruction waiting at
        # i_host, NOP while data beats stream or no beat waits (`o_hazards.instr` decodes every
        # beat, data too).
        fetch_opcode = Signal(Opcode)
        with m.If(fetching & self.i_host.valid):
            m.d.comb += fetch_opcode.eq(op)

        # Host transfers, the beats to the host and the reset scrub.
        m.submodules.transfers = xfer = HostTransfers(cfg)
        for port in ("o_ub_write", "o_wm_write", "o_param_write", "o_beat",
                     *(("o_sum_table",) if cfg.sum_tables else ())):
            wiring.connect(m, wiring.flipped(getattr(self, port)), getattr(xfer, port))
        m.d.comb += [
            xfer.i_host.payload.eq(self.i_host.payload),
            xfer.i_host.valid.eq(self.i_host.valid),
            xfer.i_fail_code.eq(decide.o_error),
            xfer.i_code.eq(status.code),
            xfer.i_index.eq(index),
            xfer.i_write_host_busy.eq(self.i_write_host_busy),
            self.o_counter_select.eq(xfer.o_counter_select),
            xfer.i_counter_valid.eq(self.i_counter_valid),
            xfer.i_counter_value.eq(self.i_counter_value),
            self.o_host_work.eq(xfer.o_host_work),
            self.o_clear_counters.eq(issue[Opcode.CLEAR_COUNTERS]),
            self.o_instruction.eq((dispatch & ~issue[Opcode.READ_COUNTERS] &
                                   ~issue[Opcode.CLEAR_COUNTERS]) | xfer.o_counters_sent),
        ]
        host_ready = Signal()   # the front end's own (the transfers' while they run)
        m.d.comb += self.i_host.ready.eq(host_ready | xfer.i_host.ready)

        with m.FSM(name="front_end"):
            with m.State("SETTLE"):     # the scrub; the engines clear their own memories
                with m.If(xfer.o_idle & self.i_idle):
                    m.next = "FETCH"
            with m.State("FETCH"):
                m.d.comb += [fetching.eq(1), self.o_host_stall.eq(~self.i_host.valid)]
                with m.If(decide.o_resync):     # restart the program; not an instruction
                    m.d.comb += host_ready.eq(1)
                    m.d.sync += [halted.eq(0), index.eq(0)]
                with m.Elif(fail):
                    m.d.comb += [host_ready.eq(1), xfer.i_fail.eq(1)]
                    m.d.sync += [status.error.eq(1), status.code.eq(decide.o_error),
                                 halted.eq(0)]
                    m.next = "ERROR_BEAT"
                with m.Elif(dispatch):
                    m.d.comb += [host_ready.eq(1), xfer.i_issue.eq(decide.o_issue)]
                    m.d.sync += [halted.eq(0), index.eq(index + 1)]
                    with m.If(issue[Opcode.LOAD_WEIGHTS]):
                        m.d.sync += written.eq(written | checks.o_tile_mask)
                    if cfg.ub_to_weights:       # (else its opcode is unknown)
                        with m.If(issue[Opcode.UB_TO_WEIGHTS]):
                            m.d.sync += written.eq(written | moved_tile)
                            m.next = "MOVE"
                    with m.If(issue[Opcode.READ_WEIGHTS]):
                        m.d.sync += queued.eq(queued + instr.count)
                    with m.If(switches):
                        m.d.sync += [queued.eq(queued - 1), have_active.eq(1)]
                    with m.If(Cat(*(issue[o] for o in TRANSFER_OPCODES
                                    if o in opcodes)).any()):
                        m.next = "TRANSFER"
                with m.Else():
                    m.d.comb += self.o_raw_stall.eq(decide.o_raw_stall)
            with m.State("TRANSFER"):
                m.d.comb += self.o_host_stall.eq(xfer.o_host_wait)
                with m.If(xfer.o_halted):
                    m.d.sync += [halted.eq(1), index.eq(0)]
                with m.If(xfer.o_done):
                    m.next = "FETCH"
            # UB_TO_WEIGHTS runs to its end (the mover is busy from the next cycle on).
            if cfg.ub_to_weights:
                with m.State("MOVE"):
                    with m.If(~self.i_ub_to_weights_busy):
                        m.next = "FETCH"
            # The error beat follows the output of every earlier instruction.
            with m.State("ERROR_BEAT"):
                with m.If(xfer.o_done):
                    m.next = "ERROR"
            # Stopped: every beat is discarded until the resynchronisation word or i_clear.
            with m.State("ERROR"):
                m.d.comb += host_ready.eq(decide.o_take_stopped)
                with m.If(self.i_clear | decide.o_resync):
                    m.d.sync += [status.error.eq(0), status.code.eq(ErrorCode.NONE),
                                 index.eq(0)]
                    m.next = "FETCH"
        return m
