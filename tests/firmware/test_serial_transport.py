"""The serial transport (:class:`firmware.transports.serial.SerialDevice`) without hardware:
through pyserial's ``socket://`` to a simulated board (:func:`sim.models.link_model.serve`), whose
core is the ISA simulator. Results equal :class:`firmware.transports.isa.IsaSimDevice`'s
(``==``; the ISA simulator's timing-dependent counters are ``None`` there and 0 from the link
model), errors and statuses too; faults injected in the link model (corrupted or dropped
frames either way, a board that is busy) are recovered by retries with every beat reaching
the core exactly once, or reported as lost output. The link model's own frame checks, NAK
codes in their order, are tested byte by byte, and the framing round trip through pyserial
over ``loop://``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import serial

from firmware import nn
from firmware.asm import Program
from firmware.cli import main as cli_main
from firmware.compiler import compile_network
from firmware.device import Device, DeviceError, DeviceStatus, DeviceTimeout, open_device
from firmware.gemm import GemmProgram, gemm_program, gemm_reference
from firmware.quant import quantise, reference_forward
from firmware.runtime import done_beat, run, run_program
from firmware.transports.isa import IsaSimDevice
from firmware.transports.serial import SerialDevice
from hdl import isa
from hdl.beats import error_beat
from hdl.link.protocol import (
    END,
    ESC,
    Frame,
    FrameDecoder,
    FrameError,
    Kind,
    Nak,
    StatusReply,
    crc16,
    encode_frame,
    slip_encode,
)
from hdl.presets import get_config
from sim.models.link_model import LinkModel, serve

#: Seconds a device waits for an answer before it sends a frame again, in the tests that
#: drop frames or wait for a timeout (short: the model answers at once); the others keep the
#: default, so a loaded machine does not make them resend.
TIMEOUT_S = 0.15


@pytest.fixture
def board():
    """``make(config_key, max_beats=..., **device_options) -> (model, device)``: a link model
    served on a free port and a SerialDevice open on it; all closed after the test."""
    made: list = []

    def make(config_key: str = "small", *, max_beats: int = 4, open_device: bool = True,
             **options) -> tuple[LinkModel, SerialDevice | None]:
        model = LinkModel(get_config(config_key), max_beats=max_beats)
        server, port = serve(model)
        made.append(server)
        model.url = f"socket://127.0.0.1:{port}"
        model.server = server
        if not open_device:
            return model, None
        device = SerialDevice(model.config, port=model.url, **options)
        made.append(device)
        return model, device

    yield make
    for thing in reversed(made):
        thing.close()


def _gemm(config_key: str, m: int, k: int, n: int, seed: int) -> tuple[GemmProgram, np.ndarray]:
    """A measured, requantised ReLU GEMM and its numpy result."""
    print(f"gemm {config_key} {m}x{k}x{n} seed {seed}")
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k))
    w = rng.integers(-128, 128, (k, n))
    kwargs = dict(bias=rng.integers(-2**12, 2**12, n), multiplier=rng.integers(1, 2**15, n),
                  shift=16, zero_point=-3, func=isa.Func.RELU)
    return (gemm_program(get_config(config_key), x, w, measure=True, **kwargs),
            gemm_reference(x, w, **kwargs))


def _assert_beats(got: Sequence[int], expected: Sequence[int | None], what: str) -> None:
    """Every beat equal; where the ISA simulator cannot know a counter (``None``) the link
    model sends 0."""
    assert len(got) == len(expected), f"{what}: {len(got)} beats, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        want = 0 if e is None else e
        assert g == want, f"{what}: beat {i} is {g:#x}, expected {want:#x}"


def _run_both(dev, ref, beats: Sequence[int], count: int, what: str) -> list[int]:
    ref.send(beats)
    expected = ref.receive(count)
    dev.send(beats)
    got = dev.receive(count)
    _assert_beats(got, expected, what)
    assert dev.status() == ref.status(), f"{what}: status {dev.status()} != {ref.status()}"
    return got


# End to end ----------------------------------------------------------------------------------

@pytest.mark.parametrize("config_key, max_beats, m, k, n", [
    ("tiny", 1, 5, 4, 3), ("small", 3, 9, 12, 10), ("wide", 16, 7, 9, 17)])
def test_gemm_equals_isa(board, config_key, max_beats, m, k, n):
    """A GEMM split into frames of 1, 3 and 16 beats: every beat equal to the ISA
    transport's, the result numpy's; the core took every beat exactly once."""
    model, dev = board(config_key, max_beats=max_beats)
    assert isinstance(dev, Device)
    plan, expected = _gemm(config_key, m, k, n, seed=m * k * n)
    ref = IsaSimDevice(dev.config)
    out = _run_both(dev, ref, plan.beats, plan.output_beats, "gemm")
    assert np.array_equal(plan.decode(out), expected)
    assert out[-1] == done_beat(plan.instructions)
    assert model.delivered == plan.beats
    assert model.stats["rx DATA"] == -(-len(plan.beats) // max_beats)
    assert dev.stats["resent"] == 0 and dev.stats["bad_frames"] == 0
    counters = plan.counters(out)
    assert counters["array_active"] > 0 and counters["cycles"] == 0


def test_program_rows_matmul_activate_counters(board):
    """Write rows, load weights and parameters, matmul, activate, read back, read the
    counters; then several programs before one receive and receives split anywhere."""
    model, dev = board("wide", max_beats=5)
    config = dev.config
    seed = 21
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    p = Program(config)
    x = rng.integers(-128, 128, (6, config.ub_row))
    w = rng.integers(-128, 128, (1, config.rows, config.cols))
    p.read_host(0, x)
    p.load_weights(0, w)
    p.read_weights(0)
    p.load_params(1, rng.integers(-500, 500, config.cols), rng.integers(1, 2**14, config.cols),
                  shift=12, zp=-5)
    p.matmul(0, 0, 6, switch=True)
    p.activate(0, 10, 6, func=isa.Func.RELU, slot=1)
    p.write_host(0, 6)
    p.write_host(10, 6)
    p.read_counters()
    p.halt()
    count = 12 + len(isa.COUNTERS) + 1
    ref = IsaSimDevice(config)
    out = _run_both(dev, ref, p.beats, count, "program")
    assert out[:6] == [int.from_bytes(row.astype(np.uint8).tobytes(), "little") for row in x]
    assert out[-1] == done_beat(p.instructions)
    counters = dict(zip(isa.COUNTERS, out[12:-1], strict=True))
    assert counters["array_active"] == 6
    assert counters["useful_macs"] == 6 * config.rows * config.cols
    assert counters["cycles"] == 0            # timing-dependent: 0 from the link model
    for _ in range(3):
        dev.send(p.beats)
        ref.send(p.beats)
    got = dev.receive(5) + dev.receive(2 * count - 5) + dev.receive(count)
    _assert_beats(got, ref.receive(3 * count), "three programs in one receive")
    assert dev.receive(0) == []
    assert model.delivered == p.beats * 4


def test_network_run_equals_isa(board):
    """run() of a compiled two-layer network: outputs equal to the ISA transport's and the
    int8 reference's, counters the ISA fixes equal, cycles() advancing."""
    _, dev = board("small", max_beats=8)
    seed = 3
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    net = nn.Network((11,), [nn.Dense(rng.normal(size=(11, 6)) / 3, rng.normal(size=6) * 0.1),
                             nn.ReLU(), nn.Dense(rng.normal(size=(6, 5)) / 2)], name="dense")
    x = rng.normal(size=(7, 11))
    qnet = quantise(net, x)
    compiled = compile_network(qnet, dev.config, batch_size=3)
    x_q = qnet.quantise_input(x)
    want = run(IsaSimDevice(dev.config), compiled, x_q)
    got = run(dev, compiled, x_q)
    assert np.array_equal(want.outputs, reference_forward(qnet, x_q))
    assert got.outputs.shape == want.outputs.shape
    assert np.array_equal(got.outputs, want.outputs)
    assert got.images == want.images == 7
    for name, value in want.counters.items():
        assert got.counters[name] == (0 if value is None else value), name
    assert got.cycles is not None and got.cycles > 0


