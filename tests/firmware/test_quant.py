"""The int8 post-training quantiser and its reference executor (firmware.quant).

Integers the quantiser or the reference produce (quantised weights, folded biases, zero points,
clamp limits, outputs) compare with ``==`` against values derived here from first principles;
tolerances appear only where int8 results are compared with the float network.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from firmware import nn
from firmware.quant import QParams, QuantError, QuantisedNetwork, quantise, reference_forward
from hdl.isa import Func
from sim.models import golden

SEED = 20260512
INT32_MAX = (1 << 31) - 1


def dense_network(weight, bias=None, act=None, name: str = "fc") -> nn.Network:
    layers = [nn.Dense(weight, bias, name=name)]
    if act is not None:
        layers.append(act())
    return nn.Network((np.shape(weight)[0],), layers)


def weight_scale(weight: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric scale, as the quantiser documents it."""
    w_max = np.abs(weight.reshape(-1, weight.shape[-1])).max(axis=0)
    return np.where(w_max > 0, w_max / 127, 1.0)


def requant_scale(stage) -> float:
    """The scale the accumulator is requantised to: the tables' input scale for
    sigmoid/tanh, the stage's output scale otherwise."""
    if stage.func in (Func.SIGMOID, Func.TANH):
        return golden.LUT_INPUT_SCALE
    return stage.out_q.scale


def conv_written_out(x_q, kernel_q, pad, pad_value, signed, stride: int = 1) -> np.ndarray:
    """Integer cross-correlation with explicit loops (independent of nn.im2col), then the
    golden matmul per output pixel; int32 results. Output (y, x) reads the padded input from
    (stride * y, stride * x)."""
    n, h, w, cin = x_q.shape
    kh, kw, _, cout = kernel_q.shape
    py, px = pad
    padded = np.full((n, h + 2 * py, w + 2 * px, cin), pad_value, dtype=np.int64)
    padded[:, py:py + h, px:px + w, :] = x_q
    ho, wo = (h + 2 * py - kh) // stride + 1, (w + 2 * px - kw) // stride + 1
    out = np.zeros((n, ho, wo, cout), dtype=np.int64)
    for y in range(ho):
        for x in range(wo):
            sy, sx = stride * y, stride * x
            patch = padded[:, sy:sy + kh, sx:sx + kw, :].reshape(n, -1)
            out[:, y, x, :] = golden.matmul(patch, kernel_q.reshape(-1, cout), x_signed=signed)
    return out


