"""The two tiers of the suite: ``make test`` (``-m "not slow and not soak"``: every block,
pipeline, transport, importer and proof in a short form, the hardest seeds and the extremes)
and ``make regression`` (``-m "slow and not soak"``: the rest of every test, many seeds and
shapes, the large configurations, every variant, a share of the volume sized for CI). Behind
them ``make soak`` (``-m soak``) runs the deep volume: the random programs, stacks and blocks
past the regression's share, with the seeds after its own.

:func:`tiered` keeps a few parameter values of a test in the fast tier and marks the rest
``slow``, so that a test's volume moves to the regression without leaving its file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import pytest

__all__ = ["SOAK", "grouped", "group_tests", "tiered"]

#: The marks of a soak run's parameters (``make soak``; ``slow`` too, so no selection of the
#: fast tier by ``not slow`` alone picks them).
SOAK = (pytest.mark.slow, pytest.mark.soak)


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


def grouped(groups: dict[str, list[str]]) -> list:
    """A bench's test groups (each a list of its cocotb tests) as parameter values: ``"all"``,
    every group in one simulator run (a start costs one to two seconds), in ``make test``;
    each group alone, spread over the workers, in ``make regression``."""
    if "all" in groups or len(groups) < 2:
        raise ValueError(f"grouped: groups {list(groups)} need no merging, or name one 'all'")
    return ["all", *(pytest.param(group, marks=pytest.mark.slow) for group in groups)]


def group_tests(groups: dict[str, list[str]], group: str) -> list[str]:
    """The cocotb tests of *group* (:func:`grouped`'s ``"all"``: every group's)."""
    return [test for tests in groups.values() for test in tests] if group == "all" \
        else groups[group]