def test_open_device_and_cycles(board):
    """open_device("serial") gives a SerialDevice; cycles() is the link model's proxy."""
    model, _ = board("tiny", open_device=False)
    dev = open_device("serial", model.config, port=model.url)
    try:
        assert isinstance(dev, SerialDevice) and isinstance(dev, Device)
        assert dev.info.max_beats == 4 and dev.info.clock_hz == model.clock_hz
        start = dev.cycles()
        assert start == model.cycles
        plan, expected = _gemm("tiny", 3, 2, 2, seed=4)
        out = run_program(dev, plan.beats, plan.output_beats, instructions=plan.instructions)
        assert np.array_equal(plan.decode(out), expected)
        assert dev.cycles() - start == len(plan.beats) + plan.output_beats == model.cycles - start
    finally:
        dev.close()
    dev.close()                                  # twice is fine
    with pytest.raises(DeviceError, match="closed"):
        dev.status()


# Errors, clear, reset ------------------------------------------------------------------------

def _bad_program(config, case: str) -> Program:
    p = Program(config)
    p.read_host(0, np.arange(2 * config.ub_row).reshape(2, config.ub_row) % 100)
    p.write_host(0, 2)
    if case == "UNKNOWN_OPCODE":
        p.word(15)      # reserved (12 to 14 are instructions where they are built)
    else:
        p.read_host(config.ub_depth - 1, np.zeros((2, config.ub_row)))
    p.halt()
    return p


