"""Post-training int8 quantisation of a :class:`firmware.nn.Network`, and the int8 reference.

The quantised network is a list of *stages*, one per Dense or Conv2D layer with the
activation function and max-pooling that follow it fused in, exactly as one MATMUL group and
one ACTIVATE run them on the core:

- weights: per output channel, symmetric int8 (``w_q = round(w / s_w)``, ``|w_q| <= 127``,
  ``s_w = max|w| / 127``; an all-zero channel gets ``s_w = 1``);
- activations: int8 (or uint8 for a non-negative network input) with a scale and a zero point
  calibrated on sample data (min/max, widened to include 0 so that 0.0 is exact);
- each stage's requantisation (:func:`sim.models.golden.requantise`) takes an int32 bias per column
  (the float bias in units of ``s_in * s_w`` minus ``z_in * sum(w_q)``, which folds the input
  zero point in), an int32 multiplier per column and one shift with
  ``multiplier / 2**shift = s_in * s_w / s_out``, and the output zero point;
- ReLU is ``max(q, z_out)``, ReLU6 is CLAMP with ``clamp_hi = round(6 / s_out) + z_out``;
  sigmoid and tanh requantise to the tables' input scale 1/16 (zero point 0) and leave with
  the tables' output scale and zero point (:mod:`sim.models.golden`).

:func:`reference_forward` is the int8 reference executor: the same arithmetic on whole
tensors with :mod:`sim.models.golden` (no tiling, no ISA simulator), which the core's output must
equal element for element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from firmware import nn
from hdl.isa import Func, Rounding
from sim.models import golden

__all__ = ["QuantError", "QParams", "Stage", "QuantisedNetwork", "quantise",
           "reference_forward"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


class QuantError(ValueError):
    """The network cannot be quantised for the core (message names the layer)."""


@dataclass(frozen=True)
class QParams:
    """``real = scale * (q - zero_point)``; ``q`` int8, or uint8 when not ``signed``."""
    scale: float
    zero_point: int
    signed: bool = True

    @property
    def range(self) -> tuple[int, int]:
        return golden.operand_range(self.signed)

    def quantise(self, x) -> np.ndarray:
        lo, hi = self.range
        q = np.round(np.asarray(x, dtype=np.float64) / self.scale) + self.zero_point
        return np.clip(q, lo, hi).astype(np.int64)

    def dequantise(self, q) -> np.ndarray:
        return self.scale * (np.asarray(q, dtype=np.float64) - self.zero_point)


#: Fixed output parameters of the table functions (hdl.isa.Func, sim.models.golden).
_LUT_IN = QParams(golden.LUT_INPUT_SCALE, 0)
_LUT_OUT = {Func.SIGMOID: QParams(*golden.SIGMOID_OUTPUT), Func.TANH: QParams(*golden.TANH_OUTPUT)}


@dataclass(eq=False)
class Stage:
    """One Dense or Conv2D layer with its fused activation and pooling, quantised.

    ``weight`` is int8 in the layer's own shape (``(K, N)`` or HWIO); ``bias``,
    ``multiplier`` are per output column (int32); ``shift`` is one rounding shift for every
    column (an int) or one per column (an int array of ``N``), ``rounding`` how it rounds
    (:class:`hdl.isa.Rounding`); ``zero_point`` (the requantisation's, 0 for the table
    functions) and ``clamp_hi`` are the activation unit's scalars. ``pad`` and ``stride`` are a
    convolution's (:class:`firmware.nn.Conv2D`; ``(0, 0)`` and 1 for a dense stage).
    ``in_shape`` and ``out_shape`` leave out the batch dimension; ``out_shape`` is after
    pooling.
    """
    name: str
    kind: str                       # "dense" or "conv"
    weight: np.ndarray
    bias: np.ndarray
    multiplier: np.ndarray
    shift: int | np.ndarray
    zero_point: int
    clamp_hi: int
    func: Func
    pool: bool
    pad: tuple[int, int]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_q: QParams
    out_q: QParams
    rounding: Rounding = Rounding.HALF_UP
    stride: int = 1
    #: With ``func`` TABLE: the 256 entries of the activation unit's programmable table
    #: (LOAD_TABLE), int8 or uint8 (``out_q``'s), entry ``q + 128`` the output for ``q``.
    table: np.ndarray | None = None
    #: A convolution's padding at the bottom and the right where it differs from ``pad``'s
    #: top and left (TFLite's SAME with a stride: ``(0, 1)`` below and right of ``(0, 0)``).
    pad_end: tuple[int, int] | None = None
    #: A residual add (the compiler's chains): the index of the earlier stage whose output is
    #: the second addend. The stage is then a 1x1 convolution of identity weights, and
    #: ``sum_tables`` (2, 256) gives the int32 term of each addend's byte (row 0: the
    #: earlier stage's output, row 1: this stage's input): the accumulator holds
    #: ``sum_tables[0][a & 255] + sum_tables[1][x & 255]`` (MATMUL_LOOKUP), which the
    #: requantisation scales (the bias is zero).
    skip: int | None = None
    sum_tables: np.ndarray | None = None

    @property
    def padding(self) -> tuple[int, int, int, int]:
        """The convolution's padding as (top, bottom, left, right)."""
        end = self.pad_end if self.pad_end is not None else self.pad
        return (self.pad[0], end[0], self.pad[1], end[1])

    @property
    def n(self) -> int:
        """Output channels (features)."""
        return self.weight.shape[-1]

    @property
    def k(self) -> int:
        """Reduction length of one output value."""
        return int(np.prod(self.weight.shape[:-1]))

    @property
    def weight_matrix(self) -> np.ndarray:
        """The weights as the ``(K, N)`` matrix the array multiplies by (HWIO rows in
        (dy, dx, channel) order for a convolution; HWC order after a flatten)."""
        return self.weight.reshape(self.k, self.n)

    @property
    def conv_out_hw(self) -> tuple[int, int]:
        """Height and width of the convolution's output, before pooling."""
        kh, kw = self.weight.shape[:2]
        t, b, left, r = self.padding
        return ((self.in_shape[0] + t + b - kh) // self.stride + 1,
                (self.in_shape[1] + left + r - kw) // self.stride + 1)


@dataclass(eq=False)
class QuantisedNetwork:
    """The stages of a quantised network and its input and output parameters."""
    name: str
    input_shape: tuple[int, ...]
    input_q: QParams
    stages: list[Stage]

    @property
    def output_q(self) -> QParams:
        return self.stages[-1].out_q

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.stages[-1].out_shape

    def quantise_input(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.shape[1:] != self.input_shape:
            raise QuantError(f"input batch has shape {x.shape[1:]} per item, the network "
                             f"takes {self.input_shape}")
        _require_finite(x, "input batch", "inputs")
        return self.input_q.quantise(x)

    def dequantise_output(self, q) -> np.ndarray:
        return self.output_q.dequantise(q)


def _require_finite(x: np.ndarray, what: str, items: str) -> None:
    """Raise :class:`QuantError` if *x* holds NaN or infinity, naming how many and where the
    first is."""
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        raise QuantError(f"{what} has {len(bad)} NaN or infinite values (the first at index "
                         f"{tuple(int(i) for i in bad[0])}); {items} must be finite numbers")


def _range_params(lo: float, hi: float, signed: bool = True) -> QParams:
    """Asymmetric parameters covering [lo, hi] (widened to include 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not signed:
        if lo < 0:
            raise QuantError("uint8 needs a non-negative range")
        return QParams(hi / 255 if hi > 0 else 1.0, 0, signed=False)
    if hi - lo <= 0:
        return QParams(1.0, 0)
    scale = (hi - lo) / 255
    zero_point = int(np.clip(round(-128 - lo / scale), -128, 127))
    return QParams(scale, zero_point)


def _multiplier_shift(real: np.ndarray, where: str) -> tuple[np.ndarray, int]:
    """int32 multipliers and one shift with ``multiplier / 2**shift ~= real`` (>= 0)."""
    top = float(real.max())
    if top <= 0:
        return np.zeros(real.shape, dtype=np.int64), 0
    shift = min(63, math.floor(math.log2(INT32_MAX / top)))
    while shift > 0 and np.round(real * 2.0 ** shift).max() > INT32_MAX:
        shift -= 1
    if shift < 0:
        raise QuantError(f"{where}: the requantisation scale {top:.3g} is larger than the "
                         f"activation unit's int32 multiplier can express (shift >= 0)")
    return np.round(real * 2.0 ** shift).astype(np.int64), shift


def _func_of(layer) -> Func:
    return {nn.ReLU: Func.RELU, nn.ReLU6: Func.CLAMP, nn.Sigmoid: Func.SIGMOID,
            nn.Tanh: Func.TANH}.get(type(layer), Func.IDENTITY)


def quantise(network: nn.Network, calibration: np.ndarray, *,
             input_signed: bool | None = None) -> QuantisedNetwork:
    """Quantise ``network`` with ranges calibrated on the float batch ``calibration``.

    ``input_signed``: int8 (True) or uint8 (False) network input; by default uint8 when the
    calibration input is non-negative. Raises :class:`QuantError` naming the layer for a
    graph the core cannot run (an activation or pooling not after a Dense/Conv2D layer).
    """
    calibration = np.asarray(calibration, dtype=np.float64)
    if calibration.ndim == 0 or len(calibration) == 0:
        raise QuantError(f"the calibration batch is empty (shape {calibration.shape}); give "
                         f"at least one input of shape {network.input_shape}")
    _require_finite(calibration, "the calibration batch", "calibration inputs")
    for layer in network.layers:
        for what in ("weight", "kernel", "bias"):
            value = getattr(layer, what, None)
            if value is not None and not np.isfinite(np.asarray(value, dtype=float)).all():
                raise QuantError(f"layer {layer.name}: its {what} has NaN or infinite values; "
                                 f"a network's parameters must be finite numbers")
    _, outputs = network.forward(calibration, collect=True)
    shapes = network.shapes()
    if input_signed is None:
        input_signed = bool(calibration.min() < 0)
    input_q = _range_params(calibration.min(), calibration.max(), signed=input_signed)

    stages: list[Stage] = []
    in_q, in_shape = input_q, network.input_shape
    layers = network.layers
    i = 0
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, nn.Flatten):
            in_shape = shapes[i]
            i += 1
            continue
        if not isinstance(layer, nn.Dense | nn.Conv2D):
            kind = type(layer).__name__
            raise QuantError(f"layer {layer.name}: {kind} must follow a Dense or Conv2D layer "
                             f"(the activation unit applies it to that layer's results)")
        weight = layer.weight if isinstance(layer, nn.Dense) else layer.kernel
        bias_f = layer.bias
        last = i
        func, act = Func.IDENTITY, None
        if i + 1 < len(layers) and isinstance(layers[i + 1], nn.ACTIVATIONS):
            act = layers[i + 1]
            func = _func_of(act)
            last = i + 1
        pool = False
        if last + 1 < len(layers) and isinstance(layers[last + 1], nn.MaxPool2D):
            if isinstance(layer, nn.Dense):
                raise QuantError(f"layer {layers[last + 1].name}: MaxPool2D must follow a "
                                 f"Conv2D layer")
            pool = True
            last += 1
        where = f"layer {layer.name}"

        # Weights: symmetric int8 per output channel.
        w2 = weight.reshape(-1, weight.shape[-1])
        w_max = np.abs(w2).max(axis=0)
        w_scale = np.where(w_max > 0, w_max / 127, 1.0)
        w_q = np.clip(np.round(weight / w_scale), -127, 127).astype(np.int64)

        # Output parameters from the calibrated range after the activation.
        if func in _LUT_OUT:
            req_q, out_q = _LUT_IN, _LUT_OUT[func]
        else:
            values = outputs[i + 1 if act is not None else i]
            out_q = _range_params(values.min(), values.max())
            req_q = out_q
        clamp_hi = 127
        if func == Func.CLAMP:
            clamp_hi = int(np.clip(round(6.0 / out_q.scale) + out_q.zero_point, -128, 127))

        acc_scale = in_q.scale * w_scale
        real = acc_scale / req_q.scale
        multiplier, shift = _multiplier_shift(real, where)
        colsum = w_q.reshape(-1, w_q.shape[-1]).sum(axis=0)
        bias = np.round(bias_f / acc_scale).astype(np.int64) - in_q.zero_point * colsum
        if bias.min() < INT32_MIN or bias.max() > INT32_MAX:
            raise QuantError(f"{where}: a bias does not fit int32 at scale {acc_scale.min():.3g}")
        pad = layer.pad if isinstance(layer, nn.Conv2D) else (0, 0)
        stride = layer.stride if isinstance(layer, nn.Conv2D) else 1
        stages.append(Stage(
            name=layer.name, kind="dense" if isinstance(layer, nn.Dense) else "conv",
            weight=w_q, bias=bias, multiplier=multiplier, shift=shift,
            zero_point=req_q.zero_point, clamp_hi=clamp_hi, func=func, pool=pool, pad=pad,
            in_shape=in_shape, out_shape=shapes[last], in_q=in_q, out_q=out_q, stride=stride))
        in_q, in_shape = out_q, shapes[last]
        i = last + 1
    if not stages:
        raise QuantError("the network has no Dense or Conv2D layer")
    if len(network.output_shape) != len(stages[-1].out_shape):
        raise QuantError("the network must end with a Dense or Conv2D stage (a trailing "
                         "Flatten changes nothing the core computes; drop it)")
    return QuantisedNetwork(network.name, network.input_shape, input_q, stages)


def reference_forward(qnet: QuantisedNetwork, x_q: np.ndarray, *,
                      collect: bool = False):
    """The int8 reference: integer outputs of every stage for quantised inputs ``x_q``
    (``(n, *input_shape)``), with :mod:`sim.models.golden`'s arithmetic on whole tensors."""
    x = np.asarray(x_q, dtype=np.int64)
    outs = []
    for st in qnet.stages:
        if st.skip is not None:
            acc = golden.wrap(golden.lookup_sums(outs[st.skip], st.sum_tables[0]) +
                              golden.lookup_sums(x, st.sum_tables[1]))
        elif st.kind == "conv":
            kh, kw = st.weight.shape[:2]
            cols = nn.im2col(x, kh, kw, st.padding, pad_value=st.in_q.zero_point,
                             stride=st.stride)
            n, ho, wo, k = cols.shape
            acc = golden.matmul(cols.reshape(-1, k), st.weight_matrix,
                                x_signed=st.in_q.signed).reshape(n, ho, wo, st.n)
        else:
            acc = golden.matmul(x.reshape(len(x), -1), st.weight_matrix,
                                x_signed=st.in_q.signed)
        q = golden.requantise(acc, st.bias, st.multiplier, st.shift, st.zero_point,
                              st.rounding.value)
        x = golden.activate(q, st.func.value, st.zero_point, st.clamp_hi, table=st.table)
        if st.pool:
            x = nn.max_pool_2x2(x)      # (the core compares as int8)
        if st.func == Func.TABLE and not st.out_q.signed:
            x = x & 0xff                # a uint8 table's bytes
        outs.append(x)
    return (x, outs) if collect else x
