"""The :class:`Device` protocol every transport implements, its errors and status, and the
registry that opens a transport by name.

A device is a core reached through its host stream: :meth:`Device.send` queues beats for the
core's input, :meth:`Device.receive` blocks until the core has sent a number of beats back.
Transports are the modules of :mod:`firmware.transports`, each registering itself under its
module's name (:func:`register_transport`):

- ``isa``: :class:`firmware.transports.isa.IsaSimDevice`, the ISA simulator in process (fast,
  functional, timing-dependent counters unknown);
- ``rtl``: :class:`firmware.transports.rtl.RtlDevice`, the RTL core under cocotb (Icarus or
  Verilator), cycle-accurate, with the hardware's own counters;
- ``serial``: :class:`firmware.transports.serial.SerialDevice`, a board over its UART (the
  frame protocol of :mod:`hdl.link.protocol`, docs/host-link.md).

This module imports no transport: :func:`open_device` imports the one it is asked for, by
name, so a transport's dependencies (cocotb, pyserial) load only when it is used, and the
transports and :mod:`firmware.runtime` can both import this module without a circle.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from amaranth.lib import data

from hdl import isa
from hdl.config import TPUConfig

__all__ = ["DeviceStatus", "DeviceError", "DeviceTimeout", "Device", "register_transport",
           "transport_options",
           "transport_names", "open_device"]

_STATUS = data.Layout.cast(isa.Status)

#: The package whose modules are the transports.
TRANSPORT_PACKAGE = "firmware.transports"

#: Transport name -> opener (``opener(config, **options)`` gives a :class:`Device`), filled
#: by each transport module as it is imported.
_OPENERS: dict[str, Callable[..., Device]] = {}


@dataclass(frozen=True)
class DeviceStatus:
    """The core's status word (:class:`hdl.isa.Status`), decoded."""
    error: bool
    code: isa.ErrorCode
    instr_index: int
    halted: bool

    @classmethod
    def from_bits(cls, bits: int) -> DeviceStatus:
        view = _STATUS.from_bits(int(bits))
        code_field = _STATUS["code"]
        code_value = (int(bits) >> code_field.offset) & ((1 << code_field.width) - 1)
        try:
            code = isa.ErrorCode(code_value)
        except ValueError:          # a code no ErrorCode names: keep the number
            code = code_value
        return cls(error=bool(int(view.error)), code=code,
                   instr_index=int(view.instr_index), halted=bool(int(view.halted)))

    def __str__(self) -> str:
        code = self.code.name if isinstance(self.code, isa.ErrorCode) else self.code
        state = f"error {code}" if self.error else "no error"
        return f"{state} at instruction {self.instr_index}" + (", halted" if self.halted else "")


class DeviceError(RuntimeError):
    """The core stopped with an error (``status`` says which and where), or the device
    cannot go on (a program that waits for beats the host never sends)."""

    def __init__(self, message: str, status: DeviceStatus | None = None):
        super().__init__(message if status is None else f"{message}: {status}")
        self.status = status


class DeviceTimeout(DeviceError):
    """The core sent fewer beats than asked for within the time allowed (a hang)."""


@runtime_checkable
class Device(Protocol):
    """A core reached through its host stream.

    Attributes
    ----------
    config : TPUConfig
        The core's configuration.
    """

    config: TPUConfig

    def send(self, beats: Sequence[int]) -> None:
        """Queue ``beats`` (instructions and data beats, ``host_width`` bits each) for the
        core's input stream, in order. Returns without waiting for the core to take them."""

    def receive(self, count: int, *, timeout_cycles: int | None = None) -> list[int]:
        """Block until the core has sent ``count`` more beats and return them, oldest first.
        Raises :class:`DeviceError` if the core stops with an error first, and
        :class:`DeviceTimeout` if they do not arrive within ``timeout_cycles`` core cycles
        (when ``None``, a default of the transport's: the RTL transport's counts cycles
        with no beat in or out, the serial one's scales with the beats sent)."""

    def status(self) -> DeviceStatus:
        """The core's status now."""

    def clear(self) -> None:
        """The out-of-band clear (``i_clear``): clears a pending error (without one it
        changes nothing in the core); beats still queued for the core and beats the core
        sent that were not received (the error beat among them) are dropped, and the next
        beat sent starts a new program."""

    def reset(self) -> None:
        """Reset the core (``rst``); queued beats are dropped."""

    def cycles(self) -> int | None:
        """Core clock cycles simulated so far (``None`` where there is no notion of time)."""

    def close(self) -> None:
        """Release the device (stop the simulator)."""


def register_transport(name: str, opener: Callable[..., Device]) -> None:
    """Make :func:`open_device` open transport ``name`` with ``opener(config, **options)``.

    Each module of :mod:`firmware.transports` calls this once, at import, with its module's
    name (that is how :func:`open_device` finds the module to import)."""
    _OPENERS[name] = opener


def transport_names() -> tuple[str, ...]:
    """The transports :func:`open_device` accepts, sorted: the modules of
    :mod:`firmware.transports`, listed without importing them."""
    spec = importlib.util.find_spec(TRANSPORT_PACKAGE)
    assert spec is not None and spec.submodule_search_locations is not None
    return tuple(sorted(module.name for module in
                        pkgutil.iter_modules(spec.submodule_search_locations)
                        if not module.name.startswith("_")))


def transport_options(transport: str, *, sim: str | None = None, waves: bool = False,
                      port: str | None = None, baudrate: int | None = None) -> dict:
    """The :func:`open_device` options a command line's settings give *transport*: ``sim``
    and ``waves`` for ``rtl``, ``port`` and ``baudrate`` for ``serial`` (those given), none
    for ``isa``."""
    if transport == "rtl":
        return {"sim": sim, "waves": waves} if sim is not None else {"waves": waves}
    if transport == "serial":
        given = {"port": port, "baudrate": baudrate}
        return {key: value for key, value in given.items() if value is not None}
    return {}


def open_device(transport: str, config: TPUConfig, **options) -> Device:
    """A device of the named transport: ``isa``, ``rtl`` (options: ``sim``, ``waves``,
    ``label``) or ``serial`` (options: ``port``, ``baudrate``, ``timeout_s``, ``retries``).

    Imports the transport's module if it is not yet. Raises :class:`ValueError` for a name
    that is no transport."""
    allowed = transport_names()
    if transport not in allowed:
        raise ValueError(f"transport {transport!r} is not supported; allowed: "
                         f"{', '.join(allowed)}")
    if transport not in _OPENERS:
        importlib.import_module(f"{TRANSPORT_PACKAGE}.{transport}")
    if transport not in _OPENERS:
        raise RuntimeError(f"{TRANSPORT_PACKAGE}.{transport} registers no transport named "
                           f"{transport!r} (register_transport)")
    return _OPENERS[transport](config, **options)
