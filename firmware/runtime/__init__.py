"""Host runtime: running programs and compiled networks on a device.

A device is anything implementing :class:`firmware.device.Device` (open one by transport
name with :func:`firmware.device.open_device`). On top of any device, :func:`run_program`
runs one program (beats in, the program's output beats out) and :func:`run` runs a compiled
network over a batch of inputs, returning the outputs and the core's performance counters over
the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

import hdl.beats
from firmware.device import Device, DeviceError
from hdl import isa
from hdl.config import TPUConfig

__all__ = ["run_program", "RunResult", "run", "check_config", "counter_beats_program",
           "decode_counters", "done_beat", "Executable", "Batch"]


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
        last = "no beat" if not out else "a counter beat" if out[-1] is None else \
            f"{out[-1]:#x}"
        raise DeviceError(f"the program's last beat ({last}) is not its DONE beat "
                          f"{done_beat(instructions):#x}", device.status())
    return out


def check_config(device: Device, executable: Executable) -> None:
    """Raise :class:`DeviceError` unless ``device`` is built for the configuration
    ``executable`` was compiled for, naming the fields that differ."""
    want, have = executable.config, device.config
    if want == have:
        return
    fields = [f"{name}: compiled for {value!r}, device {getattr(have, name)!r}"
              for name, value in want.to_dict().items() if getattr(have, name) != value]
    raise DeviceError(f"the program was compiled for the {want.name} configuration, but the "
                      f"device is a {have.name} core ({'; '.join(fields)}); compile it for "
                      f"the device's configuration")


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
    stops or a program's DONE beat is wrong, and before anything is sent when the device's
    configuration is not the one the network was compiled for.
    """
    from firmware.asm import encode

    check_config(device, executable)
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
