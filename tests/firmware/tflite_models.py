"""Small TFLite flatbuffers written with the ``tflite`` package's generated builders, for
checking operators no shared model has (ADD, pooling with SAME padding, QUANTIZE, ...)
against LiteRT."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

__all__ = ["T", "Op", "build"]

_TYPES = {"float32": 0, "int32": 2, "uint8": 3, "int64": 4, "int8": 9}


@dataclass
class T:
    """A tensor: ``data`` makes it a constant; ``scale``/``zp`` (lists) its quantisation."""
    name: str
    shape: tuple[int, ...]
    type: str = "int8"
    data: np.ndarray | None = None
    scale: list[float] | None = None
    zp: list[int] | None = None
    qdim: int = 0


@dataclass
class Op:
    code: str
    inputs: list[int]
    outputs: list[int]
    version: int = 1
    options: tuple[str, dict] | None = None
    extra: dict = field(default_factory=dict)


def _module(name: str):
    return importlib.import_module(f"tflite.{name}")


def _table(b, name: str, fields: dict) -> int:
    m = _module(name)
    getattr(m, f"{name}Start")(b)
    for key, value in fields.items():
        getattr(m, f"{name}Add{key}")(b, value)
    return getattr(m, f"{name}End")(b)


def build(tensors: list[T], ops: list[Op], inputs: list[int], outputs: list[int]) -> bytes:
    import flatbuffers
    import tflite

    b = flatbuffers.Builder(1024)
    # Buffers: 0 is the empty one; each constant tensor gets its own.
    buffer_data = [None]
    tensor_buffer = []
    for t in tensors:
        if t.data is None:
            tensor_buffer.append(0)
        else:
            dtype = {"float32": "<f4", "int32": "<i4", "uint8": "u1", "int64": "<i8",
                     "int8": "i1"}[t.type]
            buffer_data.append(np.asarray(t.data).astype(dtype).tobytes())
            tensor_buffer.append(len(buffer_data) - 1)
    buffers = []
    for data in buffer_data:
        vec = None
        if data is not None:
            b.StartVector(1, len(data), 16)
            for byte in reversed(data):
                b.PrependUint8(byte)
            vec = b.EndVector()
        buffers.append(_table(b, "Buffer", {} if vec is None else {"Data": vec}))
    tensor_offsets = []
    for t, buf in zip(tensors, tensor_buffer, strict=True):
        quant = None
        if t.scale is not None:
            scale = b.CreateNumpyVector(np.asarray(t.scale, dtype=np.float32))
            zp = b.CreateNumpyVector(np.asarray(t.zp if t.zp is not None
                                                else [0] * len(t.scale), dtype=np.int64))
            quant = _table(b, "QuantizationParameters", {"Scale": scale, "ZeroPoint": zp,
                                                         "QuantizedDimension": t.qdim})
        name = b.CreateString(t.name)
        shape = b.CreateNumpyVector(np.asarray(t.shape, dtype=np.int32))
        fields = {"Shape": shape, "Type": _TYPES[t.type], "Buffer": buf, "Name": name}
        if quant is not None:
            fields["Quantization"] = quant
        tensor_offsets.append(_table(b, "Tensor", fields))
    codes: list[tuple[int, int]] = []
    op_offsets = []
    for op in ops:
        code = getattr(tflite.BuiltinOperator, op.code)
        key = (code, op.version)
        if key not in codes:
            codes.append(key)
        fields = {"OpcodeIndex": codes.index(key),
                  "Inputs": b.CreateNumpyVector(np.asarray(op.inputs, dtype=np.int32)),
                  "Outputs": b.CreateNumpyVector(np.asarray(op.outputs, dtype=np.int32))}
        if op.options is not None:
            name, values = op.options
            fields["BuiltinOptionsType"] = getattr(tflite.BuiltinOptions, name)
            fields["BuiltinOptions"] = _table(b, name, values)
        op_offsets.append(_table(b, "Operator", fields))
    code_offsets = [_table(b, "OperatorCode", {"DeprecatedBuiltinCode": min(code, 127),
                                                "BuiltinCode": code, "Version": version})
                    for code, version in codes]

    def vector(offsets, start):
        start(b, len(offsets))
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    sg_mod = _module("SubGraph")
    tensors_vec = vector(tensor_offsets, sg_mod.SubGraphStartTensorsVector)
    ops_vec = vector(op_offsets, sg_mod.SubGraphStartOperatorsVector)
    subgraph = _table(b, "SubGraph", {
        "Tensors": tensors_vec, "Operators": ops_vec,
        "Inputs": b.CreateNumpyVector(np.asarray(inputs, dtype=np.int32)),
        "Outputs": b.CreateNumpyVector(np.asarray(outputs, dtype=np.int32))})
    model_mod = _module("Model")
    codes_vec = vector(code_offsets, model_mod.ModelStartOperatorCodesVector)
    subgraphs_vec = vector([subgraph], model_mod.ModelStartSubgraphsVector)
    buffers_vec = vector(buffers, model_mod.ModelStartBuffersVector)
    model = _table(b, "Model", {"Version": 3, "OperatorCodes": codes_vec,
                                "Subgraphs": subgraphs_vec, "Buffers": buffers_vec})
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())
