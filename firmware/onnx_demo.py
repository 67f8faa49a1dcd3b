"""``amtpu demo --net onnx``: the digits MLP as a user brings it, an ONNX model quantised by
onnxruntime, run on the core and checked against onnxruntime on every element.

The model is built at run time from the committed data, in the steps a user takes:

1. train the MLP exactly as ``amtpu demo --net mlp`` does (scikit-learn's ``MLPClassifier``,
   :data:`firmware.models.digits.MLP_HIDDEN` and ``MLP_SEED`` on the digits training split);
2. export it with skl2onnx and keep the graph up to the logits (softmax and arg-max do not
   change the predicted class; the host takes the arg-max);
3. fuse each ``MatMul`` + ``Add`` into a ``Gemm`` with a 1-D bias (what onnxruntime's
   ``quant_pre_process`` does, without its shape-inference dependency; a ``(1, N)`` bias trips
   ``quantize_static``'s per-channel path);
4. ``quantize_static`` with the training split as calibration data: QDQ format, per-channel
   int8 weights, int8 activations (with uint8 activations, onnxruntime on an x86 CPU without
   VNNI saturates pair sums of uint8 x int8 products to int16, and no exact core could equal
   it there: :func:`firmware.importers.onnx.onnxruntime_pairs_saturate`; int8 runs on its
   exact int8 kernels on every CPU with the oracle's session option,
   :func:`firmware.importers.onnx.onnxruntime_session`);
5. import it (:mod:`firmware.importers.onnx`), run it on a device, and compare every output
   element with onnxruntime's on the same inputs.

Building it rather than committing the ``.onnx`` keeps no binary to fall out of step with the
trainer; it takes a few seconds and needs the dev extras (skl2onnx, onnxruntime), which are
the oracle anyway.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

__all__ = ["build_model", "demo"]


def _train(split):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from firmware.models.digits import MLP_HIDDEN, MLP_SEED

    x = split.x_train.reshape(len(split.x_train), -1)
    model = MLPClassifier(hidden_layer_sizes=MLP_HIDDEN, max_iter=400, random_state=MLP_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, split.y_train)
    return model


def _logits_as_gemms(model):
    """The skl2onnx graph cut at the logits (the input of its Softmax), its float-to-float
    Cast dropped and each MatMul + Add of a constant fused into a Gemm with a 1-D bias."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    logits = next(n for n in graph.node if n.op_type == "Softmax").input[0]
    alias: dict[str, str] = {}                     # a dropped node's output -> its input
    nodes, keep = [], []
    matmul = None
    for node in graph.node:
        inputs = [alias.get(i, i) for i in node.input]
        if node.op_type == "Cast":
            alias[node.output[0]] = inputs[0]
        elif node.op_type == "MatMul":
            matmul = (inputs, node)
        elif node.op_type == "Add" and matmul is not None and matmul[1].output[0] in inputs:
            bias_name = next(i for i in inputs if i in inits)
            bias = numpy_helper.to_array(inits[bias_name]).reshape(-1).astype(np.float32)
            b_name = f"{bias_name}_1d"
            keep += [inits[matmul[0][1]], numpy_helper.from_array(bias, b_name)]
            nodes.append(helper.make_node("Gemm", [matmul[0][0], matmul[0][1], b_name],
                                          [node.output[0]], name=matmul[1].name or None))
            matmul = None
        elif node.op_type == "Relu":
            nodes.append(helper.make_node("Relu", inputs, list(node.output),
                                          name=node.name or None))
        else:
            raise ValueError(f"unexpected {node.op_type} before the logits in skl2onnx's graph")
        if node.output[0] == logits:
            break
    out = helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, [None, 10])
    new = helper.make_graph(nodes, "digits_mlp", [graph.input[0]], [out], keep)
    return helper.make_model(new, opset_imports=[helper.make_opsetid("", 17)])


class _Calibration:
    """onnxruntime's CalibrationDataReader over the training images."""

    def __init__(self, name: str, x: np.ndarray):
        self._it = iter([{name: x[i:i + 64]} for i in range(0, len(x), 64)])

    def get_next(self):
        return next(self._it, None)


