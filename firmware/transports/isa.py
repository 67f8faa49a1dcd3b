"""The ISA simulator as a device: fast functional runs, no notion of time."""

from __future__ import annotations

from collections.abc import Sequence

from firmware.device import DeviceError, DeviceStatus, DeviceTimeout, register_transport
from hdl.config import TPUConfig
from sim.models.isa_sim import IsaSim, error_beat

__all__ = ["IsaSimDevice"]


class IsaSimDevice:
    """:class:`firmware.device.Device` backed by :class:`sim.models.isa_sim.IsaSim`.

    Beats are executed as they are sent. Counters that depend on timing come back as
    ``None`` (the ISA simulator cannot know them), and :meth:`cycles` is ``None``.
    """

    def __init__(self, config: TPUConfig, **options):
        if options:
            raise TypeError(f"the isa transport takes no options, got {', '.join(options)}")
        self.config = config
        self.sim = IsaSim(config)
        self._out = 0                           # output beats already received

    def send(self, beats: Sequence[int]) -> None:
        # After an error the core discards beats until the resynchronisation word.
        self.sim.feed([int(b) for b in beats])

    def receive(self, count: int, *, timeout_cycles: int | None = None) -> list[int]:
        available = self.sim.output[self._out:]
        status = self.status()
        if status.error:
            beat = error_beat(status.code, status.instr_index)
            if beat in available[:count]:
                stop = available.index(beat)
                raise DeviceError(f"the core stopped after {stop} of {count} beats", status)
        if len(available) < count:
            raise DeviceTimeout(f"the core sent {len(available)} of {count} beats and waits "
                                f"for more input", status)
        self._out += count
        return available[:count]

    def status(self) -> DeviceStatus:
        return DeviceStatus.from_bits(self.sim.status.as_bits())

    def clear(self) -> None:
        self.sim.clear()
        self._out = len(self.sim.output)        # beats not received are dropped

    def reset(self) -> None:
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


register_transport("isa", IsaSimDevice)
