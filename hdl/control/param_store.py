"""The requantisation parameter store: the slots LOAD_PARAMS fills and ACTIVATE reads, for
the activation engine, whole rows for the pipelined activation unit or a word at a time for
the serial one. After a reset either zeroes every slot before it takes a write."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory

from hdl.beats import param_row_beat
from hdl.config import TPUConfig
from hdl.isa import TABLE_ENTRIES, LoadParams, Rounding
from hdl.memory.row_memory import RegisteredRead
from hdl.ports import ColumnWord

__all__ = ["ParamKind", "param_write_layout", "row_store", "column_store", "table_writer"]

_LP = data.Layout.cast(LoadParams)


class ParamKind(enum.Enum, shape=unsigned(2)):
    """Which part of a parameter slot a write carries."""
    SCALARS    = 0   # shift, rounding, zero point, clamp_hi (from the LOAD_PARAMS word)
    BIAS       = 1   # the per-column bias row
    MULTIPLIER = 2   # the per-column multiplier row
    SHIFTS     = 3   # the per-column shift row (LOAD_PARAMS with column_shifts)


def param_write_layout(cols: int, slots: int) -> data.StructLayout:
    """One write into the parameter store, or (``table``) a beat of LOAD_TABLE's entries into
    the programmable table (``row``'s bytes; ``first``: its first beat, the entries restart
    at 0; the other fields unused)."""
    return data.StructLayout({
        "slot":       unsigned(max(1, (slots - 1).bit_length())),
        "kind":       ParamKind,
        "table":      1,
        "first":      1,
        "row":        param_row_beat(cols),
        "shift":      _LP["shift"].shape,
        "rounding":   Rounding,
        "column_shifts": 1,
        "zero_point": signed(_LP["zero_point"].width),
        "clamp_hi":   signed(_LP["clamp_hi"].width),
    })


def _scalars_layout(pw) -> data.StructLayout:
    p = pw.payload
    return data.StructLayout({"shift": p.shift.shape(), "rounding": Rounding,
                              "column_shifts": 1, "zero_point": p.zero_point.shape(),
                              "clamp_hi": p.clamp_hi.shape()})


def _scalars_of(p):
    """The scalar fields of a parameter write, as :func:`_scalars_layout` stores them (in its
    field order)."""
    return Cat(p.shift, p.rounding, p.column_shifts, p.zero_point, p.clamp_hi)


def _scrub(m: Module, depth: int):
    """``(scrubbing, addr)``: after a reset, ``addr`` counts through ``depth`` words, one a
    cycle, while ``scrubbing``."""
    scrubbing = Signal(init=1)
    addr = Signal(range(depth))
    with m.If(scrubbing):
        m.d.sync += addr.eq(addr + 1)
        with m.If(addr == depth - 1):
            m.d.sync += scrubbing.eq(0)
    return scrubbing, addr


def row_store(m: Module, cfg: TPUConfig, pw, o_params, slot, func):
    """Per-slot bias and multiplier rows and the scalars, each in a memory of its own, the
    slot's rows presented whole on *o_params* (the engine's port): ``(scrubbing,
    params_ready)``, as :func:`column_store`. *pw* is the engine's ``i_param_write``."""
    scalars = _scalars_layout(pw)
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
    # The shift of every column: the slot's scalar shift repeated, written with the scalars,
    # unless the LOAD_PARAMS brings a row of them.
    shifts = data.ArrayLayout(unsigned(6), cfg.cols)
    m.submodules.shift_mem = shift_mem = memory.Memory(shape=shifts, depth=cfg.param_slots,
                                                       init=[], attrs=attrs)
    bias_w, mult_w, scalar_w, shift_w = (bias_mem.write_port(), mult_mem.write_port(),
                                         scalar_mem.write_port(), shift_mem.write_port())
    bias_r, mult_r, scalar_r, shift_r = (RegisteredRead(m, bias_mem, "bias"),
                                         RegisteredRead(m, mult_mem, "mult"),
                                         RegisteredRead(m, scalar_mem, "scalar"),
                                         RegisteredRead(m, shift_mem, "shift"))

    scrubbing, scrub_slot = _scrub(m, cfg.param_slots)
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
        m.d.comb += [bias_w.en.eq(1), mult_w.en.eq(1), scalar_w.en.eq(1), shift_w.en.eq(1)]
        for port in (bias_w, mult_w, scalar_w, shift_w):
            m.d.comb += port.addr.eq(scrub_slot)
    with m.Else():
        for port in (bias_w, mult_w, scalar_w, shift_w):
            m.d.comb += port.addr.eq(p.slot)
        row_shifts = p.row.as_value()
        m.d.comb += [
            pw.ready.eq(1),
            bias_w.data.eq(p.row), mult_w.data.eq(p.row),
            scalar_w.data.eq(_scalars_of(p)),
            shift_w.data.eq(Mux(p.kind == ParamKind.SHIFTS,
                                Cat(*(row_shifts[32 * j:32 * j + 6] for j in range(cfg.cols))),
                                p.shift.replicate(cfg.cols))),
            scalar_w.en.eq(write_valid & (p.kind == ParamKind.SCALARS)),
            bias_w.en.eq(write_valid & (p.kind == ParamKind.BIAS)),
            mult_w.en.eq(write_valid & (p.kind == ParamKind.MULTIPLIER)),
            shift_w.en.eq(write_valid & ((p.kind == ParamKind.SHIFTS) |
                                         ((p.kind == ParamKind.SCALARS) & ~p.column_shifts))),
        ]

    scalar = scalar_r.data
    for port in (bias_r, mult_r, scalar_r, shift_r):
        m.d.comb += port.addr.eq(slot)
    m.d.comb += [
        o_params.bias.eq(bias_r.data),
        o_params.multiplier.eq(mult_r.data),
        o_params.shift.eq(shift_r.data),
        o_params.rounding.eq(scalar.rounding),
        o_params.zero_point.eq(scalar.zero_point),
        o_params.clamp_hi.eq(scalar.clamp_hi),
        o_params.func.eq(func),
    ]
    # The memories present the new slot a cycle after it is taken.
    return scrubbing, 1

