"""The format-neutral graph: its operators' integer semantics, the lowering onto the core and
run_graph on the ISA simulator, on graphs built here (no model file needed)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from firmware import fixedpoint as fp
from firmware import graph as g
from firmware.compiler import lowering
from firmware.quant import QParams
from firmware.runtime.graph import run_graph
from hdl.isa import Func, Rounding
from hdl.presets import get_config
from sim.models import golden


def conv_loops(x, op: g.Conv2D) -> np.ndarray:
    """TFLite's reference convolution written as its loops: taps outside the input skipped,
    ``(x - z_in) * w`` summed, bias added, requantised per channel."""
    n, h, w, _ = x.shape
    kh, kw, cg, cout = op.weight.shape
    og = cout // op.groups
    ho, wo = op.out_hw(h, w)
    acc = np.zeros((n, ho, wo, cout), dtype=np.int64)
    for oy in range(ho):
        for ox in range(wo):
            for o in range(cout):
                grp = o // og
                total = op.bias[o]
                for dy in range(kh):
                    for dx in range(kw):
                        y = oy * op.stride[0] - op.padding[0] + dy
                        xx = ox * op.stride[1] - op.padding[2] + dx
                        if 0 <= y < h and 0 <= xx < w:
                            xs = x[:, y, xx, grp * cg:(grp + 1) * cg] - op.input_zp
                            total = total + xs @ op.weight[dy, dx, :, o]
                acc[:, oy, ox, o] = total
    return op.requant.apply(acc)


def random_requant(rng, n: int, rounding=Rounding.DOUBLE, func=Func.IDENTITY, zp=-5):
    reals = rng.uniform(0.0005, 0.02, n)
    r = g.requant_from_real(reals, zp, func=func, clamp_hi=100,
                            single=rounding == Rounding.HALF_UP)
    assert r.rounding == rounding
    return r


def conv(rng, name, kh, kw, cin, cout, groups, stride, padding, zp_in=3, **kw_req):
    return g.Conv2D(name, ["x"], ["y"],
                    weight=rng.integers(-127, 128, (kh, kw, cin // groups, cout)),
                    bias=rng.integers(-5000, 5000, cout), input_zp=zp_in,
                    requant=random_requant(rng, cout, **kw_req), stride=stride,
                    padding=padding, groups=groups)


CONV_CASES = [  # kh, kw, cin, cout, groups, stride, padding
    (3, 3, 4, 6, 1, (1, 1), (1, 1, 1, 1)),
    (3, 3, 5, 5, 5, (2, 2), (0, 1, 0, 1)),        # depthwise, stride 2, SAME's odd pixel
    (10, 8, 1, 8, 1, (2, 2), (4, 5, 3, 4)),       # micro_speech's shape
    (3, 3, 4, 8, 4, (1, 2), (1, 1, 0, 2)),        # depth multiplier 2
    (1, 1, 12, 10, 1, (1, 1), (0, 0, 0, 0)),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_reference_equals_loops(case):
    seed = 360 + CONV_CASES.index(case)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    op = conv(rng, "c", *case)
    x = rng.integers(-128, 128, (2, 9, 7, case[2]))
    np.testing.assert_array_equal(op.reference(x)[0], conv_loops(x, op))


def one_op_graph(op: g.Op, in_shape, out_shape) -> g.Graph:
    q = QParams(0.1, 3)
    tensors = {"x": g.Tensor("x", in_shape, "int8", q),
               "y": g.Tensor("y", out_shape, "int8", QParams(0.2, -5))}
    return g.Graph("one", tensors, [op], ["x"], ["y"])


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("config", ["default", "wide"])
def test_conv_on_isa_simulator_equals_reference(case, config):
    """Every convolution shape lowers to dense segments over host patches (a grouped one a
    block of columns at a time) and equals the reference on the ISA simulator."""
    seed = 370 + CONV_CASES.index(case)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    op = conv(rng, "c", *case, func=Func.CLAMP)
    ho, wo = op.out_hw(9, 7)
    graph = one_op_graph(op, (1, 9, 7, case[2]), (1, ho, wo, case[3]))
    x = rng.integers(-128, 128, (3, 9, 7, case[2]))
    result = run_graph(graph, {"x": x}, device="isa", config=get_config(config))
    np.testing.assert_array_equal(result.outputs["y"], graph.reference({"x": x})["y"])
    assert result.macs == op.macs(graph) * 3


def fc_chain(rng, sizes, rounding=Rounding.HALF_UP) -> g.Graph:
    tensors = {"t0": g.Tensor("t0", (1, sizes[0]), "int8", QParams(0.1, -128))}
    ops = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:], strict=False)):
        tensors[f"t{i + 1}"] = g.Tensor(f"t{i + 1}", (1, n), "int8", QParams(0.1, -7))
        ops.append(g.FullyConnected(f"fc{i}", [f"t{i}"], [f"t{i + 1}"],
                                    weight=rng.integers(-127, 128, (k, n)),
                                    bias=rng.integers(-3000, 3000, n),
                                    input_zp=-128 if i == 0 else -7,
                                    requant=random_requant(rng, n, rounding, Func.RELU, -7)))
    return g.Graph("chain", tensors, ops, ["t0"], [f"t{len(sizes) - 1}"])


@pytest.mark.parametrize("rounding", [Rounding.HALF_UP, Rounding.DOUBLE])
def test_fully_connected_chain_is_one_segment(rounding):
    print("seed 380")
    rng = np.random.default_rng(380)
    graph = fc_chain(rng, [20, 13, 9, 3], rounding)
    steps = lowering.lower(graph, get_config("default"))
    assert len(steps) == 1 and len(steps[0].segments) == 1
    assert len(steps[0].segments[0].network.stages) == 3
    x = rng.integers(-128, 128, (7, 20))
    result = run_graph(graph, {"t0": x}, device="isa")
    np.testing.assert_array_equal(result.outputs["t3"], graph.reference({"t0": x})["t3"])


def _table(fn, in_scale: float, out_scale: float, out_zp: int, lo: int, hi: int):
    """The 256 outputs of ``fn`` for int8 inputs of ``in_scale``, quantised."""
    x = np.arange(-128, 128) * in_scale
    return np.clip(np.round(fn(x) / out_scale) + out_zp, lo, hi).astype(np.int64)


def lookup_chain(rng, same: bool = True) -> g.Graph:
    """fc0 -> GELU (an int8 table) -> fc1 -> sigmoid (a uint8 table; GELU's again with
    ``same``) -> fc2."""
    gelu = _table(lambda x: 0.5 * x * (1 + np.tanh(0.79788456 * (x + 0.044715 * x ** 3))),
                  0.05, 0.04, 0, -128, 127)
    sigmoid = _table(lambda x: 1 / (1 + np.exp(-x)), 0.05, 1 / 255, 0, 0, 255)
    gelu[[0, 255]] = [-128, 127]                        # the extremes in the table too
    second = gelu if same else sigmoid
    dtype = "int8" if same else "uint8"
    tensors = {"x": g.Tensor("x", (1, 12), "int8", QParams(0.1, 0))}
    ops = []
    for i, (k, n, after) in enumerate([(12, 10, gelu), (10, 9, second), (9, 5, None)]):
        tensors[f"a{i}"] = g.Tensor(f"a{i}", (1, n), "int8", QParams(0.05, 0))
        ops.append(g.FullyConnected(f"fc{i}", ["x" if i == 0 else f"t{i - 1}"], [f"a{i}"],
                                    weight=rng.integers(-127, 128, (k, n)),
                                    bias=rng.integers(-3000, 3000, n), input_zp=0,
                                    requant=random_requant(rng, n, zp=0)))
        if after is not None:
            kind = "int8" if after is gelu else dtype
            tensors[f"t{i}"] = g.Tensor(f"t{i}", (1, n), kind,
                                        QParams(0.04 if after is gelu else 1 / 255, 0,
                                                kind == "int8"))
            ops.append(g.Lookup(f"f{i}", [f"a{i}"], [f"t{i}"], table=after))
    return g.Graph("lookups", tensors, ops, ["x"], ["a2"])


@pytest.mark.parametrize("same", [True, False], ids=["gelu-gelu", "gelu-sigmoid"])
def test_lookups_after_fully_connected_run_on_the_table(same):
    """A Lookup that alone reads a fully connected output joins its stage as the function
    TABLE (LOAD_TABLE in the setup): the whole run is one segment on a core with the table,
    every output equal to the reference; a second, different table ends the segment (the
    core holds one); without the table the lookups run on the host."""
    seed = 390 + same
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    graph = lookup_chain(rng, same)
    config = get_config("default")
    steps = lowering.lower(graph, config)
    kinds = [type(s).__name__ for s in steps]
    if same:
        assert kinds == ["CoreStep"], kinds
        stages = steps[0].segments[0].network.stages
        assert [st.func for st in stages] == [Func.TABLE, Func.TABLE, Func.IDENTITY]
    else:
        assert kinds == ["CoreStep", "CoreStep"], kinds
        assert [op.name for op in steps[1].ops] == ["fc1", "f1", "fc2"]
    assert lowering.placement(graph, config)["f0"] == "core"
    assert lowering.placement(graph, config.replace(lookup_table=False))["f0"] == "host"
    x = rng.integers(-128, 128, (9, 12))
    x[0] = -128
    x[1] = 127
    want = graph.reference({"x": x}, collect=True)
    assert want["a0"].min() == -128 and want["a0"].max() == 127, "no saturation: weak case"
    result = run_graph(graph, {"x": x}, device="isa", config=config)
    np.testing.assert_array_equal(result.outputs["a2"], want["a2"])
    for name in result.tensors:
        np.testing.assert_array_equal(result.tensors[name], want[name], err_msg=name)


def test_lookups_on_the_rtl(rtl_device):
    print("seed 392")
    rng = np.random.default_rng(392)
    graph = lookup_chain(rng, same=False)
    x = rng.integers(-128, 128, (5, 12))
    result = run_graph(graph, {"x": x}, device=rtl_device("small"))
    want = graph.reference({"x": x}, collect=True)
    for name in result.tensors:
        np.testing.assert_array_equal(result.tensors[name], want[name], err_msg=name)


def test_requantisation_folds_the_input_zero_point():
    """Teeth: the segment's bias is b - z_in * colsum(W); without the fold the core's
    outputs differ from the reference."""
    rng = np.random.default_rng(381)
    graph = fc_chain(rng, [12, 5])
    x = rng.integers(-128, 128, (4, 12))
    want = graph.reference({"t0": x})["t1"]
    graph.ops[0].input_zp = 0            # the fold now adds nothing; the reference still does
    result = run_graph(graph, {"t0": x}, device="isa")
    assert (result.outputs["t1"] != want).any()


# Multipliers ------------------------------------------------------------------------------

def test_quantize_multiplier_matches_tflite_cases():
    assert g.quantize_multiplier(0.0) == (0, 0)
    assert g.quantize_multiplier(0.5) == (1 << 30, 0)
    assert g.quantize_multiplier(0.25) == (1 << 30, -1)
    # A mantissa that rounds up to 2**31 halves and bumps the exponent.
    assert g.quantize_multiplier(1 - 2 ** -40) == (1 << 30, 1)
    assert g.quantize_multiplier(2.0 ** -33) == (0, 0)         # flushed below 2**-31
    assert g.quantize_multiplier(2.0 ** 40, single=True) == ((1 << 31) - 1, 30)
    for real in np.random.default_rng(382).uniform(1e-6, 1.0, 200):
        m, e = g.quantize_multiplier(real)
        assert (1 << 30) <= m < (1 << 31)
        assert math.isclose(m * 2.0 ** (e - 31), real, rel_tol=2 ** -30)


def test_requant_equals_multiply_by_quantized_multiplier():
    """HALF_UP with shift 31 - e is TFLite's single rounding, DOUBLE its double rounding,
    for every accumulator (the fixed-point module's literal ports)."""
    rng = np.random.default_rng(383)
    acc = np.concatenate([rng.integers(-2 ** 20, 2 ** 20, 4000), np.arange(-600, 600)])
    for real in rng.uniform(1e-4, 0.9, 20):
        m, e = g.quantize_multiplier(real)
        for single, rounding in ((True, Rounding.HALF_UP), (False, Rounding.DOUBLE)):
            r = g.Requant([m], [31 - e], rounding, 0)
            got = golden.requantise(acc, 0, m, 31 - e, 0, r.rounding.value)
            want = np.clip(fp.mbqm(acc, m, e, single=single), -128, 127)
            np.testing.assert_array_equal(got, want)


def test_fixedpoint_primitives():
    assert fp.srdhm(-(1 << 31), -(1 << 31)) == (1 << 31) - 1
    assert fp.srdhm(1 << 30, 1 << 30) == 1 << 29
    assert list(fp.rdbpot(np.array([5, -5, 6, -6, 7, -7]), 1)) == [3, -3, 3, -3, 4, -4]
    assert fp.sat_mul_pot(1 << 30, 2) == (1 << 31) - 1
    assert fp.sat_mul_pot(-(1 << 30), 2) == -(1 << 31)
    # exp and 1/(1+x) equal gemmlowp's bit for bit: tests/firmware/test_fixedpoint.py.


# Host operators ---------------------------------------------------------------------------

def test_average_pool_rounds_half_away_and_counts_inside_only():
    op = g.AveragePool2D("p", ["x"], ["y"], kernel=(2, 2), stride=(2, 2),
                         padding=(0, 1, 0, 1))
    x = np.array([1, 2, 2, -4, -2, 7, 5, -6, 0]).reshape(1, 3, 3, 1)
    y = op.reference(x)[0][0, :, :, 0]
    # (1+2-4-2)/4 = -0.75 -> -1; (2+7)/2 = 4.5 -> 5; (5-6)/2 = -0.5 -> -1; 0/1 = 0
    assert y.tolist() == [[-1, 5], [-1, 0]]


def test_max_pool_clamps_to_the_activation():
    op = g.MaxPool2D("p", ["x"], ["y"], kernel=(2, 2), stride=(1, 1), act=(-3, 100))
    x = np.array([-9, -8, -7, 120]).reshape(1, 2, 2, 1)
    assert op.reference(x)[0].ravel().tolist() == [100]
    x = np.array([-9, -8, -7, -6]).reshape(1, 2, 2, 1)
    assert op.reference(x)[0].ravel().tolist() == [-3]


def test_add_matches_its_float_meaning():
    op = g.Add.from_scales("a", ["a", "b"], ["y"], 0.05, 3, 0.1, -2, 0.12, 1, (-128, 127))
    a = np.arange(-128, 128)
    b = np.arange(127, -129, -1)
    y = op.reference(a, b)[0]
    real = 0.05 * (a - 3) + 0.1 * (b + 2)
    assert np.abs(np.clip(np.round(real / 0.12) + 1, -128, 127) - y).max() <= 1


def test_quantize_and_dequantize():
    q = g.Quantize("q", ["x"], ["y"], scale=0.5, zero_point=-1)
    assert q.reference(np.array([0.25, -0.25, 1.0, 100.0]))[0].tolist() == [0, -2, 1, 127]
    d = g.Dequantize("d", ["y"], ["z"], scale=0.5, zero_point=-1)
    assert d.reference(np.array([-1, 3]))[0].tolist() == [0.0, 2.0]


def test_softmax_is_a_distribution():
    op = g.Softmax("s", ["x"], ["y"], beta=1.0, input_scale=0.1)
    y = op.reference(np.array([[0, 10, 20, -128], [5, 5, 5, 5]]))[0]
    assert y[1].tolist() == [-128 + 64] * 4
    assert y[0].argmax() == 2 and y[0, 3] == -128
    assert abs((y[0] + 128).sum() - 256) <= 2


# Refusals ---------------------------------------------------------------------------------

def test_refuses_bad_operators_by_name():
    rng = np.random.default_rng(384)
    r = random_requant(rng, 4)
    with pytest.raises(g.GraphError, match="fc: weights must be int8"):
        g.FullyConnected("fc", ["x"], ["y"], weight=np.full((3, 4), 200), bias=np.zeros(4),
                         requant=r)
    with pytest.raises(g.GraphError, match="fc: 3 biases for 4 output channels"):
        g.FullyConnected("fc", ["x"], ["y"], weight=np.ones((3, 4), int), bias=np.zeros(3),
                         requant=r)
    with pytest.raises(g.GraphError, match="c: 4 output channels do not split into 3 groups"):
        g.Conv2D("c", ["x"], ["y"], weight=np.ones((1, 1, 1, 4), int), bias=np.zeros(4),
                 requant=r, groups=3)
    with pytest.raises(g.GraphError, match="activation SIGMOID; allowed: IDENTITY, RELU"):
        g.Requant([1], [1], Rounding.DOUBLE, 0, Func.SIGMOID)
    with pytest.raises(g.GraphError, match="shifts 64..64; allowed: 0 to 63"):
        g.Requant([1], [64], Rounding.DOUBLE, 0)
    with pytest.raises(g.GraphError, match="needs a shift of -1"):
        g.requant_from_real([3e9], 0, single=False, where="big")


def test_refuses_bad_graphs_and_inputs():
    rng = np.random.default_rng(385)
    graph = fc_chain(rng, [6, 2])
    with pytest.raises(g.GraphError, match="input t9 is computed by no earlier operator"):
        g.Graph("bad", graph.tensors, [g.Reshape("r", ["t9"], ["t1"], shape=(1, 2))],
                ["t0"], ["t1"])
    with pytest.raises(g.GraphError, match="the graph takes exactly \\['t0'\\]"):
        graph.reference({"x": np.zeros((1, 6), int)})
    with pytest.raises(g.GraphError, match="input t0 has shape \\(1, 5\\); the graph takes "
                                           "\\(n, 6\\)"):
        graph.reference({"t0": np.zeros((1, 5), int)})
    with pytest.raises(g.GraphError, match="input t0 is float64; it takes int8 integers"):
        graph.reference({"t0": np.zeros((1, 6))})
    with pytest.raises(g.GraphError, match="outside int8"):
        graph.reference({"t0": np.full((1, 6), 300)})


def test_run_graph_reuses_the_compiled_segments():
    rng = np.random.default_rng(386)
    graph = fc_chain(rng, [10, 4])
    cache: dict = {}
    x = rng.integers(-128, 128, (3, 10))
    first = run_graph(graph, {"t0": x}, device="isa", compiled=cache)
    (entry,) = cache.values()
    second = run_graph(graph, {"t0": x[::-1]}, device="isa", compiled=cache)
    assert list(cache.values()) == [entry]
    np.testing.assert_array_equal(second.outputs["t1"], first.outputs["t1"][::-1])


# The layer API's networks as graphs ---------------------------------------------------------

def _layer_api_networks():
    """(label, QuantisedNetwork, quantised inputs): the compiler tests' random networks
    (every activation, 'same' and 'valid' convolutions, pooling, flatten, uint8 and int8
    inputs), some with per-column shifts and each rounding mode, and the demo's CNN."""
    from test_compiler import (
        calibrate,
        digits_cnn,
        per_column_requantisation,
        quantised_inputs,
        random_cnn,
        random_conv_chain,
        random_mlp,
        small_cnn,
    )

    from firmware.nn import Network, Sigmoid, Tanh

    out = []
    for seed in range(7000, 7006):
        for kind, make in (("chain", random_conv_chain), ("cnn", random_cnn),
                           ("mlp", random_mlp)):
            rng, net, data = make(seed)
            qnet = calibrate(net, data, True if seed % 2 else None)
            if seed % 3 == 0:
                qnet = per_column_requantisation(qnet, rng, list(Rounding))
            out.append((f"{kind} seed {seed}", qnet, quantised_inputs(rng, qnet, data)))
    rng = np.random.default_rng(7)
    for act in (Sigmoid, Tanh):
        net, data = small_cnn((6, 6, 2), [(3, 4)], True)
        net = Network(net.input_shape, [*net.layers, act()], name=f"cnn-{act.__name__}")
        qnet = calibrate(net, data)
        out.append((net.name, qnet, quantised_inputs(rng, qnet, data)))
    qnet, x_q, _ = digits_cnn()
    out.append(("digits CNN", qnet, x_q[:50]))
    return out


def test_layer_api_networks_as_graphs():
    """A quantised network's graph (firmware.graph.from_network) computes exactly what the
    layer API's int8 reference does, for every network of the compiler's tests: the graph is
    the one form a network takes into the compiler, so it may lose nothing."""
    from firmware.quant import reference_forward

    kinds = set()
    for label, qnet, x_q in _layer_api_networks():
        graph = g.from_network(qnet)
        kinds |= {type(op).__name__ for op in graph.ops}
        got = graph.reference({"input": x_q})["output"]
        want = reference_forward(qnet, x_q)
        assert got.shape == want.shape, label
        bad = np.argwhere(got != want)
        assert len(bad) == 0, f"{label}: {len(bad)} of {want.size} elements differ, first at " \
                              f"{bad[0].tolist()}"
        assert graph.tensors["output"].q == qnet.output_q, label
    assert kinds == {"Conv2D", "FullyConnected", "MaxPool2D", "Reshape", "Lookup"}, kinds


def _same_stage(a, b) -> bool:
    """Whether two stages have every field equal (arrays element by element)."""
    fields = [f.name for f in dataclasses.fields(a)]
    return type(a) is type(b) and all(
        np.array_equal(getattr(a, f), getattr(b, f)) if isinstance(getattr(a, f), np.ndarray)
        or isinstance(getattr(b, f), np.ndarray) else getattr(a, f) == getattr(b, f)
        for f in fields if f != "name") and a.padding == b.padding


@functools.cache
def _demo_floats():
    """The demo's float MLP and CNN (the MLP is trained, so once) and the digits split."""
    from firmware.datasets import digits
    from firmware.models import digits as models

    split = digits()
    return split, {name: models.build(name, split) for name in ("mlp", "cnn")}


def _demo_networks(config_name: str, images: int = 20):
    from firmware.quant import quantise

    split, nets = _demo_floats()
    config = get_config(config_name)
    for name, net in nets.items():
        qnet = quantise(net, split.x_train, input_signed=config.operands == "int8")
        yield name, config, qnet, qnet.quantise_input(split.x_test[:images])


def test_the_layer_api_compiles_through_the_graph():
    """compile_network takes a quantised network through its graph (from_network, then the
    lowering): the demo's networks come back as the very stages they are (so the stage
    compiler writes the same programs for them), and a given batch's programs are the stage
    compiler's beat for beat, on the 8x8 core and the int8-only iCEBreaker preset."""
    from firmware.compiler import compile_network, compile_stages

    for config_name, batch, images in (("default", 8, 20), ("icebreaker", 1, 3)):
        for name, config, qnet, x_q in _demo_networks(config_name, images):
            via_graph = compile_network(qnet, config, batch_size=batch)
            assert via_graph.network.name == qnet.name
            assert len(via_graph.network.stages) == len(qnet.stages)
            for mine, theirs in zip(via_graph.network.stages, qnet.stages, strict=True):
                assert _same_stage(mine, theirs), (name, config_name, theirs.name)
            direct = compile_stages(qnet, config, batch_size=batch)
            assert via_graph.setup_program() == direct.setup_program(), (name, config_name)
            assert via_graph.batch_program(x_q).beats == direct.batch_program(x_q).beats, \
                (name, config_name)


@pytest.mark.slow       # the compiler's choice of batch for the CNN, twice: 8 s
def test_the_demo_networks_keep_their_programs():
    """With the compiler's own choice of batch too, the demo networks' programs through the
    graph are the stage compiler's, beat for beat."""
    from firmware.compiler import compile_network, compile_stages

    for name, config, qnet, x_q in _demo_networks("default"):
        via_graph, direct = compile_network(qnet, config), compile_stages(qnet, config)
        assert via_graph.batch_size == direct.batch_size, name
        assert via_graph.batch_program(x_q).beats == direct.batch_program(x_q).beats, name


# (generator, seed, configuration, whether the chain fits as one program)
CHAINS = [("chain", 7000, "default", True), ("chain", 7002, "small", True),
          ("cnn", 7002, "default", True), ("cnn", 7003, "small", True),
          ("chain", 7037, "small", False), ("cnn", 7001, "small", False)]


@pytest.mark.parametrize("kind, seed, config_name, fits", CHAINS,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CHAINS])
def test_convolution_chains_of_a_graph(kind, seed, config_name, fits):
    """Convolutions (with their 2x2 max-pooling), a flatten and fully connected operators,
    each read only by the next, lower to one core step whose program keeps every tensor in
    the unified buffer; where the chain does not fit, its longest prefix that fits runs as
    one program (or the convolution over patches cut on the host) and the rest follows
    step by step. Every output equal to the graph's reference either way."""
    from test_compiler import calibrate, random_cnn, random_conv_chain

    print(f"seed {seed}")
    rng, net, data = {"chain": random_conv_chain, "cnn": random_cnn}[kind](seed)
    graph = g.from_network(calibrate(net, data))
    x = graph.tensors["input"].q.quantise(data)
    run = run_graph(graph, {"input": x}, device="isa", config=get_config(config_name))
    np.testing.assert_array_equal(run.outputs["output"],
                                  graph.reference({"input": x})["output"])
    segments = [seg for s in run.steps if isinstance(s, lowering.CoreStep)
                for seg in s.segments]
    if fits:
        assert len(run.steps) == 1 and not segments[0].patches
        assert segments[0].compiled is not None
    else:
        # Shorter chains, or a convolution over patches the host cuts, with the host
        # between them.
        assert len(run.steps) > 1
        assert all(seg.patches or seg.compiled is not None for s in run.steps
                   if isinstance(s, lowering.CoreStep) and isinstance(s.ops[0], g.Conv2D)
                   for seg in s.segments)