def pool_written_out(x) -> np.ndarray:
    n, h, w, c = x.shape
    out = np.empty((n, h // 2, w // 2, c), dtype=np.int64)
    for y in range(h // 2):
        for xx in range(w // 2):
            out[:, y, xx, :] = x[:, 2 * y:2 * y + 2, 2 * xx:2 * xx + 2, :].max(axis=(1, 2))
    return out


def check_stage_params(stage, weight, bias_f, label: str):
    """Weights, folded bias and requantisation of one stage against their definitions."""
    s_w = weight_scale(weight)
    s_in, z_in = stage.in_q.scale, stage.in_q.zero_point
    assert np.all(np.isfinite(s_w)) and math.isfinite(s_in) and math.isfinite(stage.out_q.scale)
    w_q = np.clip(np.round(weight / s_w), -127, 127).astype(np.int64)
    assert np.array_equal(stage.weight, w_q), label
    assert np.abs(stage.weight).max() <= 127, label
    nonzero = np.abs(weight.reshape(-1, weight.shape[-1])).max(axis=0) > 0
    assert np.array_equal(np.abs(stage.weight_matrix).max(axis=0) == 127, nonzero), label
    bias = np.round(bias_f / (s_in * s_w)).astype(np.int64) - z_in * w_q.reshape(
        -1, w_q.shape[-1]).sum(axis=0)
    assert np.array_equal(stage.bias, bias), label
    # multiplier / 2**shift = s_in * s_w / s_out, rounded to nearest, full precision used.
    m, shift = stage.multiplier, stage.shift
    assert isinstance(shift, int) and 0 <= shift <= 63, label
    assert m.min() >= 0 and m.max() <= INT32_MAX, label
    real = s_in * s_w / requant_scale(stage)
    assert np.all(np.abs(m - real * 2.0 ** shift) <= 0.5), label
    assert shift == 63 or m.max() > INT32_MAX // 2, f"{label}: precision left unused"
    top = int(np.argmax(real))
    assert abs(m[top] / 2.0 ** shift - real[top]) <= real[top] * 2.0 ** -30, label


# QParams -------------------------------------------------------------------------------------

@pytest.mark.parametrize("signed", [True, False], ids=["int8", "uint8"])
@pytest.mark.parametrize("seed", range(SEED, SEED + 8))
def test_qparams_round_trip(seed, signed):
    rng = np.random.default_rng(seed)
    lo, hi = golden.operand_range(signed)
    scale = float(10.0 ** rng.uniform(-6, 3))
    zero_point = int(rng.integers(lo, hi, endpoint=True)) if signed else 0
    qp = QParams(scale, zero_point, signed)
    q = np.arange(lo, hi + 1)
    assert np.array_equal(qp.quantise(qp.dequantise(q)), q), f"seed {seed}"
    assert qp.dequantise(zero_point) == 0.0 and qp.quantise(0.0) == zero_point
    # Floats inside the representable range come back within half a step.
    x = rng.uniform(qp.dequantise(lo), qp.dequantise(hi), 1000)
    assert np.all(np.abs(qp.dequantise(qp.quantise(x)) - x) <= scale * (0.5 + 1e-9))
    # Outside it they saturate.
    far = np.array([qp.dequantise(lo) - 1e3 * scale, qp.dequantise(hi) + 1e3 * scale, -1e300,
                    1e300])
    assert np.array_equal(qp.quantise(far), [lo, hi, lo, hi])
    assert qp.quantise(x).dtype == np.int64


# Calibrated ranges ---------------------------------------------------------------------------

def input_params(data, **kwargs) -> QParams:
    data = np.asarray(data, dtype=np.float64).reshape(-1, 1)
    qnet = quantise(dense_network(np.ones((1, 1))), data, **kwargs)
    return qnet.input_q


def test_non_negative_input_is_uint8():
    qp = input_params([0.0, 0.5, 2.0])
    assert qp == QParams(2.0 / 255, 0, signed=False)
    assert np.array_equal(qp.quantise([0.0, 2.0, 1.0]), [0, 255, 128])


def test_negative_values_make_the_input_int8():
    qp = input_params([-1.0, 0.5, 3.0])
    assert qp.signed and qp.scale == 4.0 / 255
    assert qp.zero_point == round(-128 + 1.0 / (4.0 / 255)) == -64
    assert qp.quantise(0.0) == qp.zero_point and qp.dequantise(qp.zero_point) == 0.0
    assert qp.quantise(3.0) == 127 and qp.quantise(-1.0) in (-128, -127)


def test_input_signed_forced_on_non_negative_data():
    qp = input_params([0.0, 0.5, 2.0], input_signed=True)
    assert qp == QParams(2.0 / 255, -128, signed=True)
    assert np.array_equal(qp.quantise([0.0, 2.0]), [-128, 127])
    assert qp.dequantise(-128) == 0.0


def test_uint8_input_rejects_negative_data():
    with pytest.raises(QuantError, match="non-negative"):
        input_params([-0.5, 1.0], input_signed=False)


def test_all_negative_range():
    qp = input_params([-3.0, -1.0, -2.0])
    assert qp == QParams(3.0 / 255, 127, signed=True)
    assert qp.quantise(0.0) == 127 and qp.dequantise(127) == 0.0
    assert qp.quantise(-3.0) == -128


@pytest.mark.parametrize("lo, hi, signed, want", [
    (2.0, 5.0, None, QParams(5.0 / 255, 0, signed=False)),
    (2.0, 5.0, True, QParams(5.0 / 255, -128, signed=True)),
    (-5.0, -2.0, None, QParams(5.0 / 255, 127, signed=True)),
], ids=["positive-uint8", "positive-int8", "negative"])
def test_range_without_zero_is_widened_to_hold_zero(lo, hi, signed, want):
    qp = input_params(np.linspace(lo, hi, 7), input_signed=signed)
    assert qp == want
    assert qp.dequantise(qp.quantise(0.0)) == 0.0


@pytest.mark.parametrize("value", [0.0, 2.5, -2.5])
@pytest.mark.parametrize("signed", [None, True], ids=["auto", "int8"])
def test_constant_input(value, signed):
    """min == max: no division by zero (warnings are errors), finite parameters."""
    data = np.full((5, 3), value)
    net = dense_network(np.array([[1.0, -0.5], [0.25, 0.0], [-1.0, 2.0]]), [0.1, -0.2])
    qnet = quantise(net, data, input_signed=signed)
    qp = qnet.input_q
    assert math.isfinite(qp.scale) and qp.scale > 0
    if value == 0.0:
        assert qp == QParams(1.0, 0, signed=bool(signed))
    else:
        assert qp.scale == abs(value) / 255
    assert qp.dequantise(qp.quantise(0.0)) == 0.0
    assert abs(qp.dequantise(qp.quantise(value)) - value) <= qp.scale / 2
    stage = qnet.stages[0]
    assert math.isfinite(stage.out_q.scale) and stage.out_q.scale > 0
    out = reference_forward(qnet, qnet.quantise_input(data))
    assert np.all(out == out[0]), "a constant input gives a constant output"
    assert np.allclose(qnet.dequantise_output(out), net.forward(data),
                       atol=2 * stage.out_q.scale)


def test_all_zero_network_output():
    """Output range [0, 0]: scale 1, zero point 0, every output exactly the zero point."""
    net = dense_network(np.zeros((4, 3)), None, nn.ReLU)
    data = np.random.default_rng(SEED).normal(size=(20, 4))
    qnet = quantise(net, data)
    stage = qnet.stages[0]
    assert stage.out_q == QParams(1.0, 0)
    assert np.array_equal(stage.weight, np.zeros((4, 3)))
    out = reference_forward(qnet, qnet.quantise_input(data))
    assert np.array_equal(out, np.zeros((20, 3)))


def test_relu_output_zero_point_is_minus_128():
    rng = np.random.default_rng(SEED)
    net = dense_network(rng.normal(size=(6, 5)), rng.normal(size=5), nn.ReLU)
    data = rng.normal(size=(50, 6))
    qnet = quantise(net, data)
    stage = qnet.stages[0]
    assert stage.func == Func.RELU and stage.zero_point == stage.out_q.zero_point == -128
    assert stage.out_q.scale == net.forward(data).max() / 255
    out = reference_forward(qnet, qnet.quantise_input(data))
    assert out.min() == -128 and out.max() == 127


# Weights ------------------------------------------------------------------------------------

def test_all_zero_weight_column():
    """An all-zero column has scale 1: nothing NaN, and with a zero bias its outputs equal the
    output zero point; with a bias they equal the bias requantised."""
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(5, 4))
    w[:, 2] = 0.0
    bias = np.array([0.3, -0.1, 0.0, 0.2])
    net = dense_network(w, bias)
    data = rng.normal(size=(40, 5))
    qnet = quantise(net, data)
    stage = qnet.stages[0]
    check_stage_params(stage, w, bias, "zero column")
    assert np.array_equal(stage.weight[:, 2], np.zeros(5)) and stage.bias[2] == 0
    real = stage.in_q.scale * 1.0 / stage.out_q.scale        # s_w = 1
    assert abs(stage.multiplier[2] - real * 2.0 ** stage.shift) <= 0.5
    lo, hi = qnet.input_q.range
    x_q = np.concatenate([qnet.quantise_input(data), np.full((1, 5), lo), np.full((1, 5), hi)])
    out = reference_forward(qnet, x_q)
    assert np.array_equal(out[:, 2], np.full(len(x_q), stage.out_q.zero_point))

    bias[2] = 0.7
    qnet = quantise(dense_network(w, bias), data)
    stage = qnet.stages[0]
    assert stage.bias[2] == round(0.7 / stage.in_q.scale)
    want = golden.requantise(0, stage.bias[2], stage.multiplier[2], stage.shift,
                             stage.zero_point)
    out = reference_forward(qnet, x_q)
    assert np.array_equal(out[:, 2], np.full(len(x_q), want))
    assert abs(stage.out_q.dequantise(want) - 0.7) <= stage.out_q.scale


def test_column_with_one_huge_weight():
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(4, 3))
    w[:, 0] = [1e-3, 1000.0, -1e-3, 2e-3]
    net = dense_network(w, rng.normal(size=3))
    data = rng.normal(size=(30, 4))
    qnet = quantise(net, data)
    stage = qnet.stages[0]
    check_stage_params(stage, w, net.layers[0].bias, "huge weight")
    assert np.array_equal(stage.weight[:, 0], [0, 127, 0, 0])
    x_q = qnet.quantise_input(data)
    acc = golden.matmul(x_q, stage.weight, x_signed=stage.in_q.signed)
    want = golden.requantise(acc, stage.bias, stage.multiplier, stage.shift, stage.zero_point)
    assert np.array_equal(reference_forward(qnet, x_q), want)


# Requantisation and the reference -----------------------------------------------------------

ACTS = (None, nn.ReLU, nn.ReLU6, nn.Identity, nn.Sigmoid, nn.Tanh)
#: Lipschitz constant, float error where the table's input saturates, and the error of the
#: table's output (rounding plus saturation at 1.0) of each function.
LUT_ERROR = {nn.Sigmoid: (0.25, 4e-4, 1 / 256), nn.Tanh: (1.0, 1e-6, 1 / 128)}


def random_dense(seed: int):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 24)), int(rng.integers(1, 12))
    w = rng.normal(size=(k, n)) * 10.0 ** rng.uniform(-2, 1, size=n)
    if n > 1 and rng.random() < 0.3:
        w[:, rng.integers(n)] = 0.0
    bias = rng.normal(size=n) * 10.0 ** rng.uniform(-2, 1)
    act = ACTS[int(rng.integers(len(ACTS)))]
    data = rng.normal(size=(int(rng.integers(1, 40)), k)) * 10.0 ** rng.uniform(-1, 1)
    if rng.random() < 0.4:
        data = np.abs(data)
    signed = [None, True][int(rng.integers(2))]
    return dense_network(w, bias, act), data, signed


