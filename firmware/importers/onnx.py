"""ONNX importer: quantised ONNX models to the project's integer graph, bit-exact with
onnxruntime's CPU kernels.

What it reads
-------------
- QDQ models as ``onnxruntime.quantization.quantize_static`` writes them: ``QuantizeLinear``
  on the float input, ``DequantizeLinear`` of int8 weights (per tensor or per output channel)
  and of int32 biases, ``Gemm`` / ``MatMul`` / ``Conv`` between them, a ``QuantizeLinear``
  after (a ``Relu`` / ``Clip`` in between only where onnxruntime folds it: the output range's
  clamp already does its work),
  ``GlobalAveragePool`` (on the core, a depthwise convolution of ones), ``Add`` of two
  quantised tensors and ``AveragePool`` (host operators with onnxruntime's own float32
  arithmetic: :class:`QLinearAdd`, :class:`QLinearAveragePool`), ``MaxPool`` / ``Flatten`` /
  ``Reshape`` between a ``DequantizeLinear`` and a ``QuantizeLinear`` of the same
  parameters, and a ``DequantizeLinear`` on the output;
- the standard-domain QOperator ops ``QLinearMatMul``, ``QLinearConv``, ``MatMulInteger`` and
  ``ConvInteger`` (int32 output), with ``Flatten`` / ``Reshape`` / ``MaxPool`` on their
  integer tensors;
- float models (``Gemm`` / ``MatMul`` + ``Add`` / ``Conv`` / ``Relu`` / ``Flatten``, as
  skl2onnx writes a scikit-learn MLP): :func:`float_network` converts them to a
  :class:`firmware.nn.Network` for the project's own quantiser (:func:`firmware.quant.quantise`
  with calibration data).

Anything else is refused before any work with a :class:`ModelError` naming the node, its
operator and what is supported: unknown operators, a truncated or foreign file, dynamic
shapes, an opset outside :data:`OPSETS`.

onnxruntime's integer arithmetic (measured on onnxruntime 1.32, CPU provider)
---------------------------------------------------------------------------
``QLinearMatMul``, ``QLinearConv`` and the kernels ``quantize_static`` models run as
(onnxruntime fuses ``DequantizeLinear -> Gemm -> QuantizeLinear`` into ``QGemm``,
``... MatMul ...`` into ``QLinearMatMul``, ``... Conv ...`` into ``QLinearConv``; all go through
MLAS's ``MlasRequantizeOutput``) compute, per output column ``n``:

1. ``t = wrap32(sum_k (x_k - zx) * (w_kn - zw_n) + bias_n)``, exact integers (int32 wrap);
2. ``S_n = float32(float32(x_scale * w_scale_n) / y_scale)`` (this order: measured against the
   three other orders on scale triples where they differ);
3. ``v = float32(float32(t) * S_n)``, clamped to ``[lo - zy, hi - zy]``;
4. ``y = round_half_to_even(v) + zy``.

``QuantizeLinear`` of a float input computes ``round_half_to_even(float32(x / scale)) + zp``
(a float32 *division*, not a multiplication by the reciprocal), then saturates.

The core's requantiser computes ``rounding_shift(t * M, shift, HALF_EVEN)`` exactly
(:func:`sim.models.golden.requantise`). With ``M`` the 24-bit mantissa of ``S_n`` and ``shift``
from its exponent (:func:`float32_multiplier`), ``M / 2**shift == S_n`` exactly, so the core
rounds the *exact* product ``t * S_n`` half to even, and onnxruntime rounds the *float32*
product. They agree except where the float32 rounding matters:

- ``float32(t)`` is exact for ``|t| <= 2**24``; beyond that ``t`` itself is rounded first
  (never for an 8x8-bit product sum with ``K * 255 * 255 <= 2**24``, i.e. ``K <= 258``; for
  larger ``K`` only when the sum really is that large);
- ``float32(t * S_n)`` rounds the exact product to 24 significant bits. Every half-integer
  ``j + 0.5`` with ``|j| < 2**22`` is a float32 number, so this rounding can never carry the
  product *across* a tie, only *onto* one: when the exact product lies within half a float32
  ulp of ``j + 0.5`` without being on it, onnxruntime sees a tie and rounds to the even
  neighbour, which is the wrong neighbour half of the time. Exact ties (common with
  power-of-two scales) are float32 numbers and agree. The chance per element is at most
  about ``|v| * 2**-24``: rare, and each case is recognisable (:func:`float32_tie`).
- results that saturate agree (the clamp bounds are integers).

(docs/onnx.md has the measurements, and those of ``QLinearAdd``, ``QLinearAveragePool`` and
``QLinearGlobalAveragePool``.) The integer reference executor therefore equals onnxruntime on
every element except these counted cases, which the tests check one by one. Per-channel scales
are one ``(M, shift)`` per column (the core's per-column shifts). uint8 activations are the
same integers shifted by 128 (``clamp(r + zy, 0, 255) - 128 == clamp(r + zy - 128, -128,
127)``), so every tensor the core writes is int8, and a uint8 network input goes in shifted too
(a host ``x - 128``, so cores with int8 operands only take it). The float scale is per tensor;
a ``float16`` scale is converted exactly to float32 first.

Weight zero points other than 0 (uint8 weights) change ``w - zw`` into ``-255..255``, more than
an int8 weight tile holds. The importer splits ``w - zw`` into int8 parts (two, or three when
it reaches 255) and runs ``[x, x] @ [part_0; part_1]``: the same input read twice (stacked
along K), which is exact (:func:`split_weights`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from firmware import graph as g
from firmware.importers import ModelError
from firmware.quant import QParams
from hdl.isa import Func, Rounding
from sim.models import golden

__all__ = ["ModelError", "OPSETS", "float32_multiplier", "onnxruntime_requantise",
           "quantize_linear", "float32_tie", "split_weights"]

#: Opsets of the default domain the importer reads: from 10 (QLinearMatMul, QLinearConv,
#: MatMulInteger, ConvInteger, QuantizeLinear) to 23, the newest the onnx package here defines.
OPSETS = range(10, 24)


F32 = np.float32


# onnxruntime's arithmetic and its exact integer form ------------------------------------------

def float32_multiplier(scale) -> tuple[int, int]:
    """``(M, shift)`` with ``M / 2**shift == float32(scale)`` exactly: ``M`` the 24-bit
    mantissa (fewer bits when the low ones are zero), ``0 <= shift <= 63``.

    A scale whose exact form needs a shift above 63 is below ``2**-40`` and maps every int32
    to 0 (``|t * S| < 2**-9``), so it becomes ``(0, 0)``. A scale of ``2**24`` or more is an
    integer (shift 0), refused from ``2**31`` on (the multiplier is int32).
    """
    s = F32(scale)
    if not np.isfinite(s) or s <= 0:
        raise ModelError(f"requantisation scale {scale!r} is not a positive finite number")
    mantissa, exponent = math.frexp(float(s))       # s = mantissa * 2**exponent, exact
    m = int(mantissa * (1 << 24))                     # exact: float32 has 24 bits
    shift = 24 - exponent
    while m % 2 == 0 and shift > 0:
        m //= 2
        shift -= 1
    if shift > 63:
        return 0, 0
    if shift < 0:
        m <<= -shift
        shift = 0
        if m >= 1 << 31:
            raise ModelError(f"requantisation scale {float(s)!r} is too large for the "
                             f"int32 multiplier (at most 2**31 - 1)")
    return m, shift


def onnxruntime_requantise(t, scale, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """onnxruntime's float32 requantisation of int32 ``t`` (MLAS's
    ``MlasRequantizeOutput``): ``round_half_even(clamp(float32(t) * scale)) + zero_point``."""
    v = np.asarray(t, dtype=np.int64).astype(F32) * np.asarray(scale, dtype=F32)
    v = np.clip(v.astype(F32), F32(lo - zero_point), F32(hi - zero_point))
    return np.rint(v).astype(np.int64) + zero_point


def quantize_linear(x, scale, zero_point: int, signed: bool) -> np.ndarray:
    """ONNX ``QuantizeLinear`` as onnxruntime computes it: ``saturate(round_half_even(
    float32(x / scale)) + zero_point)``."""
    lo, hi = golden.operand_range(signed)
    v = (np.asarray(x, dtype=F32) / F32(scale)).astype(F32)
    v = np.clip(v, F32(lo - zero_point), F32(hi - zero_point))
    return np.rint(v).astype(np.int64) + zero_point


def float32_tie(t, scale) -> np.ndarray:
    """Where onnxruntime's float32 requantisation of ``t`` differs from the exact rounding
    by the float32 argument (module notes): ``float32(t)`` inexact, or the float32 product
    on a half-integer the exact product ``t * scale`` is not on."""
    t = np.asarray(t, dtype=np.int64)
    m, shift = float32_multiplier(scale)
    inexact_t = np.abs(t) > (1 << 24)
    v = (t.astype(F32) * F32(scale)).astype(F32).astype(np.float64)
    on_tie = (v - np.floor(v)) == 0.5
    exact = t * m                                     # t * S = exact / 2**shift, |.| < 2**55
    if shift == 0:
        exact_tie = np.zeros(t.shape, dtype=bool)
    else:
        exact_tie = (exact & np.int64((1 << shift) - 1)) == np.int64(1 << (shift - 1))
    return inexact_t | (on_tie & ~exact_tie)


def exact_requantise(t, scale, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """The core's requantisation of ``t`` for a float32 ``scale`` (:func:`float32_multiplier`,
    half to even), for output range ``lo..hi`` (uint8 via the int8 shift by 128)."""
    m, shift = float32_multiplier(scale)
    offset = lo + 128                      # 0 for int8, 128 for uint8
    q = golden.requantise(t, 0, m, shift, zero_point - offset, Rounding.HALF_EVEN.value)
    return np.clip(q + offset, lo, hi)


def split_weights(d: np.ndarray) -> list[np.ndarray]:
    """Int8 matrices whose sum is the integer matrix ``d``: ``[d]`` when it fits int8, else
    the fewest ``n`` parts ``floor((d + i) / n)``, ``i = 0 .. n - 1`` (they sum to ``d`` and
    differ by at most 1, so each is int8 when ``-128 n <= d <= 127 n``)."""
    d = np.asarray(d, dtype=np.int64)
    n = max(1, -(-int(d.max(initial=0)) // 127), -(-int(-d.min(initial=0)) // 128))
    return [(d + i) // n for i in range(n)]


# Host operators of ONNX's own semantics ---------------------------------------------------

@dataclass(eq=False)
class QuantizeLinear(g.Op):
    """ONNX ``QuantizeLinear`` as onnxruntime computes it (:func:`quantize_linear`); with
    ``float64`` the project quantiser's own rounding (:meth:`firmware.quant.QParams.quantise`)."""
    scale: float = 1.0
    zero_point: int = 0
    signed: bool = True
    float64: bool = False

    def reference(self, x):
        bad = np.argwhere(~np.isfinite(np.asarray(x, dtype=np.float64)))
        if len(bad):
            raise g.GraphError(f"{self.name}: the input has {len(bad)} NaN or infinite values "
                               f"(the first at {tuple(int(i) for i in bad[0])}); inputs must "
                               f"be finite numbers")
        if self.float64:
            return [QParams(self.scale, self.zero_point, self.signed).quantise(x)]
        return [quantize_linear(x, self.scale, self.zero_point, self.signed)]


