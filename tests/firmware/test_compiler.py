"""The compiler, end to end on the ISA simulator: quantised networks compiled for the presets,
run with firmware.runtime.run and compared element for element with quant.reference_forward.

Whether a network fits a configuration, and the batch size the compiler picks, are predicted
here from the on-chip layout the compiler documents (input rows ``K chunks x M``, output rows
``column blocks x positions x batch``, each stage's input and output side by side in the unified
buffer), so a CompileError is expected exactly where the prediction says so.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from math import ceil

import numpy as np
import pytest
from tiers import tiered

from firmware import nn
from firmware.asm import disassemble, instructions
from firmware.compiler import RINGS, CompileError, compile_network
from firmware.compiler.plan import _plan
from firmware.quant import QuantError, QuantisedNetwork, quantise, reference_forward
from firmware.runtime import run
from firmware.transports.isa import IsaSimDevice
from hdl.config import TPUConfig
from hdl.isa import Func, Rounding
from hdl.presets import get_config

SEED = 7_000
CONFIGS = ("tiny", "small", "wide", "default")
ACTS = (None, nn.ReLU, nn.ReLU6, nn.Identity, nn.Sigmoid, nn.Tanh)


# Predictions -----------------------------------------------------------------------------

def fits(qnet: QuantisedNetwork, config: TPUConfig, batch: int = 1) -> bool:
    """Whether the compiler takes ``batch`` images a batch."""
    try:
        compile_network(qnet, config, batch_size=batch)
        return True
    except CompileError:
        return False


def largest_batch(qnet: QuantisedNetwork, config: TPUConfig, max_batch: int = 256) -> int:
    lo, hi = 1, max_batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(qnet, config, mid) else (lo, mid - 1)
    return lo


def dense_rows(qnet: QuantisedNetwork, config: TPUConfig, images: int) -> int | None:
    """MATMUL rows of a network of Dense stages, from the documented tiling alone: every
    pass (``rows`` input features, or a channel group of ``min(rows, cols)``) streams one
    row per image, for every column block, unless its block of weights is all zero (at
    least one pass a column block); None for a network with a convolution."""
    if any(st.kind != "dense" for st in qnet.stages):
        return None
    g = min(config.rows, config.cols)
    rows, width_in = 0, config.rows
    for i, st in enumerate(qnet.stages):
        width = config.cols if i == len(qnet.stages) - 1 else g
        w = st.weight_matrix
        for nb in range(ceil(st.n / width)):
            cols = w[:, nb * width:(nb + 1) * width]
            passes = sum(bool(cols[kc * width_in:(kc + 1) * width_in].any())
                         for kc in range(ceil(st.k / width_in)))
            rows += max(passes, 1) * images
        width_in = width
    return rows


# Running ----------------------------------------------------------------------------------

def mnemonics(beats: list[int], config: TPUConfig) -> list[str]:
    """The instructions of a program, decoded (data beats left out)."""
    return [line.split()[0] for line in disassemble(beats, config).splitlines()
            if not line.startswith(".")]


def quantised_inputs(rng, qnet: QuantisedNetwork, data: np.ndarray) -> np.ndarray:
    """The calibration data quantised, then the extremes: all-lowest, all-highest and
    uniformly random codes."""
    lo, hi = qnet.input_q.range
    shape = qnet.input_shape
    extra = np.stack([np.full(shape, lo), np.full(shape, hi),
                      rng.integers(lo, hi, size=shape, endpoint=True)])
    return np.concatenate([qnet.quantise_input(data), extra])


def check_on_core(qnet: QuantisedNetwork, config: TPUConfig, x_q: np.ndarray, label: str,
                  **compile_options):
    """Compile, run on the ISA simulator, compare with the int8 reference; the core's
    array_active counter must equal the rows the compiler says its MATMULs stream, and for
    Dense networks the rows the documented tiling gives. Returns the compiled network."""
    compiled = compile_network(qnet, config, **compile_options)
    result = run(IsaSimDevice(config), compiled, x_q)
    want = reference_forward(qnet, x_q)
    assert result.outputs.shape == want.shape, label
    bad = np.argwhere(result.outputs != want)
    assert np.array_equal(result.outputs, want), (
        f"{label}: {len(bad)} of {want.size} outputs differ, first at {bad[:4].tolist()}")
    assert result.images == len(x_q), label
    active = result.counters["array_active"]
    assert active == compiled.matmul_rows(len(x_q)), f"{label}: the compiler's row count"
    expected = dense_rows(qnet, config, len(x_q))
    assert expected is None or active == expected, f"{label}: redundant or missing MATMULs"
    return compiled


def check_case(qnet: QuantisedNetwork, config_name: str, data: np.ndarray, rng, label: str,
               mode: int = 0):
    """Run ``qnet`` on the configuration when it fits one image; otherwise expect the
    CompileError that says so. ``mode`` 0: the compiler's batch size; 1: a forced batch
    size; 2: a small ``max_batch``."""
    config = get_config(config_name)
    label = f"{label} on {config_name}"
    if not fits(qnet, config):
        with pytest.raises(CompileError, match=r"even one image.*ub_depth="):
            compile_network(qnet, config)
        return
    x_q = quantised_inputs(rng, qnet, data)
    if mode == 1:
        best = largest_batch(qnet, config, max_batch=8)
        batch = int(rng.integers(1, best, endpoint=True))
        compiled = check_on_core(qnet, config, x_q, label, batch_size=batch)
        assert compiled.batch_size == batch, label
    elif mode == 2:
        max_batch = int(rng.integers(1, 5))
        compiled = check_on_core(qnet, config, x_q, label, max_batch=max_batch)
        assert compiled.batch_size <= max_batch, label
    else:
        compiled = check_on_core(qnet, config, x_q, label)
        assert 1 <= compiled.batch_size <= 256, label
    return compiled


def calibrate(net: nn.Network, data: np.ndarray, signed: bool | None = None):
    """quantise() on a random network."""
    return quantise(net, data, input_signed=signed)


def random_weights(rng, shape: tuple[int, ...]) -> np.ndarray:
    """Normal weights with a per-column scale; sometimes a zero column or a huge weight."""
    w = rng.normal(size=shape) * 10.0 ** rng.uniform(-1, 0.5, size=shape[-1])
    n = shape[-1]
    if n > 1 and rng.random() < 0.2:
        w[..., rng.integers(n)] = 0.0
    if rng.random() < 0.2:
        w.reshape(-1, n)[rng.integers(w.size // n), rng.integers(n)] *= 100
    return w


def random_data(rng, shape: tuple[int, ...], count: int) -> np.ndarray:
    data = rng.normal(size=(count, *shape)) * 10.0 ** rng.uniform(-1, 1)
    return np.abs(data) if rng.random() < 0.5 else data


def with_act(rng, layers: list) -> list:
    act = ACTS[int(rng.integers(len(ACTS)))]
    return layers + ([act()] if act is not None else [])


# Single Dense layers -------------------------------------------------------------------------

def random_dense(seed: int):
    rng = np.random.default_rng(seed)
    k = 1 if rng.random() < 0.15 else int(rng.integers(1, 72))
    n = 1 if rng.random() < 0.15 else int(rng.integers(1, 21))
    layers = with_act(rng, [nn.Dense(random_weights(rng, (k, n)), rng.normal(size=n))])
    net = nn.Network((k,), layers)
    data = random_data(rng, (k,), int(rng.integers(1, 6)))
    signed = None if rng.random() < 0.7 else True
    return rng, net, data, signed


@functools.cache
def dense_case(seed: int):
    rng, net, data, signed = random_dense(seed)
    return net, data, calibrate(net, data, signed)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 60), fast=range(SEED, SEED + 3)))
def test_random_dense(seed, config_name):
    net, data, qnet = dense_case(seed)
    rng = np.random.default_rng([seed, CONFIGS.index(config_name)])
    check_case(qnet, config_name, data, rng, f"seed {seed} dense {net.layers[0].weight.shape}",
                  mode=seed % 3)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("m, k, n", [
    (1, 1, 1), (5, 1, 9), (7, 70, 1), (3, 70, 5), (13, 9, 9), (2, 17, 33), (1, 8, 8), (9, 64, 16),
])
def test_awkward_dense_shapes(m, k, n, config_name):
    rng = np.random.default_rng([SEED, m, k, n])
    net = nn.Network((k,), [nn.Dense(rng.normal(size=(k, n)), rng.normal(size=n)), nn.ReLU()])
    data = rng.normal(size=(m, k))
    check_case(quantise(net, data), config_name, data, rng, f"dense m={m} k={k} n={n}")


# Single Conv2D layers --------------------------------------------------------------------------

KERNELS = [(1, 1), (3, 3), (5, 5), (3, 3), (1, 3), (3, 1), (2, 2), (1, 1)]


def random_conv(seed: int):
    rng = np.random.default_rng(seed)
    kh, kw = KERNELS[int(rng.integers(len(KERNELS)))]
    padding = "same" if kh % 2 and kw % 2 and rng.random() < 0.5 else "valid"
    small = rng.random() < 0.4                   # small enough for the tiny configuration
    top = 4 if small else 10
    h = int(rng.integers(1, top)) + (0 if padding == "same" else kh - 1)
    w = int(rng.integers(1, top)) + (0 if padding == "same" else kw - 1)
    cin = int(rng.integers(1, 3 if small else 7))
    cout = int(rng.integers(1, 13))
    conv = nn.Conv2D(random_weights(rng, (kh, kw, cin, cout)), rng.normal(size=cout), padding)
    layers = with_act(rng, [conv])
    ho, wo = (h, w) if padding == "same" else (h - kh + 1, w - kw + 1)
    if ho >= 2 and wo >= 2 and rng.random() < 0.5:
        layers.append(nn.MaxPool2D())
    net = nn.Network((h, w, cin), layers)
    data = random_data(rng, (h, w, cin), int(rng.integers(1, 6)))
    signed = None if rng.random() < 0.6 else True
    return rng, net, data, signed


@functools.cache
def conv_case(seed: int):
    rng, net, data, signed = random_conv(seed)
    return net, data, calibrate(net, data, signed)


def conv_label(seed: int, net: nn.Network) -> str:
    conv = net.layers[0]
    extra = "".join(f"+{type(layer).__name__}" for layer in net.layers[1:])
    return (f"seed {seed} conv {conv.kernel.shape} {conv.padding} on {net.input_shape}"
            f"{extra}")


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 60), fast=range(SEED, SEED + 5)))
def test_random_conv(seed, config_name):
    net, data, qnet = conv_case(seed)
    rng = np.random.default_rng([seed, CONFIGS.index(config_name)])
    check_case(qnet, config_name, data, rng, conv_label(seed, net), mode=seed % 3)


def test_random_conv_cases_cover_the_brief():
    """The seeds above do hold the shapes asked for (kernels, paddings, channels, pooling
    with an odd size, every activation, uint8 and int8 inputs, and cases tiny can hold)."""
    cases = [conv_case(seed) for seed in range(SEED, SEED + 60)]
    kernels = {net.layers[0].kernel.shape[:2] for net, _, _ in cases}
    assert {(1, 1), (3, 3), (5, 5)} <= kernels
    assert {net.layers[0].padding for net, _, _ in cases} == {"valid", "same"}
    assert {net.input_shape[2] for net, _, _ in cases} >= {1, 2, 3, 4, 5, 6}
    assert max(net.layers[0].kernel.shape[3] for net, _, _ in cases) >= 11
    assert any(q.stages[0].pool and q.stages[0].conv_out_hw[0] % 2 for _, _, q in cases)
    assert any(q.stages[0].pool and q.stages[0].conv_out_hw[1] % 2 for _, _, q in cases)
    assert any(net.input_shape[0] != net.input_shape[1] for net, _, _ in cases)
    # (TABLE, the programmable table, is no layer of firmware.nn.)
    assert {q.stages[0].func for _, _, q in cases} == set(Func) - {Func.TABLE, Func.NORMALISE}
    assert {q.input_q.signed for _, _, q in cases} == {True, False}
    assert any(q.input_q.signed and q.input_q.zero_point == -128 for _, _, q in cases)
    tiny = get_config("tiny")
    assert sum(fits(q, tiny) for _, _, q in cases) >= 10


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("shape, kernel, padding, pool", [
    ((5, 7, 1), (3, 3), "same", True),        # odd height and width: a row and column dropped
    ((7, 4, 3), (5, 5), "same", True),
    ((6, 9, 2), (5, 5), "valid", False),
    ((3, 11, 6), (1, 1), "valid", True),
    ((1, 1, 4), (1, 1), "valid", False),      # one pixel: a Dense in disguise
    ((2, 2, 1), (3, 3), "same", True),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_awkward_conv_shapes(shape, kernel, padding, pool, config_name):
    rng = np.random.default_rng([SEED, *shape, *kernel])
    cout = 7
    layers = [nn.Conv2D(rng.normal(size=(*kernel, shape[2], cout)), rng.normal(size=cout),
                        padding), nn.ReLU6()]
    if pool:
        layers.append(nn.MaxPool2D())
    net = nn.Network(shape, layers)
    data = rng.normal(size=(4, *shape)) * 3
    check_case(quantise(net, data), config_name, data, rng,
                  f"conv {kernel} {padding} on {shape}")


# Batches -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config_name", CONFIGS)
def test_batches_that_do_not_divide(config_name):
    """Images not a multiple of the batch size: full batches, then a short one, with the
    compiler's own batch size and with a forced one."""
    config = get_config(config_name)
    rng = np.random.default_rng([SEED, 1])
    net = nn.Network((4, 3, 1), [nn.Conv2D(rng.normal(size=(3, 3, 1, 3)), rng.normal(size=3),
                                           "valid"), nn.Tanh()])
    data = rng.uniform(-1, 1, size=(4, 4, 3, 1))
    qnet = quantise(net, data)
    best = largest_batch(qnet, config)
    assert best > 1, "the test needs more than one image per batch"
    lo, hi = qnet.input_q.range
    x_q = rng.integers(lo, hi, size=(2 * best + 1, *net.input_shape), endpoint=True)
    compiled = check_on_core(qnet, config, x_q, f"{config_name} default batch")
    forced = 3 if best > 3 else 2
    x_q = x_q[:2 * forced + 1]
    compiled = check_on_core(qnet, config, x_q, f"{config_name} batch_size={forced}",
                             batch_size=forced, program_images=forced)
    assert len(x_q) % compiled.batch_size == 1
    sizes = [b.images for b in compiled.batches(x_q)]
    assert sizes == [forced, forced, 1]
    # One program of several batches, the last one short.
    compiled = check_on_core(qnet, config, x_q, f"{config_name} one program",
                             batch_size=forced)
    assert [b.images for b in compiled.batches(x_q)] == [len(x_q)]


