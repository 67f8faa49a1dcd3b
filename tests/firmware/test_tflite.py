"""The TFLite importer against LiteRT's reference kernels, on the shared int8 models.

The oracle is LiteRT's interpreter with its reference op resolver (``BUILTIN_REF``), which
keeps every intermediate tensor (``experimental_preserve_all_tensors``), so each layer is
compared, not only the outputs. The models are read from ``../shared/models`` beside the repo
(or ``$AMTPU_MODELS``); the tests skip, saying why, when that folder or LiteRT is absent.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from firmware.importers import ModelError, load_model
from firmware.importers.tflite import load_bytes
from firmware.runtime.graph import run_graph

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("AMTPU_MODELS", REPO.parent / "shared" / "models"))
LITERT = pytest.importorskip("ai_edge_litert.interpreter",
                             reason="ai-edge-litert (the oracle) is not installed")
SMALL = ["hello_world_int8", "micro_speech_quantized"]


def model_path(name: str) -> Path:
    path = MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared models; set AMTPU_MODELS to their folder)")
    return path


def person_detect_for_litert() -> bytes:
    """person_detect.tflite with the one field LiteRT 2.3 refuses patched: its depthwise
    biases (1-D) claim quantized_dimension 3, which the int8 kernels never read; set to 0."""
    import tflite
    data = bytearray(model_path("person_detect").read_bytes())
    sg = tflite.Model.GetRootAsModel(bytes(data), 0).Subgraphs(0)
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        q = t.Quantization()
        if q is not None and q.QuantizedDimension() >= max(t.ShapeLength(), 1):
            struct.pack_into("<i", data, q._tab.Pos + q._tab.Offset(16), 0)
    return bytes(data)


class LiteRT:
    """LiteRT's reference kernels on one model, every tensor kept."""

    def __init__(self, content: bytes):
        self.interpreter = LITERT.Interpreter(
            model_content=content,
            experimental_op_resolver_type=LITERT.OpResolverType.BUILTIN_REF,
            experimental_preserve_all_tensors=True)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.index = {t["name"]: t["index"] for t in self.interpreter.get_tensor_details()}

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.interpreter.set_tensor(self.input["index"], x.astype(self.input["dtype"]))
        self.interpreter.invoke()
        return {name: self.interpreter.get_tensor(i) for name, i in self.index.items()}


def random_inputs(graph, n: int, seed: int) -> np.ndarray:
    print(f"seed {seed}")
    t = graph.tensors[graph.inputs[0]]
    return np.random.default_rng(seed).integers(-128, 128, size=(n, *t.shape[1:]))


def compare_layers(graph, oracle: LiteRT, x: np.ndarray) -> int:
    """Every tensor the graph computes equal to LiteRT's for each item of ``x``; returns
    how many tensors were compared."""
    compared = 0
    for item in x:
        want = oracle(item[None])
        got = graph.reference({graph.inputs[0]: item[None]}, collect=True)
        for op in graph.ops:
            for name in op.outputs:
                np.testing.assert_array_equal(got[name], want[name].reshape(got[name].shape),
                                              err_msg=f"tensor {name} (operator {op.name})")
                compared += 1
    return compared


@pytest.mark.parametrize("name", SMALL)
def test_reference_equals_litert_layer_by_layer(name):
    path = model_path(name)
    graph = load_model(path)
    oracle = LiteRT(path.read_bytes())
    x = random_inputs(graph, 300, seed=36)
    assert compare_layers(graph, oracle, x) == 300 * len(graph.ops)


def test_person_detect_reference_equals_litert_layer_by_layer():
    """LiteRT refuses person_detect as shipped; with the biases' unused quantisation axis
    patched it runs, and every one of the 31 layers equals the reference."""
    content = person_detect_for_litert()
    graph = load_bytes(content, name="person_detect")
    assert [type(op).__name__ for op in graph.ops].count("Conv2D") == 28
    compare_layers(graph, LiteRT(content), random_inputs(graph, 3, seed=37))
    # The shipped file imports to the same graph.
    shipped = load_model(model_path("person_detect"))
    x = random_inputs(graph, 1, seed=38)
    assert (shipped.reference({shipped.inputs[0]: x})[shipped.outputs[0]]
            == graph.reference({graph.inputs[0]: x})[graph.outputs[0]]).all()