#: The layout change between ONNX's NCHW and the core's NHWC (now an operator of the graph).
Transpose = g.Transpose


@dataclass(eq=False)
class Offset(g.Op):
    """``x + offset``: a uint8 tensor and the int8 tensor 128 below it (the core writes int8)."""
    offset: int = 0

    def reference(self, x):
        return [np.asarray(x, dtype=np.int64) + self.offset]


@dataclass(eq=False)
class Unflatten(g.Op):
    """``x.reshape(-1, *shape)``: a ``(b, m, K)`` input of a matrix product to ``b * m`` rows
    of a fully connected operator, and its ``(b * m, N)`` output back to ``(b, m, N)``."""
    shape: tuple[int, ...] = ()

    def reference(self, x):
        return [np.asarray(x).reshape(-1, *self.shape)]


@dataclass(eq=False)
class Repeat(g.Op):
    """``times`` copies of ``x`` along the last axis: the input of a product whose weights
    were split along K into int8 parts (:func:`split_weights`)."""
    times: int = 2

    def reference(self, x):
        return [np.concatenate([np.asarray(x, dtype=np.int64)] * self.times, axis=-1)]


@dataclass(eq=False)
class IntegerMatMul(g.Op):
    """ONNX ``MatMulInteger``: int32 ``(x - zx) @ (w - zw)``, wrapping. A host operator: the
    activation unit writes int8, and this output is int32."""
    weight: np.ndarray = None
    input_zp: int = 0
    weight_zp: np.ndarray = None

    def reference(self, x):
        x = np.asarray(x, dtype=np.int64) - self.input_zp
        return [golden.wrap(x @ (self.weight - self.weight_zp), 32)]


@dataclass(eq=False)
class IntegerConv(g.Op):
    """ONNX ``ConvInteger`` (NHWC, like :class:`firmware.graph.Conv2D`), int32 output; a host
    operator for the same reason as :class:`IntegerMatMul`."""
    conv: g.Conv2D = None
    weight: np.ndarray = None          # (kh, kw, cin, cout), minus the weight zero points

    def reference(self, x):
        p = self.conv.patches(x) - self.conv.input_zp
        n, ho, wo = p.shape[:3]
        acc = p.reshape(n * ho * wo, -1) @ self.weight.reshape(-1, self.weight.shape[-1])
        return [golden.wrap(acc, 32).reshape(n, ho, wo, -1)]


def fma32(x, y, z) -> np.ndarray:
    """float32 ``fma(x, y, z)``, exactly: one rounding of ``x * y + z``. ``x * y`` is exact in
    float64 for the small integers and float32 factors used here; the float64 sum's own
    rounding error (TwoSum) decides the one case where it matters, a float64 sum exactly
    halfway between two float32 numbers."""
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    p = x * y
    s = p + z
    bp = s - z
    err = (p - bp) + (z - (s - bp))
    r = s.astype(F32)
    r64 = r.astype(np.float64)
    other = np.where(s > r64, np.nextafter(r, F32(np.inf)),
                     np.nextafter(r, F32(-np.inf))).astype(np.float64)
    halfway = (s == (r64 + other) / 2) & (err != 0)
    toward = np.where(err > 0, np.maximum(r64, other), np.minimum(r64, other))
    return np.where(halfway, toward, r64).astype(F32)


@dataclass(eq=False)
class QLinearAdd(g.ElementwiseBinary):
    """onnxruntime's ``QLinearAdd`` (what ``DequantizeLinear`` x 2 -> ``Add`` ->
    ``QuantizeLinear`` runs as), as MLAS's AVX2 kernel computes it on same-shape inputs:
    ``rA = float32(sA / sC)``, ``rB = float32(sB / sC)``, ``fixed = float32(zC - fma(rA, zA,
    float32(rB * zB)))``, ``y = saturate(round_half_even(fma(a, rA, fma(b, rB, fixed))))``,
    on the ONNX values (``offsets`` turn the graph's int8 form of a uint8 tensor back)."""
    scales: tuple[float, float, float] = (1.0, 1.0, 1.0)
    zero_points: tuple[int, int, int] = (0, 0, 0)
    offsets: tuple[int, int, int] = (0, 0, 0)
    out_range: tuple[int, int] = (-128, 127)

    def reference(self, a, b):
        sa, sb, sc = (F32(v) for v in self.scales)
        za, zb, zc = self.zero_points
        ra, rb = F32(sa / sc), F32(sb / sc)
        fixed = F32(F32(zc) - fma32(ra, za, F32(rb * F32(zb))))
        a = np.asarray(a, np.int64) + self.offsets[0]
        b = np.asarray(b, np.int64) + self.offsets[1]
        v = fma32(a, ra, fma32(b, rb, fixed))
        q = np.clip(np.rint(v.astype(np.float64)), *self.out_range).astype(np.int64)
        return [q - self.offsets[2]]


@dataclass(eq=False)
class QLinearAveragePool(g.Op):
    """onnxruntime's ``QLinearAveragePool`` (what ``DequantizeLinear`` -> ``AveragePool`` ->
    ``QuantizeLinear`` runs as): each input dequantised in float32, ``x_scale * (x - x_zp)``;
    the window's values summed in float32 in row-major order; divided by the count (the
    window's positions inside the input, or the whole kernel with ``count_include_pad``); then
    ``round_half_even(float32(float32(v / y_scale) + y_zp))``, saturated. NHWC, on the ONNX
    values (``offsets`` as for :class:`QLinearAdd`)."""
    kernel: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    count_include_pad: bool = False
    scales: tuple[float, float] = (1.0, 1.0)
    zero_points: tuple[int, int] = (0, 0)
    offsets: tuple[int, int] = (0, 0)
    out_range: tuple[int, int] = (-128, 127)

    def reference(self, x):
        x = np.asarray(x, np.int64) + self.offsets[0]
        xs, ys = F32(self.scales[0]), F32(self.scales[1])
        xf = (xs * (x - self.zero_points[0]).astype(F32)).astype(F32)
        total = count = None
        for v, inside in g._pool_windows(xf, self.kernel, self.stride, self.padding, 0.0):
            v = np.where(inside, v, F32(0)).astype(F32)
            total = v if total is None else (total + v).astype(F32)
            count = inside.astype(np.int64) if count is None else count + inside
        if self.count_include_pad:
            count = np.full(count.shape, self.kernel[0] * self.kernel[1])
        mean = (total / np.broadcast_to(count, total.shape).astype(F32)).astype(F32)
        v = ((mean / ys).astype(F32) + F32(self.zero_points[1])).astype(F32)
        q = np.clip(np.rint(v.astype(np.float64)), *self.out_range).astype(np.int64)
        return [q - self.offsets[1]]


# Reading the model -----------------------------------------------------------------------

#: Operators of the default domain the importer translates.
SUPPORTED = ("QuantizeLinear", "DequantizeLinear", "Gemm", "MatMul", "Conv", "QLinearMatMul",
             "QLinearConv", "MatMulInteger", "ConvInteger", "Relu", "Clip", "MaxPool",
             "Flatten", "Reshape", "Identity", "GlobalAveragePool", "Add",
             "AveragePool", "Constant")

_ONNX_INT = {2: "uint8", 3: "int8", 6: "int32"}


def _read(source):
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"{path}: cannot read the model file ({error.strerror})") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as error:
        raise ModelError(f"{path}: not a readable ONNX model (truncated or another format: "
                         f"{error})") from None
    if not model.HasField("graph") or not model.graph.node or not model.opset_import:
        raise ModelError(f"{path}: not an ONNX model (no graph, no nodes or no opset; "
                         f"truncated or another format)")
    return model


def _where(node) -> str:
    return f"node {node.name or node.output[0]!r} ({node.op_type})"


