"""The matrix engine's buffer reads and array rows, window mode or not: a proof of the address
sequence and of the windows (:class:`hdl.isa.Matmul`, :attr:`hdl.config.TPUConfig.conv_windows`).

For every MATMUL the front end can dispatch (``count`` not zero, its accumulator rows and the
rows it reads inside their memories, ``lane < ub_row`` with ``window``; any ``step`` 0 to 15,
any ``ub_addr``), with every other input free (stalls on the read port's address and data
streams and on the array's ready, MATMULs back to back):

(a) the engine reads buffer rows ``ub_addr, ub_addr + 1, ...`` in order, exactly
    :func:`~hdl.isa.window_rows` of them (``count`` for a plain MATMUL): a read only while the
    MATMUL has windows left and never past the last row of the window being formed, and by
    the time its last window is issued every row to that window's last row has been read
    (windows only move forward, so together: the rows to the last window's end, each once);
    no window more than ``count``, and the next MATMUL only after the last;
(b) the ``i``-th row a window MATMUL sends to the array is elements ``lane + i*step ..
    lane + i*step + rows - 1`` of the rows it read, taken as one run (``ub_row`` elements a
    row, row ``ub_addr``'s element 0 first): rows in the order issued, each once, each
    element the one the ISA names;
(c) a plain MATMUL (``window`` clear, ``lane`` and ``step`` then any value) is the same with
    ``lane`` 0 and ``step = ub_row``: row ``i`` is the first ``rows`` elements of buffer row
    ``ub_addr + i``.

The buffer's data is free: the solver picks one read (its number ``S`` since the reset,
modulo ``2**SEQ_BITS``), one lane ``E`` and one value ``V`` (``AnyConst``), and assumes only
that the row the memory returns for that read has ``V`` in lane ``E``; an element of an array
row that the ISA says is that element must then be ``V``. As ``S``, ``E`` and ``V`` are any,
every element sent is the one read, whatever the memory holds (so never a copy of the same
address read by an earlier MATMUL). Reads ``2**SEQ_BITS`` apart share the tracked lane: the
engine holds two rows read before the one arriving and reads at most four ahead of it, and
that is all a read's number has to tell apart.

A reference in the harness follows each MATMUL from the cycle it is taken: the next address,
the next window's first element (``lane + i*step``, from the run's start), the windows left.
Each token the engine queues gets a ghost entry beside its token FIFO: the window it must
become (the read and lane of its first element) and its place among the windows, so that the
rows at the array are checked against the reference, not against the engine's own tokens.
Auxiliary invariants (through :class:`sim.formal.harness.Inside`) tie the engine's counters,
token FIFO and kept rows to the reference for k-induction.

Two proofs, so that each closes in seconds (together, one took minutes): ``part="reads"``
proves (a) and the invariants of the issue side (the engine's ``left``, ``win_row``,
``lane``, ``step``, ``ub_next`` against the reference), assuming nothing of the other part;
``part="rows"`` proves (b) and (c) and the invariants of the token FIFO and the kept rows,
assuming the first part's properties, which hold in every reachable state once it is proved
(the same harness, so the same states).
"""

from __future__ import annotations

from typing import Literal

from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Assume, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data

from hdl.config import TPUConfig
from hdl.control.matrix_engine import MatrixEngine
from hdl.isa import Opcode
from hdl.ports import addr_bits
from sim.formal.harness import Harness, Inside

__all__ = ["matrix_windows_harness", "token_layout", "TOKENS", "SEQ_BITS"]

#: Entries of the matrix engine's token FIFO (``meta_a``).
TOKENS = 4
#: Bits of a read's number: reads run at most TOKENS ahead of the one arriving, and the
#: engine keeps the two before it.
SEQ_BITS = 4
#: Bits of the harness's window counters (modulo 8: at most TOKENS windows in the FIFO).
WINDOW_BITS = 3

Part = Literal["reads", "rows"]


def token_layout(me: MatrixEngine) -> data.StructLayout:
    """A token of the engine's ``meta_a`` FIFO, as :mod:`hdl.control.matrix_engine` lays it
    out (the harness checks the width against the FIFO's)."""
    return data.StructLayout({"switch": 1, "signed": 1, "accumulate": 1,
                              **({"lookup": 1, "table": 1} if me.config.sum_tables else {}),
                              **({"gap": 1} if me.acc_gap else {}),
                              "read": 1, "emit": 1, "offset": range(me.config.ub_row),
                              "acc": unsigned(me.acc_bits)})


