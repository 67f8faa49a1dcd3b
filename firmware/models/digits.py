"""The demo's networks for the bundled 8x8 digits, as :class:`firmware.nn.Network` graphs.

- ``mlp``: a 3-layer MLP, 64 -> 32 -> 16 -> 10 with ReLU, trained with scikit-learn's
  ``MLPClassifier`` on the training split when asked for (about a second; fixed seed).
- ``cnn``: Conv2D 3x3 (1 -> 8, 'same') -> ReLU -> MaxPool 2x2 -> Flatten -> Dense 128 -> 10,
  trained by :mod:`firmware.models.train_cnn` (numpy); its float weights are committed in
  ``cnn_digits.npz``.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np

from firmware import nn
from firmware.datasets import Split, digits

__all__ = ["NETWORKS", "MLP_HIDDEN", "MLP_SEED", "mlp", "cnn", "build"]

NETWORKS = ("mlp", "cnn")
MLP_HIDDEN = (32, 16)
MLP_SEED = 0


#: Trained MLPs by their training data's digest: training takes a second or more, and a
#: process (a test worker, the report) asks for the same one many times.
_TRAINED: dict[str, nn.Network] = {}


def mlp(split: Split | None = None) -> nn.Network:
    """Train the MLP on the digits training split (deterministic for a given machine's BLAS;
    kept for the process, so a second call with the same data returns the same network)."""
    split = split if split is not None else digits()
    x = split.x_train.reshape(len(split.x_train), -1)
    key = hashlib.sha256(np.ascontiguousarray(x, dtype=np.float64).tobytes() +
                         np.asarray(split.y_train, dtype=np.int64).tobytes()).hexdigest()
    if key not in _TRAINED:
        _TRAINED[key] = _train_mlp(split, x)
    return _TRAINED[key]


def _train_mlp(split: Split, x: np.ndarray) -> nn.Network:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    model = MLPClassifier(hidden_layer_sizes=MLP_HIDDEN, max_iter=400, random_state=MLP_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, split.y_train)
    layers: list = [nn.Flatten()]
    for i, (weight, bias) in enumerate(zip(model.coefs_, model.intercepts_, strict=True)):
        layers.append(nn.Dense(weight, bias))
        if i < len(model.coefs_) - 1:
            layers.append(nn.ReLU())
    return nn.Network(split.x_train.shape[1:], layers, name="mlp")


def cnn(params: dict[str, np.ndarray] | None = None) -> nn.Network:
    """The CNN with the committed weights (or ``params`` of the same names)."""
    from firmware.models.train_cnn import load_params

    p = params if params is not None else load_params()
    return nn.Network((8, 8, 1), [
        nn.Conv2D(p["conv_w"], p["conv_b"], padding="same"), nn.ReLU(), nn.MaxPool2D(),
        nn.Flatten(), nn.Dense(p["dense_w"], p["dense_b"]),
    ], name="cnn")


def build(name: str, split: Split | None = None) -> nn.Network:
    """The network called ``name`` (one of :data:`NETWORKS`)."""
    if name == "mlp":
        return mlp(split)
    if name == "cnn":
        return cnn()
    raise ValueError(f"unknown network {name!r}; allowed: {', '.join(NETWORKS)}")