def test_a_graph_that_needs_the_host_is_no_single_program():
    """compile_network of a graph whose chain does not fit refuses with the compiler's
    reason (the lowering would run it step by step, a host operator between)."""
    from test_compiler import calibrate, random_cnn

    from firmware.compiler import CompileError, compile_network

    rng, net, data = random_cnn(7001)
    graph = g.from_network(calibrate(net, data))
    with pytest.raises(CompileError, match=r"does not fit 4x4 even one image"):
        compile_network(graph, get_config("small"))
    steps = lowering.lower(graph, get_config("small"))
    assert any(isinstance(s, lowering.HostStep) for s in steps)


def run_chain(graph: g.Graph, rng, images: int, config_name: str):
    """``graph`` (input ``x``, output ``y``) on the ISA simulator over ``images`` random
    inputs, the first all -128 and the second all 127: its output equal to the reference,
    and the whole graph one core step. Returns the run and the reference's tensors."""
    x = rng.integers(-128, 128, (images, *graph.tensors["x"].shape[1:]))
    x[0] = -128
    x[1] = 127
    run = run_graph(graph, {"x": x}, device="isa", config=get_config(config_name))
    want = graph.reference({"x": x}, collect=True)
    np.testing.assert_array_equal(run.outputs["y"], want["y"])
    assert [type(s).__name__ for s in run.steps] == ["CoreStep"]
    return run, want