@pytest.mark.parametrize("case", ["UNKNOWN_OPCODE", "UB_RANGE"])
def test_error_then_clear(board, case):
    """A bad instruction: receive raises DeviceError with the ISA transport's status; the
    rows before it can be received, the error beat cannot; clear() recovers."""
    model, dev = board("tiny", max_beats=3)
    ref = IsaSimDevice(dev.config)
    program = _bad_program(dev.config, case)
    for d in (ref, dev):
        d.send(program.beats)
    for d in (ref, dev):
        with pytest.raises(DeviceError) as info:
            d.receive(3)
        assert not isinstance(info.value, DeviceTimeout)
        assert "stopped after 2 of 3 beats" in str(info.value)
        assert info.value.status == DeviceStatus(
            error=True, code=isa.ErrorCode[case], instr_index=2, halted=False)
    assert dev.status() == ref.status()
    _assert_beats(dev.receive(2), ref.receive(2), "the rows before the error")
    for d in (ref, dev):
        with pytest.raises(DeviceError, match="stopped after 0 of 1"):
            d.receive(1)
    dev.clear()
    ref.clear()
    assert dev.status() == ref.status()
    assert not dev.status().error
    plan, expected = _gemm("tiny", 3, 2, 2, seed=11)
    out = _run_both(dev, ref, plan.beats, plan.output_beats, f"after {case}")
    assert np.array_equal(plan.decode(out), expected)
    assert model.sim.status == ref.sim.status


def test_error_then_resync_word(board):
    """In-band recovery: the error beat comes as data once a RESYNC_WORD later in the stream
    has cleared the error, as on the ISA transport."""
    _, dev = board("tiny", max_beats=2)
    ref = IsaSimDevice(dev.config)
    program = _bad_program(dev.config, "UNKNOWN_OPCODE")
    plan, expected = _gemm("tiny", 2, 3, 2, seed=12)
    beats = program.beats + [isa.RESYNC_WORD] + plan.beats
    out = _run_both(dev, ref, beats, 3 + plan.output_beats, "error, RESYNC_WORD, program")
    assert out[2] == error_beat(isa.ErrorCode.UNKNOWN_OPCODE, 2)
    assert np.array_equal(plan.decode(out[3:]), expected)


def test_clear_without_error_and_reset(board):
    """clear() without an error drops unreceived beats only; reset() drops them and starts
    the core, its status and the BEAT numbering again."""
    model, dev = board("tiny", timeout_s=TIMEOUT_S)
    ref = IsaSimDevice(dev.config)
    plan, expected = _gemm("tiny", 6, 2, 4, seed=8)
    for d in (ref, dev):
        d.send(plan.beats)
        d.receive(2)                             # the rest stays unread
        d.clear()
    assert dev.status() == ref.status()
    with pytest.raises(DeviceTimeout, match="sent 0 of 1"):
        dev.receive(1, timeout_cycles=100)
    for d in (ref, dev):
        d.send(plan.beats)
        d.receive(3)
        d.send(plan.beats[:5])                   # a program cut short
        d.reset()
    assert dev.status() == ref.status() == DeviceStatus(
        error=False, code=isa.ErrorCode.NONE, instr_index=0, halted=False)
    assert model.delivered == [] and model.stats["rx RESET"] == 2
    out = _run_both(dev, ref, plan.beats, plan.output_beats, "after reset")
    assert np.array_equal(plan.decode(out), expected)
    assert model.delivered == plan.beats
    with pytest.raises(DeviceTimeout, match="sent 0 of 1"):
        dev.receive(1, timeout_cycles=100)


def test_hang_times_out(board):
    """A READ_HOST waiting for data beats never sent: DeviceTimeout with the ISA transport's
    status; the beat that did arrive stays for the next receive."""
    _, dev = board("tiny", timeout_s=TIMEOUT_S)
    config = dev.config
    p = Program(config)
    p.read_host(0, np.full((1, config.ub_row), 7))
    p.write_host(0, 1)
    p.read_host(1, np.ones((4, config.ub_row)))
    ref = IsaSimDevice(config)
    for d in (ref, dev):
        d.send(p.beats[:-2])
    with pytest.raises(DeviceTimeout, match="sent 1 of 2 beats") as info:
        dev.receive(2, timeout_cycles=1000)
    assert info.value.status == ref.status() and info.value.status.instr_index == 3
    assert dev.receive(1) == ref.receive(1)


# Configuration -------------------------------------------------------------------------------

def test_configuration_mismatch(board):
    """A board built with another configuration: DeviceError naming the fields, what the
    board has, and the board left alone (no RESET)."""
    model, _ = board("small", open_device=False)
    with pytest.raises(DeviceError, match=r"cols: board 4, host 8.*'small' preset"):
        SerialDevice(get_config("wide"), port=model.url)
    custom = get_config("small").replace(ub_depth=128)
    with pytest.raises(DeviceError, match=r"ub_depth: board 256, host 128"):
        SerialDevice(custom, port=model.url)
    assert model.stats["rx INFO"] == 2 and model.stats["rx RESET"] == 0
    other, _ = board("small", open_device=False)
    other.info = dataclasses.replace(other.info, ub_depth=512)
    with pytest.raises(DeviceError, match=r"ub_depth: board 512, host 256\); it has rows=4"):
        SerialDevice(get_config("small"), port=other.url)


