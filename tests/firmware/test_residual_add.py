"""The residual ADD on chip: a chain that holds an Add of the previous stage's output and an
earlier stage's (its skip) runs it as MATMUL_LOOKUPs of the two inputs' sum tables and an
ACTIVATE, every tensor between the model's input and its last on-chip layer kept in the
unified buffer. Each output equal (``==``) to the graph's integer reference (TFLite's ADD:
each input scaled by its own multiplier from ``left_shift``, the sum by the output's,
:class:`firmware.graph.Add`), on the ISA simulator and on the RTL.

Graphs: the MobileNet-style test model (a strided convolution, a depthwise one, the residual
Add and a classifier, :func:`bench.models.mobilenet_style`), and small ones that end at the
Add: the skip first or second of its inputs, framed (a padded convolution reads it) or not,
TFLite's single and double rounding, the activation's clamp as IDENTITY, RELU and CLAMP, a
convolution after the Add, and extreme inputs (every int8 value, the outputs saturating).
"""

from __future__ import annotations

import numpy as np
import pytest
from tiers import tiered

from bench.models import mobilenet_style
from firmware.asm import instructions
from firmware.compiler import CompileError, compile_network
from firmware.compiler.lowering import placement
from firmware.graph import Add, Conv2D, Graph, requant_from_real
from firmware.graph import Tensor as GTensor
from firmware.quant import QParams
from firmware.runtime.graph import run_graph
from hdl import isa
from hdl.presets import get_config

SEED = 4242


