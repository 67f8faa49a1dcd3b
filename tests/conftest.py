"""pytest configuration shared by all tests."""

from __future__ import annotations

import os


def pytest_report_header(config) -> list[str]:
    sim = os.environ.get("SIM", "icarus")
    waves = os.environ.get("WAVES", "0")
    return [f"amtpu: SIM={sim} WAVES={waves} (cocotb tests in tests/hdl; build/ holds builds)"]