def build_model(split, directory: Path) -> tuple[Path, object]:
    """Train, export, fuse and quantise the digits MLP into ``directory``; returns the
    quantised model's path and the trained scikit-learn model."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from skl2onnx import to_onnx

    clf = _train(split)
    x = split.x_train.reshape(len(split.x_train), -1).astype(np.float32)
    exported = to_onnx(clf, x[:1], options={"zipmap": False}, target_opset=17)
    float_model = _logits_as_gemms(exported)
    float_path, q_path = directory / "digits_mlp.onnx", directory / "digits_mlp_qdq.onnx"
    onnx.save(float_model, float_path)
    logging.disable(logging.WARNING)            # quantize_static's pre-processing advice
    try:
        quantize_static(str(float_path), str(q_path),
                        _Calibration(float_model.graph.input[0].name, x),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    return q_path, clf


def demo(args: argparse.Namespace, print_counters=None) -> int:
    """Run the ONNX digits MLP on ``args.transport`` (see the module notes).
    ``print_counters(counters, config, images)`` prints the core's counters (the CLI passes
    its own, so that this module need not import the CLI)."""
    from firmware.datasets import digits
    from firmware.device import open_device, transport_options
    from firmware.importers import load_model
    from firmware.importers.onnx import onnxruntime_session
    from firmware.runtime.graph import run_graph
    from hdl.presets import get_config

    config = get_config(args.config)
    split = digits()
    n = len(split.x_test) if args.images is None else min(args.images, len(split.x_test))
    if n < 1:
        print("demo: --images must be at least 1", file=sys.stderr)
        return 2
    x = split.x_test[:n].reshape(n, -1).astype(np.float32)
    y = split.y_test[:n]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path, clf = build_model(split, Path(tmp))
        graph = load_model(path)
        session = onnxruntime_session(path)
    name_in, name_out = graph.inputs[0], graph.outputs[0]
    ort_out = session.run(None, {name_in: x})[0]
    print(f"amtpu demo: onnx (the digits MLP, skl2onnx + onnxruntime quantize_static QDQ, "
          f"per-channel int8 weights, int8 activations) on the {config.name} core "
          f"({args.config}), {n} test images, transport {args.transport}"
          + (f" ({args.sim})" if args.transport == "rtl" else ""))
    for row in graph.summary():
        print(f"    {row['name']:<28} {row['op']:<16} {str(row['shape']):<12} "
              f"{row['macs']:>7,} MACs  {row['runs on']}")
    print(f"  prepared (train, export, quantise, import) in {time.perf_counter() - t0:.1f} s")

    options = transport_options(args.transport, sim=args.sim, waves=args.waves, port=args.port,
                                baudrate=args.baud)
    t1 = time.perf_counter()
    device = open_device(args.transport, config, **options)
    try:
        result = run_graph(graph, {name_in: x}, device=device)
    finally:
        device.close()
    wall = time.perf_counter() - t1
    out = result.outputs[name_out]
    reference = graph.reference({name_in: x})[name_out]
    equal = out.shape == ort_out.shape and bool((out == ort_out).all())
    ref_equal = bool((reference == ort_out).all())
    acc_float = float((clf.predict(x) == y).mean())
    acc_ort = float((ort_out.argmax(axis=1) == y).mean())
    acc_dev = float((out.argmax(axis=1) == y).mean())
    print(f"  accuracy: float (scikit-learn) {100 * acc_float:.2f} %, onnxruntime int8 "
          f"{100 * acc_ort:.2f} %, {args.transport} {100 * acc_dev:.2f} %")
    print(f"  {args.transport} outputs equal to onnxruntime's: "
          + (f"every one of {out.size:,} elements" if equal else
             f"NO ({int((out != ort_out).sum())} of {out.size:,} elements differ)")
          + f"; integer reference equal to onnxruntime's: {'yes' if ref_equal else 'NO'}")
    cycles = result.cycles
    if cycles:
        print(f"  cycles per image: {cycles / n:,.1f} ({cycles:,} cycles for {n} images, "
              f"{len(result.segments)} core segment(s))")
        if print_counters is not None:
            print_counters(result.counters, config, n)
        print(f"  model utilisation: {result.macs:,} MACs / ({config.rows}x{config.cols} x "
              f"{cycles:,} cycles) = {100 * result.utilisation:.1f} %")
    print(f"  wall time: {wall:.1f} s for {n} images (device start-up included)")
    if not equal:
        print("demo: FAILED: the device's outputs differ from onnxruntime's", file=sys.stderr)
        return 1
    return 0
