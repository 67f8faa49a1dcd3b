"""In-order scoreboard: expected rows from the golden model, received rows from a monitor."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

__all__ = ["ScoreboardError", "Scoreboard"]


class ScoreboardError(AssertionError):
    """A received row differs from the expected one, or a row is missing or extra."""


class Scoreboard:
    """Compares received rows with expected rows, in order, with ``==``.

    Expected rows (numpy arrays from ``sim.models.golden``) are queued with :meth:`expect`;
    :meth:`receive` (a :class:`~sim.rtl.streams.StreamMonitor` callback) compares each arriving
    row with the oldest expected one and raises :class:`ScoreboardError` at the first
    mismatch or at a row nobody expected. :meth:`check_done` then asserts that every
    expected row has arrived. Every message names the row index and the test's seed.
    """

    def __init__(self, name: str, seed: int | None = None, log=None):
        self.name = name
        self.seed = seed
        self.log = log
        self.expected: deque[np.ndarray | None] = deque()
        self.matched = 0
        self.errors: list[str] = []

    def _fail(self, message: str):
        message = f"{self.name}: {message} (seed {self.seed})"
        self.errors.append(message)
        if self.log is not None:
            self.log.error(message)
        raise ScoreboardError(message)

    def expect(self, row: Any) -> None:
        self.expected.append(np.asarray(row, dtype=np.int64))

    def expect_undefined(self) -> None:
        """A row whose contents the design leaves undefined (a block RAM read that meets a
        write to its row, say): it must arrive, in its place, but any value matches."""
        self.expected.append(None)

    def receive(self, row: Any) -> None:
        got = np.asarray(row, dtype=np.int64)
        index = self.matched
        if not self.expected:
            self._fail(f"row {index}: got {got.tolist()}, expected no more rows")
        want = self.expected.popleft()
        if want is None:
            self.matched += 1
            return
        if got.shape != want.shape or not np.array_equal(got, want):
            self._fail(f"row {index}: expected {want.tolist()}, got {got.tolist()}")
        self.matched += 1

    @property
    def outstanding(self) -> int:
        return len(self.expected)

    def check_done(self) -> None:
        """Assert no row is missing and no mismatch was seen (also one swallowed elsewhere)."""
        if self.errors:
            raise ScoreboardError(self.errors[0])
        if self.expected:
            self._fail(f"{len(self.expected)} rows missing after {self.matched} matched; "
                       f"next expected {self.expected[0].tolist()}")
