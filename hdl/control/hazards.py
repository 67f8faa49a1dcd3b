"""The hazard tracker: which unfinished instruction a new one must wait for."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.isa import Instr, Opcode
from hdl.lib.compare import greater_than

__all__ = ["HazardTracker", "HazardQuerySignature", "MATMUL_SLOTS", "ADDR_END_BITS",
           "HAZARD_RULES"]

#: MATMULs that may be in flight at once (issuing, in the array, or being accumulated), unless
#: a configuration says otherwise (:attr:`~hdl.config.TPUConfig.matmul_slots`).
MATMUL_SLOTS = 4

#: Width of an exclusive range end: an address field plus a count field can carry.
ADDR_END_BITS = max(data.Layout.cast(Instr)[f].width for f in ("a", "b", "count")) + 1


#: The rules, one bit each of ``o_rules``: ``<waiting instruction>_<kind>_<unfinished one>``
#: (kind: raw = read after write, war = write after read, waw = write after write; the
#: memory is the unified buffer unless named).
HAZARD_RULES = (
    "read_host_war_matmul",         # READ_HOST writes buffer rows a MATMUL reads
    "read_host_waw_activate",       # ... an ACTIVATE writes
    "read_host_war_write_host",     # ... a WRITE_HOST reads
    "write_host_raw_activate",      # WRITE_HOST reads buffer rows an ACTIVATE writes
    "load_weights_war_read_weights",  # LOAD_WEIGHTS writes tiles a READ_WEIGHTS reads
    "matmul_raw_activate",          # MATMUL reads buffer rows an ACTIVATE writes
    "matmul_war_activate_acc",      # MATMUL writes accumulator rows an ACTIVATE reads
    "activate_raw_matmul_acc",      # ACTIVATE reads accumulator rows a MATMUL writes
    "activate_war_matmul",          # ACTIVATE writes buffer rows a MATMUL reads
    "activate_war_write_host",      # ... a WRITE_HOST reads
    "ub_to_weights_raw_activate",   # UB_TO_WEIGHTS reads buffer rows an ACTIVATE writes
    "ub_to_weights_war_read_weights",  # ... writes a tile a READ_WEIGHTS reads
)


class HazardQuerySignature(wiring.Signature):
    """The front end asks whether the instruction it holds may issue, and says when it does.

    Members
    -------
    instr : Out(Instr)
        The instruction word at the front end.
    a_end, b_end : Out(ADDR_END_BITS)
        The exclusive ends of its ranges, ``a + count`` and ``b`` plus the rows at ``b``
        (``count``; an ACTIVATE's ``count`` over its pooling window), as the front end
        computes them for its range checks (registered along with ``instr`` but with the
        ``"reference"`` pipeline), so that no adder starts the tracker's compares.
    dispatch : Out(1)
        The instruction issues this cycle (the tracker records its ranges).
    hazard : In(1)
        The instruction conflicts with an unfinished one and must wait.
    hazard_late : In(1)
        ``hazard`` a cycle later, from the rules' answers registered (a tracker built with
        ``late=True``, for ``pipeline="fast"``: no range compare runs into the
        dispatch); low otherwise.
    """

    def __init__(self):
        super().__init__({
            "instr":       Out(Instr),
            "a_end":       Out(ADDR_END_BITS),
            "b_end":       Out(ADDR_END_BITS),
            "dispatch":    Out(1),
            "hazard":      In(1),
            "hazard_late": In(1),
        })


class _Range:
    """A tracked half-open range ``[lo, hi)``; with *trees*, its compares are LUT trees
    (:func:`~hdl.lib.compare.greater_than`) instead of carry chains."""

    def __init__(self, name: str, width: int, trees: bool = False):
        self.valid = Signal(name=f"{name}_valid")
        self.lo = Signal(width, name=f"{name}_lo")
        self.hi = Signal(width, name=f"{name}_hi")
        self.trees = trees

    def hits(self, lo, hi):
        if self.trees:
            width = len(self.lo)
            lo, hi = (Cat(v, Const(0, max(0, width - len(Value.cast(v)))))[:width]
                      for v in (lo, hi))
            return self.valid & greater_than(hi, self.lo) & greater_than(self.hi, lo)
        return self.valid & (self.lo < hi) & (lo < self.hi)

    def holds(self, x):
        """``x`` is in the range (a point: no ``x + 1`` needed)."""
        if self.trees:
            width = len(self.lo)
            x = Cat(x, Const(0, max(0, width - len(Value.cast(x)))))[:width]
            return self.valid & ~greater_than(self.lo, x) & greater_than(self.hi, x)
        return self.valid & (self.lo <= x) & (x < self.hi)

    def record(self, lo, hi):
        return [self.lo.eq(lo), self.hi.eq(hi)]


class HazardTracker(wiring.Component):
    """Records the unified-buffer, accumulator and weight-tile ranges of every unfinished
    instruction and tells the front end when its instruction must wait.

    Tracked (recorded at dispatch): each in-flight MATMUL (up to ``slots``, its
    buffer rows read and accumulator rows written, until ``i_matmul_retire`` retires the
    oldest), the running ACTIVATE (accumulator rows read, buffer rows written, while
    ``i_activate_busy``), the running WRITE_HOST (buffer rows read, while
    ``i_write_host_busy``) and the running READ_WEIGHTS (tiles read, while
    ``i_read_weights_busy``).

    Rules (``hazard``), for the instruction at the front end:

    - READ_HOST writes buffer rows: waits while a MATMUL or WRITE_HOST reads, or an ACTIVATE
      writes, any of them (write after read, write after write);
    - WRITE_HOST reads buffer rows: waits while an ACTIVATE writes any (read after write);
    - LOAD_WEIGHTS writes tiles: waits while a READ_WEIGHTS reads any (write after read);
    - MATMUL reads buffer rows and writes accumulator rows: waits while an ACTIVATE writes
      those buffer rows (read after write) or reads those accumulator rows (write after
      read);
    - ACTIVATE reads accumulator rows and writes buffer rows: waits while a MATMUL writes
      those accumulator rows (read after write) or reads those buffer rows (write after
      read), or a WRITE_HOST reads them (write after read);
    - UB_TO_WEIGHTS reads buffer rows and writes a tile: waits while an ACTIVATE writes
      those buffer rows (read after write) or a READ_WEIGHTS reads the tile (write after
      read).

    UB_TO_WEIGHTS runs to its end before the front end takes the next instruction, so no
    later instruction waits for it and it needs no range of its own here: a READ_WEIGHTS
    after it reads the tile it wrote, a READ_HOST or an ACTIVATE after it writes rows it
    has read.

    Two MATMULs never wait for each other (their accumulator writes land in order) and the
    engines run one ACTIVATE, one WRITE_HOST and one READ_WEIGHTS at a time. The rules hold
    a running instruction's whole range until its engine is done, so they do not depend on
    what the unified buffer returns when a read and a write of one row meet in a cycle.

    Parameters
    ----------
    end_bits : int
        Width of the recorded ranges and of the compares, 1 to :data:`ADDR_END_BITS` (the
        default, which covers every instruction). The tracker sees only the low
        ``end_bits`` bits of the address and count fields, so it is exact for instructions
        whose ranges (``a + count``; for MATMUL and ACTIVATE also ``b`` plus the rows at
        ``b``) end below ``2**end_bits``: on a configuration whose memories hold at most
        ``2**end_bits - 1`` rows and tiles, every instruction the front end dispatches (an
        instruction that fails its range checks is reported whatever the tracker says).
        The core passes :attr:`~hdl.config.TPUConfig.range_end_bits`: 17 bits -> 9 for
        256-row memories, about half the tracker's logic.
    slots : int
        MATMULs in flight the matrix engine allows (default :data:`MATMUL_SLOTS`, 1 to 8);
        the core passes :attr:`~hdl.config.TPUConfig.matmul_slots`.
    ub_to_weights : bool
        The core runs UB_TO_WEIGHTS (:attr:`~hdl.config.TPUConfig.ub_to_weights`); without
        it the instruction never reaches the tracker (an unknown opcode), and its two rules
        are constant low (their compares cost logic).
    sum_tables : bool
        The core runs MATMUL_LOOKUP (:attr:`~hdl.config.TPUConfig.sum_tables`): its ranges
        are a MATMUL's, and so are its rules (the MATMUL rules hold for either opcode).
    late : bool
        Also answer ``hazard_late``: a flip-flop more for each range compare and opcode a
        rule has (29 with four MATMUL slots).

    Members
    -------
    i_query : In(HazardQuerySignature())
        The front end's instruction, its dispatch, and the answer.
    i_matmul_retire : In(1)
        The oldest in-flight MATMUL has written its last accumulator row.
    i_activate_busy, i_write_host_busy, i_read_weights_busy : In(1)
        The engine still runs the instruction it took last.
    o_rules : Out(len(HAZARD_RULES))
        Which rules hold for the instruction at the front end (:data:`HAZARD_RULES` order;
        for coverage: ``hazard`` is their OR).
    """

    def __init__(self, *, end_bits: int = ADDR_END_BITS, slots: int = MATMUL_SLOTS,
                 late: bool = False, ub_to_weights: bool = True, sum_tables: bool = False):
        if not isinstance(end_bits, int) or not 1 <= end_bits <= ADDR_END_BITS:
            raise ValueError(f"end_bits={end_bits!r} is not supported; allowed: 1 to "
                             f"{ADDR_END_BITS}")
        if not isinstance(slots, int) or not 1 <= slots <= 8:
            raise ValueError(f"slots={slots!r} is not supported; allowed: 1 to 8")
        self.end_bits = end_bits
        self.slots = slots
        self.late = late
        self.ub_to_weights = ub_to_weights
        self.sum_tables = sum_tables
        super().__init__({
            "i_query":             In(HazardQuerySignature()),
            "i_matmul_retire":     In(1),
            "i_activate_busy":     In(1),
            "i_write_host_busy":   In(1),
            "i_read_weights_busy": In(1),
            "o_rules":             Out(len(HAZARD_RULES)),
        })

    def elaborate(self, platform):
        m = Module()
        q = self.i_query
        instr = q.instr
        op = instr.opcode
        width = self.end_bits
        slots = self.slots
        a, b = instr.a[:width], instr.b[:width]
        a_end, b_end = q.a_end[:width], q.b_end[:width]

        # With `late` (the build for Fmax) the compares are LUT trees: on the ECP5 a carry
        # chain's result leaves it through an extra cell, too slow into the hit registers.
        def tracked(name):
            return _Range(name, width, trees=self.late)

        mm_ub = [tracked(f"mm{i}_ub") for i in range(slots)]
        mm_acc = [tracked(f"mm{i}_acc") for i in range(slots)]
        act_acc, act_ub = tracked("act_acc"), tracked("act_ub")
        ho_ub, rw_tiles = tracked("ho_ub"), tracked("rw_tiles")
        m.d.comb += [
            act_acc.valid.eq(self.i_activate_busy),
            act_ub.valid.eq(self.i_activate_busy),
            ho_ub.valid.eq(self.i_write_host_busy),
            rw_tiles.valid.eq(self.i_read_weights_busy),
        ]

        # Record at dispatch.
        head = Signal(range(slots))
        tail = Signal(range(slots))
        with m.If(q.dispatch):
            with m.Switch(op):
                with m.Case(*((Opcode.MATMUL, Opcode.MATMUL_LOOKUP) if self.sum_tables
                              else (Opcode.MATMUL,))):
                    for i in range(slots):
                        with m.If(tail == i):
                            m.d.sync += [mm_ub[i].valid.eq(1), *mm_ub[i].record(a, a_end),
                                         mm_acc[i].valid.eq(1), *mm_acc[i].record(b, b_end)]
                    m.d.sync += tail.eq(Mux(tail == slots - 1, 0, tail + 1))
                with m.Case(Opcode.ACTIVATE):
                    m.d.sync += [*act_acc.record(a, a_end), *act_ub.record(b, b_end)]
                with m.Case(Opcode.WRITE_HOST):
                    m.d.sync += ho_ub.record(a, a_end)
                with m.Case(Opcode.READ_WEIGHTS):
                    m.d.sync += rw_tiles.record(a, a_end)
        with m.If(self.i_matmul_retire):
            for i in range(slots):
                with m.If(head == i):
                    m.d.sync += [mm_ub[i].valid.eq(0), mm_acc[i].valid.eq(0)]
            m.d.sync += head.eq(Mux(head == slots - 1, 0, head + 1))

        # The rules: each the opcode and the OR of range hits (a MATMUL's over its slots).
        def hits(ranges, lo, hi):
            return [r.hits(lo, hi) for r in ranges]

        rules = {
            "read_host_war_matmul":          (Opcode.READ_HOST, hits(mm_ub, a, a_end)),
            "read_host_waw_activate":        (Opcode.READ_HOST, hits([act_ub], a, a_end)),
            "read_host_war_write_host":      (Opcode.READ_HOST, hits([ho_ub], a, a_end)),
            "write_host_raw_activate":       (Opcode.WRITE_HOST, hits([act_ub], a, a_end)),
            "load_weights_war_read_weights": (Opcode.LOAD_WEIGHTS,
                                              hits([rw_tiles], a, a_end)),
            "matmul_raw_activate":           (Opcode.MATMUL, hits([act_ub], a, a_end)),
            "matmul_war_activate_acc":       (Opcode.MATMUL, hits([act_acc], b, b_end)),
            "activate_raw_matmul_acc":       (Opcode.ACTIVATE, hits(mm_acc, a, a_end)),
            "activate_war_matmul":           (Opcode.ACTIVATE, hits(mm_ub, b, b_end)),
            "activate_war_write_host":       (Opcode.ACTIVATE, hits([ho_ub], b, b_end)),
            "ub_to_weights_raw_activate":    (Opcode.UB_TO_WEIGHTS,
                                              hits([act_ub], a, a_end)),
            "ub_to_weights_war_read_weights": (Opcode.UB_TO_WEIGHTS,
                                               [rw_tiles.holds(b)]),
        }
        assert tuple(rules) == HAZARD_RULES
        # Without UB_TO_WEIGHTS its rules are left out (their o_rules bits stay low), so that
        # the tracker is the one built before the instruction existed.
        built = {name: rule for name, rule in rules.items()
                 if self.ub_to_weights or not name.startswith("ub_to_weights")}
        def is_op(opcode):      # MATMUL_LOOKUP is a MATMUL here
            if opcode == Opcode.MATMUL and self.sum_tables:
                return (op == Opcode.MATMUL) | (op == Opcode.MATMUL_LOOKUP)
            return op == opcode

        for i, name in enumerate(HAZARD_RULES):
            if name in built:
                opcode, hit = built[name]
                m.d.comb += self.o_rules[i].eq(is_op(opcode) & Cat(*hit).any())
        m.d.comb += q.hazard.eq(self.o_rules.any())
        rules = built
        if self.late:
            # hazard_late is o_rules' OR a cycle later. What is registered is each range's
            # hit (a carry-chain compare and a LUT) and the opcode's decode; the OR over the
            # slots, the opcodes and the rules comes after the registers (registering the
            # rules would put the compares, the slots' OR and the opcode's in one cycle).
            late = []
            is_q = {}
            for opcode, hit in rules.values():
                if opcode not in is_q:
                    is_q[opcode] = Signal(name=f"is_{opcode.name.lower()}_q")
                    m.d.sync += is_q[opcode].eq(is_op(opcode))
                hit_q = Signal(len(hit), name=f"hit_q{len(late)}")
                m.d.sync += hit_q.eq(Cat(*hit))
                late.append(is_q[opcode] & hit_q.any())
            m.d.comb += q.hazard_late.eq(Cat(*late).any())
        return m
