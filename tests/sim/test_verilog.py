"""The Verilog cache key covers every gateware file, subpackages included."""

from __future__ import annotations

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