def test_batch_of_one_and_many_images_on_default():
    rng = np.random.default_rng([SEED, 2])
    net = nn.Network((12,), [nn.Dense(rng.normal(size=(12, 5))), nn.Sigmoid()])
    data = rng.normal(size=(16, 12))
    qnet = quantise(net, data)
    config = get_config("default")
    lo, hi = qnet.input_q.range
    x_q = rng.integers(lo, hi, size=(300, 12), endpoint=True)
    compiled = check_on_core(qnet, config, x_q, "300 images")
    assert compiled.batch_size <= 256
    check_on_core(qnet, config, x_q[:1], "one image")
    check_on_core(qnet, config, x_q[:5], "batch_size=1", batch_size=1)


# Multi-layer networks ------------------------------------------------------------------------

def random_cnn(seed: int):
    """Conv2D -> ReLU -> MaxPool2D -> Flatten -> Dense -> ReLU -> Dense."""
    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 3]))
    h, w = int(rng.integers(2, 7)), int(rng.integers(2, 7))
    cin, c1 = int(rng.integers(1, 4)), int(rng.integers(1, 7))
    n1, n2 = int(rng.integers(1, 13)), int(rng.integers(1, 11))
    features = (h // 2) * (w // 2) * c1
    net = nn.Network((h, w, cin), [
        nn.Conv2D(random_weights(rng, (k, k, cin, c1)), rng.normal(size=c1), "same",
                  name="conv"), nn.ReLU(), nn.MaxPool2D(), nn.Flatten(),
        nn.Dense(random_weights(rng, (features, n1)), rng.normal(size=n1), name="fc1"),
        nn.ReLU(), nn.Dense(random_weights(rng, (n1, n2)), rng.normal(size=n2), name="fc2")])
    return rng, net, random_data(rng, (h, w, cin), 6)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 8), fast=range(SEED, SEED + 2)))