@pytest.mark.parametrize("seed", range(SEED, SEED + 60))
def test_dense_requantisation_and_reference(seed):
    """Parameters from their definitions; reference_forward equals the golden arithmetic
    written out; its dequantised output is within the quantisation error of the float."""
    net, data, signed = random_dense(seed)
    label = f"seed {seed}"
    qnet = quantise(net, data, input_signed=signed)
    (stage,) = qnet.stages
    layer = net.layers[0]
    check_stage_params(stage, layer.weight, layer.bias, label)
    act = type(net.layers[-1]) if len(net.layers) > 1 else None

    # Extremes next to the calibration data.
    lo, hi = qnet.input_q.range
    x_q = qnet.quantise_input(data)
    extremes = np.array([[lo] * x_q.shape[1], [hi] * x_q.shape[1]])
    acc = golden.matmul(np.concatenate([x_q, extremes]), stage.weight,
                        x_signed=qnet.input_q.signed)
    q = golden.requantise(acc, stage.bias, stage.multiplier, stage.shift, stage.zero_point)
    want = golden.activate(q, stage.func.value, stage.zero_point, stage.clamp_hi)
    got = reference_forward(qnet, np.concatenate([x_q, extremes]))
    assert got.dtype == np.int64 and np.array_equal(got, want), label
    assert got.min() >= -128 and got.max() <= 127

    # Float versus int8: the error bound of the pre-activation value, from the rounding of
    # the input, the weights, the bias and the multiplier.
    s_in, s_w = qnet.input_q.scale, weight_scale(layer.weight)
    x_deq = qnet.input_q.dequantise(x_q)
    y_pre = x_deq @ layer.weight + layer.bias
    real = s_in * s_w / requant_scale(stage)
    rel = np.abs(stage.multiplier / 2.0 ** stage.shift - real) / real
    err = (np.abs(layer.weight).sum(axis=0) * s_in / 2       # input rounding
           + np.abs(x_deq).sum(axis=1, keepdims=True) * s_w / 2  # weight rounding
           + s_in * s_w / 2                                     # bias rounding
           + np.abs(y_pre) * rel * 1.01 + 1e-9 * (1 + np.abs(y_pre)))
    out = qnet.dequantise_output(got[:len(x_q)])
    flt = net.forward(data)
    if act in LUT_ERROR:
        lip, tail, out_err = LUT_ERROR[act]
        bound = lip * (err + golden.LUT_INPUT_SCALE / 2) + tail + out_err
    else:
        bound = err + stage.out_q.scale / 2
    assert np.all(np.abs(out - flt) <= bound * (1 + 1e-9)), (
        f"{label}: worst {np.max(np.abs(out - flt) - bound):.3g} past the bound")


