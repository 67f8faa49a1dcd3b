"""The matrix engine: MATMUL, unified buffer -> systolic array -> accumulators."""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import ub_row_beat
from hdl.config import TPUConfig
from hdl.isa import Matmul, Opcode
from hdl.layouts import act_row_layout, psum_row_layout, psum_write_layout
from hdl.memory.block_fifo import BlockFIFO
from hdl.ports import MemReadSignature, addr_bits

__all__ = ["MatrixEngine"]


class MatrixEngine(wiring.Component):
    """Runs MATMULs behind later instructions, up to ``config.matmul_slots`` in flight, rows
    back to back.

    Contract: takes a MATMUL on ``i_matmul`` while a slot is free and the previous MATMUL's last
    row is being (or has been) issued, so rows of consecutive MATMULs enter the array with no
    gap (with ``dispatch`` "registered" or "ahead", once it has been issued: then ``ready``,
    once high, stays high until it takes one); reads buffer rows ``ub_addr..`` in order, one a
    cycle, and sends each with its instruction's ``switch`` (first row only) and ``signed``
    flags to the array (with ``acc_gap``, a row that accumulates into the accumulator row of
    the row sent in the cycle before waits a cycle: see
    :class:`~hdl.datapath.accumulators.Accumulators`' ``bypass``); writes each output row to
    accumulator row ``acc_addr + i`` (added if ``accumulate``), in order; pulses ``o_retire``
    in the cycle after the last row of the oldest MATMUL has been written
    (``i_acc_written``). After a reset it first writes zeros to every accumulator row
    (``o_idle`` low meanwhile); ``o_idle`` falls only as it takes a MATMUL.
    A MATMUL_LOOKUP (with :attr:`~hdl.config.TPUConfig.sum_tables`, taken on ``i_matmul`` as
    the word it is: its ``table`` bit is MATMUL's ``window``) runs as a MATMUL without the
    window, its rows marked ``lookup`` with their ``table`` for the accumulators.
    ``o_array_active`` is high in each cycle a row enters the array. ``count`` is at most the
    rows of the smaller memory (the front end's range checks), or with the window mode the
    accumulators' (windows may read one buffer row again and again): the engine keeps counts
    that wide.

    Members
    -------
    i_matmul : In(stream.Signature(Matmul))
        Instructions from the front end.
    o_ub : Out(MemReadSignature(ub_bits, ub_row))
        Unified-buffer read client.
    o_act : Out(stream.Signature(act_row_layout))
        Activation rows into the matrix unit.
    i_psum : In(stream.Signature(psum_row_layout))
        Output rows from the matrix unit.
    o_acc : Out(stream.Signature(psum_write_layout))
        Accumulator writes.
    i_acc_written : In(1)
        The accumulators wrote a row (one pulse per row, in order).
    o_retire, o_idle, o_array_active : Out(1)
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        #: Rows are spaced for accumulators without a read-during-write bypass.
        # The accumulators add back-to-back rows to one address only when registered.
        self.acc_gap = cfg.pipeline != "fast"
        self.ub_bits = addr_bits(cfg.ub_depth)
        self.acc_bits = addr_bits(cfg.acc_depth)
        ub_row = ub_row_beat(cfg.ub_row)
        super().__init__({
            "i_matmul":       In(stream.Signature(Matmul)),
            "o_ub":           Out(MemReadSignature(self.ub_bits, ub_row)),
            "o_act":          Out(stream.Signature(act_row_layout(cfg.rows, cfg.data_width))),
            "i_psum":         In(stream.Signature(psum_row_layout(cfg.cols, cfg.acc_width))),
            "o_acc":          Out(stream.Signature(psum_write_layout(
                self.acc_bits, cfg.cols, cfg.acc_width, cfg.sum_tables))),
            "i_acc_written":  In(1),
            "o_retire":       Out(1),
            "o_idle":         Out(1),
            "o_array_active": Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        cmd = self.i_matmul
        slots = cfg.matmul_slots

        # After reset: zero every accumulator row, one a cycle as the accumulators take them.
        scrubbing = Signal(init=1)
        scrub_addr = Signal(range(cfg.acc_depth))
        with m.If(scrubbing & self.o_acc.ready):
            m.d.sync += scrub_addr.eq(scrub_addr + 1)
            with m.If(scrub_addr == cfg.acc_depth - 1):
                m.d.sync += scrubbing.eq(0)

        busy = Signal()             # still issuing rows of the newest MATMUL
        ub_next = Signal(self.ub_bits)      # the next buffer row to read
        acc_next = Signal(self.acc_bits)
        # count is at most the smaller memory's rows (the front end's range checks); with the
        # window mode, the accumulators' (windows may read one buffer row again and again).
        count_range = range((cfg.acc_depth if cfg.conv_windows
                             else min(cfg.ub_depth, cfg.acc_depth)) + 1)
        left = Signal(count_range)
        switch = Signal()
        signed_ = Signal()
        accumulate = Signal()
        lookup = Signal()       # MATMUL_LOOKUP, with its `table`
        table = Signal()
        head = Signal(range(slots))
        tail = Signal(range(slots))
        in_flight = [Signal(name=f"slot{i}_valid") for i in range(slots)]
        pending = [Signal(count_range, name=f"slot{i}_pending") for i in range(slots)]
        # pending[i] == 1, kept in a register where the memories are pipelined (for fast
        # clocks), so that no compare runs through the retire into the hazard tracker's slots.
        last_one = [Signal(name=f"slot{i}_last") for i in range(slots)]

        # gap (acc_gap only): the row accumulates into the accumulator row of the row issued
        # before it.
        windows = cfg.conv_windows
        # With the window mode an entry is a token: a buffer row read (`read`), a row for
        # the array (`emit`, its window `offset` elements into the last two rows read and
        # the one arriving), or both; without it every entry is both.
        tables = {"lookup": 1, "table": 1} if cfg.sum_tables else {}
        meta_a_layout = data.StructLayout({"switch": 1, "signed": 1, "accumulate": 1, **tables,
                                           **({"gap": 1} if self.acc_gap else {}),
                                           **({"read": 1, "emit": 1,
                                               "offset": range(cfg.ub_row)} if windows else {}),
                                           "acc": unsigned(self.acc_bits)})
        meta_b_layout = data.StructLayout({"accumulate": 1, **tables,
                                           "acc": unsigned(self.acc_bits)})
        # A row's metadata must be readable when the row arrives, or the read port would
        # idle every other cycle: the cycle after its UB read was issued (unbuffered), or
        # with pipelined memories two cycles after, when a buffered FIFO's registered
        # output has it (its read then starts at a flip-flop, not at a LUT RAM, on the fast
        # build's path from here through the tile switch into the weight FIFO).
        meta_fifo = fifo.SyncFIFOBuffered if cfg.pipeline == "fast" else fifo.SyncFIFO
        m.submodules.meta_a = meta_a = meta_fifo(width=meta_a_layout.size, depth=4)
        m.submodules.meta_b = meta_b = BlockFIFO(
            width=meta_b_layout.size, depth=cfg.array_latency + 2)
        meta_a_in = data.View(meta_a_layout, meta_a.w_data)
        meta_a_out = data.View(meta_a_layout, meta_a.r_data)
        meta_b_in = data.View(meta_b_layout, meta_b.w_data)
        meta_b_out = data.View(meta_b_layout, meta_b.r_data)

        # Issue buffer reads.
        ub = self.o_ub
        m.d.comb += [
            ub.addr.payload.eq(ub_next),
            meta_a_in.switch.eq(switch),
            meta_a_in.signed.eq(signed_),
            meta_a_in.accumulate.eq(accumulate),
            meta_a_in.acc.eq(acc_next),
        ]
        if cfg.sum_tables:
            m.d.comb += [meta_a_in.lookup.eq(lookup), meta_a_in.table.eq(table)]
        if windows:
            # The window's first element: lane `lane` of row `win_row` (a plain MATMUL: lane
            # 0, step ub_row). Its last element is in row `win_end`; each token reads the
            # next row while the window needs it, and emits the window with the read of
            # `win_end` or, when that row was read already, alone.
            lg = cfg.ub_row.bit_length() - 1
            win_row = Signal(self.ub_bits)
            lane = Signal(range(cfg.ub_row))
            step = Signal(range(17))        # at most 15, or ub_row (at most 16)
            spans = Signal()        # the window runs into the next row
            win_end = Signal(self.ub_bits)
            need_read = Signal()
            emit = Signal()
            m.d.comb += [
                spans.eq(lane + (cfg.rows - 1) >= cfg.ub_row),
                win_end.eq(win_row + spans),
                # (win_end + 1 cut to the address's width: after the buffer's last row the
                # next row to read wraps to 0, and so must the row after the window's end.)
                need_read.eq(ub_next != (win_end + 1)[:self.ub_bits]),
                emit.eq(~need_read | (ub_next == win_end)),
                ub.addr.valid.eq(busy & meta_a.w_rdy & need_read),
                meta_a.w_en.eq(busy & meta_a.w_rdy & (~need_read | ub.addr.ready)),
                meta_a_in.read.eq(need_read),
                meta_a_in.emit.eq(emit),
                # Its place in [row win_end - 1, row win_end] (lane, or lane + ub_row when
                # it does not span), less the first place a window can start (ub_row - rows
                # + 1), where the shifter's input begins: modulo ub_row, which the field's
                # width takes, both are lane - (ub_row - rows + 1).
                meta_a_in.offset.eq(lane - (cfg.ub_row - cfg.rows + 1)),
            ]
            emitted = meta_a.w_en & emit
        else:
            m.d.comb += [
                ub.addr.valid.eq(busy & meta_a.w_rdy),
                meta_a.w_en.eq(ub.addr.valid & ub.addr.ready),
            ]
            emitted = meta_a.w_en
        if self.acc_gap:
            # Decided as the row is issued, so that no compare sits on the path from the
            # buffer's response to the array's ready (a small part's critical path).
            issued_acc = Signal(self.acc_bits)
            with m.If(emitted):
                m.d.sync += issued_acc.eq(acc_next)
            m.d.comb += meta_a_in.gap.eq(accumulate & (acc_next == issued_acc))
        # The next MATMUL may follow in the cycle the last row of the current one is issued.
        # (But with the reference pipeline, only once it has been issued: then the engine's
        # ready is a function of registers, off the path from the array's stall into
        # dispatch, and falls only as it takes a MATMUL, which the dispatch decided ahead
        # relies on.)
        last_row = emitted & (left == 1) if cfg.pipeline == "reference" else 0
        m.d.comb += [
            cmd.ready.eq(~scrubbing & (~busy | last_row) & ~Cat(*in_flight).all()),
            self.o_idle.eq(~scrubbing & ~busy & ~Cat(*in_flight).any()),
        ]
        with m.If(cmd.valid & cmd.ready):
            p = cmd.payload
            m.d.sync += [
                busy.eq(1),
                ub_next.eq(p.ub_addr), acc_next.eq(p.acc_addr), left.eq(p.count),
                switch.eq(p.switch), signed_.eq(p.signed), accumulate.eq(p.accumulate),
            ]
            window_bit = p.window
            if cfg.sum_tables:
                is_lookup = p.opcode == Opcode.MATMUL_LOOKUP
                m.d.sync += [lookup.eq(is_lookup), table.eq(p.window)]
                window_bit = p.window & ~is_lookup
            if windows:
                m.d.sync += [win_row.eq(p.ub_addr),
                             lane.eq(Mux(window_bit, p.lane, 0)),
                             step.eq(Mux(window_bit, p.step, cfg.ub_row))]
            for i in range(slots):
                with m.If(tail == i):
                    m.d.sync += [in_flight[i].eq(1), pending[i].eq(p.count),
                                 last_one[i].eq(p.count == 1)]
            m.d.sync += tail.eq(Mux(tail == slots - 1, 0, tail + 1))
        with m.Elif(meta_a.w_en):
            if windows:
                with m.If(need_read):
                    m.d.sync += ub_next.eq(ub_next + 1)
                with m.If(emit):
                    next_lane = lane + step
                    m.d.sync += [win_row.eq(win_row + (next_lane >> lg)),
                                 lane.eq(next_lane[:lg])]
            else:
                m.d.sync += ub_next.eq(ub_next + 1)
            with m.If(emitted):
                m.d.sync += [acc_next.eq(acc_next + 1), left.eq(left - 1), switch.eq(0)]
                with m.If(left == 1):
                    m.d.sync += busy.eq(0)

        # Buffer rows (with their metadata) into the array. The array's pipeline moves every
        # cycle (the accumulators are always ready), so rows sent in consecutive cycles reach
        # the accumulators in consecutive cycles.
        act = self.o_act
        wait = Signal()         # it would add to the accumulator row of last cycle's row
        if self.acc_gap:
            # Rows enter in the order they were issued: the row sent last cycle is the one
            # issued before this one.
            sent = Signal()
            m.d.sync += sent.eq(act.valid & act.ready)
            m.d.comb += wait.eq(sent & meta_a_out.gap)
        m.d.comb += [
            act.payload.signed.eq(meta_a_out.signed),
            act.payload.switch.eq(meta_a_out.switch),
            meta_b.w_en.eq(act.valid & act.ready),
            meta_b_in.accumulate.eq(meta_a_out.accumulate),
            meta_b_in.acc.eq(meta_a_out.acc),
            *([meta_b_in.lookup.eq(meta_a_out.lookup), meta_b_in.table.eq(meta_a_out.table)]
              if cfg.sum_tables else []),
            self.o_array_active.eq(act.valid & act.ready),
        ]
        if windows:
            # The last two rows read (`lower`, `upper`); a token that reads shifts the
            # arriving row in, and its window comes out of the rows after the shift.
            row_bits = cfg.ub_row * cfg.data_width
            lower = Signal(row_bits)
            upper = Signal(row_bits)
            tok = meta_a_out
            arriving = ub.data.payload.as_value()
            pair = Mux(tok.read, Cat(upper, arriving), Cat(lower, upper))
            # The window starts at element ub_row - rows + 1 + offset of the pair.
            first = (cfg.ub_row - cfg.rows + 1) * cfg.data_width
            window = pair[first:].bit_select(tok.offset * cfg.data_width,
                                             cfg.rows * cfg.data_width)
            has_row = ~tok.read | ub.data.valid
            takes = ~tok.emit | (act.ready & ~wait)
            m.d.comb += [
                act.valid.eq(meta_a.r_rdy & tok.emit & has_row & ~wait),
                ub.data.ready.eq(meta_a.r_rdy & tok.read & takes),
                meta_a.r_en.eq(meta_a.r_rdy & has_row & takes),
                act.payload.data.as_value().eq(window),
            ]
            with m.If(ub.data.valid & ub.data.ready):
                m.d.sync += [lower.eq(upper), upper.eq(arriving)]
        else:
            m.d.comb += [
                act.valid.eq(ub.data.valid & meta_a.r_rdy & ~wait),
                ub.data.ready.eq(act.ready & meta_a.r_rdy & ~wait),
                meta_a.r_en.eq(act.valid & act.ready),
            ]
            for r in range(cfg.rows):
                m.d.comb += act.payload.data[r].eq(ub.data.payload[r])

        # Array output rows into the accumulators (zero rows while scrubbing).
        with m.If(scrubbing):
            m.d.comb += [self.o_acc.valid.eq(1), self.o_acc.payload.addr.eq(scrub_addr)]
        with m.Else():
            m.d.comb += [
                self.o_acc.valid.eq(self.i_psum.valid & meta_b.r_rdy),
                self.o_acc.payload.addr.eq(meta_b_out.acc),
                self.o_acc.payload.accumulate.eq(meta_b_out.accumulate),
                *([self.o_acc.payload.lookup.eq(meta_b_out.lookup),
                   self.o_acc.payload.table.eq(meta_b_out.table)] if cfg.sum_tables else []),
                self.o_acc.payload.data.eq(self.i_psum.payload),
                self.i_psum.ready.eq(self.o_acc.ready & meta_b.r_rdy),
                meta_b.r_en.eq(self.o_acc.valid & self.o_acc.ready),
            ]

        # Retire MATMULs as their last row is written (a scrub row's write is no MATMUL's:
        # its slot is not in flight).
        if not cfg.pipeline == "fast":
            for i in range(slots):
                with m.If(self.i_acc_written & (head == i) & in_flight[i]):
                    m.d.sync += pending[i].eq(pending[i] - 1)
                    with m.If(pending[i] == 1):
                        m.d.comb += self.o_retire.eq(1)
                        m.d.sync += [in_flight[i].eq(0),
                                     head.eq(Mux(head == slots - 1, 0, head + 1))]
            return m
        # Where the memories are pipelined (for fast clocks), a cycle after it: `retiring`,
        # a register, is o_retire and frees the head slot, so that the write's pulse does not
        # run through the slots' state into the hazard tracker's in one cycle. A write in
        # that cycle is the next slot's (`current`, in one-hot).
        retiring = Signal()
        head_hot = Signal(slots, init=1)            # head, one-hot
        current = Mux(retiring, head_hot.rotate_left(1), head_hot)
        m.d.sync += retiring.eq(0)
        m.d.comb += self.o_retire.eq(retiring)
        with m.If(retiring):
            m.d.sync += [head_hot.eq(head_hot.rotate_left(1)),
                         head.eq(Mux(head == slots - 1, 0, head + 1))]
            for i in range(slots):
                with m.If(head_hot[i]):
                    m.d.sync += in_flight[i].eq(0)
        for i in range(slots):
            with m.If(self.i_acc_written & current[i] & in_flight[i]):
                m.d.sync += [pending[i].eq(pending[i] - 1), last_one[i].eq(pending[i] == 2)]
                with m.If(last_one[i]):
                    m.d.sync += retiring.eq(1)
        return m
