"""pytest configuration shared by all tests."""

from __future__ import annotations

import os

import pytest


def pytest_report_header(config) -> list[str]:
    sim = os.environ.get("SIM", "icarus")
    waves = os.environ.get("WAVES", "0")
    return [f"amtpu: SIM={sim} WAVES={waves} (cocotb tests in tests/hdl; build/ holds builds)"]


@pytest.fixture(scope="module")
def rtl_device():
    """``get(config)``: an RTL device (``firmware.transports.rtl.RtlDevice`` on ``SIM``) for a
    preset name or a ``TPUConfig``, started on first use in the module, reset on each call,
    closed with the module (one simulator build and process per configuration)."""
    from firmware.transports.rtl import RtlDevice
    from hdl.config import TPUConfig, get_config
    from sim.runner import simulator

    devices: dict[TPUConfig, RtlDevice] = {}

    def get(config: str | TPUConfig) -> RtlDevice:
        config = get_config(config) if isinstance(config, str) else config
        if config not in devices:
            devices[config] = RtlDevice(config, sim=simulator())
        device = devices[config]
        device.reset()
        return device

    yield get
    for device in devices.values():
        device.close()
