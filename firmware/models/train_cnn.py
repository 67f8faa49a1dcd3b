"""A small CNN for the 8x8 digits, trained in pure numpy; its float weights are committed.

Run ``python -m firmware.models.train_cnn`` to retrain and rewrite ``cnn_digits.npz`` next to
this module (deterministic: fixed seed, a few seconds on two cores).

Network (the compiler and the float reference must follow these conventions exactly):

- Tensors are NHWC. Input ``(n, 8, 8, 1)``, float32 in [0, 1] (:func:`firmware.datasets.digits`).
- Conv2D 3x3, 1 -> 8 channels, stride 1, 'same' zero padding (one row/column of zeros on each
  side), with bias. The kernel is HWIO, shape ``(3, 3, 1, 8)``, applied as cross-correlation
  (no kernel flip)::

      out[n, y, x, o] = b[o] + sum_{dy, dx, i} in_padded[n, y + dy, x + dx, i] * k[dy, dx, i, o]

- ReLU, then MaxPool 2x2 with stride 2: ``(n, 8, 8, 8) -> (n, 4, 4, 8)``.
- Flatten in HWC order (row-major over y, then x, then channel): feature index
  ``(y * 4 + x) * 8 + c``, so the dense weight has shape ``(128, 10)``.
- Dense 128 -> 10 with bias: the logits (trained with softmax cross-entropy).

Arrays in the .npz, all float32: ``conv_w`` (3, 3, 1, 8), ``conv_b`` (8,), ``dense_w``
(128, 10), ``dense_b`` (10,).

Training: Adam on mini-batches, with a little L2 weight decay so that weights and activations
stay small for the later per-channel int8 quantisation.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from firmware.datasets import digits

__all__ = ["SEED", "PARAMS_PATH", "cnn_forward", "load_params", "train"]

#: Seed of the weight initialisation and of the mini-batch shuffling.
SEED = 0
#: The committed weights.
PARAMS_PATH = Path(__file__).with_name("cnn_digits.npz")

EPOCHS = 20
BATCH = 32
LR = 1e-2
WEIGHT_DECAY = 3e-4  # L2 penalty on the conv and dense weights (not the biases)


def im2col(x: np.ndarray) -> np.ndarray:
    """3x3 'same' patches of NHWC ``x``: ``(n*h*w, 9*c)``, columns in (dy, dx, i) order, so that
    ``im2col(x) @ k.reshape(-1, o)`` is the convolution with an HWIO kernel ``k``."""
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.stack([xp[:, dy:dy + h, dx:dx + w, :] for dy in range(3) for dx in range(3)],
                    axis=3)  # (n, h, w, 9, c)
    return cols.reshape(n * h * w, 9 * c)


def _layers(params: dict, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Forward pass keeping what the backward pass needs."""
    n, h, w, _ = x.shape
    k = params["conv_w"]
    cols = im2col(x)
    conv = (cols @ k.reshape(-1, k.shape[-1]) + params["conv_b"]).reshape(n, h, w, -1)
    relu = np.maximum(conv, 0)
    pooled = relu.reshape(n, h // 2, 2, w // 2, 2, -1).max(axis=(2, 4))
    flat = pooled.reshape(n, -1)  # HWC order
    logits = flat @ params["dense_w"] + params["dense_b"]
    return cols, relu, pooled, flat, logits


def cnn_forward(params: dict, x: np.ndarray) -> np.ndarray:
    """Float logits ``(n, 10)`` of NHWC images ``x`` of shape ``(n, 8, 8, 1)``."""
    return _layers(params, np.asarray(x, dtype=np.float32))[-1]


def load_params(path: str | Path | None = None) -> dict[str, np.ndarray]:
    """The weights in ``path`` (default: the committed ``cnn_digits.npz``)."""
    with np.load(PARAMS_PATH if path is None else path) as f:
        return {name: f[name] for name in ("conv_w", "conv_b", "dense_w", "dense_b")}


def _grads(params: dict, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean cross-entropy plus the L2 penalty."""
    cols, relu, pooled, flat, logits = _layers(params, x)
    n = len(x)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(n), y] -= 1
    d_logits = p / n
    d_pooled = (d_logits @ params["dense_w"].T).reshape(pooled.shape)
    # Max pool: the gradient goes to the first maximum of each window only (ties are common: on
    # blank background every cell of a window is ReLU(bias)).
    n_, ph, pw, c = pooled.shape
    windows = relu.reshape(n_, ph, 2, pw, 2, c).transpose(0, 1, 3, 5, 2, 4).reshape(-1, 4)
    d_windows = np.zeros_like(windows)
    d_windows[np.arange(len(windows)), windows.argmax(axis=1)] = d_pooled.reshape(-1)
    d_relu = d_windows.reshape(n_, ph, pw, c, 2, 2).transpose(0, 1, 4, 2, 5, 3)
    d_conv = (d_relu.reshape(relu.shape) * (relu > 0)).reshape(-1, c)
    k = params["conv_w"]
    return {
        "conv_w": (cols.T @ d_conv).reshape(k.shape) + WEIGHT_DECAY * k,
        "conv_b": d_conv.sum(axis=0),
        "dense_w": flat.T @ d_logits + WEIGHT_DECAY * params["dense_w"],
        "dense_b": d_logits.sum(axis=0),
    }


def accuracy(params: dict, x: np.ndarray, y: np.ndarray) -> float:
    return float((cnn_forward(params, x).argmax(axis=1) == y).mean())


def train(seed: int = SEED, epochs: int = EPOCHS) -> dict[str, np.ndarray]:
    """Train on the digits training split: He-initialised weights, Adam, mini-batches."""
    rng = np.random.default_rng(seed)
    data = digits()
    params = {
        "conv_w": rng.normal(0, np.sqrt(2 / 9), (3, 3, 1, 8)),
        "conv_b": np.zeros(8),
        "dense_w": rng.normal(0, np.sqrt(2 / 128), (128, 10)),
        "dense_b": np.zeros(10),
    }
    params = {name: v.astype(np.float32) for name, v in params.items()}
    m = {name: np.zeros_like(v) for name, v in params.items()}
    v = {name: np.zeros_like(v) for name, v in params.items()}
    beta1, beta2, eps, t = 0.9, 0.999, 1e-8, 0
    for _ in range(epochs):
        order = rng.permutation(len(data.x_train))
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            grads = _grads(params, data.x_train[batch], data.y_train[batch])
            t += 1
            for name, g in grads.items():
                m[name] = beta1 * m[name] + (1 - beta1) * g
                v[name] = beta2 * v[name] + (1 - beta2) * g * g
                step = LR * (m[name] / (1 - beta1**t)) / (np.sqrt(v[name] / (1 - beta2**t)) + eps)
                params[name] = (params[name] - step).astype(np.float32)
    return params


def main() -> None:
    start = time.perf_counter()
    params = train()
    seconds = time.perf_counter() - start
    data = digits()
    np.savez_compressed(PARAMS_PATH, **params)
    conv_max = np.abs(_layers(params, data.x_train)[1]).max()
    print(f"seed {SEED}, {EPOCHS} epochs, {seconds:.1f} s")
    print(f"train accuracy {accuracy(params, data.x_train, data.y_train):.4f}")
    print(f"test accuracy  {accuracy(params, data.x_test, data.y_test):.4f}")
    print(f"max ReLU activation on the training split {conv_max:.2f}")
    print(f"wrote {PARAMS_PATH} ({PARAMS_PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
