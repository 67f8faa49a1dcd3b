"""A first convolution that reads its input as the tensor itself, through window MATMULs
(``hdl.isa.Matmul``'s ``window``; ``firmware.compiler.layout._window_conv_layout``): the
host sends the image framed in its zero point, ``ub_row`` elements a row, and nothing else.

Every case runs on the ISA simulator equal to the int8 reference on every element (the
extremes of the input range among the images), and its input rows are the framed tensor's
elements over ``ub_row``, rounded up (plus the row a last window may reach past them).
Seeds are fixed and in the labels.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_compiler import calibrate, check_on_core, quantised_inputs

from firmware import nn
from firmware.compiler import CompileError, compile_network
from firmware.compiler.layout import WINDOW_STEP_LIMIT
from firmware.quant import reference_forward
from firmware.runtime import run
from hdl.presets import get_config

SEED = 8_400


def conv_net(seed: int, shape, k: int, cout: int, stride: int, padding: str,
             pool: bool = False, dense: int = 5) -> nn.Network:
    """A convolution (``k x k``, ReLU, a 2x2 max-pool if ``pool``), a second 'same' one,
    and a Dense: the first reads the network input."""
    rng = np.random.default_rng(seed)
    cin = shape[2]
    layers = [nn.Conv2D(rng.normal(size=(k, k, cin, cout)) / k, rng.normal(size=cout) * 0.1,
                        padding=padding, stride=stride, name="conv0"), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2D())
    layers += [nn.Conv2D(rng.normal(size=(3, 3, cout, 4)) / 3, rng.normal(size=4) * 0.1,
                         padding="same", name="conv1"), nn.ReLU(), nn.Flatten()]
    probe = nn.Network(shape, layers)
    layers.append(nn.Dense(rng.normal(size=(probe.output_shape[0], dense)) / 4,
                           rng.normal(size=dense) * 0.1, name="fc"))
    return nn.Network(shape, layers, name=f"conv{k}x{k}s{stride}{padding}{shape}")


def _framed_rows(config, qnet) -> int:
    """Rows of the framed input tensor, ``ub_row`` elements a row (rounded up)."""
    st = qnet.stages[0]
    top, bottom, left, right = st.padding
    h, w, c = st.in_shape
    return -(-((h + top + bottom) * (w + left + right) * c) // config.ub_row)


# (configuration, input HWC, kernel, output channels, stride, padding): one and several
# channels, stride 1 (one MATMUL a pass) and 2 (one a pass and output row), 'same' and
# 'valid', a kernel row longer than the array's rows (5 x 3 = 15 elements: two chunks on 8,
# four on 4), a step past ub_row (3 x 2 = 6 on the 4x4: rows read that complete no window).
# The last three in make regression (make test's budget).
CASES = [
    ("default", (8, 9, 1), 3, 8, 1, "same"),
    ("default", (9, 8, 3), 3, 8, 2, "same"),
    ("default", (7, 7, 3), 5, 6, 1, "same"),
    ("small", (6, 7, 3), 3, 4, 2, "same"),
    ("wide", (6, 7, 1), 3, 8, 2, "valid"),
    ("default", (9, 10, 2), 3, 8, 1, "valid"),
    ("small", (6, 6, 1), 5, 4, 1, "valid"),
    ("tiny", (5, 4, 1), 3, 2, 1, "valid"),
]


@pytest.mark.parametrize("config_name, shape, k, cout, stride, padding", [
    pytest.param(*c, id=f"{c[0]}-{c[1][0]}x{c[1][1]}x{c[1][2]}-k{c[2]}-s{c[4]}-{c[5]}",
                 marks=pytest.mark.slow if n >= 5 else ()) for n, c in enumerate(CASES)])
def test_first_convolution_reads_the_tensor(config_name, shape, k, cout, stride, padding):
    config = get_config(config_name)
    seed = SEED + k * 10 + stride + shape[2] * 100
    net = conv_net(seed, shape, k, cout, stride, padding)
    rng = np.random.default_rng(seed)
    qnet = calibrate(net, rng.normal(size=(4, *shape)))
    x_q = quantised_inputs(rng, qnet, rng.normal(size=(3, *shape)))
    label = f"seed {seed}: {net.name} on {config_name}"
    # (A given batch: the compiler's own choice estimates many programs.)
    compiled = check_on_core(qnet, config, x_q, label, batch_size=2)
    first = compiled._plan.layouts[0]
    assert first.tensor is not None, f"{label}: its first convolution takes the host's rows"
    assert compiled.unit == 1, label
    framed = _framed_rows(config, qnet)
    # The framed tensor, and at most the rows the last windows reach past it.
    assert framed <= compiled.input_rows() <= framed + -(-config.rows // config.ub_row), label
    assert "the tensor itself (window MATMULs)" in compiled.summary(), label
    # The same network over the host's rows of taps: as exact, and more rows a image.
    host = check_on_core(qnet, config, x_q, label + " (windows=False)", windows=False,
                         batch_size=2)
    assert host._plan.layouts[0].tensor is None, label
    assert host.input_rows() > compiled.input_rows(), label


def test_pooled_first_convolution_takes_either_form():
    """Under a fused 2x2 max-pool the windows run two rows a MATMUL (the pooling window's
    four positions are consecutive accumulator rows), so by default the host's rows of taps
    carry the input; ``windows=True`` takes the tensor itself. Both exact."""
    config = get_config("default")
    shape = (8, 8, 1)
    net = conv_net(SEED + 1, shape, 3, 8, 1, "same", pool=True)
    rng = np.random.default_rng(SEED + 1)
    qnet = calibrate(net, rng.normal(size=(4, *shape)))
    x_q = quantised_inputs(rng, qnet, rng.normal(size=(3, *shape)))
    default = check_on_core(qnet, config, x_q, "pooled, default", batch_size=2)
    assert default._plan.layouts[0].tensor is None
    windows = check_on_core(qnet, config, x_q, "pooled, windows=True", windows=True,
                            batch_size=2)
    assert windows._plan.layouts[0].tensor is not None
    assert windows.input_rows() == _framed_rows(config, qnet) + 1     # a last window's row
    assert windows._plan.layouts[0].window == 4


def test_windows_refused_with_the_reason():
    """``windows=True`` where a window MATMUL cannot read the input raises before any work,
    saying why; the default then takes the host's rows of taps (exact)."""
    shape = (6, 6, 8)                     # 8 channels x stride 2: a step of 16 elements
    net = conv_net(SEED + 2, shape, 3, 4, 2, "same")
    rng = np.random.default_rng(SEED + 2)
    qnet = calibrate(net, rng.normal(size=(4, *shape)))
    x_q = quantised_inputs(rng, qnet, rng.normal(size=(2, *shape)))
    config = get_config("default")
    assert 8 * 2 > WINDOW_STEP_LIMIT
    with pytest.raises(CompileError, match=r"windows=True.*step 16 elements.*at most 15"):
        compile_network(qnet, config, windows=True)
    default = check_on_core(qnet, config, x_q, "step 16, default", batch_size=2)
    assert default._plan.layouts[0].tensor is None
    # A core built without the window mode.
    bare = config.replace(conv_windows=False)
    with pytest.raises(CompileError, match=r"no window mode \(TPUConfig.conv_windows\)"):
        compile_network(qnet, bare, windows=True)
    small = calibrate(conv_net(SEED + 3, (6, 6, 1), 3, 4, 1, "same"),
                      rng.normal(size=(4, 6, 6, 1)))
    assert compile_network(small, bare)._plan.layouts[0].tensor is None


def test_window_convolution_on_the_rtl(rtl_device):
    """Stride 2, three channels, a step past the 4x4's row (6 elements: rows read that
    complete no window) on the RTL core: every output equal to the int8 reference, and the
    rows the array streams equal to the compiler's count."""
    config = get_config("small")
    shape = (6, 7, 3)
    seed = SEED + 4
    net = conv_net(seed, shape, 3, 4, 2, "same")
    rng = np.random.default_rng(seed)
    qnet = calibrate(net, rng.normal(size=(4, *shape)))
    x_q = quantised_inputs(rng, qnet, rng.normal(size=(1, *shape)))
    compiled = compile_network(qnet, config, batch_size=1)
    assert compiled._plan.layouts[0].tensor is not None
    result = run(rtl_device(config), compiled, x_q)
    want = reference_forward(qnet, x_q)
    bad = np.argwhere(result.outputs != want)
    assert np.array_equal(result.outputs, want), (
        f"seed {seed}: {len(bad)} of {want.size} RTL outputs differ, first at {bad[:4]}")
    assert result.counters["array_active"] == compiled.matmul_rows(len(x_q))