def depthwise_chain(rng, c: int = 8) -> g.Graph:
    """A pointwise convolution, a depthwise one (a group per channel), a depthwise one with
    a depth multiplier of 2 and stride 2, a 2x2 max-pooling, a flatten and a fully connected
    operator: each output read only by the next; ``c`` channels."""
    tensors = {"x": g.Tensor("x", (1, 6, 6, 3), "int8", QParams(0.05, 3))}
    ops = []
    zp = 3
    shape = (6, 6, 3)
    specs = [("pw", 1, 1, 3, c, 1, (1, 1), (0, 0, 0, 0)),
             ("dw", 3, 3, c, c, c, (1, 1), (1, 1, 1, 1)),
             ("dw2", 3, 3, c, 2 * c, c, (2, 2), (1, 1, 1, 1))]
    prev = "x"
    for name, kh, kw, cin, cout, groups, stride, padding in specs:
        op = conv(rng, name, kh, kw, cin, cout, groups, stride, padding, zp_in=zp,
                  func=Func.RELU, zp=-7)
        op.inputs, op.outputs = [prev], [name]
        shape = (*op.out_hw(*shape[:2]), cout)
        tensors[name] = g.Tensor(name, (1, *shape), "int8", QParams(0.05, -7))
        ops.append(op)
        prev, zp = name, -7
    h, w, c = shape
    tensors["pool"] = g.Tensor("pool", (1, h // 2, w // 2, c), "int8", QParams(0.05, -7))
    ops.append(g.MaxPool2D("pool", [prev], ["pool"]))
    k = (h // 2) * (w // 2) * c
    tensors["flat"] = g.Tensor("flat", (1, k), "int8", QParams(0.05, -7))
    ops.append(g.Reshape("flat", ["pool"], ["flat"], shape=(1, k)))
    tensors["y"] = g.Tensor("y", (1, 10), "int8", QParams(0.1, 0))
    ops.append(g.FullyConnected("fc", ["flat"], ["y"], weight=rng.integers(-127, 128, (k, 10)),
                                bias=rng.integers(-5000, 5000, 10), input_zp=-7,
                                requant=random_requant(rng, 10, zp=0)))
    return g.Graph("depthwise", tensors, ops, ["x"], ["y"])


@pytest.mark.parametrize("config_name, channels", [
    pytest.param("default", 16, marks=pytest.mark.slow), ("small", 8)])
def test_depthwise_convolutions_chain_on_chip(config_name, channels):
    """Depthwise convolutions (one with a depth multiplier) run in the chain as dense ones
    whose tiles off the diagonal are zero, those tiles' passes left out: one program, every
    output equal to the reference, fewer array rows than the dense form would stream."""
    from firmware.compiler import compile_network
    from firmware.compiler.emitter import _Emitter

    seed = 395
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    graph = depthwise_chain(rng, channels)
    config = get_config(config_name)
    run, _ = run_chain(graph, rng, 6, config_name)
    compiled = compile_network(graph, config)
    em = _Emitter(compiled, np.zeros((compiled.batch_size, 6, 6, 3), dtype=np.int64),
                  estimate=True)
    em.emit()
    dense = [len(sp.layout.passes) * sp.layout.col_blocks for sp in compiled._plan.stages]
    run_passes = [sum(len(em._passes(sp, nb)) for nb in range(sp.layout.col_blocks))
                  for sp in compiled._plan.stages]
    assert run_passes[0] == dense[0] and run_passes[-1] == dense[-1]
    assert run_passes[1] < dense[1] and run_passes[2] < dense[2], (run_passes, dense)
    assert run.counters["array_active"] == compiled.matmul_rows(6)


def strided_same_chain(rng) -> g.Graph:
    """TFLite's SAME padding with stride 2 on even sizes pads only below and right: a first
    convolution 3x3 stride 2 on 8x8x3, a depthwise 3x3 stride 2, a 3x3 stride 1 with 'same'
    padding, a 1x3 with (0, 0, 2, 0), then a flatten and a fully connected operator."""
    tensors = {"x": g.Tensor("x", (1, 8, 8, 3), "int8", QParams(0.05, -4))}
    ops, prev, zp, shape = [], "x", -4, (8, 8, 3)
    specs = [("c0", 3, 3, 3, 8, 1, (2, 2), (0, 1, 0, 1)),
             ("dw", 3, 3, 8, 8, 8, (2, 2), (0, 1, 0, 1)),
             ("c2", 3, 3, 8, 6, 1, (1, 1), (1, 1, 1, 1)),
             ("c3", 1, 3, 6, 5, 1, (1, 1), (0, 0, 2, 0))]
    for name, kh, kw, cin, cout, groups, stride, padding in specs:
        op = conv(rng, name, kh, kw, cin, cout, groups, stride, padding, zp_in=zp,
                  func=Func.CLAMP, zp=9)
        op.inputs, op.outputs = [prev], [name]
        shape = (*op.out_hw(*shape[:2]), cout)
        tensors[name] = g.Tensor(name, (1, *shape), "int8", QParams(0.05, 9))
        ops.append(op)
        prev, zp = name, 9
    k = int(np.prod(shape))
    tensors["flat"] = g.Tensor("flat", (1, k), "int8", QParams(0.05, 9))
    ops.append(g.Reshape("flat", [prev], ["flat"], shape=(1, k)))
    tensors["y"] = g.Tensor("y", (1, 7), "int8", QParams(0.1, 0))
    ops.append(g.FullyConnected("fc", ["flat"], ["y"], weight=rng.integers(-127, 128, (k, 7)),
                                bias=rng.integers(-5000, 5000, 7), input_zp=9,
                                requant=random_requant(rng, 7, zp=0)))
    return g.Graph("strided-same", tensors, ops, ["x"], ["y"])


@pytest.mark.parametrize("config_name", ["default", "small"])
def test_padding_on_one_side_chains_on_chip(config_name):
    """Padding that differs between opposite sides (TFLite's SAME with a stride) in the
    chain: the first convolution's host rows padded so, the later ones reading frames that
    are so; one program, every output equal to the reference."""
    seed = 397
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    run, _ = run_chain(strided_same_chain(rng), rng, 5, config_name)
    stages = run.steps[0].segments[0].network.stages
    assert [st.padding for st in stages[:4]] == [(0, 1, 0, 1), (0, 1, 0, 1), (1, 1, 1, 1),
                                                 (0, 0, 2, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9, 16, 25, 36, 49, 64, 100, 144, 196])
def test_average_as_requantisation_rounds_as_tflite(n):
    """The multiplier and shift an average pooling of n positions runs with on chip give
    TFLite's (t + n/2) / n, half away from zero, for every int8 sum t of n values, in the
    activation unit's single-rounding modes (exhaustive; DOUBLE, gemmlowp's two roundings,
    is not used for it)."""
    from firmware.compiler.chain import _average_as_conv

    kh = next(d for d in range(int(math.isqrt(n)), 0, -1) if n % d == 0)
    pool = g.AveragePool2D("avg", ["x"], ["y"], kernel=(kh, n // kh), stride=(1, 1))
    op = _average_as_conv(pool, 1)
    t = np.arange(-128 * n, 127 * n + 1)
    half = n // 2
    want = np.clip(np.where(t > 0, (t + half) // n, -((-t + half) // n)), -128, 127)
    assert op.requant.rounding == Rounding.HALF_UP
    for rounding in (Rounding.HALF_UP, Rounding.HALF_EVEN):
        got = golden.requantise(t, 0, op.requant.multiplier[0], op.requant.shift[0], 0,
                                rounding.value)
        bad = np.flatnonzero(got != want)
        assert len(bad) == 0, f"n={n} {rounding.name}: sum {t[bad[0]]} gives {got[bad[0]]}"


def average_chain(rng) -> g.Graph:
    """A 'same' convolution, a 2x2 average pooling, a pointwise convolution, a global
    average pooling (the whole 3x3 map), a flatten and a fully connected operator."""
    tensors = {"x": g.Tensor("x", (1, 6, 6, 2), "int8", QParams(0.05, 1))}
    c0 = conv(rng, "c0", 3, 3, 2, 6, 1, (1, 1), (1, 1, 1, 1), zp_in=1, zp=-3)
    c0.inputs, c0.outputs = ["x"], ["c0"]
    tensors["c0"] = g.Tensor("c0", (1, 6, 6, 6), "int8", QParams(0.05, -3))
    tensors["p0"] = g.Tensor("p0", (1, 3, 3, 6), "int8", QParams(0.05, -3))
    p0 = g.AveragePool2D("p0", ["c0"], ["p0"], kernel=(2, 2), stride=(2, 2))
    c1 = conv(rng, "c1", 1, 1, 6, 9, 1, (1, 1), (0, 0, 0, 0), zp_in=-3, zp=4)
    c1.inputs, c1.outputs = ["p0"], ["c1"]
    tensors["c1"] = g.Tensor("c1", (1, 3, 3, 9), "int8", QParams(0.05, 4))
    tensors["p1"] = g.Tensor("p1", (1, 1, 1, 9), "int8", QParams(0.05, 4))
    p1 = g.AveragePool2D("p1", ["c1"], ["p1"], kernel=(3, 3), stride=(3, 3))
    tensors["flat"] = g.Tensor("flat", (1, 9), "int8", QParams(0.05, 4))
    flat = g.Reshape("flat", ["p1"], ["flat"], shape=(1, 9))
    tensors["y"] = g.Tensor("y", (1, 5), "int8", QParams(0.1, 0))
    fc = g.FullyConnected("fc", ["flat"], ["y"], weight=rng.integers(-127, 128, (9, 5)),
                          bias=rng.integers(-500, 500, 5), input_zp=4,
                          requant=random_requant(rng, 5, zp=0))
    return g.Graph("averages", tensors, [c0, p0, c1, p1, flat, fc], ["x"], ["y"])


@pytest.mark.parametrize("config_name", ["default", "small"])
def test_average_pooling_chains_on_chip(config_name):
    """Average pooling (a 2x2 window and a global one) in the chain, as a depthwise
    convolution of ones requantised by 1/n: one program, every tensor equal to the
    reference, the averages' ties among them."""
    seed = 399
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    run, want = run_chain(average_chain(rng), rng, 7, config_name)
    assert [type(op).__name__ for op in run.steps[0].ops] == [
        "Conv2D", "AveragePool2D", "Conv2D", "AveragePool2D", "Reshape", "FullyConnected"]
    c0 = want["c0"].reshape(7, 3, 2, 3, 2, 6).sum(axis=(2, 4))
    assert (c0 % 4 == 2).any(), "no tie in the 2x2 averages: a weak case"


@pytest.mark.slow      # the ISA tests above hold the compiler; these hold the RTL to them
@pytest.mark.parametrize("make", ["strided_same_chain", "depthwise_chain", "average_chain"])
def test_chains_on_the_rtl(rtl_device, make):
    """The chains of the tests above as one program each on the RTL small core: one-sided
    frames, the passes of zero tiles left out, averages as requantised sums; every tensor
    equal to the reference and the counters to the ISA simulator's."""
    seed = {"strided_same_chain": 397, "depthwise_chain": 395, "average_chain": 399}[make]
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    graph = globals()[make](rng)
    shape = graph.tensors["x"].shape[1:]
    x = rng.integers(-128, 128, (3, *shape))
    x[0] = -128
    dev = rtl_device("small")
    result = run_graph(graph, {"x": x}, device=dev)
    assert [type(s).__name__ for s in result.steps] == ["CoreStep"]
    want = graph.reference({"x": x}, collect=True)
    np.testing.assert_array_equal(result.outputs["y"], want["y"])
    isa = run_graph(graph, {"x": x}, device="isa", config=dev.config)
    for key in ("instructions", "array_active", "useful_macs"):
        assert result.counters[key] == isa.counters[key], key


def test_a_reshape_after_a_chain_is_a_layout():
    """A reshape that alone reads a chain's output (person_detect's SpatialSqueeze) joins
    the chain: no host step between the chain and the graph's output."""
    rng = np.random.default_rng(401)
    print("seed 401")
    c0 = conv(rng, "c0", 3, 3, 2, 4, 1, (2, 2), (0, 1, 0, 1), zp_in=0, zp=2)
    c0.inputs, c0.outputs = ["x"], ["c0"]
    tensors = {"x": g.Tensor("x", (1, 6, 6, 2), "int8", QParams(0.05, 0)),
               "c0": g.Tensor("c0", (1, 3, 3, 4), "int8", QParams(0.05, 2)),
               "y": g.Tensor("y", (1, 36), "int8", QParams(0.05, 2))}
    graph = g.Graph("squeeze", tensors, [c0, g.Reshape("y", ["c0"], ["y"], shape=(1, 36))],
                    ["x"], ["y"])
    x = rng.integers(-128, 128, (4, 6, 6, 2))
    run = run_graph(graph, {"x": x}, device="isa")
    assert [type(op).__name__ for s in run.steps for op in s.ops] == ["Conv2D", "Reshape"]
    assert len(run.steps) == 1
    np.testing.assert_array_equal(run.outputs["y"], graph.reference({"x": x})["y"])
