"""Stream rules of the engines the front end dispatches to (:mod:`hdl.control`).

For each engine, every stream it drives obeys the valid/ready rules (``valid`` is not
dropped and the payload does not change until the transfer) whenever every stream it
receives does (:func:`sim.formal.harness.all_stream_rules`, which also covers the ``addr`` and
``data`` streams inside a memory read client). Every other input is free, except for the
assumptions each harness states: what the engine's neighbours in :class:`hdl.core.Core`
guarantee (a memory answers only addresses it was sent; the activation unit returns a row
only for a window it was given; the front end dispatches only checked instructions and
offers a beat only while no WRITE_HOST runs).

Each harness also checks the engine's side of the contracts the hazard and front-end proofs
assume of it: ``o_busy`` rises only in the cycle after the engine takes an instruction (or
after a reset), the engine takes one only while not busy, its ``ready`` does not fall
unless it takes an instruction (with the compact and fast pipelines the front end issues on
last cycle's ready), and the matrix engine retires only MATMULs in flight, never holds more than
:attr:`~hdl.config.TPUConfig.matmul_slots`, and its ``o_idle`` does not fall unless it takes
one (SYNC, HALT and the counter instructions wait on it).

Auxiliary invariants on the engines' counters (through :class:`sim.formal.harness.Inside`) make
k-induction close.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Const, Module, Mux, Signal

from hdl.config import TPUConfig
from hdl.control.activation_engine import ActivationEngine, window_log2
from hdl.control.host_writer import HostWriter
from hdl.control.matrix_engine import MatrixEngine
from hdl.control.param_store import ParamKind
from hdl.control.weight_loader import WeightLoader
from hdl.control.weight_mover import WeightMover
from sim.formal.harness import Harness, Inside, all_stream_rules, past, was_reset

__all__ = ["weight_loader_harness", "matrix_engine_harness", "activation_engine_harness",
           "host_writer_harness", "weight_mover_harness"]


def _fire(port) -> Signal:
    return port.valid & port.ready


def _busy_contract(m: Module, cmd, busy, *, name: str) -> None:
    """``busy`` rises exactly in the cycle after ``cmd`` transferred (or after a reset), and
    ``cmd`` is taken only while ``busy`` is low."""
    prefix = name.replace(" ", "_")
    took = past(m, _fire(cmd), name=f"{prefix}_took_1")
    busy_1 = past(m, busy, name=f"{prefix}_busy_1")
    fresh = was_reset(m)
    m.d.comb += [
        Assert(fresh | ~(busy & ~busy_1) | took,
               f"{name}: o_busy rises only the cycle after an instruction is taken"),
        Assert(~cmd.ready | ~busy, f"{name}: takes an instruction only while not busy"),
        Assert(~took | fresh | busy, f"{name}: o_busy is high the cycle after it takes one"),
    ]


def _ready_holds(m: Module, cmd, *, name: str) -> None:
    """``cmd.ready`` does not fall unless an instruction was taken."""
    prefix = name.replace(" ", "_")
    ready_1 = past(m, cmd.ready, name=f"{prefix}_ready_1")
    took = past(m, _fire(cmd), name=f"{prefix}_took_for_ready_1")
    m.d.comb += Assert(was_reset(m) | ~ready_1 | cmd.ready | took,
                       f"{name}: ready does not fall unless an instruction is taken")


def _outstanding(m: Module, client, width: int, *, name: str) -> Signal:
    """Read requests of memory read *client* not yet answered; assumes the memory answers
    only requests it has been sent (at least a cycle later)."""
    count = Signal(width, name=f"{name}_outstanding")
    m.d.sync += count.eq(count + _fire(client.addr) - _fire(client.data))
    m.d.comb += Assume(~client.data.valid | (count != 0))
    return count


def weight_loader_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`WeightLoader` (``o_wm.addr``, ``o_weight``; ``o_weight`` is
    ``o_wm.data`` passed through) and its busy contract.

    Assumed of the environment: the weight memory answers only requests it has been sent;
    the front end dispatches only checked instructions (``count`` not zero, tiles in range).
    """

    def properties(m: Module, wl: WeightLoader, inside: Inside) -> None:
        all_stream_rules(m, wl)
        cmd = wl.i_read_weights
        p = cmd.payload
        m.d.comb += Assume(~cmd.valid | ((p.count != 0) &
                                         (p.tile + p.count <= config.weight_mem_tiles)))
        _busy_contract(m, cmd, wl.o_busy, name="weight loader")
        _ready_holds(m, cmd, name="weight loader")
        # o_idle also waits for the matrix unit (no tile, or a whole one in the shadow
        # registers), which changes that way only with rows from here or a MATMUL's switch,
        # and a MATMUL in flight keeps the matrix engine busy: assumed here.
        matrix_done = (wl.i_matrix.tiles == 0) | wl.i_matrix.shadow_full
        matrix_done_1 = past(m, matrix_done, name="wl_matrix_done_1")
        wl_busy_1 = past(m, wl.o_busy, name="wl_busy_for_idle_1")
        m.d.comb += Assume(~matrix_done_1 | matrix_done | wl_busy_1)
        idle_1 = past(m, wl.o_idle, name="wl_idle_1")
        took_1 = past(m, _fire(cmd), name="wl_took_for_idle_1")
        m.d.comb += Assert(was_reset(m) | ~idle_1 | wl.o_idle | took_1,
                           "weight loader: o_idle does not fall unless it takes an instruction")
        reads = _outstanding(m, wl.o_wm, len(inside.signal("pending")), name="wm")
        # With scale_tiles_late, in the cycle after a take (`scaling`) the counts are in
        # tiles and nothing is requested yet.
        scaling = inside.signal("scaling") if config.scale_tiles_late else Const(0)
        m.d.comb += [
            Assert(inside.signal("pending") == inside.signal("req_left") + reads,
                   "every row is requested or answered"),
            Assert(~scaling | ((reads == 0) & (inside.signal("req_left") != 0)),
                   "scaling: tiles taken, none requested yet"),
            # Invariants: the flags are the counts' non-zero tests.
            Assert(inside.signal("requesting") == ((inside.signal("req_left") != 0) & ~scaling),
                   "requesting: rows left to request"),
            Assert(inside.signal("loading") == (inside.signal("pending") != 0),
                   "loading: rows left to answer"),
        ]

    return Harness(WeightLoader(config), properties, reset="any")


