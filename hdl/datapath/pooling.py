"""The activation unit's max-pooling: a window's rows in two lanes, the larger one out.

A window's even rows (by their index in it) are pooled into lane A, its odd ones into lane
B, and the window's row is the larger of the two. A lane takes a row at most every other
cycle, so its loop is two stages: P1 compares the lane with the row (into a register), P2
keeps the larger (compare and multiplexer into the register's enable do not fit one cycle).
P3 and P4 take the larger lane of a window's row.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data

from hdl.lib.compare import greater_than
from hdl.lib.registers import register_copies

__all__ = ["pool_controls", "pool_column"]


def pool_controls(m: Module, valid, last, cols: int):
    """The pooling's controls from *valid* and *last*, the row in the stage before P1:
    ``(p1, closes, single)``, the row's controls in P1 (``valid``, ``odd``, ``later``), a
    copy per column (each drives only its column's multiplexers); whether the row in P1-P4
    closes its window; whether the window in P1-P2 is of one row (lane B holds none of it)."""
    # `odd` and `later` describe the row before P1: its index in the window is odd; it is 2
    # or more (its lane already holds one of the window's rows).
    odd = Signal()
    later = Signal()
    with m.If(valid):
        m.d.sync += [odd.eq(~odd & ~last), later.eq((later | odd) & ~last)]
    ctl = data.StructLayout({"valid": 1, "odd": 1, "later": 1})
    p1 = [data.View(ctl, copy) for copy in register_copies(
        m, Cat(valid, odd, later), cols, "pool_p1")]
    closes = [Signal(name=f"closes_p{i}") for i in range(1, 5)]   # row in P1-P4 closes
    single = [Signal(name=f"single_p{i}") for i in range(1, 3)]
    m.d.sync += [closes[0].eq(valid & last), closes[1].eq(closes[0]),
                 closes[2].eq(closes[1]), closes[3].eq(closes[2]),
                 single[0].eq(~odd & ~later), single[1].eq(single[0])]
    return p1, closes, single


def pool_column(m: Module, j: int, result, c, closes, single, out) -> None:
    """Column *j*'s pooling: P1 compares each lane with *result*, the row's value; P2 keeps
    the larger in the row's lane (*c*: the row's controls in P1); P3 and P4 put the larger
    lane of a window's row into *out* (*closes* and *single* from :func:`pool_controls`)."""
    def reg(shape, name):
        return Signal(shape, name=f"{name}_{j}", reset_less=True)

    lane_a, lane_b = reg(signed(8), "lane_a"), reg(signed(8), "lane_b")
    above_a, above_b = reg(1, "above_a"), reg(1, "above_b")    # the lane > the row
    row_p1 = reg(signed(8), "row_p1")
    m.d.sync += [above_a.eq(greater_than(lane_a, result)),
                 above_b.eq(greater_than(lane_b, result)),
                 row_p1.eq(result)]
    for lane, above_lane, lane_odd in ((lane_a, above_a, 0), (lane_b, above_b, 1)):
        with m.If(c.valid & (c.odd == lane_odd)):
            m.d.sync += lane.eq(Mux(c.later & above_lane, lane, row_p1))
    # P3 compares the two lanes (into a register, with copies of them: the next window's
    # rows may change them meanwhile), P4 takes the larger: compare and multiplexer do not
    # fit one cycle on the fast build.
    final_a, final_b = reg(signed(8), "final_a"), reg(signed(8), "final_b")
    a_wins = reg(1, "a_wins")
    with m.If(closes[1]):
        m.d.sync += [final_a.eq(lane_a), final_b.eq(lane_b),
                     a_wins.eq(single[1] | greater_than(lane_a, lane_b))]
    with m.If(closes[2]):
        m.d.sync += out.eq(Mux(a_wins, final_a, final_b))
