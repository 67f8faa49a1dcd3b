"""The two tiers of the suite: ``make test`` (``-m "not slow"``, about five minutes on two
cores, every block, pipeline, transport, importer and proof in a short form, the hardest seeds
and the extremes) and ``make regression`` (``-m slow``: the volume, many seeds and shapes,
the large configurations, every variant).

:func:`tiered` keeps a few parameter values of a test in the fast tier and marks the rest
``slow``, so that a test's volume moves to the regression without leaving its file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import pytest

__all__ = ["tiered"]


def tiered(values: Iterable, fast: Collection) -> list:
    """*values* as ``pytest.parametrize`` values, each not in *fast* marked ``slow`` (a
    tuple is one parameter set of several arguments, with the same id as unmarked)."""
    values = list(values)
    missing = [v for v in fast if v not in values]
    if missing:
        raise ValueError(f"tiered: {missing} are not among the values {values}")
    return [v if v in fast else
            pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for v in values]
