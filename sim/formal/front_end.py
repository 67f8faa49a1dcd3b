"""Proofs of the front end (:class:`hdl.control.front_end.FrontEnd`): the stream rules of
every stream it drives, and that it does nothing while stopped on an error.

Stream rules (:func:`front_end_streams_harness`): every stream the front end drives (the
five dispatch streams, ``o_beat``, ``o_ub_write``, ``o_wm_write``, ``o_param_write``) keeps
``valid`` and its payload until the transfer, given that ``i_host`` does. Assumed of the
rest of :class:`hdl.core.Core`, each a property another proof checks:

- the hazard tracker's ``hazard`` does not rise while the instruction it is asked about
  stays the same and nothing is dispatched (checked by :mod:`sim.formal.hazards`);
- ``i_write_host_busy`` rises only in the cycle after a WRITE_HOST is dispatched (the host
  writer's busy contract, :mod:`sim.formal.engines`);
- the activation engine takes a scalar parameter write whenever it is not busy
  (:mod:`sim.formal.engines`): in the cycle LOAD_PARAMS issues, the front end sends its
  first write, the scalars, without looking at ``o_param_write.ready`` (a bias or
  multiplier row may wait: the serial unit's store writes it a column a cycle);

With ``pipeline="compact"`` or ``"fast"`` (the front end issues on last cycle's readiness), also:

- an engine's ``ready`` does not fall unless it takes an instruction, ``i_activate_busy``
  rises only in the cycle after an ACTIVATE is dispatched, and ``i_idle`` does not fall
  unless something is dispatched (:mod:`sim.formal.engines` checks the first of each engine
  and the second; the third is each engine's ``o_idle``/``o_busy`` there, the weight loader's
  under the matrix unit's tiles changing only with its rows or a MATMUL's switch), and
  ``i_idle`` implies the activation engine is idle (the core's idle is the engines' AND),
  and ``i_sums_busy`` (the sum tables' zeroing after a reset) never rises;

``i_counter_valid`` and ``i_counter_value`` are free: the counters keep counting
(``cycles`` every cycle) while a READ_COUNTERS beat waits for the host, and the front end
holds the value it sampled (the proof found the beat carrying the live counter before that
register existed).

Stopped (:func:`front_end_stopped_harness`), with every input free: from the cycle
``o_status.error`` is high until it falls (``i_clear`` or the resynchronisation word):

- nothing issues: no dispatch stream is valid, ``o_hazards.dispatch`` is low, no
  instruction or CLEAR_COUNTERS event;
- no memory is written: ``o_ub_write``, ``o_wm_write``, ``o_param_write`` are not valid;
- ``o_beat`` carries only the error beat (:class:`~hdl.beats.ErrorBeat` with the status's
  code and instruction index), at most once, offered as soon as no WRITE_HOST runs, and
  exactly once by the time the error clears;
- the decode-level state (tiles written, tiles queued, a tile active, the instruction
  index, halted) and the status code do not change, so the beats discarded meanwhile have
  no effect; the index returns to 0 when the error clears.

Invariants tie ``o_status.error`` to the front end's FSM (``ERROR_BEAT`` or ``ERROR``).
"""

from __future__ import annotations

import functools

from amaranth.hdl import Assert, Assume, Cat, Const, Module, Mux, Signal, Value

from hdl.beats import ERROR_MAGIC, ErrorBeat
from hdl.config import TPUConfig
from hdl.control.front_end import FrontEnd
from hdl.control.param_store import ParamKind
from hdl.isa import INSTR_BITS, RESYNC_WORD, Opcode
from sim.formal.harness import Harness, Inside, all_stream_rules, past, was_reset

__all__ = ["front_end_streams_harness", "front_end_stopped_harness"]


def _fire(port) -> Value:
    return port.valid & port.ready


def _states_agree(m: Module, config: TPUConfig, inside: Inside) -> None:
    """Invariants: the front end's FSM and its transfers' agree on who is working (the front
    end waits in TRANSFER or ERROR_BEAT exactly while its transfers run one)."""
    fe = functools.partial(inside.in_state, "front_end_state")
    xfer = functools.partial(inside.in_state, "transfers.transfers_state")
    rows = ("HOST_ROWS", "WEIGHT_ROWS", "PARAM_BIAS", "PARAM_MULT", "PARAM_SHIFTS",
            "SEND_COUNTERS", "SEND_DONE") + (("WEIGHT_SCALE",) if config.scale_tiles_late else ())
    rows += ("TABLE_ROWS",) if config.lookup_table else ()    # LOAD_TABLE's beats, if built
    rows += ("SUM_TABLE_ROWS",) if config.sum_tables else ()  # a sum table's, if built
    moving = ("MOVE",) if config.ub_to_weights else ()     # UB_TO_WEIGHTS' state, if built
    m.d.comb += [
        Assert(fe("TRANSFER") == xfer(*rows), "TRANSFER exactly while a transfer runs"),
        Assert(fe("ERROR_BEAT") == xfer("ERROR_BEAT"), "ERROR_BEAT in both"),
        Assert(~fe("FETCH", *moving, "ERROR") | xfer("IDLE"),
               "no transfer while fetching, moving or stopped"),
        Assert(~fe("SETTLE") | xfer("SCRUB", "IDLE"), "settling: the scrub or nothing"),
        Assert(fe("SETTLE", "FETCH", "TRANSFER", *moving, "ERROR_BEAT", "ERROR"),
               "a state of its own"),
    ]