def matrix_engine_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`MatrixEngine` (``o_ub.addr``, ``o_act``, ``o_acc``), its
    MATMUL slots (retire only one in flight, at most ``config.matmul_slots``), with every input
    free."""

    SLOTS = config.matmul_slots

    def properties(m: Module, me: MatrixEngine, inside: Inside) -> None:
        all_stream_rules(m, me)
        if config.pipeline != "reference":
            # (With pipeline="reference" the next MATMUL may be taken as the last row of the
            # current one is issued: ready follows the array's stall, and falls with it.)
            _ready_holds(m, me.i_matmul, name="matrix engine")
        idle_1 = past(m, me.o_idle, name="me_idle_1")
        took_1 = past(m, _fire(me.i_matmul), name="me_took_for_idle_1")
        m.d.comb += Assert(was_reset(m) | ~idle_1 | me.o_idle | took_1,
                           "matrix engine: o_idle does not fall unless it takes a MATMUL")
        in_flight = Signal(range(SLOTS + 1), name="me_in_flight")
        m.d.sync += in_flight.eq(in_flight + _fire(me.i_matmul) - me.o_retire)
        slots = [inside.signal(f"slot{i}_valid") for i in range(SLOTS)]
        m.d.comb += [
            Assert(~me.o_retire | (in_flight != 0), "retires only a MATMUL in flight"),
            Assert(~_fire(me.i_matmul) | (in_flight != SLOTS),
                   f"at most {SLOTS} MATMULs in flight"),
        ]
        # Invariant: the valid slots are the `in_flight` ones from `head` on, up to `tail`.
        head, tail = inside.signal("head"), inside.signal("tail")
        m.d.comb += [
            Assert(in_flight <= SLOTS, "in flight: within the slots"),
            Assert(tail == (head + in_flight) % SLOTS, "tail follows head"),
        ]
        for i in range(SLOTS):
            m.d.comb += Assert(slots[i] == (((i - head) % SLOTS) < in_flight),
                               f"slot {i} is valid when it is among those in flight")
        if config.pipeline == "fast":
            # Invariants of the retire a cycle after the last write: the one-hot head is the
            # head, and a MATMUL is retiring only while one is in flight.
            m.d.comb += [
                Assert(inside.signal("head_hot") == (Const(1, SLOTS) << head)[:SLOTS],
                       "the one-hot head is the head"),
                Assert(~inside.signal("retiring") | (in_flight != 0),
                       "retiring only while a MATMUL is in flight"),
            ]

    return Harness(MatrixEngine(config), properties, reset="any")


def activation_engine_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`ActivationEngine` (``o_acc.addr``, ``o_row``, ``o_ub``) and its
    busy contract.

    Assumed of the environment: the accumulators answer only requests they have been sent;
    the activation unit returns a row on ``i_out`` only for a pooling window it has been given
    on ``o_row`` (its last row marked); the front end dispatches only ACTIVATEs whose count is
    a multiple of the window (its BAD_FIELD check) and whose rows fit the accumulators and
    results the unified buffer (its range checks: the engine's counts are that wide).
    With ``activation_unit="serial"`` the unit's word selection (``params``) is free.
    """

    def properties(m: Module, ae: ActivationEngine, inside: Inside) -> None:
        all_stream_rules(m, ae)
        cmd = ae.i_activate
        log = window_log2(cmd.payload.pool)
        m.d.comb += Assume(~cmd.valid | ((cmd.payload.count & ((1 << log) - 1)) == 0))
        m.d.comb += Assume(~cmd.valid | ((cmd.payload.count <= config.acc_depth) &
                                         ((cmd.payload.count >> log) <= config.ub_depth)))
        count_bits = len(cmd.payload.count) + 2    # up to 4 rows a window: no wrap
        reads = _outstanding(m, ae.o_acc, count_bits, name="acc")
        owed = Signal(count_bits, name="owed")          # windows given, results not taken
        m.d.sync += owed.eq(owed + (_fire(ae.o_row) & ae.o_row.payload.last) - _fire(ae.i_out))
        m.d.comb += Assume(~ae.i_out.valid | (owed != 0))
        _busy_contract(m, cmd, ae.o_busy, name="activation engine")
        _ready_holds(m, cmd, name="activation engine")
        # A bias or multiplier row may take a cycle a column (the serial unit's store), a
        # LOAD_TABLE beat a cycle an entry; the front end sends LOAD_PARAMS' first write, its
        # scalars, without looking at ready.
        pw = ae.i_param_write.payload
        scalars = (pw.kind == ParamKind.SCALARS) & ~pw.table
        m.d.comb += Assert(ae.o_busy | ae.i_param_write.ready | ~scalars,
                           "a scalar parameter write is taken whenever the engine is not "
                           "busy")

        # Invariants: every row of the running ACTIVATE is either still to request, being
        # read, in the unit's current window, or in a window whose result is owed.
        busy, run = inside.signal("busy"), inside.signal("run")
        mask = inside.signal("window_mask")
        phase = inside.signal("resp_index") & mask
        rows_left = inside.signal("req_left") + reads + phase + owed * (mask + 1)
        m.d.comb += [
            Assert(~run | busy, "runs only while busy"),
            Assert((mask == 0) | (mask == 1) | (mask == 3), "a window of 1, 2 or 4 rows"),
            Assert(~busy | (inside.signal("out_left") * (mask + 1) == rows_left),
                   "every row of the running ACTIVATE is accounted for"),
            Assert(busy | ((rows_left == 0) & (owed == 0)), "nothing in flight when idle"),
        ]

    return Harness(ActivationEngine(config), properties, reset="any")