def test_random_cnn(seed, config_name):
    rng, net, data = random_cnn(seed)
    qnet = calibrate(net, data)
    assert [st.kind for st in qnet.stages] == ["conv", "dense", "dense"]
    check_case(qnet, config_name, data, rng, f"seed {seed} cnn {net.input_shape}",
                  mode=seed % 3)


def random_mlp(seed: int):
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 25)) for _ in range(4)]
    layers = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers.append(nn.Dense(random_weights(rng, (k, n)), rng.normal(size=n), name=f"fc{i}"))
        layers = with_act(rng, layers)
    return rng, nn.Network((sizes[0],), layers), random_data(rng, (sizes[0],), 6)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 10), fast=range(SEED, SEED + 3)))
def test_random_mlp(seed, config_name):
    rng, net, data = random_mlp(seed)
    qnet = calibrate(net, data)
    assert len(qnet.stages) == 3
    check_case(qnet, config_name, data, rng, f"seed {seed} mlp {net.shapes()}",
                  mode=seed % 3)


CHAIN_KERNELS = [(1, 1), (3, 3), (5, 5), (3, 3), (1, 3), (3, 1), (3, 5), (2, 2), (5, 5)]


def random_conv_chain(seed: int):
    """Two or three Conv2D layers (the later ones read the previous stage's output on chip,
    framed for 'same' padding), sometimes pooling after the first, sometimes a Dense head."""
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(2, 8)), int(rng.integers(2, 8))
    channels = int(rng.integers(1, 4))
    shape = input_shape = (h, w, channels)
    layers = []
    for index in range(2 if rng.random() < 0.7 else 3):
        h, w, cin = shape
        options = [(kh, kw, pad) for kh, kw in CHAIN_KERNELS for pad in ("valid", "same")
                   if (pad == "same" and kh % 2 and kw % 2)
                   or (pad == "valid" and kh <= h and kw <= w)]
        kh, kw, padding = options[int(rng.integers(len(options)))]
        cout = int(rng.integers(1, 9))
        layers.append(nn.Conv2D(random_weights(rng, (kh, kw, cin, cout)),
                                rng.normal(size=cout), padding, name=f"conv{index}"))
        layers = with_act(rng, layers)
        if padding == "valid":
            h, w = h - kh + 1, w - kw + 1
        if index == 0 and h >= 2 and w >= 2 and rng.random() < 0.4:
            layers.append(nn.MaxPool2D())
            h, w = h // 2, w // 2
        shape = (h, w, cout)
    if rng.random() < 0.4:
        n = int(rng.integers(1, 10))
        layers += [nn.Flatten(), nn.Dense(random_weights(rng, (h * w * shape[2], n)),
                                          rng.normal(size=n), name="fc")]
        layers = with_act(rng, layers)
    net = nn.Network(input_shape, layers)
    return rng, net, random_data(rng, input_shape, 5)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 24), fast=range(SEED, SEED + 3)))
