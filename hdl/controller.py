"""Controller: fetches the host's instruction stream, checks and dispatches instructions to
the units, and keeps them apart with interlocks instead of NOP padding."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulators import psum_write_layout
from .activation import acc_row_layout
from .config import TPUConfig
from .isa import (
    COUNTER_BITS,
    COUNTERS,
    DONE_MAGIC,
    ERROR_MAGIC,
    INSTR_BITS,
    RESYNC_WORD,
    Activate,
    ErrorCode,
    Func,
    Instr,
    LoadParams,
    LoadWeights,
    Matmul,
    Opcode,
    Pool,
    Status,
)
from .systolic_array import act_row_layout, psum_row_layout, weight_row_layout
from .unified_buffer import write_request_layout

__all__ = ["Controller", "MATMUL_SLOTS"]

#: MATMULs that may be in flight at once (issuing, in the array, or being accumulated).
MATMUL_SLOTS = 4


def _bits(depth: int) -> int:
    return max(1, (depth - 1).bit_length())


def _overlap(a_lo, a_hi, b_lo, b_hi):
    """Half-open ranges [a_lo, a_hi) and [b_lo, b_hi) share an element."""
    return (a_lo < b_hi) & (b_lo < a_hi)


class _Range:
    """A tracked half-open address range with a valid bit."""

    def __init__(self, name: str, width: int = 17):
        self.valid = Signal(name=f"{name}_valid")
        self.lo = Signal(width, name=f"{name}_lo")
        self.hi = Signal(width, name=f"{name}_hi")

    def hits(self, lo, hi):
        return self.valid & _overlap(self.lo, self.hi, lo, hi)

    def set(self, lo, count):
        return [self.valid.eq(1), self.lo.eq(lo), self.hi.eq(lo + count)]


class Controller(wiring.Component):
    """Instruction fetch, decode, error checks, dispatch, interlocks and counters.

    The front end takes one instruction at a time from ``i_host``, checks it (an error stops
    the core before the instruction has any effect, until ``i_clear``), then either runs it
    itself (host transfers, which own the host stream: READ_HOST, LOAD_WEIGHTS, LOAD_PARAMS,
    READ_COUNTERS, HALT) or hands it to an engine that runs behind later instructions:

    - the weight loader (READ_WEIGHTS): weight memory -> weight FIFO;
    - the matrix engine (MATMUL): unified buffer -> systolic array -> accumulators, up to
      :data:`MATMUL_SLOTS` instructions in flight, rows back to back;
    - the activation engine (ACTIVATE): accumulators -> activation unit -> unified buffer;
    - the host writer (WRITE_HOST): unified buffer -> ``o_host``.

    An instruction waits (counted as ``raw_stall``) while an earlier, unfinished one touches
    an overlapping unified-buffer or accumulator range in a conflicting way (read after
    write, write after read, write after write), and while its engine is busy. SYNC, HALT,
    READ_COUNTERS and CLEAR_COUNTERS wait until every engine is idle.
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        self.ub_bits = _bits(cfg.ub_depth)
        self.acc_bits = _bits(cfg.acc_depth)
        self.wm_bits = _bits(cfg.weight_mem_tiles * cfg.rows)
        ub_row = data.ArrayLayout(unsigned(cfg.data_width), cfg.ub_row)
        acc_row = data.ArrayLayout(signed(cfg.acc_width), cfg.cols)
        params = data.ArrayLayout(signed(32), cfg.cols)
        wrow = weight_row_layout(cfg.cols, cfg.data_width)
        super().__init__({
            "i_host":          In(stream.Signature(unsigned(cfg.host_width))),
            "o_host":          Out(stream.Signature(unsigned(cfg.host_width))),
            "o_status":        Out(Status),
            "i_clear":         In(1),
            # Unified buffer clients.
            "ub_host_w":       Out(stream.Signature(write_request_layout(self.ub_bits, ub_row))),
            "ub_act_w":        Out(stream.Signature(write_request_layout(self.ub_bits, ub_row))),
            "ub_mm_addr":      Out(stream.Signature(unsigned(self.ub_bits))),
            "ub_mm_data":      In(stream.Signature(ub_row)),
            "ub_host_addr":    Out(stream.Signature(unsigned(self.ub_bits))),
            "ub_host_data":    In(stream.Signature(ub_row)),
            # Weight memory.
            "wm_w":            Out(stream.Signature(write_request_layout(self.wm_bits, wrow))),
            "wm_addr":         Out(stream.Signature(unsigned(self.wm_bits))),
            "wm_data":         In(stream.Signature(wrow)),
            # Matrix unit.
            "mu_weight":       Out(stream.Signature(wrow)),
            "mu_act":          Out(stream.Signature(act_row_layout(cfg.rows, cfg.data_width))),
            "mu_psum":         In(stream.Signature(psum_row_layout(cfg.cols, cfg.acc_width))),
            "mu_weight_stall": In(1),
            "mu_weight_shift": In(1),
            "mu_shadow_full":  In(1),
            "mu_tiles":        In(range(cfg.weight_fifo_depth + 1)),
            # Accumulators.
            "acc_w":           Out(stream.Signature(psum_write_layout(self.acc_bits, cfg.cols,
                                                                      cfg.acc_width))),
            "acc_written":     In(1),
            "acc_addr":        Out(stream.Signature(unsigned(self.acc_bits))),
            "acc_data":        In(stream.Signature(acc_row)),
            # Activation unit.
            "au_row":          Out(stream.Signature(acc_row_layout(cfg.cols, cfg.acc_width))),
            "au_out":          In(stream.Signature(data.ArrayLayout(signed(8), cfg.cols))),
            "au_bias":         Out(params),
            "au_multiplier":   Out(params),
            "au_shift":        Out(unsigned(6)),
            "au_zero_point":   Out(signed(8)),
            "au_clamp_hi":     Out(signed(8)),
            "au_func":         Out(Func),
        })

    def elaborate(self, platform):
        cfg = self.config
        rows, cols = cfg.rows, cfg.cols
        m = Module()

        # ---- Performance counters ------------------------------------------------------
        counters = {name: Signal(COUNTER_BITS, name=f"count_{name}") for name in COUNTERS}
        bump = {name: Signal(name=f"bump_{name}") for name in COUNTERS}
        clear_counters = Signal()
        for name in COUNTERS:
            amount = rows * cols if name == "useful_macs" else 1
            with m.If(clear_counters):
                m.d.sync += counters[name].eq(0)
            with m.Elif(bump[name]):
                m.d.sync += counters[name].eq(counters[name] + amount)
        m.d.comb += bump["cycles"].eq(1)

        # ---- Decode-level state (changes only as instructions are dispatched) ------------
        written = Signal(cfg.weight_mem_tiles)     # tiles LOAD_WEIGHTS has written
        queued = Signal(range(cfg.weight_fifo_depth + 2))  # tiles read, not switched in
        have_active = Signal()                     # a tile has been switched in
        index = Signal(24)                         # instruction index in the program
        status = self.o_status
        halted = Signal()
        # The index stands still while stopped: it names the failing instruction.
        m.d.comb += [status.halted.eq(halted), status.instr_index.eq(index)]

        # ---- Engines' tracked ranges (for interlocks) ----------------------------------
        mm_ub = [_Range(f"mm{i}_ub") for i in range(MATMUL_SLOTS)]
        mm_acc = [_Range(f"mm{i}_acc") for i in range(MATMUL_SLOTS)]
        act_ub = _Range("act_ub")
        act_acc = _Range("act_acc")
        ho_ub = _Range("ho_ub")
        rw_tiles = _Range("rw_tiles")

        # ---- Instruction decode ----------------------------------------------------------
        beat = self.i_host.payload
        instr = data.View(Instr, beat[:INSTR_BITS])
        op = instr.opcode
        mm = data.View(Matmul, beat[:INSTR_BITS])
        av = data.View(Activate, beat[:INSTR_BITS])
        lw = data.View(LoadWeights, beat[:INSTR_BITS])
        lp = data.View(LoadParams, beat[:INSTR_BITS])
        a, b, count = instr.a, instr.b, instr.count
        a_end = Signal(17)
        b_end = Signal(17)
        window_log = Signal(2)
        out_count = Signal(16)
        m.d.comb += [
            window_log.eq(Mux(av.pool == Pool.MAX4, 2, Mux(av.pool == Pool.MAX2, 1, 0))),
            out_count.eq(count >> window_log),
            a_end.eq(a + count),
            b_end.eq(b + Mux(op == Opcode.ACTIVATE, out_count, count)),
        ]

        is_ = {o: Signal(name=f"is_{o.name.lower()}") for o in Opcode}
        for o in Opcode:
            m.d.comb += is_[o].eq(op == o)
        unknown = ~Cat(*is_.values()).any()
        needs_count = (is_[Opcode.READ_HOST] | is_[Opcode.WRITE_HOST] |
                       is_[Opcode.LOAD_WEIGHTS] | is_[Opcode.READ_WEIGHTS] |
                       is_[Opcode.MATMUL] | is_[Opcode.ACTIVATE])
        window_mask = Signal(2)
        m.d.comb += window_mask.eq((1 << window_log) - 1)
        bad_field = (
            (needs_count & (count == 0)) |
            (is_[Opcode.ACTIVATE] & ((av.func.as_value() > Func.TANH.value) |
                                     (av.pool.as_value() == 3) |
                                     ((count & window_mask) != 0) |
                                     (av.slot >= cfg.param_slots))) |
            (is_[Opcode.LOAD_PARAMS] & (lp.slot >= cfg.param_slots)))
        # MATMUL: a = ub_addr, b = acc_addr. ACTIVATE: a = acc_addr, b = ub_addr.
        ub_range = (((is_[Opcode.READ_HOST] | is_[Opcode.WRITE_HOST] | is_[Opcode.MATMUL]) &
                     (a_end > cfg.ub_depth)) |
                    (is_[Opcode.ACTIVATE] & (b_end > cfg.ub_depth)))
        acc_range = ((is_[Opcode.MATMUL] & (b_end > cfg.acc_depth)) |
                     (is_[Opcode.ACTIVATE] & (a_end > cfg.acc_depth)))
        weight_range = ((is_[Opcode.LOAD_WEIGHTS] | is_[Opcode.READ_WEIGHTS]) &
                        (a_end > cfg.weight_mem_tiles))
        tile_mask = Signal(cfg.weight_mem_tiles)
        for t in range(cfg.weight_mem_tiles):
            m.d.comb += tile_mask[t].eq((t >= a) & (t < a_end))
        weight_unwritten = is_[Opcode.READ_WEIGHTS] & ((tile_mask & ~written) != 0)
        weight_empty = is_[Opcode.MATMUL] & Mux(mm.switch, queued == 0, ~have_active)
        weight_overflow = is_[Opcode.READ_WEIGHTS] & (queued + count >
                                                       cfg.weight_fifo_depth + 1)
        error_code = Signal(ErrorCode)
        checks = [   # in priority order: the first that fails is reported
            (unknown, ErrorCode.UNKNOWN_OPCODE),
            (bad_field, ErrorCode.BAD_FIELD),
            (ub_range, ErrorCode.UB_RANGE),
            (acc_range, ErrorCode.ACC_RANGE),
            (weight_range, ErrorCode.WEIGHT_RANGE),
            (weight_unwritten, ErrorCode.WEIGHT_UNWRITTEN),
            (weight_empty, ErrorCode.WEIGHT_EMPTY),
            (weight_overflow, ErrorCode.WEIGHT_OVERFLOW),
        ]
        for failed, code in reversed(checks):    # later assignments win
            with m.If(failed):
                m.d.comb += error_code.eq(code)

        # ---- Engine state ----------------------------------------------------------------
        # Matrix engine.
        mm_busy = Signal()               # still issuing rows of the newest MATMUL
        mm_ub_next = Signal(self.ub_bits)
        mm_acc_next = Signal(self.acc_bits)
        mm_left = Signal(16)
        mm_switch = Signal()
        mm_signed = Signal()
        mm_accumulate = Signal()
        mm_head = Signal(range(MATMUL_SLOTS))
        mm_tail = Signal(range(MATMUL_SLOTS))
        mm_pending = [Signal(16, name=f"mm{i}_pending") for i in range(MATMUL_SLOTS)]
        mm_free = Signal()      # a MATMUL may be dispatched: see below
        # Activation engine.
        act_busy = Signal()
        act_run = Signal()
        act_acc_next = Signal(self.acc_bits)
        act_req_left = Signal(16)
        act_resp_index = Signal(2)
        act_window_mask = Signal(2)
        act_out_addr = Signal(self.ub_bits)
        act_out_left = Signal(16)
        act_func = Signal(Func)
        act_slot = Signal(range(cfg.param_slots))
        # Host writer.
        ho_busy = Signal()
        ho_addr = Signal(self.ub_bits)
        ho_req_left = Signal(16)
        ho_resp_left = Signal(16)
        # Weight loader.
        rw_addr = Signal(self.wm_bits)
        rw_req_left = Signal(range(cfg.weight_mem_tiles * rows + 1))
        rw_pending = Signal(range(cfg.weight_mem_tiles * rows + 1))

        mm_idle = ~mm_busy & ~Cat(*(r.valid for r in mm_acc)).any()
        rw_idle = (rw_req_left == 0) & (rw_pending == 0)
        weights_settled = rw_idle & ((self.mu_tiles == 0) | self.mu_shadow_full)
        all_idle = Signal()
        m.d.comb += all_idle.eq(mm_idle & weights_settled & ~act_busy & ~ho_busy)

        # ---- Interlocks for the instruction at the front end ----------------------------
        mm_ub_hit = Cat(*(r.hits(a, a_end) for r in mm_ub)).any()
        mm_acc_hit_act = Cat(*(r.hits(a, a_end) for r in mm_acc)).any()
        mm_ub_hit_act = Cat(*(r.hits(b, b_end) for r in mm_ub)).any()
        hazard = Signal()      # a range conflict (counted as raw_stall)
        busy = Signal()        # the engine or the whole core is not free
        with m.Switch(op):
            with m.Case(Opcode.READ_HOST):
                m.d.comb += hazard.eq(mm_ub_hit | act_ub.hits(a, a_end) | ho_ub.hits(a, a_end))
            with m.Case(Opcode.WRITE_HOST):
                m.d.comb += [hazard.eq(act_ub.hits(a, a_end)), busy.eq(ho_busy)]
            with m.Case(Opcode.LOAD_WEIGHTS):
                m.d.comb += hazard.eq(rw_tiles.hits(a, a_end))
            with m.Case(Opcode.READ_WEIGHTS):
                m.d.comb += busy.eq(~rw_idle)
            with m.Case(Opcode.MATMUL):
                m.d.comb += [
                    hazard.eq(act_ub.hits(a, a_end) | act_acc.hits(b, b_end)),
                    busy.eq(~mm_free),
                ]
            with m.Case(Opcode.ACTIVATE):
                m.d.comb += [
                    hazard.eq(mm_acc_hit_act | mm_ub_hit_act | ho_ub.hits(b, b_end)),
                    busy.eq(act_busy),
                ]
            with m.Case(Opcode.LOAD_PARAMS):
                m.d.comb += busy.eq(act_busy)
            with m.Case(Opcode.SYNC, Opcode.HALT, Opcode.READ_COUNTERS, Opcode.CLEAR_COUNTERS):
                m.d.comb += busy.eq(~all_idle)

        # ---- Front end -------------------------------------------------------------------
        fe_addr = Signal(max(self.ub_bits, self.wm_bits))   # a row, or tile * rows + row
        fe_left = Signal(range((1 << 16) * rows + 1))
        fe_signed = Signal()
        fe_slot = Signal(range(cfg.param_slots))
        fe_counter = Signal(range(len(COUNTERS)))
        fe_out_valid = Signal()
        fe_out_data = Signal(cfg.host_width)
        dispatch = Signal()     # the instruction at the front end leaves it this cycle

        # Reset clears the unified buffer, the accumulators and the parameter slots, one row
        # of each a cycle, before the first instruction is taken.
        scrubbing = Signal()
        scrub_addr = Signal(range(max(cfg.ub_depth, cfg.acc_depth, cfg.param_slots) + 1))
        scrub_ub = Signal()
        m.d.comb += scrub_ub.eq(scrubbing & (scrub_addr < cfg.ub_depth))

        ub_row_bits = cfg.data_width * cfg.ub_row
        m.d.comb += [
            self.ub_host_w.payload.addr.eq(Mux(scrubbing, scrub_addr, fe_addr)),
            self.ub_host_w.payload.data.eq(Mux(scrubbing, 0, beat[:ub_row_bits])),
            self.wm_w.payload.addr.eq(fe_addr),
            self.wm_w.payload.data.data.eq(beat[:cfg.data_width * cols]),
            self.wm_w.payload.data.signed.eq(fe_signed),
        ]

        # Parameter store: per-slot bias and multiplier rows, and the scalars.
        scalars = data.StructLayout({"shift": unsigned(6), "zero_point": signed(8),
                                     "clamp_hi": signed(8)})
        params = data.ArrayLayout(signed(32), cols)
        m.submodules.bias_mem = bias_mem = memory.Memory(shape=params, depth=cfg.param_slots,
                                                         init=[])
        m.submodules.mult_mem = mult_mem = memory.Memory(shape=params, depth=cfg.param_slots,
                                                         init=[])
        m.submodules.scalar_mem = scalar_mem = memory.Memory(shape=scalars,
                                                             depth=cfg.param_slots, init=[])
        bias_w, mult_w, scalar_w = (bias_mem.write_port(), mult_mem.write_port(),
                                    scalar_mem.write_port())
        bias_r, mult_r, scalar_r = (bias_mem.read_port(), mult_mem.read_port(),
                                    scalar_mem.read_port())
        with m.If(scrubbing):
            m.d.comb += [bias_w.addr.eq(scrub_addr), mult_w.addr.eq(scrub_addr),
                         scalar_w.addr.eq(scrub_addr)]
        with m.Else():
            m.d.comb += [
                bias_w.addr.eq(fe_slot), bias_w.data.eq(beat[:32 * cols]),
                mult_w.addr.eq(fe_slot), mult_w.data.eq(beat[:32 * cols]),
                scalar_w.addr.eq(lp.slot),
                scalar_w.data.shift.eq(lp.shift),
                scalar_w.data.zero_point.eq(lp.zero_point.as_signed()),
                scalar_w.data.clamp_hi.eq(lp.clamp_hi.as_signed()),
            ]
        for port in (bias_r, mult_r, scalar_r):
            m.d.comb += [port.addr.eq(act_slot), port.en.eq(1)]
        m.d.comb += [
            self.au_bias.eq(bias_r.data),
            self.au_multiplier.eq(mult_r.data),
            self.au_shift.eq(scalar_r.data.shift),
            self.au_zero_point.eq(scalar_r.data.zero_point),
            self.au_clamp_hi.eq(scalar_r.data.clamp_hi),
            self.au_func.eq(act_func),
        ]

        counter_values = Cat(*(counters[name] for name in COUNTERS))
        m.d.comb += fe_out_data.eq(counter_values.word_select(fe_counter, COUNTER_BITS))

        host_wait = Signal()
        resync = Signal()       # the beat at the front end is the resynchronisation word
        m.d.comb += resync.eq(beat[:INSTR_BITS] == RESYNC_WORD)
        with m.FSM(name="front_end"):
            with m.State("SCRUB"):
                m.d.comb += [scrubbing.eq(1), self.ub_host_w.valid.eq(scrub_ub)]
                with m.If(scrub_addr < cfg.param_slots):
                    m.d.comb += [bias_w.en.eq(1), mult_w.en.eq(1), scalar_w.en.eq(1)]
                with m.If(~scrub_ub | self.ub_host_w.ready):
                    m.d.sync += scrub_addr.eq(scrub_addr + 1)
                    with m.If(scrub_addr == max(cfg.ub_depth, cfg.acc_depth,
                                                cfg.param_slots) - 1):
                        m.next = "FETCH"
            with m.State("FETCH"):
                m.d.comb += host_wait.eq(~self.i_host.valid)
                with m.If(self.i_host.valid):
                    with m.If(resync):
                        # Restart the program; not an instruction.
                        m.d.comb += self.i_host.ready.eq(1)
                        m.d.sync += [halted.eq(0), index.eq(0)]
                    with m.Elif(error_code != ErrorCode.NONE):
                        m.d.comb += self.i_host.ready.eq(1)
                        m.d.sync += [status.error.eq(1), status.code.eq(error_code),
                                     halted.eq(0)]
                        m.next = "ERROR_BEAT"
                    with m.Elif(~hazard & ~busy):
                        m.d.comb += [self.i_host.ready.eq(1), dispatch.eq(1)]
                        m.d.sync += [halted.eq(0), index.eq(index + 1)]
                        m.d.comb += bump["instructions"].eq(~is_[Opcode.READ_COUNTERS] &
                                                            ~is_[Opcode.CLEAR_COUNTERS])
                        with m.Switch(op):
                            with m.Case(Opcode.READ_HOST):
                                m.d.sync += [fe_addr.eq(a), fe_left.eq(count)]
                                m.next = "HOST_ROWS"
                            with m.Case(Opcode.LOAD_WEIGHTS):
                                m.d.sync += [
                                    fe_addr.eq(a * rows), fe_left.eq(count * rows),
                                    fe_signed.eq(lw.signed),
                                    written.eq(written | tile_mask),
                                ]
                                m.next = "WEIGHT_ROWS"
                            with m.Case(Opcode.LOAD_PARAMS):
                                m.d.comb += scalar_w.en.eq(1)
                                m.d.sync += fe_slot.eq(lp.slot)
                                m.next = "PARAM_BIAS"
                            with m.Case(Opcode.READ_COUNTERS):
                                m.d.sync += fe_counter.eq(0)
                                m.next = "SEND_COUNTERS"
                            with m.Case(Opcode.CLEAR_COUNTERS):
                                m.d.comb += clear_counters.eq(1)
                            with m.Case(Opcode.HALT):
                                m.next = "SEND_DONE"
                    with m.Else():
                        m.d.comb += bump["raw_stall"].eq(hazard)
            # Data beats of READ_HOST and LOAD_WEIGHTS, one row a beat.
            for state, rows_out in (("HOST_ROWS", self.ub_host_w), ("WEIGHT_ROWS", self.wm_w)):
                with m.State(state):
                    m.d.comb += [
                        host_wait.eq(~self.i_host.valid),
                        rows_out.valid.eq(self.i_host.valid),
                        self.i_host.ready.eq(rows_out.ready),
                    ]
                    with m.If(self.i_host.valid & rows_out.ready):
                        m.d.sync += [fe_addr.eq(fe_addr + 1), fe_left.eq(fe_left - 1)]
                        with m.If(fe_left == 1):
                            m.next = "FETCH"
            with m.State("PARAM_BIAS"):
                m.d.comb += [
                    host_wait.eq(~self.i_host.valid),
                    self.i_host.ready.eq(1),
                    bias_w.en.eq(self.i_host.valid),
                ]
                with m.If(self.i_host.valid):
                    m.next = "PARAM_MULT"
            with m.State("PARAM_MULT"):
                m.d.comb += [
                    host_wait.eq(~self.i_host.valid),
                    self.i_host.ready.eq(1),
                    mult_w.en.eq(self.i_host.valid),
                ]
                with m.If(self.i_host.valid):
                    m.next = "FETCH"
            with m.State("SEND_COUNTERS"):
                m.d.comb += fe_out_valid.eq(1)
                with m.If(self.o_host.ready):
                    m.d.sync += fe_counter.eq(fe_counter + 1)
                    with m.If(fe_counter == len(COUNTERS) - 1):
                        m.d.comb += bump["instructions"].eq(1)
                        m.next = "FETCH"
            with m.State("SEND_DONE"):
                m.d.comb += [
                    fe_out_valid.eq(1),
                    fe_out_data.eq(Cat(Const(0, 32), Const(DONE_MAGIC, 32)) | index),
                ]
                with m.If(self.o_host.ready):
                    m.d.sync += [halted.eq(1), index.eq(0)]
                    m.next = "FETCH"
            # The error beat follows the output of every earlier instruction.
            with m.State("ERROR_BEAT"):
                with m.If(~ho_busy):
                    m.d.comb += [
                        fe_out_valid.eq(1),
                        fe_out_data.eq(Cat(index[:24], status.code.as_value(), Const(0, 4),
                                           Const(ERROR_MAGIC, 32))),
                    ]
                    with m.If(self.o_host.ready):
                        m.next = "ERROR"
            # Stopped: every beat is discarded until the resynchronisation word or i_clear.
            with m.State("ERROR"):
                m.d.comb += self.i_host.ready.eq(1)
                with m.If(self.i_clear | (self.i_host.valid & resync)):
                    m.d.sync += [status.error.eq(0), status.code.eq(ErrorCode.NONE),
                                 index.eq(0)]
                    m.next = "FETCH"
        m.d.comb += bump["host_stall"].eq(host_wait)

        # ---- Decode-level bookkeeping at dispatch ---------------------------------------
        with m.If(dispatch & is_[Opcode.READ_WEIGHTS]):
            m.d.sync += queued.eq(queued + count)
        with m.If(dispatch & is_[Opcode.MATMUL] & mm.switch):
            m.d.sync += [queued.eq(queued - 1), have_active.eq(1)]

        # ---- Weight loader: weight memory -> weight FIFO -------------------------------
        m.d.comb += [
            self.wm_addr.valid.eq(rw_req_left != 0),
            self.wm_addr.payload.eq(rw_addr),
        ]
        wiring.connect(m, wiring.flipped(self.wm_data), wiring.flipped(self.mu_weight))
        rw_req = self.wm_addr.valid & self.wm_addr.ready
        rw_resp = self.wm_data.valid & self.wm_data.ready
        with m.If(dispatch & is_[Opcode.READ_WEIGHTS]):
            m.d.sync += [
                rw_addr.eq(a * rows),
                rw_req_left.eq(count * rows),
                rw_pending.eq(count * rows),
                *rw_tiles.set(a, count),
            ]
        with m.Else():
            with m.If(rw_req):
                m.d.sync += [rw_addr.eq(rw_addr + 1), rw_req_left.eq(rw_req_left - 1)]
            with m.If(rw_resp):
                m.d.sync += rw_pending.eq(rw_pending - 1)
                with m.If(rw_pending == 1):
                    m.d.sync += rw_tiles.valid.eq(0)

        # ---- Matrix engine: unified buffer -> array -> accumulators ---------------------
        meta_a_layout = data.StructLayout({"switch": 1, "signed": 1, "accumulate": 1,
                                           "acc": unsigned(self.acc_bits)})
        meta_b_layout = data.StructLayout({"accumulate": 1, "acc": unsigned(self.acc_bits)})
        # Unbuffered: a row's metadata must be readable the cycle after its UB read was
        # issued, when the row arrives, or the read port would idle every other cycle.
        m.submodules.meta_a = meta_a = fifo.SyncFIFO(width=meta_a_layout.size, depth=4)
        m.submodules.meta_b = meta_b = fifo.SyncFIFOBuffered(
            width=meta_b_layout.size, depth=cfg.array_latency + 2)
        meta_a_in = data.View(meta_a_layout, meta_a.w_data)
        meta_a_out = data.View(meta_a_layout, meta_a.r_data)
        meta_b_in = data.View(meta_b_layout, meta_b.w_data)
        meta_b_out = data.View(meta_b_layout, meta_b.r_data)

        # Issue UB reads.
        m.d.comb += [
            self.ub_mm_addr.valid.eq(mm_busy & meta_a.w_rdy),
            self.ub_mm_addr.payload.eq(mm_ub_next),
            meta_a.w_en.eq(self.ub_mm_addr.valid & self.ub_mm_addr.ready),
            meta_a_in.switch.eq(mm_switch),
            meta_a_in.signed.eq(mm_signed),
            meta_a_in.accumulate.eq(mm_accumulate),
            meta_a_in.acc.eq(mm_acc_next),
        ]
        # The next MATMUL may follow in the cycle the last row of the current one is issued,
        # so rows of consecutive MATMULs enter the array back to back.
        mm_last_row = meta_a.w_en & (mm_left == 1)
        m.d.comb += mm_free.eq((~mm_busy | mm_last_row) & ~Cat(*(r.valid for r in mm_acc)).all())
        with m.If(dispatch & is_[Opcode.MATMUL]):
            m.d.sync += [
                mm_busy.eq(1),
                mm_ub_next.eq(a), mm_acc_next.eq(b), mm_left.eq(count),
                mm_switch.eq(mm.switch), mm_signed.eq(mm.signed),
                mm_accumulate.eq(mm.accumulate),
            ]
            for i in range(MATMUL_SLOTS):
                with m.If(mm_tail == i):
                    m.d.sync += [*mm_ub[i].set(a, count), *mm_acc[i].set(b, count),
                                 mm_pending[i].eq(count)]
            m.d.sync += mm_tail.eq(Mux(mm_tail == MATMUL_SLOTS - 1, 0, mm_tail + 1))
        with m.Elif(meta_a.w_en):
            m.d.sync += [
                mm_ub_next.eq(mm_ub_next + 1), mm_acc_next.eq(mm_acc_next + 1),
                mm_left.eq(mm_left - 1), mm_switch.eq(0),
            ]
            with m.If(mm_left == 1):
                m.d.sync += mm_busy.eq(0)

        # UB rows (with their metadata) into the array.
        act = self.mu_act
        m.d.comb += [
            act.valid.eq(self.ub_mm_data.valid & meta_a.r_rdy),
            act.payload.signed.eq(meta_a_out.signed),
            act.payload.switch.eq(meta_a_out.switch),
            self.ub_mm_data.ready.eq(act.ready & meta_a.r_rdy),
            meta_a.r_en.eq(act.valid & act.ready),
            meta_b.w_en.eq(act.valid & act.ready),
            meta_b_in.accumulate.eq(meta_a_out.accumulate),
            meta_b_in.acc.eq(meta_a_out.acc),
        ]
        for r in range(rows):
            m.d.comb += act.payload.data[r].eq(self.ub_mm_data.payload[r])
        m.d.comb += [
            bump["array_active"].eq(act.valid & act.ready),
            bump["useful_macs"].eq(act.valid & act.ready),
            bump["weight_stall"].eq(self.mu_weight_stall),
            bump["weight_shift"].eq(self.mu_weight_shift),
        ]

        # Array output rows into the accumulators (zero rows while scrubbing after reset).
        with m.If(scrubbing):
            m.d.comb += [
                self.acc_w.valid.eq(scrub_addr < cfg.acc_depth),
                self.acc_w.payload.addr.eq(scrub_addr),
            ]
        with m.Else():
            m.d.comb += [
                self.acc_w.valid.eq(self.mu_psum.valid & meta_b.r_rdy),
                self.acc_w.payload.addr.eq(meta_b_out.acc),
                self.acc_w.payload.accumulate.eq(meta_b_out.accumulate),
                self.acc_w.payload.data.eq(self.mu_psum.payload),
                self.mu_psum.ready.eq(self.acc_w.ready & meta_b.r_rdy),
                meta_b.r_en.eq(self.acc_w.valid & self.acc_w.ready),
            ]

        # Retire MATMULs as their last row is written.
        for i in range(MATMUL_SLOTS):
            # (A scrub row's write is not a MATMUL's: the slot is not valid then.)
            with m.If(self.acc_written & (mm_head == i) & mm_acc[i].valid):
                m.d.sync += mm_pending[i].eq(mm_pending[i] - 1)
                with m.If(mm_pending[i] == 1):
                    m.d.sync += [mm_ub[i].valid.eq(0), mm_acc[i].valid.eq(0),
                                 mm_head.eq(Mux(mm_head == MATMUL_SLOTS - 1, 0, mm_head + 1))]

        # ---- Activation engine: accumulators -> activation unit -> unified buffer ------
        with m.If(dispatch & is_[Opcode.ACTIVATE]):
            m.d.sync += [
                act_busy.eq(1), act_run.eq(0),
                act_acc_next.eq(a), act_req_left.eq(count), act_resp_index.eq(0),
                act_window_mask.eq(window_mask), act_out_addr.eq(b),
                act_out_left.eq(out_count), act_func.eq(av.func), act_slot.eq(av.slot),
                *act_acc.set(a, count), *act_ub.set(b, out_count),
            ]
        with m.Elif(act_busy):
            # The parameter memories need a cycle to present the new slot.
            m.d.sync += act_run.eq(1)
        m.d.comb += [
            self.acc_addr.valid.eq(act_run & (act_req_left != 0)),
            self.acc_addr.payload.eq(act_acc_next),
            self.au_row.valid.eq(self.acc_data.valid),
            self.au_row.payload.data.eq(self.acc_data.payload),
            self.au_row.payload.last.eq((act_resp_index & act_window_mask) == act_window_mask),
            self.acc_data.ready.eq(self.au_row.ready),
            self.ub_act_w.valid.eq(self.au_out.valid),
            self.ub_act_w.payload.addr.eq(act_out_addr),
            self.au_out.ready.eq(self.ub_act_w.ready),
        ]
        for j in range(cols):
            m.d.comb += self.ub_act_w.payload.data[j].eq(self.au_out.payload[j])
        with m.If(self.acc_addr.valid & self.acc_addr.ready):
            m.d.sync += [act_acc_next.eq(act_acc_next + 1), act_req_left.eq(act_req_left - 1)]
        with m.If(self.au_row.valid & self.au_row.ready):
            m.d.sync += act_resp_index.eq(act_resp_index + 1)
        with m.If(self.ub_act_w.valid & self.ub_act_w.ready):
            m.d.sync += [act_out_addr.eq(act_out_addr + 1), act_out_left.eq(act_out_left - 1)]
            with m.If(act_out_left == 1):
                m.d.sync += [act_busy.eq(0), act_run.eq(0), act_ub.valid.eq(0),
                             act_acc.valid.eq(0)]

        # ---- Host writer: unified buffer -> host ---------------------------------------
        with m.If(dispatch & is_[Opcode.WRITE_HOST]):
            m.d.sync += [ho_busy.eq(1), ho_addr.eq(a), ho_req_left.eq(count),
                         ho_resp_left.eq(count), *ho_ub.set(a, count)]
        m.d.comb += [
            self.ub_host_addr.valid.eq(ho_req_left != 0),
            self.ub_host_addr.payload.eq(ho_addr),
        ]
        with m.If(self.ub_host_addr.valid & self.ub_host_addr.ready):
            m.d.sync += [ho_addr.eq(ho_addr + 1), ho_req_left.eq(ho_req_left - 1)]
        with m.If(fe_out_valid):
            m.d.comb += [self.o_host.valid.eq(1), self.o_host.payload.eq(fe_out_data)]
        with m.Else():
            m.d.comb += [
                self.o_host.valid.eq(self.ub_host_data.valid),
                self.o_host.payload.eq(self.ub_host_data.payload.as_value()),
                self.ub_host_data.ready.eq(self.o_host.ready),
            ]
        with m.If(self.ub_host_data.valid & self.ub_host_data.ready):
            m.d.sync += ho_resp_left.eq(ho_resp_left - 1)
            with m.If(ho_resp_left == 1):
                m.d.sync += [ho_busy.eq(0), ho_ub.valid.eq(0)]

        # ---- Non-matrix time ------------------------------------------------------------
        m.d.comb += bump["non_matrix"].eq(
            ~(act.valid & act.ready) &
            (act_busy | ho_busy | self.ub_host_w.valid | self.wm_w.valid | fe_out_valid))
        return m
