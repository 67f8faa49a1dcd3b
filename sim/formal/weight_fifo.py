"""Proof of the weight FIFO (:class:`hdl.datapath.weight_fifo.WeightFIFO`): no row lost, duplicated
or
reordered, whole tiles only, under any valid/ready pattern.

The harness counts rows in and out (``stored``, and each side's position in its tile) and
checks, every cycle, on the ports:

- no overflow, no underflow: a row is accepted only with room for it, and one leaves only
  when one is stored;
- ``o_tiles`` is the number of whole tiles stored (``o_tiles * rows == stored + out_phase
  - in_phase``), so a tile is offered only once all its rows are in;
- within a tile, rows leave without gaps (``o_row.valid`` while a tile is partly read), and
  with ``rows >= 2`` a counted tile is offered at once (``o_tiles != 0`` implies
  ``o_row.valid``; one-row tiles are offered a cycle after they are counted);
- order: one row, picked by the solver at any time (a free ``pick`` input) among all rows
  ever written, leaves with its payload unchanged, after exactly the rows that were stored
  ahead of it, and at the same position in its tile. Since the pick is free and the payload
  free, this holds for every row: no loss, duplication or reordering;
- the stream rules: assumed on ``i_row``, asserted on ``o_row``.

For k-induction, auxiliary invariants tie the counts to the FIFO's counters and the picked
row to its place in the underlying ``BlockFIFO`` (its output register or its memory,
read through an extra port).
"""

from __future__ import annotations

from amaranth.asserts import AnySeq
from amaranth.hdl import Assert, Module, Mux, Signal

from hdl.datapath.weight_fifo import WeightFIFO
from sim.formal.harness import Harness, Inside, stream_rules

__all__ = ["weight_fifo_harness"]


def _wrap_inc(counter: Signal, modulus: int):
    return Mux(counter == modulus - 1, 0, counter + 1)


def weight_fifo_harness(*, rows: int = 2, cols: int = 1, data_width: int = 4, depth: int = 2,
                        registered: bool = False, count_bug: bool = False,
                        dut_class: type[WeightFIFO] = WeightFIFO) -> Harness:
    """Harness proving :class:`WeightFIFO` (see the module docstring).

    Parameters
    ----------
    rows, cols, data_width, depth
        The FIFO's parameters (``rows * depth >= 2``).
    registered : bool
        The FIFO with its output ring (``WeightFIFO(registered=True)``, ``rows * depth > 2``):
        the properties on the ports only, for a BMC (the invariants below follow the plain
        FIFO's BlockFIFO; a counted tile reaches the ring's output a cycle or two later).
    count_bug : bool
        Deliberately wrong count (one tile too many): the proof must fail. For the tests.
    dut_class : type
        The design under test: :class:`WeightFIFO`, or a deliberately broken variant (tests).
    """
    capacity = rows * depth
    if capacity < 2:
        raise ValueError("the proof follows BlockFIFO's memory: rows * depth >= 2")
    dut = dut_class(rows=rows, cols=cols, data_width=data_width, depth=depth,
                    registered=registered)

    def properties(m: Module, fifo: WeightFIFO, inside: Inside) -> None:
        stream_rules(m, fifo.i_row, side="env")
        stream_rules(m, fifo.o_row, side="dut")
        take_in = Signal(name="take_in")
        take_out = Signal(name="take_out")
        m.d.comb += [
            take_in.eq(fifo.i_row.valid & fifo.i_row.ready),
            take_out.eq(fifo.o_row.valid & fifo.o_row.ready),
        ]

        # Counts: rows stored, and where each side is in its tile.
        stored = Signal(range(capacity + 1), name="stored")
        in_phase = Signal(range(rows), name="in_phase")
        out_phase = Signal(range(rows), name="out_phase")
        m.d.sync += stored.eq(stored + take_in - take_out)
        with m.If(take_in):
            m.d.sync += in_phase.eq(_wrap_inc(in_phase, rows))
        with m.If(take_out):
            m.d.sync += out_phase.eq(_wrap_inc(out_phase, rows))

        whole = stored + out_phase - in_phase + (rows if count_bug else 0)
        m.d.comb += [
            Assert(stored <= capacity, "never more rows than the capacity"),
            Assert(~take_in | (stored != capacity), "no overflow: a row accepted when full"),
            Assert(~take_out | (stored != 0), "no underflow: a row out of an empty FIFO"),
            Assert(fifo.o_tiles * rows == whole, "o_tiles counts the whole tiles stored"),
            Assert((out_phase == 0) | fifo.o_row.valid, "no gap within a tile"),
        ]
        if rows >= 2 and not registered:
            # With one-row tiles, o_tiles counts a tile a cycle before BlockFIFO
            # offers it (its read latency); with more rows, the first row is there in time.
            m.d.comb += Assert((fifo.o_tiles == 0) | fifo.o_row.valid,
                               "a counted tile is offered")

        # Order: follow one picked row through the FIFO.
        pick = Signal(name="pick")
        tracking = Signal(name="tracking")
        picked = Signal.like(fifo.i_row.payload.as_value(), name="picked", reset_less=True)
        picked_phase = Signal(range(rows), name="picked_phase", reset_less=True)
        ahead = Signal(range(capacity), name="ahead")    # rows to leave before the picked one
        m.d.comb += pick.eq(AnySeq(1))
        with m.If(tracking & take_out):
            with m.If(ahead == 0):
                m.d.comb += [
                    Assert(fifo.o_row.payload.as_value() == picked, "rows leave unchanged"),
                    Assert(out_phase == picked_phase, "rows keep their place in the tile"),
                ]
                m.d.sync += tracking.eq(0)
            with m.Else():
                m.d.sync += ahead.eq(ahead - 1)
        with m.If(take_in & pick & ~tracking):
            m.d.sync += [
                tracking.eq(1),
                picked.eq(fifo.i_row.payload.as_value()),
                picked_phase.eq(in_phase),
                ahead.eq(stored - take_out),
            ]
        m.d.comb += Assert(~tracking | (ahead < stored), "the picked row is still stored")

        if registered:
            return
        # Invariants on the internal state, for induction: the FIFO's tile counters are the
        # harness's, its level is `stored`, and the picked row is where `ahead` says: in the
        # output register (r_data, when r_rdy) or in the memory behind it.
        r_rdy = inside.signal("rows.r_rdy")
        inner_depth = capacity - 1
        slot = Signal(range(2 * inner_depth), name="picked_slot")
        m.d.comb += slot.eq(inside.signal("rows.consume") + ahead - r_rdy)
        addr = Mux(slot >= inner_depth, slot - inner_depth, slot)
        in_memory = inside.memory("rows.storage", addr)
        m.d.comb += [
            Assert((in_phase < rows) & (out_phase < rows), "tile positions in range"),
            Assert(inside.signal("written") == in_phase, "written counts rows in the tile"),
            Assert(inside.signal("read") == out_phase, "read counts rows out of the tile"),
            Assert(inside.signal("rows.level") == stored, "the row FIFO holds `stored` rows"),
            Assert(~tracking | ((out_phase + ahead) % rows == picked_phase),
                   "the picked row's place in its tile"),
            Assert(~(tracking & r_rdy & (ahead == 0)) |
                   (inside.signal("rows.r_data") == picked),
                   "the picked row, next out, is in the output register"),
            Assert(~(tracking & (ahead >= r_rdy)) | (in_memory == picked),
                   "the picked row is in memory `ahead` places behind the head"),
        ]

    return Harness(dut, properties, reset="any")
