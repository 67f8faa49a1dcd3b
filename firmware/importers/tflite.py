"""TFLite int8 flatbuffers to a :class:`firmware.graph.Graph`, with TFLite's own arithmetic.

The flatbuffer is read with the ``tflite`` package (the schema's generated readers; no
TensorFlow). Every parameter is derived exactly as LiteRT's reference kernels derive it in
their Prepare step, so that :meth:`Graph.reference` and the core equal the reference kernels
on every element:

- FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D: int8 weights with zero point 0, per tensor or
  per output channel, int32 bias; the real multiplier ``s_in * s_w / s_out`` (a per-tensor
  fully connected layer multiplies the two float32 scales in float32 first, as
  ``GetQuantizedConvolutionMultipler`` does; the others in double, as
  ``PopulateConvolutionQuantizationParams`` does), quantised by ``QuantizeMultiplier``
  and applied as the build rounds (:data:`ROUNDINGS`; :func:`firmware.graph.requant_from_real`):
  LiteRT 2.3's reference FULLY_CONNECTED rounds the exact product once, half up (HALF_UP
  with ``shift = 31 - e``), its convolutions round twice as gemmlowp does (DOUBLE). Measured
  on near-ties in the shared models and the tests' operator model: either kind with the
  other kind's rounding differs from LiteRT, this assignment never did;
- the fused activation's range (``CalculateActivationRangeQuantized``) must be what the
  activation unit computes: none, RELU (``max(q, z_out)``) or RELU6 (CLAMP); RELU_N1_TO_1 is
  refused unless it coincides with one of them;
- SAME padding as ``ComputePaddingHeightWidth`` (the odd pixel at the bottom/right);
- MAX_POOL_2D, AVERAGE_POOL_2D, ADD, RESHAPE, SOFTMAX, QUANTIZE, DEQUANTIZE: host operators.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from firmware import graph as g
from firmware.importers import ModelError
from firmware.quant import QParams
from hdl.isa import Func

__all__ = ["load", "load_bytes", "SUPPORTED"]

#: Builtin operator codes (schema BuiltinOperator) this importer translates, with the highest
#: operator version it knows.
SUPPORTED = {"ADD": 5, "AVERAGE_POOL_2D": 3, "CONV_2D": 6, "DEPTHWISE_CONV_2D": 7,
             "DEQUANTIZE": 5, "FULLY_CONNECTED": 11, "MAX_POOL_2D": 3, "QUANTIZE": 3,
             "RESHAPE": 3, "SOFTMAX": 3}

#: Fused activation functions (schema ActivationFunctionType).
_ACT = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}

#: Tensor types (schema TensorType) the graph holds.
_TYPES = {0: "float32", 2: "int32", 3: "uint8", 9: "int8"}

SCHEMA_VERSION = 3


def _op_names() -> dict[int, str]:
    import tflite
    return {v: k for k, v in vars(tflite.BuiltinOperator).items() if isinstance(v, int)}


#: How the TFLite build the model is to match rounds ``MultiplyByQuantizedMultiplier``, per
#: operator kind (fully connected, convolutions, host operators): ``True`` is one rounding
#: half up of the exact product (``TFLITE_SINGLE_ROUNDING``, ruy), ``False`` gemmlowp's double
#: rounding. ``litert``: what LiteRT 2.3's reference op resolver was measured to compute (its
#: int8 FULLY_CONNECTED rounds once, its convolutions, softmax twice); ``double``: gemmlowp's
#: everywhere (TFLite built without single rounding); ``single``: one rounding everywhere.
ROUNDINGS = {"litert": (True, False, False), "double": (False, False, False),
             "single": (True, True, True)}


def load(path, **options) -> g.Graph:
    """The graph of the ``.tflite`` file at ``path`` (options: see :func:`load_bytes`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ModelError(f"{path}: cannot read the model file ({error.strerror})") from None
    return load_bytes(data, name=path.stem, **options)


def load_bytes(data: bytes, *, name: str = "model", rounding: str = "litert") -> g.Graph:
    """The graph of a TFLite flatbuffer held in ``data``; ``rounding`` one of
    :data:`ROUNDINGS`: the arithmetic of the TFLite build to match."""
    if rounding not in ROUNDINGS:
        raise ModelError(f"rounding={rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"{name}: not a TFLite flatbuffer (no 'TFL3' identifier at byte 4; "
                         f"{len(data)} bytes); allowed: TFLite models (schema version 3)")
    try:
        return _Importer(data, name, ROUNDINGS[rounding]).graph()
    except ModelError:
        raise
    except (IndexError, ValueError, TypeError, AttributeError) as error:
        # A truncated or corrupt flatbuffer points outside the file; the readers fail
        # with whatever the bytes there make of it.
        raise ModelError(f"{name}: the flatbuffer is truncated or corrupt ({len(data)} bytes; "
                         f"reading it failed with {type(error).__name__}: {error})") from None
    except Exception as error:        # struct.error and the like from the same cause
        raise ModelError(f"{name}: the flatbuffer is truncated or corrupt ({len(data)} bytes; "
                         f"reading it failed with {type(error).__name__}: {error})") from None


class _Importer:
    def __init__(self, data: bytes, name: str, single: tuple[bool, bool, bool]):
        import tflite
        self.fc_single, self.conv_single, self.single = single
        self.tflite = tflite
        self.data = data
        self.name = name
        self.model = tflite.Model.GetRootAsModel(data, 0)
        self.names = _op_names()

    # Tensors ----------------------------------------------------------------------------

    def _tensor_name(self, i: int) -> str:
        return self.tnames[i]

    def _buffer(self, i: int) -> np.ndarray | None:
        t = self.sg.Tensors(i)
        b = t.Buffer()
        if b == 0:
            return None
        buf = self.model.Buffers(b)
        if buf.Offset() > 1:
            raise ModelError(f"{self.name}: tensor {self.tnames[i]} keeps its data outside "
                             f"the flatbuffer (a model over 2 GB); allowed: data inside")
        if buf.DataLength() == 0:
            return None
        raw = buf.DataAsNumpy().tobytes()
        dtype = {0: "<f4", 2: "<i4", 3: "u1", 9: "i1", 4: "<i8"}.get(t.Type())
        if dtype is None:
            raise ModelError(f"{self.name}: constant tensor {self.tnames[i]} has type "
                             f"{t.Type()}; allowed: float32, int32, int64, uint8, int8")
        shape = tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        values = np.frombuffer(raw, dtype=dtype)
        if values.size != int(np.prod(shape)):
            raise ModelError(f"{self.name}: constant tensor {self.tnames[i]} holds "
                             f"{values.size} values for shape {shape}")
        return values.reshape(shape).astype(np.int64 if dtype != "<f4" else np.float32)

    def _quant(self, i: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        q = self.sg.Tensors(i).Quantization()
        if q is None or q.ScaleLength() == 0:
            return None
        if q.DetailsType() != 0:
            raise ModelError(f"{self.name}: tensor {self.tnames[i]} uses custom "
                             f"quantisation; allowed: affine (scale, zero point)")
        zp = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(q.ScaleLength(), int)
        return (q.ScaleAsNumpy().astype(np.float32), np.asarray(zp, dtype=np.int64),
                int(q.QuantizedDimension()))

    def _qparams(self, i: int) -> QParams:
        quant = self._quant(i)
        t = self.sg.Tensors(i)
        if quant is None:
            raise ModelError(f"{self.name}: tensor {self.tnames[i]} has no quantisation; "
                             f"allowed: int8 tensors with a scale and zero point")
        scale, zp, _ = quant
        if len(scale) != 1:
            raise ModelError(f"{self.name}: activation tensor {self.tnames[i]} is quantised "
                             f"per channel; allowed: one scale and zero point")
        return QParams(float(scale[0]), int(zp[0]), t.Type() != 3)

    def _shape(self, i: int) -> tuple[int, ...]:
        t = self.sg.Tensors(i)
        return tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()

    def _check_tensor(self, i: int) -> None:
        t = self.sg.Tensors(i)
        name = self.tnames[i]
        if t.Type() not in (*_TYPES, 4):
            raise ModelError(f"{self.name}: tensor {name} has TFLite type {t.Type()}; allowed: "
                             f"int8, uint8, int32, float32 (int64 for constant shapes)")
        if t.Sparsity() is not None:
            raise ModelError(f"{self.name}: tensor {name} is sparse; allowed: dense tensors")
        shape = self._shape(i)
        if any(s < 1 for s in shape):
            raise ModelError(f"{self.name}: tensor {name} has shape {shape}; allowed: fixed "
                             f"positive sizes")
        if t.ShapeSignatureLength():
            sig = [int(s) for s in t.ShapeSignatureAsNumpy()]
            if any(s < 0 for s in sig[1:]) or len(sig) != len(shape):
                raise ModelError(f"{self.name}: tensor {name} has a dynamic shape {sig} "
                                 f"(-1 beyond the batch); allowed: fixed shapes, the batch "
                                 f"dimension only may be -1")

    # The model --------------------------------------------------------------------------

    def graph(self) -> g.Graph:
        m = self.model
        if m.Version() != SCHEMA_VERSION:
            raise ModelError(f"{self.name}: TFLite schema version {m.Version()}; allowed: "
                             f"{SCHEMA_VERSION}")
        if m.SubgraphsLength() != 1:
            raise ModelError(f"{self.name}: {m.SubgraphsLength()} subgraphs; allowed: one "
                             f"(no control flow)")
        self.sg = sg = m.Subgraphs(0)
        self.tnames = []
        seen = set()
        for i in range(sg.TensorsLength()):
            raw = sg.Tensors(i).Name()
            name = raw.decode() if raw else f"tensor_{i}"
            if name in seen:
                name = f"{name}#{i}"
            seen.add(name)
            self.tnames.append(name)
        # First pass: refuse what is not supported before translating anything.
        ops = []
        for k in range(sg.OperatorsLength()):
            op = sg.Operators(k)
            code = m.OperatorCodes(op.OpcodeIndex())
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            opname = self.names.get(builtin, f"builtin {builtin}")
            where = f"{self.name}: operator {k} ({opname}"
            outs = list(op.OutputsAsNumpy()) if op.OutputsLength() else []
            if outs:
                where += f", output {self.tnames[outs[0]]}"
            where += ")"
            if opname == "CUSTOM" or code.CustomCode():
                custom = code.CustomCode().decode() if code.CustomCode() else "?"
                raise ModelError(f"{where}: custom operator {custom!r} is not supported; "
                                 f"allowed: {', '.join(sorted(SUPPORTED))}")
            if opname not in SUPPORTED:
                raise ModelError(f"{where}: the operator is not supported; allowed: "
                                 f"{', '.join(sorted(SUPPORTED))}")
            if code.Version() > SUPPORTED[opname]:
                raise ModelError(f"{where}: operator version {code.Version()} is not "
                                 f"supported; allowed: 1 to {SUPPORTED[opname]}")
            ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
            for t in [*ins, *outs]:
                if t >= 0:
                    self._check_tensor(t)
            ops.append((k, op, opname, where, ins, [int(x) for x in outs]))
        # Second pass: translate.
        self.tensors: dict[str, g.Tensor] = {}
        self.ops: list[g.Op] = []
        self.constants: dict[int, np.ndarray] = {}
        inputs = [self.tnames[i] for i in sg.InputsAsNumpy()]
        outputs = [self.tnames[i] for i in sg.OutputsAsNumpy()]
        for i in sg.InputsAsNumpy():
            self._declare(int(i))
        for k, op, opname, where, ins, outs in ops:
            for i in outs:
                self._declare(i)
            getattr(self, f"_op_{opname.lower()}")(op, where, ins, outs, k)
        try:
            return g.Graph(self.name, self.tensors, self.ops, inputs, outputs)
        except g.GraphError as error:
            raise ModelError(f"{self.name}: {error}") from None

    def _declare(self, i: int) -> str:
        name = self.tnames[i]
        if name in self.tensors:
            return name
        t = self.sg.Tensors(i)
        dtype = _TYPES.get(t.Type())
        if dtype is None:
            raise ModelError(f"{self.name}: tensor {name} has TFLite type {t.Type()}; "
                             f"allowed: int8, uint8, int32, float32")
        q = self._qparams(i) if dtype in ("int8", "uint8") and self._quant(i) else None
        shape = self._shape(i)
        self.tensors[name] = g.Tensor(name, shape, dtype, q)
        return name

    def _options(self, op, cls_name: str):
        table = op.BuiltinOptions()
        cls = getattr(self.tflite, cls_name)
        opts = cls()
        if table is not None:
            opts.Init(table.Bytes, table.Pos)
        return opts if table is not None else None

    def _activation(self, where: str, code: int, out: int) -> tuple[int, int]:
        """TFLite's ``CalculateActivationRangeQuantized`` for int8 output ``out``."""
        act = _ACT.get(code, f"type {code}")
        q = self._qparams(out)
        lo, hi = q.range

        def quantise(f: float) -> int:
            v = np.float32(f) / np.float32(q.scale)
            return q.zero_point + int(np.floor(v + 0.5) if v >= 0 else np.ceil(v - 0.5))

        if act == "NONE":
            return lo, hi
        if act == "RELU":
            return max(lo, quantise(0.0)), hi
        if act == "RELU6":
            return max(lo, quantise(0.0)), min(hi, quantise(6.0))
        if act == "RELU_N1_TO_1":
            return max(lo, quantise(-1.0)), min(hi, quantise(1.0))
        raise ModelError(f"{where}: fused activation {act} is not supported; allowed: NONE, "
                         f"RELU, RELU6 (RELU_N1_TO_1 where it equals one of them)")

    def _core_act(self, where: str, code: int, out: int) -> tuple[Func, int]:
        """The activation unit's function and clamp for the fused activation's range."""
        lo, hi = self._activation(where, code, out)
        zp = self._qparams(out).zero_point
        if (lo, hi) == (-128, 127):
            return Func.IDENTITY, 127
        if lo == zp and hi == 127:
            return Func.RELU, 127
        if lo == zp or (lo == -128 and zp == -128):
            return Func.CLAMP, hi
        raise ModelError(f"{where}: the fused activation {_ACT.get(code)} clamps to "
                         f"{lo}..{hi} with output zero point {zp}; the activation unit clamps "
                         f"to -128..127, zp..127 or zp..hi only")

    def _int8(self, where: str, i: int, what: str) -> QParams:
        t = self.sg.Tensors(i)
        if t.Type() != 9:
            raise ModelError(f"{where}: the {what} {self.tnames[i]} is "
                             f"{_TYPES.get(t.Type(), t.Type())}; allowed: int8")
        return self._qparams(i)

    def _weights(self, where: str, i: int, channels: int, axis: int):
        """int8 weights, their per-channel float32 scales (length ``channels``)."""
        t = self.sg.Tensors(i)
        w = self._buffer(i)
        if w is None:
            raise ModelError(f"{where}: the weights {self.tnames[i]} are not constant; "
                             f"allowed: constant int8 weights")
        if t.Type() != 9:
            raise ModelError(f"{where}: the weights {self.tnames[i]} are "
                             f"{_TYPES.get(t.Type(), t.Type())}; allowed: int8")
        quant = self._quant(i)
        if quant is None:
            raise ModelError(f"{where}: the weights {self.tnames[i]} have no quantisation")
        scale, zp, dim = quant
        if np.any(zp != 0):
            raise ModelError(f"{where}: the weights {self.tnames[i]} have zero points "
                             f"{sorted(set(zp.tolist()))}; allowed: 0 (symmetric int8)")
        if len(scale) == 1:
            return w, np.repeat(scale, channels), False
        if len(scale) != channels or dim != axis:
            raise ModelError(f"{where}: the weights {self.tnames[i]} have {len(scale)} scales "
                             f"along axis {dim}; allowed: 1, or {channels} along axis {axis}")
        return w, scale, True

    def _bias(self, where: str, i: int, n: int) -> np.ndarray:
        if i < 0:
            return np.zeros(n, dtype=np.int64)
        b = self._buffer(i)
        t = self.sg.Tensors(i)
        if b is None or t.Type() != 2:
            raise ModelError(f"{where}: the bias {self.tnames[i]} must be a constant int32 "
                             f"tensor")
        return b.reshape(-1)

    # Operators --------------------------------------------------------------------------

    def _op_fully_connected(self, op, where, ins, outs, k):
        opts = self._options(op, "FullyConnectedOptions")
        code = opts.FusedActivationFunction() if opts else 0
        if opts is not None and opts.WeightsFormat() != 0:
            raise ModelError(f"{where}: shuffled weights are not supported; allowed: DEFAULT")
        x, wi, bi = ins[0], ins[1], ins[2] if len(ins) > 2 else -1
        in_q = self._int8(where, x, "input")
        out_q = self._int8(where, outs[0], "output")
        n = self._shape(wi)[0]
        w, w_scale, per_channel = self._weights(where, wi, n, 0)
        if per_channel:
            real = [float(np.float32(in_q.scale)) * float(s) / float(np.float32(out_q.scale))
                    for s in w_scale]
        else:       # GetQuantizedConvolutionMultipler: the product of the float32 scales
            product = np.float32(np.float32(in_q.scale) * w_scale[0])
            real = [float(product) / float(np.float32(out_q.scale))]
        func, clamp = self._core_act(where, code, outs[0])
        requant = g.requant_from_real(real, out_q.zero_point, func=func, clamp_hi=clamp,
                                      single=self.fc_single, where=where)
        self._add(g.FullyConnected, where, self.tnames[op.OutputsAsNumpy()[0]],
                  inputs=[self._declare(x)], outputs=[self.tnames[outs[0]]], weight=w.T,
                  bias=self._bias(where, bi, n), input_zp=in_q.zero_point, requant=requant)

    def _conv_common(self, where, opts, ins, outs, w_hwio, w_scale, groups, stride, dilation):
        x = ins[0]
        bi = ins[2] if len(ins) > 2 else -1
        in_q = self._int8(where, x, "input")
        out_q = self._int8(where, outs[0], "output")
        if dilation != (1, 1):
            raise ModelError(f"{where}: dilation {dilation}; allowed: 1")
        _, h, wd, _ = self._shape(x)
        _, ho, wo, cout = self._shape(outs[0])
        kh, kw = w_hwio.shape[:2]
        pads = []
        for size, out, kern, s in ((h, ho, kh, stride[0]), (wd, wo, kw, stride[1])):
            total = max((out - 1) * s + kern - size, 0)
            pads += [total // 2, total - total // 2]
        real = [float(np.float32(in_q.scale)) * float(s) / float(np.float32(out_q.scale))
                for s in w_scale]
        func, clamp = self._core_act(where, opts.FusedActivationFunction(), outs[0])
        requant = g.requant_from_real(real, out_q.zero_point, func=func, clamp_hi=clamp,
                                      single=self.conv_single, where=where)
        op = self._add(g.Conv2D, where, self.tnames[outs[0]], inputs=[self._declare(x)],
                       outputs=[self.tnames[outs[0]]], weight=w_hwio,
                       bias=self._bias(where, bi, cout), input_zp=in_q.zero_point,
                       requant=requant, stride=stride, padding=tuple(pads), groups=groups)
        if op.out_hw(h, wd) != (ho, wo):
            raise ModelError(f"{where}: output {ho}x{wo} does not follow from the input "
                             f"{h}x{wd}, kernel, stride and padding")

    def _op_conv_2d(self, op, where, ins, outs, k):
        opts = self._options(op, "Conv2DOptions")
        cout, kh, kw, cg = self._shape(ins[1])
        w, w_scale, _ = self._weights(where, ins[1], cout, 0)
        cin = self._shape(ins[0])[3]
        if cin % cg:
            raise ModelError(f"{where}: {cin} input channels for filters of {cg}")
        self._conv_common(where, opts, ins, outs, w.transpose(1, 2, 3, 0), w_scale, cin // cg,
                          (opts.StrideH(), opts.StrideW()),
                          (opts.DilationHFactor(), opts.DilationWFactor()))

    def _op_depthwise_conv_2d(self, op, where, ins, outs, k):
        opts = self._options(op, "DepthwiseConv2DOptions")
        _, kh, kw, cout = self._shape(ins[1])
        w, w_scale, _ = self._weights(where, ins[1], cout, 3)
        cin = self._shape(ins[0])[3]
        if cout % cin:
            raise ModelError(f"{where}: {cout} output channels for {cin} input channels")
        self._conv_common(where, opts, ins, outs, w.reshape(kh, kw, 1, cout), w_scale, cin,
                          (opts.StrideH(), opts.StrideW()),
                          (opts.DilationHFactor(), opts.DilationWFactor()))

    def _pool(self, cls, op, where, ins, outs):
        opts = self._options(op, "Pool2DOptions")
        in_q = self._int8(where, ins[0], "input")
        out_q = self._int8(where, outs[0], "output")
        if (in_q.scale, in_q.zero_point) != (out_q.scale, out_q.zero_point):
            raise ModelError(f"{where}: input and output quantisation differ; allowed: equal "
                             f"(as TFLite's int8 pooling requires)")
        _, h, w, _ = self._shape(ins[0])
        _, ho, wo, _ = self._shape(outs[0])
        kernel = (opts.FilterHeight(), opts.FilterWidth())
        stride = (opts.StrideH(), opts.StrideW())
        pads = []
        for size, out, kern, s in ((h, ho, kernel[0], stride[0]), (w, wo, kernel[1], stride[1])):
            total = max((out - 1) * s + kern - size, 0)
            pads += [total // 2, total - total // 2]
        act = self._activation(where, opts.FusedActivationFunction(), outs[0])
        self._add(cls, where, self.tnames[outs[0]], inputs=[self._declare(ins[0])],
                  outputs=[self.tnames[outs[0]]], kernel=kernel, stride=stride,
                  padding=tuple(pads), act=act)

    def _op_max_pool_2d(self, op, where, ins, outs, k):
        self._pool(g.MaxPool2D, op, where, ins, outs)

    def _op_average_pool_2d(self, op, where, ins, outs, k):
        self._pool(g.AveragePool2D, op, where, ins, outs)

    def _op_reshape(self, op, where, ins, outs, k):
        self._add(g.Reshape, where, self.tnames[outs[0]], inputs=[self._operand(ins[0])],
                  outputs=[self.tnames[outs[0]]], shape=self._shape(outs[0]))

    def _op_softmax(self, op, where, ins, outs, k):
        opts = self._options(op, "SoftmaxOptions")
        in_q = self._int8(where, ins[0], "input")
        out_q = self._int8(where, outs[0], "output")
        if out_q.zero_point != -128 or abs(out_q.scale - 1 / 256) > 0.001 / 256:
            raise ModelError(f"{where}: output scale {out_q.scale} and zero point "
                             f"{out_q.zero_point}; allowed: 1/256 and -128 (TFLite's int8 "
                             f"softmax)")
        self._add(g.Softmax, where, self.tnames[outs[0]], inputs=[self._operand(ins[0])],
                  outputs=[self.tnames[outs[0]]], beta=opts.Beta() if opts else 1.0,
                  input_scale=in_q.scale, single=self.single)

    def _op_add(self, op, where, ins, outs, k):
        opts = self._options(op, "AddOptions")
        qa, qb = (self._int8(where, i, "input") for i in ins[:2])
        qo = self._int8(where, outs[0], "output")
        act = self._activation(where, opts.FusedActivationFunction() if opts else 0, outs[0])
        try:
            add = g.Add.from_scales(self.tnames[outs[0]],
                                    [self._operand(ins[0]), self._operand(ins[1])],
                                    [self.tnames[outs[0]]], qa.scale, qa.zero_point,
                                    qb.scale, qb.zero_point, qo.scale, qo.zero_point, act,
                                    single=self.single)
        except g.GraphError as error:
            raise ModelError(f"{where}: {error}") from None
        self.ops.append(add)

    def _op_quantize(self, op, where, ins, outs, k):
        t_in = self.sg.Tensors(ins[0])
        out_q = self._qparams(outs[0])
        lo, hi = out_q.range
        if t_in.Type() == 0:
            self._add(g.Quantize, where, self.tnames[outs[0]], inputs=[self._operand(ins[0])],
                      outputs=[self.tnames[outs[0]]], scale=out_q.scale,
                      zero_point=out_q.zero_point, out_range=(lo, hi))
            return
        in_q = self._qparams(ins[0])
        real = float(np.float32(in_q.scale)) / float(np.float32(out_q.scale))
        self._add(g.Requantize, where, self.tnames[outs[0]], inputs=[self._operand(ins[0])],
                  outputs=[self.tnames[outs[0]]], in_zp=in_q.zero_point,
                  multiplier=g.quantize_multiplier(real, single=self.single),
                  out_zp=out_q.zero_point, out_range=(lo, hi), single=self.single)

    def _op_dequantize(self, op, where, ins, outs, k):
        in_q = self._qparams(ins[0])
        self._add(g.Dequantize, where, self.tnames[outs[0]], inputs=[self._operand(ins[0])],
                  outputs=[self.tnames[outs[0]]], scale=in_q.scale, zero_point=in_q.zero_point)

    # Helpers ----------------------------------------------------------------------------

    def _operand(self, i: int) -> str:
        """The tensor an operator reads: computed, a graph input, or a constant (added as a
        :class:`firmware.graph.Constant` operator the first time)."""
        name = self._declare(i)
        produced = {t for op in self.ops for t in op.outputs}
        if name in produced or i in [int(x) for x in self.sg.InputsAsNumpy()]:
            return name
        value = self._buffer(i)
        if value is None:
            raise ModelError(f"{self.name}: tensor {name} is read before anything computes "
                             f"it and holds no data")
        self.ops.append(g.Constant(f"{name} (constant)", [], [name], value=value))
        return name

    def _add(self, cls, where, name, **kwargs):
        try:
            op = cls(name, **kwargs)
        except g.GraphError as error:
            raise ModelError(f"{where}: {error}") from None
        self.ops.append(op)
        return op
