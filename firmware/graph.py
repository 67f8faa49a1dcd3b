"""A quantised network as the model importers produce it, its integer reference and its
lowering onto the core.

A :class:`Graph` holds tensors (shape, element type, quantisation) and operators in execution
order, with the inputs and outputs named as the model names them. Nothing in it is specific to
a file format: the importers (:mod:`firmware.importers`) translate a model's operators into
the operators below, with every parameter in integers, and refuse what does not map.

Operators
---------
*Core operators* run on the systolic array:

- :class:`FullyConnected`: ``y = act(requantise((x - z_in) @ W + b))``;
- :class:`Conv2D`: stride, asymmetric padding (the input's zero point), ``groups`` (a
  depthwise convolution has one group per input channel).

Their weights are int8 with zero point 0, the bias int32, and the requantisation
(:class:`Requant`) per output channel an int32 multiplier and a shift (0 to 63) with a
rounding mode (:class:`hdl.isa.Rounding`), then the output zero point and the activation
unit's function: IDENTITY, RELU = ``max(q, z_out)`` or CLAMP = ``min(max(q, z_out),
clamp_hi)``, exactly :func:`sim.models.golden.requantise` and :func:`~sim.models.golden.activate`.

*Host operators* run in numpy between the core's segments, each with exact integer semantics:
:class:`Reshape`, :class:`MaxPool2D`, :class:`AveragePool2D`, :class:`Add`, :class:`Softmax`,
:class:`Quantize`, :class:`Requantize`, :class:`Dequantize`, :class:`Constant`. Their
arithmetic is TFLite's reference kernels' (gemmlowp's fixed point written out in
:mod:`firmware.fixedpoint`), the only format whose host operators the importers produce so
far.

:meth:`Graph.reference` is the integer reference executor: every operator on whole tensors.

Lowering
--------
:func:`lower` turns the graph into steps for one :class:`~hdl.config.TPUConfig`: runs of
fully connected operators (each output read only by the next) become one
:class:`firmware.quant.QuantisedNetwork` of dense stages, kept on chip between them; every
convolution becomes a dense segment over the patches the host cuts (im2col with the stride and
the padding, one "image" per output position), so that stride, asymmetric padding and groups
cost the compiler nothing; a grouped (depthwise) convolution runs one block of ``cols`` output
channels at a time, each block a dense layer over the patches of its own input channels.
The input zero point is folded into the bias (``b - z_in * colsum(W)``) as
:mod:`firmware.quant` does. On a core with UB_TO_WEIGHTS
(:attr:`~hdl.config.TPUConfig.ub_to_weights`) an :class:`AttentionScores` becomes a
:class:`AttentionStep`: each head's ``q @ k.T`` on the array, ``k.T`` made on chip
(:mod:`firmware.attention`), and so does an :class:`AttentionMix` (``p @ v``, ``v`` moved
into weight tiles on chip) where the core takes uint8 activations; elsewhere they run on the
host. Where the core has the programmable table (:attr:`~hdl.config.TPUConfig.lookup_table`)
a :class:`Lookup` that alone reads the scores (softmax's exp) joins their step, and one that
alone reads a fully connected operator's output (GELU, sigmoid, any function of an int8)
joins its run as the stage's function: the ACTIVATE looks it up, and only its output leaves
the core. Where the core has all three (UB_TO_WEIGHTS, the table and the row scale),
attention's q, k and v projections, its scores, their exp and the normalised mix become one
:class:`AttentionBlockStep`, one program from the projections' input to the attention
output (:mod:`firmware.attention_block`), when it fits the core's memories and slots.
:func:`placement` says which
operator ran where. :func:`run_graph` runs the steps on a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware import fixedpoint as fp
from firmware.fixedpoint import quantize_multiplier
from firmware.quant import QParams, QuantisedNetwork, Stage
from hdl.isa import Func, Rounding
from sim.models import golden

__all__ = ["GraphError", "Tensor", "Requant", "Op", "FullyConnected", "Conv2D", "Reshape",
           "MaxPool2D", "AveragePool2D", "Add", "Softmax", "Quantize", "Requantize",
           "Dequantize", "Constant", "AttentionScores", "Lookup", "evaluate",
           "SoftmaxNormalise", "AttentionMix",
           "LayerNorm", "Concat", "round_div", "isqrt", "Graph", "quantize_multiplier",
           "requant_from_real", "Segment",
           "HostStep", "CoreStep", "AttentionStep", "AttentionBlockStep", "lower",
           "placement", "GraphRun", "run_graph"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

#: Element types of a tensor and their integer ranges.
INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int32": (INT32_MIN, INT32_MAX)}
DTYPES = (*INT_RANGES, "float32")


class GraphError(ValueError):
    """A graph that is inconsistent or that the core cannot run (names the operator)."""


@dataclass(frozen=True)
class Tensor:
    """A tensor: ``shape`` with the batch first, ``dtype`` one of :data:`DTYPES`, ``q`` the
    quantisation of an integer activation (``None`` for float tensors and constants)."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    q: QParams | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise GraphError(f"tensor {self.name}: dtype {self.dtype!r}; allowed: "
                             f"{', '.join(DTYPES)}")


# Requantisation --------------------------------------------------------------------------

def requant_from_real(reals, zero_point: int, *, func: Func = Func.IDENTITY,
                      clamp_hi: int = 127, single: bool = True, where: str = "") -> Requant:
    """The :class:`Requant` of TFLite's ``MultiplyByQuantizedMultiplier`` for the real
    multipliers ``reals`` (one per output channel): Q31 multipliers from
    :func:`quantize_multiplier` and ``shift = 31 - e``. ``single``: a build with
    ``TFLITE_SINGLE_ROUNDING`` (``(x * M + 2**(s - 1)) >> s``, exactly HALF_UP); otherwise
    gemmlowp's double rounding (DOUBLE), the same integer for every accumulator ``x`` with
    ``x << max(e, 0)`` in int32."""
    mults, shifts = [], []
    for real in np.atleast_1d(np.asarray(reals, dtype=np.float64)):
        try:
            m, e = quantize_multiplier(float(real), single=single)
        except ValueError as error:
            raise GraphError(f"{where}: {error}") from None
        if not -32 <= e <= 31:
            raise GraphError(f"{where}: the requantisation scale {real:.6g} needs a shift of "
                             f"{31 - e}; the activation unit shifts by 0 to 63")
        mults.append(m)
        shifts.append(31 - e)
    return Requant(np.array(mults, dtype=np.int64), np.array(shifts, dtype=np.int64),
                   Rounding.HALF_UP if single else Rounding.DOUBLE, int(zero_point), func,
                   int(clamp_hi))