def test_open_without_reset_keeps_board_state(board):
    """reset=False: the board's state and its last DATA seq are kept; the new session's
    first DATA frame must not reuse that seq (it would be taken for a retry and dropped)."""
    model, dev = board("tiny", max_beats=64)
    ref = IsaSimDevice(dev.config)
    plan, expected = _gemm("tiny", 2, 2, 2, seed=5)
    assert len(plan.beats) <= 64                 # one DATA frame
    _run_both(dev, ref, plan.beats, plan.output_beats, "first session")
    last_seq = model._data_seq
    dev.close()
    with SerialDevice(model.config, port=model.url, reset=False) as again:
        assert again._last_data_seq == last_seq
        # INFO and STATUS took seqs 1 and 2 in both sessions; the first session's DATA
        # frame had 3, so this one skips it.
        out = _run_both(again, ref, plan.beats, plan.output_beats, "second session")
        assert np.array_equal(plan.decode(out), expected)
        assert last_seq == 3 and again._status_reply().data_seq == 4
    assert model.delivered == plan.beats * 2 and model.stats["retry"] == 0


# Retries and lost output ---------------------------------------------------------------------

FAULT_CASES = [
    ("corrupt", Kind.ACK, 1), ("drop", Kind.ACK, 2), ("corrupt_in", Kind.DATA, 2),
    ("drop_in", Kind.DATA, 1), ("corrupt", Kind.STATUS_REPLY, 1), ("drop_in", Kind.STATUS, 1),
    ("corrupt_in", Kind.CLEAR, 1), ("drop", None, 1),
]


@pytest.mark.parametrize("action, kind, count", FAULT_CASES,
                         ids=[f"{a}-{k.name if k else 'any'}-{c}" for a, k, c in FAULT_CASES])
def test_faults_are_retried(board, action, kind, count):
    """Corrupted and dropped frames, either way: retried, and the core sees every beat
    exactly once (the board acknowledges a DATA retry without delivering it again)."""
    model, dev = board("small", max_beats=3, timeout_s=TIMEOUT_S)
    ref = IsaSimDevice(dev.config)
    plan, expected = _gemm("small", 5, 6, 7, seed=9)
    # The faults hit frames in the middle of the program.
    dev.send(plan.beats[:6])
    ref.send(plan.beats[:6])
    model.inject(action, kind, count)
    dev.send(plan.beats[6:])
    ref.send(plan.beats[6:])
    dev.clear()                                  # no error: the beats stay (none received)
    ref.clear()
    dev.send(plan.beats)
    ref.send(plan.beats)
    got = dev.receive(plan.output_beats)
    _assert_beats(got, ref.receive(plan.output_beats), f"{action} {kind}")
    assert np.array_equal(plan.decode(got), expected)
    assert dev.status() == ref.status()
    assert model.faults_pending() == 0 and model.stats[f"fault {action}"] == count
    assert dev.stats["resent"] >= 1
    assert model.delivered == plan.beats * 2
    if (action, kind) in (("drop", Kind.ACK), ("corrupt", Kind.ACK)):
        assert model.stats["retry"] >= count


def test_retries_run_out(board):
    """A frame that never gets through: DeviceError naming the last NAK, after `retries`
    resends; a board that never answers: DeviceError saying so."""
    model, dev = board("tiny", retries=2, timeout_s=TIMEOUT_S)
    model.inject("corrupt_in", Kind.DATA, 3)
    with pytest.raises(DeviceError, match=r"no ACK for DATA frame \d+ .* after 3 tries "
                                          r"\(last: NAK CRC\)"):
        dev.send([isa.RESYNC_WORD])
    assert model.delivered == [] and model.stats["nak CRC"] == 3
    model.inject("drop_in", Kind.STATUS, 3)
    with pytest.raises(DeviceError, match=r"after 3 tries \(last: no answer within 0.15 s\)"):
        dev.status()
    assert dev.status().instr_index == 0         # the link works again


def test_link_failure_is_reported(board):
    """The board goes away (the connection closes): the next request says the link failed
    instead of waiting for an answer."""
    model, dev = board("tiny")
    assert dev.status().instr_index == 0
    model.server.close()
    with pytest.raises(DeviceError, match=r"the serial link failed: reading .* failed"):
        for _ in range(50):                      # until the reader has seen the close
            dev.status()
    with pytest.raises(DeviceError, match="the serial link failed"):
        dev.send([isa.RESYNC_WORD])


def test_no_board_on_the_port():
    """loop:// echoes the host's own frames: no INFO_REPLY, so no board."""
    with pytest.raises(DeviceError, match=r"no INFO_REPLY for INFO frame .* after 2 tries.*"
                                          r"second interface"):
        SerialDevice(get_config("tiny"), port="loop://", timeout_s=0.05, retries=1)
    with pytest.raises(DeviceError, match="cannot open serial port '/dev/amtpu-none'"):
        SerialDevice(get_config("tiny"), port="/dev/amtpu-none")


