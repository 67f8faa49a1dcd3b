"""Host runtime: the :class:`Device` protocol every transport implements, and running
programs and compiled networks on a device.

A device is a core reached through its host stream: :meth:`Device.send` queues beats for the
core's input, :meth:`Device.receive` blocks until the core has sent a number of beats back.
Transports (:mod:`firmware.transports`):

- ``isa``: :class:`firmware.transports.isa.IsaSimDevice`, the ISA simulator in process (fast,
  functional, timing-dependent counters unknown);
- ``rtl``: :class:`firmware.transports.rtl.RtlDevice`, the RTL core under cocotb (Icarus or
  Verilator), cycle-accurate, with the hardware's own counters;
- ``serial``: :class:`firmware.transports.serial.SerialDevice`, a board over its UART (the
  frame protocol of :mod:`hdl.link.protocol`, docs/host-link.md).

On top of any device, :func:`run_program` runs one program (beats in, the program's output
beats out) and :func:`run` runs a compiled network over a batch of inputs, returning the
outputs and the core's performance counters over the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from amaranth.lib import data

import hdl.beats
from hdl import isa
from hdl.config import TPUConfig

__all__ = ["DeviceStatus", "DeviceError", "DeviceTimeout", "Device", "open_device",
           "TRANSPORTS", "run_program", "RunResult", "run", "counter_beats_program",
           "decode_counters", "done_beat"]

_STATUS = data.Layout.cast(isa.Status)

#: Names accepted by :func:`open_device`.
TRANSPORTS = ("isa", "rtl", "serial")


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


def open_device(transport: str, config: TPUConfig, **options) -> Device:
    """A device of the named transport: ``isa``, ``rtl`` (options: ``sim``, ``waves``,
    ``label``) or ``serial`` (options: ``port``, ``baudrate``, ``timeout_s``, ``retries``)."""
    if transport == "isa":
        from firmware.transports.isa import IsaSimDevice
        return IsaSimDevice(config, **options)
    if transport == "rtl":
        from firmware.transports.rtl import RtlDevice
        return RtlDevice(config, **options)
    if transport == "serial":
        from firmware.transports.serial import SerialDevice
        return SerialDevice(config, **options)
    raise ValueError(f"transport {transport!r} is not supported; allowed: "
                     f"{', '.join(TRANSPORTS)}")


def done_beat(instructions: int) -> int:
    """The beat HALT sends for a program of ``instructions`` instructions."""
    return hdl.beats.done_beat(instructions)


def run_program(device: Device, beats: Sequence[int], output_beats: int, *,
                instructions: int | None = None,
                timeout_cycles: int | None = None) -> list[int]:
    """Send one program and return the ``output_beats`` beats it answers with (the DONE beat
    last). With ``instructions``, the DONE beat is checked against it."""
    device.send(beats)
    out = device.receive(output_beats, timeout_cycles=timeout_cycles)
    if instructions is not None and out[-1] != done_beat(instructions):
        raise DeviceError(f"the program's last beat {out[-1]:#x} is not its DONE beat "
                          f"{done_beat(instructions):#x}", device.status())
    return out


def counter_beats_program() -> tuple[list[int], int]:
    """The program ``READ_COUNTERS; HALT`` and how many beats it answers with."""
    from firmware.asm import encode
    beats = [encode(isa.Opcode.READ_COUNTERS), encode(isa.Opcode.HALT)]
    return beats, len(isa.COUNTERS) + 1


def decode_counters(beats: Sequence[int | None]) -> dict[str, int | None]:
    """The counters from the beats READ_COUNTERS sends (``None`` stays ``None``)."""
    if len(beats) != len(isa.COUNTERS):
        raise ValueError(f"expected {len(isa.COUNTERS)} counter beats, got {len(beats)}")
    return {name: None if value is None else int(value)
            for name, value in zip(isa.COUNTERS, beats, strict=True)}


class Executable(Protocol):
    """What :func:`run` needs from a compiled network (see :mod:`firmware.compiler`)."""

    config: TPUConfig

    def setup_program(self) -> tuple[list[int], int]:
        """Beats that load what stays resident (weights, parameters), and their output
        beat count."""

    def batches(self, inputs: np.ndarray) -> Iterable[Batch]:
        """The per-batch programs for ``inputs`` (already quantised)."""


@dataclass
class Batch:
    """One program of a compiled network: its beats, how many beats it answers with, and
    how to turn those into the batch's outputs."""
    beats: list[int]
    output_beats: int
    instructions: int
    images: int
    decode: Callable[[list[int]], np.ndarray]


@dataclass
class RunResult:
    """Outputs and measurements of :func:`run`."""
    outputs: np.ndarray
    counters: dict[str, int | None] = field(default_factory=dict)
    cycles: int | None = None         # core cycles the device simulated for the run
    images: int = 0

    @property
    def cycles_per_image(self) -> float | None:
        c = self.counters.get("cycles")
        return None if c is None or not self.images else c / self.images


def run(device: Device, executable: Executable, inputs: np.ndarray, *,
        progress: Callable[[int], None] | None = None) -> RunResult:
    """Run ``executable`` over quantised ``inputs`` on ``device``.

    Loads the resident state (setup program), clears the counters, runs every batch program
    and reads the counters at the end, so they cover exactly the batches. ``progress`` is
    called with the images each batch completed. Raises :class:`DeviceError` when the core
    stops or a program's DONE beat is wrong.
    """
    from firmware.asm import encode

    setup, setup_out = executable.setup_program()
    if setup:
        run_program(device, setup, setup_out)
    run_program(device, [encode(isa.Opcode.CLEAR_COUNTERS), encode(isa.Opcode.HALT)], 1,
                instructions=2)
    start = device.cycles()
    outputs = []
    images = 0
    for batch in executable.batches(inputs):
        out = run_program(device, batch.beats, batch.output_beats,
                          instructions=batch.instructions)
        outputs.append(batch.decode(out))
        images += batch.images
        if progress is not None:
            progress(batch.images)
    beats, n = counter_beats_program()
    out = run_program(device, beats, n)
    counters = decode_counters(out[:-1])
    end = device.cycles()
    cycles = None if start is None or end is None else end - start
    result = np.concatenate(outputs) if outputs else np.zeros((0,), dtype=np.int64)
    return RunResult(outputs=result, counters=counters, cycles=cycles, images=images)
