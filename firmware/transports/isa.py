"""The ISA simulator as a device: fast functional runs, no notion of time."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from firmware.runtime import DeviceError, DeviceStatus, DeviceTimeout
from hdl.config import TPUConfig
from sim.isa_sim import IsaSim

__all__ = ["IsaSimDevice"]


class IsaSimDevice:
    """:class:`firmware.runtime.Device` backed by :class:`sim.isa_sim.IsaSim`.

    Beats are executed as they are sent. Counters that depend on timing come back as
    ``None`` (the ISA simulator cannot know them), and :meth:`cycles` is ``None``.
    """

    def __init__(self, config: TPUConfig, **options):
        if options:
            raise TypeError(f"the isa transport takes no options, got {', '.join(options)}")
        self.config = config
        self.sim = IsaSim(config)
        self._queue: deque[int] = deque()      # beats not consumed because of an error
        self._out = 0                           # output beats already received

    def send(self, beats: Sequence[int]) -> None:
        beats = [int(b) for b in beats]
        if self._queue:
            self._queue.extend(beats)
            return
        left = self.sim.feed(beats)
        if left:
            self._queue.extend(beats[len(beats) - left:])

    def receive(self, count: int, *, timeout_cycles: int | None = None) -> list[int]:
        available = len(self.sim.output) - self._out
        if available < count:
            status = self.status()
            if status.error:
                raise DeviceError(f"the core stopped after {available} of {count} beats",
                                  status)
            raise DeviceTimeout(f"the core sent {available} of {count} beats and waits for "
                                f"more input", status)
        out = self.sim.output[self._out:self._out + count]
        self._out += count
        return out

    def status(self) -> DeviceStatus:
        return DeviceStatus.from_bits(self.sim.status.as_bits())

    def clear(self) -> None:
        self._queue.clear()
        self.sim.clear()

    def reset(self) -> None:
        self._queue.clear()
        self._out = 0
        self.sim.reset()

    def cycles(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