@pytest.mark.parametrize("where", ["middle", "last"])
def test_lost_beat_is_reported(board, where):
    """A BEAT frame corrupted on the wire cannot be sent again: the next BEAT's seq shows
    the gap, or (the last one) the receive ends without it; DeviceError says the link lost
    output, and clear() makes the device usable again."""
    model, dev = board("tiny", timeout_s=TIMEOUT_S)
    plan, expected = _gemm("tiny", 3, 2, 2, seed=6)
    if where == "middle":
        model.inject("corrupt", Kind.BEAT)       # the first beat of the answer
        dev.send(plan.beats)
        match = (r"lost output: BEAT frame 1 came where 0 was due: 1 beat\(s\) lost \(a "
                 r"frame from the board was dropped \(CRC\)\)")
    else:
        dev.send(plan.beats[:-1])                # all but HALT: the results come back
        model.inject("corrupt", Kind.BEAT)       # the DONE beat, the last of the answer
        dev.send(plan.beats[-1:])
        match = r"lost output: .*dropped \(CRC\) and no beat came after it"
    assert model.stats["fault corrupt"] == 1
    with pytest.raises(DeviceError, match=match):
        dev.receive(plan.output_beats, timeout_cycles=0)
    with pytest.raises(DeviceError, match="lost output"):
        dev.receive(1)                           # sticky until clear() or reset()
    dev.clear()
    out = run_program(dev, plan.beats, plan.output_beats, instructions=plan.instructions)
    assert np.array_equal(plan.decode(out), expected)


def test_busy_board(board):
    """A core that does not take its input: the two frame buffers fill, the third frame is
    answered NAK BUSY and sent again until the board takes it; the beats arrive once."""
    model, dev = board("small", max_beats=2)
    ref = IsaSimDevice(dev.config)
    plan, expected = _gemm("small", 4, 4, 4, seed=10)
    assert len(plan.beats) > 3 * 2
    model.pause()
    timer = threading.Timer(0.3, model.resume)
    timer.start()
    try:
        dev.send(plan.beats)
    finally:
        timer.join()
    assert model.stats["nak BUSY"] >= 1 and dev.stats["naks"]["BUSY"] >= 1
    out = dev.receive(plan.output_beats)
    _assert_beats(out, run_program(ref, plan.beats, plan.output_beats), "after BUSY")
    assert np.array_equal(plan.decode(out), expected)
    assert model.delivered == plan.beats
    # A board busy for longer than busy_timeout_s.
    dev.busy_timeout_s = 0.2
    model.pause()
    with pytest.raises(DeviceError, match="NAK BUSY for 0.2 s"):
        dev.send(plan.beats)
    assert model.pending == 2
    model.resume()
    dev.reset()
    assert dev.status() == DeviceStatus(error=False, code=isa.ErrorCode.NONE, instr_index=0,
                                        halted=False)


# The link model's frame checks ---------------------------------------------------------------

def _replies(model: LinkModel, data: bytes) -> list[tuple[Kind, int, bytes]]:
    out = []
    for frame in FrameDecoder().feed(model.feed(data)):
        assert isinstance(frame, Frame), frame
        out.append((Kind(frame.kind), frame.seq, frame.payload))
    return out


def _nak(code: Nak, seq: int) -> tuple[Kind, int, bytes]:
    return (Kind.NAK, seq, bytes((code.value,)))