def test_random_conv_chain(seed, config_name):
    rng, net, data = random_conv_chain(seed)
    qnet = calibrate(net, data, None if seed % 4 else True)
    label = f"seed {seed} " + " ".join(
        f"{layer.name}{layer.kernel.shape[:2]}{layer.padding}" if isinstance(layer, nn.Conv2D)
        else type(layer).__name__ for layer in net.layers) + f" on {net.input_shape}"
    check_case(qnet, config_name, data, rng, label, mode=seed % 3)


def test_random_conv_chains_cover_padding_and_heads():
    nets = [random_conv_chain(seed)[1] for seed in range(SEED, SEED + 24)]
    later = [layer for net in nets for layer in net.layers[1:] if isinstance(layer, nn.Conv2D)]
    assert {layer.padding for layer in later} == {"valid", "same"}
    assert {layer.kernel.shape[0] for layer in later if layer.padding == "same"} >= {3, 5}
    assert any(isinstance(layer, nn.MaxPool2D) for net in nets for layer in net.layers)
    assert any(isinstance(net.layers[-1], nn.Dense) or isinstance(net.layers[-2], nn.Dense)
               for net in nets)
    assert any(sum(isinstance(layer, nn.Conv2D) for layer in net.layers) == 3 for net in nets)


# Tensors that share buffer rows ----------------------------------------------------------------

def small_cnn(shape, convs, pool: bool, dense: int = 10, seed: int = 7):
    """Convolutions with 'same' padding and ReLU (2x2 max-pooling after the first if
    ``pool``), then a Dense: what a user tries first on a small core."""
    rng = np.random.default_rng(seed)
    layers, channels = [], shape[2]
    for i, (k, out) in enumerate(convs):
        layers += [nn.Conv2D(rng.normal(size=(k, k, channels, out)) / k,
                             rng.normal(size=out) * 0.1, padding="same", name=f"conv{i}"),
                   nn.ReLU()]
        if pool and i == 0:
            layers.append(nn.MaxPool2D())
        channels = out
    probe = nn.Network(shape, layers + [nn.Flatten()])
    layers += [nn.Flatten(), nn.Dense(rng.normal(size=(probe.output_shape[0], dense)) / 4,
                                      rng.normal(size=dense) * 0.1, name="fc")]
    return nn.Network(shape, layers, name=f"cnn{shape}"), rng.normal(size=(4, *shape))


