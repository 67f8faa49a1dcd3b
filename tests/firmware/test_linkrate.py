"""firmware.linkrate: the host link's bytes per image, checked against the board-side byte
model (sim.models.link_model) and the boards' own modules."""

from __future__ import annotations

import dataclasses

import pytest

import boards.icebreaker
import boards.ulx3s
from firmware.asm import encode
from firmware.linkrate import BOARDS, BoardLink, board_for, link_rate
from firmware.runtime import Batch
from firmware.transports.serial import data_payloads
from hdl import isa
from hdl.link.protocol import Kind, encode_frame
from hdl.presets import PRESETS
from sim.models.isa_sim import IsaSim
from sim.models.link_model import LinkModel

TINY = PRESETS["tiny"]
BEAT_BYTES = TINY.host_width // 8
#: A data row whose every byte SLIP escapes: END (0xC0) and ESC (0xDB) in turn.
ESCAPES = int.from_bytes(bytes([0xC0, 0xDB] * (BEAT_BYTES // 2)), "little")


@pytest.mark.parametrize("key, module", [("icebreaker", boards.icebreaker),
                                         ("ulx3s", boards.ulx3s)])
def test_board_table_matches_boards(key, module):
    """firmware may not import boards/: its copy of the links must equal the boards'."""
    link = BOARDS[key]
    assert (link.preset, link.clock_mhz, link.baud, link.max_beats) == (
        module.BOARD_CONFIG, module.CLOCK_MHZ, module.BAUD, module.MAX_BEATS)


def test_cli_clocks_come_from_the_table():
    from firmware import cli
    assert cli.DEFAULT_CLOCK_MHZ == BOARDS["ulx3s"].clock_mhz
    assert cli.ICEBREAKER_CLOCK_MHZ == BOARDS["icebreaker"].clock_mhz


def test_board_for():
    assert board_for(PRESETS["icebreaker"]) is BOARDS["icebreaker"]
    assert board_for(PRESETS["ulx3s"]) is BOARDS["ulx3s"]
    assert board_for(PRESETS["default"]) is BOARDS["ulx3s"]
    assert board_for(PRESETS["tiny"]) is None


def _program(rows: list[int]) -> Batch:
    """READ_HOST the rows into the unified buffer, WRITE_HOST them back, HALT."""
    beats = [encode(isa.Opcode.READ_HOST, ub_addr=0, count=len(rows)), *rows,
             encode(isa.Opcode.WRITE_HOST, ub_addr=0, count=len(rows)),
             encode(isa.Opcode.HALT)]
    return Batch(beats=beats, output_beats=len(rows) + 1, instructions=3, images=1,
                 decode=lambda out: out)


def _wire(model: LinkModel, kind: Kind, seq: int, payload: bytes = b"") -> bytes:
    return model.feed(encode_frame(kind, seq, payload))


@pytest.mark.parametrize("max_beats", [1, 2, 3])
def test_bytes_equal_the_link_model(max_beats):
    """Bytes each way for two small programs, sent as SerialDevice and runtime.run send
    them, equal what the board-side model takes and answers."""
    batches = [_program([ESCAPES, 0x0102]), _program([0, ESCAPES, 0xC0C0_0000_0000_00DB])]
    board = BoardLink("test", preset="tiny", clock_mhz=10.0, baud=115_200,
                      max_beats=max_beats)
    model = LinkModel(TINY, max_beats=max_beats)
    sim = IsaSim(TINY)
    outputs = [sim.run(b.beats) for b in batches]

    # What run() does on a freshly opened SerialDevice before the first batch. The setup's
    # NOPs give the last DATA frame seq 0xC0 (escaped) when a frame holds one beat.
    _wire(model, Kind.INFO, 1)
    _wire(model, Kind.RESET, 2)
    setup = [encode(isa.Opcode.NOP)] * 0xAF + [encode(isa.Opcode.HALT)]
    seq = 2
    for payload in data_payloads(setup, beat_bytes=BEAT_BYTES, max_beats=max_beats):
        seq += 1
        _wire(model, Kind.DATA, seq, payload)
    clear = [encode(isa.Opcode.CLEAR_COUNTERS), encode(isa.Opcode.HALT)]
    for payload in data_payloads(clear, beat_bytes=BEAT_BYTES, max_beats=max_beats):
        seq += 1
        _wire(model, Kind.DATA, seq, payload)
    seq += 1
    _wire(model, Kind.STATUS, seq)
    acks_before, first = model.stats["tx ACK"], seq

    sent = back = 0
    for batch in batches:
        for payload in data_payloads(batch.beats, beat_bytes=BEAT_BYTES, max_beats=max_beats):
            seq += 1
            frame = encode_frame(Kind.DATA, seq, payload)
            sent += len(frame)
            back += len(model.feed(frame))
    assert model.stats["tx ACK"] - acks_before == seq - first
    assert not any(key.startswith("nak") for key in model.stats), model.stats
    assert max_beats > 1 or seq == 0xC0, "the last DATA frame no longer has seq 0xC0"

    exact = link_rate(batches, config=TINY, board=board, setup=(setup, 1), outputs=outputs)
    assert exact.exact
    assert exact.to_board == sent
    assert exact.acks + exact.beat_frames_low == back
    # The escapes were counted: the ESCAPES row alone adds a byte per byte to each way.
    raw = exact.data_frames * 6 + sum(len(b.beats) for b in batches) * BEAT_BYTES
    assert exact.to_board - raw >= 2 * BEAT_BYTES

    bounded = link_rate(batches, config=TINY, board=board, setup=(setup, 1))
    assert not bounded.exact and bounded.to_board == sent
    assert bounded.beat_frames_low < exact.beat_frames_low <= bounded.beat_frames_high


def test_rates():
    batch = _program([1, 2, 3])
    board = BoardLink("test", preset="tiny", clock_mhz=1.0, baud=10_000, max_beats=16)
    rate = link_rate([batch], config=TINY, board=board,
                     outputs=[IsaSim(TINY).run(batch.beats)], cycles_per_image=100)
    assert rate.byte_rate == 1000
    busiest = max(rate.to_board + rate.acks, rate.acks + rate.beat_frames_low)
    assert rate.images_per_s == 1000 / busiest
    assert rate.core_images_per_s == 10_000
    # Six beats in one DATA frame; four BEAT frames, each with its own framing, come back.
    assert rate.bound_by == "from" and busiest == rate.acks + rate.beat_frames_low


@pytest.mark.parametrize("field, value", [("baud", -1), ("baud", 0), ("max_beats", 0),
                                          ("clock_mhz", 0), ("preset", "nope")])
def test_bad_board(field, value):
    with pytest.raises(ValueError, match=f"{field}=.*allowed"):
        dataclasses.replace(BOARDS["ulx3s"], **{field: value})


def test_bad_batches():
    board = dataclasses.replace(BOARDS["ulx3s"], preset="tiny")
    batch = _program([1])
    with pytest.raises(ValueError, match="images=0.*allowed: an int >= 1"):
        link_rate([dataclasses.replace(batch, images=0)], config=TINY, board=board)
    with pytest.raises(ValueError, match="no batches; allowed"):
        link_rate([], config=TINY, board=board)
    with pytest.raises(ValueError, match="output beats given; allowed: its output_beats"):
        link_rate([batch], config=TINY, board=board, outputs=[[1]])
    with pytest.raises(ValueError, match="cycles_per_image=0.*allowed"):
        link_rate([batch], config=TINY, board=board, cycles_per_image=0)