def test_link_model_checks_in_order():
    """Each bad frame gets the NAK of the first check it fails, in the documented order,
    and changes nothing; then the same model runs a program."""
    config = get_config("tiny")
    model = LinkModel(config, max_beats=2)
    bb = model.beat_bytes
    beat = bytes(range(1, bb + 1))
    data = bytes((Kind.DATA.value, 7)) + beat

    def crc(body: bytes) -> bytes:
        return body + crc16(body).to_bytes(2, "little")

    def raw(body: bytes) -> bytes:      # a body framed by END with SLIP escaping
        return slip_encode(body)

    def bad_crc(body: bytes) -> bytes:  # the CRC's high byte wrong
        return body[:-1] + bytes((body[-1] ^ 0xFF,))

    oversize = crc(bytes((Kind.DATA.value, 8)) + beat * 3)
    cases = [
        # ESC + a byte other than ESC_END/ESC_ESC; also when the frame is oversize too.
        (bytes((END, Kind.DATA.value, 9, ESC, 0x01, 0x02, 0x03, END)), _nak(Nak.ESCAPE, 9)),
        (raw(oversize)[:6] + bytes((ESC, 0x00)) + raw(oversize)[6:], _nak(Nak.ESCAPE, 8)),
        # Longer than max_beats beats (even with a bad CRC).
        (raw(oversize), _nak(Nak.OVERSIZE, 8)),
        (raw(bad_crc(oversize)), _nak(Nak.OVERSIZE, 8)),
        # Fewer than 4 bytes: before the CRC check; fewer than 2: seq 0.
        (raw(bytes((Kind.STATUS.value, 5, 0x12))), _nak(Nak.LENGTH, 5)),
        (raw(bytes((0x42,))), _nak(Nak.LENGTH, 0)),
        # CRC, before the kind.
        (raw(bad_crc(crc(bytes((0x7F, 6))))), _nak(Nak.CRC, 6)),
        (raw(bad_crc(crc(data))), _nak(Nak.CRC, 7)),
        # Kind: unknown, or a device-to-host kind; before the payload length.
        (encode_frame(0x7F, 10, b"\x01"), _nak(Nak.KIND, 10)),
        (encode_frame(Kind.ACK, 11), _nak(Nak.KIND, 11)),
        # Payload length: DATA not whole beats, or none; control frames with a payload.
        (encode_frame(Kind.DATA, 12, beat[:-1]), _nak(Nak.LENGTH, 12)),
        (encode_frame(Kind.DATA, 13, beat + beat[:1]), _nak(Nak.LENGTH, 13)),
        (encode_frame(Kind.DATA, 14), _nak(Nak.LENGTH, 14)),
        (encode_frame(Kind.STATUS, 15, b"\x00"), _nak(Nak.LENGTH, 15)),
        (encode_frame(Kind.RESET, 16, b"\x00"), _nak(Nak.LENGTH, 16)),
        # Empty frames and a lone END are ignored.
        (bytes((END, END, END)), None),
    ]
    for i, (wire, reply) in enumerate(cases):
        assert _replies(model, wire) == ([] if reply is None else [reply]), f"case {i}"
    assert model.delivered == [] and model.sim.output == []
    assert model.stats["rx DATA"] == 3 and model.stats["rx STATUS"] == 1
    # Line noise before a frame ends up in a frame of its own.
    status = _replies(model, b"\x11\x22\x33\x44\x55" + encode_frame(Kind.STATUS, 17))
    assert status[0] == _nak(Nak.CRC, 0x22)
    assert status[1][:2] == (Kind.STATUS_REPLY, 17)
    reply = StatusReply.unpack(status[1][2])
    assert reply == StatusReply(status=model.sim.status.as_bits(), cycles=0, data_seq=0,
                                pending=0, seq_valid=False)
    # A truncated frame (no END) is cut off by the next frame's leading END.
    cut = encode_frame(Kind.DATA, 18, beat)[:-3]
    assert _replies(model, cut) == []
    assert _replies(model, encode_frame(Kind.INFO, 19))[0] == _nak(Nak.CRC, 18)
    assert model.delivered == []
    # A whole program through the same model.
    plan, expected = _gemm("tiny", 2, 3, 2, seed=13)
    out = []
    for seq, start in enumerate(range(0, len(plan.beats), 2)):
        chunk = plan.beats[start:start + 2]
        payload = b"".join(b.to_bytes(bb, "little") for b in chunk)
        replies = _replies(model, encode_frame(Kind.DATA, 100 + seq, payload))
        assert replies[0] == (Kind.ACK, 100 + seq, b"")
        out += [int.from_bytes(p, "little") for k, _, p in replies[1:] if k == Kind.BEAT]
        # The same frame again is a retry: ACK, not delivered twice.
        assert _replies(model, encode_frame(Kind.DATA, 100 + seq, payload)) == [
            (Kind.ACK, 100 + seq, b"")]
    assert np.array_equal(plan.decode(out), expected)
    assert model.delivered == plan.beats


def test_link_model_busy_clear_reset():
    """Two frame buffers: the third new DATA frame is NAK BUSY (a retry of the last one is
    still ACKed); CLEAR drops held frames; RESET forgets the DATA seq and numbers BEATs
    from 0 again."""
    model = LinkModel(get_config("tiny"), max_beats=1)
    p = Program(model.config)
    p.halt()
    beat = p.beats[0].to_bytes(model.beat_bytes, "little")
    model.pause()
    assert _replies(model, encode_frame(Kind.DATA, 1, beat)) == [(Kind.ACK, 1, b"")]
    assert _replies(model, encode_frame(Kind.DATA, 2, beat)) == [(Kind.ACK, 2, b"")]
    assert _replies(model, encode_frame(Kind.DATA, 3, beat)) == [_nak(Nak.BUSY, 3)]
    assert _replies(model, encode_frame(Kind.DATA, 2, beat)) == [(Kind.ACK, 2, b"")]
    status = _replies(model, encode_frame(Kind.STATUS, 4))[0]
    assert StatusReply.unpack(status[2]).pending == 2
    assert StatusReply.unpack(status[2]).data_seq == 2
    model.resume()
    beats = _replies(model, b"")
    assert [(k, s) for k, s, _ in beats] == [(Kind.BEAT, 0), (Kind.BEAT, 1)]
    assert beats[0][2] == done_beat(1).to_bytes(model.beat_bytes, "little")
    model.pause()
    _replies(model, encode_frame(Kind.DATA, 5, beat))
    assert model.pending == 1
    assert _replies(model, encode_frame(Kind.CLEAR, 6)) == [(Kind.ACK, 6, b"")]
    assert model.pending == 0
    model.resume()
    assert _replies(model, encode_frame(Kind.DATA, 5, beat)) == [(Kind.ACK, 5, b"")]
    assert model.delivered == [p.beats[0]] * 2     # the retry of 5 was not delivered
    assert _replies(model, encode_frame(Kind.RESET, 7)) == [(Kind.ACK, 7, b"")]
    status = StatusReply.unpack(_replies(model, encode_frame(Kind.STATUS, 8))[0][2])
    assert (status.data_seq, status.seq_valid) == (5, False)   # as the gateware: flag only
    replies = _replies(model, encode_frame(Kind.DATA, 5, beat))  # not a retry any more
    assert [(k, s) for k, s, _ in replies] == [(Kind.ACK, 5), (Kind.BEAT, 0)]
    assert model.delivered == [p.beats[0]]