# (configuration, batch size, input HWC, [(kernel, channels)], pool, the plan's mode). Each
# ran at d504740, whose layout let a stage's output take its input's rows; the resident
# layout (every tensor in rows of its own) does not fit them (at that batch size).
SHARED_ROWS = [
    ("small", None, (8, 8, 1), [(3, 4), (3, 8), (3, 8)], True, "sequential"),
    ("wide", None, (8, 8, 1), [(3, 4), (3, 8), (3, 8)], True, "sequential"),
    ("icebreaker", None, (8, 8, 1), [(3, 4), (3, 8), (3, 8)], True, "sequential"),
    pytest.param("5x3", None, (8, 8, 1), [(3, 16), (3, 16)], False, "sequential",
                 marks=pytest.mark.slow),
    pytest.param("5x3", None, (10, 10, 2), [(3, 4), (3, 8), (3, 8)], False, "reuse",
                 marks=pytest.mark.slow),
    ("7x2", 2, (10, 10, 2), [(3, 4), (3, 8), (3, 8)], True, "sequential"),
]


@pytest.mark.parametrize("config_name, batch, shape, convs, pool, mode", SHARED_ROWS,
                         ids=[f"{c[0]}-{c[2][0]}x{c[2][1]}x{c[2][2]}-{len(c[3])}conv"
                              f"{'-pool' if c[4] else ''}"
                              for c in (getattr(p, "values", p) for p in SHARED_ROWS)])
def test_tensors_share_rows_where_they_must(config_name, batch, shape, convs, pool, mode):
    """Every output equal to the reference over several batches (a frame written again
    before each batch, the next batch's input after the last one's write-back), where only
    a layout whose tensors share rows fits."""
    net, calibration = small_cnn(shape, convs, pool)
    config = get_config(config_name)
    qnet = calibrate(net, calibration, True if config.operands == "int8" else None)
    rng = np.random.default_rng([SEED, len(convs), shape[0]])
    x_q = quantised_inputs(rng, qnet, rng.normal(size=(5, *shape)))
    compiled = check_on_core(qnet, config, x_q, f"{net.name} on {config_name}",
                             batch_size=batch)
    assert compiled._plan.mode == mode
    for ring in RINGS:
        with pytest.raises(CompileError, match="resident layout"):
            _plan(config, qnet, compiled.unit, compiled.units, ring=ring, modes=("resident",),
                  windows=compiled.windows)
    assert any(sp.refresh for sp in compiled._plan.stages)


@functools.cache
def digits_cnn():
    from firmware.datasets import digits
    from firmware.models.train_cnn import load_params

    p = load_params()
    net = nn.Network((8, 8, 1), [
        nn.Conv2D(p["conv_w"], p["conv_b"], "same", name="conv"), nn.ReLU(), nn.MaxPool2D(),
        nn.Flatten(), nn.Dense(p["dense_w"], p["dense_b"], name="fc")])
    data = digits()
    qnet = quantise(net, data.x_train)
    return qnet, qnet.quantise_input(data.x_test), data.y_test


def test_digits_cnn_on_default():
    qnet, x_q, labels = digits_cnn()
    compiled = check_on_core(qnet, get_config("default"), x_q, "digits CNN")
    assert compiled.resident_weights and compiled.resident_params


@pytest.mark.parametrize("config_name", ["small", "wide"])
def test_digits_cnn_streams_on_small_arrays(config_name):
    qnet, x_q, _ = digits_cnn()
    config = get_config(config_name)
    compiled = check_on_core(qnet, config, x_q[:12], f"digits CNN on {config_name}")
    assert not compiled.resident_weights
    assert compiled.resident_params == (config_name == "wide")


def test_weights_partly_resident():
    """Where the tiles do not all fit (the digits CNN on the 4x4 core's 16 tiles), the setup
    program loads those the batches switch to most into all but the streaming slots, and a
    batch streams only the others: fewer LOAD_WEIGHTS than tiles it switches to, none of
    them into a resident tile's slot; the outputs stay exact (check_on_core)."""
    from firmware.compiler.network import STREAM_SLOTS
    from hdl.isa import Opcode

    qnet, x_q, _ = digits_cnn()
    config = get_config("small")
    compiled = check_on_core(qnet, config, x_q[:8], "digits CNN on small, partly resident")
    resident = compiled.tile_slots
    assert not compiled.resident_weights
    assert len(resident) == config.weight_mem_tiles - STREAM_SLOTS
    setup, _ = compiled.setup_program()
    loads = [f["tile"] for op, f in instructions(setup, config) if op == Opcode.LOAD_WEIGHTS]
    assert sorted(loads) == sorted(resident.values())
    batch = next(iter(compiled.batches(x_q[:8])))
    ops = instructions(batch.beats, config)
    streamed = [f["tile"] for op, f in ops if op == Opcode.LOAD_WEIGHTS]
    reads = sum(f["count"] for op, f in ops if op == Opcode.READ_WEIGHTS)
    assert 0 < len(streamed) < reads
    assert not set(streamed) & set(resident.values())


def test_digits_cnn_does_not_fit_tiny():
    qnet, _, _ = digits_cnn()
    assert not fits(qnet, get_config("tiny"))
    with pytest.raises(CompileError, match=r"stage conv: .*ub_depth=64"):
        compile_network(qnet, get_config("tiny"))


# Odd configurations ----------------------------------------------------------------------------

