"""Unified buffer: the activation memory shared by the host, the matrix unit and the
activation unit."""


from amaranth.hdl import unsigned
from amaranth.lib import data

from hdl.memory.row_memory import RowMemory

__all__ = ["UnifiedBuffer"]


class UnifiedBuffer(RowMemory):
    """The unified buffer: ``depth`` rows of ``row_elems`` raw 8-bit activations.

    Write clients: 0 the host (READ_HOST), 1 the activation unit. Read clients: 0 the
    matrix unit (MATMUL), 1 the host (WRITE_HOST).
    """

    HOST_WRITE, ACT_WRITE = 0, 1
    MATMUL_READ, HOST_READ = 0, 1

    def __init__(self, *, depth: int, row_elems: int, data_width: int = 8,
                 pipelined: bool = False):
        # Two write clients share one port; the two readers have a port each.
        self.row_elems = row_elems
        super().__init__(depth=depth, row_shape=data.ArrayLayout(unsigned(data_width),
                                                                 row_elems),
                         readers=2, writers=2, pipelined=pipelined)
