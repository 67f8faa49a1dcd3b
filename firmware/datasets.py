"""Data sets the demo and the tests use, bundled with their packages (no download).

:func:`digits` is scikit-learn's copy of the UCI handwritten digits: 1,797 images of 8x8
pixels with values 0 to 16, ten classes. The split is the usual stratified 80/20 with a
fixed seed: 1,437 training and 360 test images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Split", "digits", "DIGITS_SEED"]

#: Seed of the train/test split (fixed, so every run and every model sees the same split).
DIGITS_SEED = 0


@dataclass(frozen=True)
class Split:
    """Images as float32 in [0, 1], shape ``(n, 8, 8, 1)`` (height, width, channels), and
    labels 0..9."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits() -> Split:
    """The digits split (pixel values divided by 16)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=DIGITS_SEED)
    return Split(x_train, y_train, x_test, y_test)