def front_end_streams_harness(config: TPUConfig) -> Harness:
    """Stream rules of :class:`FrontEnd` under the assumptions of the module docstring."""

    def properties(m: Module, fe: FrontEnd, inside: Inside) -> None:
        all_stream_rules(m, fe)
        _states_agree(m, config, inside)
        fresh = was_reset(m)
        q = fe.o_hazards
        hazard_1 = past(m, q.hazard, name="hazard_1")
        dispatch_1 = past(m, q.dispatch, name="dispatch_1")
        instr_1 = past(m, q.instr.as_value(), name="instr_1")
        m.d.comb += Assume(fresh | ~(q.hazard & ~hazard_1) | dispatch_1 |
                           (q.instr.as_value() != instr_1))
        if config.pipeline == "fast":
            # The answer it uses, a cycle later: no rise but within two cycles of a dispatch
            # or a new word.
            late_1 = past(m, q.hazard_late, name="hazard_late_1")
            dispatch_2 = past(m, dispatch_1, name="dispatch_2")
            instr_2 = past(m, instr_1, name="instr_2")
            fresh_1 = past(m, fresh, name="was_reset_1")
            m.d.comb += Assume(fresh | fresh_1 | ~(q.hazard_late & ~late_1) | dispatch_1 |
                               dispatch_2 | (q.instr.as_value() != instr_1) |
                               (instr_1 != instr_2))
        busy_1 = past(m, fe.i_write_host_busy, name="write_host_busy_1")
        took_1 = past(m, _fire(fe.o_write_host), name="write_host_took_1")
        m.d.comb += [
            Assume(fresh | ~(fe.i_write_host_busy & ~busy_1) | took_1),
            Assume(fe.i_activate_busy | fe.o_param_write.ready |
                   (fe.o_param_write.payload.kind != ParamKind.SCALARS) |
                   fe.o_param_write.payload.table),
        ]
        if config.pipeline != "reference":
            for name in ("o_read_weights", "o_matmul", "o_activate", "o_write_host",
                         "o_ub_to_weights"):
                port = getattr(fe, name)
                ready_1 = past(m, port.ready, name=f"{name}_ready_1")
                fired_1 = past(m, _fire(port), name=f"{name}_took_1")
                m.d.comb += [
                    Assume(fresh | ~ready_1 | port.ready | fired_1),
                    # Invariant: it was decided on a ready engine that took nothing since.
                    Assert(fresh | ~port.valid | (ready_1 & ~fired_1),
                           f"{name}: valid only after a cycle the engine was ready and idle"),
                ]
            act_busy_1 = past(m, fe.i_activate_busy, name="activate_busy_1")
            act_took_1 = past(m, _fire(fe.o_activate), name="activate_took_1")
            idle_1 = past(m, fe.i_idle, name="idle_1")
            m.d.comb += [
                Assume(fresh | ~(fe.i_activate_busy & ~act_busy_1) | act_took_1),
                Assume(fresh | ~idle_1 | fe.i_idle | dispatch_1),
                # (The core's idle includes the activation engine's: a sum-table LOAD_TABLE,
                # which waits until the core is idle, waits for it too.)
                Assume(~fe.i_idle | ~fe.i_activate_busy),
            ]
            if config.sum_tables:
                # The sum tables' zeroing after a reset only ends.
                sums_1 = past(m, fe.i_sums_busy, name="sums_busy_1")
                m.d.comb += Assume(fresh | ~fe.i_sums_busy | sums_1)
            # Invariant: LOAD_PARAMS (LOAD_TABLE) issues after a cycle no ACTIVATE ran or
            # started.
            for o in (Opcode.LOAD_PARAMS, Opcode.LOAD_TABLE):
                if o in config.opcodes:
                    m.d.comb += Assert(fresh | ~inside.signal(f"issue_{o.name.lower()}") |
                                       (~act_busy_1 & ~act_took_1),
                                       f"{o.name} issues after a cycle the activation engine "
                                       f"was idle")

    return Harness(FrontEnd(config), properties, reset="any")