def random_conv(seed: int):
    rng = np.random.default_rng(seed)
    kh, kw = [(1, 1), (3, 3), (5, 5), (1, 3), (2, 2)][int(rng.integers(5))]
    padding = "same" if kh % 2 and kw % 2 and rng.random() < 0.5 else "valid"
    h = int(rng.integers(1 if padding == "same" else kh, 8))
    w = int(rng.integers(1 if padding == "same" else kw, 8))
    cin, cout = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    layers = [nn.Conv2D(rng.normal(size=(kh, kw, cin, cout)), rng.normal(size=cout) * 0.3,
                        padding)]
    act = ACTS[int(rng.integers(len(ACTS)))]
    if act is not None:
        layers.append(act())
    oh = h - kh + 1 if padding == "valid" else h
    ow = w - kw + 1 if padding == "valid" else w
    if oh >= 2 and ow >= 2 and rng.random() < 0.5:
        layers.append(nn.MaxPool2D())
    data = rng.normal(size=(int(rng.integers(1, 6)), h, w, cin))
    if rng.random() < 0.5:
        data = np.abs(data)
    return nn.Network((h, w, cin), layers), data, [None, True][int(rng.integers(2))]


@pytest.mark.parametrize("seed", range(SEED, SEED + 30))
def test_conv_reference_written_out(seed):
    """Conv2D stages: parameters from their definitions, padding with the input zero point,
    and reference_forward equal to explicit loops over golden arithmetic."""
    net, data, signed = random_conv(seed)
    label = f"seed {seed}"
    qnet = quantise(net, data, input_signed=signed)
    (stage,) = qnet.stages
    conv = net.layers[0]
    check_stage_params(stage, conv.kernel, conv.bias, label)
    assert stage.pad == conv.pad and stage.in_shape == net.input_shape
    assert stage.out_shape == net.output_shape and stage.pool == isinstance(
        net.layers[-1], nn.MaxPool2D)
    lo, hi = qnet.input_q.range
    x_q = np.concatenate([qnet.quantise_input(data), np.full((1, *net.input_shape), lo),
                          np.full((1, *net.input_shape), hi)])
    acc = conv_written_out(x_q, stage.weight, stage.pad, stage.in_q.zero_point,
                           stage.in_q.signed)
    q = golden.requantise(acc, stage.bias, stage.multiplier, stage.shift, stage.zero_point)
    want = golden.activate(q, stage.func.value, stage.zero_point, stage.clamp_hi)
    if stage.pool:
        want = pool_written_out(want)
    got = reference_forward(qnet, x_q)
    assert got.shape == (len(x_q), *net.output_shape), label
    assert np.array_equal(got, want), label


