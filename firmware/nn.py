"""A small explicit layer graph of float networks, the input of the quantiser.

Conventions (the quantiser, the compiler and the int8 reference all follow them):

- tensors are NHWC (batch, height, width, channels); a vector input is ``(batch, features)``;
- :class:`Conv2D` kernels are HWIO ``(kh, kw, in_channels, out_channels)`` and are applied as
  a cross-correlation with stride ``s`` (1 by default): ``out[n, y, x, o] = bias[o] + sum
  over dy, dx, i of in[n, s * y + dy - p, s * x + dx - p, i] * kernel[dy, dx, i, o]``, where
  ``p`` is 0 for ``valid`` and ``(k - 1) / 2`` for ``same`` (odd kernels) on every side,
  positions outside the input reading 0; the output is ``(H + 2p - k) // s + 1`` high (and
  likewise wide). ``same`` pads symmetrically, as PyTorch's ``padding=k // 2``: with stride 1
  the output has the input's size; with stride 2 it has TensorFlow's ``same`` size,
  ``ceil(H / 2)``, but not its windows where ``H + 2p - k`` is odd (TensorFlow pads the extra
  row and column at the bottom and right, so its windows start one row and column lower);
- :class:`Dense` weights are ``(in_features, out_features)``: ``out = x @ weight + bias``;
- :class:`Flatten` flattens in HWC order (row-major over y, then x, then channels);
- :class:`MaxPool2D` takes 2x2 windows with stride 2 (odd trailing rows/columns dropped).

:class:`Network` holds the input shape and the layers and runs the float forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Dense", "Conv2D", "ReLU", "ReLU6", "Identity", "Sigmoid", "Tanh", "MaxPool2D",
           "Flatten", "Layer", "ACTIVATIONS", "Network", "NetworkError"]


class NetworkError(ValueError):
    """A layer or network that is malformed (shapes that do not chain, bad parameters)."""


@dataclass(eq=False)
class Dense:
    """Fully connected layer: ``x @ weight + bias``."""
    weight: np.ndarray
    bias: np.ndarray | None = None
    name: str = ""

    def __post_init__(self):
        self.weight = np.asarray(self.weight, dtype=np.float64)
        if self.weight.ndim != 2 or 0 in self.weight.shape:
            raise NetworkError(f"Dense weight must be (in, out) and non-empty, got "
                               f"{self.weight.shape}")
        n = self.weight.shape[1]
        self.bias = np.zeros(n) if self.bias is None else np.asarray(self.bias, np.float64)
        if self.bias.shape != (n,):
            raise NetworkError(f"Dense bias must be ({n},), got {self.bias.shape}")


@dataclass(eq=False)
class Conv2D:
    """2-D convolution with a stride (the same in both directions, an int >= 1) and
    ``valid`` or ``same`` padding (see the module notes)."""
    kernel: np.ndarray
    bias: np.ndarray | None = None
    padding: str = "valid"
    stride: int = 1
    name: str = ""

    def __post_init__(self):
        self.kernel = np.asarray(self.kernel, dtype=np.float64)
        if self.kernel.ndim != 4 or 0 in self.kernel.shape:
            raise NetworkError(f"Conv2D kernel must be HWIO (kh, kw, in, out), got "
                               f"{self.kernel.shape}")
        if self.padding not in ("valid", "same"):
            raise NetworkError(f"Conv2D padding={self.padding!r} is not supported; "
                               f"allowed: 'valid', 'same'")
        kh, kw = self.kernel.shape[:2]
        if self.padding == "same" and (kh % 2 == 0 or kw % 2 == 0):
            raise NetworkError(f"Conv2D 'same' padding needs odd kernel sizes, got {kh}x{kw}")
        n = self.kernel.shape[3]
        self.bias = np.zeros(n) if self.bias is None else np.asarray(self.bias, np.float64)
        if self.bias.shape != (n,):
            raise NetworkError(f"Conv2D bias must be ({n},), got {self.bias.shape}")
        self.stride = _check_stride(self.stride, "Conv2D")

    @property
    def pad(self) -> tuple[int, int]:
        """Rows and columns of zeros on each side of the input."""
        kh, kw = self.kernel.shape[:2]
        return ((kh - 1) // 2, (kw - 1) // 2) if self.padding == "same" else (0, 0)


def _check_stride(stride, where: str) -> int:
    """``stride`` as an int, or :class:`NetworkError` naming what is allowed."""
    if isinstance(stride, bool) or not isinstance(stride, int | np.integer) or stride < 1:
        raise NetworkError(f"{where} stride={stride!r} is not supported; allowed: an int >= 1 "
                           f"(the same stride in both directions)")
    return int(stride)


@dataclass(eq=False)
class _Named:
    """A layer with no parameters, only a name."""
    name: str = ""


class ReLU(_Named):
    """``max(x, 0)``."""


class ReLU6(_Named):
    """``min(max(x, 0), 6)``."""


class Identity(_Named):
    """``x``."""


class Sigmoid(_Named):
    """``1 / (1 + exp(-x))``."""


class Tanh(_Named):
    """``tanh(x)``."""


class MaxPool2D(_Named):
    """2x2 max-pooling, stride 2."""


class Flatten(_Named):
    """NHWC to (batch, H*W*C) in HWC order."""


Layer = Dense | Conv2D | ReLU | ReLU6 | Identity | Sigmoid | Tanh | MaxPool2D | Flatten
ACTIVATIONS = (ReLU, ReLU6, Identity, Sigmoid, Tanh)


def _activation(layer, x: np.ndarray) -> np.ndarray:
    if isinstance(layer, ReLU):
        return np.maximum(x, 0.0)
    if isinstance(layer, ReLU6):
        return np.clip(x, 0.0, 6.0)
    if isinstance(layer, Sigmoid):
        return 0.5 * (1.0 + np.tanh(0.5 * x))      # = 1 / (1 + exp(-x)), without overflow
    if isinstance(layer, Tanh):
        return np.tanh(x)
    return x


def conv2d(x: np.ndarray, kernel: np.ndarray, pad: tuple[int, int],
           pad_value: float | int = 0, stride: int = 1) -> np.ndarray:
    """Cross-correlation of NHWC ``x`` with an HWIO kernel, ``pad`` rows/columns of
    ``pad_value`` on each side, ``stride`` in both directions (float or exact integer
    arithmetic, by the inputs' dtype)."""
    patches = im2col(x, kernel.shape[0], kernel.shape[1], pad, pad_value, stride)
    n, ho, wo, k = patches.shape
    return (patches.reshape(-1, k) @ kernel.reshape(k, -1)).reshape(n, ho, wo, -1)


def im2col(x: np.ndarray, kh: int, kw: int, pad: tuple[int, int],
           pad_value: float | int = 0, stride: int = 1) -> np.ndarray:
    """``(n, ho, wo, kh * kw * c)`` patches of NHWC ``x``, each in (dy, dx, channel) order,
    the order of an HWIO kernel reshaped to ``(kh * kw * c, out)``; patch ``(y, x)`` starts at
    row ``stride * y`` and column ``stride * x`` of the padded input. ``pad``: ``(py, px)`` on
    both sides, or ``(top, bottom, left, right)``."""
    stride = _check_stride(stride, "im2col")
    top, bottom, left, right = (pad[0], pad[0], pad[1], pad[1]) if len(pad) == 2 else pad
    x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=pad_value)
    n, h, w, c = x.shape
    if h < kh or w < kw:
        raise NetworkError(f"a {kh}x{kw} kernel does not fit a {h}x{w} (padded) input")
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    cols = np.empty((n, ho, wo, kh, kw, c), dtype=x.dtype)
    span_y, span_x = stride * (ho - 1) + 1, stride * (wo - 1) + 1
    for dy in range(kh):
        for dx in range(kw):
            cols[:, :, :, dy, dx, :] = x[:, dy:dy + span_y:stride, dx:dx + span_x:stride, :]
    return cols.reshape(n, ho, wo, kh * kw * c)