def _check_model(model, ops=SUPPORTED) -> None:
    """Opsets, operators and input shapes, before any work."""
    versions = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    v = versions.get("ai.onnx")
    if v is None or v not in OPSETS:
        raise ModelError(f"the model imports opset {v} of the default domain; supported: "
                         f"{OPSETS.start} to {OPSETS.stop - 1}")
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise ModelError(f"{_where(node)}: operator of domain {node.domain!r}; supported: "
                             f"the default domain's {', '.join(ops)}")
        if node.op_type not in ops:
            raise ModelError(f"{_where(node)}: operator {node.op_type} is not supported; "
                             f"supported: {', '.join(ops)}")
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        dims = list(tt.shape.dim)
        if not tt.HasField("shape") or not dims:
            raise ModelError(f"input {inp.name!r}: no static shape; the importer needs every "
                             f"dimension but the batch fixed")
        for i, d in enumerate(dims[1:], start=1):
            if not d.HasField("dim_value") or d.dim_value < 1:
                raise ModelError(f"input {inp.name!r}: dimension {i} is dynamic "
                                 f"({d.dim_param or '?'}); only the batch (dimension 0) may be")


@dataclass
class _Value:
    """What the importer knows of an ONNX tensor."""
    kind: str               # "const", "dqconst", "float" (graph input), "int", "dq", "acc"
    shape: tuple[int, ...] = ()         # ONNX shape, batch first
    name: str = ""                      # graph tensor holding it (int, dq)
    const: np.ndarray | None = None
    dtype: str = "int8"                 # ONNX element type of an int tensor
    scale: np.ndarray | None = None     # dq: float32 scale(s)
    zero_point: np.ndarray | None = None
    axis: int = 1
    offset: int = 0                     # graph value = ONNX value - offset
    nhwc: bool = False                  # a 4-D tensor stored NHWC
    pending: dict = field(default_factory=dict)   # acc: the product awaiting its Q