def random_strided_chain(seed: int):
    """One or two strided convolutions (stride 2 or 3, pooling after the first sometimes),
    small enough to write out."""
    rng = np.random.default_rng(seed)
    h, w, cin = int(rng.integers(5, 11)), int(rng.integers(5, 11)), int(rng.integers(1, 4))
    shape, layers = (h, w, cin), []
    for index in range(int(rng.integers(1, 3))):
        kh, kw = [(1, 1), (2, 2), (3, 3), (3, 1)][int(rng.integers(4))]
        padding = "same" if kh % 2 and kw % 2 and rng.random() < 0.5 else "valid"
        cout = int(rng.integers(1, 5))
        if padding == "valid" and (kh > shape[0] or kw > shape[1]):
            break
        layers.append(nn.Conv2D(rng.normal(size=(kh, kw, shape[2], cout)),
                                rng.normal(size=cout) * 0.3, padding,
                                stride=int(rng.integers(2, 4)), name=f"conv{index}"))
        act = ACTS[int(rng.integers(len(ACTS)))]
        if act is not None:
            layers.append(act())
        shape = nn.Network((h, w, cin), layers).output_shape
        if index == 0 and min(shape[:2]) >= 2 and rng.random() < 0.4:
            layers.append(nn.MaxPool2D())
            shape = nn.Network((h, w, cin), layers).output_shape
    data = rng.normal(size=(int(rng.integers(1, 5)), h, w, cin))
    if rng.random() < 0.5:
        data = np.abs(data)
    return nn.Network((h, w, cin), layers), data


