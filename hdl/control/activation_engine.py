"""The activation engine: ACTIVATE, accumulators -> activation unit -> unified buffer, and the
requantisation parameter store LOAD_PARAMS fills."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.isa import Activate, Func, LoadParams, Pool, param_row_beat, ub_row_beat
from hdl.layouts import acc_row_layout
from hdl.memory.row_memory import RegisteredRead
from hdl.ports import (
    MemReadSignature,
    MemWriteSignature,
    ParamColumnSignature,
    addr_bits,
    requant_params_layout,
)

__all__ = ["ActivationEngine", "ParamKind", "param_write_layout", "window_log2"]

_LP = data.Layout.cast(LoadParams)


class ParamKind(enum.Enum, shape=unsigned(2)):
    """Which part of a parameter slot a write carries."""
    SCALARS    = 0   # shift, zero point, clamp_hi (from the LOAD_PARAMS word)
    BIAS       = 1   # the per-column bias row
    MULTIPLIER = 2   # the per-column multiplier row


def param_write_layout(cols: int, slots: int) -> data.StructLayout:
    """One write into the parameter store."""
    return data.StructLayout({
        "slot":       unsigned(max(1, (slots - 1).bit_length())),
        "kind":       ParamKind,
        "row":        param_row_beat(cols),
        "shift":      _LP["shift"].shape,
        "zero_point": signed(_LP["zero_point"].width),
        "clamp_hi":   signed(_LP["clamp_hi"].width),
    })


class ActivationEngine(wiring.Component):
    """Runs ACTIVATE behind later instructions and holds the parameter slots.

    Contract: takes an ACTIVATE on ``i_activate`` while idle (once ready, it stays ready
    until it takes one); one cycle later (the
    parameter store presents the slot) reads accumulator rows ``acc_addr..`` in order into
    the activation unit, marking the last row of each pooling window, and writes each
    result row to the next unified-buffer row from ``ub_addr`` (``cols`` results, the rest
    of the row zero); ``o_busy`` is high from the cycle after it takes an instruction until
    its last row is written. ``o_params`` is the slot of the running ACTIVATE and its
    function. ``i_param_write`` is always ready and writes one part of a slot (the front
    end sends them only while no ACTIVATE runs). After a reset it first zeroes every slot
    (``o_busy`` high meanwhile). ``count`` is at most ``acc_depth`` and its results at most
    ``ub_depth`` (the front end's range checks): the engine keeps counts that wide.

    Members
    -------
    i_activate : In(stream.Signature(Activate))
        Instructions from the front end.
    i_param_write : In(stream.Signature(param_write_layout))
        LOAD_PARAMS' writes from the front end.
    o_acc : Out(MemReadSignature(acc_bits, acc_row))
        Accumulator read client.
    o_row : Out(stream.Signature(acc_row_layout))
        Rows into the activation unit.
    i_out : In(stream.Signature(ArrayLayout(signed(8), cols)))
        Result rows from the activation unit.
    o_ub : Out(MemWriteSignature(ub_bits, ub_row))
        Unified-buffer write client.
    o_params : Out(requant_params_layout(cols))
        Parameters for the activation unit (``activation_unit="pipelined"``): whole rows,
        from a memory per row kind (``param_store``).
    params : In(ParamColumnSignature(cols))
        Parameters for the serial unit (``activation_unit="serial"``, instead of
        ``o_params``), which reads them a word at a time: the store is one 32-bit-wide block
        RAM, a word per column and kind and one for the scalars in each slot (the scalars
        are read into a register when an ACTIVATE starts, one cycle more before its first
        read). A bias or multiplier row is written a column a cycle: the engine takes it
        (``ready``) in the cycle it writes the last column. (One narrow block RAM takes far
        fewer blocks than a memory per row kind, and no registered rows.)
    o_busy : Out(1)
    """

    def __init__(self, config: TPUConfig):
        cfg = self.config = config
        self.column_store = cfg.activation_unit == "serial"
        self.ub_bits = addr_bits(cfg.ub_depth)
        self.acc_bits = addr_bits(cfg.acc_depth)
        ub_row = ub_row_beat(cfg.ub_row)
        acc_row = data.ArrayLayout(signed(cfg.acc_width), cfg.cols)
        super().__init__({
            "i_activate":    In(stream.Signature(Activate)),
            "i_param_write": In(stream.Signature(param_write_layout(cfg.cols,
                                                                    cfg.param_slots))),
            "o_acc":         Out(MemReadSignature(self.acc_bits, acc_row)),
            "o_row":         Out(stream.Signature(acc_row_layout(cfg.cols, cfg.acc_width))),
            "i_out":         In(stream.Signature(data.ArrayLayout(signed(8), cfg.cols))),
            "o_ub":          Out(MemWriteSignature(self.ub_bits, ub_row)),
            **({"params": In(ParamColumnSignature(cfg.cols))} if self.column_store else
               {"o_params": Out(requant_params_layout(cfg.cols))}),
            "o_busy":        Out(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()

        busy = Signal()
        run = Signal()
        acc_next = Signal(self.acc_bits)
        req_left = Signal(range(cfg.acc_depth + 1))
        resp_index = Signal(2)
        window_mask = Signal(2)
        out_addr = Signal(self.ub_bits)
        out_left = Signal(range(cfg.ub_depth + 1))
        func = Signal(Func)
        slot = Signal(range(cfg.param_slots))
        take = Signal()

        # The parameter store: after a reset it zeroes every slot (``scrubbing``), then takes
        # LOAD_PARAMS' writes; ``params_ready`` says, while an ACTIVATE waits to run, that
        # its slot's parameters are presented from the next cycle.
        store = self._column_store if self.column_store else self._row_store
        scrubbing, params_ready = store(m, slot, func, busy, run, take)
        m.d.comb += self.o_busy.eq(busy | scrubbing)

        cmd = self.i_activate
        a = cmd.payload
        log = Signal(2)
        m.d.comb += [
            log.eq(window_log2(a.pool)),
            cmd.ready.eq(~busy & ~scrubbing),
        ]
        m.d.comb += take.eq(cmd.valid & cmd.ready)
        with m.If(take):
            m.d.sync += [
                busy.eq(1), run.eq(0),
                acc_next.eq(a.acc_addr), req_left.eq(a.count), resp_index.eq(0),
                window_mask.eq((1 << log) - 1), out_addr.eq(a.ub_addr),
                out_left.eq(a.count >> log), func.eq(a.func), slot.eq(a.slot),
            ]
        with m.Elif(busy):
            m.d.sync += run.eq(params_ready)

        m.d.comb += [
            self.o_acc.addr.valid.eq(run & (req_left != 0)),
            self.o_acc.addr.payload.eq(acc_next),
            self.o_row.valid.eq(self.o_acc.data.valid),
            self.o_row.payload.data.eq(self.o_acc.data.payload),
            self.o_row.payload.last.eq((resp_index & window_mask) == window_mask),
            self.o_acc.data.ready.eq(self.o_row.ready),
            self.o_ub.valid.eq(self.i_out.valid),
            self.o_ub.payload.addr.eq(out_addr),
            self.i_out.ready.eq(self.o_ub.ready),
        ]
        for j in range(cfg.cols):
            m.d.comb += self.o_ub.payload.data[j].eq(self.i_out.payload[j])
        with m.If(self.o_acc.addr.valid & self.o_acc.addr.ready):
            m.d.sync += [acc_next.eq(acc_next + 1), req_left.eq(req_left - 1)]
        with m.If(self.o_row.valid & self.o_row.ready):
            m.d.sync += resp_index.eq(resp_index + 1)
        with m.If(self.o_ub.valid & self.o_ub.ready):
            m.d.sync += [out_addr.eq(out_addr + 1), out_left.eq(out_left - 1)]
            with m.If(out_left == 1):
                m.d.sync += [busy.eq(0), run.eq(0)]
        return m

    def _scalars_layout(self) -> data.StructLayout:
        p = self.i_param_write.payload
        return data.StructLayout({"shift": p.shift.shape(), "zero_point": p.zero_point.shape(),
                                  "clamp_hi": p.clamp_hi.shape()})

    def _scrub(self, m: Module, depth: int):
        """``(scrubbing, addr)``: after a reset, ``addr`` counts through ``depth`` words, one a
        cycle, while ``scrubbing``."""
        scrubbing = Signal(init=1)
        addr = Signal(range(depth))
        with m.If(scrubbing):
            m.d.sync += addr.eq(addr + 1)
            with m.If(addr == depth - 1):
                m.d.sync += scrubbing.eq(0)
        return scrubbing, addr

    def _row_store(self, m: Module, slot, func, busy, run, take):
        """Per-slot bias and multiplier rows and the scalars, each in a memory of its own, the
        slot's rows presented whole on ``o_params``."""
        cfg = self.config
        pw = self.i_param_write
        scalars = self._scalars_layout()
        row = param_row_beat(cfg.cols)
        # param_store="block": in block RAM, a read during a write of its slot left undefined
        # (it never happens while an ACTIVATE runs), so that yosys does not emulate it with
        # a register per bit (RegisteredRead: the form in which yosys honours that).
        attrs = ({"ram_style": "block", "no_rw_check": 1} if cfg.param_store == "block"
                 else None)
        m.submodules.bias_mem = bias_mem = memory.Memory(shape=row, depth=cfg.param_slots,
                                                         init=[], attrs=attrs)
        m.submodules.mult_mem = mult_mem = memory.Memory(shape=row, depth=cfg.param_slots,
                                                         init=[], attrs=attrs)
        m.submodules.scalar_mem = scalar_mem = memory.Memory(shape=scalars,
                                                             depth=cfg.param_slots, init=[],
                                                             attrs=attrs)
        bias_w, mult_w, scalar_w = (bias_mem.write_port(), mult_mem.write_port(),
                                    scalar_mem.write_port())
        bias_r, mult_r, scalar_r = (RegisteredRead(m, bias_mem, "bias"),
                                    RegisteredRead(m, mult_mem, "mult"),
                                    RegisteredRead(m, scalar_mem, "scalar"))

        scrubbing, scrub_slot = self._scrub(m, cfg.param_slots)
        # The fast pipeline writes a slot a cycle after the front end sends it, from
        # flip-flops: the write's address otherwise ends the front end's dispatch path. An
        # ACTIVATE taken the cycle after the last write still reads the slot it wrote (its
        # read is a cycle after it is taken).
        if cfg.pipeline == "fast":
            write_valid = Signal()
            p = Signal.like(pw.payload)
            m.d.sync += [write_valid.eq(pw.valid & pw.ready), p.eq(pw.payload)]
        else:
            write_valid, p = pw.valid, pw.payload
        with m.If(scrubbing):
            m.d.comb += [bias_w.en.eq(1), mult_w.en.eq(1), scalar_w.en.eq(1)]
            for port in (bias_w, mult_w, scalar_w):
                m.d.comb += port.addr.eq(scrub_slot)
        with m.Else():
            for port in (bias_w, mult_w, scalar_w):
                m.d.comb += port.addr.eq(p.slot)
            m.d.comb += [
                pw.ready.eq(1),
                bias_w.data.eq(p.row), mult_w.data.eq(p.row),
                scalar_w.data.shift.eq(p.shift),
                scalar_w.data.zero_point.eq(p.zero_point),
                scalar_w.data.clamp_hi.eq(p.clamp_hi),
                scalar_w.en.eq(write_valid & (p.kind == ParamKind.SCALARS)),
                bias_w.en.eq(write_valid & (p.kind == ParamKind.BIAS)),
                mult_w.en.eq(write_valid & (p.kind == ParamKind.MULTIPLIER)),
            ]

        scalar = scalar_r.data
        for port in (bias_r, mult_r, scalar_r):
            m.d.comb += port.addr.eq(slot)
        m.d.comb += [
            self.o_params.bias.eq(bias_r.data),
            self.o_params.multiplier.eq(mult_r.data),
            self.o_params.shift.eq(scalar.shift),
            self.o_params.zero_point.eq(scalar.zero_point),
            self.o_params.clamp_hi.eq(scalar.clamp_hi),
            self.o_params.func.eq(func),
        ]
        # The memories present the new slot a cycle after it is taken.
        return scrubbing, 1

    def _column_store(self, m: Module, slot, func, busy, run, take):
        """One 32-bit word per slot, column and kind (bias, multiplier) and one for the
        scalars, in one block RAM; the serial unit reads the words it needs on ``params``."""
        cfg = self.config
        pw = self.i_param_write
        p = pw.payload
        scalars = self._scalars_layout()
        # A word's address: its kind (0 bias, 1 multiplier, 2 the scalars, at column 0), its
        # column, its slot.
        col_bits = (cfg.cols - 1).bit_length()
        depth = cfg.param_slots << (col_bits + 2)

        def address(kind, col, slot_):
            return Cat(kind, col, slot_)

        def scalars_at(slot_):
            return address(Const(2, 2), Const(0, col_bits), slot_)

        m.submodules.param_mem = mem = memory.Memory(
            shape=unsigned(32), depth=depth, init=[],
            attrs={"ram_style": "block", "no_rw_check": 1})
        wr = mem.write_port()
        # A read that meets a write returns anything (no_rw_check): the words are written only
        # while no ACTIVATE runs, and the scalars are read only as one starts.
        rd = RegisteredRead(m, mem, "param")

        scrubbing, scrub_addr = self._scrub(m, depth)
        wcol = Signal(range(cfg.cols))          # the column of a row being written
        last_col = wcol == cfg.cols - 1
        with m.If(scrubbing):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(scrub_addr), wr.data.eq(0)]
        with m.Elif(p.kind == ParamKind.SCALARS):
            word = Signal(scalars)
            m.d.comb += [
                word.shift.eq(p.shift), word.zero_point.eq(p.zero_point),
                word.clamp_hi.eq(p.clamp_hi),
                pw.ready.eq(1),
                wr.en.eq(pw.valid),
                wr.addr.eq(scalars_at(p.slot)),
                wr.data.eq(word),
            ]
        with m.Else():
            # A row, a column a cycle; taken with its last column.
            m.d.comb += [
                pw.ready.eq(last_col),
                wr.en.eq(pw.valid),
                wr.addr.eq(address(Cat(p.kind == ParamKind.MULTIPLIER, 0), wcol, p.slot)),
                wr.data.eq(p.row[wcol]),
            ]
            with m.If(pw.valid):
                m.d.sync += wcol.eq(Mux(last_col, 0, wcol + 1))

        # While an ACTIVATE waits to run, its scalars are read (``fetched`` in the cycle the
        # word arrives) into a register; while it runs, the unit's selection.
        fetched = Signal()
        with m.If(take):
            m.d.sync += fetched.eq(0)
        with m.Elif(busy & ~run):
            m.d.sync += fetched.eq(1)
        sel = self.params
        with m.If(run):
            m.d.comb += rd.addr.eq(address(Cat(sel.multiplier, 0), sel.col, slot))
        with m.Else():
            m.d.comb += rd.addr.eq(scalars_at(slot))
        scalar = Signal(scalars, reset_less=True)
        with m.If(fetched & ~run):
            m.d.sync += scalar.eq(rd.data)
        m.d.comb += [
            sel.word.eq(rd.data),
            sel.shift.eq(scalar.shift),
            sel.zero_point.eq(scalar.zero_point),
            sel.clamp_hi.eq(scalar.clamp_hi),
            sel.func.eq(func),
        ]
        return scrubbing, fetched


def window_log2(pool):
    """log2 of the pooling window of ``pool`` (a :class:`~hdl.isa.Pool` value)."""
    return Mux(pool == Pool.MAX4, 2, Mux(pool == Pool.MAX2, 1, 0))
