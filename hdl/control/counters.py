"""Performance counters in TPU v1's Table 3 categories."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.isa import COUNTER_BITS, COUNTERS
from hdl.ports import COUNTER_EVENTS, CounterEventsSignature

__all__ = ["PerfCounters", "RING"]

#: The counters the bank stores, in the order of its ring: every counter but
#: ``useful_macs``, which is ``array_active`` times ``macs_per_row``.
RING = tuple(name for name in COUNTERS if name != "useful_macs")


class PerfCounters(wiring.Component):
    """:data:`hdl.isa.COUNTERS`, each ``width`` bits wide and wrapping.

    Contract: every counter counts from reset or the last ``clear`` event (which wins over
    the cycle's other events); ``cycles`` counts every cycle, ``useful_macs`` adds
    ``macs_per_row`` for each ``array_active`` cycle, ``non_matrix`` counts the cycles with
    ``other_work`` and no ``array_active``; the others count the cycles their event is high.
    The events are registered as they arrive (they come late in the cycle, from the
    engines' handshakes), and registered again in the order of the ring (each is the carry
    into a counter's whole chain), so a value shown in cycle ``t`` counts the events up to
    cycle ``t - 3``.

    The counters of :data:`RING` move one place round a ring every cycle, each adding its
    event as it moves, and ``o_value`` shows the one at the ring's head: the counter
    ``i_select`` names is shown (``o_valid``) one cycle in every ``len(RING)`` = 8. A ring
    is much smaller than a multiplexer choosing any counter at any time (a small part's
    concern): it costs a few cells for its events, and a counter a cell a bit either way
    (each register loads its neighbour plus one, an increment on the carry chain).
    ``useful_macs`` is ``array_active`` times ``macs_per_row``, computed from
    it as it is shown (both wrap at ``2**width`` and clear together, so they are the same
    number).

    Parameters
    ----------
    macs_per_row : int
        Multiply-accumulates of one row through the array (``rows * cols``).
    width : int
        Bits of each counter, at most :data:`~hdl.isa.COUNTER_BITS` (``o_value`` is that
        wide, zero above ``width``).

    Members
    -------
    i_events : In(CounterEventsSignature())
        The events, one bit each.
    i_select : In(range(len(COUNTERS)))
        Which counter to show (:data:`~hdl.isa.COUNTERS` order).
    o_valid : Out(1)
        ``o_value`` is the selected counter's value in this cycle (from a register, at
        most ``len(RING)`` cycles after ``i_select`` changes).
    o_value : Out(COUNTER_BITS)
        The counter at the ring's head (combinational).
    """

    def __init__(self, *, macs_per_row: int, width: int = COUNTER_BITS):
        if not 1 <= width <= COUNTER_BITS:
            raise ValueError(f"counter width {width} is not supported; allowed: 1 to "
                             f"{COUNTER_BITS}")
        if not isinstance(macs_per_row, int) or macs_per_row < 1:
            raise ValueError(f"macs_per_row={macs_per_row!r} is not supported; allowed: a "
                             f"positive int")
        self.macs_per_row = macs_per_row
        self.width = width
        super().__init__({
            "i_events": In(CounterEventsSignature()),
            "i_select": In(range(len(COUNTERS))),
            "o_valid":  Out(1),
            "o_value":  Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        ev = SimpleNamespace(**{name: Signal(name=f"event_{name}") for name in COUNTER_EVENTS})
        for name in COUNTER_EVENTS:
            m.d.sync += getattr(ev, name).eq(getattr(self.i_events, name))
        counting = Signal()     # every cycle's event, registered as the others are
        m.d.sync += counting.eq(1)
        n = len(RING)
        assert n & (n - 1) == 0, "the ring's position wraps as a power of two"
        events = {
            "cycles":       counting,
            "instructions": ev.instructions,
            "array_active": ev.array_active,
            "weight_stall": ev.weight_stall,
            "weight_shift": ev.weight_shift,
            "non_matrix":   ev.other_work & ~ev.array_active,
            "raw_stall":    ev.raw_stall,
            "host_stall":   ev.host_stall,
        }
        ring = [Signal(self.width, name=f"count_{i}") for i in range(n)]
        # Place p holds counter RING[(p + head) % n]; next cycle it holds its neighbour's,
        # RING[(p + 1 + head) % n], plus that counter's event of this cycle.
        head = Signal(range(n))
        m.d.sync += head.eq(head + 1)
        event_bits = Cat(*(events[name] for name in RING))
        # The events in the order of the places they reach, registered (rotated for the
        # places' counters of the next cycle), so that the rotation's two LUT levels are not
        # in front of the wide increment.
        moved = Signal(n)
        m.d.sync += moved.eq(Cat(event_bits, event_bits).bit_select((head + 2)[:len(head)], n))
        clear = Signal()        # registered with the events it drops
        m.d.sync += clear.eq(ev.clear)
        for p in range(n):
            with m.If(clear):
                m.d.sync += ring[p].eq(0)
            with m.Else():
                m.d.sync += ring[p].eq(ring[(p + 1) % n] + moved[p])

        # Showing: the selected counter is at the head when its place in RING comes round.
        select = self.i_select
        place = Signal(range(n))
        for i, name in enumerate(COUNTERS):
            with m.If(select == i):
                m.d.comb += place.eq(RING.index("array_active" if name == "useful_macs"
                                                else name))
        macs = Signal(self.width)
        shown = ring[0]
        m.d.comb += macs.eq(sum(shown << b for b in range(self.macs_per_row.bit_length())
                                if self.macs_per_row >> b & 1))
        m.d.comb += [
            self.o_valid.eq(head == place),
            self.o_value.eq(Mux(select == COUNTERS.index("useful_macs"), macs, shown)),
        ]
        return m