@pytest.mark.parametrize("seed", range(SEED, SEED + 16))
def test_strided_conv_reference_written_out(seed):
    """Strided Conv2D stages keep the layer's stride and output size, and reference_forward
    equals the written-out integer loops, stage by stage, at the input's range ends too."""
    net, data = random_strided_chain(seed)
    qnet = quantise(net, data)
    convs = [layer for layer in net.layers if isinstance(layer, nn.Conv2D)]
    label = f"seed {seed}: " + ", ".join(
        f"{c.kernel.shape[:2]} {c.padding} stride {c.stride}" for c in convs) + \
        f" on {net.input_shape}"
    shapes = net.shapes()
    assert [st.stride for st in qnet.stages] == [c.stride for c in convs], label
    for st, conv in zip(qnet.stages, convs, strict=True):
        assert st.conv_out_hw == shapes[net.layers.index(conv)][:2], label
    lo, hi = qnet.input_q.range
    x_q = np.concatenate([qnet.quantise_input(data), np.full((1, *net.input_shape), lo),
                          np.full((1, *net.input_shape), hi)])
    got, outs = reference_forward(qnet, x_q, collect=True)
    y = x_q
    for st, out in zip(qnet.stages, outs, strict=True):
        acc = conv_written_out(y, st.weight, st.pad, st.in_q.zero_point, st.in_q.signed,
                               st.stride)
        y = golden.activate(golden.requantise(acc, st.bias, st.multiplier, st.shift,
                                              st.zero_point), st.func.value, st.zero_point,
                            st.clamp_hi)
        if st.pool:
            y = pool_written_out(y)
        assert out.shape == (len(x_q), *st.out_shape), label
        assert np.array_equal(out, y), f"{label}: stage {st.name}"
    assert np.array_equal(got, y), label


def test_strided_conv_reference_small_case_by_hand():
    """Codes -12..12 on a 5x5 int8 input, a 3x3 kernel of ones, stride 2, valid, and an
    identity requantisation (multiplier ``1 << 20``, shift 20): each output is the sum of its
    window, the windows starting at rows and columns 0 and 2 (centred on codes -6, -4, 4, 6)."""
    net = nn.Network((5, 5, 1), [nn.Conv2D(np.ones((3, 3, 1, 1)), stride=2, name="c")])
    unit = QParams(1.0, 0, signed=True)
    stage = dataclasses.replace(
        quantise(net, np.ones((1, 5, 5, 1))).stages[0], weight=np.ones((3, 3, 1, 1), np.int64),
        bias=np.zeros(1, np.int64), multiplier=np.array([1 << 20]), shift=20, zero_point=0,
        clamp_hi=127, func=Func.IDENTITY, in_q=unit, out_q=unit)
    qnet = QuantisedNetwork("by hand", (5, 5, 1), unit, [stage])
    x_q = np.arange(25).reshape(1, 5, 5, 1) - 12
    assert stage.conv_out_hw == (2, 2) and stage.stride == 2
    assert np.array_equal(reference_forward(qnet, x_q)[0, :, :, 0], [[-54, -36], [36, 54]])


def test_multi_stage_reference_chains_parameters():
    """Each stage reads the previous stage's output parameters; the CNN-shaped chain equals
    the written-out arithmetic stage by stage."""
    rng = np.random.default_rng(SEED)
    net = nn.Network((6, 5, 2), [
        nn.Conv2D(rng.normal(size=(3, 3, 2, 4)), rng.normal(size=4), "same"), nn.ReLU(),
        nn.MaxPool2D(), nn.Flatten(), nn.Dense(rng.normal(size=(24, 7)), rng.normal(size=7)),
        nn.Tanh(), nn.Dense(rng.normal(size=(7, 3)), rng.normal(size=3))])
    data = rng.uniform(0, 1, size=(12, 6, 5, 2))
    qnet = quantise(net, data)
    assert [s.kind for s in qnet.stages] == ["conv", "dense", "dense"]
    assert qnet.stages[1].in_q == qnet.stages[0].out_q
    assert qnet.stages[2].in_q == qnet.stages[1].out_q == QParams(*golden.TANH_OUTPUT)
    assert qnet.stages[1].in_shape == (24,) and qnet.output_shape == (3,)
    x_q = qnet.quantise_input(data)
    got, outs = reference_forward(qnet, x_q, collect=True)
    s0, s1, s2 = qnet.stages
    acc = conv_written_out(x_q, s0.weight, s0.pad, s0.in_q.zero_point, s0.in_q.signed)
    y = pool_written_out(golden.activate(
        golden.requantise(acc, s0.bias, s0.multiplier, s0.shift, s0.zero_point), 1,
        s0.zero_point))
    assert np.array_equal(outs[0], y)
    for st, out in ((s1, outs[1]), (s2, outs[2])):
        acc = golden.matmul(y.reshape(len(y), -1), st.weight, x_signed=st.in_q.signed)
        y = golden.activate(golden.requantise(acc, st.bias, st.multiplier, st.shift,
                                              st.zero_point), st.func.value, st.zero_point,
                            st.clamp_hi)
        assert np.array_equal(out, y)
    assert np.array_equal(got, y)


