"""The accelerator core: controller, memories and units behind one host stream."""

from amaranth.hdl import Module, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .accumulators import Accumulators
from .activation import ActivationUnit
from .config import TPUConfig
from .controller import Controller
from .isa import Status
from .matrix_unit import MatrixUnit
from .unified_buffer import UnifiedBuffer
from .weight_memory import WeightMemory

__all__ = ["Core"]


class Core(wiring.Component):
    """A TPU-v1-style core: the host streams instructions and data in and reads results out.

    ::

        i_host -> Controller -> unified buffer -> matrix unit (weight FIFO + array)
                     |  ^           ^   |                 |
                     |  |           |   v                 v
                     |  +------ activation unit <---- accumulators
                     v
                weight memory -> weight FIFO

    Members
    -------
    i_host : In(stream.Signature(unsigned(config.host_width)))
        Instructions (:mod:`hdl.isa`) and their data beats.
    o_host : Out(stream.Signature(unsigned(config.host_width)))
        Rows for WRITE_HOST, counters for READ_COUNTERS, the DONE beat of HALT.
    o_status : Out(Status)
        Error flag, code and failing instruction index; readable at any time.
    i_clear : In(1)
        Clears an error; the next beat starts a new program.
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        host = stream.Signature(unsigned(config.host_width))
        super().__init__({
            "i_host":   In(host),
            "o_host":   Out(host),
            "o_status": Out(Status),
            "i_clear":  In(1),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()

        m.submodules.controller = ctrl = Controller(cfg)
        m.submodules.unified_buffer = ub = UnifiedBuffer(
            depth=cfg.ub_depth, row_elems=cfg.ub_row, data_width=cfg.data_width)
        m.submodules.weight_memory = wm = WeightMemory(
            tiles=cfg.weight_mem_tiles, rows=cfg.rows, cols=cfg.cols, data_width=cfg.data_width)
        m.submodules.matrix_unit = mu = MatrixUnit(cfg)
        m.submodules.accumulators = acc = Accumulators(
            depth=cfg.acc_depth, cols=cfg.cols, acc_width=cfg.acc_width)
        m.submodules.activation = au = ActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width)

        wiring.connect(m, wiring.flipped(self.i_host), ctrl.i_host)
        wiring.connect(m, ctrl.o_host, wiring.flipped(self.o_host))
        m.d.comb += [self.o_status.eq(ctrl.o_status), ctrl.i_clear.eq(self.i_clear)]

        wiring.connect(m, ctrl.ub_host_w, ub.w[UnifiedBuffer.HOST_WRITE])
        wiring.connect(m, ctrl.ub_act_w, ub.w[UnifiedBuffer.ACT_WRITE])
        wiring.connect(m, ctrl.ub_mm_addr, ub.r_addr[UnifiedBuffer.MATMUL_READ])
        wiring.connect(m, ub.r_data[UnifiedBuffer.MATMUL_READ], ctrl.ub_mm_data)
        wiring.connect(m, ctrl.ub_host_addr, ub.r_addr[UnifiedBuffer.HOST_READ])
        wiring.connect(m, ub.r_data[UnifiedBuffer.HOST_READ], ctrl.ub_host_data)

        wiring.connect(m, ctrl.wm_w, wm.w[0])
        wiring.connect(m, ctrl.wm_addr, wm.r_addr[0])
        wiring.connect(m, wm.r_data[0], ctrl.wm_data)

        wiring.connect(m, ctrl.mu_weight, mu.i_weight)
        wiring.connect(m, ctrl.mu_act, mu.i_act)
        wiring.connect(m, mu.o_psum, ctrl.mu_psum)
        m.d.comb += [
            ctrl.mu_weight_stall.eq(mu.o_weight_stall),
            ctrl.mu_weight_shift.eq(mu.o_weight_shift),
            ctrl.mu_shadow_full.eq(mu.o_shadow_full),
            ctrl.mu_tiles.eq(mu.o_tiles),
        ]

        wiring.connect(m, ctrl.acc_w, acc.i_psum)
        m.d.comb += ctrl.acc_written.eq(acc.o_written)
        wiring.connect(m, ctrl.acc_addr, acc.r_addr)
        wiring.connect(m, acc.r_data, ctrl.acc_data)

        wiring.connect(m, ctrl.au_row, au.i_row)
        wiring.connect(m, au.o_row, ctrl.au_out)
        m.d.comb += [
            au.i_bias.eq(ctrl.au_bias),
            au.i_multiplier.eq(ctrl.au_multiplier),
            au.i_shift.eq(ctrl.au_shift),
            au.i_zero_point.eq(ctrl.au_zero_point),
            au.i_clamp_hi.eq(ctrl.au_clamp_hi),
            au.i_func.eq(ctrl.au_func),
        ]
        return m
