"""Several output positions an accumulator row: a first convolution that a Dense reads, with
few output channels, computes ``p`` positions in each row of the array's output (the wide
kernel over them in one host row; ``firmware.compiler.layout._paired``). The rule, from the
compiler's notes: the largest ``p >= 2`` with ``p * n <= min(rows, cols)``, the wide kernel's
``kh * (kw + (p - 1) * spacing * stride) * cin`` taps in a row of ``rows``, and ``p`` dividing
the output's width (after pooling); ``spacing`` is 2 with max-pooling (a row's positions in
``p`` pooling windows side by side), else 1.

Every case runs on the ISA simulator packed and unpacked, both equal to the int8 reference on
every element, and the packed one streams one array row and sends one host row per ``p``
output positions (one position a row: ``p`` times as many or more). Seeds are in the labels.
Every compile here takes the host's rows of taps (``windows=False``): a first convolution
that reads the tensor itself through window MATMULs has one position a row.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiers import tiered

from firmware import nn
from firmware.compiler import compile_network
from firmware.datasets import digits
from firmware.models import digits as models
from firmware.quant import QuantisedNetwork, quantise, reference_forward
from firmware.runtime import run
from firmware.transports.isa import IsaSimDevice
from hdl.config import TPUConfig
from hdl.presets import get_config

SEED = 9_100

CONFIGS: dict[str, TPUConfig] = {
    "default": get_config("default"),
    "large": get_config("large"),
    # Non-square and neither side a power of two: min(rows, cols) = 6 output columns.
    "9x6": TPUConfig(rows=9, cols=6, ub_depth=1024, acc_depth=256, weight_mem_tiles=32),
}


def expected_per_row(config: TPUConfig, st) -> int:
    """Positions a row the rule above gives for first stage ``st`` (1: not packed)."""
    kh, kw, cin, n = st.weight.shape
    ho, wo = st.conv_out_hw
    spacing = 2 if st.pool else 1
    width = wo // 2 if st.pool else wo
    best = 1
    for p in range(2, min(config.rows, config.cols) // n + 1):
        if kh * (kw + (p - 1) * spacing * st.stride) * cin <= config.rows and width % p == 0:
            best = p
    return best


def conv_dense(seed: int, config: TPUConfig) -> tuple[nn.Network, np.ndarray]:
    """A random Conv2D (kernel 1-3, 3 only where a wide 3x3 kernel can fit the rows; stride
    1-2, valid or same, pooling or not, mostly one input channel, few output channels) then
    Flatten and Dense, and its calibration batch. The input width makes the output's width
    even four times in five (the rule's divisibility, so that most cases pack)."""
    rng = np.random.default_rng(seed)
    g = min(config.rows, config.cols)
    cin = 1 if rng.random() < 0.7 else int(rng.integers(2, 4))
    k = int(rng.integers(1, 4 if config.rows >= 12 else 3))
    padding = "same" if k % 2 and rng.random() < 0.5 else "valid"
    stride = int(rng.integers(1, 3))
    pool = rng.random() < 0.5
    even = rng.random() < 0.8
    for _ in range(100):
        h, w = int(rng.integers(max(4, k), 11)), int(rng.integers(max(4, k), 13))
        ho = -(-h // stride) if padding == "same" else (h - k) // stride + 1
        wo = -(-w // stride) if padding == "same" else (w - k) // stride + 1
        if pool and min(ho, wo) < 2:
            continue
        if not even or (wo // 2 if pool else wo) % 2 == 0:
            break
    cout = int(rng.integers(1, max(2, g // 2) + 1))
    layers = [nn.Conv2D(rng.normal(size=(k, k, cin, cout)) / np.sqrt(k * k * cin),
                        rng.normal(size=cout) * 0.2, padding, stride=stride, name="conv"),
              (nn.ReLU, nn.Identity, nn.ReLU6)[int(rng.integers(3))]()]
    if pool:
        layers.append(nn.MaxPool2D())
    shape = nn.Network((h, w, cin), layers).output_shape
    features, n = int(np.prod(shape)), int(rng.integers(1, 13))
    layers += [nn.Flatten(), nn.Dense(rng.normal(size=(features, n)) / np.sqrt(features),
                                      rng.normal(size=n) * 0.2, name="fc")]
    net = nn.Network((h, w, cin), layers, name=f"convdense{seed}")
    calibration = rng.normal(size=(3, h, w, cin)) * 10.0 ** rng.uniform(-0.5, 1.0)
    return net, calibration


def inputs(qnet: QuantisedNetwork, calibration: np.ndarray, seed: int) -> np.ndarray:
    """The calibration batch quantised, then all-lowest, all-highest, a checkerboard of the
    two and random codes."""
    lo, hi = qnet.input_q.range
    shape = qnet.input_shape
    checker = np.indices(shape).sum(axis=0) % 2
    rng = np.random.default_rng([seed, 1])
    return np.concatenate([qnet.quantise_input(calibration), np.stack([
        np.full(shape, lo), np.full(shape, hi), np.where(checker, hi, lo),
        rng.integers(lo, hi, size=shape, endpoint=True)])])


def check_packed(qnet: QuantisedNetwork, config: TPUConfig, x_q: np.ndarray, label: str,
                 **options) -> int:
    """Compile packed and unpacked, run both on the ISA simulator, compare each with the
    reference and the packed one's rows with the unpacked one's; returns positions a row.
    Where the rule does not pack, the default compile alone (which must not pack; unpacked
    layouts are test_conv_stacks')."""
    want = reference_forward(qnet, x_q)
    p = expected_per_row(config, qnet.stages[0])
    compiled = {}
    for pack in (False, True) if p > 1 else (True,):
        cn = compile_network(qnet, config, pack_positions=pack, windows=False, **options)
        result = run(IsaSimDevice(config), cn, x_q)
        bad = np.argwhere(result.outputs != want)
        assert np.array_equal(result.outputs, want), (
            f"{label}, pack_positions={pack}: {len(bad)} of {want.size} outputs differ, first "
            f"at {bad[:4].tolist()}")
        assert result.counters["array_active"] == cn.matmul_rows(len(x_q)), label
        compiled[pack] = cn
    packed = compiled[True]
    first = packed._plan.stages[0].stage
    assert getattr(first, "per_row", 1) == p, f"{label}: {first} positions a row, {p} wanted"
    assert (f"{p} positions a row" in packed.summary()) == (p > 1), label
    if p == 1:
        return p
    plain = compiled[False]
    assert "positions a row" not in plain.summary(), label
    # One host row and one array row per p output positions (per image, any batching);
    # one position a row needs p times as many or more (its shifted passes read a few
    # positions past the edge).
    conv_rows = [cn._trial.stage_rows[0] / (3 * cn.batch_size) for cn in (plain, packed)]
    st = qnet.stages[0]
    ho, wo = st.conv_out_hw
    rows = 4 * (ho // 2) * (wo // 2) // p if st.pool else ho * wo // p
    assert (packed.input_rows(), conv_rows[1]) == (rows, rows), (label, conv_rows)
    assert plain.input_rows() >= p * rows and conv_rows[0] >= p * rows, (label, conv_rows)
    # The shape bound counts the layer's own MACs: the same, over fewer slots.
    assert packed.useful_macs() == plain.useful_macs(), label
    assert packed.bounds()[0].slots * p <= plain.bounds()[0].slots, label
    return p


def _cases() -> list[tuple[int, str]]:
    return [(SEED + i, name) for i, name in enumerate(list(CONFIGS) * 6)]


#: make test: the first two cases of each configuration.
FAST_CASES = _cases()[:2 * len(CONFIGS)]


@pytest.mark.parametrize("seed, config_name", tiered(_cases(), fast=FAST_CASES),
                         ids=[f"{name}-seed{seed}" for seed, name in _cases()])
def test_random_conv_dense(seed, config_name):
    config = CONFIGS[config_name]
    net, calibration = conv_dense(seed, config)
    qnet = quantise(net, calibration)
    x_q = inputs(qnet, calibration, seed)
    layer = net.layers[0]
    label = (f"seed {seed} on {config_name}: {net.input_shape} conv{layer.kernel.shape[0]}/"
             f"{layer.stride} {layer.padding} ->{layer.kernel.shape[-1]}"
             f"{' pool' if qnet.stages[0].pool else ''}, dense ->{qnet.stages[1].n}")
    check_packed(qnet, config, x_q, label)


def test_random_cases_pack():
    """Most random cases pack (two and three positions a row, with and without pooling,
    stride 1 and 2); the rest show the rule's refusals."""
    seen = []
    for seed, name in _cases():
        config = CONFIGS[name]
        net, calibration = conv_dense(seed, config)
        st = quantise(net, calibration).stages[0]
        seen.append((expected_per_row(config, st), st.pool, st.stride))
    packed = [s for s in seen if s[0] > 1]
    assert len(packed) >= len(seen) // 2, seen
    assert {p for p, _, _ in packed} >= {2, 3}, seen
    assert {pool for _, pool, _ in packed} == {True, False}, seen
    assert {stride for _, _, stride in packed} == {1, 2}, seen
    assert any(p == 1 for p, _, _ in seen), seen


def test_digits_cnn_on_16x16_halves_its_rows():
    """The demo CNN (3x3 conv to 8 channels, max-pool, Dense) on the 16x16: two positions a
    row (a 3x5 patch in 15 of 16 lanes), 32 host rows and 40 array rows an image instead of 64
    and 80, the shape bound 57.5 % instead of 28.7 %, and the cycle model's estimate lower."""
    split = digits()
    config = get_config("large")
    qnet = quantise(models.build("cnn", split), split.x_train)
    x_q = qnet.quantise_input(split.x_test[:40])
    assert check_packed(qnet, config, x_q, "digits cnn on large") == 2
    plain = compile_network(qnet, config, pack_positions=False, windows=False)
    packed = compile_network(qnet, config, windows=False)
    assert (plain.input_rows(), packed.input_rows()) == (64, 32)
    rows = [sum(cn._trial.stage_rows) / (3 * cn.batch_size) for cn in (plain, packed)]
    assert rows == [80, 40], rows
    assert round(100 * plain.bound(), 1) == 28.7 and round(100 * packed.bound(), 1) == 57.5
    assert packed.estimate() < 0.6 * plain.estimate()


@pytest.mark.parametrize("case", ["conv after conv", "channels fill the row", "taps overflow",
                                  "odd width", "conv last"])
def test_not_packed(case):
    """What the rule refuses stays one position a row, and still equals the reference: a
    convolution another convolution reads, one whose channels leave no room, one whose wide
    kernel overflows a row, one whose output width no p divides, and a convolution that is
    the network's output."""
    rng = np.random.default_rng(SEED - 1)
    config = get_config("default")
    shape, k, cout, pool = (6, 6, 1), 3, 2, False
    if case == "channels fill the row":
        cout = 5
    elif case == "taps overflow":
        shape = (6, 6, 2)          # 3 x 4 x 2 = 24 taps > 8 rows
    elif case == "odd width":
        k = 1
        shape = (4, 5, 1)          # a 1x1 conv: output width 5
    layers = [nn.Conv2D(rng.normal(size=(k, k, shape[2], cout)) / 3, rng.normal(size=cout),
                        "valid", name="conv"), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2D())
    if case == "conv after conv":
        layers += [nn.Conv2D(rng.normal(size=(1, 1, cout, 2)) / 2, np.zeros(2), "valid",
                             name="conv2"), nn.ReLU()]
    out = nn.Network(shape, layers).output_shape
    if case != "conv last":
        features = int(np.prod(out))
        layers += [nn.Flatten(), nn.Dense(rng.normal(size=(features, 3)) / 4, np.zeros(3),
                                          name="fc")]
    net = nn.Network(shape, layers, name=case)
    calibration = rng.normal(size=(3, *shape)) * 4
    qnet = quantise(net, calibration)
    x_q = inputs(qnet, calibration, SEED - 1)
    cn = compile_network(qnet, config, windows=False)
    assert "positions a row" not in cn.summary(), case
    result = run(IsaSimDevice(config), cn, x_q)
    assert np.array_equal(result.outputs, reference_forward(qnet, x_q)), case


@pytest.mark.slow
@pytest.mark.soak          # 128 s on Icarus: the 16x16 core
def test_digits_cnn_packed_on_the_rtl(rtl_device):
    """The packed 16x16 CNN on the RTL core equals the reference on every logit."""
    split = digits()
    config = get_config("large")
    qnet = quantise(models.build("cnn", split), split.x_train)
    x_q = qnet.quantise_input(split.x_test[:48])
    cn = compile_network(qnet, config, windows=False)
    assert "2 positions a row" in cn.summary()
    result = run(rtl_device(config), cn, x_q)
    assert np.array_equal(result.outputs, reference_forward(qnet, x_q))


#: Two positions a row with stride 2 on the default core (make test); with a 1x1 kernel on
#: it, four with pooling on the 16x16 and two with pooling on the 9x6 (make regression).
RTL_CASES = [(SEED + 0, "default"), pytest.param(SEED + 9, "default", marks=pytest.mark.slow),
             pytest.param(SEED + 7, "large", marks=pytest.mark.slow),
             pytest.param(SEED + 5, "9x6", marks=pytest.mark.slow)]


@pytest.mark.parametrize("seed, config_name", RTL_CASES)
def test_random_packed_on_the_rtl(rtl_device, seed, config_name):
    """Random packed cases on the RTL core, equal to the reference."""
    config = CONFIGS[config_name]
    net, calibration = conv_dense(seed, config)
    qnet = quantise(net, calibration)
    x_q = inputs(qnet, calibration, seed)
    cn = compile_network(qnet, config, windows=False)
    assert expected_per_row(config, qnet.stages[0]) > 1
    result = run(rtl_device(config), cn, x_q)
    assert np.array_equal(result.outputs, reference_forward(qnet, x_q)), f"seed {seed}"
