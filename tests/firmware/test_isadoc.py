"""docs/isa.md is generated from hdl/isa.py and must be up to date."""

from __future__ import annotations

from amaranth.lib import data

from firmware import isadoc
from hdl import isa


def test_docs_isa_md_is_up_to_date():
    fix = "python -m firmware.isadoc -o docs/isa.md"
    assert isadoc.DOC_PATH.exists(), f"docs/isa.md is missing: {fix}"
    assert isadoc.DOC_PATH.read_text() == isadoc.generate(), f"docs/isa.md is stale: {fix}"
    assert isadoc.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "isa.md"
    stale.write_text(isadoc.generate().replace("MATMUL", "MATMULT"))
    monkeypatch.setattr(isadoc, "DOC_PATH", stale)
    assert isadoc.main(["--check"]) == 1
    assert "is stale" in capsys.readouterr().err
    out = tmp_path / "new.md"
    assert isadoc.main(["-o", str(out)]) == 0
    assert out.read_text() == isadoc.generate()


def test_everything_is_documented():
    text = isadoc.generate()
    for opcode, layout in isa.FORMATS.items():
        assert f"### {opcode.value}: `{opcode.name.lower()}`" in text
        for name, field in data.Layout.cast(layout):
            hi = field.offset + field.width - 1
            bits = f"{field.offset}" if field.width == 1 else f"{hi}:{field.offset}"
            assert f"| `{name}` | {bits} | {field.width} |" in text, (opcode, name)
    for cls in (isa.Func, isa.Rounding, isa.Pool, isa.ErrorCode):
        for member in cls:
            assert f"| {member.value} | `{member.name}` |" in text
    for i, name in enumerate(isa.COUNTERS):
        assert f"| {i} | `{name}` |" in text
    assert "| `instr_index` | 31:8 | 24 |" in text
    assert "0x444f4e45" in text


def test_activate_states_the_activation_units_depth_from_the_gateware(monkeypatch):
    from hdl.datapath.activation import ActivationUnit
    from hdl.datapath.activation_serial import element_cycles

    def activate_section(text: str) -> str:
        start = text.index(f"### {isa.Opcode.ACTIVATE.value}: `activate`")
        return text[start:text.index("\n### ", start + 1)]

    section = activate_section(isadoc.generate())
    assert f"`ActivationUnit.STAGES` = {ActivationUnit.STAGES} cycles" in section
    assert f"{element_cycles(0)} to {element_cycles(63)} cycles an element" in section
    assert "5-stage" not in section
    # The figure follows the gateware: a unit one stage deeper is documented as such.
    monkeypatch.setattr(ActivationUnit, "STAGES", ActivationUnit.STAGES + 1)
    section = activate_section(isadoc.generate())
    assert f"`ActivationUnit.STAGES` = {ActivationUnit.STAGES} cycles" in section
