"""The digits Transformer's float model (firmware/models/transformer.py): the committed
weights, the forward pass against an independent per-image, per-head loop, and the trainer's
reproducibility."""

import functools
import importlib.util

import numpy as np
import pytest

from firmware.datasets import digits
from firmware.models import transformer as tf


@functools.cache
def committed():
    return tf.load_params(), digits()


def _loop_forward(p: dict, image: np.ndarray) -> np.ndarray:
    """One image, written out from the module notes with loops over heads, queries and keys
    (no einsum, no reshape tricks), in float64."""
    p = {k: v.astype(np.float64) for k, v in p.items()}

    def ln(x, g, b):
        out = np.empty_like(x)
        for t in range(len(x)):
            mu = sum(x[t]) / len(x[t])
            var = sum((v - mu) ** 2 for v in x[t]) / len(x[t])
            out[t] = (x[t] - mu) / np.sqrt(var + tf.LN_EPS) * g + b
        return out

    h = np.array([image[t, :, 0] @ p["embed_w"] + p["embed_b"] + p["pos"][t]
                  for t in range(tf.TOKENS)])
    for i in range(tf.LAYERS):
        a = ln(h, p[f"l{i}_ln1_g"], p[f"l{i}_ln1_b"])
        q, k, v = (a @ p[f"l{i}_{m}_w"] + p[f"l{i}_{m}_b"] for m in "qkv")
        heads = np.zeros((tf.TOKENS, tf.D_MODEL))
        for j in range(tf.HEADS):
            cols = slice(j * tf.D_HEAD, (j + 1) * tf.D_HEAD)
            for t in range(tf.TOKENS):
                s = np.array([q[t, cols] @ k[u, cols] for u in range(tf.TOKENS)])
                s /= np.sqrt(tf.D_HEAD)
                e = np.exp(s - s.max())
                w = e / e.sum()
                heads[t, cols] = sum(w[u] * v[u, cols] for u in range(tf.TOKENS))
        h = h + heads @ p[f"l{i}_o_w"] + p[f"l{i}_o_b"]
        a = ln(h, p[f"l{i}_ln2_g"], p[f"l{i}_ln2_b"])
        h = h + np.maximum(a @ p[f"l{i}_ff1_w"] + p[f"l{i}_ff1_b"], 0) @ p[f"l{i}_ff2_w"] \
            + p[f"l{i}_ff2_b"]
    h = ln(h, p["lnf_g"], p["lnf_b"])
    return h.mean(axis=0) @ p["cls_w"] + p["cls_b"]


def test_committed_weights_have_the_documented_shapes_and_accuracy():
    params, data = committed()
    assert {k: v.shape for k, v in params.items()} == tf.PARAM_SHAPES
    assert all(v.dtype == np.float32 for v in params.values())
    acc = tf.accuracy(params, data.x_test, data.y_test)
    print(f"float test accuracy {acc:.4f}")
    assert acc >= 0.95


def test_forward_matches_a_loop_over_heads_and_tokens():
    params, data = committed()
    images = data.x_test[:12]
    fast = tf.forward({k: v.astype(np.float64) for k, v in params.items()}, images)
    slow = np.array([_loop_forward(params, im) for im in images])
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-9)


def test_each_head_attends_to_its_own_columns():
    """Swapping the two heads' columns of q, k and v (and o's rows) leaves the logits alone;
    mixing one head's q with the other head's k changes them: the head split has teeth."""
    params, data = committed()
    p = {k: v.astype(np.float64) for k, v in params.items()}
    perm = np.r_[tf.D_HEAD:tf.D_MODEL, 0:tf.D_HEAD]
    swapped = dict(p)
    for m in "qkv":
        swapped[f"l0_{m}_w"], swapped[f"l0_{m}_b"] = p[f"l0_{m}_w"][:, perm], p[f"l0_{m}_b"][perm]
    swapped["l0_o_w"] = p["l0_o_w"][perm]
    x = data.x_test[:20]
    np.testing.assert_allclose(tf.forward(swapped, x), tf.forward(p, x), atol=1e-9)
    mixed = dict(p)
    mixed["l0_k_w"], mixed["l0_k_b"] = p["l0_k_w"][:, perm], p["l0_k_b"][perm]
    assert not np.allclose(tf.forward(mixed, x), tf.forward(p, x))


def test_bad_inputs_and_weight_files_are_refused(tmp_path):
    params, _ = committed()
    with pytest.raises(ValueError, match=r"images must be \(n, 8, 8"):
        tf.forward(params, np.zeros((2, 64)))
    bad = dict(params)
    bad["pos"] = np.zeros((7, tf.D_MODEL), np.float32)
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match=r"pos is \(7, 16\), expected \(8, 16\)"):
        tf.load_params(tmp_path / "bad.npz")
    del bad["pos"]
    np.savez(tmp_path / "missing.npz", **bad)
    with pytest.raises(ValueError, match=r"missing \['pos'\]"):
        tf.load_params(tmp_path / "missing.npz")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("autograd") is None,
                    reason="retraining needs autograd (the dev extra)")
def test_training_reproduces_the_committed_weights(tmp_path):
    """The trainer with its fixed seed rewrites the committed weights (same machine class:
    BLAS may differ elsewhere, so the accuracy is checked too)."""
    params = tf.train()
    committed_params, data = committed()
    print(f"retrained test accuracy {tf.accuracy(params, data.x_test, data.y_test):.4f}")
    assert tf.accuracy(params, data.x_test, data.y_test) >= 0.95
    assert all(np.allclose(params[k], committed_params[k], atol=1e-4) for k in params)