#: Three one-byte noise frames back to back (issue 35's wire): NAK LENGTH, seq 0, each.
NOISE = bytes((END, 0x01, END, 0x01, END, 0x01, END))


def test_link_model_noise_then_status():
    """Noise, then at once STATUS, in one write: as the gateware does (tests/hdl/
    tb_board_core.py compares the two at the UART pins), the NAKs that find the reply queue
    holding one are dropped, and the STATUS is answered: for three, a NAK (sent at once), a
    NAK (queued), then the STATUS_REPLY; for fifteen, a NAK each time the queue was empty."""
    model = LinkModel(get_config("tiny"), max_beats=4)
    for noise, naks in ((NOISE, 2), (NOISE * 5, None)):
        before = model.stats["lost NAK"]
        replies = _replies(model, noise + encode_frame(Kind.STATUS, 0x66))
        assert set(replies[:-1]) == {_nak(Nak.LENGTH, 0)}, replies
        assert len(replies) - 1 == (naks or len(replies) - 1) < noise.count(0x01)
        assert model.stats["lost NAK"] - before == noise.count(0x01) - (len(replies) - 1)
        assert replies[-1][:2] == (Kind.STATUS_REPLY, 0x66)
        assert StatusReply.unpack(replies[-1][2]) == StatusReply(
            status=0, cycles=0, data_seq=0, pending=0, seq_valid=False)
    # Replies to frames with a good CRC (a KIND NAK, STATUS) fill the queue; the third
    # request of a flood finds it full (a host that waits for each answer never floods).
    flood = encode_frame(0x06, 1) + encode_frame(Kind.STATUS, 2) + encode_frame(Kind.INFO, 3)
    assert [(k, s) for k, s, _ in _replies(model, flood)] == [
        (Kind.NAK, 1), (Kind.STATUS_REPLY, 2), (Kind.INFO_REPLY, 3)]
    assert model.stats["lost INFO_REPLY"] == 0
    many = b"".join(encode_frame(Kind.STATUS, seq) for seq in range(8))
    got = [s for _, s, _ in _replies(model, many)]
    assert got[:3] == [0, 1, 2] and len(got) < 8, got
    assert model.stats["lost STATUS_REPLY"] == 8 - len(got)


def test_link_model_decoding_busy_clear_resync():
    """What docs/host-link.md promises a host writer, on the model: ESC then a byte other
    than ESC_END/ESC_ESC decodes to that byte (the NAK ESCAPE's seq shows it), ESC right
    before END; BUSY decided as a frame's first byte arrives; CLEAR keeps the last DATA
    seq (a resent frame is ACKed and never runs); the resynchronisation word with no error
    pending restarts the program (instruction index 0)."""
    model = LinkModel(get_config("tiny"), max_beats=1)
    bb = model.beat_bytes
    for wire, seq in [(bytes((END, ESC, 0x33, 0x44, END)), 0x44),
                      (bytes((END, 0x01, ESC, 0x55, 0x66, END)), 0x55),
                      (bytes((END, ESC, ESC, 0xDC, 0x02, END)), 0xDC),
                      (bytes((END, 0x02, 0x07, ESC, END)), 0x07)]:
        assert _replies(model, wire) == [_nak(Nak.ESCAPE, seq)], wire.hex(" ")
    p = Program(model.config)
    p.read_host(0, [[1, 2]])
    words = [w.to_bytes(bb, "little") for w in p.beats]
    # BUSY at the first byte: both buffers taken as the third frame begins.
    model.pause()
    assert _replies(model, encode_frame(Kind.DATA, 1, words[0])) == [(Kind.ACK, 1, b"")]
    assert _replies(model, encode_frame(Kind.DATA, 2, words[1])) == [(Kind.ACK, 2, b"")]
    third = encode_frame(Kind.DATA, 3, isa.RESYNC_WORD.to_bytes(bb, "little"))
    assert _replies(model, third[:5]) == []
    model.resume()
    assert model.pending == 0 and model.delivered == p.beats
    assert _replies(model, third[5:]) == [_nak(Nak.BUSY, 3)]
    # The resynchronisation word with no error pending: the program restarts.
    assert model.sim.status.instr_index == 1
    assert _replies(model, third) == [(Kind.ACK, 3, b"")]
    status = StatusReply.unpack(_replies(model, encode_frame(Kind.STATUS, 4))[0][2])
    assert (status.status, status.data_seq) == (0, 3), status
    # CLEAR keeps the last DATA seq: the same frame again is a retry, never delivered.
    assert _replies(model, encode_frame(Kind.CLEAR, 5)) == [(Kind.ACK, 5, b"")]
    assert _replies(model, third) == [(Kind.ACK, 3, b"")]
    assert model.delivered == [*p.beats, isa.RESYNC_WORD] and model.stats["retry"] == 1