class _Importer:
    def __init__(self, model, name: str):
        import onnx  # noqa: F401
        from onnx import numpy_helper

        self.model = model
        self.name = name
        self.values: dict[str, _Value] = {}
        self.tensors: dict[str, g.Tensor] = {}
        self.ops: list[g.Op] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        for init in model.graph.initializer:
            self.values[init.name] = _Value("const", const=numpy_helper.to_array(init))
        self._n = 0

    # helpers ---------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self._n += 1
        name = f"{base}#{self._n}"
        while name in self.tensors:
            self._n += 1
            name = f"{base}#{self._n}"
        return name

    def tensor(self, name: str, shape, dtype: str, q: QParams | None = None) -> str:
        self.tensors[name] = g.Tensor(name, tuple(int(d) for d in shape), dtype, q)
        return name

    def const(self, node, i: int, what: str, optional: bool = False):
        if i >= len(node.input) or not node.input[i]:
            if optional:
                return None
            raise ModelError(f"{_where(node)}: {what} is missing")
        v = self.values.get(node.input[i])
        if v is None or v.kind != "const":
            raise ModelError(f"{_where(node)}: {what} ({node.input[i]!r}) must be a constant "
                             f"(an initializer); the importer needs fixed quantisation "
                             f"parameters and weights")
        return v.const

    def value(self, node, i: int) -> _Value:
        v = self.values.get(node.input[i])
        if v is None:
            raise ModelError(f"{_where(node)}: input {node.input[i]!r} is computed by no "
                             f"earlier node and is no graph input")
        return v

    def int_shape(self, v: _Value) -> tuple[int, ...]:
        """The graph tensor's shape (NHWC when ``v.nhwc``)."""
        return self.tensors[v.name].shape

    # the walk --------------------------------------------------------------------------
    def run(self) -> g.Graph:
        graph = self.model.graph
        inits = {i.name for i in graph.initializer}
        data_inputs = [i for i in graph.input if i.name not in inits]
        if len(data_inputs) != 1:
            raise ModelError(f"the model has {len(data_inputs)} non-constant inputs "
                             f"({', '.join(i.name for i in data_inputs)}); supported: one "
                             f"(give the others as initializers)")
        inp = data_inputs[0]
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                 for d in tt.shape.dim]
        dtype = {1: "float32", **_ONNX_INT}.get(tt.elem_type)
        if dtype is None or dtype == "int32":
            raise ModelError(f"input {inp.name!r}: element type {tt.elem_type}; supported: "
                             f"float32, uint8, int8")
        self.tensor(inp.name, shape, dtype)
        self.inputs.append(inp.name)
        if dtype == "float32":
            self.values[inp.name] = _Value("float", tuple(shape), inp.name, dtype="float32")
        else:
            v = _Value("int", tuple(shape), inp.name, dtype=dtype)
            self.values[inp.name] = self.as_int8(v, inp.name)
        for node in graph.node:
            handler = getattr(self, f"op_{node.op_type}")
            handler(node)
        for out in graph.output:
            self.finish_output(out.name)
        result = g.Graph(self.name, self.tensors, self.ops, self.inputs, self.outputs)
        result.onnx_names = {name: (v.name, v.offset, v.nhwc) for name, v in
                             self.values.items() if v.kind == "int"}
        return result

    def finish_output(self, name: str) -> None:
        v = self.values.get(name)
        if v is None:
            raise ModelError(f"output {name!r} is computed by no node")
        if v.kind == "int" or v.kind == "dq":
            src = v.name
            shape = self.int_shape(v)
            if v.nhwc and len(shape) == 4:
                t = self.fresh(name)
                shape = (shape[0], shape[3], shape[1], shape[2])
                self.tensor(t, shape, self.tensors[src].dtype, self.tensors[src].q)
                self.ops.append(Transpose(f"{name}:nchw", [src], [t], perm=(0, 3, 1, 2)))
                src = t
            if v.kind == "dq":
                self.tensor(name, shape, "float32")
                scale = float(v.scale.reshape(-1)[0])
                self.ops.append(g.Dequantize(f"{name}:dequantize", [src], [name], scale=scale,
                                             zero_point=int(v.zero_point.reshape(-1)[0])
                                             - v.offset))
            elif v.offset:
                self.tensor(name, shape, v.dtype)
                self.ops.append(Offset(f"{name}:{v.dtype}", [src], [name], offset=v.offset))
            elif src != name:
                self.tensor(name, shape, self.tensors[src].dtype, self.tensors[src].q)
                self.ops.append(Offset(f"{name}:copy", [src], [name], offset=0))
            self.outputs.append(name)
            return
        if v.kind == "float" and name in self.inputs:
            raise ModelError(f"output {name!r} is the float input itself; nothing to run")
        raise ModelError(f"output {name!r} is a float result with no QuantizeLinear after it "
                         f"(the core computes quantised tensors only)")

    def set_int(self, name: str, node_out: str, shape, dtype: str, scale, zp, offset: int,
                nhwc: bool) -> None:
        self.values[node_out] = _Value("int", tuple(shape), name, dtype=dtype,
                                       scale=np.asarray(scale, F32),
                                       zero_point=np.asarray(zp), offset=offset, nhwc=nhwc)

    # constants and Q/DQ ---------------------------------------------------------------
    def op_Constant(self, node):
        from onnx import numpy_helper

        value = next((a for a in node.attribute if a.name == "value"), None)
        if value is None:
            raise ModelError(f"{_where(node)}: supported: a Constant with a tensor 'value'")
        self.values[node.output[0]] = _Value("const", const=numpy_helper.to_array(value.t))

    def op_Identity(self, node):
        self.values[node.output[0]] = self.value(node, 0)

    def _scale_zp(self, node, first: int, dtype_of=None):
        scale = np.asarray(self.const(node, first, "the scale"))
        if scale.dtype not in (np.float32, np.float16):
            raise ModelError(f"{_where(node)}: scale of type {scale.dtype}; supported: "
                             f"float32, float16")
        scale = scale.astype(F32)
        if not np.isfinite(scale).all() or (scale <= 0).any():
            raise ModelError(f"{_where(node)}: a scale is not a positive finite number")
        zp = self.const(node, first + 1, "the zero point", optional=True)
        if zp is None:
            zp = np.zeros(scale.shape, dtype=np.uint8)
        return scale, np.asarray(zp)

    def _check_qdq_attrs(self, node):
        for a in node.attribute:
            if a.name == "block_size" and a.i != 0:
                raise ModelError(f"{_where(node)}: blocked quantisation (block_size {a.i}); "
                                 f"supported: per tensor and per axis")
            if a.name == "saturate" and a.i != 1:
                raise ModelError(f"{_where(node)}: saturate=0 applies to float8 only")
            if a.name == "output_dtype" and a.i not in (0, 2, 3):
                raise ModelError(f"{_where(node)}: output_dtype {a.i}; supported: uint8, "
                                 f"int8")

    def op_QuantizeLinear(self, node):
        self._check_qdq_attrs(node)
        scale, zp = self._scale_zp(node, 1)
        if scale.size != 1:
            raise ModelError(f"{_where(node)}: a per-axis QuantizeLinear of an activation; "
                             f"supported: one scale per tensor")
        dtype = _ONNX_INT.get(_np_onnx(zp.dtype))
        if dtype not in ("uint8", "int8"):
            raise ModelError(f"{_where(node)}: quantises to {zp.dtype}; supported: uint8, "
                             f"int8")
        s, z = F32(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])
        x = self.value(node, 0)
        out = node.output[0]
        if x.kind == "float":
            name = self.fresh(out)
            self.tensor(name, x.shape, dtype, QParams(float(s), z, dtype == "int8"))
            self.ops.append(QuantizeLinear(_name(node), [x.name], [name], scale=float(s),
                                           zero_point=z, signed=dtype == "int8"))
            v = self.as_int8(_Value("int", x.shape, name, dtype=dtype, scale=np.asarray(s),
                                    zero_point=np.asarray(z)), out)
            if len(x.shape) == 4:
                v = self.to_nhwc(v, out)
            self.values[out] = v
            return
        if x.kind == "acc":
            self.emit_product(node, x, s, z, dtype)
            return
        if x.kind == "dq":
            same = (x.scale.size == 1 and F32(x.scale.reshape(-1)[0]) == s
                    and int(x.zero_point.reshape(-1)[0]) == z and x.dtype == dtype)
            if not same:
                raise ModelError(f"{_where(node)}: requantises {node.input[0]!r} to other "
                                 f"parameters with no operator between; supported: the same "
                                 f"scale and zero point as its DequantizeLinear")
            self.values[out] = _Value("int", x.shape, x.name, dtype=x.dtype, scale=x.scale,
                                      zero_point=x.zero_point, offset=x.offset, nhwc=x.nhwc)
            return
        raise ModelError(f"{_where(node)}: quantises {node.input[0]!r}, which is not the float "
                         f"input, a Gemm/MatMul/Conv result or a dequantised tensor")

    def op_DequantizeLinear(self, node):
        self._check_qdq_attrs(node)
        scale, zp = self._scale_zp(node, 1)
        axis = _attr(node, "axis", 1)
        x = self.value(node, 0)
        out = node.output[0]
        if x.kind == "const":
            self.values[out] = _Value("dqconst", x.const.shape, const=x.const, scale=scale,
                                      zero_point=zp, axis=axis,
                                      dtype=str(np.asarray(x.const).dtype))
            return
        if x.kind != "int":
            raise ModelError(f"{_where(node)}: dequantises {node.input[0]!r}, which is not "
                             f"an integer tensor")
        if scale.size != 1:
            raise ModelError(f"{_where(node)}: a per-axis DequantizeLinear of an activation; "
                             f"supported: one scale per tensor")
        self.values[out] = _Value("dq", x.shape, x.name, dtype=x.dtype, scale=scale,
                                  zero_point=zp, offset=x.offset, nhwc=x.nhwc)

    def as_int8(self, v: _Value, base: str) -> _Value:
        """A uint8 tensor as the int8 tensor 128 below it (cores with int8 operands only
        take it so, and every tensor the core writes is int8 anyway); others unchanged."""
        if v.dtype != "uint8" or v.offset:
            return v
        src = self.tensors[v.name]
        q = src.q and QParams(src.q.scale, src.q.zero_point - 128, True)
        name = self.fresh(base)
        self.tensor(name, src.shape, "int8", q)
        self.ops.append(Offset(f"{base}:int8", [v.name], [name], offset=-128))
        return _Value(v.kind, v.shape, name, dtype=v.dtype, scale=v.scale,
                      zero_point=v.zero_point, offset=128, nhwc=v.nhwc)

    def to_nhwc(self, v: _Value, base: str) -> _Value:
        n, c, h, w = self.tensors[v.name].shape
        name = self.fresh(base)
        src = self.tensors[v.name]
        self.tensor(name, (n, h, w, c), src.dtype, src.q)
        self.ops.append(Transpose(f"{base}:nhwc", [v.name], [name], perm=(0, 2, 3, 1)))
        return _Value(v.kind, v.shape, name, dtype=v.dtype, scale=v.scale,
                      zero_point=v.zero_point, offset=v.offset, nhwc=True)

    # products ---------------------------------------------------------------------------
    def _dq_input(self, node, v: _Value) -> _Value:
        if v.kind != "dq":
            raise ModelError(f"{_where(node)}: input {node.input[0]!r} is not a dequantised "
                             f"integer tensor; supported: DequantizeLinear(QuantizeLinear(...)) "
                             f"activations (a QDQ model)")
        return v

    def _dq_weight(self, node, i: int, what: str) -> _Value:
        w = self.values.get(node.input[i]) if i < len(node.input) else None
        if w is None or w.kind != "dqconst":
            raise ModelError(f"{_where(node)}: {what} {node.input[i]!r} is not a "
                             f"DequantizeLinear of a constant integer tensor")
        return w

    def op_Gemm(self, node):
        if _attr(node, "transA", 0):
            raise ModelError(f"{_where(node)}: transA=1; supported: transA=0")
        if _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0:
            raise ModelError(f"{_where(node)}: alpha and beta must be 1")
        self._qdq_product(node, "dense", trans_b=bool(_attr(node, "transB", 0)))

    def op_MatMul(self, node):
        self._qdq_product(node, "dense", trans_b=False)

    def op_Conv(self, node):
        self._qdq_product(node, "conv", trans_b=False)

    def _qdq_product(self, node, kind, trans_b):
        x = self._dq_input(node, self.value(node, 0))
        w = self._dq_weight(node, 1, "the weight")
        q = w.const.astype(np.int64)
        if w.dtype not in ("int8", "uint8"):
            raise ModelError(f"{_where(node)}: weights of type {w.dtype}; supported: int8, "
                             f"uint8")
        if kind == "dense":
            if q.ndim != 2:
                raise ModelError(f"{_where(node)}: weight shape {q.shape}; supported: 2-D")
            if trans_b:
                q = q.T
            ch_axis = 0 if trans_b else 1
            n = q.shape[1]
        else:
            if q.ndim != 4:
                raise ModelError(f"{_where(node)}: weight shape {q.shape}; supported: 4-D "
                                 f"(2-D convolutions)")
            ch_axis, n = 0, q.shape[0]
        w_scale = _per_channel(node, w, ch_axis, n, "weight")
        w_zp = _per_channel(node, w, ch_axis, n, "weight", zero_points=True)
        bias = None
        if len(node.input) > 2 and node.input[2]:
            b = self._dq_weight(node, 2, "the bias")
            if b.dtype != "int32":
                raise ModelError(f"{_where(node)}: bias of type {b.dtype}; supported: int32 "
                                 f"(quantised with scale input_scale * weight_scale)")
            b_scale = _per_channel(node, b, 0, n, "bias")
            want = (F32(x.scale.reshape(-1)[0]) * w_scale).astype(F32)
            if not np.array_equal(b_scale, want) or (b.zero_point != 0).any():
                raise ModelError(f"{_where(node)}: the bias scale is not input_scale * "
                                 f"weight_scale (float32) with zero point 0")
            bias = b.const.astype(np.int64).reshape(-1)
            if bias.size != n:
                raise ModelError(f"{_where(node)}: {bias.size} biases for {n} outputs")
        self.values[node.output[0]] = _Value("acc", pending=dict(
            node=node, kind=kind, x=x, x_scale=F32(x.scale.reshape(-1)[0]),
            x_zp=int(x.zero_point.reshape(-1)[0]), weight=q, w_scale=w_scale, w_zp=w_zp,
            bias=bias, func=Func.IDENTITY, clip=None))

    def op_Relu(self, node):
        v = self.value(node, 0)
        if v.kind != "acc" or v.pending["kind"] not in ("dense", "conv") or \
                v.pending["func"] != Func.IDENTITY:
            raise ModelError(f"{_where(node)}: supported after a Gemm/MatMul/Conv whose result "
                             f"is quantised next (the activation unit applies it)")
        v.pending["func"] = Func.RELU
        v.pending["act_node"] = node
        self.values[node.output[0]] = v

    def op_Clip(self, node):
        v = self.value(node, 0)
        if v.kind != "acc" or v.pending["kind"] not in ("dense", "conv") or \
                v.pending["func"] != Func.IDENTITY:
            raise ModelError(f"{_where(node)}: supported after a Gemm/MatMul/Conv whose result "
                             f"is quantised next (the activation unit applies it)")
        lo = self.const(node, 1, "min", optional=True)
        hi = self.const(node, 2, "max", optional=True)
        v.pending["func"] = Func.CLAMP
        v.pending["act_node"] = node
        v.pending["clip"] = (None if lo is None else float(lo), None if hi is None else
                             float(hi))
        self.values[node.output[0]] = v

    def op_Add(self, node):
        a, b = self.value(node, 0), self.value(node, 1)
        if a.kind != "dq" or b.kind != "dq":
            raise ModelError(f"{_where(node)}: supported: the sum of two dequantised integer "
                             f"tensors (a QDQ model's residual add), not of a constant or a "
                             f"float result")
        if a.nhwc != b.nhwc:
            a = a if a.nhwc else self._nhwc_of(node, a)
            b = b if b.nhwc else self._nhwc_of(node, b)
        if self.tensors[a.name].shape[1:] != self.tensors[b.name].shape[1:] or \
                a.dtype != b.dtype:
            raise ModelError(f"{_where(node)}: inputs of shapes {a.shape} and {b.shape}, types "
                             f"{a.dtype} and {b.dtype}; supported: the same shape and type (no "
                             f"broadcasting)")
        self.values[node.output[0]] = _Value("acc", pending=dict(node=node, kind="add", x=a,
                                                                 y=b))

    def op_AveragePool(self, node):
        v = self._dq_input(node, self.value(node, 0))
        if not v.nhwc:
            v = self._nhwc_of(node, v)
        if _attr(node, "ceil_mode", 0) or any(d != 1 for d in _attr(node, "dilations", [])):
            raise ModelError(f"{_where(node)}: ceil_mode=1 or dilations; supported: "
                             f"ceil_mode=0, no dilation")
        kernel = tuple(_attr(node, "kernel_shape", []))
        if len(kernel) != 2:
            raise ModelError(f"{_where(node)}: kernel_shape {kernel}; supported: 2-D")
        geo = _conv_geometry(node, v, self.tensors[v.name].shape, (0, 0, *kernel))
        self.values[node.output[0]] = _Value("acc", pending=dict(
            node=node, kind="avgpool", x=v, kernel=kernel, geo=geo,
            count_include_pad=bool(_attr(node, "count_include_pad", 0))))

    def op_GlobalAveragePool(self, node):
        v = self._dq_input(node, self.value(node, 0))
        if not v.nhwc:
            v = self._nhwc_of(node, v)
        self.values[node.output[0]] = _Value("acc", pending=dict(node=node, kind="gap", x=v))

    def emit_product(self, qnode, v: _Value, y_scale, y_zp: int, y_dtype: str):
        p = v.pending
        node = p["node"]
        x: _Value = p["x"]
        if p["kind"] == "add":
            a, b = x, p["y"]
            if y_dtype != a.dtype:
                raise ModelError(f"{_where(qnode)}: quantises an Add of {a.dtype} tensors to "
                                 f"{y_dtype}; supported: the same type")
            offset = 128 if y_dtype == "uint8" else 0
            name = self.fresh(qnode.output[0])
            shape = self.tensors[a.name].shape
            self.tensor(name, shape, "int8", QParams(float(y_scale), y_zp - offset, True))
            self.ops.append(QLinearAdd(
                _name(node), [a.name, b.name], [name],
                scales=(float(a.scale.reshape(-1)[0]), float(b.scale.reshape(-1)[0]),
                        float(y_scale)),
                zero_points=(int(a.zero_point.reshape(-1)[0]), int(b.zero_point.reshape(-1)[0]),
                             y_zp),
                offsets=(a.offset, b.offset, offset),
                out_range=golden.operand_range(y_dtype == "int8")))
            self.set_int(name, qnode.output[0], a.shape, y_dtype, y_scale, y_zp, offset, a.nhwc)
            return
        if p["kind"] == "avgpool":
            if y_dtype != x.dtype:
                raise ModelError(f"{_where(qnode)}: quantises an AveragePool of {x.dtype} to "
                                 f"{y_dtype}; supported: the same type")
            offset = 128 if y_dtype == "uint8" else 0
            geo = p["geo"]
            op = QLinearAveragePool(
                _name(node), [x.name], [], kernel=p["kernel"], stride=geo["stride"],
                padding=geo["padding"], count_include_pad=p["count_include_pad"],
                scales=(float(x.scale.reshape(-1)[0]), float(y_scale)),
                zero_points=(int(x.zero_point.reshape(-1)[0]), y_zp),
                offsets=(x.offset, offset), out_range=golden.operand_range(y_dtype == "int8"))
            nb, h, w, c = self.tensors[x.name].shape
            _, ho, wo, _ = op.reference(np.zeros((1, h, w, c), np.int64))[0].shape
            name = self.fresh(qnode.output[0])
            op.outputs = [name]
            self.tensor(name, (nb, ho, wo, c), "int8", QParams(float(y_scale), y_zp - offset))
            self.ops.append(op)
            self.set_int(name, qnode.output[0], (x.shape[0], c, ho, wo), y_dtype, y_scale, y_zp,
                         offset, True)
            return
        if p["kind"] == "gap":
            # onnxruntime's QLinearGlobalAveragePool: the int32 sum minus the zero point's,
            # requantised by float32(x_scale / float32(y_scale * positions)) as MLAS's
            # requantisation does; on the core a depthwise convolution with weights 1.
            _, h, w, c = self.tensors[x.name].shape
            scale = F32(F32(x.scale.reshape(-1)[0]) / F32(F32(y_scale) * F32(h * w)))
            self._product(node, qnode.output[0], x, 1.0, int(x.zero_point.reshape(-1)[0]),
                          np.ones((c, 1, h, w), np.int64), np.ones(c, F32), np.zeros(c),
                          None, y_scale, y_zp, y_dtype, Func.IDENTITY, None, "conv",
                          scales=np.full(c, scale, F32), groups=c)
            return
        self._product(node, qnode.output[0], x, p["x_scale"], p["x_zp"], p["weight"],
                      p["w_scale"], p["w_zp"], p["bias"], y_scale, y_zp, y_dtype, p["func"],
                      p["clip"], p["kind"], act_node=p.get("act_node"))

    def _product(self, node, out, x: _Value, x_scale, x_zp, weight, w_scale, w_zp, bias,
                 y_scale, y_zp, y_dtype, func, clip, kind, scales=None, groups=None,
                 act_node=None):
        """The core operator(s) of one quantised product: ``out`` (ONNX name) =
        requantise((x - x_zp) @ (weight - w_zp) + bias)."""
        n = weight.shape[1] if kind == "dense" else weight.shape[0]
        lo, hi = golden.operand_range(y_dtype == "int8")
        offset = 128 if y_dtype == "uint8" else 0
        zq = y_zp - offset                                   # the int8 zero point
        if scales is None:
            s = (F32(x_scale) * np.asarray(w_scale, F32)).astype(F32) / F32(y_scale)
        else:
            s = np.asarray(scales, F32)
        s = np.broadcast_to(s.astype(F32), (n,))
        mults, shifts = zip(*(float32_multiplier(si) for si in s), strict=True)
        clamp_hi = 127
        # onnxruntime folds a Relu / Clip before a QuantizeLinear into its integer kernels
        # only when the output range's own clamp already does its work; otherwise it runs the
        # product in float32 (FusedGemm, Conv), which no integer arithmetic reproduces.
        act = act_node or node
        if func == Func.RELU and y_zp != lo:
            raise ModelError(f"{_where(act)}: a Relu before a QuantizeLinear of zero point "
                             f"{y_zp}: onnxruntime folds it into its integer kernel only when "
                             f"the zero point is the type's minimum {lo} (as quantize_static "
                             f"writes it) and otherwise computes in float; supported: {lo}")
        if func == Func.CLAMP:
            cmin, cmax = clip
            low = F32(F32(lo - y_zp) * F32(y_scale))
            high = F32(F32(hi - y_zp) * F32(y_scale))
            if (cmin is not None and cmin > low) or (cmax is not None and cmax < high):
                raise ModelError(f"{_where(act)}: Clip({cmin}, {cmax}) narrows the quantised "
                                 f"range [{low}, {high}]: onnxruntime folds a Clip into its "
                                 f"integer kernel only when it does not, and otherwise "
                                 f"computes in float; supported: a Clip the output range "
                                 f"covers")
            func = Func.IDENTITY
        requant = g.Requant(np.array(mults), np.array(shifts), Rounding.HALF_EVEN, zq, func,
                            clamp_hi)
        d = weight - (np.asarray(w_zp, dtype=np.int64).reshape(
            (1, n) if kind == "dense" else (n, 1, 1, 1)))
        parts = split_weights(d)
        src = x.name
        x_shape = self.tensors[src].shape
        in_zp = x_zp - x.offset
        if len(parts) > 1:
            rep = self.fresh(f"{out}:repeat")
            self.tensor(rep, (*x_shape[:-1], x_shape[-1] * len(parts)), self.tensors[src].dtype,
                        self.tensors[src].q)
            self.ops.append(Repeat(f"{_name(node)}:repeat", [src], [rep], times=len(parts)))
            src = rep
        bias = np.zeros(n, dtype=np.int64) if bias is None else bias
        name = self.fresh(out)
        q = QParams(float(y_scale), zq, True)
        if kind == "dense":
            if x.nhwc or len(x_shape) < 2:
                raise ModelError(f"{_where(node)}: a matrix product of a {len(x.shape)}-D "
                                 f"spatial tensor; flatten it first")
            wm = np.concatenate(parts, axis=0)
            rows = int(np.prod(x_shape[:-1]))
            flat = name if len(x_shape) == 2 else self.fresh(out)
            if flat != name:                 # (b, m, K): b * m rows of K
                rows_in = self.fresh(f"{out}:rows")
                self.tensor(rows_in, (rows, x_shape[-1] * len(parts)),
                            self.tensors[src].dtype, self.tensors[src].q)
                self.ops.append(Unflatten(f"{_name(node)}:rows", [src], [rows_in],
                                          shape=(x_shape[-1] * len(parts),)))
                src = rows_in
            self.tensor(flat, (rows, n), "int8", q)
            self.ops.append(g.FullyConnected(_name(node), [src], [flat], weight=wm, bias=bias,
                                             input_zp=in_zp, requant=requant))
            self.ops[-1].onnx_scales = s
            if flat != name:                 # (b, m, K) @ (K, N): back to (b, m, N)
                self.tensor(name, (*x_shape[:-1], n), "int8", q)
                self.ops.append(Unflatten(f"{_name(node)}:unflatten", [flat], [name],
                                          shape=tuple(x_shape[1:-1]) + (n,)))
            self.set_int(name, out, (*x.shape[:-1], n), y_dtype, y_scale, y_zp, offset, False)
            return
        conv = _conv_geometry(node, x, self.tensors[x.name].shape, weight.shape)
        if groups is not None:
            conv["groups"] = groups
        hwio = np.concatenate([p.transpose(2, 3, 1, 0) for p in parts], axis=2)
        if conv["groups"] != 1 and len(parts) > 1:
            raise ModelError(f"{_where(node)}: a grouped convolution with weight zero points "
                             f"that do not fit int8 after subtraction; supported: group=1")
        op = g.Conv2D(_name(node), [src], [name], weight=hwio, bias=bias, input_zp=in_zp,
                      requant=requant, stride=conv["stride"], padding=conv["padding"],
                      groups=conv["groups"])
        nb, h, w_, _ = self.tensors[src].shape
        ho, wo = op.out_hw(h, w_)
        self.tensor(name, (nb, ho, wo, n), "int8", q)
        op.onnx_scales = s
        self.ops.append(op)
        self.set_int(name, out, (x.shape[0], n, ho, wo), y_dtype, y_scale, y_zp, offset, True)

    # QOperator --------------------------------------------------------------------------
    def _int_input(self, node, i: int) -> _Value:
        v = self.value(node, i)
        if v.kind != "int":
            raise ModelError(f"{_where(node)}: input {node.input[i]!r} is not an integer "
                             f"tensor")
        return v

    def _qop_weight(self, node, i: int, zp_index: int | None, kind: str):
        w = np.asarray(self.const(node, i, "the weight"))
        if w.dtype not in (np.int8, np.uint8):
            raise ModelError(f"{_where(node)}: weights of type {w.dtype}; supported: int8, "
                             f"uint8")
        w = w.astype(np.int64)
        if kind == "dense" and w.ndim == 3 and (w == w[:1]).all():
            w = w[0]                       # a batch of identical matrices: one matrix
        if (kind == "dense" and w.ndim != 2) or (kind == "conv" and w.ndim != 4):
            raise ModelError(f"{_where(node)}: weight shape {w.shape}; supported: "
                             f"{'2-D' if kind == 'dense' else '4-D'}")
        n = w.shape[1] if kind == "dense" else w.shape[0]
        zp = None if zp_index is None else self.const(node, zp_index, "the weight zero point",
                                                       optional=True)
        zp = np.zeros(n, np.int64) if zp is None else np.asarray(zp, np.int64).reshape(-1)
        if zp.size not in (1, n):
            raise ModelError(f"{_where(node)}: {zp.size} weight zero points for {n} outputs")
        return w, np.broadcast_to(zp, (n,)).copy(), n

    def _qop_scale(self, node, i: int, n: int | None = None):
        s = np.asarray(self.const(node, i, "a scale"))
        if s.dtype not in (np.float32, np.float16):
            raise ModelError(f"{_where(node)}: scale of type {s.dtype}; supported: float32, "
                             f"float16")
        s = s.astype(F32).reshape(-1)
        if not np.isfinite(s).all() or (s <= 0).any():
            raise ModelError(f"{_where(node)}: a scale is not a positive finite number")
        if n is None:
            if s.size != 1:
                raise ModelError(f"{_where(node)}: {s.size} scales; supported: one per tensor")
            return s[0]
        if s.size not in (1, n):
            raise ModelError(f"{_where(node)}: {s.size} weight scales for {n} outputs")
        return np.broadcast_to(s, (n,)).copy()

    def _qop_zp(self, node, i: int, x_dtype: str | None = None) -> tuple[int, str]:
        zp = np.asarray(self.const(node, i, "a zero point", optional=True)
                        if i < len(node.input) else np.zeros(1, np.uint8))
        if zp.size != 1:
            raise ModelError(f"{_where(node)}: {zp.size} zero points; supported: one per tensor")
        dtype = _ONNX_INT.get(_np_onnx(zp.dtype))
        return int(zp.reshape(-1)[0]), dtype or x_dtype

    def op_QLinearMatMul(self, node):
        x = self._int_input(node, 0)
        x_scale = self._qop_scale(node, 1)
        x_zp, _ = self._qop_zp(node, 2)
        w, w_zp, n = self._qop_weight(node, 3, 5, "dense")
        w_scale = self._qop_scale(node, 4, n)
        y_scale = self._qop_scale(node, 6)
        y_zp, y_dtype = self._qop_zp(node, 7)
        self._product(node, node.output[0], x, x_scale, x_zp, w, w_scale, w_zp, None,
                      y_scale, y_zp, y_dtype, Func.IDENTITY, None, "dense")

    def op_QLinearConv(self, node):
        x = self._int_input(node, 0)
        if not x.nhwc:
            x = self._nhwc_of(node, x)
        x_scale = self._qop_scale(node, 1)
        x_zp, _ = self._qop_zp(node, 2)
        w, w_zp, n = self._qop_weight(node, 3, 5, "conv")
        w_scale = self._qop_scale(node, 4, n)
        y_scale = self._qop_scale(node, 6)
        y_zp, y_dtype = self._qop_zp(node, 7)
        bias = self.const(node, 8, "the bias", optional=True)
        if bias is not None:
            bias = np.asarray(bias)
            if bias.dtype != np.int32 or bias.size != n:
                raise ModelError(f"{_where(node)}: bias must be int32 with {n} values")
            bias = bias.astype(np.int64).reshape(-1)
        self._product(node, node.output[0], x, x_scale, x_zp, w, w_scale, w_zp, bias,
                      y_scale, y_zp, y_dtype, Func.IDENTITY, None, "conv")

    def _nhwc_of(self, node, x: _Value) -> _Value:
        if len(self.tensors[x.name].shape) != 4:
            raise ModelError(f"{_where(node)}: input {node.input[0]!r} is not 4-D (N, C, H, W)")
        return self.to_nhwc(x, node.input[0])

    def op_MatMulInteger(self, node):
        x = self._int_input(node, 0)
        x_zp = int(np.asarray(self.const(node, 2, "", optional=True)
                              if len(node.input) > 2 and node.input[2] else 0).reshape(-1)[0])
        w, w_zp, n = self._qop_weight(node, 1, 3 if len(node.input) > 3 else None, "dense")
        shape = self.tensors[x.name].shape
        if x.nhwc:
            raise ModelError(f"{_where(node)}: a matrix product of a spatial tensor")
        name = self.fresh(node.output[0])
        self.tensor(name, (*shape[:-1], n), "int32")
        self.ops.append(IntegerMatMul(_name(node), [x.name], [name], weight=w,
                                      input_zp=x_zp - x.offset, weight_zp=w_zp))
        self.values[node.output[0]] = _Value("int", (*x.shape[:-1], n), name, dtype="int32")

    def op_ConvInteger(self, node):
        x = self._int_input(node, 0)
        if not x.nhwc:
            x = self._nhwc_of(node, x)
        x_zp = int(np.asarray(self.const(node, 2, "", optional=True)
                              if len(node.input) > 2 and node.input[2] else 0).reshape(-1)[0])
        w, w_zp, n = self._qop_weight(node, 1, 3 if len(node.input) > 3 else None, "conv")
        conv = _conv_geometry(node, x, self.tensors[x.name].shape, w.shape)
        d = (w - w_zp.reshape(n, 1, 1, 1)).transpose(2, 3, 1, 0)
        geometry = g.Conv2D(_name(node), [x.name], [], weight=np.zeros(d.shape, np.int64),
                            bias=np.zeros(n, np.int64), input_zp=x_zp - x.offset,
                            requant=g.Requant(np.zeros(n), np.zeros(n), Rounding.HALF_EVEN, 0),
                            stride=conv["stride"], padding=conv["padding"],
                            groups=conv["groups"])
        if conv["groups"] != 1:
            raise ModelError(f"{_where(node)}: group={conv['groups']}; supported: 1")
        nb, h, w_, _ = self.tensors[x.name].shape
        ho, wo = geometry.out_hw(h, w_)
        name = self.fresh(node.output[0])
        self.tensor(name, (nb, ho, wo, n), "int32")
        self.ops.append(IntegerConv(_name(node), [x.name], [name], conv=geometry, weight=d))
        self.values[node.output[0]] = _Value("int", (x.shape[0], n, ho, wo), name,
                                             dtype="int32", nhwc=True)

    # layout and pooling -----------------------------------------------------------------
    def _shape_op(self, node, new_shape):
        """Flatten / Reshape of an integer or dequantised tensor (same values, new shape)."""
        v = self.value(node, 0)
        if v.kind not in ("int", "dq"):
            raise ModelError(f"{_where(node)}: reshapes {node.input[0]!r}, which is not a "
                             f"quantised tensor")
        if len(new_shape) == 4:
            raise ModelError(f"{_where(node)}: a reshape to 4-D; supported: to 1 to 3 "
                             f"dimensions")
        src = v.name
        if v.nhwc:
            t = self.fresh(node.input[0])
            n, h, w, c = self.tensors[src].shape
            self.tensor(t, (n, c, h, w), self.tensors[src].dtype, self.tensors[src].q)
            self.ops.append(Transpose(f"{_name(node)}:nchw", [src], [t], perm=(0, 3, 1, 2)))
            src = t
        name = self.fresh(node.output[0])
        batch = self.tensors[src].shape[0]
        shape = (batch, *new_shape[1:])
        self.tensor(name, shape, self.tensors[src].dtype, self.tensors[src].q)
        self.ops.append(g.Reshape(_name(node), [src], [name], shape=shape))
        self.values[node.output[0]] = _Value(v.kind, tuple(new_shape), name, dtype=v.dtype,
                                             scale=v.scale, zero_point=v.zero_point,
                                             offset=v.offset)

    def op_Flatten(self, node):
        v = self.value(node, 0)
        axis = _attr(node, "axis", 1)
        shape = v.shape
        if axis != 1:
            raise ModelError(f"{_where(node)}: axis={axis}; supported: 1 (keep the batch)")
        self._shape_op(node, (shape[0], int(np.prod(shape[1:]))))

    def op_Reshape(self, node):
        v = self.value(node, 0)
        target = [int(d) for d in self.const(node, 1, "the shape")]
        if _attr(node, "allowzero", 0):
            raise ModelError(f"{_where(node)}: allowzero=1 is not supported")
        size = int(np.prod(v.shape[1:]))
        dims = [v.shape[i] if d == 0 else d for i, d in enumerate(target)]
        if dims.count(-1) > 1:
            raise ModelError(f"{_where(node)}: more than one -1 in the shape {target}")
        if len(dims) < 1:
            raise ModelError(f"{_where(node)}: an empty shape")
        rest = [d for d in dims[1:] if d != -1]
        if -1 in dims[1:]:
            dims[dims.index(-1, 1)] = size // max(1, int(np.prod(rest)))
        if dims[0] not in (-1, v.shape[0]) and v.shape[0] != 1:
            raise ModelError(f"{_where(node)}: reshapes across the batch (shape {target}); "
                             f"supported: the batch dimension kept")
        if int(np.prod(dims[1:])) != size:
            raise ModelError(f"{_where(node)}: shape {target} does not hold the "
                             f"{size} elements of an item of {node.input[0]!r}")
        self._shape_op(node, (v.shape[0], *dims[1:]))

    def op_MaxPool(self, node):
        v = self.value(node, 0)
        if v.kind not in ("int", "dq"):
            raise ModelError(f"{_where(node)}: pools {node.input[0]!r}, which is not a "
                             f"quantised tensor")
        if not v.nhwc:
            v = self._nhwc_of(node, v)
        if _attr(node, "ceil_mode", 0) or any(d != 1 for d in _attr(node, "dilations", [])):
            raise ModelError(f"{_where(node)}: ceil_mode=1 or dilations; supported: "
                             f"ceil_mode=0, no dilation")
        if len(node.output) > 1 and node.output[1]:
            raise ModelError(f"{_where(node)}: the Indices output is not supported")
        kernel = tuple(_attr(node, "kernel_shape", []))
        geo = _conv_geometry(node, v, self.tensors[v.name].shape, (0, 0, *kernel))
        op = g.MaxPool2D(_name(node), [v.name], [], kernel=kernel, stride=geo["stride"],
                         padding=geo["padding"], act=(-(1 << 31), (1 << 31) - 1))
        n, h, w, c = self.tensors[v.name].shape
        _, ho, wo, _ = op.reference(np.zeros((1, h, w, c), np.int64))[0].shape
        name = self.fresh(node.output[0])
        op.outputs = [name]
        self.tensor(name, (n, ho, wo, c), self.tensors[v.name].dtype, self.tensors[v.name].q)
        self.ops.append(op)
        self.values[node.output[0]] = _Value(v.kind, (v.shape[0], c, ho, wo), name,
                                             dtype=v.dtype, scale=v.scale,
                                             zero_point=v.zero_point, offset=v.offset,
                                             nhwc=True)