def front_end_stopped_harness(config: TPUConfig) -> Harness:
    """The front end while stopped on an error (see the module docstring); every input
    free."""

    def properties(m: Module, fe: FrontEnd, inside: Inside) -> None:
        _states_agree(m, config, inside)
        fresh = was_reset(m)
        status = fe.o_status
        error = status.error
        beat = fe.o_beat

        # The error beat, built from the status with the ErrorBeat layout.
        expected = Signal(ErrorBeat, name="expected_beat")
        m.d.comb += [
            expected.instr_index.eq(status.instr_index),
            expected.code.eq(status.code),
            expected.magic.eq(ERROR_MAGIC),
        ]
        expected_beat = Cat(expected.as_value(), Const(0, len(beat.payload) - INSTR_BITS))

        # Beats sent in this error episode.
        sent = Signal(2, name="error_beats_sent")
        with m.If(~error):
            m.d.sync += sent.eq(0)
        with m.Elif(_fire(beat) & (sent != 3)):
            m.d.sync += sent.eq(sent + 1)

        dispatch_streams = (fe.o_read_weights, fe.o_matmul, fe.o_activate, fe.o_write_host,
                            fe.o_ub_to_weights)
        with m.If(error):
            m.d.comb += [
                Assert(~Cat(*(p.valid for p in dispatch_streams)).any(),
                       "stopped: no instruction is dispatched"),
                Assert(~fe.o_hazards.dispatch, "stopped: no dispatch reaches the tracker"),
                Assert(~fe.o_instruction & ~fe.o_clear_counters,
                       "stopped: no instruction completes, counters not cleared"),
                Assert(~fe.o_ub_write.valid & ~fe.o_wm_write.valid & ~fe.o_param_write.valid,
                       "stopped: no memory is written"),
                Assert(~beat.valid | (beat.payload == expected_beat),
                       "stopped: the only beat is the error beat (status code and index)"),
                Assert(~beat.valid | (sent == 0), "stopped: at most one error beat"),
                # Invariant where the beat is a register (the fast pipeline): it holds the
                # error beat while stopped.
                Assert(Const(config.pipeline != "fast") |
                       (inside.signal("transfers.beat_word") == expected_beat[:64]),
                       "stopped: the beat register holds the error beat"),
                Assert((sent != 0) | fe.i_write_host_busy | beat.valid,
                       "stopped: the error beat is offered once no WRITE_HOST runs"),
            ]

        # Across a cycle spent stopped: nothing decoded changes; the error clears only with
        # i_clear or the resynchronisation word, after exactly one beat.
        decode_state = Cat(inside.signal("written"), inside.signal("queued"),
                           inside.signal("have_active"), inside.signal("halted"))
        decode_1 = past(m, decode_state, name="decode_state_1")
        error_1 = past(m, error, name="error_1")
        code_1 = past(m, status.code, name="code_1")
        index_1 = past(m, status.instr_index, name="index_1")
        sent_1 = past(m, sent + _fire(beat), name="sent_1")
        resync = fe.i_host.valid & (fe.i_host.payload[:INSTR_BITS] == RESYNC_WORD)
        clear_1 = past(m, fe.i_clear, name="clear_1")
        resync_1 = past(m, resync, name="resync_1")
        restart_1 = clear_1 | resync_1
        if config.pipeline != "reference":
            # The front end acts on the word in its second cycle (`resync_q`, an invariant):
            # the error clears a cycle after i_clear or two after the word was offered.
            m.d.comb += Assert(fresh | ~inside.signal("dispatch.resync_q") | resync_1,
                               "resync_q: the word was offered a cycle ago")
            restart_1 = clear_1 | past(m, resync_1, name="resync_2")
        with m.If(~fresh & error_1):
            m.d.comb += [
                Assert(decode_state == decode_1,
                       "stopped: written, queued, have_active, halted unchanged"),
                Assert(status.instr_index == Mux(error, index_1, 0),
                       "stopped: the index stays, and restarts at 0 with the error cleared"),
                Assert(error | restart_1, "the error clears only with i_clear or resync"),
            ]
            with m.If(error):
                m.d.comb += Assert(status.code.as_value() == code_1, "stopped: the code stays")
            with m.Else():
                m.d.comb += Assert(sent_1 == 1, "exactly one error beat before restarting")

        # Invariants: the status shows an error exactly in the error states, and the beat
        # has been sent exactly when the front end has moved on to ERROR.
        stopped = inside.in_state("front_end_state", "ERROR_BEAT", "ERROR")
        m.d.comb += [
            Assert(error == stopped, "error exactly in ERROR_BEAT and ERROR"),
            Assert(~error | (sent == inside.in_state("front_end_state", "ERROR")),
                   "the beat has been sent exactly in ERROR"),
        ]

    return Harness(FrontEnd(config), properties, reset="any")