def test_double_rounding_is_not_litert_fully_connected():
    """Teeth: gemmlowp's double rounding in the fully connected layers differs from LiteRT
    on near-ties (the reason the importer rounds them once)."""
    path = model_path("hello_world_int8")
    graph = load_model(path, rounding="double")
    oracle = LiteRT(path.read_bytes())
    with pytest.raises(AssertionError):
        compare_layers(graph, oracle, random_inputs(graph, 300, seed=36))


@pytest.mark.parametrize("name", SMALL)
def test_isa_simulator_equals_litert(name):
    path = model_path(name)
    graph = load_model(path)
    oracle = LiteRT(path.read_bytes())
    x = random_inputs(graph, 16, seed=39)
    result = run_graph(graph, {graph.inputs[0]: x}, device="isa")
    out = graph.outputs[0]
    want = np.concatenate([oracle(item[None])[out] for item in x])
    np.testing.assert_array_equal(result.outputs[out], want.reshape(result.outputs[out].shape))
    for op in graph.ops:                  # the segments' own outputs too
        if op.outputs[0] in result.tensors and op.outputs[0] not in graph.inputs:
            ref = graph.reference({graph.inputs[0]: x}, collect=True)[op.outputs[0]]
            np.testing.assert_array_equal(result.tensors[op.outputs[0]], ref)


@pytest.mark.slow          # 20 s; make test runs the other two models
def test_person_detect_isa_equals_reference():
    graph = load_model(model_path("person_detect"))
    x = random_inputs(graph, 1, seed=40)
    result = run_graph(graph, {graph.inputs[0]: x}, device="isa")
    ref = graph.reference({graph.inputs[0]: x}, collect=True)
    for name, value in result.tensors.items():
        np.testing.assert_array_equal(value, ref[name], err_msg=f"tensor {name}")


@pytest.mark.parametrize("name", [
    "hello_world_int8",
    # Some 18,000 cycles: over a minute on Icarus.
    pytest.param("micro_speech_quantized", marks=pytest.mark.slow)])
def test_rtl_equals_litert(rtl_device, name):
    """One input of each model on the RTL core (default configuration), equal to LiteRT."""
    path = model_path(name)
    graph = load_model(path)
    oracle = LiteRT(path.read_bytes())
    x = random_inputs(graph, 1, seed=41)
    result = run_graph(graph, {graph.inputs[0]: x}, device=rtl_device("default"))
    out = graph.outputs[0]
    want = oracle(x)[out]
    np.testing.assert_array_equal(result.outputs[out], want.reshape(result.outputs[out].shape))
    assert result.cycles and result.utilisation


# Refusals -----------------------------------------------------------------------------------

def _field(table, slot: int) -> int:
    """Byte position of a table's scalar field (``slot`` its vtable offset); must be set."""
    offset = table._tab.Offset(slot)
    assert offset, "the field is not stored in this model"
    return table._tab.Pos + offset


def _hello() -> tuple[bytearray, object]:
    import tflite
    data = bytearray(model_path("hello_world_int8").read_bytes())
    return data, tflite.Model.GetRootAsModel(bytes(data), 0)


def test_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"PK\x03\x04 this is a zip archive")
    with pytest.raises(ModelError, match="not a TFLite flatbuffer"):
        load_model(path)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(ModelError, match="allowed: TFLite flatbuffers"):
        load_model(other)


