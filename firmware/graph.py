"""A quantised network as the model importers produce it, and its integer reference.

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
:func:`from_network` writes a network of the layer API (:mod:`firmware.quant`) as a graph with
the same integer semantics, so the importers and the layer API meet in one form.

:func:`firmware.compiler.lower` maps the graph onto the core (which operators run there and
how); :func:`firmware.runtime.graph.run_graph` runs it on a device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware import fixedpoint as fp
from firmware.fixedpoint import quantize_multiplier
from firmware.quant import QParams
from hdl.isa import Func, Rounding
from sim.models import golden

__all__ = ["GraphError", "Tensor", "Requant", "Op", "FullyConnected", "Conv2D", "Reshape",
           "Transpose",
           "MaxPool2D", "AveragePool2D", "Add", "ElementwiseBinary", "Softmax", "Quantize",
           "Requantize",
           "Dequantize", "Constant", "AttentionScores", "Lookup", "evaluate",
           "SoftmaxNormalise", "AttentionMix",
           "LayerNorm", "Concat", "round_div", "isqrt", "Graph", "quantize_multiplier",
           "requant_from_real", "from_network", "FIXED_TABLES"]

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
class Transpose(Op):
    """The axes permuted by ``perm`` (the batch axis included): NCHW to NHWC and back."""
    perm: tuple[int, ...] = ()

    def reference(self, x):
        return [np.transpose(np.asarray(x), self.perm)]


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


class ElementwiseBinary(Op):
    """An operator of two int8 tensors of one shape whose every output element (int8) is a
    function of the two input elements at its place, whatever the rest hold: its reference
    on every pair of values (a 256 x 256 grid) tells the whole function, which the compiler
    runs on chip where two sum tables reproduce it (an importer's float-arithmetic add,
    :mod:`firmware.compiler.sums`)."""


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


# The layer API's networks as graphs ---------------------------------------------------------

#: The activation unit's fixed tables, as the Lookup a graph writes for them.
FIXED_TABLES = {Func.SIGMOID: golden.SIGMOID_LUT, Func.TANH: golden.TANH_LUT}


def from_network(qnet) -> Graph:
    """The graph of a :class:`firmware.quant.QuantisedNetwork` (the layer API's), with the
    same integer semantics as :func:`firmware.quant.reference_forward`: a stage becomes a
    :class:`FullyConnected` (after a :class:`Reshape` where it flattens an image) or a
    :class:`Conv2D` (its symmetric padding on both sides, the input's zero point unfolded from
    the bias), then a :class:`Lookup` for a table function (SIGMOID, TANH, TABLE), then a
    :class:`MaxPool2D` of 2x2 windows where it pools. Tensors are named ``input``, each
    stage's output by the stage's name, ``output`` last."""
    dtype = "int8" if qnet.input_q.signed else "uint8"
    tensors = {"input": Tensor("input", (1, *qnet.input_shape), dtype, qnet.input_q)}
    ops: list[Op] = []
    x = "input"

    def add(name: str, shape, q: QParams) -> str:
        tensors[name] = Tensor(name, (1, *shape), "int8" if q.signed else "uint8", q)
        return name

    for k, st in enumerate(qnet.stages):
        last = k == len(qnet.stages) - 1
        out = "output" if last else st.name
        z_in = st.in_q.zero_point
        w = st.weight.astype(np.int64)
        # The stage's bias has -z_in * colsum(W) folded in; the graph's operator subtracts
        # the zero point from its input instead.
        bias = golden.wrap(np.asarray(st.bias, np.int64) + z_in * st.weight_matrix.sum(axis=0),
                           32)
        table = FIXED_TABLES.get(st.func, st.table if st.func == Func.TABLE else None)
        func = Func.IDENTITY if table is not None else st.func
        requant = Requant(st.multiplier, st.shift, st.rounding, st.zero_point, func,
                          st.clamp_hi)
        conv_shape = (*st.conv_out_hw, st.n) if st.kind == "conv" else st.out_shape
        # What the requantisation writes where a table or a pool follows: the pool keeps
        # the output's scale; a fixed table's input scale is the activation unit's (a
        # programmable table's is not recorded in the stage).
        if table is not None:
            pre_q = QParams(golden.LUT_INPUT_SCALE if st.func in FIXED_TABLES else 1.0,
                            st.zero_point, True)
        else:
            pre_q = st.out_q
        y = out if table is None and not st.pool else \
            add(f"{st.name}/requantised", conv_shape, pre_q)
        if st.kind == "conv":
            ops.append(Conv2D(st.name, [x], [y], weight=w, bias=bias, input_zp=z_in,
                              requant=requant, stride=(st.stride, st.stride),
                              padding=st.padding))
        else:
            if len(tensors[x].shape) != 2:
                flat = add(f"{st.name}/flat", (st.k,), tensors[x].q)
                ops.append(Reshape(f"{st.name}/flatten", [x], [flat], shape=(1, st.k)))
                x = flat
            ops.append(FullyConnected(st.name, [x], [y], weight=w, bias=bias, input_zp=z_in,
                                      requant=requant))
        if table is not None:
            values = np.asarray(golden.table_values(table), dtype=np.int64)
            unsigned = st.func == Func.TABLE and not st.out_q.signed
            if unsigned and st.pool:
                raise GraphError(f"{st.name}: a uint8 table's output pooled as int8 bytes "
                                 f"has no graph operator")
            t_out = out if not st.pool else add(f"{st.name}/table", conv_shape,
                                                QParams(st.out_q.scale, st.out_q.zero_point,
                                                        True))
            ops.append(Lookup(f"{st.name}/table", [y], [t_out],
                              table=values & 0xff if unsigned else values))
            y = t_out
        if st.pool:
            ops.append(MaxPool2D(f"{st.name}/pool", [y], [out], kernel=(2, 2), stride=(2, 2)))
        add(out, st.out_shape, st.out_q)
        x = out
    return Graph(qnet.name, tensors, ops, ["input"], ["output"])