def host_writer_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`HostWriter` (``o_ub.addr``, ``o_host``) and its busy contract.

    Assumed of the environment: the unified buffer answers only requests it has been sent;
    the front end offers a beat on ``i_beat`` only while no WRITE_HOST runs or is offered
    (:class:`~hdl.control.front_end.FrontEnd` sends beats from states that dispatch nothing,
    once the writer is idle).
    """

    def properties(m: Module, hw: HostWriter, inside: Inside) -> None:
        all_stream_rules(m, hw)
        count_bits = len(hw.i_write_host.payload.count)
        reads = _outstanding(m, hw.o_ub, count_bits, name="ub")
        m.d.comb += Assume(~hw.i_beat.valid | ~(hw.o_busy | hw.i_write_host.valid))
        _busy_contract(m, hw.i_write_host, hw.o_busy, name="host writer")
        _ready_holds(m, hw.i_write_host, name="host writer")

        resp_left, req_left = inside.signal("resp_left"), inside.signal("req_left")
        m.d.comb += [
            Assert(resp_left == req_left + reads, "every row is requested or answered"),
            Assert(hw.o_busy | (resp_left == 0), "no row left when idle"),
        ]

    return Harness(HostWriter(config), properties, reset="any")


def weight_mover_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`WeightMover` (``o_ub.addr``, ``o_wm``) and its busy contract
    (UB_TO_WEIGHTS' next instruction waits on ``o_busy``).

    Assumed of the environment: the unified buffer answers only requests it has been sent;
    the front end dispatches only checked instructions (a ``count`` of 1 to the tile's rows,
    or its columns when transposed).
    """

    def properties(m: Module, mv: WeightMover, inside: Inside) -> None:
        all_stream_rules(m, mv)
        cmd = mv.i_move.payload
        most = Signal.like(cmd.count, name="count_most")
        m.d.comb += [
            most.eq(Mux(cmd.transpose, config.cols, config.rows)),
            Assume(~mv.i_move.valid | ((cmd.count != 0) & (cmd.count <= most))),
        ]
        reads = _outstanding(m, mv.o_ub, len(cmd.count), name="ub")
        _busy_contract(m, mv.i_move, mv.o_busy, name="weight mover")
        _ready_holds(m, mv.i_move, name="weight mover")

        req_left, recv_left = inside.signal("req_left"), inside.signal("recv_left")
        reading, writing = inside.signal("reading"), inside.signal("writing")
        m.d.comb += [
            Assert(recv_left == req_left + reads, "every row is requested or answered"),
            Assert(mv.o_busy == (reading | writing), "busy while reading or writing"),
            Assert(~(reading & writing), "reads, then writes"),
            Assert(~reading | (recv_left != 0), "reading: a row still to come"),
            Assert(~writing | (recv_left == 0), "no row left once reading is done"),
            Assert(mv.o_busy | (reads == 0), "no read outstanding while idle"),
        ]

    return Harness(WeightMover(config), properties, reset="any")
