"""The accelerator core: the front end, the engines and the datapath behind one host stream."""

from amaranth.hdl import Cat, Module, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.control.activation_engine import ActivationEngine
from hdl.control.counters import PerfCounters
from hdl.control.front_end import FrontEnd
from hdl.control.hazards import HAZARD_RULES, HazardTracker
from hdl.control.host_writer import HostWriter
from hdl.control.matrix_engine import MatrixEngine
from hdl.control.weight_loader import WeightLoader
from hdl.control.weight_mover import WeightMover
from hdl.datapath.accumulators import Accumulators
from hdl.datapath.activation import ActivationUnit
from hdl.datapath.activation_serial import SerialActivationUnit
from hdl.datapath.matrix_unit import MatrixUnit
from hdl.isa import Status
from hdl.memory.unified_buffer import UnifiedBuffer
from hdl.memory.weight_memory import WeightMemory

__all__ = ["Core", "ACTIVITY", "activity_layout"]

#: Engines whose activity ``o_activity`` reports, one bit each.
ACTIVITY = ("front_end", "weight_loader", "matrix", "activation", "host_writer")


def activity_layout() -> data.StructLayout:
    """``o_activity``: the hazard rule the front end waits on (if any) and which engines
    are busy, for coverage in simulation (unconnected on a board, so synthesis drops it)."""
    return data.StructLayout({"stall_rules": len(HAZARD_RULES), "busy": len(ACTIVITY)})