# Framing through pyserial --------------------------------------------------------------------

def test_framing_round_trip_over_loop():
    """encode_frame through pyserial's loop:// and back through FrameDecoder: the same
    frames, END and ESC in payloads escaped, frames split across reads anywhere."""
    seed = 1234
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    frames = [Frame(kind=Kind.DATA.value, seq=0, payload=bytes((END, ESC, END, ESC)))]
    for _ in range(40):
        size = int(rng.integers(0, 40))
        payload = bytes(rng.choice([END, ESC, 0x00, 0xDC, 0xDD, *range(8)], size).tolist())
        frames.append(Frame(kind=int(rng.choice([k.value for k in Kind])),
                            seq=int(rng.integers(0, 256)), payload=payload))
    wire = b"".join(encode_frame(f.kind, f.seq, f.payload) for f in frames)
    port = serial.serial_for_url("loop://", baudrate=3_000_000, timeout=0.5)
    try:
        port.write(wire)
        back = port.read(len(wire))
    finally:
        port.close()
    assert back == wire
    for f in frames:
        body = encode_frame(f.kind, f.seq, f.payload)[1:-1]
        assert END not in body, "END inside a frame"
    decoder = FrameDecoder()
    got: list = []
    cuts = sorted(rng.choice(len(back), 25, replace=False).tolist())
    for a, b in zip([0, *cuts], [*cuts, len(back)], strict=True):
        got += decoder.feed(back[a:b])
    assert got == frames
    assert isinstance(FrameDecoder().feed(bytes((END, 1, 2, 3, 4, END)))[0], FrameError)


def test_docs_worked_example():
    """docs/host-link.md's worked example is what encode_frame and the link model send."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "host-link.md").read_text()
    config = get_config("tiny")
    p = Program(config)
    p.read_host(3, [[-64, 0x25]])
    p.halt()
    assert p.beats == [0x10000000303, 0x25C0, 0x1]
    payload = b"".join(b.to_bytes(8, "little") for b in p.beats)
    model = LinkModel(config, max_beats=8)
    replies = model.feed(encode_frame(Kind.DATA, 5, payload))
    for wire in (encode_frame(Kind.DATA, 5, payload), encode_frame(Kind.ACK, 5),
                 encode_frame(Kind.BEAT, 0, done_beat(2).to_bytes(8, "little")),
                 encode_frame(Kind.NAK, 5, bytes((Nak.CRC.value,))),
                 encode_frame(Kind.STATUS, 6)):
        assert wire.hex(" ") in text, wire.hex(" ")
    assert replies == encode_frame(Kind.ACK, 5) + encode_frame(
        Kind.BEAT, 0, done_beat(2).to_bytes(8, "little"))
    body = bytes((Kind.DATA.value, 5)) + payload
    assert f"body:  {body.hex(' ')}" in text and f"body: 0x{crc16(body):04x}" in text


# Bad input, command line ---------------------------------------------------------------------

def test_bad_input(board):
    model, dev = board("tiny")
    with pytest.raises(ValueError, match="does not fit in host_width=64 bits"):
        dev.send([1 << 64])
    with pytest.raises(ValueError, match=r"count=-1 .* allowed: an int >= 0"):
        dev.receive(-1)
    with pytest.raises(ValueError, match=r"timeout_cycles=-5"):
        dev.receive(1, timeout_cycles=-5)
    for kwargs, match in [({"port": ""}, "port=''"), ({"port": "loop://", "baudrate": 0},
                                                       "baudrate=0"),
                          ({"port": "loop://", "retries": -1}, "retries=-1"),
                          ({"port": "loop://", "timeout_s": 0}, "timeout_s=0")]:
        with pytest.raises(ValueError, match=match):
            SerialDevice(model.config, **kwargs)
    with pytest.raises(ValueError, match="fault 'explode' is not supported; allowed"):
        model.inject("explode")
    with pytest.raises(ValueError, match="max_beats=0 is not supported"):
        LinkModel(model.config, max_beats=0)
    assert model.delivered == []


def test_cli_demo_over_serial(board, capsys):
    """amtpu demo --transport serial against a served link model: exact outputs."""
    model, _ = board("default", max_beats=16, open_device=False)
    assert cli_main(["demo", "--config", "default", "--transport", "serial", "--port",
                     model.url, "--images", "6", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "transport serial (socket://" in out
    assert "serial outputs equal to the int8 reference: every one of" in out
    with pytest.raises(SystemExit):
        cli_main(["demo", "--transport", "serial"])
    assert "needs --port" in capsys.readouterr().err


def test_link_model_command_line():
    """python -m sim.models.link_model serves a board a SerialDevice can open."""
    process = subprocess.Popen([sys.executable, "-m", "sim.models.link_model", "--config", "tiny",
                                "--max-beats", "3"], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "tiny" in line and "socket://127.0.0.1:" in line, line
        url = line.split(" on ")[1].split(";")[0]
        with SerialDevice(get_config("tiny"), port=url, timeout_s=0.5) as dev:
            assert dev.info.max_beats == 3
            assert dev.status().instr_index == 0
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
