"""pytest configuration shared by all tests."""

from __future__ import annotations

import gc
import json
import os

import pytest


def pytest_configure(config) -> None:
    # The tests build large, long-lived object graphs (Amaranth designs, compiled programs,
    # the ISA simulator's state): with Python's default thresholds the collector walked them
    # every few hundred allocations, 15 to 35 % of the compiler's and the conversions'
    # processor time. Garbage with cycles waits longer; nothing depends on when it goes
    # (tests that need it gone call gc.collect()).
    from sim.rtl.verilog import GC_THRESHOLD
    gc.set_threshold(*GC_THRESHOLD)


#: The modules with the most work in make test, heaviest first (durations of a 2-core run,
#: 2026-12-07): collected first, so that with pytest-xdist's work stealing the long tests
#: start early and the run does not end on one worker with a long test while the other idles.
#: Tests keep their order within a module (its fixtures set up once).
HEAVY_FIRST = (
    "tests/sim/test_formal.py", "tests/hdl/test_core.py", "tests/hdl/test_interlocks.py",
    "tests/firmware/test_compiler.py", "tests/hdl/test_activation.py",
    "tests/firmware/test_onnx.py", "tests/firmware/test_paired_conv.py",
    "tests/firmware/test_networks_rtl.py", "tests/firmware/test_transformer_int8.py",
    "tests/hdl/test_host_link.py", "tests/hdl/test_fuzz.py",
    "tests/firmware/test_attention_block.py", "tests/hdl/test_systolic_array.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {path: n for n, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


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
    from hdl.config import TPUConfig
    from hdl.presets import get_config
    from sim.rtl.runner import simulator

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


def pytest_terminal_summary(terminalreporter) -> None:
    """Coverage tables tests attach with ``record_property("coverage_table", json)`` (keys
    ``title``, ``column``, ``counts``, ``missed``): one table per title, a column per test,
    printed after the run (they come back from pytest-xdist workers in the reports)."""
    tables: dict[str, dict[str, dict]] = {}
    reports = sorted((report for kind in ("passed", "failed")
                      for report in terminalreporter.getreports(kind)), key=lambda r: r.nodeid)
    for report in reports:
        for name, value in getattr(report, "user_properties", ()):
            if name == "coverage_table" and report.when == "call":
                table = json.loads(value)
                tables.setdefault(table["title"], {})[table["column"]] = table
    for title, columns in tables.items():
        names: list[str] = []
        for column in columns.values():
            names += [n for n in column["counts"] if n not in names]
        width = max(len(title), *(len(n) for n in names))
        cell = max(9, *(len(c) for c in columns))
        write = terminalreporter.write_line
        terminalreporter.section(title.split(":")[0])
        write(f"{title:<{width}}  " + "  ".join(f"{c:>{cell}}" for c in columns))
        for n in names:
            cells = [f"{c['counts'][n]:>{cell}}" if n in c["counts"] else f"{'-':>{cell}}"
                     for c in columns.values()]
            missed = any(n in c["missed"] for c in columns.values())
            write(f"{n:<{width}}  " + "  ".join(cells) + ("  MISSED" if missed else ""))