def matrix_windows_harness(config: TPUConfig, part: Part, *, invariants: bool = True,
                           dut_class: type = MatrixEngine) -> Harness:
    """The address sequence (``part="reads"``) or the rows sent (``part="rows"``) of
    :class:`MatrixEngine` (module docstring). *config* must build the window mode, with the
    reference or compact pipeline (whose token FIFO is unbuffered). ``invariants=False``:
    without the auxiliary invariants, for a bounded check of the contract alone (a broken
    engine's counterexample then fails (a), (b) or (c), not an invariant). *dut_class*: a
    broken engine, for the proof's own tests."""
    cfg = config
    if part not in ("reads", "rows"):
        raise ValueError(f"part must be 'reads' or 'rows', not {part!r}")
    if not cfg.conv_windows:
        raise ValueError("matrix_windows_harness needs a configuration with conv_windows")
    if cfg.pipeline == "fast":
        raise ValueError("matrix_windows_harness reads the unbuffered token FIFO: pipeline "
                         "'reference' or 'compact', not 'fast'")
    rows, ub_row, width = cfg.rows, cfg.ub_row, cfg.data_width
    lg = ub_row.bit_length() - 1
    if lg == 0:
        raise ValueError("matrix_windows_harness needs ub_row of at least 2")
    ub_bits = addr_bits(cfg.ub_depth)
    # Where the shifter's window input begins in the pair of rows: a window's first element
    # at place `first + offset`.
    first = ub_row - rows + 1

    def properties(m: Module, me: MatrixEngine, inside: Inside) -> None:
        # The other part's properties are assumed (the reads' by "rows"), or left out; without
        # `invariants`, so are the auxiliary invariants.
        def check(mine: bool, invariant: bool = False):
            if invariant and not invariants:
                return lambda *args: []
            if mine:
                return Assert
            return Assume if part == "rows" else (lambda *args: [])

        reads_check, rows_check = check(part == "reads"), check(part == "rows")
        reads_invariant = check(part == "reads", invariant=True)
        rows_invariant = check(part == "rows", invariant=True)

        cmd, ub, act = me.i_matmul, me.o_ub, me.o_act
        p = cmd.payload
        take = cmd.valid & cmd.ready
        fire_addr = ub.addr.valid & ub.addr.ready
        fire_data = ub.data.valid & ub.data.ready
        fire_act = act.valid & act.ready

        def seq(value, name: str) -> Signal:        # a read's number
            s = Signal(SEQ_BITS, name=name)
            m.d.comb += s.eq(value)
            return s

        def lane_of(row, lane) -> Value:
            return Value.cast(row).word_select(lane, width)

        # What the front end dispatches (its BAD_FIELD, UB_RANGE and ACC_RANGE checks).
        # (A MATMUL_LOOKUP's `table` is where `window` is: it reads as a plain MATMUL.)
        window_in = p.window
        if cfg.sum_tables:
            window_in = p.window & (p.opcode != Opcode.MATMUL_LOOKUP)
        lane_in = Mux(window_in, p.lane, 0)            # a plain MATMUL: lane 0, step ub_row
        step_in = Mux(window_in, p.step, ub_row)
        count_in = p.count[:addr_bits(cfg.acc_depth) + 1]   # (at most acc_depth, below)
        last_in = Signal(range(cfg.acc_depth * 16 + 16 + rows), name="last_element_in")
        rows_in = Signal(range(cfg.acc_depth * 16 + 16 + rows), name="rows_read_in")
        m.d.comb += [
            last_in.eq(lane_in + (count_in - 1) * step_in + rows - 1),
            rows_in.eq(Mux(window_in, (last_in >> lg) + 1, count_in)),
            Assume(~cmd.valid | ((p.count != 0) & (p.acc_addr + p.count <= cfg.acc_depth) &
                                 (p.ub_addr + rows_in <= cfg.ub_depth) &
                                 (~window_in | (p.lane < ub_row)))),
        ]

        # The memory: reads answered in order, each at least a cycle after it was sent; read
        # `tracked` has `tracked_value` in lane `tracked_lane`, every other element is free.
        tracked = Signal(SEQ_BITS, name="tracked_read")
        tracked_lane = Signal(lg, name="tracked_lane")
        tracked_value = Signal(width, name="tracked_value")
        m.d.comb += [tracked.eq(AnyConst(SEQ_BITS)), tracked_lane.eq(AnyConst(lg)),
                     tracked_value.eq(AnyConst(width))]
        issued = Signal(SEQ_BITS, name="reads_issued")
        answered = Signal(SEQ_BITS, name="reads_answered")
        m.d.sync += [issued.eq(issued + fire_addr), answered.eq(answered + fire_data)]
        outstanding = seq(issued - answered, "reads_outstanding")
        m.d.comb += [
            Assume(~ub.data.valid | (outstanding != 0)),
            Assume(~(ub.data.valid & (answered == tracked)) |
                   (lane_of(ub.data.payload, tracked_lane) == tracked_value)),
        ]

        # The reference: the MATMUL being issued (its ub_addr, step, the next window's first
        # element from the run's start, the windows left, the next row to read and the row
        # after the last window issued, the number of its first read).
        iss_base = Signal(ub_bits, name="ref_ub_addr")
        iss_step = Signal(5, name="ref_step")
        iss_k = Signal(range(cfg.ub_depth * ub_row + 32), name="ref_first_element")
        iss_left = Signal(range(cfg.acc_depth + 1), name="ref_windows_left")
        iss_first = Signal(name="ref_first_window")
        iss_addr = Signal(ub_bits + 1, name="ref_next_addr")
        iss_from = Signal(ub_bits + 1, name="ref_rows_done")
        iss_seq0 = Signal(SEQ_BITS, name="ref_first_read")
        win_end = Signal(ub_bits + 8, name="ref_window_end")     # the window's last row
        m.d.comb += win_end.eq(iss_base + ((iss_k + rows - 1) >> lg))

        # The engine's token FIFO: its handshakes and entries.
        layout = token_layout(me)
        w_data = inside.input("meta_a.w_data")
        if len(w_data) != layout.size:
            raise ValueError(f"the matrix engine's token is {len(w_data)} bits, the harness's "
                             f"layout {layout.size}: update token_layout")
        token_in = data.View(layout, w_data)
        push = inside.input("meta_a.w_en") & inside.signal("meta_a.w_rdy")
        pop = inside.input("meta_a.r_en") & inside.signal("meta_a.r_rdy")
        push_emit = push & token_in.emit
        produce = inside.signal("meta_a.produce")
        consume = inside.signal("meta_a.consume")
        level = inside.signal("meta_a.level")

        # (a) The reads.
        with m.If(fire_addr):
            m.d.comb += [
                reads_check(iss_left != 0, "reads only for a MATMUL with windows left"),
                reads_check(ub.addr.payload == iss_addr,
                            "reads ub_addr, ub_addr + 1, ... in order"),
                reads_check(iss_addr <= win_end, "reads no row past the window being formed"),
            ]
        with m.If(push_emit):
            m.d.comb += reads_check(iss_left != 0, "issues count windows, no more")
            with m.If(iss_left == 1):
                m.d.comb += reads_check(iss_addr + fire_addr == win_end + 1,
                                        "the last window issued: every row to its end read")
        with m.If(take):
            m.d.comb += reads_check((iss_left == 0) | ((iss_left == 1) & push_emit),
                                    "takes a MATMUL once the last one's windows are issued")
            m.d.sync += [iss_base.eq(p.ub_addr), iss_step.eq(step_in), iss_k.eq(lane_in),
                         iss_left.eq(p.count), iss_first.eq(1), iss_addr.eq(p.ub_addr),
                         iss_from.eq(p.ub_addr), iss_seq0.eq(issued + fire_addr)]
        with m.Else():
            with m.If(fire_addr):
                m.d.sync += iss_addr.eq(iss_addr + 1)
            with m.If(push_emit):
                m.d.sync += [iss_k.eq(iss_k + iss_step), iss_left.eq(iss_left - 1),
                             iss_first.eq(0), iss_from.eq(win_end + 1)]

        # Invariants: the engine's issue state is the reference's; the windows left end
        # inside the buffer; the rows read reach the last window's end and at most the next
        # one's.
        busy = inside.signal("busy")
        m.d.comb += [
            reads_invariant(busy == (iss_left != 0), "busy while windows are left"),
            reads_invariant(inside.signal("left") == iss_left, "left: the windows left"),
            reads_invariant(iss_base <= iss_addr, "reads from ub_addr on"),
            reads_invariant(issued == seq(iss_seq0 + (iss_addr - iss_base), "ref_next_read"),
                        "the reads issued: the MATMUL's first read's number plus its rows"),
        ]
        with m.If(busy):
            last_row = Signal(ub_bits + 12, name="ref_last_row")
            before = iss_base + ((iss_k - iss_step + rows - 1) >> lg) + 1
            m.d.comb += [
                last_row.eq(iss_base + ((iss_k + (iss_left - 1) * iss_step + rows - 1) >> lg)),
                reads_invariant(last_row < cfg.ub_depth, "the windows left end inside the buffer"),
                reads_invariant(inside.signal("step") == iss_step, "step: the reference's"),
                reads_invariant(inside.signal("win_row") == (iss_base + (iss_k >> lg))[:ub_bits],
                            "win_row: the row of the next window's first element"),
                reads_invariant(inside.signal("lane") == iss_k[:lg],
                            "lane: the lane of the next window's first element"),
                reads_invariant(inside.signal("ub_next") == iss_addr[:ub_bits],
                            "ub_next: the next row to read"),
                reads_invariant((iss_from <= iss_addr) & (iss_addr <= win_end + 1),
                            "rows read: to the last window's end, at most the next one's"),
                reads_invariant(Mux(iss_first, (iss_from == iss_base) & (iss_k < ub_row),
                                (iss_k >= iss_step) & (iss_from == before)),
                            "the window before ends in the row before iss_from"),
            ]

        # Windows issued and sent (modulo 2**WINDOW_BITS).
        win_in = Signal(WINDOW_BITS, name="windows_issued")
        win_out = Signal(WINDOW_BITS, name="windows_sent")
        m.d.sync += [win_in.eq(win_in + push_emit), win_out.eq(win_out + fire_act)]

        # Ghost entries beside the token FIFO: the read a token's window ends in (its own, or
        # the last one before it), the window's first element (read and lane), and how many
        # windows were issued before it.
        g_read = [Signal(SEQ_BITS, name=f"ghost{a}_read") for a in range(TOKENS)]
        g_first = [Signal(SEQ_BITS, name=f"ghost{a}_first_read") for a in range(TOKENS)]
        g_lane = [Signal(lg, name=f"ghost{a}_first_lane") for a in range(TOKENS)]
        g_window = [Signal(WINDOW_BITS, name=f"ghost{a}_window") for a in range(TOKENS)]
        g_emit = [Signal(name=f"ghost{a}_emit") for a in range(TOKENS)]
        for a in range(TOKENS):
            with m.If(push & (produce == a)):
                m.d.sync += [g_read[a].eq(issued - 1 + token_in.read),
                             g_first[a].eq(iss_seq0 + (iss_k >> lg)),
                             g_lane[a].eq(iss_k[:lg]), g_window[a].eq(win_in),
                             g_emit[a].eq(token_in.emit)]

        # (b), (c) The rows sent: the oldest token's window, checked against its ghost entry.
        head = {name: Signal.like(ghost[0], name=f"head_{name}") for name, ghost in (
            ("read", g_first), ("lane", g_lane), ("window", g_window), ("emit", g_emit))}
        for a in range(TOKENS):
            with m.If(consume == a):
                m.d.comb += [head["read"].eq(g_first[a]), head["lane"].eq(g_lane[a]),
                             head["window"].eq(g_window[a]), head["emit"].eq(g_emit[a])]
        m.d.comb += [
            rows_check(~pop | (fire_act == head["emit"]),
                       "a window's token leaves as its row is sent, any other without a row"),
            rows_check(~fire_act | pop, "a row is sent only as its token leaves"),
        ]
        with m.If(fire_act):
            m.d.comb += rows_check(head["window"] == win_out,
                                   "rows reach the array in the order issued, each once")
            for r in range(rows):
                element = Signal(range(ub_row + rows), name=f"sent{r}_lane")
                m.d.comb += element.eq(head["lane"] + r)
                read = seq(head["read"] + (element >> lg), f"sent{r}_read")
                m.d.comb += rows_check(
                    ~((read == tracked) & (element[:lg] == tracked_lane)) |
                    (act.payload.data[r] == tracked_value),
                    f"element {r} of a row is element lane + i*step + {r} of the run read")

        # Invariants: the engine's last two rows received are reads answered - 1 and
        # answered - 2, once that many have come since the reset, and the current MATMUL's
        # rows received have.
        upper_real = Signal(name="upper_real")
        lower_real = Signal(name="lower_real")
        with m.If(fire_data):
            m.d.sync += [upper_real.eq(1), lower_real.eq(upper_real)]
        n_read = Signal(ub_bits + 1, name="ref_rows_read")
        n_received = Signal(ub_bits + 1, name="ref_rows_received")
        m.d.comb += [
            n_read.eq(iss_addr - iss_base),
            n_received.eq(Mux(n_read > outstanding, n_read - outstanding, 0)),
            rows_invariant(~lower_real | upper_real, "rows received in order"),
            rows_invariant((n_received == 0) | upper_real, "a row of the MATMUL received: upper"),
            rows_invariant((n_received < 2) | lower_real, "two rows of it received: lower too"),
            rows_invariant(~(upper_real & (seq(answered - 1, "upper_read") == tracked)) |
                       (lane_of(inside.signal("upper"), tracked_lane) == tracked_value),
                       "upper: the last row received"),
            rows_invariant(~(lower_real & (seq(answered - 2, "lower_read") == tracked)) |
                       (lane_of(inside.signal("lower"), tracked_lane) == tracked_value),
                       "lower: the row received before it"),
        ]

        # Invariants: each live token is its ghost entry's. Their reads are numbered in FIFO
        # order from the next answer to the last read issued, their windows from the next row
        # to send to the windows issued; a window's offset is its first element's place in
        # the pair of rows it ends in (the read before its own, or the last two), and those
        # rows are still to come or received since the reset.
        tokens = [data.View(layout, inside.memory("meta_a.storage", Const(a, 2)))
                  for a in range(TOKENS)]
        tail = Signal(2, name="token_tail")
        last_read = seq(issued - 1, "last_read")
        m.d.comb += tail.eq(produce - 1)
        with m.If(level == 0):
            m.d.comb += [rows_invariant(outstanding == 0, "no token: no read outstanding"),
                         rows_invariant(win_in == win_out, "no token: every window sent")]
        for a in range(TOKENS):
            token, prev = tokens[a], (a - 1) % TOKENS
            place = Signal(2, name=f"token{a}_place")
            m.d.comb += place.eq(a - consume)
            with m.If(place < level):
                m.d.comb += rows_invariant(g_emit[a] == token.emit,
                                       f"token {a}: a window exactly where the ghost's is")
                with m.If(consume == a):
                    m.d.comb += [
                        rows_invariant(g_read[a] == seq(answered - 1 + token.read, f"head{a}_read"),
                                   f"token {a}, the oldest: reads the next answer"),
                        rows_invariant(g_window[a] == win_out,
                                   f"token {a}, the oldest: the next window to send"),
                    ]
                with m.Else():
                    m.d.comb += [
                        rows_invariant(g_read[a] == seq(g_read[prev] + token.read, f"next{a}_read"),
                                   f"token {a}: reads the answer after the token before"),
                        rows_invariant(g_window[a] == (g_window[prev] + g_emit[prev])[:WINDOW_BITS],
                                   f"token {a}: the window after the token before"),
                    ]
                with m.If(tail == a):
                    m.d.comb += [
                        rows_invariant(g_read[a] == last_read,
                                       f"token {a}, the newest: the last read"),
                        rows_invariant(win_in == (g_window[a] + g_emit[a])[:WINDOW_BITS],
                                   f"token {a}, the newest: the windows issued"),
                    ]
                with m.If(token.emit):
                    high = g_first[a] == g_read[a]
                    low = g_first[a] == seq(g_read[a] - 1, f"token{a}_low_read")
                    age_high = seq(answered - g_read[a], f"token{a}_high_age")
                    age_low = seq(answered - g_read[a] + 1, f"token{a}_low_age")
                    m.d.comb += [
                        rows_invariant(high | low, f"token {a}: its window starts in its pair"),
                        rows_invariant(first + token.offset == Mux(high, ub_row + g_lane[a],
                                                               g_lane[a]),
                                   f"token {a}: offset is its first element's place in the pair"),
                        rows_invariant((age_high != 1) | upper_real,
                                   f"token {a}: its last row received since the reset"),
                        rows_invariant(~low | (((age_low != 1) | upper_real) &
                                           ((age_low != 2) | lower_real)),
                                   f"token {a}: its first row received since the reset"),
                    ]

    return Harness(dut_class(config), properties, reset="any")
