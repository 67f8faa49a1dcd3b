"""cocotb testbench: BoardCore (UART, host link, core) through its two UART pins.

The host is modelled bit by bit: its transmitter drives ``i_rx`` with ``Timer`` steps of
one bit time, starting off the clock's phase (a real host's UART is asynchronous to the
board clock), and its receiver samples ``o_tx`` in the middle of each bit after the start
bit's falling edge. Frames are made and read with the real framing code
(:mod:`hdl.link.protocol`: ``encode_frame``, ``FrameDecoder``, ``StatusReply``,
``InfoReply``); programs are built with :class:`firmware.asm.Program` and run through
:class:`sim.models.isa_sim.IsaSim`, whose output must equal the BEAT frames the board sends
(``==``, the timing-dependent counters aside). After every error case (bad CRC, a
truncated frame, garbage, an oversize frame, an instruction failing its checks cleared with
CLEAR or the resynchronisation word, RESET, noise filling the reply queue, the
resynchronisation word with no error pending) the state read back with WRITE_HOST equals
IsaSim's; the replies to noise equal :class:`sim.models.link_model.LinkModel`'s. Every
wait has a time limit sized to the bytes it waits for, and a timeout names what was
awaited.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time
from cocotb.triggers import Event, FallingEdge, First, Timer

from firmware.asm import Program
from hdl import isa
from hdl.beats import DONE_MAGIC, ERROR_MAGIC
from hdl.isa import ErrorCode, Func
from hdl.link import protocol as lp
from hdl.link.board_core import running_epoch_bits
from hdl.link.protocol import Frame, FrameDecoder, FrameError, Kind, Nak, encode_frame
from sim.models.isa_sim import IsaSim
from sim.models.link_model import LinkModel
from sim.rtl.runner import config_from_env
from sim.rtl.streams import reset, start_clock

CLK_NS = 10
DIVISOR = int(os.environ.get("AMTPU_DIVISOR", "4"))
MAX_BEATS = int(os.environ.get("AMTPU_MAX_BEATS", "4"))
CLOCK_HZ = int(os.environ.get("AMTPU_CLOCK_HZ", "20000"))
BIT_NS = DIVISOR * CLK_NS
BYTE_NS = 10 * BIT_NS
#: The host UART's phase against the board clock (not a multiple of the clock period).
PHASE_NS = 3.7
#: Cycles the core may work without a byte on the wire (a reset's memory scrub, a MATMUL).
CORE_SLACK_CYCLES = 4_000
SEED = 2027
#: Unified-buffer rows read back after each error case: every row the cases write.
READ_BACK_ROWS = 12


class Host:
    """The host: a bit-level UART on the board's pins and the link protocol on top.

    BEAT frames are collected in :attr:`beats` (their seqs must count up from 0 or the
    last RESET), other frames in :attr:`replies`; a frame from the board that fails to
    decode, or a bad stop bit, is recorded and fails the test.
    """

    def __init__(self, dut):
        self.dut = dut
        self.config = config_from_env("tiny")
        self.beat_bytes = self.config.host_width // 8
        self.limit = lp.max_body(MAX_BEATS, self.beat_bytes)
        self.ref = IsaSim(self.config)
        self.to_board: deque[int] = deque()
        self._tx_wake = Event()
        self._changed = Event()
        self.decoder = FrameDecoder()
        self.beats: list[int] = []
        self.replies: list[Frame] = []
        self.problems: list[str] = []
        self.beat_seq = 0
        self.data_seq = 0
        self._tasks = []

    async def start(self) -> None:
        dut = self.dut
        dut.i_rx.value = 1
        start_clock(dut, CLK_NS)
        await reset(dut, 4)
        self._tasks = [cocotb.start_soon(self._uart_tx()), cocotb.start_soon(self._uart_rx())]
        dut._log.info(f"config {self.config}, divisor {DIVISOR}, max_beats {MAX_BEATS}, "
                      f"seed {SEED}")

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        assert not self.problems, f"seed {SEED}: {self.problems}"

    # The UART, bit by bit ------------------------------------------------------------------

    async def _uart_tx(self):
        await Timer(PHASE_NS, "ns")
        while True:
            while not self.to_board:
                self._tx_wake.clear()
                await self._tx_wake.wait()
            byte = self.to_board.popleft()
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                self.dut.i_rx.value = bit
                await Timer(BIT_NS, "ns")

    async def _uart_rx(self):
        o_tx = self.dut.o_tx
        while True:
            await FallingEdge(o_tx)
            await Timer(BIT_NS // 2 + 1, "ns")
            if int(o_tx.value) != 0:
                self.problems.append(f"a start bit shorter than half a bit at "
                                     f"{get_sim_time('ns')} ns")
                continue
            byte = 0
            for i in range(8):
                await Timer(BIT_NS, "ns")
                byte |= int(o_tx.value) << i
            await Timer(BIT_NS, "ns")
            if int(o_tx.value) != 1:
                self.problems.append(f"a low stop bit at {get_sim_time('ns')} ns")
            for frame in self.decoder.feed(bytes([byte])):
                self._frame(frame)

    def _frame(self, frame: Frame | FrameError) -> None:
        if isinstance(frame, FrameError):
            self.problems.append(f"a frame from the board failed to decode: {frame}")
        elif frame.kind == Kind.BEAT.value:
            if frame.seq != self.beat_seq:
                self.problems.append(f"BEAT seq {frame.seq}, expected {self.beat_seq}")
            self.beat_seq = (frame.seq + 1) % 256
            self.beats.append(int.from_bytes(frame.payload, "little"))
        else:
            self.replies.append(frame)
        self._changed.set()

    # Waiting, with a limit -----------------------------------------------------------------

    async def wait_for(self, cond, what: str, timeout_ns: float) -> None:
        deadline = get_sim_time("ns") + timeout_ns
        while not cond():
            left = deadline - get_sim_time("ns")
            if left <= 0:
                raise AssertionError(
                    f"seed {SEED}: timed out after {timeout_ns / 1000:.1f} us waiting for "
                    f"{what}; {len(self.replies)} replies (last {self.replies[-1:]}), "
                    f"{len(self.beats)} beats, {len(self.to_board)} bytes unsent; "
                    f"problems {self.problems}")
            self._changed.clear()
            await First(self._changed.wait(), Timer(round(left) + 1, "ns"))

    @staticmethod
    def budget_ns(wire_bytes: int) -> float:
        return 2 * wire_bytes * BYTE_NS + CORE_SLACK_CYCLES * CLK_NS

    # Frames --------------------------------------------------------------------------------

    def send(self, wire: bytes) -> None:
        self.to_board.extend(wire)
        self._tx_wake.set()

    async def request(self, wire: bytes, what: str) -> Frame:
        """Send ``wire`` and return the next reply (a BEAT frame in flight may come first)."""
        n = len(self.replies)
        self.send(wire)
        out = 2 * (self.beat_bytes * 2 + 6) + 50       # a BEAT frame, then the reply
        await self.wait_for(lambda: len(self.replies) > n, f"the reply to {what}",
                            self.budget_ns(len(self.to_board) + out))
        return self.replies[n]

    async def expect(self, wire: bytes, kind: Kind, seq: int, what: str,
                     payload: bytes | None = None) -> Frame:
        reply = await self.request(wire, what)
        assert (reply.kind, reply.seq) == (kind.value, seq), \
            f"seed {SEED}: {what}: expected {kind.name} seq {seq}, got {reply}"
        if payload is not None:
            assert reply.payload == payload, f"seed {SEED}: {what}: {reply}"
        return reply

    async def expect_nak(self, wire: bytes, code: Nak, seq: int, what: str) -> None:
        await self.expect(wire, Kind.NAK, seq, what, bytes([code.value]))

    async def status(self, seq: int = 0x5A) -> lp.StatusReply:
        reply = await self.expect(encode_frame(Kind.STATUS, seq), Kind.STATUS_REPLY, seq,
                                  "STATUS")
        return lp.StatusReply.unpack(reply.payload)

    def data_frame(self, seq: int, beats: list[int]) -> bytes:
        return encode_frame(Kind.DATA, seq, b"".join(
            int(b).to_bytes(self.beat_bytes, "little") for b in beats))

    def next_seq(self) -> int:
        self.data_seq = (self.data_seq + 1) % 256
        return self.data_seq

    async def send_beats(self, beats: list[int], what: str) -> None:
        """Beats to the core in DATA frames of up to MAX_BEATS, each sent again after NAK
        BUSY (the core may be busy sending output through the slower UART)."""
        for start in range(0, len(beats), MAX_BEATS):
            chunk = beats[start:start + MAX_BEATS]
            seq = self.next_seq()
            wire = self.data_frame(seq, chunk)
            for _ in range(200):
                reply = await self.request(wire, f"{what}, DATA seq {seq}")
                if reply.kind == Kind.NAK.value and reply.payload == bytes([Nak.BUSY.value]):
                    await Timer(20 * BYTE_NS, "ns")
                    continue
                assert (reply.kind, reply.seq) == (Kind.ACK.value, seq), \
                    f"seed {SEED}: {what}: DATA seq {seq} answered {reply}"
                break
            else:
                raise AssertionError(f"seed {SEED}: {what}: DATA seq {seq} still BUSY")

    async def run(self, beats: list[int], what: str) -> None:
        """Run ``beats`` on the board and on IsaSim; the board's output must equal IsaSim's
        (``None``, a timing-dependent counter, matches any value)."""
        first = len(self.beats)
        expected = self.ref.run(beats)
        await self.send_beats(beats, what)
        await self.wait_for(lambda: len(self.beats) >= first + len(expected),
                            f"{len(expected)} beats of {what}",
                            self.budget_ns(len(expected) * (2 * self.beat_bytes + 6)))
        got = self.beats[first:]
        assert got == [g if e is None else e for e, g in zip(expected, got, strict=True)], \
            f"seed {SEED}: {what}: the board's output differs from IsaSim's"

    async def read_back(self, what: str) -> None:
        """WRITE_HOST of the first READ_BACK_ROWS unified-buffer rows, then HALT: the board
        must send IsaSim's beats, and then have IsaSim's status."""
        p = Program(self.config)
        p.write_host(0, READ_BACK_ROWS)
        p.halt()
        await self.run(p.beats, f"read-back after {what}")
        st = await self.status()
        assert (st.status, st.pending) == (self.ref.status.as_bits(), 0), \
            f"seed {SEED}: after {what}: {st}, IsaSim {self.ref.status}"


def setup_program(config, rng: np.random.Generator) -> Program:
    """State for the error cases: eight buffer rows and a weight tile."""
    p = Program(config)
    p.read_host(0, rng.integers(-128, 128, (8, config.ub_row)))
    p.load_weights(0, rng.integers(-128, 128, (config.rows, config.cols)))
    return p


async def start(dut) -> Host:
    host = Host(dut)
    await host.start()
    return host


@cocotb.test()
async def test_program(dut):
    """INFO and STATUS, then READ_HOST, LOAD_WEIGHTS, READ_WEIGHTS, MATMUL, LOAD_PARAMS,
    ACTIVATE (ReLU), WRITE_HOST, READ_COUNTERS and HALT: the BEAT frames equal IsaSim's
    output; a DATA frame sent twice (its ACK lost) is not delivered twice; the LEDs."""
    host = await start(dut)
    cfg = host.config
    rng = np.random.default_rng(SEED)
    info = await host.expect(encode_frame(Kind.INFO, 1), Kind.INFO_REPLY, 1, "INFO")
    assert lp.InfoReply.unpack(info.payload) == lp.InfoReply.of(
        cfg, max_beats=MAX_BEATS, clock_hz=CLOCK_HZ)
    st = await host.status(2)
    assert (st.status, st.pending, st.seq_valid) == (0, 0, False), st
    assert int(dut.o_running.value) == 0 and int(dut.o_error.value) == 0

    p = Program(cfg)
    p.read_host(0, rng.integers(-128, 128, (6, cfg.ub_row)))
    p.load_weights(0, rng.integers(-128, 128, (cfg.rows, cfg.cols)))
    p.read_weights(0, 1)
    p.matmul(0, 0, 6, switch=True)
    p.load_params(0, rng.integers(-2**12, 2**12, cfg.cols), rng.integers(1, 2**14, cfg.cols),
                  shift=14, zp=-3, clamp=100)
    p.activate(0, 16, 6, func=Func.RELU)
    p.write_host(16, 6)
    p.write_host(0, 6)
    p.read_counters()
    p.halt()
    expected = host.ref.run(p.beats)
    assert any(b not in (None, 0) for b in expected[:6]), "a ReLU output of all zeros"

    # The first frame twice with the same seq: ACKed twice, delivered once.
    first = p.beats[:MAX_BEATS]
    seq = host.next_seq()
    wire = host.data_frame(seq, first)
    await host.expect(wire, Kind.ACK, seq, "first DATA frame")
    await host.expect(wire, Kind.ACK, seq, "the same frame again")
    await host.send_beats(p.beats[MAX_BEATS:], "the program")
    await host.wait_for(lambda: len(host.beats) >= len(expected), "the program's output",
                        host.budget_ns(len(expected) * (2 * host.beat_bytes + 6)))
    got = host.beats
    assert got == [g if e is None else e for e, g in zip(expected, got, strict=True)], \
        f"seed {SEED}: the board's output differs from IsaSim's"
    assert int(dut.o_running.value) == 1, "o_running is dark right after the core's output"
    st = await host.status(3)
    assert (st.status, st.pending, st.data_seq, st.seq_valid) == \
        (host.ref.status.as_bits(), 0, host.data_seq, True), st
    # The LED goes dark by the end of the epoch after the last beat's (two epochs at most).
    await Timer(((2 << running_epoch_bits(CLOCK_HZ)) + 100) * CLK_NS, "ns")
    assert int(dut.o_running.value) == 0, "o_running still lit long after the last beat"
    host.stop()


@cocotb.test()
async def test_bad_crc(dut):
    """A DATA frame with a payload bit flipped is NAK CRC and changes nothing; sent again
    intact, it is ACKed and run."""
    host = await start(dut)
    rng = np.random.default_rng(SEED + 1)
    await host.run(setup_program(host.config, rng).beats, "setup")
    p = Program(host.config)
    p.read_host(2, rng.integers(-128, 128, (3, host.config.ub_row)))
    seq = host.next_seq()
    wire = bytearray(host.data_frame(seq, p.beats))
    wire[4] ^= 0x01                     # a payload byte (kind, seq, then the payload)
    assert wire[4] not in (lp.END, lp.ESC) and wire[4] ^ 1 not in (lp.END, lp.ESC)
    await host.expect_nak(bytes(wire), Nak.CRC, seq, "a corrupted frame")
    st = await host.status()
    assert (st.pending, st.data_seq) == (0, (seq - 1) % 256), st
    await host.read_back("a corrupted frame")
    await host.expect(host.data_frame(seq, p.beats), Kind.ACK, seq, "the frame intact")
    host.ref.feed(p.beats)
    await host.read_back("the frame sent again")
    host.stop()


@cocotb.test()
async def test_truncated_frame(dut):
    """The first half of a DATA frame, then the next frame (its leading END ends the cut
    one): the cut frame is NAKed as the protocol model says, the next one runs."""
    host = await start(dut)
    rng = np.random.default_rng(SEED + 2)
    await host.run(setup_program(host.config, rng).beats, "setup")
    p = Program(host.config)
    p.read_host(1, rng.integers(-128, 128, (MAX_BEATS - 1, host.config.ub_row)))
    seq = host.next_seq()
    wire = host.data_frame(seq, p.beats)
    cut = wire[:len(wire) // 2]
    (error,) = FrameDecoder(host.limit).feed(cut + bytes([lp.END]))
    assert isinstance(error, FrameError)
    n = len(host.replies)
    host.send(cut)
    reply = await host.request(wire, "a cut frame, then the whole one")
    await host.wait_for(lambda: len(host.replies) >= n + 2, "the second reply",
                        host.budget_ns(100))
    nak, ack = host.replies[n:n + 2]
    assert (nak.kind, nak.seq, nak.payload) == (Kind.NAK.value, error.seq,
                                                bytes([error.code.value])), nak
    assert reply == nak and (ack.kind, ack.seq) == (Kind.ACK.value, seq), ack
    host.ref.feed(p.beats)
    await host.read_back("a truncated frame")
    host.stop()


@cocotb.test()
async def test_garbage(dut):
    """Line noise between frames: each garbage frame is NAKed with the code the protocol
    model gives, nothing reaches the core, the next frame runs."""
    host = await start(dut)
    rng = np.random.default_rng(SEED + 3)
    await host.run(setup_program(host.config, rng).beats, "setup")
    garbage = [bytes([0x13, 0x37, lp.ESC, 0x00, 0x42, lp.END]),
               bytes([0xFF, 0xFE, lp.END]),
               bytes([Kind.DATA.value, 0x07]) + bytes(rng.integers(0, 0xC0, 9).tolist()) +
               bytes([lp.END]),
               bytes([lp.ESC, lp.END])]
    model = FrameDecoder(host.limit)
    for noise in garbage:
        (error,) = model.feed(noise)
        assert isinstance(error, FrameError), f"seed {SEED}: garbage decoded as {error}"
        await host.expect_nak(noise, error.code, error.seq, f"garbage {noise.hex()}")
    await host.read_back("garbage")
    p = Program(host.config)
    p.read_host(5, rng.integers(-128, 128, (2, host.config.ub_row)))
    await host.run(p.beats, "a frame after the garbage")
    await host.read_back("garbage and a frame")
    host.stop()


@cocotb.test()
async def test_oversize(dut):
    """A DATA frame of MAX_BEATS + 1 beats is NAK OVERSIZE and changes nothing."""
    host = await start(dut)
    rng = np.random.default_rng(SEED + 4)
    await host.run(setup_program(host.config, rng).beats, "setup")
    p = Program(host.config)
    p.read_host(0, rng.integers(-128, 128, (MAX_BEATS, host.config.ub_row)))
    seq = host.next_seq()
    await host.expect_nak(host.data_frame(seq, p.beats), Nak.OVERSIZE, seq, "oversize")
    await host.read_back("an oversize frame")
    host.stop()


async def _instruction_error(dut, recover: str) -> None:
    host = await start(dut)
    cfg = host.config
    rng = np.random.default_rng(SEED + 5)
    await host.run(setup_program(cfg, rng).beats, "setup")
    p = Program(cfg)
    p.read_host(8, rng.integers(-128, 128, (2, cfg.ub_row)))
    p.write_host(cfg.ub_depth - 2, 4)                          # past the buffer: UB_RANGE
    p.read_host(0, rng.integers(-128, 128, (2, cfg.ub_row)))   # discarded by the core
    first = len(host.beats)
    host.ref.feed(p.beats)
    assert host.ref.status.error and host.ref.status.code == ErrorCode.UB_RANGE
    expected = host.ref.output[first:]
    assert len(expected) == 1 and expected[0] >> 32 == ERROR_MAGIC, expected
    await host.send_beats(p.beats, "a failing program")
    await host.wait_for(lambda: len(host.beats) > first, "the error beat",
                        host.budget_ns(3 * (2 * host.beat_bytes + 6)))
    assert host.beats[first:] == expected
    st = await host.status()
    assert st.status == host.ref.status.as_bits(), (st, host.ref.status)
    assert int(dut.o_error.value) == 1
    if recover == "clear":
        seq = 0x30
        await host.expect(encode_frame(Kind.CLEAR, seq), Kind.ACK, seq, "CLEAR")
        host.ref.clear()
    else:
        await host.send_beats([isa.RESYNC_WORD], "the resynchronisation word")
        host.ref.feed([isa.RESYNC_WORD])
    st = await host.status()
    assert st.status == host.ref.status.as_bits() and not host.ref.status.error, st
    assert int(dut.o_error.value) == 0
    await host.read_back(f"an instruction error and {recover}")
    host.stop()


@cocotb.test()
async def test_instruction_error_clear(dut):
    """An instruction that fails its checks: its error beat comes back as a BEAT, STATUS
    shows IsaSim's status, CLEAR recovers; the state equals IsaSim's."""
    await _instruction_error(dut, "clear")


@cocotb.test()
async def test_instruction_error_resync(dut):
    """As test_instruction_error_clear, recovering in band with the resynchronisation
    word."""
    await _instruction_error(dut, "resync")


@cocotb.test()
async def test_reset(dut):
    """RESET: ACK, the core reset (memories scrubbed: IsaSim's reset state reads back), the
    BEAT numbering from 0, the DATA seq forgotten."""
    host = await start(dut)
    rng = np.random.default_rng(SEED + 6)
    await host.run(setup_program(host.config, rng).beats, "setup")
    await host.expect(encode_frame(Kind.RESET, 0x40), Kind.ACK, 0x40, "RESET")
    host.ref.reset()
    host.beat_seq = 0
    st = await host.status()
    assert (st.status, st.pending, st.seq_valid) == (0, 0, False), st
    host.data_seq = (host.data_seq - 1) % 256     # the last seq is new again after RESET
    await host.read_back("RESET")
    host.stop()



#: Three one-byte frames of line noise, back to back (each a NAK LENGTH, seq 0).
NOISE = bytes([lp.END, 0x01, lp.END, 0x01, lp.END, 0x01, lp.END])


def _masked(frames: list[Frame]) -> list[tuple[int, int, bytes]]:
    """Frames as (kind, seq, payload), a STATUS_REPLY's cycle count zeroed, and its DATA seq
    too while its flag says there is none (the board keeps the last one over a reset)."""
    out = []
    for f in frames:
        payload = f.payload
        if f.kind == Kind.STATUS_REPLY.value:
            st = lp.StatusReply.unpack(payload)
            payload = dataclasses.replace(st, cycles=0,
                                          data_seq=st.data_seq if st.seq_valid else 0).pack()
        out.append((f.kind, f.seq, payload))
    return out


@cocotb.test()
async def test_noise_then_status(dut):
    """Three one-byte noise frames and at once a STATUS (the wire of issue 35): the
    STATUS_REPLY arrives with the board's state, and the replies are the link model's, byte
    for byte (the cycle count aside): the first two NAKs (the third found a NAK waiting).
    Then the same right after the ACK of a DATA frame whose WRITE_HOST sends BEAT frames of
    escaped bytes: a BEAT frame goes out as the noise comes in and keeps the transmitter busy
    until the STATUS has come, and its reply still arrives (the board used to answer three
    frames ahead and drop the rest: the three NAKs took every place)."""
    host = await start(dut)
    cfg = host.config
    n = len(host.replies)
    wire = NOISE + encode_frame(Kind.STATUS, 0x66)
    model = LinkModel(cfg, max_beats=MAX_BEATS, clock_hz=CLOCK_HZ)
    expected = FrameDecoder().feed(model.feed(wire))
    await host.request(wire, "noise, then STATUS")
    await host.wait_for(lambda: len(host.replies) >= n + len(expected),
                        "the replies to the noise and the STATUS", host.budget_ns(100))
    await Timer(40 * BYTE_NS, "ns")                 # and nothing more
    got = host.replies[n:]
    assert _masked(got) == _masked(expected), f"seed {SEED}: board {got}, model {expected}"
    st = lp.StatusReply.unpack(got[-1].payload)
    assert (got[-1].kind, got[-1].seq) == (Kind.STATUS_REPLY.value, 0x66), got
    assert (st.status, st.pending, st.seq_valid) == (0, 0, False), st

    # Output of END bytes (-64 is 0xC0): every payload byte of a BEAT frame escaped.
    p = Program(cfg)
    p.read_host(0, np.full((2, cfg.ub_row), -64))
    p.write_host(0, 2)
    assert len(p.beats) <= MAX_BEATS
    first = len(host.beats)
    expected_beats = host.ref.run(p.beats)
    await host.send_beats(p.beats, "READ_HOST and WRITE_HOST of END bytes")
    n = len(host.replies)
    await host.request(wire, "noise, then STATUS, while BEAT frames go out")
    await host.wait_for(lambda: any(r.kind == Kind.STATUS_REPLY.value
                                    for r in host.replies[n:]),
                        "the STATUS_REPLY after the noise", host.budget_ns(200))
    got = host.replies[n:]
    status = got[-1]
    assert (status.kind, status.seq) == (Kind.STATUS_REPLY.value, 0x66), got
    assert all((r.kind, r.seq, r.payload) == (Kind.NAK.value, 0, bytes([Nak.LENGTH.value]))
               for r in got[:-1]) and len(got) <= 3, got
    st = lp.StatusReply.unpack(status.payload)
    assert (st.status, st.pending, st.data_seq, st.seq_valid) == \
        (host.ref.status.as_bits(), 0, host.data_seq, True), st
    await host.wait_for(lambda: len(host.beats) >= first + len(expected_beats),
                        "the output", host.budget_ns(len(expected_beats) * 30))
    assert host.beats[first:] == expected_beats
    await host.read_back("noise while BEAT frames go out")
    host.stop()


@cocotb.test()
async def test_resync_without_error(dut):
    """The resynchronisation word with no error pending restarts the program: STATUS shows
    instruction index 0 (IsaSim's status), and the next HALT's DONE beat counts from it."""
    host = await start(dut)
    cfg = host.config
    rng = np.random.default_rng(SEED + 7)
    p = Program(cfg)
    p.read_host(0, rng.integers(-128, 128, (2, cfg.ub_row)))
    p.write_host(0, 1)
    await host.run(p.beats, "two instructions, no HALT")
    st = await host.status()
    assert st.status == host.ref.status.as_bits() and host.ref.status.instr_index == 2, st
    await host.run([isa.RESYNC_WORD], "the resynchronisation word, no error pending")
    st = await host.status()
    assert st.status == host.ref.status.as_bits() == 0, (st, host.ref.status)
    halt = Program(cfg)
    halt.halt()
    await host.run(halt.beats, "HALT")
    assert host.beats[-1] == DONE_MAGIC << 32 | 1, hex(host.beats[-1])
    await host.read_back("the resynchronisation word without an error")
    host.stop()