@dataclass(eq=False)
class Requant:
    """Per output channel: ``q = act(sat8(sat32(round(t * multiplier / 2**shift)) +
    zero_point))`` with ``t`` the int32 accumulator plus bias (the activation unit)."""
    multiplier: np.ndarray
    shift: np.ndarray
    rounding: Rounding
    zero_point: int
    func: Func = Func.IDENTITY
    clamp_hi: int = 127

    def __post_init__(self):
        self.multiplier = np.asarray(self.multiplier, dtype=np.int64).reshape(-1)
        self.shift = np.broadcast_to(np.asarray(self.shift, dtype=np.int64),
                                     self.multiplier.shape).copy()
        if self.multiplier.size and (self.multiplier.min() < INT32_MIN
                                     or self.multiplier.max() > INT32_MAX):
            raise GraphError("a requantisation multiplier does not fit int32")
        if self.shift.size and (self.shift.min() < 0 or self.shift.max() > 63):
            raise GraphError(f"requantisation shifts {self.shift.min()}..{self.shift.max()}; "
                             f"allowed: 0 to 63")
        if self.func not in (Func.IDENTITY, Func.RELU, Func.CLAMP):
            raise GraphError(f"activation {self.func.name}; allowed: IDENTITY, RELU, CLAMP")
        if not -128 <= self.zero_point <= 127 or not -128 <= self.clamp_hi <= 127:
            raise GraphError("the output zero point and clamp_hi must be int8")

    def apply(self, acc: np.ndarray) -> np.ndarray:
        """int8 outputs of int32 accumulators ``acc`` (bias included; channels last)."""
        q = golden.requantise(acc, 0, self.multiplier, self.shift, self.zero_point,
                              self.rounding.value)
        return golden.activate(q, self.func.value, self.zero_point, self.clamp_hi)

    @property
    def scalar_shift(self) -> int | np.ndarray:
        """One shift when every channel has the same (what a stage takes most simply)."""
        return int(self.shift[0]) if (self.shift == self.shift[0]).all() else self.shift


# Operators --------------------------------------------------------------------------------

