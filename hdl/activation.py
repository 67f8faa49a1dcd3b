"""Activation unit: requantisation, activation function and max-pooling."""

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .isa import Func
from .ports import requant_params_layout

__all__ = ["ActivationUnit", "lut_table", "acc_row_layout"]

#: A table index ``q`` (int8) stands for ``q * LUT_INPUT_SCALE``.
LUT_INPUT_SCALE = 1 / 16


def lut_table(func: Func) -> list[int]:
    """The 256 int8 outputs of a table function for inputs q = -128..127.

    SIGMOID: output scale 1/256, zero point -128; TANH: output scale 1/128, zero point 0.
    Rounded half away from zero, saturated to int8.
    """
    if func == Func.SIGMOID:
        fn, scale, zp = (lambda x: 1 / (1 + math.exp(-x))), 256, -128
    elif func == Func.TANH:
        fn, scale, zp = math.tanh, 128, 0
    else:
        raise ValueError(f"{func} has no table")
    table = []
    for q in range(-128, 128):
        y = fn(q * LUT_INPUT_SCALE) * scale
        rounded = math.floor(y + 0.5) if y >= 0 else math.ceil(y - 0.5)
        table.append(max(-128, min(127, rounded + zp)))
    return table


def acc_row_layout(cols: int, acc_width: int = 32) -> data.StructLayout:
    """A row of accumulator sums entering the unit; ``last`` closes a pooling window."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(acc_width), cols),
        "last": unsigned(1),
    })


class ActivationUnit(wiring.Component):
    """Turns rows of int32 sums into rows of int8 activations, one row per cycle.

    For each column ``j``, exactly as :func:`sim.golden.requantise` and
    :func:`sim.golden.activate` specify:

    1. ``t = wrap32(acc + bias[j])``;
    2. ``p = t * multiplier[j]`` (exact, 64 bits);
    3. ``r = (p + 2**(shift-1)) >>> shift`` (``r = p`` when ``shift == 0``): rounding to
       nearest with ties towards +infinity;
    4. ``q = saturate_int8(saturate_int32(r) + zero_point)``;
    5. the function: IDENTITY ``q``; RELU ``max(q, zero_point)``; CLAMP
       ``min(max(q, zero_point), clamp_hi)``; SIGMOID and TANH a fixed table indexed by
       ``q`` (see :func:`lut_table`);
    6. max-pooling: the element-wise maximum over the rows up to one with ``last`` set,
       sent as one output row.

    ``bias``, ``multiplier``, ``shift``, ``zero_point``, ``clamp_hi`` and the function come
    from ``i_params``, held steady by the controller while a row is in flight.

    Members
    -------
    i_row : In(stream.Signature(acc_row_layout))
        Sums, with ``last`` on the final row of each pooling window.
    o_row : Out(stream.Signature(ArrayLayout(signed(8), cols)))
        Activations, one row per pooling window.
    i_params : In(requant_params_layout(cols))
        The requantisation parameters and the function (``func``).
    o_busy : Out(1)
        A row is in the pipeline.
    """

    STAGES = 5

    def __init__(self, *, cols: int, acc_width: int = 32):
        self.cols = cols
        self.acc_width = acc_width
        super().__init__({
            "i_row":    In(stream.Signature(acc_row_layout(cols, acc_width))),
            "o_row":    Out(stream.Signature(data.ArrayLayout(signed(8), cols))),
            "i_params": In(requant_params_layout(cols)),
            "o_busy":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cols = self.cols

        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_row.valid | self.o_row.ready),
            self.i_row.ready.eq(advance),
        ]
        take = self.i_row.valid & self.i_row.ready

        valid = [Signal(name=f"valid_s{i}") for i in range(1, self.STAGES)]
        last = [Signal(name=f"last_s{i}") for i in range(1, self.STAGES)]
        with m.If(advance):
            m.d.sync += [valid[0].eq(take), last[0].eq(self.i_row.payload.last)]
            for i in range(1, len(valid)):
                m.d.sync += [valid[i].eq(valid[i - 1]), last[i].eq(last[i - 1])]
        m.d.comb += self.o_busy.eq(sum(valid) != 0 if valid else 0)

        # One table ROM per column: SIGMOID at 0..255, TANH at 256..511, index q + 128.
        rom_init = [v & 0xff for v in lut_table(Func.SIGMOID) + lut_table(Func.TANH)]
        is_table = (self.i_params.func == Func.SIGMOID) | (self.i_params.func == Func.TANH)

        pooled = Signal(data.ArrayLayout(signed(8), cols))
        window_open = Signal()
        for j in range(cols):
            # Stage 1: bias, wrapping at 32 bits.
            t = Signal(signed(32), name=f"t_{j}")
            # Stage 2: exact 64-bit product.
            p = Signal(signed(64), name=f"p_{j}")
            # Stage 3: rounding shift, saturation, zero point.
            q = Signal(signed(8), name=f"q_{j}")
            # Stage 4: function (the table read lands in stage 5).
            f = Signal(signed(8), name=f"f_{j}")
            with m.If(advance):
                m.d.sync += [
                    t.eq(self.i_row.payload.data[j] + self.i_params.bias[j]),
                    p.eq(t * self.i_params.multiplier[j]),
                    q.eq(self._saturate(self._requant(p))),
                    f.eq(self._function(q)),
                ]

            rom = memory.Memory(shape=unsigned(8), depth=512, init=rom_init)
            m.submodules[f"lut_{j}"] = rom
            rd = rom.read_port()
            m.d.comb += [
                rd.en.eq(advance),
                rd.addr.eq(Cat(q[:7], ~q[7], self.i_params.func == Func.TANH)),
            ]
            result = Mux(is_table, rd.data.as_signed(), f)

            # Stage 5: pooling into the output register.
            best = Mux(window_open & (pooled[j] > result), pooled[j], result)
            with m.If(advance & valid[3]):
                m.d.sync += pooled[j].eq(best)
                with m.If(last[3]):
                    m.d.sync += self.o_row.payload[j].eq(best)

        with m.If(advance):
            m.d.sync += self.o_row.valid.eq(valid[3] & last[3])
            with m.If(valid[3]):
                m.d.sync += window_open.eq(~last[3])
        return m

    def _requant(self, p):
        """``(p + 2**(shift-1)) >>> shift``, exact; ``p`` when ``shift == 0``."""
        half = (Const(1, unsigned(65)) << self.i_params.shift) >> 1
        return (p + half) >> self.i_params.shift

    def _saturate(self, r):
        """``saturate_int8(saturate_int32(r) + zero_point)``."""
        r32 = Mux(r < -(1 << 31), -(1 << 31), Mux(r > (1 << 31) - 1, (1 << 31) - 1, r))
        v = r32 + self.i_params.zero_point
        return Mux(v < -128, -128, Mux(v > 127, 127, v))

    def _function(self, q):
        zp = self.i_params.zero_point
        relu = Mux(q > zp, q, zp)
        clamp = Mux(relu > self.i_params.clamp_hi, self.i_params.clamp_hi, relu)
        return Mux(self.i_params.func == Func.RELU, relu,
                   Mux(self.i_params.func == Func.CLAMP, clamp, q))
