"""The Verilog cache key covers every gateware file, subpackages included."""

from __future__ import annotations

from pathlib import Path

from sim.rtl import verilog


def _factory():
    return None


def test_design_hash_covers_subpackages(tmp_path, monkeypatch):
    (tmp_path / "top.py").write_text("A = 1\n")
    (tmp_path / "engines").mkdir()
    sub = tmp_path / "engines" / "engine.py"
    sub.write_text("B = 1\n")
    monkeypatch.setattr(verilog, "HDL_DIR", tmp_path)
    before = verilog.design_hash("tiny", _factory)
    assert verilog.design_hash("tiny", _factory) == before
    sub.write_text("B = 2\n")
    assert verilog.design_hash("tiny", _factory) != before, \
        "a change in an hdl/ subpackage must change the Verilog cache key"
    (tmp_path / "top.py").write_text("A = 2\n")
    assert verilog.design_hash("tiny", _factory) != before


def test_roots_are_the_repository():
    """The build folder, the gateware the cache key hashes and the PYTHONPATH cocotb's
    simulators get all hang off the repository root: a wrong root hashes no gateware at all
    (every build would be reused) and lets the simulators import another checkout's code."""
    assert (verilog.REPO_ROOT / "hdl" / "core.py").is_file()
    assert (verilog.REPO_ROOT / "sim" / "rtl" / "verilog.py").resolve() == \
        Path(verilog.__file__).resolve()
    assert verilog.HDL_DIR == verilog.REPO_ROOT / "hdl"
    assert verilog.BUILD_ROOT == verilog.REPO_ROOT / "build"
    assert any(verilog.HDL_DIR.rglob("*.py"))
