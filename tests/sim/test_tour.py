"""The guided tour (sim.waves.tour, `make tour`) without GTKWave: its program's results, its save
file's names against the waveform, the opcode filter, the cycle numbers docs/tour.md quotes;
and the screenshot's PNG encoder."""

from __future__ import annotations

import re
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from firmware.asm import disassemble
from hdl import isa
from hdl.isa import Opcode
from hdl.presets import get_config
from sim.models.golden import conv_windows
from sim.models.isa_sim import IsaSim
from sim.rtl.gtkw import ENUM_FIELDS, enum_filter, fst_signals, gtkw_traces, read_enum_filter
from sim.waves.screenshot import decode_xwd, encode_png
from sim.waves.tour import (
    EVENTS,
    MARKERS,
    TOUR_CONFIG,
    WINDOWS_KERNEL,
    attention_program,
    decode_rows,
    markers,
    run_tour,
    tour_program,
    windows_program,
    write_tour_gtkw,
)

pytestmark = pytest.mark.skipif(shutil.which("iverilog") is None,
                                reason="the tour runs on Icarus Verilog (iverilog)")


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    if shutil.which("fst2vcd") is None:
        pytest.skip("fst2vcd (Debian package gtkwave) is needed to read the waveform's names")
    return run_tour(out_dir=tmp_path_factory.mktemp("tour"))


def test_program_is_the_documented_one():
    """The listing the tour prints is the disassembler's, instruction for instruction."""
    config = get_config(TOUR_CONFIG)
    program = tour_program(config)
    text = disassemble(program.beats, config).splitlines()
    assert [line for line in text if not line.startswith(".")] == \
        [line for line, _ in program.listing]


def test_results_equal_isa_sim(tour):
    config = get_config(TOUR_CONFIG)
    assert tour.received == IsaSim(config).run(tour.program.beats)
    assert len(tour.received) == tour.program.expected_beats


def test_gtkw_names_exist_in_dump(tour):
    """Every trace of the save file is a signal of the dump, as GTKWave names it (it drops
    unknown names without a word), and the save file names the dump it was made from."""
    text = tour.gtkw.read_text()
    dump = re.search(r'^\[dumpfile\] "([^"]+)"', text, re.MULTILINE)[1]
    assert (tour.gtkw.parent / dump).resolve() == tour.fst.resolve()
    traces = gtkw_traces(text)
    assert traces == tour.traces and len(traces) > 50
    available = set(fst_signals(tour.fst).values())
    missing = [trace for trace in traces if trace not in available]
    assert not missing, f"{tour.gtkw} names signals not in {tour.fst}: {missing}"


def test_gtkw_stages_markers_view(tour):
    text = tour.gtkw.read_text()
    comments = [line[1:] for line in text.splitlines()
                if line.startswith("-") and line[1:2].isdigit()]
    assert [int(line.split()[0]) for line in comments] == list(range(1, 12))
    # One named marker per event, all inside the view, in the order the data flows.
    names = re.findall(r"^\[markername\] ([A-Z])(.*)$", text, re.MULTILINE)
    assert [label for _, label in names] == [label for label, _ in EVENTS.values()] + ["DONE"]
    zoom = re.search(r"^\*(\S+) (-?\d+) (.*)$", text, re.MULTILINE)
    marks = [int(t) for t in zoom[3].split()[:len(names)]]
    assert all(tour.start < t < tour.end for t in marks)
    assert marks == sorted(marks[:2]) + marks[2:] and marks[-1] == max(marks)
    assert int(re.search(r"^\[timestart\] (\d+)", text, re.MULTILINE)[1]) == int(tour.start)
    # The opcode is shown by name: its trace carries the opcode filter.
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("front_end.fetch_opcode[3:0]"))
    assert lines[at - 1].startswith("^") and lines[at - 1].endswith("opcode.gtkwfilter")


TOUR_DOC = Path(__file__).resolve().parents[2] / "docs" / "tour.md"


def _number(pattern: str, text: str) -> list[int]:
    """The numbers *pattern*'s groups match in *text* (any run of white space in the pattern
    matches a line break too); fails if it is not there."""
    found = re.search(r"\s+".join(pattern.split()), text)
    assert found, f"docs/tour.md no longer says {pattern!r}"
    return [int(group) for group in found.groups()]


