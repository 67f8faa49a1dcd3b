"""The transport registry of firmware/device.py: names, lazy imports and bad names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from firmware.device import Device, open_device, transport_names
from hdl.presets import get_config

ROOT = Path(__file__).resolve().parent.parent.parent


def test_transport_names_are_the_transport_modules():
    assert transport_names() == ("isa", "rtl", "serial")


def test_unknown_transport_names_it_and_the_allowed_ones():
    with pytest.raises(ValueError) as error:
        open_device("uart", get_config("tiny"))
    assert str(error.value) == "transport 'uart' is not supported; allowed: isa, rtl, serial"


def test_open_isa_device_runs_a_halt():
    from firmware.asm import encode
    from firmware.runtime import done_beat, run_program
    from firmware.transports.isa import IsaSimDevice
    from hdl import isa

    device = open_device("isa", get_config("tiny"))
    assert isinstance(device, IsaSimDevice) and isinstance(device, Device)
    assert run_program(device, [encode(isa.Opcode.HALT)], 1) == [done_beat(1)]


def test_opening_a_transport_imports_no_other():
    """Opening ``isa`` (in a fresh interpreter) imports neither the rtl transport (cocotb)
    nor the serial one (pyserial): the registry imports a transport only by its name."""
    script = (
        "import sys\n"
        "from firmware.device import open_device\n"
        "from hdl.presets import get_config\n"
        "before = set(sys.modules)\n"
        "open_device('isa', get_config('tiny')).close()\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "print(' '.join(name for name in loaded if name.startswith(('firmware.transports',"
        " 'serial', 'cocotb'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["firmware.transports", "firmware.transports.isa"]


def test_transport_options_give_each_transport_its_own():
    from firmware.device import transport_options
    assert transport_options("isa", sim="icarus", port="loop://") == {}
    assert transport_options("rtl", sim="icarus", waves=True, port="x") == \
        {"sim": "icarus", "waves": True}
    assert transport_options("serial", sim="icarus", port="loop://", baudrate=115200) == \
        {"port": "loop://", "baudrate": 115200}
    assert transport_options("serial", port="loop://") == {"port": "loop://"}
