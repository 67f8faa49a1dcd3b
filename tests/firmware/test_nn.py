"""The float network graph (firmware.nn): strided convolutions against the module notes'
definition written out as loops, output shapes, and bad strides refused with what is allowed."""

from __future__ import annotations

import numpy as np
import pytest

from firmware import nn

SEED = 20261205


def conv_by_definition(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, pad: tuple[int, int],
                       stride: int) -> np.ndarray:
    """``out[n, y, x, o] = bias[o] + sum of in[n, s*y + dy - p, s*x + dx - p, i] *
    kernel[dy, dx, i, o]``, positions outside the input reading 0: one sum per element, no
    padded array and no im2col."""
    n, h, w, cin = x.shape
    kh, kw, _, cout = kernel.shape
    py, px = pad
    ho, wo = (h + 2 * py - kh) // stride + 1, (w + 2 * px - kw) // stride + 1
    out = np.zeros((n, ho, wo, cout))
    for b in range(n):
        for y in range(ho):
            for xx in range(wo):
                for o in range(cout):
                    total = bias[o]
                    for dy in range(kh):
                        for dx in range(kw):
                            iy, ix = stride * y + dy - py, stride * xx + dx - px
                            if 0 <= iy < h and 0 <= ix < w:
                                total += float(x[b, iy, ix, :] @ kernel[dy, dx, :, o])
                    out[b, y, xx, o] = total
    return out


def small_ints(rng, shape) -> np.ndarray:
    """Integer-valued floats: every sum of their products is exact in double precision, so
    two summation orders compare with ==."""
    return rng.integers(-9, 10, size=shape).astype(np.float64)


def random_strided_conv(seed: int):
    rng = np.random.default_rng(seed)
    kh, kw = [(1, 1), (2, 2), (3, 3), (5, 5), (1, 3), (3, 2)][int(rng.integers(6))]
    padding = "same" if kh % 2 and kw % 2 and rng.random() < 0.5 else "valid"
    stride = int(rng.integers(2, 4))
    h = int(rng.integers(1 if padding == "same" else kh, 10))
    w = int(rng.integers(1 if padding == "same" else kw, 10))
    cin, cout = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    conv = nn.Conv2D(small_ints(rng, (kh, kw, cin, cout)), small_ints(rng, cout), padding,
                     stride=stride)
    return conv, small_ints(rng, (2, h, w, cin))


@pytest.mark.parametrize("seed", range(SEED, SEED + 20))
def test_strided_conv_forward_equals_the_definition(seed):
    conv, x = random_strided_conv(seed)
    net = nn.Network(x.shape[1:], [conv])
    label = (f"seed {seed}: {conv.kernel.shape[:2]} {conv.padding} stride {conv.stride} "
             f"on {x.shape[1:]}")
    want = conv_by_definition(x, conv.kernel, conv.bias, conv.pad, conv.stride)
    got = net.forward(x)
    assert got.shape == want.shape == (2, *net.output_shape), label
    assert np.array_equal(got, want), label


def test_stride_one_is_the_default_and_unchanged():
    rng = np.random.default_rng(SEED)
    kernel, x = small_ints(rng, (3, 3, 2, 3)), small_ints(rng, (2, 6, 5, 2))
    conv = nn.Conv2D(kernel, padding="same")
    assert conv.stride == 1
    want = conv_by_definition(x, kernel, np.zeros(3), (1, 1), 1)
    assert np.array_equal(nn.Network((6, 5, 2), [conv]).forward(x), want)


def test_strided_integer_conv_is_exact():
    """conv2d on int64 inputs stays integer and exact (the int8 reference relies on it)."""
    rng = np.random.default_rng(SEED + 1)
    x = rng.integers(-128, 128, size=(2, 7, 6, 3))
    kernel = rng.integers(-127, 128, size=(3, 3, 3, 4))
    got = nn.conv2d(x, kernel, (1, 1), pad_value=-5, stride=2)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-5)
    assert got.dtype == np.int64 and got.shape == (2, 4, 3, 4)
    for y in range(4):
        for xx in range(3):
            patch = padded[:, 2 * y:2 * y + 3, 2 * xx:2 * xx + 3, :]
            assert np.array_equal(got[:, y, xx, :], np.einsum("nabi,abio->no", patch, kernel))


@pytest.mark.parametrize("shape, k, padding, stride, out", [
    ((7, 7, 1), 3, "valid", 2, (3, 3)),
    ((8, 8, 1), 3, "valid", 2, (3, 3)),
    ((8, 8, 1), 3, "same", 2, (4, 4)),
    ((7, 8, 1), 3, "same", 2, (4, 4)),
    ((5, 5, 1), 5, "valid", 3, (1, 1)),
    ((4, 9, 1), 1, "valid", 4, (1, 3)),
    ((12, 4, 1), 2, "valid", 2, (6, 2)),
])
def test_strided_output_shape(shape, k, padding, stride, out):
    """``(H + 2p - k) // stride + 1``; with ``same`` and stride 2, ``ceil(H / 2)``."""
    conv = nn.Conv2D(np.ones((k, k, 1, 2)), padding=padding, stride=stride)
    net = nn.Network(shape, [conv])
    assert net.output_shape == (*out, 2)
    assert net.forward(np.ones((1, *shape))).shape == (1, *out, 2)


def test_same_pads_symmetrically_with_stride_two():
    """PyTorch's padding=1 for a 3x3 kernel: output (0, 0) is centred on input (0, 0) and
    reads the zero row and column above and left of it (TensorFlow's 'same' would centre it
    on (1, 1) for an even input)."""
    x = np.arange(16, dtype=float).reshape(1, 4, 4, 1)
    kernel = np.zeros((3, 3, 1, 1))
    kernel[1, 1] = 1.0                                   # the centre tap
    out = nn.Network((4, 4, 1), [nn.Conv2D(kernel, padding="same", stride=2)]).forward(x)
    assert np.array_equal(out[0, :, :, 0], x[0, ::2, ::2, 0])


def test_kernel_that_does_not_fit_is_named():
    with pytest.raises(nn.NetworkError, match=r"layer big: a 5x5 kernel .* does not fit"):
        nn.Network((4, 6, 1), [nn.Conv2D(np.ones((5, 5, 1, 1)), stride=2, name="big")])


@pytest.mark.parametrize("stride", [0, -1, 1.5, 2.0, "2", True, None, (2, 2)])
def test_bad_stride_is_refused_with_what_is_allowed(stride):
    with pytest.raises(nn.NetworkError, match=r"stride=.* allowed: an int >= 1"):
        nn.Conv2D(np.ones((3, 3, 1, 1)), stride=stride)
    with pytest.raises(nn.NetworkError, match=r"stride=.* allowed: an int >= 1"):
        nn.im2col(np.ones((1, 4, 4, 1)), 3, 3, (0, 0), stride=stride)


def test_numpy_integer_stride_is_accepted():
    conv = nn.Conv2D(np.ones((3, 3, 1, 1)), stride=np.int64(2))
    assert conv.stride == 2 and type(conv.stride) is int