def _name(node) -> str:
    return node.name or node.output[0]


def _attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _np_onnx(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _per_channel(node, w: _Value, ch_axis: int, n: int, what: str,
                 zero_points: bool = False) -> np.ndarray:
    """A DequantizeLinear constant's scales (or zero points) per output channel."""
    values = np.asarray(w.zero_point if zero_points else w.scale).reshape(-1)
    if values.size == 1:
        return np.broadcast_to(values, (n,)).copy()
    rank = np.asarray(w.const).ndim
    if values.size != n or (w.axis % max(rank, 1)) != ch_axis % max(rank, 1):
        raise ModelError(f"{_where(node)}: the {what}'s quantisation has {values.size} values "
                         f"along axis {w.axis}; supported: one, or one per output channel")
    return values.copy()


def _conv_geometry(node, x: _Value, nhwc_shape, w_shape) -> dict:
    """Stride, (top, bottom, left, right) padding and groups of a Conv/MaxPool node."""
    kh, kw = w_shape[2:]
    if len(nhwc_shape) != 4:
        raise ModelError(f"{_where(node)}: input is not 4-D (N, C, H, W)")
    if any(d != 1 for d in _attr(node, "dilations", [])):
        raise ModelError(f"{_where(node)}: dilations {_attr(node, 'dilations', [])}; "
                         f"supported: 1")
    sy, sx = _attr(node, "strides", [1, 1])
    _, h, w, _ = nhwc_shape
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s in ((h, kh, sy), (w, kw, sx)):
            out = -(-size // s)
            total = max(0, (out - 1) * s + k - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        padding = (pads[0][0], pads[0][1], pads[1][0], pads[1][1])
    elif auto in ("NOTSET", "VALID"):
        p = _attr(node, "pads", [0, 0, 0, 0]) if auto == "NOTSET" else [0, 0, 0, 0]
        padding = (p[0], p[2], p[1], p[3])
    else:
        raise ModelError(f"{_where(node)}: auto_pad={auto}; supported: NOTSET, VALID, "
                         f"SAME_UPPER, SAME_LOWER")
    groups = _attr(node, "group", 1)
    return {"stride": (int(sy), int(sx)), "padding": tuple(int(v) for v in padding),
            "groups": int(groups)}


def load(source, *, name: str | None = None, calibration=None,
         outputs: list[str] | None = None) -> g.Graph:
    """The :class:`firmware.graph.Graph` of the ONNX model ``source`` (a path, or an
    ``onnx.ModelProto``). A float model (no QuantizeLinear, QLinear or Integer operator) is
    quantised by the project's quantiser with ``calibration`` (float inputs, required then).
    ``outputs``: tensor names to end the model at (only the nodes they need are read), for
    example the logits before a classifier's Softmax and ArgMax.

    The graph's ``onnx_names`` maps each integer ONNX tensor to ``(graph tensor, offset,
    nhwc)``: the graph holds the ONNX value minus ``offset`` (128 for a uint8 tensor the core
    writes as int8), NHWC when ``nhwc``."""
    model = _read(source)
    label = name or (Path(source).stem if not hasattr(source, "graph") else
                     (model.graph.name or "model"))
    if outputs is not None:
        model = _cut(model, list(outputs))
    quantised = any(n.op_type in ("QuantizeLinear", "QLinearMatMul", "QLinearConv",
                                  "MatMulInteger", "ConvInteger") for n in model.graph.node)
    if not quantised:
        return _float_graph(model, label, calibration)
    _check_model(model)
    return _Importer(model, label).run()


def _cut(model, outputs: list[str]):
    """The model ending at the tensors ``outputs``: the nodes they depend on, in order."""
    import onnx
    from onnx import helper

    produced = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    need, stack = set(), list(outputs)
    for name in outputs:
        if name not in produced and name not in inputs:
            raise ModelError(f"outputs: no node computes {name!r}")
    while stack:
        t = stack.pop()
        node = produced.get(t)
        if node is None or id(node) in need:
            continue
        need.add(id(node))
        stack.extend(i for i in node.input if i and i not in inits)
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    nodes = [n for n in model.graph.node if id(n) in need]
    del cut.graph.node[:]
    cut.graph.node.extend(nodes)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    del cut.graph.output[:]
    cut.graph.output.extend(helper.make_tensor_value_info(o, types.get(o, 1), None)
                            for o in outputs)
    return cut


# Float models and the project's quantiser ---------------------------------------------------

#: Operators of a float model :func:`float_network` translates.
FLOAT_SUPPORTED = ("Gemm", "MatMul", "Add", "Relu", "Flatten", "Reshape", "Cast", "Identity")


def float_network(source, name: str | None = None):
    """The float model ``source`` as a :class:`firmware.nn.Network`: ``Gemm`` or ``MatMul`` +
    ``Add`` (constant weights and bias), ``Relu``, ``Flatten`` / ``Reshape`` to a vector,
    ``Cast`` to float and ``Identity`` (what skl2onnx writes for an MLP, cut at the logits)."""
    from firmware import nn

    model = _read(source)
    _check_model_float(model)
    inits = _initializers(model)
    graph = model.graph
    inp = [i for i in graph.input if i.name not in inits][0]
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim[1:])
    current = inp.name
    layers: list = []
    if len(shape) != 1:
        layers.append(nn.Flatten())
    pending = None                          # a MatMul awaiting its Add
    for node in graph.node:
        where = _where(node)
        if node.input and node.input[0] != current and node.op_type != "Add":
            raise ModelError(f"{where}: reads {node.input[0]!r}, not the previous node's "
                             f"output; supported: a chain of layers")
        if node.op_type in ("Cast", "Identity", "Flatten", "Reshape"):
            if node.op_type == "Cast" and _attr(node, "to", 1) != 1:
                raise ModelError(f"{where}: casts to type {_attr(node, 'to', 1)}; supported: "
                                 f"float (1)")
        elif node.op_type in ("MatMul", "Gemm"):
            w = inits.get(node.input[1])
            if w is None or w.ndim != 2:
                raise ModelError(f"{where}: the weight must be a 2-D initializer")
            w = w.astype(np.float64)
            b = None
            if node.op_type == "Gemm":
                if _attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0 or \
                        _attr(node, "beta", 1.0) != 1.0:
                    raise ModelError(f"{where}: supported: transA=0, alpha=beta=1")
                if _attr(node, "transB", 0):
                    w = w.T
                if len(node.input) > 2 and node.input[2]:
                    b = inits.get(node.input[2])
                    if b is None:
                        raise ModelError(f"{where}: the bias must be an initializer")
                    b = np.asarray(b, np.float64).reshape(-1)
            pending = nn.Dense(w, b)
            layers.append(pending)
        elif node.op_type == "Add":
            consts = [inits.get(i) for i in node.input]
            data = [i for i, c in zip(node.input, consts, strict=True) if c is None]
            if not isinstance(pending, nn.Dense) or data != [current] or \
                    layers[-1] is not pending:
                raise ModelError(f"{where}: supported: adding a constant bias right after a "
                                 f"MatMul")
            bias = [c for c in consts if c is not None][0]
            pending.bias = pending.bias + np.asarray(bias, np.float64).reshape(-1)
        elif node.op_type == "Relu":
            layers.append(nn.ReLU())
        current = node.output[0]
    if [o.name for o in graph.output] != [current]:
        raise ModelError(f"the model's outputs {[o.name for o in graph.output]} are not the "
                         f"last node's output {current!r}; supported: one output, a chain")
    return nn.Network(shape, layers, name=name or graph.name or "onnx")


def _initializers(model) -> dict:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _check_model_float(model) -> None:
    versions = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    v = versions.get("ai.onnx")
    if v is None or v not in OPSETS:
        raise ModelError(f"the model imports opset {v} of the default domain; supported: "
                         f"{OPSETS.start} to {OPSETS.stop - 1}")
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in FLOAT_SUPPORTED:
            raise ModelError(f"{_where(node)}: operator {node.op_type} is not supported in a "
                             f"float model; supported: {', '.join(FLOAT_SUPPORTED)} (end the "
                             f"model at its logits: outputs=[...])")
    inits = {i.name for i in model.graph.initializer}
    data = [i for i in model.graph.input if i.name not in inits]
    if len(data) != 1:
        raise ModelError(f"the model has {len(data)} non-constant inputs; supported: one")
    _check_model(model, ops=FLOAT_SUPPORTED)


def graph_of_quantised(qnet, input_name: str = "input", output_name: str = "output",
                       name: str | None = None) -> g.Graph:
    """The :class:`firmware.graph.Graph` of a :class:`firmware.quant.QuantisedNetwork` of dense
    stages: a float input quantised as the quantiser does, the stages as fully connected
    operators (half-up rounding, one shift), the output dequantised."""
    from firmware.quant import QuantError

    tensors: dict[str, g.Tensor] = {}
    ops: list[g.Op] = []
    iq = qnet.input_q
    tensors[input_name] = g.Tensor(input_name, (1, *qnet.input_shape), "float32")
    x = f"{input_name}:q"
    tensors[x] = g.Tensor(x, (1, *qnet.input_shape), "int8" if iq.signed else "uint8", iq)
    ops.append(QuantizeLinear(f"{input_name}:quantise", [input_name], [x], scale=iq.scale,
                              zero_point=iq.zero_point, signed=iq.signed, float64=True))
    if len(qnet.input_shape) != 1:
        flat = f"{input_name}:flat"
        shape = (1, int(np.prod(qnet.input_shape)))
        tensors[flat] = g.Tensor(flat, shape, tensors[x].dtype, iq)
        ops.append(g.Reshape(f"{input_name}:flatten", [x], [flat], shape=shape))
        x = flat
    for st in qnet.stages:
        if st.kind != "dense":
            raise QuantError(f"stage {st.name}: {st.kind}; the ONNX float path builds dense "
                             f"stages only")
        colsum = st.weight_matrix.sum(axis=0)
        bias = golden.wrap(st.bias + st.in_q.zero_point * colsum, 32)
        out = f"{st.name}:out"
        tensors[out] = g.Tensor(out, (1, st.n), "int8", st.out_q)
        requant = g.Requant(st.multiplier, st.shift, st.rounding, st.zero_point, st.func,
                            st.clamp_hi)
        ops.append(g.FullyConnected(st.name, [x], [out], weight=st.weight_matrix, bias=bias,
                                    input_zp=st.in_q.zero_point, requant=requant))
        x = out
    oq = qnet.output_q
    tensors[output_name] = g.Tensor(output_name, (1, qnet.stages[-1].n), "float32")
    ops.append(g.Dequantize(f"{output_name}:dequantize", [x], [output_name], scale=oq.scale,
                            zero_point=oq.zero_point))
    return g.Graph(name or qnet.name, tensors, ops, [input_name], [output_name])


def _float_graph(model, label: str, calibration) -> g.Graph:
    from firmware.quant import QuantError, quantise

    network = float_network(model, label)
    if calibration is None:
        raise ModelError(f"{label}: a float model (no QuantizeLinear, QLinear or Integer "
                         f"operator); give calibration inputs (calibration=...) to quantise "
                         f"it with the project's quantiser")
    calibration = np.asarray(calibration, dtype=np.float64)
    if calibration.ndim >= 1 and calibration.shape[1:] != network.input_shape:
        raise ModelError(f"{label}: calibration items have shape {calibration.shape[1:]}; the "
                         f"model takes {network.input_shape}")
    try:
        qnet = quantise(network, calibration)
    except QuantError as error:
        raise ModelError(f"{label}: {error}") from None
    inits = {i.name for i in model.graph.initializer}
    inp = [i.name for i in model.graph.input if i.name not in inits][0]
    return graph_of_quantised(qnet, inp, model.graph.output[0].name, label)


# Checking against onnxruntime ------------------------------------------------------------------

def onnxruntime_session(model):
    """An onnxruntime CPU session for ``model`` (a path, bytes or a ``ModelProto``) as the
    oracle: quiet, and with ``session.qdqisint8allowed`` set. Without it, onnxruntime on an x86
    CPU without VNNI rewrites int8 QDQ activations to uint8 and runs them on its uint8 x int8
    kernels, whose pair sums saturate (:func:`onnxruntime_pairs_saturate`): an int8 model's
    results would then depend on the CPU. With it, int8 stays on onnxruntime's exact int8
    kernels on every CPU (on VNNI and Arm CPUs it is the default already)."""
    import onnxruntime as ort

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])


