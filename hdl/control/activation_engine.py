"""The activation engine: ACTIVATE, accumulators -> activation unit -> unified buffer, and the
requantisation parameter store LOAD_PARAMS fills (:mod:`hdl.control.param_store`)."""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.beats import ub_row_beat
from hdl.config import TPUConfig
from hdl.control.param_store import column_store, param_write_layout, row_store, table_writer
from hdl.isa import Activate, Func, Pool
from hdl.layouts import acc_row_layout
from hdl.ports import (
    MemReadSignature,
    MemWriteSignature,
    ParamColumnSignature,
    addr_bits,
    requant_params_layout,
)

__all__ = ["ActivationEngine", "window_log2"]


class ActivationEngine(wiring.Component):
    """Runs ACTIVATE behind later instructions and holds the parameter slots.

    Contract: takes an ACTIVATE on ``i_activate`` while idle (once ready, it stays ready
    until it takes one); one cycle later (the
    parameter store presents the slot) reads accumulator rows ``acc_addr..`` in order into
    the activation unit, marking the last row of each pooling window, and writes each
    result row to the next unified-buffer row from ``ub_addr`` (``cols`` results, the rest
    of the row zero); ``o_busy`` is high from the cycle after it takes an instruction until
    its last row is written. ``o_params`` is the slot of the running ACTIVATE and its
    function. ``i_param_write`` is always ready and writes one part of a slot, or takes a
    LOAD_TABLE beat once its entries are written (the front end sends them only while no
    ACTIVATE runs). After a reset it first zeroes every slot
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
    o_table : Out(MemWriteSignature(8, unsigned(8)))
        With :attr:`~hdl.config.TPUConfig.lookup_table`: LOAD_TABLE's entries into the
        activation unit's table, one a cycle (:func:`~hdl.control.param_store.table_writer`;
        zeros to every entry after a reset, ``o_busy`` high meanwhile).
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
            **({"o_table": Out(MemWriteSignature(8, unsigned(8)))} if cfg.lookup_table
               else {}),
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
        # its slot's parameters are presented from the next cycle. LOAD_TABLE's beats go to
        # the table writer instead.
        pw = self.i_param_write
        if cfg.lookup_table:
            store_pw = stream.Signature(pw.payload.shape()).create()
            table_pw = stream.Signature(pw.payload.shape()).create()
            for part, chosen in ((store_pw, ~pw.payload.table), (table_pw, pw.payload.table)):
                m.d.comb += [part.payload.eq(pw.payload), part.valid.eq(pw.valid & chosen)]
            m.d.comb += pw.ready.eq(Mux(pw.payload.table, table_pw.ready, store_pw.ready))
            table_scrubbing = table_writer(m, cfg, table_pw, self.o_table)
        else:
            store_pw, table_scrubbing = pw, 0
        if self.column_store:
            scrubbing, params_ready = column_store(m, cfg, store_pw, self.params,
                                                   slot, func, busy, run, take)
        else:
            scrubbing, params_ready = row_store(m, cfg, store_pw, self.o_params,
                                                slot, func)
        scrubbing = scrubbing | table_scrubbing
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


def window_log2(pool):
    """log2 of the pooling window of ``pool`` (a :class:`~hdl.isa.Pool` value)."""
    return Mux(pool == Pool.MAX4, 2, Mux(pool == Pool.MAX2, 1, 0))
