"""The front end's transfers: data beats into the memories, beats to the host, the reset scrub."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
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
from hdl.control.param_store import ParamKind, param_write_layout
from hdl.isa import (
    COUNTER_BITS,
    COUNTERS,
    INSTR_BITS,
    ErrorCode,
    Instr,
    LoadParams,
    LoadTable,
    LoadWeights,
    Opcode,
    Status,
    TableTarget,
    table_beats,
)
from hdl.layouts import weight_row_layout
from hdl.lib.arith import times_constant
from hdl.ports import MemWriteSignature, addr_bits

__all__ = ["HostTransfers", "TRANSFER_OPCODES", "INDEX_BITS"]

#: The opcodes whose work is a transfer here (the front end waits in TRANSFER meanwhile).
TRANSFER_OPCODES = (Opcode.READ_HOST, Opcode.LOAD_WEIGHTS, Opcode.LOAD_PARAMS,
                    Opcode.READ_COUNTERS, Opcode.HALT, Opcode.LOAD_TABLE)

#: Width of the program's instruction index (:class:`~hdl.isa.Status`).
INDEX_BITS = data.Layout.cast(Status)["instr_index"].width


class HostTransfers(wiring.Component):
    """What the front end does once it has issued a host transfer or failed a check, and
    after a reset:

    - READ_HOST and LOAD_WEIGHTS: the data beats that follow, a row each, into the unified
      buffer and the weight memory (LOAD_WEIGHTS scales its tile and count to rows; with
      :attr:`~hdl.config.TPUConfig.scale_tiles_late` in a cycle of its own);
    - LOAD_PARAMS: its scalars in the cycle it issues, then the bias and multiplier beats
      and, with ``column_shifts``, the shift row's;
    - LOAD_TABLE (with :attr:`~hdl.config.TPUConfig.lookup_table`): its
      :func:`~hdl.isa.table_beats` beats of entries, to the activation engine's table
      writer, which takes each as it has written its entries; of a sum table (with
      :attr:`~hdl.config.TPUConfig.sum_tables`), its :func:`~hdl.isa.sum_table_beats`
      beats, each beat's ``cols`` entries one a cycle on ``o_sum_table``;
    - READ_COUNTERS: a beat per counter, each sampled when the counter bank shows it;
    - HALT: the DONE beat; a failed check: the error beat, once no WRITE_HOST runs;
    - after a reset: zeros into every unified-buffer row (``o_scrubbing``).

    It starts in the cycle ``i_issue`` (one-hot by opcode) or ``i_fail`` is high and signals
    ``o_done`` in the cycle its last beat is taken, so the front end fetches again in the
    next cycle, as if the transfer were a state of its own.

    Members
    -------
    i_host : In(stream.Signature(unsigned(host_width)))
        The host's beats: the instruction word in the cycle it issues, then the data beats
        (``ready`` only while a transfer takes them).
    i_issue : In(2 ** opcode width)
        The instruction at fetch issues this cycle, one-hot by opcode.
    i_fail : In(1)
        The instruction at fetch fails a check this cycle (with ``i_fail_code``).
    i_fail_code, i_code : In(ErrorCode)
        The failing check's code as it fails, and the status's code after.
    i_index : In(INDEX_BITS)
        The program's instruction index (the DONE and error beats carry it).
    i_write_host_busy : In(1)
    o_ub_write, o_wm_write, o_param_write, o_beat, o_counter_select,
    i_counter_valid, i_counter_value
        As the front end's (:class:`~hdl.control.front_end.FrontEnd`).
    o_idle : Out(1)
        No transfer runs and the scrub is over.
    o_done : Out(1)
        The transfer's last beat is taken this cycle.
    o_halted, o_counters_sent : Out(1)
        ``o_done`` of the DONE beat; of the last counter beat.
    o_host_wait : Out(1)
        A transfer waits for a beat from the host.
    o_host_work : Out(1)
        A transfer moves a beat: a data row (READ_HOST, LOAD_WEIGHTS, LOAD_PARAMS's bias and
        multiplier rows, LOAD_TABLE's entries; not the instruction beat) or a beat to the
        host (each cycle a row is offered, so a LOAD_TABLE beat counts ``4 * cols``).
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        self.ub_bits = addr_bits(cfg.ub_depth)
        self.wm_bits = addr_bits(cfg.weight_mem_tiles * cfg.rows)
        host = stream.Signature(unsigned(cfg.host_width))
        super().__init__({
            "i_host":            In(host),
            "i_issue":           In(1 << Opcode.as_shape().width),
            "i_fail":            In(1),
            "i_fail_code":       In(ErrorCode),
            "i_code":            In(ErrorCode),
            "i_index":           In(INDEX_BITS),
            "i_write_host_busy": In(1),
            "o_ub_write":        Out(MemWriteSignature(self.ub_bits, ub_row_beat(cfg.ub_row))),
            "o_wm_write":        Out(MemWriteSignature(
                self.wm_bits, weight_row_layout(cfg.cols, cfg.data_width))),
            "o_param_write":     Out(stream.Signature(param_write_layout(cfg.cols,
                                                                         cfg.param_slots))),
            "o_beat":            Out(host),
            **({"o_sum_table":   Out(MemWriteSignature(9, signed(cfg.acc_width)))}
               if cfg.sum_tables else {}),
            "o_counter_select":  Out(range(len(COUNTERS))),
            "i_counter_valid":   In(1),
            "i_counter_value":   In(COUNTER_BITS),
            "o_idle":            Out(1),
            "o_done":            Out(1),
            "o_halted":          Out(1),
            "o_counters_sent":   Out(1),
            "o_host_wait":       Out(1),
            "o_host_work":       Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        rows = cfg.rows
        m = Module()

        beat = self.i_host.payload
        word = beat[:INSTR_BITS]
        instr = data.View(Instr, word)
        lw = data.View(LoadWeights, word)
        lp = data.View(LoadParams, word)
        a, count = instr.a, instr.count
        issue = {o: self.i_issue[o.value] for o in Opcode}

        def row_beat(layout):       # a data beat, in the low bits of the beat
            return data.View(layout, beat[:data.Layout.cast(layout).size])

        addr = Signal(max(self.ub_bits, self.wm_bits))   # a row, or tile * rows + row
        left = Signal(range((1 << instr.count.shape().width) * rows + 1))
        signed_ = Signal()
        slot = Signal.like(self.o_param_write.payload.slot)
        shifts_follow = Signal()    # LOAD_PARAMS's third beat, the shift row, follows
        counter = Signal(range(len(COUNTERS)))
        # A counter beat's payload is held in a register: the counters keep counting while
        # the host stalls, and a stream's payload must not change before the transfer. It is
        # sampled when the counter bank shows the counter, then offered. With the fast
        # pipeline the DONE and error beats are loaded into it too, as their states are
        # entered, so that the beat is a register and no state decode runs into its bits.
        beat_in_register = cfg.pipeline == "fast"
        beat_word = Signal(64 if beat_in_register else COUNTER_BITS)
        counter_held = Signal()
        scrubbing = Signal()
        param_rows = Signal()       # LOAD_PARAMS's (or LOAD_TABLE's) row is offered
        first = Signal()            # LOAD_TABLE's first beat is offered
        scrub_addr = Signal(range(cfg.ub_depth))
        beat_out = self.o_beat

        def done_beat(count):
            return Cat(count[:INDEX_BITS], Const(0, 32 - INDEX_BITS), Const(DONE_MAGIC, 32))

        def error_beat(code):
            return (data.Layout.cast(ErrorBeat).const({"magic": ERROR_MAGIC}).as_value() |
                    Cat(self.i_index, code.as_value()))

        m.d.comb += [
            self.o_ub_write.payload.addr.eq(Mux(scrubbing, scrub_addr, addr)),
            self.o_ub_write.payload.data.eq(Mux(scrubbing, 0,
                                                row_beat(ub_row_beat(cfg.ub_row)).as_value())),
            self.o_wm_write.payload.addr.eq(addr),
            self.o_wm_write.payload.data.data.eq(row_beat(weight_row_beat(cfg.cols))),
            self.o_wm_write.payload.data.signed.eq(signed_),
            self.o_param_write.payload.row.eq(row_beat(param_row_beat(cfg.cols))),
            self.o_param_write.payload.shift.eq(lp.shift),
            self.o_param_write.payload.rounding.eq(lp.rounding),
            self.o_param_write.payload.column_shifts.eq(lp.column_shifts),
            self.o_param_write.payload.zero_point.eq(lp.zero_point.as_signed()),
            self.o_param_write.payload.clamp_hi.eq(lp.clamp_hi.as_signed()),
            self.o_counter_select.eq(counter),
            beat_out.payload.eq(beat_word),
            self.o_host_work.eq(self.o_ub_write.valid | self.o_wm_write.valid | param_rows |
                                beat_out.valid),
        ]
        if cfg.sum_tables:
            m.d.comb += self.o_host_work.eq(self.o_ub_write.valid | self.o_wm_write.valid |
                                            param_rows | beat_out.valid |
                                            self.o_sum_table.valid)
            # A sum-table beat's entries, one a cycle: `sum_addr` is the table and the entry,
            # `lane` the entry's column in the beat.
            sum_addr = Signal(9)
            lane = Signal(range(cfg.cols))
            last_entry = sum_addr[:8] == 255
            beat_taken = (lane == cfg.cols - 1) | last_entry
            m.d.comb += [
                self.o_sum_table.payload.addr.eq(sum_addr),
                self.o_sum_table.payload.data.eq(beat.word_select(lane, cfg.acc_width)),
            ]

        with m.FSM(name="transfers"):
            with m.State("SCRUB"):
                m.d.comb += [scrubbing.eq(1), self.o_ub_write.valid.eq(1)]
                with m.If(self.o_ub_write.ready):
                    m.d.sync += scrub_addr.eq(scrub_addr + 1)
                    with m.If(scrub_addr == cfg.ub_depth - 1):
                        m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += self.o_idle.eq(1)
                with m.If(issue[Opcode.READ_HOST]):
                    m.d.sync += [addr.eq(a), left.eq(count)]
                    m.next = "HOST_ROWS"
                with m.If(issue[Opcode.LOAD_WEIGHTS]):
                    late = cfg.scale_tiles_late     # in tiles now, rows in WEIGHT_SCALE
                    m.d.sync += [
                        addr.eq(a if late else times_constant(a, rows)),
                        left.eq(count if late else times_constant(count, rows)),
                        signed_.eq(lw.signed),
                    ]
                    m.next = "WEIGHT_SCALE" if late else "WEIGHT_ROWS"
                with m.If(issue[Opcode.LOAD_PARAMS]):
                    m.d.comb += [
                        self.o_param_write.valid.eq(1),
                        self.o_param_write.payload.slot.eq(lp.slot),
                        self.o_param_write.payload.kind.eq(ParamKind.SCALARS),
                    ]
                    m.d.sync += [slot.eq(lp.slot), shifts_follow.eq(lp.column_shifts)]
                    m.next = "PARAM_BIAS"
                if cfg.lookup_table:
                    target = data.View(LoadTable, word).target
                    with m.If(issue[Opcode.LOAD_TABLE]):
                        m.d.sync += [left.eq(table_beats(cfg.cols)), first.eq(1)]
                        m.next = "TABLE_ROWS"
                        if cfg.sum_tables:
                            with m.If(target != TableTarget.ACTIVATION):
                                m.d.sync += [sum_addr.eq(Cat(Const(0, 8),
                                                             target == TableTarget.SUM1)),
                                             lane.eq(0)]
                                m.next = "SUM_TABLE_ROWS"
                with m.If(issue[Opcode.READ_COUNTERS]):
                    m.d.sync += [counter.eq(0), counter_held.eq(0)]
                    m.next = "SEND_COUNTERS"
                with m.If(issue[Opcode.HALT]):
                    if beat_in_register:    # the DONE beat counts the HALT (index + 1)
                        m.d.sync += beat_word.eq(done_beat(self.i_index + 1))
                    m.next = "SEND_DONE"
                with m.If(self.i_fail):
                    if beat_in_register:
                        m.d.sync += beat_word.eq(error_beat(self.i_fail_code))
                    m.next = "ERROR_BEAT"
            if cfg.scale_tiles_late:
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
                        self.o_host_wait.eq(~self.i_host.valid),
                        rows_out.valid.eq(self.i_host.valid),
                        self.i_host.ready.eq(rows_out.ready),
                    ]
                    with m.If(self.i_host.valid & rows_out.ready):
                        m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
                        with m.If(left == 1):
                            m.d.comb += self.o_done.eq(1)
                            m.next = "IDLE"
            for state, kind, after in (("PARAM_BIAS", ParamKind.BIAS, "PARAM_MULT"),
                                       ("PARAM_MULT", ParamKind.MULTIPLIER, None),
                                       ("PARAM_SHIFTS", ParamKind.SHIFTS, "IDLE")):
                with m.State(state):
                    m.d.comb += [
                        self.o_host_wait.eq(~self.i_host.valid),
                        self.o_param_write.valid.eq(self.i_host.valid),
                        param_rows.eq(self.i_host.valid),
                        self.o_param_write.payload.slot.eq(slot),
                        self.o_param_write.payload.kind.eq(kind),
                        self.i_host.ready.eq(self.o_param_write.ready),
                    ]
                    with m.If(self.i_host.valid & self.o_param_write.ready):
                        if after is None:       # the multiplier row: the shifts may follow
                            with m.If(shifts_follow):
                                m.next = "PARAM_SHIFTS"
                            with m.Else():
                                m.d.comb += self.o_done.eq(1)
                                m.next = "IDLE"
                        else:
                            m.d.comb += self.o_done.eq(after == "IDLE")
                            m.next = after
            if cfg.lookup_table:
                with m.State("TABLE_ROWS"):
                    m.d.comb += [
                        self.o_host_wait.eq(~self.i_host.valid),
                        self.o_param_write.valid.eq(self.i_host.valid),
                        param_rows.eq(self.i_host.valid),
                        self.o_param_write.payload.table.eq(1),
                        self.o_param_write.payload.first.eq(first),
                        self.i_host.ready.eq(self.o_param_write.ready),
                    ]
                    with m.If(self.i_host.valid & self.o_param_write.ready):
                        m.d.sync += [left.eq(left - 1), first.eq(0)]
                        with m.If(left == 1):
                            m.d.comb += self.o_done.eq(1)
                            m.next = "IDLE"
            if cfg.sum_tables:
                with m.State("SUM_TABLE_ROWS"):
                    m.d.comb += [
                        self.o_host_wait.eq(~self.i_host.valid),
                        self.o_sum_table.valid.eq(self.i_host.valid),
                        self.i_host.ready.eq(beat_taken & self.o_sum_table.ready),
                    ]
                    with m.If(self.i_host.valid & self.o_sum_table.ready):
                        m.d.sync += [sum_addr.eq(sum_addr + 1),
                                     lane.eq(Mux(beat_taken, 0, lane + 1))]
                        with m.If(last_entry):
                            m.d.comb += self.o_done.eq(1)
                            m.next = "IDLE"
            with m.State("SEND_COUNTERS"):
                with m.If(counter_held):
                    m.d.comb += beat_out.valid.eq(1)
                    with m.If(beat_out.ready):
                        m.d.sync += [counter.eq(counter + 1), counter_held.eq(0)]
                        with m.If(counter == len(COUNTERS) - 1):
                            m.d.comb += [self.o_done.eq(1), self.o_counters_sent.eq(1)]
                            m.next = "IDLE"
                with m.Elif(self.i_counter_valid):
                    m.d.sync += [beat_word.eq(self.i_counter_value), counter_held.eq(1)]
            with m.State("SEND_DONE"):
                m.d.comb += beat_out.valid.eq(1)
                if not beat_in_register:
                    m.d.comb += beat_out.payload.eq(done_beat(self.i_index))
                with m.If(beat_out.ready):
                    m.d.comb += [self.o_done.eq(1), self.o_halted.eq(1)]
                    m.next = "IDLE"
            # The error beat follows the output of every earlier instruction.
            with m.State("ERROR_BEAT"):
                with m.If(~self.i_write_host_busy):
                    m.d.comb += beat_out.valid.eq(1)
                    if not beat_in_register:
                        m.d.comb += beat_out.payload.eq(error_beat(self.i_code))
                    with m.If(beat_out.ready):
                        m.d.comb += self.o_done.eq(1)
                        m.next = "IDLE"
        return m
