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


def test_activate_states_normalises_figures_from_hdl_isa(monkeypatch):
    """The reciprocal's constants, range and precision are taken from hdl.isa (the precision
    claims themselves are checked in tests/sim/test_golden.py), and follow them."""
    def normalise_paragraph(text: str) -> str:
        start = text.index("Function NORMALISE (a core built with `row_scale`)")
        return " ".join(text[start:text.index("\n\n", start)].split())

    text = normalise_paragraph(isadoc.generate())
    assert "`RECIPROCAL_BITS` = 9 and `RECIPROCAL_SCALE` = 25" in text
    assert f"`recip` runs from {2**25} (`d` = 1) down to {isa.reciprocal(511)[0]} " \
           "(`m` = 511)" in text
    assert "for `d` < 512, and within a relative `2**-8` of it" in text
    assert "`z + t / d * 2**(25 - shift)`" in text
    monkeypatch.setattr(isa, "RECIPROCAL_BITS", 8)
    monkeypatch.setattr(isa, "RECIPROCAL_SCALE", 20)
    text = normalise_paragraph(isadoc.generate())
    assert "`RECIPROCAL_BITS` = 8 and `RECIPROCAL_SCALE` = 20" in text
    assert f"`recip` runs from {2**20} (`d` = 1) down to {(2**20 + 127) // 255} " \
           "(`m` = 255)" in text
    assert "for `d` < 256, and within a relative `2**-7` of it" in text


def test_configurations_table_says_which_presets_have_the_row_scale():
    from hdl.presets import PRESETS

    text = isadoc.generate()
    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip("|").split("|")]

    lines = text.splitlines()
    column = cells(next(line for line in lines if line.startswith("| Preset |"))).index(
        "row_scale")
    for name, config in PRESETS.items():
        row = cells(next(line for line in lines if line.startswith(f"| `{name}` |")))
        assert row[column] == ("yes" if config.row_scale else "no"), name
    assert not PRESETS["icebreaker"].row_scale and PRESETS["default"].row_scale
    assert "without `row_scale` ACTIVATE's function NORMALISE is BAD_FIELD" in text
    # The Func table takes NORMALISE's comment whole, its continuation line included.
    assert "| 6 | `NORMALISE` | the row divided by its last column: the multiplier is the " \
           "reciprocal of that accumulator (see RECIPROCAL_BITS), the shift grows with it |" \
           in text