# Activation functions ------------------------------------------------------------------------

def test_relu6_clamp_hi_encodes_six():
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(3, 4)) * 4
    net = dense_network(w, None, nn.ReLU6)
    data = rng.normal(size=(200, 3)) * 3
    assert net.forward(data).max() == 6.0, "the calibration must reach the clamp"
    qnet = quantise(net, data)
    stage = qnet.stages[0]
    assert stage.func == Func.CLAMP
    assert stage.out_q == QParams(6.0 / 255, -128) and stage.zero_point == -128
    assert stage.clamp_hi == round(6.0 / (6.0 / 255)) - 128 == 127
    assert abs(stage.out_q.dequantise(stage.clamp_hi) - 6.0) <= 1e-12
    lo, hi = qnet.input_q.range
    x_q = np.concatenate([qnet.quantise_input(data), [[hi, hi, hi], [lo, lo, lo]]])
    out = reference_forward(qnet, x_q)
    assert out.max() == 127 and out.min() == -128
    # The float clamp at 6.0 maps to clamp_hi: the largest float outputs are exactly 127.
    flt = net.forward(data)
    assert np.all(out[:len(data)][flt == 6.0] == 127)


def test_relu6_with_a_range_below_six_clamps_at_the_range():
    rng = np.random.default_rng(SEED)
    net = dense_network(rng.normal(size=(3, 2)) * 0.1, None, nn.ReLU6)
    data = rng.normal(size=(50, 3))
    hi = net.forward(data).max()
    assert 0 < hi < 6
    stage = quantise(net, data).stages[0]
    assert stage.out_q == QParams(hi / 255, -128)
    assert stage.clamp_hi == 127      # 6.0 lies past the int8 range: saturated


@pytest.mark.parametrize("act, func, out", [
    (nn.Sigmoid, Func.SIGMOID, golden.SIGMOID_OUTPUT), (nn.Tanh, Func.TANH, golden.TANH_OUTPUT),
], ids=["sigmoid", "tanh"])
def test_table_functions_use_the_tables_parameters(act, func, out):
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(5, 6))
    bias = rng.normal(size=6)
    net = nn.Network((5,), [nn.Dense(w, bias), act(), nn.Dense(rng.normal(size=(6, 2)))])
    data = rng.normal(size=(40, 5)) * 3
    qnet = quantise(net, data)
    stage, after = qnet.stages
    assert stage.func == func and stage.zero_point == 0
    assert stage.out_q == QParams(*out) and after.in_q == QParams(*out)
    check_stage_params(stage, w, bias, act.__name__)
    real = stage.in_q.scale * weight_scale(w) / golden.LUT_INPUT_SCALE
    assert np.all(np.abs(stage.multiplier - real * 2.0 ** stage.shift) <= 0.5)
    lo, hi = qnet.input_q.range
    x_q = np.concatenate([qnet.quantise_input(data), np.full((1, 5), lo), np.full((1, 5), hi)])
    _, outs = reference_forward(qnet, x_q, collect=True)
    acc = golden.matmul(x_q, stage.weight)
    q = golden.requantise(acc, stage.bias, stage.multiplier, stage.shift, 0)
    table = golden.SIGMOID_LUT if func == Func.SIGMOID else golden.TANH_LUT
    assert np.array_equal(outs[0], table[q + 128])


# Errors ------------------------------------------------------------------------------------

def _quantise(layers, input_shape=(4,)):
    net = nn.Network(input_shape, layers)
    data = np.random.default_rng(SEED).normal(size=(3, *input_shape))
    return quantise(net, data)


def dense(k=4, n=4, name=""):
    return nn.Dense(np.ones((k, n)), name=name)


