"""Random convolution stacks, quantised, compiled and run on the core, bit-exact against the
int8 reference (firmware.quant.reference_forward), every output element compared with ==.

A seed makes one float network: an (H, W, C) input, one to three Conv2D layers (1x1, 2x2,
3x3 or 5x5 kernels, stride 1 or 2, valid or same padding) each followed by ReLU, ReLU6 or
Identity and sometimes by a MaxPool2D, and sometimes a Flatten and a Dense head. Weights are
scaled by their fan-in so that the activations neither all saturate nor vanish. The network is
quantised on random calibration data and run on that data and on extreme inputs (every input
at the lowest code, at the highest, alternating, random codes). One seed in four makes a
*saturating* stack (positive weights, calibrated on inputs of mixed sign), whose extreme inputs
drive the requantiser past int8.

Seeds take the configurations in turn: the default 8x8 core, the small 4x4 one and an odd
3x5 one. A network whose tensors do not fit the configuration's unified buffer must raise
CompileError naming the stage and ``ub_depth``; it then runs on the same array with a deeper
unified buffer, so every seed is checked on the core.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pytest
from tiers import SOAK

from firmware import nn
from firmware.compiler import CompiledNetwork, CompileError, compile_network
from firmware.device import open_device
from firmware.quant import QuantisedNetwork, Stage, quantise, reference_forward
from firmware.runtime import run
from hdl.config import TPUConfig
from hdl.presets import get_config
from sim.models import golden

SEED = 38_000
#: Seeds make test picks from (the first ones), of which it runs FAST and those that bring
#: what the brief asks for (see fast_seeds); make regression runs the others and SLOW more.
CANDIDATES = 40
FAST = 10
SLOW = 240
#: Most array rows (array_rows) a stack of the default run may stream.
FAST_ROWS = 12_000
ACTS = (nn.ReLU, nn.ReLU6, nn.Identity)
KERNELS = (1, 2, 3, 5)

CONFIGS: dict[str, TPUConfig] = {
    "default": get_config("default"),
    "small": get_config("small"),
    # Non-square, neither dimension a power of two, one parameter slot short of a network's
    # stages (so parameters stream) and few accumulators.
    "3x5": TPUConfig(rows=3, cols=5, ub_depth=2048, acc_depth=64, weight_mem_tiles=32,
                     param_slots=2),
}


def config_of(seed: int) -> str:
    return list(CONFIGS)[seed % len(CONFIGS)]


# The generator -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stack:
    """A random network, its float calibration batch, the input signedness asked of the
    quantiser (None: by the data) and whether it is a saturating stack."""
    seed: int
    net: nn.Network
    calibration: np.ndarray
    input_signed: bool | None
    saturating: bool

    @property
    def summary(self) -> str:
        parts = []
        for layer in self.net.layers:
            if isinstance(layer, nn.Conv2D):
                kh, kw, _, cout = layer.kernel.shape
                parts.append(f"conv{kh}x{kw}/{layer.stride} {layer.padding} ->{cout}")
            elif isinstance(layer, nn.Dense):
                parts.append(f"dense ->{layer.weight.shape[1]}")
            else:
                parts.append(type(layer).__name__)
        kind = " saturating" if self.saturating else ""
        return f"seed {self.seed}{kind}: {self.net.input_shape} " + ", ".join(parts)


def random_stack(seed: int) -> Stack:
    """The network of ``seed`` (see the module notes)."""
    rng = np.random.default_rng(seed)
    saturating = seed % 4 == 3
    input_shape = (int(rng.integers(4, 13)), int(rng.integers(4, 13)), int(rng.integers(1, 21)))
    layers: list = []
    shape = input_shape
    for index in range(int(rng.integers(1, 4))):
        h, w, cin = shape
        options = [(k, padding) for k in KERNELS for padding in ("valid", "same")
                   if (padding == "same" and k % 2) or (padding == "valid" and k <= min(h, w))]
        k, padding = options[int(rng.integers(len(options)))]
        stride = int(rng.integers(1, 3))
        cout = int(rng.integers(1, 21))
        fan_in = k * k * cin
        kernel = rng.normal(size=(k, k, cin, cout)) * rng.uniform(1.0, 2.0) / np.sqrt(fan_in)
        if saturating:
            kernel = np.abs(kernel)
        layers.append(nn.Conv2D(kernel, rng.normal(size=cout) * 0.2, padding, stride=stride,
                                name=f"conv{index}"))
        layers.append(ACTS[int(rng.integers(len(ACTS)))]())
        shape = nn.Network(input_shape, layers).output_shape
        if min(shape[:2]) >= 2 and rng.random() < 0.3:
            layers.append(nn.MaxPool2D())
            shape = nn.Network(input_shape, layers).output_shape
    if rng.random() < 0.4:
        features, n = int(np.prod(shape)), int(rng.integers(1, 21))
        weight = rng.normal(size=(features, n)) / np.sqrt(features)
        if saturating:
            weight = np.abs(weight)
        layers += [nn.Flatten(), nn.Dense(weight, rng.normal(size=n) * 0.2, name="fc")]
        if rng.random() < 0.5:
            layers.append(ACTS[int(rng.integers(len(ACTS)))]())
    net = nn.Network(input_shape, layers, name=f"stack{seed}")
    count = int(rng.integers(2, 5))
    calibration = rng.normal(size=(count, *input_shape)) * 10.0 ** rng.uniform(-0.5, 1.0)
    input_signed = None
    if saturating:
        input_signed = True
    elif rng.random() < 0.4:
        calibration = np.abs(calibration)                # uint8 input unless forced
        input_signed = True if rng.random() < 0.3 else None
    return Stack(seed, net, calibration, input_signed, saturating)


@functools.cache
def quantised(seed: int) -> tuple[Stack, QuantisedNetwork, np.ndarray]:
    """The stack of ``seed``, quantised, and its quantised test inputs: the calibration
    batch, then all-lowest, all-highest, alternating lowest/highest and random codes."""
    stack = random_stack(seed)
    qnet = quantise(stack.net, stack.calibration, input_signed=stack.input_signed)
    lo, hi = qnet.input_q.range
    shape = qnet.input_shape
    checker = np.indices(shape).sum(axis=0) % 2
    rng = np.random.default_rng([seed, 1])
    extremes = np.stack([np.full(shape, lo), np.full(shape, hi), np.where(checker, hi, lo),
                         rng.integers(lo, hi, size=shape, endpoint=True)])
    return stack, qnet, np.concatenate([qnet.quantise_input(stack.calibration), extremes])


def before_saturation(st: Stage, x: np.ndarray) -> np.ndarray:
    """The requantiser's result for stage input ``x`` before it saturates to int8 (the steps
    of golden.requantise without the last clip)."""
    if st.kind == "conv":
        kh, kw = st.weight.shape[:2]
        cols = nn.im2col(x, kh, kw, st.pad, pad_value=st.in_q.zero_point, stride=st.stride)
        acc = golden.matmul(cols.reshape(-1, cols.shape[-1]), st.weight_matrix,
                            x_signed=st.in_q.signed)
    else:
        acc = golden.matmul(x.reshape(len(x), -1), st.weight_matrix, x_signed=st.in_q.signed)
    t = golden.wrap(acc + st.bias, 32)
    return golden.rounding_shift(t * st.multiplier, st.shift, st.rounding.value) + st.zero_point


def saturated_stages(qnet: QuantisedNetwork, x_q: np.ndarray) -> list[str]:
    """Names of the stages whose requantiser saturates on some element of ``x_q``."""
    _, outs = reference_forward(qnet, x_q, collect=True)
    names = []
    for st, x in zip(qnet.stages, [x_q, *outs[:-1]], strict=True):
        r = before_saturation(st, x)
        if (r > 127).any() or (r < -128).any():
            names.append(st.name)
    return names


# Running ------------------------------------------------------------------------------------

def compile_for(qnet: QuantisedNetwork, config: TPUConfig, images: int, label: str
                ) -> tuple[CompiledNetwork, TPUConfig]:
    """Compile for ``config`` with batches of at most ``images`` (a batch computes all its
    images, so a larger one would only cost simulation time); when the unified buffer is too
    small, check the error names a stage and ``ub_depth``, and compile for the same array with
    the shallowest unified buffer that holds one image."""
    try:
        return compile_network(qnet, config, max_batch=images), config
    except CompileError as error:
        message = str(error)
        names = "|".join(re.escape(st.name) for st in qnet.stages)
        assert re.search(rf"stage ({names}): .*ub_depth={config.ub_depth}", message), (
            f"{label}: {message}")
    depth = config.ub_depth * 2
    while True:
        assert depth <= 65536, f"{label}: does not fit a unified buffer of 65536 rows"
        deeper = config.replace(ub_depth=depth)
        try:
            return compile_network(qnet, deeper, max_batch=images), deeper
        except CompileError as error:
            assert "ub_depth" in str(error), f"{label} with ub_depth={depth}: {error}"
        depth *= 2


def check_stack(seed: int, config_name: str, transport: str = "isa", device=None) -> str:
    """Run the stack of ``seed`` on ``config_name`` and compare with the reference; returns
    the label (with the unified buffer it ran with when the preset's was too small)."""
    stack, qnet, x_q = quantised(seed)
    label = f"{stack.summary} on {config_name}"
    compiled, config = compile_for(qnet, CONFIGS[config_name], len(x_q), label)
    if config.ub_depth != CONFIGS[config_name].ub_depth:
        label += f" (ub_depth={config.ub_depth})"
    dev = device if device is not None else open_device(transport, config)
    result = run(dev, compiled, x_q)
    want = reference_forward(qnet, x_q)
    assert result.outputs.shape == want.shape, f"{label}: output shape"
    bad = np.argwhere(result.outputs != want)
    assert np.array_equal(result.outputs, want), (
        f"{label}: {len(bad)} of {want.size} outputs differ from the reference, first at "
        f"{bad[:4].tolist()}")
    return label


def array_rows(seed: int) -> int:
    """Roughly the rows the array streams for the stack of ``seed`` on its configuration:
    per image and stage, output positions x kernel taps x input channel groups x output
    column blocks. The ISA simulator's time grows with it."""
    _, qnet, x_q = quantised(seed)
    config = CONFIGS[config_of(seed)]
    rows = 0
    for st in qnet.stages:
        (kh, kw), positions = ((st.weight.shape[:2], int(np.prod(st.conv_out_hw)))
                               if st.kind == "conv" else ((1, 1), 1))
        rows += (positions * kh * kw * -(-st.weight.shape[-2] // config.rows)
                 * -(-st.n // config.cols))
    return rows * len(x_q)


def _brief(seed: int) -> set:
    """What a stack brings of what test_stacks_cover_the_brief asks for."""
    stack, qnet, _ = quantised(seed)
    convs = [layer for layer in stack.net.layers if isinstance(layer, nn.Conv2D)]
    out = {("convs", len(convs)), ("config", config_of(seed)), ("signed", qnet.input_q.signed)}
    for layer in convs:
        k = layer.kernel.shape[0]
        out |= {("kernel", k), ("stride", layer.stride), ("padding", layer.padding)}
        if k == 3:
            out.add(("3x3", layer.stride, layer.padding))
    if any(st.pool and i > 0 for i, st in enumerate(qnet.stages)):
        out.add(("pool after the first stage",))
    if qnet.stages[-1].kind == "dense":
        out.add(("dense head",))
    return out


@functools.cache
def fast_seeds() -> list[int]:
    """Among the first ``CANDIDATES`` seeds whose stack streams at most ``FAST_ROWS`` array
    rows (the others, large inputs with many channels on the small arrays, run in make
    regression): the first ``FAST``, then each later one that brings something of the brief
    the ones before it lack."""
    light = [seed for seed in range(SEED, SEED + 4 * CANDIDATES)
             if array_rows(seed) <= FAST_ROWS][:CANDIDATES]
    seeds = light[:FAST]
    seen = set().union(*map(_brief, seeds))
    for seed in light[FAST:]:
        if not _brief(seed) <= seen:
            seeds.append(seed)
            seen |= _brief(seed)
    return seeds


@pytest.mark.parametrize("seed", fast_seeds())
def test_random_stack(seed):
    check_stack(seed, config_of(seed))


@pytest.mark.parametrize("seed", [
    pytest.param(seed, marks=pytest.mark.slow if seed < SEED + CANDIDATES + 20 else SOAK)
    for seed in range(SEED, SEED + CANDIDATES + SLOW) if seed not in fast_seeds()])
def test_random_stack_more(seed):
    check_stack(seed, config_of(seed))


def test_stacks_cover_the_brief():
    """The fast seeds hold every kernel, both strides and paddings, pooling after a later
    convolution, dense heads, one, two and three convolutions, saturating stacks that do
    saturate, and activations that neither all saturate nor vanish."""
    stacks = [quantised(seed) for seed in fast_seeds()]
    convs = [layer for stack, _, _ in stacks for layer in stack.net.layers
             if isinstance(layer, nn.Conv2D)]
    assert {layer.kernel.shape[0] for layer in convs} == set(KERNELS)
    assert {layer.stride for layer in convs} == {1, 2}
    assert {layer.padding for layer in convs} == {"valid", "same"}
    assert {(layer.stride, layer.padding) for layer in convs if layer.kernel.shape[0] == 3} \
        == {(1, "valid"), (1, "same"), (2, "valid"), (2, "same")}
    assert {sum(isinstance(layer, nn.Conv2D) for layer in stack.net.layers)
            for stack, _, _ in stacks} == {1, 2, 3}
    assert any(st.pool and i > 0 for _, qnet, _ in stacks for i, st in enumerate(qnet.stages))
    assert any(qnet.stages[-1].kind == "dense" for _, qnet, _ in stacks)
    assert {qnet.input_q.signed for _, qnet, _ in stacks} == {True, False}
    assert {config_of(stack.seed) for stack, _, _ in stacks} == set(CONFIGS)
    for stack, qnet, x_q in stacks:
        if stack.saturating:
            assert saturated_stages(qnet, x_q), f"{stack.summary}: nothing saturates"
    # On the calibration data every stage's output takes several codes in most stacks.
    lively = 0
    for stack, qnet, x_q in stacks:
        _, outs = reference_forward(qnet, x_q[:len(stack.calibration)], collect=True)
        lively += all(len(np.unique(out)) > 4 for out in outs)
    assert lively >= 0.8 * len(stacks), f"only {lively} of {len(stacks)} stacks are lively"


def test_network_that_cannot_fit_names_the_stage_and_memory():
    """A 64x64x20 input on the small core (a 256-row unified buffer): CompileError naming
    the first stage and ub_depth."""
    rng = np.random.default_rng(SEED - 1)
    net = nn.Network((64, 64, 20), [
        nn.Conv2D(rng.normal(size=(3, 3, 20, 4)) / 8, padding="same", stride=2, name="big"),
        nn.ReLU()])
    qnet = quantise(net, rng.normal(size=(2, 64, 64, 20)))
    with pytest.raises(CompileError, match=r"stage big: .*unified buffer.*ub_depth=256"):
        compile_network(qnet, get_config("small"))


# The RTL -------------------------------------------------------------------------------------

RTL_SEEDS = [(SEED + 1, "small"), (SEED + 3, "small"), (SEED + 2, "3x5")]


@pytest.mark.slow
@pytest.mark.parametrize("seed, config_name", RTL_SEEDS,
                         ids=[f"{name}-seed{seed}" for seed, name in RTL_SEEDS])
def test_random_stack_on_rtl(rtl_device, seed, config_name):
    """A few stacks on the RTL core (SIM, Icarus by default), equal to the reference."""
    stack, qnet, x_q = quantised(seed)
    _, config = compile_for(qnet, CONFIGS[config_name], len(x_q), stack.summary)
    check_stack(seed, config_name, device=rtl_device(config))