def column_store(m: Module, cfg: TPUConfig, pw, sel, slot, func, busy, run, take):
    """One 32-bit word per slot, column and kind (bias, multiplier) and one for the
    scalars, in one block RAM; the serial unit reads the words it needs on *sel* (the
    engine's ``params``). *pw* is the engine's ``i_param_write``; *busy*, *run* and *take*
    its state. ``(scrubbing, params_ready)``: zeroing every word after a reset; while an
    ACTIVATE waits to run, its slot's parameters are presented from the next cycle."""
    p = pw.payload
    scalars = _scalars_layout(pw)
    # A word's address: its kind (ColumnWord: bias, multiplier, the scalars at column 0, a
    # column's shift), its column, its slot.
    col_bits = (cfg.cols - 1).bit_length()
    depth = cfg.param_slots << (col_bits + 2)

    def address(kind, col, slot_):
        return Cat(kind, col, slot_)

    def scalars_at(slot_):
        return address(Const(ColumnWord.SCALARS.value, 2), Const(0, col_bits), slot_)

    m.submodules.param_mem = mem = memory.Memory(
        shape=unsigned(32), depth=depth, init=[],
        attrs={"ram_style": "block", "no_rw_check": 1})
    wr = mem.write_port()
    # A read that meets a write returns anything (no_rw_check): the words are written only
    # while no ACTIVATE runs, and the scalars are read only as one starts.
    rd = RegisteredRead(m, mem, "param")

    scrubbing, scrub_addr = _scrub(m, depth)
    wcol = Signal(range(cfg.cols))          # the column of a row being written
    last_col = wcol == cfg.cols - 1
    with m.If(scrubbing):
        m.d.comb += [wr.en.eq(1), wr.addr.eq(scrub_addr), wr.data.eq(0)]
    with m.Elif(p.kind == ParamKind.SCALARS):
        word = Signal(scalars)
        m.d.comb += [
            word.eq(_scalars_of(p)),
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
            wr.addr.eq(address(Mux(p.kind == ParamKind.BIAS, ColumnWord.BIAS,
                                   Mux(p.kind == ParamKind.MULTIPLIER, ColumnWord.MULTIPLIER,
                                       ColumnWord.SHIFT)), wcol, p.slot)),
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
    with m.If(run):
        m.d.comb += rd.addr.eq(address(sel.kind, sel.col, slot))
    with m.Else():
        m.d.comb += rd.addr.eq(scalars_at(slot))
    scalar = Signal(scalars, reset_less=True)
    with m.If(fetched & ~run):
        m.d.sync += scalar.eq(rd.data)
    m.d.comb += [
        sel.word.eq(rd.data),
        sel.shift.eq(scalar.shift),
        sel.column_shifts.eq(scalar.column_shifts),
        sel.rounding.eq(scalar.rounding),
        sel.zero_point.eq(scalar.zero_point),
        sel.clamp_hi.eq(scalar.clamp_hi),
        sel.func.eq(func),
    ]
    return scrubbing, fetched


def table_writer(m: Module, cfg: TPUConfig, pw, tw):
    """LOAD_TABLE's beats (*pw*, the engine's ``i_param_write`` with ``table`` set) written
    into the programmable table an entry at a time (*tw*, the activation unit's ``i_table``,
    which takes one every cycle): a beat of ``4 * cols`` entries is taken as its last entry
    is written (every column's copy of the table has one write port, so the entries go one
    at a time; a whole table takes 256 cycles, once per program). After a reset it writes
    zeros to every entry first: ``scrubbing``, returned."""
    per_beat = 4 * cfg.cols
    p = pw.payload
    byte = Signal(range(per_beat))          # the beat's entry being written
    entry = Signal(range(TABLE_ENTRIES + per_beat))     # the table's next entry
    at = Signal.like(entry)
    last_byte = byte == per_beat - 1
    scrubbing = Signal(init=1)
    entries = p.row.as_value()
    m.d.comb += at.eq(Mux(p.first & (byte == 0), 0, entry))
    with m.If(scrubbing):
        m.d.comb += [tw.valid.eq(1), tw.payload.addr.eq(entry), tw.payload.data.eq(0)]
        with m.If(tw.ready):
            m.d.sync += entry.eq(entry + 1)
            with m.If(entry == TABLE_ENTRIES - 1):
                m.d.sync += scrubbing.eq(0)
    with m.Else():
        # Entries past 255 (a last beat's spare bytes) are dropped, a cycle each.
        inside = at < TABLE_ENTRIES
        m.d.comb += [
            tw.valid.eq(pw.valid & inside),
            tw.payload.addr.eq(at),
            tw.payload.data.eq(entries.word_select(byte, 8)),
            pw.ready.eq(last_byte & (tw.ready | ~inside)),
        ]
        with m.If(pw.valid & (tw.ready | ~inside)):
            m.d.sync += [byte.eq(Mux(last_byte, 0, byte + 1)), entry.eq(at + 1)]
    return scrubbing