ODD_CONFIGS = {
    "3x5": TPUConfig(rows=3, cols=5, ub_depth=512, acc_depth=64, weight_mem_tiles=32),
    "5x3": TPUConfig(rows=5, cols=3, ub_depth=512, acc_depth=64, weight_mem_tiles=32),
    # At the minimum: one weight tile, one parameter slot, a one-tile FIFO and 16
    # accumulator rows (jobs of 8 rows, two windows of pooling).
    "minimal": TPUConfig(rows=4, cols=4, weight_fifo_depth=1, ub_depth=1024, acc_depth=16,
                         weight_mem_tiles=1, param_slots=1),
}


@pytest.mark.parametrize("config_name", ODD_CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 4), fast=[SEED]))
def test_odd_configurations(seed, config_name):
    """Non-square arrays with rows > cols and rows < cols, and a configuration at every
    minimum, on the CNN shape, an MLP and a chain of convolutions."""
    config = ODD_CONFIGS[config_name]
    for kind, (rng, net, data) in (("cnn", random_cnn(seed)), ("mlp", random_mlp(seed)),
                                   ("conv chain", random_conv_chain(seed))):
        qnet = calibrate(net, data)
        label = f"seed {seed} {kind} on {config_name}"
        assert fits(qnet, config), label
        compiled = check_on_core(qnet, config, quantised_inputs(rng, qnet, data), label,
                                 batch_size=largest_batch(qnet, config, max_batch=3))
        if config_name == "minimal":
            assert not compiled.resident_weights and not compiled.resident_params


# Rounding modes and per-column shifts -------------------------------------------------------

def per_column_requantisation(qnet: QuantisedNetwork, rng, roundings) -> QuantisedNetwork:
    """``qnet`` with every stage requantising per column, as TFLite and onnxruntime models
    do: each column's ``multiplier / 2**shift`` re-expressed with its own shift (a Q31
    multiplier in [2**30, 2**31) for most columns, a power of two for some, which makes
    exact ties common), and the stages' rounding modes taken in turn from ``roundings``."""
    stages = []
    for i, st in enumerate(qnet.stages):
        real = st.multiplier / 2.0 ** np.asarray(st.shift)
        mult = np.zeros(st.n, dtype=np.int64)
        shift = np.zeros(st.n, dtype=np.int64)
        for j, r in enumerate(real):
            if r <= 0:
                continue
            e = int(np.floor(np.log2(r)))
            if rng.random() < 0.3:                       # a power of two: m = 2**30
                mult[j], shift[j] = 1 << 30, 30 - e
            else:
                mult[j], shift[j] = round(r * 2.0 ** (30 - e)), 30 - e
                if mult[j] == 1 << 31:
                    mult[j], shift[j] = 1 << 30, shift[j] - 1
        assert shift.min() >= 0 and shift.max() <= 63, (st.name, shift)
        stages.append(dataclasses.replace(st, multiplier=mult, shift=shift,
                                          rounding=roundings[i % len(roundings)]))
    return QuantisedNetwork(qnet.name, qnet.input_shape, qnet.input_q, stages)


ROUNDING_ORDERS = [(Rounding.DOUBLE, Rounding.HALF_EVEN), (Rounding.HALF_EVEN, Rounding.DOUBLE),
                   (Rounding.DOUBLE,), (Rounding.HALF_EVEN, Rounding.HALF_UP)]


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("seed", tiered(range(SEED, SEED + 4), fast=range(SEED, SEED + 2)))
def test_per_column_shifts_and_rounding_modes(seed, config_name):
    """CNNs whose stages requantise with a shift per output column and DOUBLE or HALF_EVEN
    rounding, compiled and run on the ISA simulator, equal quant.reference_forward (the
    per-column shifts are sliced per column block like the bias)."""
    rng, net, data = random_cnn(seed)
    qnet = per_column_requantisation(calibrate(net, data), rng,
                                     ROUNDING_ORDERS[(seed - SEED) % len(ROUNDING_ORDERS)])
    label = f"seed {seed} cnn {net.input_shape}, per-column shifts, " + ", ".join(
        st.rounding.name for st in qnet.stages)
    check_case(qnet, config_name, data, rng, label, mode=seed % 3)


def test_per_column_rounding_reaches_the_core_when_parameters_stream():
    """Parameter sets streamed per ACTIVATE (more sets than slots) carry their per-column
    shifts and rounding modes too; with ties planted (power-of-two multipliers), rounding
    every stage HALF_UP instead changes the outputs."""
    config = get_config("default")
    rng = np.random.default_rng([SEED, 36])
    net = nn.Network((10,), [nn.Dense(rng.normal(size=(10, 20)), rng.normal(size=20)),
                             nn.ReLU6(), nn.Dense(rng.normal(size=(20, 35)))])
    data = rng.normal(size=(9, 10))
    qnet = per_column_requantisation(quantise(net, data), rng,
                                     (Rounding.DOUBLE, Rounding.HALF_EVEN))
    for st in qnet.stages:
        st.multiplier = np.where(st.multiplier > 0, 1 << 30, 0)   # ties wherever possible
    x_q = np.concatenate([quantised_inputs(rng, qnet, data),
                          rng.integers(-128, 128, (40, 10))])
    compiled = check_on_core(qnet, config, x_q, "streamed per-column params", batch_size=4)
    assert compiled.resident_weights and not compiled.resident_params
    setup, _ = compiled.setup_program()
    batch = next(iter(compiled.batches(x_q)))
    text = disassemble(batch.beats, config)
    assert "rounding=double" in text and "rounding=half_even" in text
    loads = mnemonics(batch.beats, config).count("load_params")
    assert text.count(".shift ") == loads >= 8        # every set loaded, some again
    half_up = QuantisedNetwork(qnet.name, qnet.input_shape, qnet.input_q, [
        dataclasses.replace(st, rounding=Rounding.HALF_UP) for st in qnet.stages])
    assert not np.array_equal(reference_forward(half_up, x_q), reference_forward(qnet, x_q))


