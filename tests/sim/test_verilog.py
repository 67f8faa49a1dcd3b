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


class _Design:
    def __init__(self, size):
        self.size = size


class _Other(_Design):
    pass


WIDTH = 4


def _closing(size, cls=None):
    if cls is None:
        return lambda: _Design(size)
    return lambda: cls(size)


def test_factory_identity_is_what_it_builds():
    """One design written as a factory in two places is one conversion (the same key); a
    factory that could build something else (another value closed over, another class, a
    global constant of another value) gets another key."""
    same = _closing(3)
    written_elsewhere = (lambda size: (lambda: _Design(size)))(3)
    assert verilog.design_hash("k", same) == verilog.design_hash("k", written_elsewhere)
    assert verilog.design_hash("k", same) != verilog.design_hash("k", _closing(4))
    assert verilog.design_hash("k", _closing(3, _Design)) != \
        verilog.design_hash("k", _closing(3, _Other))

    def wide():
        return _Design(WIDTH)

    before = verilog.design_hash("k", wide)
    global WIDTH
    WIDTH = 5
    try:
        assert verilog.design_hash("k", wide) != before
    finally:
        WIDTH = 4