def onnxruntime_check(graph: g.Graph, source, inputs: dict, tensors: dict,
                      where: dict | None = None) -> list[dict]:
    """Per quantised tensor of the ONNX model ``source`` (every QuantizeLinear output and
    QOperator result, in model order): the elements of ``tensors`` (a run's or the
    reference's graph tensors, for ``inputs``) equal to onnxruntime's on the same inputs.
    Rows: ``tensor`` (ONNX name), ``operator`` and ``runs on`` (the graph operator that
    computes it; where it ran by operator name, from ``where`` when given, as
    :func:`firmware.compiler.lowering.where_ran` says), ``equal``, ``size``. Needs
    onnxruntime (a dev dependency)."""
    import onnx
    from onnx import helper

    model = onnx.ModelProto()
    model.CopyFrom(_read(source))
    names = getattr(graph, "onnx_names", {})
    wanted = [o for n in model.graph.node for o in n.output if o in names
              and graph.tensors[names[o][0]].dtype != "float32"]
    known = {o.name for o in model.graph.output}
    for name in wanted:
        if name not in known:
            model.graph.output.append(helper.make_tensor_value_info(
                name, _ONNX_TYPE[_integer_dtype(names, graph, name)], None))
    session = onnxruntime_session(model)
    outs = [o.name for o in session.get_outputs()]
    feeds = {k: np.asarray(v).astype(np.float32 if graph.tensors[k].dtype == "float32"
                                     else graph.tensors[k].dtype) for k, v in inputs.items()}
    values = dict(zip(outs, session.run(None, feeds), strict=True))
    producers = {t: op for op in graph.ops for t in op.outputs}
    rows = []
    for name in wanted:
        gname, offset, nhwc = names[name]
        if gname not in tensors:
            continue
        mine = np.asarray(tensors[gname], dtype=np.int64) + offset
        if nhwc and mine.ndim == 4:
            mine = mine.transpose(0, 3, 1, 2)
        want = np.asarray(values[name], dtype=np.int64).reshape(mine.shape)
        op = producers.get(gname)
        rows.append({"tensor": name, "operator": type(op).__name__ if op else "input",
                     "runs on": (where or {}).get(
                         op.name, "core" if op.core else "host") if op is not None else "host",
                     "equal": int((mine == want).sum()), "size": int(mine.size)})
    return rows