@dataclass(eq=False)
class Op:
    """An operator: ``inputs`` and ``outputs`` are tensor names of its graph."""
    name: str
    inputs: list[str]
    outputs: list[str]

    #: Whether it runs on the systolic array.
    core = False

    def reference(self, *xs: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def macs(self, graph: Graph) -> int:
        return 0


def _check_int8_weights(name: str, w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype.kind not in "iu" or (w.size and (w.min() < -128 or w.max() > 127)):
        raise GraphError(f"{name}: weights must be int8 values (-128..127)")
    return w.astype(np.int64)


def _check_bias(name: str, b: np.ndarray, n: int) -> np.ndarray:
    b = np.asarray(b, dtype=np.int64).reshape(-1)
    if b.shape != (n,):
        raise GraphError(f"{name}: {b.size} biases for {n} output channels")
    if b.size and (b.min() < INT32_MIN or b.max() > INT32_MAX):
        raise GraphError(f"{name}: a bias does not fit int32")
    return b


@dataclass(eq=False)
class FullyConnected(Op):
    """``y = requant((x.reshape(-1, K) - input_zp) @ weight + bias)``; ``weight`` is
    ``(K, N)`` int8 (zero point 0), ``bias`` ``(N,)`` int32. ``keep_dims``: ``y`` keeps
    ``x``'s leading dimensions (``(..., K)`` to ``(..., N)``, a token matrix's rows)."""
    weight: np.ndarray = None
    bias: np.ndarray = None
    input_zp: int = 0
    requant: Requant = None
    keep_dims: bool = False
    core = True

    def __post_init__(self):
        self.weight = _check_int8_weights(self.name, self.weight)
        if self.weight.ndim != 2:
            raise GraphError(f"{self.name}: weight must be (K, N), got {self.weight.shape}")
        self.bias = _check_bias(self.name, self.bias, self.weight.shape[1])
        if self.requant.multiplier.shape != (self.weight.shape[1],):
            self.requant = _broadcast_requant(self.requant, self.weight.shape[1])

    def accumulate(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64).reshape(-1, self.weight.shape[0]) - self.input_zp
        return golden.wrap(golden.exact_matmul(x, self.weight) + self.bias, 32)

    def reference(self, x):
        y = self.requant.apply(self.accumulate(x))
        return [y.reshape(*np.shape(x)[:-1], -1) if self.keep_dims else y]

    def macs(self, graph):
        rows = int(np.prod(graph.tensors[self.inputs[0]].shape)) // self.weight.shape[0]
        return rows * self.weight.size


@dataclass(eq=False)
class Conv2D(Op):
    """2-D convolution of NHWC int8 ``x``: ``weight`` ``(kh, kw, cin // groups, cout)`` int8
    (zero point 0), ``bias`` ``(cout,)``, ``stride`` ``(sy, sx)``, ``padding`` ``(top,
    bottom, left, right)`` filled with ``input_zp`` (contributes 0), ``groups`` (output
    channel ``o`` reads input channels of group ``o // (cout // groups)``)."""
    weight: np.ndarray = None
    bias: np.ndarray = None
    input_zp: int = 0
    requant: Requant = None
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    groups: int = 1
    core = True

    def __post_init__(self):
        self.weight = _check_int8_weights(self.name, self.weight)
        if self.weight.ndim != 4:
            raise GraphError(f"{self.name}: weight must be (kh, kw, cin/groups, cout), got "
                             f"{self.weight.shape}")
        cout = self.weight.shape[3]
        if self.groups < 1 or cout % self.groups:
            raise GraphError(f"{self.name}: {cout} output channels do not split into "
                             f"{self.groups} groups")
        if min(self.stride) < 1 or min(self.padding) < 0:
            raise GraphError(f"{self.name}: stride {self.stride} and padding {self.padding}; "
                             f"allowed: strides >= 1, paddings >= 0")
        self.bias = _check_bias(self.name, self.bias, cout)
        if self.requant.multiplier.shape != (cout,):
            self.requant = _broadcast_requant(self.requant, cout)

    @property
    def cin(self) -> int:
        return self.weight.shape[2] * self.groups

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        kh, kw = self.weight.shape[:2]
        t, b, left, r = self.padding
        return (h + t + b - kh) // self.stride[0] + 1, (w + left + r - kw) // self.stride[1] + 1

    def patches(self, x: np.ndarray) -> np.ndarray:
        """``(n, ho, wo, kh, kw, cin)`` patches of ``x``, padding with the input zero point."""
        x = np.asarray(x, dtype=np.int64)
        kh, kw = self.weight.shape[:2]
        t, b, left, r = self.padding
        n, h, w, c = x.shape
        if c != self.cin:
            raise GraphError(f"{self.name}: input has {c} channels, the weights take "
                             f"{self.cin}")
        ho, wo = self.out_hw(h, w)
        xp = np.pad(x, ((0, 0), (t, b), (left, r), (0, 0)), constant_values=self.input_zp)
        sy, sx = self.stride
        out = np.empty((n, ho, wo, kh, kw, c), dtype=np.int64)
        for dy in range(kh):
            for dx in range(kw):
                out[:, :, :, dy, dx, :] = xp[:, dy:dy + sy * (ho - 1) + 1:sy,
                                             dx:dx + sx * (wo - 1) + 1:sx, :]
        return out

    def dense_weight(self, out_channels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the output channels ``out_channels``: the input channels they read and the
        ``(kh * kw * len(inputs), len(out_channels))`` weight matrix over those patches
        (zero where an output channel does not read an input channel)."""
        kh, kw, cg, cout = self.weight.shape
        og = cout // self.groups
        groups = np.unique(out_channels // og)
        ins = (groups[:, None] * cg + np.arange(cg)).reshape(-1)
        w = np.zeros((kh, kw, len(ins), len(out_channels)), dtype=np.int64)
        for j, o in enumerate(out_channels):
            g = o // og
            start = int(np.searchsorted(ins, g * cg))
            w[:, :, start:start + cg, j] = self.weight[:, :, :, o]
        return ins, w.reshape(-1, len(out_channels))

    def accumulate(self, x: np.ndarray) -> np.ndarray:
        p = self.patches(x) - self.input_zp
        n, ho, wo, kh, kw, _ = p.shape
        cout = self.weight.shape[3]
        og, cg = cout // self.groups, self.weight.shape[2]
        acc = np.empty((n, ho, wo, cout), dtype=np.int64)
        for g in range(self.groups):
            pg = p[..., g * cg:(g + 1) * cg].reshape(n, ho, wo, -1)
            wg = self.weight[..., g * og:(g + 1) * og].reshape(-1, og)
            acc[..., g * og:(g + 1) * og] = golden.exact_matmul(pg, wg)
        return golden.wrap(acc + self.bias, 32)

    def reference(self, x):
        return [self.requant.apply(self.accumulate(x))]

    def macs(self, graph):
        out = graph.tensors[self.outputs[0]].shape
        kh, kw, cg, _ = self.weight.shape
        return int(np.prod(out)) * kh * kw * cg


def _broadcast_requant(r: Requant, n: int) -> Requant:
    if r.multiplier.size != 1:
        raise GraphError(f"{r.multiplier.size} requantisation multipliers for {n} channels")
    return Requant(np.repeat(r.multiplier, n), np.repeat(r.shift, n), r.rounding,
                   r.zero_point, r.func, r.clamp_hi)


@dataclass(eq=False)
class Constant(Op):
    """A constant tensor (no inputs), the same for every item of the batch."""
    value: np.ndarray = None

    def reference(self):
        return [np.asarray(self.value)]


@dataclass(eq=False)
class Reshape(Op):
    """The same elements in ``shape`` (its first dimension the batch's)."""
    shape: tuple[int, ...] = ()

    def reference(self, x):
        return [np.asarray(x).reshape(len(x), *self.shape[1:])]


def _pool_windows(x: np.ndarray, kernel, stride, padding, fill):
    """Per kernel offset, the strided view of ``x`` padded with ``fill`` and the mask of
    positions inside the input."""
    kh, kw = kernel
    sy, sx = stride
    t, b, left, r = padding
    n, h, w, c = x.shape
    ho, wo = (h + t + b - kh) // sy + 1, (w + left + r - kw) // sx + 1
    xp = np.pad(x, ((0, 0), (t, b), (left, r), (0, 0)), constant_values=fill)
    inside = np.pad(np.ones((1, h, w, 1), dtype=bool), ((0, 0), (t, b), (left, r), (0, 0)))
    for dy in range(kh):
        for dx in range(kw):
            sl = (slice(None), slice(dy, dy + sy * (ho - 1) + 1, sy),
                  slice(dx, dx + sx * (wo - 1) + 1, sx), slice(None))
            yield xp[sl], inside[sl]


@dataclass(eq=False)
class _Pool2D(Op):
    """A pooling window's geometry (padding top, bottom, left, right) and the output clamp."""
    kernel: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    act: tuple[int, int] = (-128, 127)


@dataclass(eq=False)
class MaxPool2D(_Pool2D):
    """Maximum over each window's positions inside the input, clamped to ``act``."""

    def reference(self, x):
        x = np.asarray(x, dtype=np.int64)
        best = None
        for v, _ in _pool_windows(x, self.kernel, self.stride, self.padding, INT32_MIN):
            best = v if best is None else np.maximum(best, v)
        return [np.clip(best, *self.act)]


@dataclass(eq=False)
class AveragePool2D(_Pool2D):
    """Mean over each window's positions inside the input, rounded half away from zero
    (``(s + n/2) / n`` in C's truncating division, TFLite's reference), clamped to ``act``;
    input and output share scale and zero point."""

    def reference(self, x):
        x = np.asarray(x, dtype=np.int64)
        total, count = 0, 0
        for v, inside in _pool_windows(x, self.kernel, self.stride, self.padding, 0):
            total = total + v
            count = count + inside
        count = np.broadcast_to(count, np.shape(total))
        half = count // 2
        mean = np.where(total > 0, (total + half) // count, -((-total + half) // count))
        return [np.clip(mean, *self.act)]


@dataclass(eq=False)
class Add(Op):
    """TFLite's quantised add: both inputs minus their zero points, shifted left by
    ``left_shift``, scaled by ``(m1, s1)`` and ``(m2, s2)``, summed, scaled by ``(mo, so)``
    (``MultiplyByQuantizedMultiplierSmallerThanOneExp``), plus ``out_zp``, clamped to ``act``."""
    zps: tuple[int, int] = (0, 0)
    left_shift: int = 20
    scales: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    out_scale: tuple[int, int] = (0, 0)
    out_zp: int = 0
    act: tuple[int, int] = (-128, 127)
    single: bool = True

    @classmethod
    def from_scales(cls, name, inputs, outputs, s1: float, z1: int, s2: float, z2: int,
                    so: float, zo: int, act: tuple[int, int], single: bool = True) -> Add:
        """The parameters TFLite's Prepare derives from the float32 scales."""
        twice_max = 2 * float(max(np.float32(s1), np.float32(s2)))
        left = 20
        params = [quantize_multiplier(float(np.float32(s)) / twice_max, single=single)
                  for s in (s1, s2)]
        out = quantize_multiplier(twice_max / ((1 << left) * float(np.float32(so))),
                                  single=single)
        return cls(name, inputs, outputs, zps=(z1, z2), left_shift=left,
                   scales=tuple(params), out_scale=out, out_zp=zo, act=act, single=single)

    def reference(self, a, b):
        a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
        one = self.single
        sa = fp.mbqm((a - self.zps[0]) << self.left_shift, *self.scales[0], single=one)
        sb = fp.mbqm((b - self.zps[1]) << self.left_shift, *self.scales[1], single=one)
        out = fp.mbqm(sa + sb, *self.out_scale, single=one) + self.out_zp
        return [np.clip(out, *self.act)]


@dataclass(eq=False)
class Softmax(Op):
    """TFLite's int8 softmax over the last axis (its reference kernel, gemmlowp's fixed
    point, :func:`firmware.fixedpoint.softmax_int8`) for ``beta`` and the input's float32
    scale; the output is int8 with scale 1/256 and zero point -128."""
    beta: float = 1.0
    input_scale: float = 1.0
    single: bool = True

    def reference(self, x):
        return [fp.softmax_int8(x, self.beta, self.input_scale, single=self.single)]


@dataclass(eq=False)
class Quantize(Op):
    """float32 to integers: ``round(x / scale) + zero_point`` (float32 division, ties away
    from zero), clamped to the output type."""
    scale: float = 1.0
    zero_point: int = 0
    out_range: tuple[int, int] = (-128, 127)

    def reference(self, x):
        v = np.asarray(x, dtype=np.float32) / np.float32(self.scale)
        r = np.where(v >= 0, np.floor(v + np.float32(0.5)), np.ceil(v - np.float32(0.5)))
        return [np.clip(r.astype(np.int64) + self.zero_point, *self.out_range)]


@dataclass(eq=False)
class Requantize(Op):
    """Integers to integers of other parameters: ``mbqm(x - in_zp, M, e) + out_zp``."""
    in_zp: int = 0
    multiplier: tuple[int, int] = (0, 0)
    out_zp: int = 0
    out_range: tuple[int, int] = (-128, 127)
    single: bool = True

    def reference(self, x):
        v = fp.mbqm(np.asarray(x, np.int64) - self.in_zp, *self.multiplier,
                    single=self.single) + self.out_zp
        return [np.clip(v, *self.out_range)]


@dataclass(eq=False)
class Dequantize(Op):
    """Integers to float32: ``(x - zero_point) * scale`` in float32."""
    scale: float = 1.0
    zero_point: int = 0

    def reference(self, x):
        return [(np.asarray(x, np.int64) - self.zero_point).astype(np.float32)
                * np.float32(self.scale)]


# Transformer operators ------------------------------------------------------------------

def round_div(a, b) -> np.ndarray:
    """``a / b`` rounded to the nearest integer, ties up (``b > 0``), exactly in int64."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return (2 * a + b) // (2 * b)


def isqrt(v) -> np.ndarray:
    """``floor(sqrt(v))`` of non-negative int64 values below 2**52, exactly (float64's
    correctly rounded square root is within one of it there; the two steps after it make
    the result exact whatever the platform's ``sqrt`` does at the last bit)."""
    v = np.asarray(v, np.int64)
    r = np.floor(np.sqrt(v.astype(np.float64))).astype(np.int64)
    r -= (r * r > v)
    r += ((r + 1) * (r + 1) <= v)
    return r


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """``(n, T, H * d)`` as ``(n, H, T, d)``: head ``j`` is columns ``j * d .. (j + 1) * d``."""
    n, t, c = x.shape
    return x.reshape(n, t, heads, c // heads).transpose(0, 2, 1, 3)


@dataclass(eq=False)
class AttentionScores(Op):
    """Each head's ``q_j @ k_j.T``: int8 ``q`` and ``k`` ``(n, T, H * d)`` (zero point 0) to
    int32 ``(n, H, T, T)`` accumulators (query rows, key columns), requantised by
    ``requant`` (one multiplier; ``1 / sqrt(d)`` is folded into it) to int8."""
    heads: int = 1
    requant: Requant = None

    def __post_init__(self):
        if self.heads < 1:
            raise GraphError(f"{self.name}: heads must be >= 1, not {self.heads}")

    def accumulate(self, q, k) -> np.ndarray:
        if q.shape != k.shape or q.shape[-1] % self.heads:
            raise GraphError(f"{self.name}: q {q.shape} and k {k.shape} must match, with "
                             f"channels a multiple of {self.heads} heads")
        acc = np.einsum("nhtd,nhsd->nhts", _heads(np.asarray(q, np.int64), self.heads),
                        _heads(np.asarray(k, np.int64), self.heads))
        return golden.wrap(acc, 32)

    def reference(self, q, k):
        return [self.requant.apply(self.accumulate(q, k)[..., None])[..., 0]]

    def macs(self, graph):
        n, t, c = graph.tensors[self.inputs[0]].shape
        return n * t * t * c


@dataclass(eq=False)
class Lookup(Op):
    """A 256-entry table of an int8 input: ``out = table[x + 128]`` (the activation
    unit's programmable function: exp for softmax, or any pointwise function)."""
    table: np.ndarray = None

    def __post_init__(self):
        self.table = np.asarray(self.table, dtype=np.int64)
        if self.table.shape != (256,):
            raise GraphError(f"{self.name}: the table has {self.table.size} entries; a "
                             f"table has 256, one per int8 input")
        if self.table.min() < -128 or self.table.max() > 255:
            raise GraphError(f"{self.name}: table values {self.table.min()}.."
                             f"{self.table.max()}; allowed: int8 or uint8")

    def reference(self, x):
        x = np.asarray(x, np.int64)
        if x.size and (x.min() < -128 or x.max() > 127):
            raise GraphError(f"{self.name}: the input is not int8")
        return [self.table[x + 128]]


@dataclass(eq=False)
class SoftmaxNormalise(Op):
    """Softmax's division: ``e`` ``(n, H, T, T)`` non-negative weights (exp's table) to the
    probabilities ``p = min(255, round_div(255 * e, den))`` in uint8 (scale 1/255), ``den``
    the row's sum; a row whose weights are all zero gives zeros. A host operator: the core
    has no per-row scale."""

    def reference(self, e):
        e = np.asarray(e, np.int64)
        if e.ndim != 4 or (e.size and e.min() < 0):
            raise GraphError(f"{self.name}: the weights must be non-negative (n, H, T, T)")
        den = e.sum(axis=-1, keepdims=True)
        p = np.where(den > 0, round_div(255 * e, np.maximum(den, 1)), 0)
        return [np.minimum(p, 255)]


@dataclass(eq=False)
class AttentionMix(Op):
    """Each head's ``p_j @ v_j``: uint8 probabilities ``p`` ``(n, H, T, T)`` (query rows, key
    columns) and int8 ``v`` ``(n, T, H * d)`` (zero point 0) to int32 ``(n, H, T, d)``,
    requantised by ``requant`` (one multiplier: ``p``'s scale times ``v``'s over the
    output's) to int8, heads side by side ``(n, T, H * d)``.

    With ``normalise``, ``p`` is softmax's unnormalised weights ``e`` (exp's table, uint8) and
    the division by each row's sum comes after the product, as the activation unit's
    NORMALISE does it (:func:`sim.models.golden.requantise_normalised`): each output row
    ``e_t @ v`` divided by ``sum(e_t)`` through the reciprocal, ``out = sat8(round((e_t @ v) *
    recip(sum(e_t)) / 2**(shift + cut)) + zero_point)``, so ``out = mean_e(v) * 2**(25 -
    shift)`` (the output's scale is ``v``'s times ``2**(shift - 25)``; ``requant``'s
    multiplier is not used)."""
    requant: Requant = None
    normalise: bool = False

    def reference(self, p, v):
        if not self.normalise:
            out = self.requant.apply(self.accumulate(p, v)[..., None])[..., 0]
        else:
            acc = self.accumulate(p, v)
            den = golden.wrap(np.asarray(p, np.int64).sum(axis=-1, keepdims=True), 32)
            rows = np.concatenate([acc, den], axis=-1)
            flat = rows.reshape(-1, rows.shape[-1])
            req = self.requant
            out = golden.requantise_normalised(flat, 0, int(req.shift[0]), req.zero_point,
                                               req.rounding.value)
            out = out.reshape(rows.shape)[..., :-1]
        n, h, t, d = out.shape
        return [out.transpose(0, 2, 1, 3).reshape(n, t, h * d)]

    def accumulate(self, p, v) -> np.ndarray:
        p, v = np.asarray(p, np.int64), np.asarray(v, np.int64)
        heads = p.shape[1] if p.ndim == 4 else 0
        if p.ndim != 4 or v.ndim != 3 or not heads or v.shape[-1] % heads or \
                p.shape[3] != v.shape[1] or p.shape[2] != v.shape[1]:
            raise GraphError(f"{self.name}: probabilities {p.shape} and values {v.shape} do "
                             f"not match (n, H, T, T) and (n, T, H * d)")
        return golden.wrap(np.einsum("nhts,nhsd->nhtd", p, _heads(v, heads)), 32)

    def macs(self, graph):
        n, t, c = graph.tensors[self.inputs[1]].shape
        return n * t * t * c


@dataclass(eq=False)
class LayerNorm(Op):
    """LayerNorm over the last axis of int8 ``x`` (zero point 0), in integers: with ``D``
    channels, ``c = D * x - sum(x)`` (``D`` times the deviation from the mean) and
    ``r = isqrt(sum(c**2) * 2**(2 * frac) // D)`` (``D`` times the standard deviation, with
    ``frac`` fraction bits), the normalised value is ``c * 2**frac / r``, and ``out =
    clamp(round_div(c * gain * 2**frac + offset * r, r * 2**gain_shift))`` with
    ``gain = round(g / s_out * 2**gain_shift)`` and ``offset = round(b / s_out *
    2**gain_shift)`` per channel; a row of equal values (``r = 0``) gives
    ``round_div(offset, 2**gain_shift)``. LayerNorm's epsilon is left out: an int8 row's
    variance is 0 or at least ``(scale / D)**2``."""
    gain: np.ndarray = None
    offset: np.ndarray = None
    gain_shift: int = 16
    frac: int = 8

    def __post_init__(self):
        self.gain = np.asarray(self.gain, np.int64).reshape(-1)
        self.offset = np.asarray(self.offset, np.int64).reshape(-1)
        if self.gain.shape != self.offset.shape:
            raise GraphError(f"{self.name}: {self.gain.size} gains, {self.offset.size} "
                             f"offsets")
        if np.abs(self.gain).max(initial=0) >= 1 << 31 or \
                np.abs(self.offset).max(initial=0) >= 1 << 40:
            raise GraphError(f"{self.name}: a gain or offset does not fit (int32 gains)")

    def reference(self, x):
        x = np.asarray(x, np.int64)
        d = x.shape[-1]
        if d != self.gain.size:
            raise GraphError(f"{self.name}: {d} channels, {self.gain.size} gains")
        c = d * x - x.sum(axis=-1, keepdims=True)
        if d * 255 * d * 255 * d << 2 * self.frac >= 1 << 52:
            raise GraphError(f"{self.name}: {d} channels with {self.frac} fraction bits "
                             f"overflow the integer square root (below 2**52)")
        r = isqrt((c * c).sum(axis=-1, keepdims=True) * (1 << 2 * self.frac) // d)
        den = np.maximum(r, 1) << self.gain_shift
        out = round_div(c * self.gain * (1 << self.frac) + self.offset * r, den)
        flat = round_div(np.broadcast_to(self.offset, x.shape), 1 << self.gain_shift)
        return [np.clip(np.where(r > 0, out, flat), -128, 127)]


@dataclass(eq=False)
class Concat(Op):
    """The inputs side by side on the last axis (the unified buffer's channel groups)."""

    def reference(self, *xs):
        return [np.concatenate([np.asarray(x, np.int64) for x in xs], axis=-1)]


# The graph --------------------------------------------------------------------------------

def evaluate(ops: list[Op], values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run *ops* in order on the integer reference, adding each output to *values* (which
    holds every tensor they read that none of them writes); returns *values*."""
    for op in ops:
        values.update(zip(op.outputs, op.reference(*(values[t] for t in op.inputs)),
                          strict=True))
    return values


@dataclass(eq=False)
class Graph:
    """Tensors by name, operators in execution order, the model's input and output names."""
    name: str
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]

    def __post_init__(self):
        known = set(self.inputs)
        for name in self.inputs:
            if name not in self.tensors:
                raise GraphError(f"graph input {name} is not a tensor")
        for op in self.ops:
            for t in op.inputs:
                if t not in known:
                    raise GraphError(f"operator {op.name}: input {t} is computed by no "
                                     f"earlier operator and is no graph input")
            known.update(op.outputs)
            for t in op.outputs:
                if t not in self.tensors:
                    raise GraphError(f"operator {op.name}: output {t} is not a tensor")
        for name in self.outputs:
            if name not in known:
                raise GraphError(f"graph output {name} is computed by no operator")

    def consumers(self, tensor: str) -> list[Op]:
        return [op for op in self.ops if tensor in op.inputs]

    def macs(self) -> int:
        """Multiply-accumulates of one inference (the core operators')."""
        return sum(op.macs(self) for op in self.ops)

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``inputs`` by name as arrays, checked against the input tensors (any batch)."""
        missing = [n for n in self.inputs if n not in inputs]
        extra = [n for n in inputs if n not in self.inputs]
        if missing or extra:
            raise GraphError(f"inputs {sorted(inputs)}; the graph takes exactly "
                             f"{self.inputs}")
        out = {}
        for name in self.inputs:
            t = self.tensors[name]
            x = np.asarray(inputs[name])
            if x.shape[1:] != t.shape[1:] or x.ndim != len(t.shape):
                raise GraphError(f"input {name} has shape {x.shape}; the graph takes "
                                 f"(n, {', '.join(map(str, t.shape[1:]))})")
            if t.dtype in INT_RANGES:
                lo, hi = INT_RANGES[t.dtype]
                if x.dtype.kind not in "iu":
                    raise GraphError(f"input {name} is {x.dtype}; it takes {t.dtype} integers")
                if x.size and (x.min() < lo or x.max() > hi):
                    raise GraphError(f"input {name} has values outside {t.dtype} "
                                     f"({lo}..{hi})")
                x = x.astype(np.int64)
            else:
                x = x.astype(np.float32)
            out[name] = x
        return out

    def reference(self, inputs: dict[str, np.ndarray], *, collect: bool = False):
        """The integer reference: outputs by name (every tensor with ``collect``)."""
        values = evaluate(self.ops, dict(self.check_inputs(inputs)))
        return values if collect else {n: values[n] for n in self.outputs}

    def summary(self) -> list[dict]:
        """One row per operator: name, kind, output shape, MACs, where it runs."""
        return [{"name": op.name, "op": type(op).__name__,
                 "shape": self.tensors[op.outputs[0]].shape, "macs": op.macs(self),
                 "runs on": "core" if op.core else "host"} for op in self.ops]


# Lowering ---------------------------------------------------------------------------------

@dataclass(eq=False)
class Segment:
    """One :class:`QuantisedNetwork` run on the core: what it reads of its input tensor
    (``in_channels`` of a convolution's patches, or all) and which output channels it
    writes."""
    network: QuantisedNetwork
    out_channels: np.ndarray | None = None
    in_channels: np.ndarray | None = None


@dataclass(eq=False)
class CoreStep:
    """Core operators run as segments: a chain of fully connected operators (one segment)
    or one convolution (one segment per block of output channels)."""
    ops: list[Op]
    segments: list[Segment]

    @property
    def input(self) -> str:
        return self.ops[0].inputs[0]

    @property
    def output(self) -> str:
        return self.ops[-1].outputs[0]


@dataclass(eq=False)
class HostStep:
    op: Op


@dataclass(eq=False)
class AttentionStep:
    """One of attention's products on the core (:mod:`firmware.attention`): an
    :class:`AttentionScores` (``q`` and ``k`` in, the int8 scores out) or an
    :class:`AttentionMix` (``p`` and ``v`` in, the int8 output out). ``lookup``: a
    :class:`Lookup` of the scores (softmax's exp) run in the same step, by the activation
    unit's programmable table, so the scores never leave the core."""
    op: Op
    lookup: Lookup | None = None

    @property
    def ops(self) -> list[Op]:
        return [self.op] + ([self.lookup] if self.lookup else [])

    @property
    def output(self) -> str:
        return self.ops[-1].outputs[0]


@dataclass(eq=False)
class AttentionBlockStep:
    """Attention from its projections to its output in one program
    (:mod:`firmware.attention_block`): ``projections`` (q, k, v :class:`FullyConnected`
    operators of one input), ``scores`` of q and k, ``lookup`` (exp) of the scores, and the
    normalised ``mix`` of exp's output and v. Only the input and the output cross the
    link."""
    projections: tuple[FullyConnected, FullyConnected, FullyConnected]
    scores: AttentionScores
    lookup: Lookup
    mix: AttentionMix
    #: The ops in the graph's order.
    ops: list[Op] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.ops[0].name}..{self.ops[-1].name}"

    @property
    def input(self) -> str:
        return self.projections[0].inputs[0]

    @property
    def output(self) -> str:
        return self.mix.outputs[0]


def _attention_block(graph: Graph, ops: list[Op], config) -> AttentionBlockStep | None:
    """The :class:`AttentionBlockStep` of ``ops`` (six consecutive operators: three
    projections, the scores, their exp and the normalised mix, wired as attention, their
    intermediate tensors read by nothing else), or ``None``; ``None`` too when the block
    does not compile for ``config`` (the operators then run as steps of their own)."""
    from firmware.attention_block import AttentionBlockExecutable
    from firmware.compiler import CompileError

    if len(ops) < 6 or not (config.ub_to_weights and config.lookup_table and
                            config.row_scale):
        return None
    fcs = [op for op in ops[:6] if isinstance(op, FullyConnected)]
    rest = [op for op in ops[:6] if not isinstance(op, FullyConnected)]
    if len(fcs) != 3 or [type(op) for op in rest] != [AttentionScores, Lookup, AttentionMix]:
        return None
    scores, lookup, mix = rest
    by_out = {fc.outputs[0]: fc for fc in fcs}
    q, k = (by_out.get(t) for t in scores.inputs)
    v = by_out.get(mix.inputs[1])
    if q is None or k is None or v is None or len({id(q), id(k), id(v)}) != 3:
        return None
    outputs = set(graph.outputs)
    readers = {q.outputs[0]: [scores], k.outputs[0]: [scores], v.outputs[0]: [mix],
               scores.outputs[0]: [lookup], lookup.outputs[0]: [mix]}
    if (q.inputs != k.inputs or q.inputs != v.inputs or lookup.inputs != scores.outputs
            or mix.inputs[0] != lookup.outputs[0] or not mix.normalise
            or any(t in outputs or graph.consumers(t) != r for t, r in readers.items())):
        return None
    step = AttentionBlockStep((q, k, v), scores, lookup, mix, list(ops[:6]))
    x = graph.tensors[q.inputs[0]]
    if len(x.shape) != 3 or x.dtype not in ("int8", "uint8"):
        return None
    try:
        AttentionBlockExecutable(step, config, x.shape[1], x.shape[2], x.dtype == "int8")
    except CompileError:
        return None
    return step


def _qparams(graph: Graph, name: str) -> QParams:
    t = graph.tensors[name]
    if t.dtype not in ("int8", "uint8"):
        raise GraphError(f"tensor {name} is {t.dtype}; the core reads and writes int8/uint8")
    q = t.q or QParams(1.0, 0, t.dtype == "int8")
    return QParams(q.scale, q.zero_point, t.dtype == "int8")


def _stage(name, weight, bias, input_zp, requant: Requant, in_q, out_q,
           table=None) -> Stage:
    """A dense stage; with ``table``, a Lookup's, as its function (TABLE)."""
    colsum = weight.sum(axis=0)
    folded = golden.wrap(bias - input_zp * colsum, 32)
    n = weight.shape[1]
    return Stage(name=name, kind="dense", weight=weight, bias=folded,
                 multiplier=requant.multiplier, shift=requant.scalar_shift,
                 zero_point=requant.zero_point, clamp_hi=requant.clamp_hi,
                 func=requant.func if table is None else Func.TABLE,
                 pool=False, pad=(0, 0), in_shape=(weight.shape[0],), out_shape=(n,),
                 in_q=in_q, out_q=out_q, rounding=requant.rounding, table=table)


def _sub_requant(r: Requant, cols: np.ndarray) -> Requant:
    return Requant(r.multiplier[cols], r.shift[cols], r.rounding, r.zero_point, r.func,
                   r.clamp_hi)


def lower(graph: Graph, config, *, fuse_attention: bool = True) -> list[
        CoreStep | AttentionStep | AttentionBlockStep | HostStep]:
    """The graph as core steps and host steps for ``config`` (see the module notes);
    ``fuse_attention=False`` keeps attention's operators steps of their own (to compare)."""
    steps: list[CoreStep | AttentionStep | AttentionBlockStep | HostStep] = []
    outputs = set(graph.outputs)
    i = 0
    ops = graph.ops
    while i < len(ops):
        op = ops[i]
        block = _attention_block(graph, ops[i:i + 6], config) \
            if fuse_attention and isinstance(op, FullyConnected) else None
        if block is not None:
            steps.append(block)
            i += len(block.ops)
            continue
        if config.ub_to_weights and (isinstance(op, AttentionScores) or (
                isinstance(op, AttentionMix) and config.operands != "int8" and
                (not op.normalise or (config.row_scale and config.cols > 1)))):
            lookup = ops[i + 1] if i + 1 < len(ops) else None
            if not (isinstance(op, AttentionScores) and config.lookup_table and
                    isinstance(lookup, Lookup) and lookup.inputs == op.outputs and
                    op.outputs[0] not in outputs and graph.consumers(op.outputs[0]) == [lookup]
                    and op.requant.func == Func.IDENTITY):
                lookup = None
            steps.append(AttentionStep(op, lookup))
            i += len(steps[-1].ops)
            continue
        if not op.core:
            steps.append(HostStep(op))
            i += 1
            continue
        in_q = _qparams(graph, op.inputs[0])
        if isinstance(op, Conv2D):
            out_q = _qparams(graph, op.outputs[0])
            cout = op.weight.shape[3]
            block = cout if op.groups == 1 else config.cols
            segments = []
            for start in range(0, cout, block):
                cols = np.arange(start, min(start + block, cout))
                ins, w = op.dense_weight(cols)
                stage = _stage(op.name, w, op.bias[cols], op.input_zp,
                               _sub_requant(op.requant, cols), in_q, out_q)
                net = QuantisedNetwork(f"{op.name}[{start}:{cols[-1] + 1}]", (w.shape[0],),
                                       in_q, [stage])
                segments.append(Segment(net, cols, ins))
            steps.append(CoreStep([op], segments))
            i += 1
            continue
        # A run of fully connected operators, each output read only by the next; a Lookup
        # that alone reads one's output joins it as its stage's function (the activation
        # unit's table: one table a run, so a second, different one ends it).
        chain: list[Op] = []
        table = None

        def sole_reader(prev: Op, kind, j: int) -> Op | None:
            """The operator at ``j`` if it is a ``kind`` and alone reads ``prev``'s output."""
            nxt = ops[j] if j < len(ops) else None
            if (isinstance(nxt, kind) and prev.outputs[0] not in outputs
                    and graph.consumers(prev.outputs[0]) == [nxt]):
                return nxt
            return None

        fc = op
        while fc is not None:
            chain.append(fc)
            lookup = sole_reader(fc, Lookup, i + len(chain)) if config.lookup_table else None
            if lookup is not None and fc.requant.func == Func.IDENTITY:
                if table is not None and not np.array_equal(table, lookup.table):
                    chain.pop()     # a segment of its own, with its own table
                    break
                chain.append(lookup)
                table = lookup.table
            fc = sole_reader(chain[-1], FullyConnected, i + len(chain))
        stages = []
        q = in_q
        for k, fc in enumerate(chain):
            if isinstance(fc, Lookup):
                continue
            looked_up = k + 1 < len(chain) and isinstance(chain[k + 1], Lookup)
            out_q = _qparams(graph, chain[k + looked_up].outputs[0])
            stages.append(_stage(fc.name, fc.weight, fc.bias, fc.input_zp, fc.requant, q,
                                 out_q, table=chain[k + 1].table if looked_up else None))
            q = out_q
        net = QuantisedNetwork(chain[0].name if len(chain) == 1 else
                               f"{chain[0].name}..{chain[-1].name}",
                               (chain[0].weight.shape[0],), in_q, stages)
        steps.append(CoreStep(chain, [Segment(net)]))
        i += len(chain)
    return steps


@dataclass
class GraphRun:
    """What :func:`run_graph` returns: ``outputs`` and every computed tensor by name,
    per-segment counters, and the totals."""
    outputs: dict[str, np.ndarray]
    tensors: dict[str, np.ndarray]
    segments: list[dict] = field(default_factory=list)
    macs: int = 0
    array_cells: int = 1

    def _total(self, key: str) -> int | None:
        values = [s["counters"].get(key) for s in self.segments]
        return None if any(v is None for v in values) else sum(values)

    @property
    def counters(self) -> dict[str, int | None]:
        """The core's counters summed over every segment (``None`` where a segment's device
        has no such counter)."""
        total: dict = {}
        for seg in self.segments:
            for key, value in seg["counters"].items():
                total[key] = None if value is None or total.get(key, 0) is None \
                    else total.get(key, 0) + value
        return total

    @property
    def cycles(self) -> int | None:
        """Core cycles over every segment (``None`` when the device has no timing)."""
        return self._total("cycles")

    @property
    def utilisation(self) -> float | None:
        """The model's MACs over the array's capacity in those cycles."""
        c = self.cycles
        return None if not c else self.macs / (c * self.array_cells)


def placement(graph: Graph, config) -> dict[str, str]:
    """Where each operator of ``graph`` runs on ``config``, by name: ``"core"`` or
    ``"host"``."""
    where = {op.name: "host" for op in graph.ops}
    for step in lower(graph, config):
        if not isinstance(step, HostStep):
            where.update((op.name, "core") for op in step.ops)
    return where


def _segment_input(step: CoreStep, seg: Segment, x: np.ndarray) -> np.ndarray:
    op = step.ops[0]
    if isinstance(op, Conv2D):
        p = op.patches(x)[..., seg.in_channels]
        return p.reshape(-1, seg.network.input_shape[0])
    return np.asarray(x, dtype=np.int64).reshape(-1, seg.network.input_shape[0])


def run_graph(graph: Graph, inputs: dict[str, np.ndarray], *, device="isa", config=None,
              compiled: dict | None = None, fuse_attention: bool = True) -> GraphRun:
    """Run ``graph`` on ``inputs`` (by name, integers of the input tensors' types, any
    batch): core steps on ``device`` (a :class:`firmware.device.Device`, or a transport name
    opened for ``config``, the default configuration if none), host steps in numpy.
    ``compiled``: a dict the caller keeps to reuse the lowering and the compiled segments
    between calls for the same graph and configuration. ``fuse_attention``: as for
    :func:`lower`. Raises :class:`firmware.compiler.CompileError` naming the segment when
    one does not fit."""
    from firmware.attention import MixExecutable, ScoresExecutable
    from firmware.attention_block import AttentionBlockExecutable
    from firmware.compiler import compile_network
    from firmware.device import open_device
    from firmware.runtime import run
    from hdl.presets import get_config

    own = isinstance(device, str)
    if own:
        device = open_device(device, config or get_config("default"))
    config = device.config
    cache = {} if compiled is None else compiled
    key = (id(graph), config, fuse_attention)
    try:
        values = dict(graph.check_inputs(inputs))
        if key not in cache or cache[key][0] is not graph:
            steps = lower(graph, config, fuse_attention=fuse_attention)
            executables = {id(seg): compile_network(seg.network, config)
                           for step in steps if isinstance(step, CoreStep)
                           for seg in step.segments}
            for step in steps:
                if isinstance(step, AttentionBlockStep):
                    x_t = graph.tensors[step.input]
                    executables[id(step)] = AttentionBlockExecutable(
                        step, config, x_t.shape[1], x_t.shape[2], x_t.dtype == "int8")
                if isinstance(step, AttentionStep):
                    op = step.op
                    if isinstance(op, AttentionScores):
                        _, t, c = graph.tensors[op.inputs[0]].shape
                        executables[id(step)] = ScoresExecutable(op, config, t, c,
                                                                 lookup=step.lookup)
                    else:
                        _, h, t, _ = graph.tensors[op.inputs[0]].shape
                        c = graph.tensors[op.inputs[1]].shape[-1]
                        executables[id(step)] = MixExecutable(op, config, t, c, h)
            cache[key] = (graph, steps, executables)
        _, steps, executables = cache[key]
        result = GraphRun({}, values, macs=0, array_cells=config.rows * config.cols)
        for step in steps:
            if isinstance(step, HostStep):
                op = step.op
                for name, v in zip(op.outputs, op.reference(*(values[t] for t in op.inputs)),
                                   strict=True):
                    values[name] = v
                continue
            if isinstance(step, AttentionBlockStep):
                x = values[step.input]
                r = run(device, executables[id(step)], x)
                values[step.output] = r.outputs
                result.segments.append({"name": step.name, "counters": r.counters,
                                        "images": r.images})
                result.macs += sum(op.macs(graph) for op in step.ops) * len(x) // \
                    graph.tensors[graph.inputs[0]].shape[0]
                continue
            if isinstance(step, AttentionStep):
                op = step.op
                a, b = (values[t] for t in op.inputs)
                if isinstance(op, AttentionScores):
                    if a.shape != b.shape:
                        raise GraphError(f"{op.name}: q {a.shape} and k {b.shape} must match")
                    x = np.stack([a, b], axis=1)
                else:
                    x = MixExecutable.pack(a, b)
                r = run(device, executables[id(step)], x)
                values[step.output] = r.outputs
                result.segments.append({"name": op.name, "counters": r.counters,
                                        "images": r.images})
                result.macs += op.macs(graph) * len(a) // graph.tensors[
                    graph.inputs[0]].shape[0]
                continue
            x = values[step.input]
            out_t = graph.tensors[step.output]
            n = len(x)
            out = np.zeros((n, *out_t.shape[1:]), dtype=np.int64)
            for seg in step.segments:
                r = run(device, executables[id(seg)], _segment_input(step, seg, x))
                y = r.outputs
                if seg.out_channels is None:
                    out = y.reshape(out.shape)
                else:
                    out[..., seg.out_channels] = y.reshape(*out.shape[:-1], -1)
                result.segments.append({"name": seg.network.name, "counters": r.counters,
                                        "images": r.images})
            values[step.output] = out
            result.macs += sum(op.macs(graph) for op in step.ops) * n // graph.tensors[
                graph.inputs[0]].shape[0]
        result.outputs = {name: values[name] for name in graph.outputs}
        return result
    finally:
        if own:
            device.close()