@pytest.mark.parametrize("make, input_shape, bad", [
    (lambda: [nn.ReLU(name="r0"), dense()], (4,), "r0"),
    (lambda: [dense(), nn.ReLU(), nn.Tanh(name="t2")], (4,), "t2"),
    (lambda: [nn.MaxPool2D(name="p0"), nn.Flatten(), dense(8)], (4, 4, 2), "p0"),
    (lambda: [nn.Conv2D(np.ones((1, 1, 2, 2))), nn.MaxPool2D(), nn.MaxPool2D(name="p3")],
     (4, 4, 2), "p3"),
    (lambda: [nn.Conv2D(np.ones((1, 1, 2, 2))), nn.Flatten(), nn.ReLU(name="r2")], (2, 2, 2),
     "r2"),
], ids=["activation-first", "two-activations", "pool-first", "pool-after-pool",
        "activation-after-flatten"])
def test_layer_that_cannot_be_fused_is_named(make, input_shape, bad):
    with pytest.raises(QuantError, match=f"layer {bad}: "):
        _quantise(make(), input_shape)


def test_maxpool_after_dense_is_rejected_with_the_layer_named():
    # A Dense output is a vector, so the graph is already malformed for nn.Network.
    with pytest.raises(nn.NetworkError, match="layer p1: MaxPool2D"):
        _quantise([dense(), nn.MaxPool2D(name="p1")])


def test_trailing_flatten_and_no_stage():
    with pytest.raises(QuantError, match="must end with a Dense or Conv2D"):
        _quantise([nn.Conv2D(np.ones((1, 1, 2, 2))), nn.Flatten()], (2, 2, 2))
    with pytest.raises(QuantError, match="no Dense or Conv2D"):
        _quantise([nn.Flatten()])


def test_requantisation_scale_too_large_is_named():
    """Column 0's huge weights cancel on the calibration data, so the output range is set by
    column 1's tiny values: s_in * s_w / s_out is far past the int32 multiplier."""
    net = dense_network(np.array([[1e6, 1e-6], [-1e6, 0.0]]), name="fc9")
    data = np.repeat(np.linspace(0, 1, 9)[:, None], 2, axis=1)
    with pytest.raises(QuantError, match="layer fc9: the requantisation scale"):
        quantise(net, data)


def test_bias_past_int32_is_named():
    net = dense_network(np.array([[1e-6]]), np.array([1e6]), name="fc7")
    with pytest.raises(QuantError, match="layer fc7: a bias does not fit int32"):
        quantise(net, np.linspace(0, 1, 5)[:, None])


def test_quantise_input_checks_the_shape():
    qnet = _quantise([dense()])
    with pytest.raises(QuantError, match="takes"):
        qnet.quantise_input(np.zeros((2, 5)))


# The committed digits CNN --------------------------------------------------------------------

@functools.cache
def digits_cnn():
    from firmware.datasets import digits
    from firmware.models.train_cnn import cnn_forward, load_params

    p = load_params()
    net = nn.Network((8, 8, 1), [
        nn.Conv2D(p["conv_w"], p["conv_b"], "same", name="conv"), nn.ReLU(), nn.MaxPool2D(),
        nn.Flatten(), nn.Dense(p["dense_w"], p["dense_b"], name="fc")])
    return net, digits(), p, cnn_forward


def test_digits_cnn_int8_accuracy_within_one_point_of_float():
    net, data, params, cnn_forward = digits_cnn()
    flt = net.forward(data.x_test)
    # The layer graph is the model the weights were trained as.
    assert np.allclose(flt, cnn_forward(params, data.x_test), rtol=1e-4, atol=1e-4)
    qnet = quantise(net, data.x_train)
    assert not qnet.input_q.signed and len(qnet.stages) == 2
    assert qnet.stages[0].pool and qnet.stages[0].func == Func.RELU
    out = reference_forward(qnet, qnet.quantise_input(data.x_test))
    assert out.shape == (360, 10)
    acc_float = (flt.argmax(axis=1) == data.y_test).mean()
    acc_int8 = (out.argmax(axis=1) == data.y_test).mean()
    assert acc_float > 0.9
    assert abs(acc_int8 - acc_float) <= 0.01, f"float {acc_float:.4f}, int8 {acc_int8:.4f}"


def test_sigmoid_calibration_with_very_negative_inputs():
    """The float sigmoid must not overflow (warnings are errors) for very negative inputs."""
    net = dense_network(np.array([[1.0]]), None, nn.Sigmoid)
    qnet = quantise(net, np.array([[-1000.0], [0.0], [2.0]]))
    assert qnet.stages[0].func == Func.SIGMOID