class Core(wiring.Component):
    """A TPU-v1-style core: the host streams instructions and data in and reads results out.

    ::

        i_host -> FrontEnd --dispatch--> WeightLoader  -> weight memory -> matrix unit
                    |   ^                MatrixEngine  -> unified buffer -> matrix unit
                    |   |                                 -> accumulators
                    |   HazardTracker    ActivationEngine -> accumulators -> activation
                    |                                        unit -> unified buffer
                    |                    WeightMover   -> unified buffer -> weight memory
                    +--beats-->          HostWriter -> unified buffer -> o_host

    The weight mover (UB_TO_WEIGHTS) is built only with
    :attr:`~hdl.config.TPUConfig.ub_to_weights`.

    Members
    -------
    i_host : In(stream.Signature(unsigned(config.host_width)))
        Instructions (:mod:`hdl.isa`) and their data beats.
    o_host : Out(stream.Signature(unsigned(config.host_width)))
        Rows for WRITE_HOST, counters for READ_COUNTERS, the DONE beat of HALT, error beats.
    o_status : Out(Status)
        Error flag, code and failing instruction index; readable at any time.
    i_clear : In(1)
        Clears a pending error; the next beat starts a new program.
    o_activity : Out(activity_layout())
        Coverage taps: the rules the front end is stalled on this cycle and the engines that
        are busy (:data:`ACTIVITY` order: a host transfer, READ_WEIGHTS, MATMUL, ACTIVATE,
        WRITE_HOST).
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        host = stream.Signature(unsigned(config.host_width))
        super().__init__({
            "i_host":   In(host),
            "o_host":   Out(host),
            "o_status": Out(Status),
            "i_clear":  In(1),
            "o_activity": Out(activity_layout()),
        })

    def elaborate(self, platform):
        cfg = self.config
        fast = cfg.pipeline == "fast"
        m = Module()

        m.submodules.front_end = fe = FrontEnd(cfg)
        # The front end dispatches only ranges that fit the memories: compare that wide.
        m.submodules.hazards = hz = HazardTracker(end_bits=cfg.range_end_bits,
                                                  slots=cfg.matmul_slots,
                                                  late=fast,
                                                  ub_to_weights=cfg.ub_to_weights,
                                                  sum_tables=cfg.sum_tables)
        m.submodules.weight_loader = wl = WeightLoader(cfg)
        m.submodules.matrix_engine = me = MatrixEngine(cfg)
        m.submodules.activation_engine = ae = ActivationEngine(cfg)
        m.submodules.host_writer = hw = HostWriter(cfg)
        m.submodules.counters = pc = PerfCounters(macs_per_row=cfg.rows * cfg.cols,
                                                  width=cfg.counter_bits)
        m.submodules.unified_buffer = ub = UnifiedBuffer(
            depth=cfg.ub_depth, row_elems=cfg.ub_row, data_width=cfg.data_width,
            pipelined=fast, weights_reader=cfg.ub_to_weights)
        m.submodules.weight_memory = wm = WeightMemory(
            tiles=cfg.weight_mem_tiles, rows=cfg.rows, cols=cfg.cols, data_width=cfg.data_width,
            pipelined=fast, mover=cfg.ub_to_weights)
        m.submodules.matrix_unit = mu = MatrixUnit(cfg)
        m.submodules.accumulators = acc = Accumulators(
            depth=cfg.acc_depth, cols=cfg.cols, acc_width=cfg.acc_width,
            registered=fast, sum_tables=cfg.sum_tables)
        if cfg.activation_unit == "serial":
            au = SerialActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width,
                                      table=cfg.lookup_table, row_scale=cfg.row_scale)
        else:
            # Its 18x18 partial products on MULT18X18D with the ECP5 build; inferred otherwise
            # (an SB_MAC16's dual 8x8 mode does not suit them).
            au = ActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width,
                                multiplier="ecp5" if cfg.multiplier == "ecp5" else "infer",
                                table=cfg.lookup_table, row_scale=cfg.row_scale,
                                pipelined=fast)
        m.submodules.activation = au

        # Host side.
        wiring.connect(m, wiring.flipped(self.i_host), fe.i_host)
        wiring.connect(m, hw.o_host, wiring.flipped(self.o_host))
        wiring.connect(m, fe.o_beat, hw.i_beat)
        m.d.comb += [self.o_status.eq(fe.o_status), fe.i_clear.eq(self.i_clear)]

        # Dispatch and hazards.
        wiring.connect(m, fe.o_hazards, hz.i_query)
        wiring.connect(m, fe.o_read_weights, wl.i_read_weights)
        wiring.connect(m, fe.o_matmul, me.i_matmul)
        wiring.connect(m, fe.o_activate, ae.i_activate)
        wiring.connect(m, fe.o_write_host, hw.i_write_host)
        wiring.connect(m, fe.o_param_write, ae.i_param_write)
        if cfg.ub_to_weights:
            m.submodules.weight_mover = mv = WeightMover(cfg)
            wiring.connect(m, fe.o_ub_to_weights, mv.i_move)
            wiring.connect(m, mv.o_ub, ub.r[UnifiedBuffer.WEIGHTS_READ])
            wiring.connect(m, mv.o_wm, wm.w[1])
            m.d.comb += fe.i_ub_to_weights_busy.eq(mv.o_busy)
        m.d.comb += [
            hz.i_matmul_retire.eq(me.o_retire),
            hz.i_activate_busy.eq(ae.o_busy),
            hz.i_write_host_busy.eq(hw.o_busy),
            hz.i_read_weights_busy.eq(wl.o_busy),
            fe.i_idle.eq(me.o_idle & wl.o_idle & ~ae.o_busy & ~hw.o_busy),
            fe.i_activate_busy.eq(ae.o_busy),
            fe.i_write_host_busy.eq(hw.o_busy),
        ]

        # Memories and datapath.
        wiring.connect(m, fe.o_ub_write, ub.w[UnifiedBuffer.HOST_WRITE])
        wiring.connect(m, ae.o_ub, ub.w[UnifiedBuffer.ACT_WRITE])
        wiring.connect(m, me.o_ub, ub.r[UnifiedBuffer.MATMUL_READ])
        wiring.connect(m, hw.o_ub, ub.r[UnifiedBuffer.HOST_READ])
        wiring.connect(m, fe.o_wm_write, wm.w[0])
        wiring.connect(m, wl.o_wm, wm.r[0])
        wiring.connect(m, wl.o_weight, mu.i_weight)
        wiring.connect(m, mu.o_status, wl.i_matrix)
        wiring.connect(m, me.o_act, mu.i_act)
        wiring.connect(m, mu.o_psum, me.i_psum)
        wiring.connect(m, me.o_acc, acc.i_psum)
        if cfg.sum_tables:
            wiring.connect(m, fe.o_sum_table, acc.i_table)
            m.d.comb += fe.i_sums_busy.eq(acc.o_sums_scrubbing)
        m.d.comb += me.i_acc_written.eq(acc.o_written)
        wiring.connect(m, ae.o_acc, acc.r)
        wiring.connect(m, ae.o_row, au.i_row)
        wiring.connect(m, au.o_row, ae.i_out)
        if cfg.lookup_table:
            wiring.connect(m, ae.o_table, au.i_table)
        if cfg.activation_unit == "serial":
            wiring.connect(m, au.params, ae.params)
        else:
            m.d.comb += au.i_params.eq(ae.o_params)

        # Coverage taps.
        m.d.comb += [
            self.o_activity.stall_rules.eq(hz.o_rules &
                                           fe.o_raw_stall.replicate(len(HAZARD_RULES))),
            self.o_activity.busy.eq(Cat(fe.o_host_work, ~wl.o_idle, ~me.o_idle, ae.o_busy,
                                        hw.o_busy)),
        ]

        # Performance counters.
        other_work = ae.o_busy | hw.o_busy | fe.o_host_work
        if cfg.ub_to_weights:
            other_work = other_work | mv.o_busy
        ev = pc.i_events
        m.d.comb += [
            fe.i_counter_value.eq(pc.o_value),
            fe.i_counter_valid.eq(pc.o_valid),
            pc.i_select.eq(fe.o_counter_select),
            ev.instructions.eq(fe.o_instruction),
            ev.raw_stall.eq(fe.o_raw_stall),
            ev.host_stall.eq(fe.o_host_stall),
            ev.clear.eq(fe.o_clear_counters),
            ev.array_active.eq(me.o_array_active),
            ev.weight_stall.eq(mu.o_status.weight_stall),
            ev.weight_shift.eq(mu.o_status.weight_shift),
            ev.other_work.eq(other_work),
        ]
        return m
