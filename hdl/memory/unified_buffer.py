"""Unified buffer: the activation memory shared by the host, the matrix unit and the
activation unit."""


from amaranth.hdl import unsigned
from amaranth.lib import data

from hdl.memory.row_memory import RowMemory

__all__ = ["UnifiedBuffer"]


class UnifiedBuffer(RowMemory):
    """The unified buffer: ``depth`` rows of ``row_elems`` raw 8-bit activations.

    Write clients: 0 the host (READ_HOST), 1 the activation unit. Read clients: 0 the
    matrix unit (MATMUL), 1 the host (WRITE_HOST) and, with *weights_reader*, 2 the weight
    mover (UB_TO_WEIGHTS).
    """

    HOST_WRITE, ACT_WRITE = 0, 1
    MATMUL_READ, HOST_READ, WEIGHTS_READ = 0, 1, 2

    def __init__(self, *, depth: int, row_elems: int, data_width: int = 8,
                 pipelined: bool = False, weights_reader: bool = False):
        # Two write clients share one port. The matrix unit has a read port of its own, so
        # that a MATMUL streams a row every cycle; the weight mover shares the host's (a
        # third port would be a third copy of the memory in block RAM).
        self.row_elems = row_elems
        super().__init__(depth=depth, row_shape=data.ArrayLayout(unsigned(data_width),
                                                                 row_elems),
                         readers=(1, 2) if weights_reader else 2, writers=2,
                         pipelined=pipelined)