# Streaming weights and parameters ------------------------------------------------------------

def test_weights_streamed_when_tiles_exceed_weight_memory():
    config = get_config("tiny")
    rng = np.random.default_rng([SEED, 3])
    net = nn.Network((20,), [nn.Dense(rng.normal(size=(20, 4)), rng.normal(size=4)), nn.ReLU()])
    data = rng.normal(size=(9, 20))
    qnet = quantise(net, data)
    x_q = quantised_inputs(rng, qnet, data)
    compiled = check_on_core(qnet, config, x_q, "streamed weights", batch_size=2)
    assert len(compiled.tiles) == 10 * 2 > config.weight_mem_tiles
    assert not compiled.resident_weights and compiled.resident_params
    setup, _ = compiled.setup_program()
    assert "load_weights" not in mnemonics(setup, config)
    for batch in compiled.batches(x_q):
        ops = mnemonics(batch.beats, config)
        assert ops.count("load_weights") == ops.count("read_weights") == ops.count("matmul")
        assert "load_params" not in ops


def test_params_streamed_when_parameter_sets_exceed_slots():
    config = get_config("default")
    rng = np.random.default_rng([SEED, 4])
    net = nn.Network((10,), [nn.Dense(rng.normal(size=(10, 20)), rng.normal(size=20)),
                             nn.ReLU6(), nn.Dense(rng.normal(size=(20, 35)))])
    data = rng.normal(size=(9, 10))
    qnet = quantise(net, data)
    x_q = quantised_inputs(rng, qnet, data)
    compiled = check_on_core(qnet, config, x_q, "streamed params", batch_size=4)
    assert compiled.resident_weights and not compiled.resident_params
    setup, _ = compiled.setup_program()
    assert set(mnemonics(setup, config)) == {"load_weights", "halt"}
    for batch in compiled.batches(x_q):
        ops = mnemonics(batch.beats, config)
        # Slots are kept while the sets they hold come round again (3 + 5 sets, 4 slots).
        assert 3 + 5 <= ops.count("load_params") <= ops.count("activate")
        assert "load_weights" not in ops


def test_weights_and_params_both_streamed():
    config = get_config("tiny")
    rng = np.random.default_rng([SEED, 5])
    net = nn.Network((7,), [nn.Dense(rng.normal(size=(7, 9)), rng.normal(size=9)), nn.Tanh(),
                            nn.Dense(rng.normal(size=(9, 3)), rng.normal(size=3))])
    data = rng.normal(size=(11, 7))
    qnet = quantise(net, data)
    compiled = check_on_core(qnet, config, quantised_inputs(rng, qnet, data), "both streamed")
    assert not compiled.resident_weights and not compiled.resident_params
    setup, _ = compiled.setup_program()
    assert mnemonics(setup, config) == ["halt"]


def test_resident_setup_loads_everything_once():
    config = get_config("small")
    rng = np.random.default_rng([SEED, 6])
    net = nn.Network((6,), [nn.Dense(rng.normal(size=(6, 6))), nn.ReLU(),
                            nn.Dense(rng.normal(size=(6, 3)))])
    data = rng.normal(size=(5, 6))
    qnet = quantise(net, data)
    x_q = quantised_inputs(rng, qnet, data)
    compiled = check_on_core(qnet, config, x_q, "resident")
    assert compiled.resident_weights and compiled.resident_params
    setup, out = compiled.setup_program()
    ops = mnemonics(setup, config)
    assert out == 1 and ops[-1] == "halt"
    assert ops.count("load_weights") == 1 and ops.count("load_params") == 3
    for batch in compiled.batches(x_q):
        ops = mnemonics(batch.beats, config)
        assert "load_weights" not in ops and "load_params" not in ops


# Program structure -------------------------------------------------------------------------

@pytest.mark.parametrize("config_name", CONFIGS)
def test_batch_program_relies_on_the_interlocks(config_name):
    """No NOP padding and no SYNC: ordering is left to the hardware interlocks. One HALT at
    the end, every MATMUL switches to its own tile (one READ_WEIGHTS each)."""
    config = get_config(config_name)
    rng = np.random.default_rng([SEED, 12])
    cases = [calibrate(*random_mlp(SEED + 1)[1:])]
    cases += [qnet for _, _, qnet in map(conv_case, range(SEED, SEED + 60))
              if fits(qnet, config) and qnet.stages[0].pool][:2]
    for index, qnet in enumerate(cases):
        label = f"case {index} on {config_name}"
        compiled = compile_network(qnet, config)
        lo, hi = qnet.input_q.range
        x_q = rng.integers(lo, hi, size=(5, *qnet.input_shape), endpoint=True)
        for batch in compiled.batches(x_q):
            lines = [line for line in disassemble(batch.beats, config).splitlines()
                     if not line.startswith(".")]
            ops = [line.split()[0] for line in lines]
            assert len(ops) == batch.instructions, label
            assert "nop" not in ops and "sync" not in ops, label
            assert ops.count("halt") == 1 and ops[-1] == "halt", label
            assert set(ops) <= {"read_host", "load_weights", "read_weights", "matmul",
                                "load_params", "activate", "write_host", "halt"}, label
            matmuls = [line for line in lines if line.startswith("matmul")]
            switches = sum(bool(re.search(r"\bswitch\b", line)) for line in matmuls)
            queued = sum(int(re.search(r"count=(\d+)", line).group(1)) for line in lines
                         if line.startswith("read_weights"))
            assert switches == queued, label       # each tile queued once, used once
            assert ops.count("activate") >= len(qnet.stages), label


