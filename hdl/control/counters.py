"""Performance counters in TPU v1's Table 3 categories."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..isa import COUNTER_BITS, COUNTERS
from ..ports import CounterEventsSignature

__all__ = ["PerfCounters"]


class PerfCounters(wiring.Component):
    """:data:`hdl.isa.COUNTERS`, each ``width`` bits wide and wrapping.

    Contract: every counter counts from reset or the last ``clear`` event (which wins over
    the cycle's other events); ``cycles`` counts every cycle, ``useful_macs`` adds
    ``macs_per_row`` for each ``array_active`` cycle, ``non_matrix`` counts the cycles with
    ``other_work`` and no ``array_active``; the others count the cycles their event is high.

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
        Which counter ``o_value`` shows (:data:`~hdl.isa.COUNTERS` order).
    o_value : Out(COUNTER_BITS)
        The selected counter's value (combinational).
    """

    def __init__(self, *, macs_per_row: int, width: int = COUNTER_BITS):
        if not 1 <= width <= COUNTER_BITS:
            raise ValueError(f"counter width {width} is not supported; allowed: 1 to "
                             f"{COUNTER_BITS}")
        self.macs_per_row = macs_per_row
        self.width = width
        super().__init__({
            "i_events": In(CounterEventsSignature()),
            "i_select": In(range(len(COUNTERS))),
            "o_value":  Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        ev = self.i_events
        bumps = {
            "cycles":       (1, 1),
            "instructions": (ev.instructions, 1),
            "array_active": (ev.array_active, 1),
            "useful_macs":  (ev.array_active, self.macs_per_row),
            "weight_stall": (ev.weight_stall, 1),
            "weight_shift": (ev.weight_shift, 1),
            "non_matrix":   (ev.other_work & ~ev.array_active, 1),
            "raw_stall":    (ev.raw_stall, 1),
            "host_stall":   (ev.host_stall, 1),
        }
        # useful_macs is array_active times macs_per_row (one event, one clear, both wrap at
        # 2**width): for a power of two, array_active shifted rather than a counter of its own.
        derived = self.macs_per_row & (self.macs_per_row - 1) == 0
        counters = {}
        for name in COUNTERS:
            if name == "useful_macs" and derived:
                continue
            counter = Signal(self.width, name=f"count_{name}")
            event, amount = bumps[name]
            with m.If(ev.clear):
                m.d.sync += counter.eq(0)
            with m.Elif(event):
                m.d.sync += counter.eq(counter + amount)
            counters[name] = counter
        if derived:
            log2 = self.macs_per_row.bit_length() - 1
            counters["useful_macs"] = (counters["array_active"] << log2)[:self.width]
        counters = [counters[name] for name in COUNTERS]
        m.d.comb += self.o_value.eq(Cat(*counters).word_select(self.i_select, self.width))
        return m
