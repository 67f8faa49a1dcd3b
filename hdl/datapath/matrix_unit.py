"""Matrix unit: the weight FIFO feeding the systolic array's shadow weights."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from hdl.config import TPUConfig
from hdl.datapath.systolic_array import SystolicArray
from hdl.datapath.weight_fifo import WeightFIFO
from hdl.ports import MatrixStatusSignature

__all__ = ["MatrixUnit"]


class MatrixUnit(wiring.Component):
    """A :class:`WeightFIFO` of ``config.weight_fifo_depth`` tiles in front of a
    :class:`SystolicArray`: tiles queue in the FIFO and shift into the array's shadow
    registers while it computes with the active tile.

    Members
    -------
    i_weight : In(stream.Signature(weight_row_layout))
        Rows of weight tiles, row 0 of each tile first.
    i_act : In(stream.Signature(act_row_layout))
        Activation rows; ``switch`` on the first row of each tile.
    o_psum : Out(stream.Signature(psum_row_layout))
        Output rows, in input order.
    o_status : Out(MatrixStatusSignature(weight_fifo_depth))
        ``weight_stall`` and ``weight_shift`` as :class:`SystolicArray`'s, for the
        performance counters; ``shadow_full``: a whole tile waits in the array's shadow
        registers; ``tiles``: whole tiles waiting in the FIFO.
    """

    def __init__(self, config: TPUConfig):
        self.config = config
        self._array = SystolicArray(config)
        sig = self._array.signature.members
        super().__init__({
            "i_weight": sig["i_weight"],
            "i_act":    sig["i_act"],
            "o_psum":   sig["o_psum"],
            "o_status": Out(MatrixStatusSignature(config.weight_fifo_depth)),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        m.submodules.array = array = self._array
        m.submodules.weight_fifo = wfifo = WeightFIFO(
            rows=cfg.rows, cols=cfg.cols, data_width=cfg.data_width,
            depth=cfg.weight_fifo_depth, registered=cfg.pipeline == "fast")

        wiring.connect(m, wiring.flipped(self.i_weight), wfifo.i_row)
        wiring.connect(m, wfifo.o_row, array.i_weight)
        wiring.connect(m, wiring.flipped(self.i_act), array.i_act)
        wiring.connect(m, array.o_psum, wiring.flipped(self.o_psum))
        m.d.comb += [
            self.o_status.weight_stall.eq(array.o_weight_stall),
            self.o_status.weight_shift.eq(array.o_weight_shift),
            self.o_status.shadow_full.eq(array.o_shadow_full),
            self.o_status.tiles.eq(wfifo.o_tiles),
        ]
        return m