def _section(heading: str) -> str:
    """docs/tour.md's section under ``## heading``, up to the next ``## `` heading."""
    text = TOUR_DOC.read_text()
    section = text[text.index(f"## {heading}"):]
    end = section.find("\n## ", 1)
    return section if end < 0 else section[:end]


def _listing_block(heading: str) -> list[str]:
    """The first code block of a section, a line a list entry."""
    block = _section(heading)
    block = block[block.index("```") + 4:]
    return block[:block.index("```")].splitlines()


def test_doc_cycles_match_run(tour):
    """docs/tour.md's marker table (letter, label, time, cycle) is the run's, and so are the
    view's start, the cycle count from the first instruction to the DONE beat and the array's
    active cycles it quotes: a change to the core's timing that moves them fails here."""
    text = TOUR_DOC.read_text()
    table = [(letter, label, int(ns), int(cycle)) for letter, label, ns, cycle in re.findall(
        r"^\| ([A-Z]) `([^`]+)` \| (\d+) ns \| (\d+) \|", text, re.MULTILINE)]
    cycles = tour.cycles()
    assert all(tour.events[name] % 1000 == 0 for name, _ in MARKERS)
    assert table == [(chr(ord("A") + i), label, tour.events[name] // 1000, cycles[name])
                     for i, (name, label) in enumerate(MARKERS)]
    # Among them the first ReLU row into the buffer (F) and the DONE beat (H).
    doc = {name: row[3] for (name, _), row in zip(MARKERS, table, strict=True)}
    assert (doc["activate"], doc["done"]) == (cycles["activate"], cycles["done"])
    assert _number(r"at (\d+) ns: before that", text) == [tour.start // 1000]
    assert _number(r"\(time - (\d+) ns\) / (\d+) ns", text) == \
        [tour.events["load_weights"] // 1000, tour.period // 1000]
    assert _number(r"(\d+) cycles from the first instruction to the last beat", text) == \
        [cycles["done"]]
    rows = len(tour.program.expected)
    assert _number(r"active (\d+) of those (\d+) cycles", text) == [rows, cycles["done"]]


def test_gtkw_rejects_unknown_names(tour, tmp_path):
    """A trace the dump lacks is an error, not a silently dropped line."""
    signals = fst_signals(tour.fst)
    del signals["core.matrix_unit.array.core.pe_1_1.shadow"]
    with pytest.raises(ValueError, match="pe_1_1.shadow"):
        write_tour_gtkw(tour.fst, tmp_path / "x.gtkw", get_config(TOUR_CONFIG),
                        events=tour.events, start=tour.start, end=tour.end, signals=signals)


def test_opcode_filter_names_every_opcode(tour):
    table = read_enum_filter(tour.filters["opcode"])
    assert {value: table[value] for value in (op.value for op in Opcode)} == \
        {op.value: op.name for op in Opcode}
    assert len(table) == 1 << Opcode.as_shape().width
    for field, enum_type in ENUM_FIELDS.items():
        table = read_enum_filter(tour.filters[field])
        assert all(table[member.value] == member.name for member in enum_type)


def test_enum_filter_matches_name_and_width():
    filters = {field: f"{field}.gtkwfilter" for field in ENUM_FIELDS}
    assert enum_filter("core.front_end.\\o_hazards__instr.opcode[3:0]", filters).name == \
        "opcode.gtkwfilter"
    assert enum_filter("core.front_end.fetch_opcode[3:0]", filters) is not None
    assert enum_filter("core.x.\\i_activate__payload.func[2:0]", filters) is not None
    assert enum_filter("core.x.opcode[7:0]", filters) is None         # not the enum's width
    assert enum_filter("core.x.myopcode[3:0]", filters) is None


def _read_png(raw: bytes) -> np.ndarray:
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, palette = 8, b"", None
    while pos < len(raw):
        (n,) = struct.unpack(">I", raw[pos:pos + 4])
        kind, body = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", raw[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        pos += 12 + n
        if kind == b"IHDR":
            width, height, _, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"PLTE":
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat += body
    channels = 1 if colour == 3 else 3
    lines = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(
        height, 1 + width * channels)
    assert not lines[:, 0].any()                                       # filter 0 throughout
    pixels = lines[:, 1:].reshape(height, width, channels)
    return palette[pixels[:, :, 0]] if colour == 3 else pixels


def test_png_encoder_round_trip():
    rng = np.random.default_rng(3)
    few = rng.choice(np.array([[0, 0, 0], [255, 255, 255], [10, 200, 30]], dtype=np.uint8),
                     size=(7, 5))
    assert np.array_equal(_read_png(encode_png(few)), few)             # indexed
    many = rng.integers(0, 256, (6, 9, 3), dtype=np.uint8)
    assert np.array_equal(_read_png(encode_png(many, max_colours=None)), many)   # RGB
    reduced = _read_png(encode_png(many, max_colours=16))
    assert len(np.unique(reduced.reshape(-1, 3), axis=0)) <= 16


def test_xwd_decoder():
    """A 2x2 TrueColor dump (32 bits a pixel, LSB first), as Xvfb's 24-bit screen gives."""
    width, height = 2, 2
    header = struct.pack(">25I", 100, 7, 2, 24, width, height, 0, 0, 32, 0, 32, 32, width * 4,
                         4, 0xFF0000, 0xFF00, 0xFF, 8, 256, 0, width, height, 0, 0, 0)
    pixels = [0x102030, 0xFF0000, 0x00FF00, 0x0000FF]
    raw = header + b"".join(struct.pack("<I", p) for p in pixels)
    assert decode_xwd(raw).tolist() == [[[16, 32, 48], [255, 0, 0]], [[0, 255, 0], [0, 0, 255]]]


# The attention stop --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    if shutil.which("fst2vcd") is None:
        pytest.skip("fst2vcd (Debian package gtkwave) is needed to read the waveform's names")
    return run_tour(out_dir=tmp_path_factory.mktemp("tour"), stop="attention")


def test_attention_program_is_the_documented_one():
    """The attention stop's listing is the disassembler's and docs/tour.md's."""
    config = get_config(TOUR_CONFIG)
    program = attention_program(config)
    text = disassemble(program.beats, config).splitlines()
    listing = [line for line, _ in program.listing]
    assert [line for line in text if not line.startswith(".")] == listing
    assert [" ".join(line.split()[:len(want.split())]) for line, want in
            zip(_listing_block("Attention"), listing, strict=True)] == listing


@pytest.mark.slow       # the stop's RTL run (make regression; the main stop's is in make test)
def test_attention_scores_and_names(attention):
    """q @ k.T, k.T made on chip, equals the ISA simulator's beats and numpy's product; every
    trace of its save file is in its dump."""
    config = get_config(TOUR_CONFIG)
    program = attention.program
    assert attention.received == IsaSim(config).run(program.beats)
    q, k = program.x, program.w
    t = len(q)
    assert np.array_equal(program.expected[:, :t], np.clip(q @ k.T, -128, 127))
    text = attention.gtkw.read_text()
    traces = gtkw_traces(text)
    available = set(fst_signals(attention.fst).values())
    assert traces == attention.traces and not [x for x in traces if x not in available]
    assert any("weight_mover" in x and "buf" in x for x in traces)
    names = re.findall(r"^\[markername\] ([A-Z])(.*)$", text, re.MULTILINE)
    assert [label for _, label in names] == [label for _, label in markers("attention")]


@pytest.mark.slow       # the stop's RTL run (make regression; the main stop's is in make test)
def test_attention_doc_cycles_match_run(attention):
    """docs/tour.md's attention marker table is the run's."""
    text = _section("Attention")
    table = [(letter, label, int(ns), int(cycle)) for letter, label, ns, cycle in re.findall(
        r"^\| ([A-Z]) \| `([^`]+)` \| (\d+) ns \| (\d+) \|", text, re.MULTILINE)]
    cycles = attention.cycles()
    assert table == [(chr(ord("A") + i), label, attention.events[name] // 1000, cycles[name])
                     for i, (name, label) in enumerate(markers("attention"))]
    assert _number(r"counted from marker A \(`\(time - (\d+) ns\) / 10 ns`\)", text) == \
        [attention.events["read_host"] // 1000]


# The windows stop ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    if shutil.which("fst2vcd") is None:
        pytest.skip("fst2vcd (Debian package gtkwave) is needed to read the waveform's names")
    return run_tour(out_dir=tmp_path_factory.mktemp("tour"), stop="windows")


def test_windows_program_is_the_documented_one():
    """The windows stop's listing is the disassembler's and docs/tour.md's, and its MATMULs
    are window MATMULs at steps 1 and 2."""
    config = get_config(TOUR_CONFIG)
    program = windows_program(config)
    text = disassemble(program.beats, config).splitlines()
    listing = [line for line, _ in program.listing]
    assert [line for line in text if not line.startswith(".")] == listing
    assert [" ".join(line.split()[:len(want.split())]) for line, want in
            zip(_listing_block("Windows"), listing, strict=True)] == listing
    matmuls = [line for line in listing if line.startswith("matmul")]
    assert all(line.endswith(" window") for line in matmuls)
    assert [line.split()[4] for line in matmuls] == ["step=1", "step=2"]


@pytest.mark.slow       # the stop's RTL run (make regression; the main stop's is in make test)
def test_windows_outputs_and_names(windows):
    """The windows times W equal the ISA simulator's beats, and the rows that are the
    convolution's outputs equal golden.conv_windows (which cuts the windows from the image,
    not from the buffer) times W at strides 1 and 2; every trace of the save file is in the
    dump, the engine's token and kept rows among them."""
    config = get_config(TOUR_CONFIG)
    program = windows.program
    assert windows.received == IsaSim(config).run(program.beats)
    rows = decode_rows(windows.received[:-1], config.cols)
    assert np.array_equal(rows, program.expected)
    kw = WINDOWS_KERNEL[1]
    for stride in (1, 2):
        reference = conv_windows(program.x[:, :, None], WINDOWS_KERNEL, stride)[0]
        assert np.array_equal(rows[program.conv[stride]],
                              np.clip(reference @ program.w[:kw], -128, 127))
    assert not program.w[kw:].any()          # the window's elements past the kernel row
    text = windows.gtkw.read_text()
    traces = gtkw_traces(text)
    available = set(fst_signals(windows.fst).values())
    assert traces == windows.traces and not [x for x in traces if x not in available]
    for name in ("need_read", "emit", "win_row", "upper", "lower", "payload.lane",
                 "payload.step", "o_act__payload.data[3]"):
        assert any(name in x for x in traces), name
    comments = [line[1:] for line in text.splitlines()
                if line.startswith("-") and line[1:2].isdigit()]
    assert [int(line.split()[0]) for line in comments] == list(range(1, 8))
    names = re.findall(r"^\[markername\] ([A-Z])(.*)$", text, re.MULTILINE)
    assert [label for _, label in names] == [label for _, label in markers("windows")]


@pytest.mark.slow       # the stop's RTL run (make regression; the main stop's is in make test)
def test_windows_doc_cycles_match_run(windows):
    """docs/tour.md's windows marker table, its origin, the cycles from the first instruction
    to the last beat and the windows' cycles (isa.window_cycles) are the run's."""
    text = _section("Windows")
    table = [(letter, label, int(ns), int(cycle)) for letter, label, ns, cycle in re.findall(
        r"^\| ([A-Z]) \| `([^`]+)` \| (\d+) ns \| (\d+) \|", text, re.MULTILINE)]
    cycles = windows.cycles()
    assert table == [(chr(ord("A") + i), label, windows.events[name] // 1000, cycles[name])
                     for i, (name, label) in enumerate(markers("windows"))]
    assert _number(r"\(`\(time - (\d+) ns\) / 10 ns`\)", text) == \
        [windows.events["load_weights"] // 1000]
    assert _number(r"(\d+) cycles from the first instruction to the last beat", text) == \
        [cycles["done"]]
    config = get_config(TOUR_CONFIG)
    fields = [dict(w.split("=") for w in line.split() if "=" in w)
              for line, _ in windows.program.listing if line.startswith("matmul")]
    spent = sum(isa.window_cycles(int(f.get("lane", 0)), int(f["step"]), int(f["count"]),
                                  config.rows, config.ub_row) for f in fields)
    assert _number(r"sent (\d+) windows in (\d+) cycles", text) == \
        [len(windows.program.expected), spent]