@functools.cache
def onnxruntime_pairs_saturate() -> str | None:
    """Whether this machine's onnxruntime computes uint8 x int8 products inexactly: on x86
    CPUs without VNNI, MLAS's uint8 x int8 kernels (``QLinearMatMul``, ``QLinearConv`` and the
    QDQ forms fused into them) add adjacent products in pairs with ``vpmaddubsw``, which
    saturates each pair sum to int16 (onnxruntime's quantisation guide: use ``reduce_range`` on
    such CPUs). Then onnxruntime is no exact oracle for models with uint8 activations and int8
    weights, and no exact integer core can equal it. Probed once: both operators with every
    input 255 and every weight -128 or 127, whose exact sums overflow int16 in pairs.
    Returns ``None`` where onnxruntime is exact, else a sentence saying what was seen. int8 x
    int8 and uint8 x uint8 go through other kernels, exact on the same CPUs."""
    from onnx import TensorProto, helper, numpy_helper

    k, y_scale = 16, 8192.0                    # |sum| <= 16 * 255 * 128 = 522,240: in range
    seen = []
    for kind in ("QLinearMatMul", "QLinearConv"):
        for w_value in (-128, 127):
            if kind == "QLinearMatMul":
                x_shape, w = [2, k], np.full((k, 2), w_value, np.int8)
            else:
                x_shape, w = [1, k, 2, 2], np.full((2, k, 1, 1), w_value, np.int8)
            inits = [numpy_helper.from_array(np.array(v, t), n) for v, t, n in
                     ((1.0, np.float32, "xs"), (0, np.uint8, "xz"), (1.0, np.float32, "ws"),
                      (0, np.int8, "wz"), (y_scale, np.float32, "ys"), (128, np.uint8, "yz"))]
            inits.insert(2, numpy_helper.from_array(w, "w"))
            node = helper.make_node(kind, ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
            graph = helper.make_graph(
                [node], "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
            got = onnxruntime_session(model).run(None, {"x": np.full(x_shape, 255, np.uint8)})[0]
            exact = int(np.round(255 * w_value * k / y_scale)) + 128
            if (got.astype(int) != exact).any():
                seen.append(f"{kind} gives {int(got.flat[0])} for {exact}")
    if not seen:
        return None
    return ("onnxruntime on this CPU saturates uint8 x int8 products summed in pairs to int16 "
            "(x86 without VNNI; " + "; ".join(seen) + "), so its results for uint8 "
            "activations with int8 weights are not exact integer arithmetic")


_ONNX_TYPE = {"uint8": 2, "int8": 3, "int32": 6}


def _integer_dtype(names, graph, onnx_name) -> str:
    gname, offset, _ = names[onnx_name]
    dtype = graph.tensors[gname].dtype
    return "uint8" if offset == 128 else dtype