# Errors ------------------------------------------------------------------------------------

def test_network_that_cannot_hold_one_image():
    rng = np.random.default_rng([SEED, 7])
    net = nn.Network((200,), [nn.Dense(rng.normal(size=(200, 3)), name="wide_fc")])
    qnet = quantise(net, rng.normal(size=(4, 200)))
    assert not fits(qnet, get_config("tiny"))
    with pytest.raises(CompileError, match=r"stage wide_fc: .*ub_depth=64"):
        compile_network(qnet, get_config("tiny"))
    compile_network(qnet, get_config("small"))


@pytest.mark.parametrize("config_name", ["small", "default"])
def test_maxpool_and_stride_after_a_conv_on_chip(config_name):
    """Max-pooling after a convolution that reads another stage's output, and a stride-2
    convolution on chip: each output position's rows are a MATMUL of their own."""
    rng = np.random.default_rng([SEED, 8])
    net = nn.Network((7, 6, 1), [
        nn.Conv2D(rng.normal(size=(3, 3, 1, 2)), name="c1"), nn.ReLU(),
        nn.Conv2D(rng.normal(size=(3, 3, 2, 3)), padding="same", name="c2"), nn.ReLU(),
        nn.MaxPool2D(), nn.Conv2D(rng.normal(size=(1, 1, 3, 2)), stride=2, name="c3")])
    data = rng.normal(size=(5, 7, 6, 1))
    qnet = quantise(net, data)
    assert [st.pool for st in qnet.stages] == [False, True, False]
    assert qnet.stages[2].stride == 2
    check_on_core(qnet, get_config(config_name), quantised_inputs(rng, qnet, data),
                  f"pool and stride on chip on {config_name}")


@pytest.mark.parametrize("layers, shape, error, name", [
    (lambda: [nn.Tanh(name="t0"), nn.Dense(np.ones((3, 2)))], (3,), QuantError, "t0"),
    (lambda: [nn.Dense(np.ones((3, 2))), nn.MaxPool2D(name="mp")], (3,), nn.NetworkError, "mp"),
    (lambda: [nn.Conv2D(np.ones((1, 1, 1, 2))), nn.ReLU(), nn.ReLU(name="r2")], (2, 2, 1),
     QuantError, "r2"),
], ids=["activation-first", "maxpool-after-dense", "activation-after-activation"])
def test_graph_errors_name_the_layer(layers, shape, error, name):
    with pytest.raises(error, match=f"layer {name}: "):
        net = nn.Network(shape, layers())
        quantise(net, np.ones((2, *shape)))


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, "4"])
def test_bad_batch_size(batch_size):
    rng = np.random.default_rng([SEED, 9])
    net = nn.Network((4,), [nn.Dense(rng.normal(size=(4, 4)))])
    qnet = quantise(net, rng.normal(size=(3, 4)))
    with pytest.raises(CompileError, match="batch_size"):
        compile_network(qnet, get_config("small"), batch_size=batch_size)


def test_batch_size_too_large_names_the_memory():
    rng = np.random.default_rng([SEED, 10])
    net = nn.Network((4,), [nn.Dense(rng.normal(size=(4, 4)), name="fc")])
    qnet = quantise(net, rng.normal(size=(3, 4)))
    config = get_config("tiny")
    best = largest_batch(qnet, config, max_batch=10_000)
    assert compile_network(qnet, config, batch_size=best).batch_size == best
    with pytest.raises(CompileError, match=r"stage fc: .*ub_depth=64"):
        compile_network(qnet, config, batch_size=best + 1)


def test_inputs_checked_before_running():
    rng = np.random.default_rng([SEED, 11])
    net = nn.Network((4,), [nn.Dense(rng.normal(size=(4, 4)))])
    qnet = quantise(net, rng.normal(size=(3, 4)))
    compiled = compile_network(qnet, get_config("small"))
    assert qnet.input_q.signed
    with pytest.raises(ValueError, match="per item"):
        next(compiled.batches(np.zeros((2, 5), dtype=np.int64)))
    with pytest.raises(ValueError, match="-128..127"):
        next(compiled.batches(np.full((2, 4), 128)))


# A core for int8 operands only -------------------------------------------------------------

def test_int8_only_core():
    """``operands="int8"``: a uint8 network input is refused with the fix named; quantised
    with int8 input, the network runs (the ISA simulator, which stops on any uint8 operand
    with SIGNEDNESS) and equals the int8 reference, -128 and 127 inputs included."""
    rng = np.random.default_rng(SEED + 900)
    print(f"seed {SEED + 900}")
    config = get_config("tiny").replace(operands="int8")
    net = nn.Network((6,), [nn.Dense(random_weights(rng, (6, 5)), rng.normal(size=5)),
                            nn.ReLU(), nn.Dense(random_weights(rng, (5, 3)), rng.normal(size=3))])
    data = np.abs(rng.normal(size=(9, 6)))              # non-negative: uint8 by default
    with pytest.raises(CompileError, match=r"its input is uint8, but the 2x2 core takes int8 "
                                           r"operands only .*input_signed=True"):
        compile_network(quantise(net, data), config)
    qnet = quantise(net, data, input_signed=True)
    x_q = qnet.quantise_input(data)
    x_q[0, :] = -128
    x_q[1, :] = 127
    check_on_core(qnet, config, x_q, "int8-only tiny")