def _residual(seed: int, *, skip_first: bool = True, framed: bool = True,
              single: bool = True, act: str = "none", after: bool = False,
              images: int = 5) -> tuple[Graph, dict]:
    """input (6, 6, 3) -> conv a (3x3, SAME, 4 channels) -> conv b (3x3 SAME when ``framed``
    else 1x1, 4 channels) -> Add(a, b) (``skip_first``: a is the Add's first input) with
    the activation ``act`` -> optionally a 3x3 convolution. Random int8 weights; scales
    from the values; the input holds every int8 value."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (images, 6, 6, 3))
    n = min(256, x.size)
    x.reshape(-1)[:n] = np.arange(-128, 128)[:n]
    tensors = {"input": GTensor("input", (1, 6, 6, 3), "int8", QParams(1 / 32, -3))}
    ops = []
    values = {"input": x}

    def conv(name, src, k, cout, scale, zp):
        q_in = tensors[src].q
        pad = (k // 2,) * 4
        w = rng.integers(-127, 128, (k, k, tensors[src].shape[-1], cout))
        b = rng.integers(-3000, 3000, cout)
        op = Conv2D(name, [src], [name], weight=w, bias=b, input_zp=q_in.zero_point,
                    requant=requant_from_real(np.full(cout, q_in.scale / 64 / scale), zp,
                                              single=single, where=name),
                    padding=pad)
        tensors[name] = GTensor(name, (1, 6, 6, cout), "int8", QParams(scale, zp))
        values[name] = op.reference(values[src])[0]
        ops.append(op)
        return name

    a = conv("a", "input", 3, 4, 0.05, -7)
    b = conv("b", a, 3 if framed else 1, 4, 0.09, 11)
    qa, qb = tensors[a].q, tensors[b].q
    so, zo = 0.11, -20
    lo, hi = {"none": (-128, 127), "relu": (zo, 127), "clamp": (zo, 60)}[act]
    inputs = [a, b] if skip_first else [b, a]
    q0, q1 = tensors[inputs[0]].q, tensors[inputs[1]].q
    add = Add.from_scales("add", inputs, ["add"], q0.scale, q0.zero_point, q1.scale,
                          q1.zero_point, so, zo, act=(lo, hi), single=single)
    ops.append(add)
    tensors["add"] = GTensor("add", (1, 6, 6, 4), "int8", QParams(so, zo))
    out = "add"
    if after:
        values["add"] = add.reference(values[inputs[0]], values[inputs[1]])[0]
        out = conv("c", "add", 3, 4, 0.07, 2)
    del qa, qb
    return Graph("residual", tensors, ops, ["input"], [out]), {"input": x}


def _check(graph: Graph, inputs: dict, device="isa", config=None) -> None:
    config = config or get_config("default")
    assert all(where == "core" for where in placement(graph, config).values()), \
        placement(graph, config)
    compile_network(graph, config)          # one program: no host step between
    got = run_graph(graph, inputs, device=device, config=config)
    ref = graph.reference(inputs)
    for name in graph.outputs:
        a, b = np.asarray(got.outputs[name]), np.asarray(ref[name])
        assert a.shape == b.shape and (a == b).all(), \
            f"seed {SEED}: {name}: {(a != b).sum()} of {a.size} elements differ"


CASES = [dict(), dict(skip_first=False), dict(framed=False), dict(single=False),
         dict(act="relu"), dict(act="clamp", single=False), dict(after=True),
         dict(after=True, skip_first=False, framed=False)]


@pytest.mark.parametrize("case", tiered(CASES, fast=[CASES[k] for k in (0, 3, 5, 6)]),
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_residual_adds_on_the_isa_simulator(case):
    """Each residual graph in one program on the 8x8 core, equal to the reference on every
    element; the outputs saturate at both ends."""
    print(f"seed {SEED}, {case}")
    graph, inputs = _residual(SEED, **case)
    ref = graph.reference(inputs)[graph.outputs[0]]
    assert (ref == 127).any() or (ref == -128).any() or case.get("act")
    _check(graph, inputs)


def test_mobilenet_style_is_one_program():
    """The MobileNet-style model's every operator on the core in one chain, its logits equal
    to the reference for 9 images (several batches, a partial last)."""
    graph, inputs = mobilenet_style(seed=0, images=9)
    _check(graph, inputs)


def test_refusals():
    """A core without the sum tables keeps the Add on the host (the chain ends before it);
    two adds of other scales in one chain are refused by name where compiled alone."""
    graph, inputs = _residual(SEED)
    config = get_config("default").replace(sum_tables=False)
    assert placement(graph, config)["add"] == "host"
    got = run_graph(graph, inputs, device="isa", config=config)
    assert (np.asarray(got.outputs["add"]) == graph.reference(inputs)["add"]).all()
    with pytest.raises(CompileError, match="does not run as one program"):
        compile_network(graph, config)


def test_two_adds_of_other_scales():
    """Two residual adds of other scales in one chain: each batch loads each add's sum
    tables before its lookups (the setup program none), the whole model one program, equal
    to the reference."""
    graph, inputs = _residual(SEED, after=True)
    q_add, q_c = graph.tensors["add"].q, graph.tensors["c"].q
    add2 = Add.from_scales("add2", ["add", "c"], ["add2"], q_add.scale, q_add.zero_point,
                           q_c.scale, q_c.zero_point, 0.2, 5, act=(-128, 127))
    graph.ops.append(add2)
    graph.tensors["add2"] = GTensor("add2", (1, 6, 6, 4), "int8", QParams(0.2, 5))
    graph.outputs[:] = ["add2"]
    config = get_config("default")
    compiled = compile_network(graph, config)
    assert compiled.reload_sums and compiled.sum_tables is None
    batch = next(iter(compiled.batches(inputs["input"])))
    loads = sum(1 for op, f in instructions(batch.beats, config)
                if op == isa.Opcode.LOAD_TABLE)
    images = min(len(inputs["input"]), compiled.program_images)
    assert loads == 2 * 2 * -(-images // compiled.batch_size), loads     # 2 adds x 2 tables
    _check(graph, inputs)


def test_on_the_rtl(rtl_device):
    """A residual graph (the skip framed by the convolution that reads it too) on the small
    core's RTL, two images, equal to the reference."""
    graph, inputs = _residual(SEED, images=2)
    device = rtl_device("small")
    _check(graph, inputs, device=device, config=device.config)


@pytest.mark.slow           # 20 s of Icarus on the 8x8 core (make regression)
def test_mobilenet_style_on_the_rtl(rtl_device):
    """The MobileNet-style model on the 8x8 core's RTL, two images, equal to the
    reference."""
    graph, inputs = mobilenet_style(seed=0, images=2)
    device = rtl_device("default")
    _check(graph, inputs, device=device, config=device.config)