def max_pool_2x2(x: np.ndarray) -> np.ndarray:
    """2x2 max-pooling, stride 2, of NHWC ``x`` (odd trailing rows/columns dropped)."""
    n, h, w, c = x.shape
    x = x[:, :h - h % 2, :w - w % 2, :]
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


@dataclass(eq=False)
class Network:
    """Input shape (without the batch dimension: ``(H, W, C)`` or ``(features,)``) and the
    layers in order. :meth:`shapes` checks that they chain."""
    input_shape: tuple[int, ...]
    layers: Sequence[Layer] = field(default_factory=list)
    name: str = "network"

    def __post_init__(self):
        self.input_shape = tuple(int(d) for d in self.input_shape)
        self.layers = list(self.layers)
        for i, layer in enumerate(self.layers):
            if not layer.name:
                layer.name = f"{i}:{type(layer).__name__}"
        self.shapes()

    def shapes(self) -> list[tuple[int, ...]]:
        """The output shape of every layer (batch dimension left out)."""
        shape = self.input_shape
        if len(shape) not in (1, 3) or min(shape) < 1:
            raise NetworkError(f"input shape {shape} is not (H, W, C) or (features,)")
        out = []
        for layer in self.layers:
            where = f"layer {layer.name}"
            if isinstance(layer, Dense):
                if len(shape) != 1:
                    raise NetworkError(f"{where}: Dense needs a vector input, got {shape}; "
                                       f"put a Flatten before it")
                if shape[0] != layer.weight.shape[0]:
                    raise NetworkError(f"{where}: Dense weight has {layer.weight.shape[0]} "
                                       f"inputs, the input has {shape[0]} features")
                shape = (layer.weight.shape[1],)
            elif isinstance(layer, Conv2D):
                if len(shape) != 3:
                    raise NetworkError(f"{where}: Conv2D needs an (H, W, C) input, got {shape}")
                kh, kw, cin, cout = layer.kernel.shape
                if shape[2] != cin:
                    raise NetworkError(f"{where}: kernel has {cin} input channels, the input "
                                       f"has {shape[2]}")
                py, px = layer.pad
                s = layer.stride
                h, w = shape[0] + 2 * py - kh, shape[1] + 2 * px - kw
                if h < 0 or w < 0:
                    raise NetworkError(f"{where}: a {kh}x{kw} kernel with {layer.padding!r} "
                                       f"padding does not fit {shape}")
                shape = (h // s + 1, w // s + 1, cout)
            elif isinstance(layer, MaxPool2D):
                if len(shape) != 3 or shape[0] < 2 or shape[1] < 2:
                    raise NetworkError(f"{where}: MaxPool2D needs (H, W, C) with H, W >= 2, "
                                       f"got {shape}")
                shape = (shape[0] // 2, shape[1] // 2, shape[2])
            elif isinstance(layer, Flatten):
                shape = (int(np.prod(shape)),)
            elif not isinstance(layer, ACTIVATIONS):
                raise NetworkError(f"{where}: unknown layer type {type(layer).__name__}")
            out.append(shape)
        return out

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shapes()[-1] if self.layers else self.input_shape

    def forward(self, x: np.ndarray, *, collect: bool = False):
        """Float forward pass of a batch ``x`` (``(n, *input_shape)``). With ``collect``,
        also the output of every layer."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape[1:] != self.input_shape:
            raise NetworkError(f"input batch has shape {x.shape[1:]} per item, the network "
                               f"takes {self.input_shape}")
        outputs = []
        for layer in self.layers:
            if isinstance(layer, Dense):
                x = x @ layer.weight + layer.bias
            elif isinstance(layer, Conv2D):
                x = conv2d(x, layer.kernel, layer.pad, stride=layer.stride) + layer.bias
            elif isinstance(layer, MaxPool2D):
                x = max_pool_2x2(x)
            elif isinstance(layer, Flatten):
                x = x.reshape(len(x), -1)
            else:
                x = _activation(layer, x)
            outputs.append(x)
        return (x, outputs) if collect else x
