"""A small Transformer encoder for the 8x8 digits: the float model and its trainer.

Its float weights are committed in ``transformer_digits.npz``; the float forward pass here
needs numpy only. Retraining (``python -m firmware.models.transformer``) needs ``autograd``
(the ``dev`` extra) and rewrites the .npz next to this module: fixed seed, deterministic for
a given machine's BLAS, a minute or two on two cores.

Network (the quantiser and the integer reference follow these conventions exactly):

- The image ``(n, 8, 8, 1)``, float in [0, 1] (:func:`firmware.datasets.digits`), read as
  :data:`TOKENS` tokens of :data:`TOKEN_DIM` pixels: token ``t`` is image row ``t``.
- Embedding: ``h = tokens @ embed_w + embed_b + pos``, ``embed_w`` ``(8, D)``, ``pos``
  ``(T, D)`` a learned position embedding; ``D`` = :data:`D_MODEL`.
- :data:`LAYERS` pre-norm encoder layers, each::

      a = LayerNorm(h);  h = h + MultiHeadAttention(a)
      a = LayerNorm(h);  h = h + relu(a @ ff1_w + ff1_b) @ ff2_w + ff2_b

  LayerNorm over the last axis with a learned scale and offset, ``eps`` = :data:`LN_EPS`.
  Attention has :data:`HEADS` heads of :data:`D_HEAD` = ``D / HEADS``: ``q = a @ q_w + q_b``
  (and ``k``, ``v`` likewise), head ``j`` the columns ``j * D_HEAD .. (j + 1) * D_HEAD``;
  ``p = softmax(q_j @ k_j.T / sqrt(D_HEAD))`` over the last axis (keys); the heads'
  ``p @ v_j`` side by side, then ``@ o_w + o_b``.
- A final LayerNorm, the mean over the tokens, then ``@ cls_w + cls_b``: the logits.

Arrays in the .npz (float32): ``embed_w``, ``embed_b``, ``pos``; per layer ``i``:
``l{i}_ln1_g``, ``l{i}_ln1_b``, ``l{i}_q_w``, ``l{i}_q_b``, ``l{i}_k_w``, ``l{i}_k_b``,
``l{i}_v_w``, ``l{i}_v_b``, ``l{i}_o_w``, ``l{i}_o_b``, ``l{i}_ln2_g``, ``l{i}_ln2_b``,
``l{i}_ff1_w``, ``l{i}_ff1_b``, ``l{i}_ff2_w``, ``l{i}_ff2_b``; then ``lnf_g``, ``lnf_b``,
``cls_w``, ``cls_b``. Weights are ``(in, out)``: ``y = x @ w + b``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from firmware.datasets import digits

__all__ = ["SEED", "PARAMS_PATH", "TOKENS", "TOKEN_DIM", "D_MODEL", "HEADS", "D_HEAD", "D_FF",
           "LAYERS", "CLASSES", "LN_EPS", "PARAM_SHAPES", "tokens", "forward", "load_params",
           "accuracy", "train"]

#: Seed of the initialisation and of the mini-batch order.
SEED = 0
#: The committed weights.
PARAMS_PATH = Path(__file__).with_name("transformer_digits.npz")

TOKENS = 8        # image rows
TOKEN_DIM = 8     # pixels a row
D_MODEL = 16
HEADS = 2
D_HEAD = D_MODEL // HEADS
D_FF = 32
LAYERS = 1
CLASSES = 10
LN_EPS = 1e-5

EPOCHS = 60
BATCH = 32
LR = 3e-3
WEIGHT_DECAY = 1e-4   # decoupled (AdamW) on the weight matrices, not the biases or LN


def _layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    d, f = D_MODEL, D_FF
    return {
        f"l{i}_ln1_g": (d,), f"l{i}_ln1_b": (d,),
        f"l{i}_q_w": (d, d), f"l{i}_q_b": (d,), f"l{i}_k_w": (d, d), f"l{i}_k_b": (d,),
        f"l{i}_v_w": (d, d), f"l{i}_v_b": (d,), f"l{i}_o_w": (d, d), f"l{i}_o_b": (d,),
        f"l{i}_ln2_g": (d,), f"l{i}_ln2_b": (d,),
        f"l{i}_ff1_w": (d, f), f"l{i}_ff1_b": (f,), f"l{i}_ff2_w": (f, d),
        f"l{i}_ff2_b": (d,),
    }


#: Every parameter's name and shape, in the .npz's order.
PARAM_SHAPES: dict[str, tuple[int, ...]] = {
    "embed_w": (TOKEN_DIM, D_MODEL), "embed_b": (D_MODEL,), "pos": (TOKENS, D_MODEL),
    **{k: v for i in range(LAYERS) for k, v in _layer_shapes(i).items()},
    "lnf_g": (D_MODEL,), "lnf_b": (D_MODEL,),
    "cls_w": (D_MODEL, CLASSES), "cls_b": (CLASSES,),
}


def tokens(x: np.ndarray) -> np.ndarray:
    """Images ``(n, 8, 8, 1)`` (or ``(n, 8, 8)``) as ``(n, TOKENS, TOKEN_DIM)`` tokens."""
    x = np.asarray(x)
    if x.shape[1:] not in ((TOKENS, TOKEN_DIM, 1), (TOKENS, TOKEN_DIM)):
        raise ValueError(f"images must be (n, {TOKENS}, {TOKEN_DIM}[, 1]), got {x.shape}")
    return x.reshape(len(x), TOKENS, TOKEN_DIM)


def _layer_norm(xp, x, g, b):
    mean = xp.mean(x, axis=-1, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / xp.sqrt(var + LN_EPS) * g + b


def _softmax(xp, s):
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def _attention(xp, p, i: int, a):
    n = a.shape[0]

    def heads(w, b):     # (n, T, D) -> (n, H, T, D_HEAD)
        return xp.transpose(xp.reshape(a @ p[w] + p[b], (n, TOKENS, HEADS, D_HEAD)),
                            (0, 2, 1, 3))
    q, k, v = (heads(f"l{i}_{m}_w", f"l{i}_{m}_b") for m in "qkv")
    scores = xp.einsum("nhtd,nhsd->nhts", q, k) / np.sqrt(D_HEAD)
    out = xp.einsum("nhts,nhsd->nhtd", _softmax(xp, scores), v)
    out = xp.reshape(xp.transpose(out, (0, 2, 1, 3)), (n, TOKENS, D_MODEL))
    return out @ p[f"l{i}_o_w"] + p[f"l{i}_o_b"]


def forward(params: dict, x: np.ndarray, xp=np) -> np.ndarray:
    """Float logits ``(n, CLASSES)`` of images ``x`` (see the module notes). ``xp`` is the
    array module (numpy, or autograd's numpy while training)."""
    p = params
    h = tokens(x) @ p["embed_w"] + p["embed_b"] + p["pos"]
    for i in range(LAYERS):
        h = h + _attention(xp, p, i, _layer_norm(xp, h, p[f"l{i}_ln1_g"], p[f"l{i}_ln1_b"]))
        a = _layer_norm(xp, h, p[f"l{i}_ln2_g"], p[f"l{i}_ln2_b"])
        ff = xp.maximum(a @ p[f"l{i}_ff1_w"] + p[f"l{i}_ff1_b"], 0)
        h = h + ff @ p[f"l{i}_ff2_w"] + p[f"l{i}_ff2_b"]
    h = _layer_norm(xp, h, p["lnf_g"], p["lnf_b"])
    return xp.mean(h, axis=1) @ p["cls_w"] + p["cls_b"]


def load_params(path: str | Path | None = None) -> dict[str, np.ndarray]:
    """The weights in ``path`` (default: the committed ``transformer_digits.npz``), checked
    against :data:`PARAM_SHAPES`."""
    with np.load(PARAMS_PATH if path is None else path) as f:
        params = {name: f[name] for name in f.files}
    missing = sorted(set(PARAM_SHAPES) - set(params))
    extra = sorted(set(params) - set(PARAM_SHAPES))
    if missing or extra:
        raise ValueError(f"transformer weights: missing {missing}, unexpected {extra}")
    for name, shape in PARAM_SHAPES.items():
        if params[name].shape != shape:
            raise ValueError(f"transformer weight {name} is {params[name].shape}, "
                             f"expected {shape}")
    return params


def accuracy(params: dict, x: np.ndarray, y: np.ndarray) -> float:
    return float((forward(params, x).argmax(axis=1) == y).mean())


def _init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    params = {}
    for name, shape in PARAM_SHAPES.items():
        if name.endswith("_g"):
            params[name] = np.ones(shape)
        elif name == "pos":
            params[name] = rng.normal(0, 0.1, shape)
        elif len(shape) == 2:   # Glorot-uniform weight matrices
            lim = np.sqrt(6 / sum(shape))
            params[name] = rng.uniform(-lim, lim, shape)
        else:
            params[name] = np.zeros(shape)
    return params


def train(seed: int = SEED, epochs: int = EPOCHS, log=None) -> dict[str, np.ndarray]:
    """Train on the digits training split: AdamW on mini-batches, cosine learning-rate
    decay. Needs ``autograd`` (the ``dev`` extra)."""
    try:
        import autograd.numpy as anp
        from autograd import grad
    except ImportError as e:     # pragma: no cover - depends on the environment
        raise RuntimeError("training the transformer needs autograd: pip install -e '.[dev]'"
                           ) from e
    rng = np.random.default_rng(seed)
    data = digits()
    x_train = tokens(data.x_train).astype(np.float64)
    params = _init(rng)

    def loss(p, x, y):
        logits = forward(p, x, xp=anp)
        logits = logits - anp.max(logits, axis=1, keepdims=True)
        logp = logits - anp.log(anp.sum(anp.exp(logits), axis=1, keepdims=True))
        return -anp.mean(logp[np.arange(len(y)), y])

    g_loss = grad(loss)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    beta1, beta2, eps, t = 0.9, 0.999, 1e-8, 0
    steps = epochs * -(-len(x_train) // BATCH)
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            grads = g_loss(params, x_train[batch], data.y_train[batch])
            t += 1
            lr = LR * 0.5 * (1 + np.cos(np.pi * (t - 1) / steps))
            for k, g in grads.items():
                m[k] = beta1 * m[k] + (1 - beta1) * g
                v[k] = beta2 * v[k] + (1 - beta2) * g * g
                step = (m[k] / (1 - beta1 ** t)) / (np.sqrt(v[k] / (1 - beta2 ** t)) + eps)
                decay = WEIGHT_DECAY * params[k] if params[k].ndim == 2 else 0
                params[k] = params[k] - lr * (step + decay)
        if log is not None and (epoch + 1) % 10 == 0:
            log(f"epoch {epoch + 1}: train {accuracy(params, data.x_train, data.y_train):.4f} "
                f"test {accuracy(params, data.x_test, data.y_test):.4f}")
    return {k: v.astype(np.float32) for k, v in params.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else PARAMS_PATH
    t0 = time.perf_counter()
    params = train(log=print)
    np.savez(out, **params)
    data = digits()
    print(f"wrote {out}: test accuracy {accuracy(params, data.x_test, data.y_test):.4f} "
          f"({time.perf_counter() - t0:.0f} s, seed {SEED})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