def test_refuses_a_truncated_file():
    data = model_path("hello_world_int8").read_bytes()
    for size in (len(data) - 1, len(data) // 2, 200, 40):
        with pytest.raises(ModelError, match="cut: the flatbuffer is truncated or corrupt"):
            load_bytes(data[:size], name="cut")


def test_refuses_an_unsupported_operator():
    data, model = _hello()
    code = model.OperatorCodes(0)
    data[_field(code, 4)] = 28                                  # TANH
    if code._tab.Offset(10):
        struct.pack_into("<i", data, _field(code, 10), 28)
    with pytest.raises(ModelError, match=r"operator 0 \(TANH.*not supported; allowed: ADD"):
        load_bytes(bytes(data), name="hello")


def test_refuses_an_unsupported_operator_version():
    data, model = _hello()
    struct.pack_into("<i", data, _field(model.OperatorCodes(0), 8), 99)
    with pytest.raises(ModelError, match="FULLY_CONNECTED.*version 99 is not supported; "
                                         "allowed: 1 to"):
        load_bytes(bytes(data), name="hello")


def test_refuses_an_unsupported_schema_version():
    data, model = _hello()
    struct.pack_into("<I", data, _field(model, 4), 2)
    with pytest.raises(ModelError, match="schema version 2; allowed: 3"):
        load_bytes(bytes(data), name="hello")


def test_refuses_a_dynamic_shape():
    data, model = _hello()
    sg = model.Subgraphs(0)
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        if t.ShapeSignatureLength() == 2 and t.ShapeSignature(1) == 16:
            vector = t._tab.Vector(t._tab.Offset(18))
            struct.pack_into("<i", data, vector + 4, -1)
            name = t.Name().decode()
            break
    with pytest.raises(ModelError, match=f"tensor {name} has a dynamic shape .*the batch "
                                         f"dimension only"):
        load_bytes(bytes(data), name="hello")


def test_refuses_asymmetric_weights():
    data, model = _hello()
    sg = model.Subgraphs(0)
    t = next(sg.Tensors(i) for i in range(sg.TensorsLength())
             if sg.Tensors(i).Name() == b"sequential/dense_1/MatMul")
    q = t.Quantization()
    vector = q._tab.Vector(q._tab.Offset(10))
    struct.pack_into("<q", data, vector, 3)
    with pytest.raises(ModelError, match="dense_1/MatMul have zero points \\[3\\]; allowed: 0"):
        load_bytes(bytes(data), name="hello")


def test_refuses_a_fused_activation_the_core_lacks():
    import tflite
    data, model = _hello()
    op = model.Subgraphs(0).Operators(0)
    table = op.BuiltinOptions()
    opts = tflite.FullyConnectedOptions()
    opts.Init(table.Bytes, table.Pos)
    data[_field(opts, 4)] = 4                                   # TANH
    with pytest.raises(ModelError, match="fused activation TANH is not supported; allowed: "
                                         "NONE, RELU, RELU6"):
        load_bytes(bytes(data), name="hello")


def test_refuses_an_unknown_rounding():
    with pytest.raises(ModelError, match="rounding='nearest'; allowed: litert, double"):
        load_model(model_path("hello_world_int8"), rounding="nearest")


@pytest.mark.slow
def test_person_detect_rtl_equals_reference():
    """person_detect on the RTL core (Verilator: some 400,000 cycles), every layer the core
    computes equal to the reference, which equals LiteRT layer by layer (above)."""
    from firmware.device import open_device
    from hdl.presets import get_config
    graph = load_model(model_path("person_detect"))
    x = random_inputs(graph, 1, seed=42)
    device = open_device("rtl", get_config("default"), sim="verilator")
    try:
        result = run_graph(graph, {graph.inputs[0]: x}, device=device)
    finally:
        device.close()
    ref = graph.reference({graph.inputs[0]: x}, collect=True)
    for name, value in result.tensors.items():
        np.testing.assert_array_equal(value, ref[name], err_msg=f"tensor {name}")
    assert result.cycles and result.utilisation


@pytest.mark.slow          # 15 s on the ISA simulator; the deep preset's own Verilator build
@pytest.mark.parametrize("device", ["isa", "rtl"])
def test_person_detect_whole_on_the_deep_core(device):
    """On the deep preset (an 8,192-row unified buffer) person_detect lowers to one core
    step, every operator but the final softmax in one program (its input crosses the link
    once, as the tensor itself), and its output equals LiteRT's (patched as above), on the
    ISA simulator and on the RTL for one input."""
    from firmware.compiler.lowering import CoreStep, HostStep, lower
    from firmware.device import open_device
    from hdl.presets import get_config
    graph = load_model(model_path("person_detect"))
    config = get_config("deep")
    steps = lower(graph, config)
    assert [type(s) for s in steps] == [CoreStep, HostStep], steps
    assert len(steps[0].segments) == 1 and not steps[0].segments[0].patches
    oracle = LiteRT(person_detect_for_litert())
    x = random_inputs(graph, 1, seed=43)
    dev = open_device(device, config, **({"sim": "verilator"} if device == "rtl" else {}))
    try:
        result = run_graph(graph, {graph.inputs[0]: x}, device=dev)
    finally:
        dev.close()
    out = graph.outputs[0]
    want = oracle(x)[out]
    np.testing.assert_array_equal(result.outputs[out], want.reshape(result.outputs[out].shape))


# The command line ---------------------------------------------------------------------------

def test_cli_run_checks_against_litert(tmp_path, capsys):
    from firmware.cli import main
    path = model_path("hello_world_int8")
    graph = load_model(path)
    name = graph.inputs[0]
    x = np.array([[0.5], [1.5], [3.0], [-0.2]])
    np.savez(tmp_path / "x.npz", **{name: x})
    rc = main(["run", str(path), "--inputs", str(tmp_path / "x.npz"), "--outputs",
               str(tmp_path / "y.npz"), "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "equal elements" in out and "4 / 4" in out
    assert "operators: 3 on the core in programs from their input to their output, 0 " \
        "convolutions over patches the host cuts, 0 on the host" in out
    want = graph.reference({name: graph.tensors[name].q.quantise(x)})[graph.outputs[0]]
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_array_equal(y[graph.outputs[0]], want)


def test_cli_run_refuses_inputs_by_name(tmp_path, capsys):
    from firmware.cli import main
    path = model_path("micro_speech_quantized")
    np.savez(tmp_path / "x.npz", a=np.zeros((1, 1960), int), b=np.zeros((1, 1960), int))
    assert main(["run", str(path), "--inputs", str(tmp_path / "x.npz")]) == 2
    assert "has arrays ['a', 'b']; the model takes ['Reshape_1']" in capsys.readouterr().err
    np.savez(tmp_path / "x.npz", x=np.full((1, 1960), np.nan))
    assert main(["run", str(path), "--inputs", str(tmp_path / "x.npz")]) == 2
    assert "NaN or infinite" in capsys.readouterr().err
    np.save(tmp_path / "x.npy", np.zeros((1, 1960), int))     # one array: taken as the input
    assert main(["run", str(path), "--inputs", str(tmp_path / "x.npy")]) == 0
    (tmp_path / "x.txt").write_text("1 2 3")
    assert main(["run", str(path), "--inputs", str(tmp_path / "x.txt")]) == 2
    assert "not an .npz or .npy of the inputs" in capsys.readouterr().err
    (tmp_path / "bad.tflite").write_bytes(b"\0" * 64)
    assert main(["run", str(tmp_path / "bad.tflite"), "--inputs",
                 str(tmp_path / "x.npz")]) == 2
    assert "not a TFLite flatbuffer" in capsys.readouterr().err


def test_cli_compile_writes_the_programs(tmp_path, capsys):
    """The assembly file re-assembles to exactly the beats of every segment's setup and batch
    programs, and its header is the per-layer report."""
    from firmware.asm import assemble
    from firmware.cli import main
    from firmware.compiler import compile_network
    from firmware.compiler.lowering import CoreStep, lower
    from hdl.presets import get_config
    path = model_path("micro_speech_quantized")
    out = tmp_path / "prog.s"
    assert main(["compile", str(path), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "Conv2D" in report and "320,000" in report and "Softmax" in report
    config = get_config("default")
    beats = []
    for step in lower(load_model(path), config):
        if isinstance(step, CoreStep):
            for seg in step.segments:
                compiled = compile_network(seg.network, config)
                beats += compiled.setup_program()[0]
                x = np.full((1, *seg.network.input_shape), seg.network.input_q.zero_point)
                beats += compiled.batch_program(x).beats
    assert assemble(out.read_text(), config) == beats


# Every operator, in a model written here ----------------------------------------------------

def operator_zoo(seed: int) -> bytes:
    """float input -> QUANTIZE -> CONV_2D (stride 2, SAME with the odd pixel, RELU6,
    per-channel) -> DEPTHWISE_CONV_2D (multiplier 2, RELU) -> MAX_POOL_2D and AVERAGE_POOL_2D
    (3x3, stride 2, SAME) -> ADD -> QUANTIZE (int8 to int8) -> RESHAPE -> FULLY_CONNECTED ->
    SOFTMAX -> DEQUANTIZE."""
    from tests.firmware.tflite_models import Op, T, build
    rng = np.random.default_rng(seed)
    s_w1 = rng.uniform(0.002, 0.02, 6)
    s_w2 = rng.uniform(0.002, 0.02, 12)
    s_w3 = 0.004
    same2 = {"Padding": 0, "StrideW": 2, "StrideH": 2}
    tensors = [
        T("x", (1, 8, 7, 3), "float32"),
        T("a", (1, 8, 7, 3), scale=[0.04], zp=[2]),
        T("w1", (6, 3, 3, 3), data=rng.integers(-127, 128, (6, 3, 3, 3)), scale=list(s_w1)),
        T("b1", (6,), "int32", data=rng.integers(-900, 900, 6), scale=list(0.04 * s_w1)),
        T("b", (1, 4, 4, 6), scale=[0.03], zp=[-128]),
        T("w2", (1, 3, 3, 12), data=rng.integers(-127, 128, (1, 3, 3, 12)), scale=list(s_w2),
          qdim=3),
        T("b2", (12,), "int32", data=rng.integers(-900, 900, 12), scale=list(0.03 * s_w2)),
        T("c", (1, 4, 4, 12), scale=[0.05], zp=[-20]),
        T("d", (1, 2, 2, 12), scale=[0.05], zp=[-20]),
        T("e", (1, 2, 2, 12), scale=[0.05], zp=[-20]),
        T("f", (1, 2, 2, 12), scale=[0.07], zp=[5]),
        T("g", (1, 2, 2, 12), scale=[0.06], zp=[-3]),
        T("shape", (2,), "int32", data=np.array([1, 48])),
        T("h", (1, 48), scale=[0.06], zp=[-3]),
        T("w3", (10, 48), data=rng.integers(-127, 128, (10, 48)), scale=[s_w3]),
        T("b3", (10,), "int32", data=rng.integers(-900, 900, 10), scale=[0.06 * s_w3]),
        T("i", (1, 10), scale=[0.2], zp=[7]),
        T("j", (1, 10), scale=[1 / 256], zp=[-128]),
        T("k", (1, 10), "float32"),
    ]
    ops = [
        Op("QUANTIZE", [0], [1]),
        Op("CONV_2D", [1, 2, 3], [4], 3, ("Conv2DOptions", {
            **same2, "FusedActivationFunction": 3, "DilationWFactor": 1,
            "DilationHFactor": 1})),
        Op("DEPTHWISE_CONV_2D", [4, 5, 6], [7], 3, ("DepthwiseConv2DOptions", {
            "Padding": 0, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 2,
            "FusedActivationFunction": 1, "DilationWFactor": 1, "DilationHFactor": 1})),
        Op("MAX_POOL_2D", [7], [8], 2, ("Pool2DOptions", {
            **same2, "FilterWidth": 3, "FilterHeight": 3})),
        Op("AVERAGE_POOL_2D", [7], [9], 2, ("Pool2DOptions", {
            **same2, "FilterWidth": 3, "FilterHeight": 3})),
        Op("ADD", [8, 9], [10], 2, ("AddOptions", {"FusedActivationFunction": 0})),
        Op("QUANTIZE", [10], [11], 2),
        Op("RESHAPE", [11, 12], [13]),
        Op("FULLY_CONNECTED", [13, 14, 15], [16], 4, ("FullyConnectedOptions", {})),
        Op("SOFTMAX", [16], [17], 2, ("SoftmaxOptions", {"Beta": 1.0})),
        Op("DEQUANTIZE", [17], [18], 2),
    ]
    return build(tensors, ops, [0], [18])


def test_every_operator_equals_litert_layer_by_layer():
    print("seeds 43, 44")
    content = operator_zoo(43)
    graph = load_bytes(content, name="zoo")
    assert {type(op).__name__ for op in graph.ops} == {
        "Quantize", "Conv2D", "MaxPool2D", "AveragePool2D", "Add", "Requantize", "Reshape",
        "FullyConnected", "Softmax", "Dequantize"}
    assert graph.ops[1].padding == (0, 1, 1, 1) and graph.ops[2].groups == 6
    oracle = LiteRT(content)
    x = np.random.default_rng(44).normal(0, 3, (100, 8, 7, 3)).astype(np.float32)
    compared = 0
    for item in x:
        want = oracle(item[None])
        got = graph.reference({"x": item[None]}, collect=True)
        for op in graph.ops:
            name = op.outputs[0]
            np.testing.assert_array_equal(got[name], want[name].reshape(got[name].shape),
                                          err_msg=f"tensor {name} ({type(op).__name__})")
            compared += 1
    assert compared == 100 * len(graph.ops)
    result = run_graph(graph, {"x": x[:4]}, device="isa")
    np.testing.assert_array_equal(result.outputs["k"], graph.reference({"x": x[:4]})["k"])
