# amaranth: UnusedElaboratable=no
"""HostLink (hdl.link.host_link) in amaranth.sim against the frame protocol (hdl.link.protocol).

The testbench plays both neighbours: the host side sends bytes made with
``link_protocol.encode_frame`` (one a cycle at most, or every other cycle for the link
with ``registered_checks``, never waiting: a UART cannot) and
decodes what comes back with ``link_protocol.FrameDecoder``; a stub core takes the beats the
link delivers and sends beats of its own, both with random stalls, and plays the core's
status, ``i_clear`` and reset. Delivered beats, replies and BEAT frames are compared with
``==``; seeds are fixed and printed.
(The first line keeps Amaranth from warning about the objects that constructors given
bad arguments leave behind.)
"""

from __future__ import annotations

import random
import struct
from collections import deque
from collections.abc import Callable

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hdl.config import TPUConfig
from hdl.isa import Status
from hdl.link import protocol as lp
from hdl.link.host_link import REPLY_QUEUE_DEPTH, HostLink
from hdl.link.protocol import Frame, FrameDecoder, FrameError, Kind, Nak, encode_frame
from hdl.presets import get_config

TINY = get_config("tiny")           # 64-bit beats: 8 bytes
CLOCK_HZ = 12_000_000
STATUS = data.Layout.cast(Status)
ERROR_BIT = 1 << STATUS["error"].offset
#: The longest any single wait may take, in cycles: a hang fails within seconds.
WAIT_LIMIT = 20_000
#: Whether the benches build HostLink with ``registered_checks`` (set by :func:`checks`).
REGISTERED_CHECKS = [False]


@pytest.fixture(autouse=True, params=[False, pytest.param(True, marks=pytest.mark.slow)],
                ids=["checks", "registered-checks"])
def checks(request):
    """Every test twice: the link's frame checks combinational, and registered (the ULX3S
    build's; the host then leaves a cycle between bytes; in make regression)."""
    REGISTERED_CHECKS[0] = request.param
    yield request.param
    REGISTERED_CHECKS[0] = False


def beat_bytes(config: TPUConfig) -> int:
    return config.host_width // 8


def to_bytes(beats: list[int], config: TPUConfig) -> bytes:
    return b"".join(b.to_bytes(beat_bytes(config), "little") for b in beats)


def random_beats(rng: random.Random, n: int, config: TPUConfig, special: float = 0.25
                 ) -> list[int]:
    """Beats whose bytes are END or ESC with probability ``special``, else random."""
    out = []
    for _ in range(n):
        raw = bytes(rng.choice((lp.END, lp.ESC)) if rng.random() < special
                    else rng.randrange(256) for _ in range(beat_bytes(config)))
        out.append(int.from_bytes(raw, "little"))
    return out


def data_frame(seq: int, beats: list[int], config: TPUConfig = TINY) -> bytes:
    return encode_frame(Kind.DATA, seq, to_bytes(beats, config))


def body_frame(body: bytes) -> bytes:
    """``body`` as it is (no CRC added), SLIP-framed."""
    return lp.slip_encode(body)


def with_crc(body: bytes) -> bytes:
    return body + lp.crc16(body).to_bytes(2, "little")


def with_bad_crc(body: bytes) -> bytes:
    good = with_crc(body)
    return good[:-1] + bytes([good[-1] ^ 0x5A])


class Bench:
    """A HostLink between a scripted host and a stub core.

    Parameters
    ----------
    seed : int
        Seeds every random stall.
    rx_idle : float
        Probability of an idle cycle between host bytes.
    tx_stall : float
        Probability the byte sink (a UART transmitter) is not ready.
    core_stall : float
        Probability the stub core does not take an offered beat.
    core_idle : float
        Probability the stub core does not offer its next beat in a cycle.
    """

    def __init__(self, seed: int, *, config: TPUConfig = TINY, max_beats: int = 4,
                 rx_idle: float = 0.0, tx_stall: float = 0.0, core_stall: float = 0.0,
                 core_idle: float = 0.0):
        print(f"seed {seed}")
        self.seed = seed
        self.config = config
        self.max_beats = max_beats
        self.registered = REGISTERED_CHECKS[0]
        self.dut = HostLink(config, max_beats=max_beats, clock_hz=CLOCK_HZ,
                            registered_checks=self.registered)
        self.rng = random.Random(seed)
        self.rx_idle, self.tx_stall = rx_idle, tx_stall
        self.core_stall, self.core_idle = core_stall, core_idle
        self.cycle = 0
        self.to_link: deque[int] = deque()      # host bytes not yet sent
        self.end_cycles: list[int] = []         # cycle each host END byte went in
        self.tx_bytes: list[int] = []
        self.decoder = FrameDecoder()
        self.frames: list[tuple[int, Frame | FrameError]] = []   # (cycle ended, frame)
        self.frame_starts: list[int] = []       # cycle of each frame's first byte
        self.delivered: list[int] = []          # beats the stub core took
        self.core_take = True                   # the stub core takes beats at all
        self.from_core: deque[int] = deque()    # beats the stub core will send
        self.core_sent: list[int] = []
        self.status = 0
        self.clear_honoured: Callable[[], bool] = lambda: True
        self.clear_cycles: list[int] = []
        self.reset_cycles: list[int] = []
        self.delivered_at: list[int] = []
        self.o_host_breaks: list[int] = []      # cycles o_host dropped or changed a beat
        self.o_tx_breaks: list[int] = []
        self.tx_hold = False                    # the byte sink takes nothing

    # Processes ---------------------------------------------------------------------------

    async def _host_tx(self, ctx):
        dut = self.dut
        while True:
            byte = None
            if self.to_link and self.rng.random() >= self.rx_idle:
                byte = self.to_link.popleft()
            ctx.set(dut.i_rx.valid, byte is not None)
            ctx.set(dut.i_rx.payload, byte or 0)
            _, _, ready = await ctx.tick().sample(dut.i_rx.ready)
            assert ready, f"seed {self.seed}: i_rx.ready low at cycle {self.cycle}"
            if byte == lp.END:
                self.end_cycles.append(self.cycle)
            if byte is not None and self.registered:
                # Registered checks need the bytes two cycles apart (a UART's are far more).
                ctx.set(dut.i_rx.valid, 0)
                await ctx.tick()

    async def _host_rx(self, ctx):
        dut = self.dut
        prev = None
        while True:
            ctx.set(dut.o_tx.ready, not self.tx_hold and self.rng.random() >= self.tx_stall)
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.o_tx.valid, dut.o_tx.ready, dut.o_tx.payload)
            if prev is not None and (not valid or payload != prev):
                self.o_tx_breaks.append(self.cycle)
            prev = payload if valid and not ready else None
            if valid and ready:
                if payload != lp.END and (not self.tx_bytes or self.tx_bytes[-1] == lp.END):
                    self.frame_starts.append(self.cycle)
                self.tx_bytes.append(payload)
                for frame in self.decoder.feed(bytes([payload])):
                    self.frames.append((self.cycle, frame))

    async def _core_in(self, ctx):
        dut = self.dut
        prev = None
        while True:
            ctx.set(dut.o_host.ready, self.core_take and self.rng.random() >= self.core_stall)
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.o_host.valid, dut.o_host.ready, dut.o_host.payload)
            if prev is not None and (not valid or payload != prev):
                self.o_host_breaks.append(self.cycle)
            prev = payload if valid and not ready else None
            if valid and ready:
                self.delivered.append(payload)
                self.delivered_at.append(self.cycle)

    async def _core_out(self, ctx):
        dut = self.dut
        offered = None
        while True:
            if offered is None and self.from_core and self.rng.random() >= self.core_idle:
                offered = self.from_core[0]
            ctx.set(dut.i_host.valid, offered is not None)
            ctx.set(dut.i_host.payload, offered or 0)
            ctx.set(dut.i_status.as_value(), self.status)
            _, _, ready, clear, reset = await ctx.tick().sample(
                dut.i_host.ready, dut.o_clear, dut.o_core_reset)
            self.cycle += 1
            if offered is not None and ready:
                self.core_sent.append(self.from_core.popleft())
                offered = None
            if clear:
                self.clear_cycles.append(self.cycle - 1)
                if self.clear_honoured():
                    self.status &= ~ERROR_BIT
            if reset:
                self.reset_cycles.append(self.cycle - 1)
                self.status = 0
                self.from_core.clear()      # a reset core has nothing to send
                offered = None

    # Helpers for the test body ----------------------------------------------------------

    def send(self, wire: bytes) -> None:
        self.to_link.extend(wire)

    async def until(self, ctx, cond: Callable[[], bool], what: str,
                    limit: int = WAIT_LIMIT) -> None:
        for _ in range(limit):
            if cond():
                return
            await ctx.tick()
        raise AssertionError(f"seed {self.seed}: no {what} after {limit} cycles "
                             f"(cycle {self.cycle})")

    def replies(self) -> list[Frame | FrameError]:
        return [f for _, f in self.frames
                if not (isinstance(f, Frame) and f.kind == Kind.BEAT.value)]

    def beat_frames(self) -> list[Frame]:
        return [f for _, f in self.frames if isinstance(f, Frame) and f.kind == Kind.BEAT.value]

    async def request(self, ctx, wire: bytes, what: str) -> Frame:
        """Send ``wire`` and return the next reply (not a BEAT)."""
        n = len(self.replies())
        self.send(wire)
        await self.until(ctx, lambda: len(self.replies()) > n, f"reply to {what}")
        reply = self.replies()[n]
        assert isinstance(reply, Frame), f"seed {self.seed}: {what}: bad reply {reply}"
        return reply

    async def expect_ack(self, ctx, wire: bytes, seq: int, what: str) -> None:
        reply = await self.request(ctx, wire, what)
        assert (reply.kind, reply.seq, reply.payload) == (Kind.ACK.value, seq, b""), \
            f"seed {self.seed}: {what}: {reply}"

    async def expect_nak(self, ctx, wire: bytes, code: Nak, seq: int, what: str) -> None:
        reply = await self.request(ctx, wire, what)
        assert (reply.kind, reply.seq, reply.payload) == (Kind.NAK.value, seq,
                                                          bytes([code.value])), \
            f"seed {self.seed}: {what}: expected NAK {code.name} seq {seq}, got {reply}"

    async def status_reply(self, ctx, seq: int = 0x55) -> lp.StatusReply:
        reply = await self.request(ctx, encode_frame(Kind.STATUS, seq), "STATUS")
        assert (reply.kind, reply.seq) == (Kind.STATUS_REPLY.value, seq), reply
        return lp.StatusReply.unpack(reply.payload)

    async def idle(self, ctx) -> None:
        """Wait until every host byte is in and the link has sent all it had (40 cycles
        without a byte out)."""
        await self.until(ctx, lambda: not self.to_link, "host bytes sent")
        quiet = 0
        for _ in range(WAIT_LIMIT):
            n = len(self.tx_bytes)
            await ctx.tick()
            quiet = quiet + 1 if len(self.tx_bytes) == n else 0
            if quiet == 40:
                return
        raise AssertionError(f"seed {self.seed}: the link still sends after {WAIT_LIMIT} "
                             f"cycles (cycle {self.cycle})")

    def run(self, body: Callable) -> None:
        sim = Simulator(self.dut)
        sim.add_clock(1 / CLOCK_HZ)
        for process in (self._host_tx, self._host_rx, self._core_in, self._core_out):
            sim.add_testbench(process, background=True)

        async def main(ctx):
            await body(ctx, self)
            # Every frame the link sent must decode.
            errors = [f for _, f in self.frames if isinstance(f, FrameError)]
            assert not errors, f"seed {self.seed}: undecodable frames from the link: {errors}"
            assert not self.o_tx_breaks, \
                f"seed {self.seed}: o_tx changed a byte before it was taken: {self.o_tx_breaks}"

        sim.add_testbench(main)
        sim.run()


def check_beat_frames(bench: Bench, first_seq: int = 0) -> list[int]:
    """The BEAT frames' beats; their seqs must count from ``first_seq`` modulo 256."""
    frames = bench.beat_frames()
    seqs = [f.seq for f in frames]
    assert seqs == [(first_seq + i) % 256 for i in range(len(frames))], \
        f"seed {bench.seed}: BEAT seqs {seqs}"
    return [int.from_bytes(f.payload, "little") for f in frames]


# Delivery ------------------------------------------------------------------------------------

@pytest.mark.parametrize("config_key, seed", [("tiny", 11), ("tiny", 12), ("small", 13)])
def test_data_in_order(config_key: str, seed: int):
    """DATA frames of 1 to max_beats beats (with END and ESC bytes in them) reach the core
    in order, whole, under random stalls on every side. The host waits for each reply and
    sends a frame again after NAK BUSY. The core takes nothing until the first BUSY (so both
    buffers fill, whatever the timing), then takes beats under random stalls."""
    config = get_config(config_key)
    b = Bench(seed, config=config, rx_idle=0.3, tx_stall=0.3, core_stall=0.9)
    rng = random.Random(seed)
    frames = [random_beats(rng, rng.randint(1, b.max_beats), config) for _ in range(16)]
    frames[0] = random_beats(rng, b.max_beats, config)
    busy = 0

    async def body(ctx, b):
        nonlocal busy
        b.core_take = False
        for seq, beats in enumerate(frames):
            for _ in range(100):
                reply = await b.request(ctx, data_frame(seq, beats, config), f"DATA {seq}")
                if reply.kind == Kind.NAK.value and reply.payload == bytes([Nak.BUSY.value]):
                    busy += 1
                    b.core_take = True
                    continue
                assert (reply.kind, reply.seq) == (Kind.ACK.value, seq), reply
                break
            else:
                raise AssertionError(f"seed {seed}: DATA {seq} still BUSY after 100 tries")
        await b.until(ctx, lambda: len(b.delivered) == sum(map(len, frames)), "every beat")
        await b.idle(ctx)

    b.run(body)
    print(f"seed {seed}: {busy} NAK BUSY")
    assert busy > 0
    assert b.delivered == [beat for beats in frames for beat in beats]
    assert b.o_host_breaks == []


def test_two_frames_wait_while_core_stalls():
    """Back to back while the core takes nothing: both ACKed (the second waits in the other
    buffer), a third is BUSY (and changes nothing), a retry of the second is ACKed, not
    BUSY; STATUS says two pending; once the core takes beats, both frames arrive in order,
    and the third, sent again, after them."""
    b = Bench(21, core_stall=0.3)
    rng = random.Random(21)
    f1, f2, f3 = (random_beats(rng, n, TINY) for n in (4, 3, 2))

    async def body(ctx, b):
        b.core_take = False
        b.send(data_frame(1, f1) + data_frame(2, f2))
        await b.until(ctx, lambda: len(b.replies()) == 2, "two ACKs")
        await b.expect_nak(ctx, data_frame(3, f3), Nak.BUSY, 3, "third DATA frame")
        await b.expect_ack(ctx, data_frame(2, f2), 2, "retry of the second")
        st = await b.status_reply(ctx)
        assert (st.pending, st.data_seq, st.seq_valid) == (2, 2, True), st
        assert b.delivered == []
        b.core_take = True
        await b.until(ctx, lambda: len(b.delivered) == len(f1) + len(f2), "two frames")
        await b.expect_ack(ctx, data_frame(3, f3), 3, "third DATA frame again")
        await b.until(ctx, lambda: len(b.delivered) == 9, "third frame")
        st = await b.status_reply(ctx)
        assert (st.pending, st.data_seq) == (0, 3), st
        await b.idle(ctx)

    b.run(body)
    assert [(r.kind, r.seq) for r in b.replies()[:2]] == [(Kind.ACK.value, 1),
                                                         (Kind.ACK.value, 2)]
    assert b.delivered == f1 + f2 + f3
    assert b.o_host_breaks == []


def test_busy_is_decided_at_the_first_byte():
    """A DATA frame that began while both buffers were full is BUSY even when a buffer
    frees up before its END: its first bytes were not stored."""
    b = Bench(22)
    rng = random.Random(22)
    f1, f2, f3 = (random_beats(rng, n, TINY) for n in (1, 1, 4))

    async def body(ctx, b):
        b.core_take = False
        await b.expect_ack(ctx, data_frame(1, f1), 1, "first")
        await b.expect_ack(ctx, data_frame(2, f2), 2, "second")
        wire = data_frame(3, f3)
        b.send(wire[:10])
        await b.until(ctx, lambda: not b.to_link, "the first bytes of the third")
        b.core_take = True
        await b.until(ctx, lambda: len(b.delivered) == 2, "the first two frames")
        await b.expect_nak(ctx, wire[10:], Nak.BUSY, 3, "the rest of the third")
        await b.expect_ack(ctx, wire, 3, "the third again")
        await b.until(ctx, lambda: len(b.delivered) == 6, "the third frame")

    b.run(body)
    assert b.delivered == f1 + f2 + f3


def test_data_dedup():
    """A DATA frame with the seq of the last accepted one is ACKed and not delivered again;
    a new seq is; after RESET the old seq is new again."""
    b = Bench(31, core_stall=0.2)
    rng = random.Random(31)
    f1, f2, f3 = (random_beats(rng, n, TINY) for n in (2, 3, 1))

    async def body(ctx, b):
        await b.expect_ack(ctx, data_frame(7, f1), 7, "first")
        await b.expect_ack(ctx, data_frame(7, f1), 7, "retry")
        await b.expect_ack(ctx, data_frame(7, f2), 7, "same seq, other payload")
        await b.expect_ack(ctx, data_frame(8, f2), 8, "next seq")
        await b.until(ctx, lambda: len(b.delivered) == 5, "two frames")
        await b.expect_ack(ctx, encode_frame(Kind.RESET, 9), 9, "RESET")
        st = await b.status_reply(ctx)
        assert (st.seq_valid, st.pending, st.data_seq) == (False, 0, 8), st  # the flag only
        await b.expect_ack(ctx, data_frame(8, f3), 8, "seq 8 after RESET")
        await b.until(ctx, lambda: len(b.delivered) == 6, "frame after RESET")
        await b.idle(ctx)

    b.run(body)
    assert b.delivered == f1 + f2 + f3


# NAK codes and their order -------------------------------------------------------------------

def test_nak_codes():
    """Every NAK code, the seq it carries, and the order of the checks; none changes
    anything (a good frame afterwards is the only one delivered)."""
    b = Bench(41, rx_idle=0.2, tx_stall=0.2)
    rng = random.Random(41)
    beats = random_beats(rng, 2, TINY)
    good = with_crc(bytes([Kind.DATA.value, 0x21]) + to_bytes(beats, TINY))
    limit = lp.max_body(b.max_beats, beat_bytes(TINY))
    oversize = with_crc(bytes([Kind.DATA.value, 0x22]) +
                        to_bytes(random_beats(rng, b.max_beats + 1, TINY), TINY))
    assert len(oversize) == limit + beat_bytes(TINY)
    full = random_beats(rng, b.max_beats, TINY)
    cases = [
        # (wire, code, seq, what)
        (bytes([lp.END, Kind.DATA.value, 0x31, lp.ESC, 0x00, 1, 2, lp.END]),
         Nak.ESCAPE, 0x31, "ESC then a plain byte"),
        (bytes([lp.END, Kind.STATUS.value, 0x32, 1, 2, lp.ESC, lp.END]),
         Nak.ESCAPE, 0x32, "ESC just before END"),
        (lp.slip_encode(oversize[:-4])[:-1] + bytes([lp.ESC, 0x01, lp.END]),
         Nak.ESCAPE, 0x22, "oversize with a bad escape: ESCAPE first"),
        (body_frame(oversize), Nak.OVERSIZE, 0x22, "one beat too many"),
        (body_frame(oversize[:limit + 1]), Nak.OVERSIZE, 0x22, "one byte too many"),
        (body_frame(bytes([Kind.STATUS.value, 0x33, 0x44])), Nak.LENGTH, 0x33, "3 bytes"),
        (body_frame(bytes([0x99])), Nak.LENGTH, 0, "1 byte: seq 0"),
        (body_frame(with_bad_crc(good[:-2])), Nak.CRC, 0x21, "CRC"),
        (body_frame(with_bad_crc(bytes([0x83, 0x34, 1, 2, 3]))), Nak.CRC, 0x34,
         "bad CRC and bad kind: CRC first"),
        (body_frame(with_bad_crc(bytes([Kind.STATUS.value, 0x3F, 1]))), Nak.CRC, 0x3F,
         "bad CRC and a payload on STATUS: CRC first"),
        (encode_frame(0x83, 0x35), Nak.KIND, 0x35, "a device kind"),
        (encode_frame(0x00, 0x36), Nak.KIND, 0x36, "kind 0"),
        (encode_frame(0x06, 0x37, b"\x01\x02\x03"), Nak.KIND, 0x37,
         "kind 6 with a payload: KIND first"),
        (encode_frame(Kind.DATA, 0x38), Nak.LENGTH, 0x38, "DATA without a beat"),
        (encode_frame(Kind.DATA, 0x39, to_bytes(beats, TINY)[:-1]), Nak.LENGTH, 0x39,
         "DATA, one byte short of 2 beats"),
        (encode_frame(Kind.DATA, 0x3A, to_bytes(beats, TINY) + b"\x00"), Nak.LENGTH, 0x3A,
         "DATA, one byte over 2 beats"),
        (encode_frame(Kind.STATUS, 0x3B, b"\x00"), Nak.LENGTH, 0x3B, "STATUS with payload"),
        (encode_frame(Kind.CLEAR, 0x3C, b"\x00" * 8), Nak.LENGTH, 0x3C, "CLEAR with payload"),
        (encode_frame(Kind.RESET, 0x3D, b"\x01"), Nak.LENGTH, 0x3D, "RESET with payload"),
        (encode_frame(Kind.INFO, 0x3E, b"\x01"), Nak.LENGTH, 0x3E, "INFO with payload"),
    ]

    async def body(ctx, b):
        for wire, code, seq, what in cases:
            await b.expect_nak(ctx, wire, code, seq, what)
        # Empty frames are ignored: no reply at all; ESC alone before END is an ESCAPE.
        n = len(b.replies())
        b.send(bytes([lp.END, lp.END, lp.END]))
        await b.idle(ctx)
        assert len(b.replies()) == n
        await b.expect_nak(ctx, bytes([lp.END, lp.ESC, lp.END]), Nak.ESCAPE, 0, "ESC alone")
        st = await b.status_reply(ctx)
        assert (st.pending, st.seq_valid) == (0, False), st
        await b.expect_ack(ctx, body_frame(good), 0x21, "a good frame")
        await b.expect_ack(ctx, data_frame(0x23, full), 0x23, "a frame of max_beats beats")
        await b.until(ctx, lambda: len(b.delivered) == 2 + b.max_beats, "the good frames")
        await b.idle(ctx)
        assert b.clear_cycles == [] and b.reset_cycles == []

    b.run(body)
    assert b.delivered == beats + full


def test_frames_without_leading_end():
    """Frames sent with no leading END (one END between frames) work the same."""
    b = Bench(42)
    rng = random.Random(42)
    beats = random_beats(rng, 3, TINY)

    async def body(ctx, b):
        b.send(b"\xc0")
        await b.expect_ack(ctx, encode_frame(Kind.DATA, 5, to_bytes(beats, TINY),
                                             leading_end=False), 5, "DATA")
        reply = await b.request(ctx, encode_frame(Kind.INFO, 6, leading_end=False), "INFO")
        assert reply.kind == Kind.INFO_REPLY.value and reply.seq == 6
        await b.until(ctx, lambda: len(b.delivered) == 3, "beats")

    b.run(body)
    assert b.delivered == beats


def test_garbage_between_frames():
    """Random bytes (END and ESC frequent) between good frames: each garbage frame gets the
    NAK the protocol model gives it (FrameDecoder, then the kind and length checks); only
    the good frames' beats arrive. The host waits for the answer to each frame (a flood of
    short frames would overflow the reply queue, see test_reply_queue_overflow)."""
    seed = 43
    b = Bench(seed, rx_idle=0.1)
    rng = random.Random(seed)
    limit = lp.max_body(b.max_beats, beat_bytes(TINY))
    stream = bytearray()
    good: list[int] = []
    for k in range(12):
        stream += bytes(rng.choice((lp.END, lp.ESC, lp.ESC_END, lp.ESC_ESC, 0x01, 0x02,
                                    rng.randrange(256))) for _ in range(rng.randrange(1, 60)))
        beats = random_beats(rng, rng.randint(1, 4), TINY)
        stream += data_frame(100 + k, beats)
        good += beats
    stream += b"\xc0"

    # Cut the stream after each END; the replies each chunk must bring.
    chunks: list[tuple[bytes, int]] = []
    expected: list[tuple[int, int, bytes]] = []
    model = FrameDecoder(limit)
    chunk = bytearray()
    for byte in stream:
        chunk.append(byte)
        if byte != lp.END:
            continue
        for item in model.feed(bytes(chunk)):
            if isinstance(item, FrameError):
                expected.append((Kind.NAK.value, item.seq, bytes([item.code.value])))
            elif item.kind == Kind.DATA.value:
                assert len(item.payload) % beat_bytes(TINY) == 0, f"seed {seed}"
                expected.append((Kind.ACK.value, item.seq, b""))
            else:
                raise AssertionError(f"seed {seed}: garbage with a good CRC; pick another seed")
        chunks.append((bytes(chunk), len(expected)))
        chunk.clear()

    async def body(ctx, b):
        for wire, n in chunks:
            b.send(wire)
            await b.until(ctx, lambda n=n: len(b.replies()) >= n, "reply")
        await b.idle(ctx)

    b.run(body)
    codes = sorted({Nak(e[2][0]).name for e in expected if e[0] == Kind.NAK.value})
    print("NAK codes seen:", codes)
    assert len(codes) >= 3
    assert [(r.kind, r.seq, r.payload) for r in b.replies()] == expected
    assert b.delivered == good


# CLEAR, RESET --------------------------------------------------------------------------------

def test_clear_drops_undelivered_frames():
    """CLEAR while one frame is half delivered and another waits: the core has what it took
    before the CLEAR and nothing more of those frames; o_clear pulses once (no error
    pending); STATUS shows nothing pending; frames after the CLEAR arrive."""
    b = Bench(51)
    rng = random.Random(51)
    f1, f2, f3 = (random_beats(rng, n, TINY) for n in (4, 4, 2))

    async def body(ctx, b):
        b.core_take = False
        await b.expect_ack(ctx, data_frame(1, f1), 1, "first")
        await b.expect_ack(ctx, data_frame(2, f2), 2, "second")
        b.core_take = True
        await b.until(ctx, lambda: len(b.delivered) == 2, "two beats")
        b.core_take = False
        await b.expect_ack(ctx, encode_frame(Kind.CLEAR, 3), 3, "CLEAR")
        st = await b.status_reply(ctx)
        assert (st.pending, st.data_seq, st.seq_valid) == (0, 2, True), st
        b.core_take = True
        await b.idle(ctx)
        assert b.delivered == f1[:2]
        await b.expect_ack(ctx, data_frame(4, f3), 4, "after CLEAR")
        await b.until(ctx, lambda: len(b.delivered) == 4, "frame after CLEAR")
        await b.idle(ctx)

    b.run(body)
    assert b.delivered == f1[:2] + f3
    assert len(b.clear_cycles) == 1 and b.reset_cycles == []


def test_clear_waits_for_the_error_beat():
    """With an error pending whose error beat is still queued (the core ignores i_clear
    until it is sent), o_clear stays high until the error flag drops, and no beat is
    delivered meanwhile; then the next frame's beats arrive."""
    b = Bench(52, tx_stall=0.5)
    rng = random.Random(52)
    f1 = random_beats(rng, 3, TINY)
    error_beat = 0x4641494C_01000003

    async def body(ctx, b):
        b.clear_honoured = lambda: not b.from_core
        b.status = ERROR_BIT
        b.from_core.extend([0x1111, 0x2222, error_beat])
        b.send(encode_frame(Kind.CLEAR, 1) + data_frame(2, f1))
        await b.until(ctx, lambda: len(b.replies()) == 2, "ACKs of CLEAR and DATA")
        await b.until(ctx, lambda: len(b.delivered) == 3, "beats after the clear")
        await b.idle(ctx)

    b.run(body)
    assert check_beat_frames(b) == [0x1111, 0x2222, error_beat]
    assert b.delivered == f1
    # o_clear held from the CLEAR until the error beat was taken, and the first beat went
    # to the core only after that.
    kinds = [f.kind for _, f in b.frames]
    error_frame = max(i for i, k in enumerate(kinds) if k == Kind.BEAT.value)
    error_start, error_end = b.frame_starts[error_frame], b.frames[error_frame][0]
    assert len(b.clear_cycles) >= 2
    assert b.clear_cycles == list(range(b.clear_cycles[0], b.clear_cycles[-1] + 1))
    assert error_start < b.clear_cycles[-1] < error_end
    assert b.delivered_at[0] > b.clear_cycles[-1]


def test_reset():
    """RESET drops pending frames, pulses o_core_reset once, restarts the BEAT numbering
    and forgets the DATA seq; a BEAT frame in flight is finished first (its beat is read in
    place) and the reset comes before the next."""
    b = Bench(61, tx_stall=0.3)
    rng = random.Random(61)
    f1, f2, f3 = (random_beats(rng, n, TINY) for n in (4, 4, 1))
    first = random_beats(rng, 5, TINY)

    async def body(ctx, b):
        b.from_core.extend(first[:3])
        await b.until(ctx, lambda: len(b.beat_frames()) == 3, "three BEAT frames")
        b.core_take = False
        await b.expect_ack(ctx, data_frame(1, f1), 1, "first")
        await b.expect_ack(ctx, data_frame(2, f2), 2, "second")
        b.tx_hold = True            # the next BEAT frame stays in flight
        b.from_core.extend(first[3:])
        await b.until(ctx, lambda: len(b.from_core) == 2, "the fourth beat offered")
        b.send(encode_frame(Kind.RESET, 3))
        await b.until(ctx, lambda: not b.to_link, "RESET sent")
        for _ in range(100):
            await ctx.tick()
        assert b.reset_cycles == [], "reset while a BEAT frame reads the beat in place"
        b.tx_hold = False
        await b.until(ctx, lambda: len(b.reset_cycles) == 1, "the core reset")
        await b.until(ctx, lambda: len(b.replies()) == 3, "ACK of RESET")
        b.core_take = True
        st = await b.status_reply(ctx)
        assert (st.pending, st.seq_valid) == (0, False), st
        b.from_core.extend([0xABC, 0xDEF])
        await b.until(ctx, lambda: len(b.beat_frames()) == 6, "two BEAT frames after reset")
        await b.expect_ack(ctx, data_frame(2, f3), 2, "seq 2 again after RESET")
        await b.until(ctx, lambda: len(b.delivered) == 1, "beat after RESET")
        await b.idle(ctx)

    b.run(body)
    frames = b.beat_frames()
    assert [f.seq for f in frames] == [0, 1, 2, 3, 0, 1]
    assert [int.from_bytes(f.payload, "little") for f in frames] == first[:4] + [0xABC, 0xDEF]
    assert b.replies()[2].kind == Kind.ACK.value and b.replies()[2].seq == 3
    assert b.delivered == f3
    assert len(b.reset_cycles) == 1


# STATUS, INFO --------------------------------------------------------------------------------

def test_status_reply_fields():
    """STATUS_REPLY: the status word, the cycle counter sampled as the reply starts (between
    the request's END and the reply's first byte), the last DATA seq, pending frames and the
    flag."""
    b = Bench(71)
    rng = random.Random(71)

    async def body(ctx, b):
        st = await b.status_reply(ctx, seq=0xC0)           # a seq that needs escaping
        assert (st.data_seq, st.pending, st.seq_valid, st.status) == (0, 0, False, 0), st
        b.status = 0x00ABCD_E1
        b.core_take = False
        await b.expect_ack(ctx, data_frame(0xDB, random_beats(rng, 1, TINY)), 0xDB, "DATA")
        start = b.cycle
        st = await b.status_reply(ctx, seq=0x12)
        reply_start = b.frame_starts[-1]
        assert (st.status, st.data_seq, st.pending, st.seq_valid) == \
            (0x00ABCD_E1, 0xDB, 1, True), st
        assert start <= st.cycles <= reply_start, (start, st.cycles, reply_start)
        assert b.end_cycles[-1] < st.cycles
        b.core_take = True
        await b.until(ctx, lambda: len(b.delivered) == 1, "the beat")
        st2 = await b.status_reply(ctx, seq=0x13)
        assert st2.pending == 0 and st2.cycles > st.cycles

    b.run(body)


@pytest.mark.parametrize("config_key, max_beats", [("tiny", 4), ("small", 16)])
def test_info_reply(config_key: str, max_beats: int):
    config = get_config(config_key)
    b = Bench(81, config=config, max_beats=max_beats)
    got = []

    async def body(ctx, b):
        reply = await b.request(ctx, encode_frame(Kind.INFO, 0x44), "INFO")
        assert (reply.kind, reply.seq) == (Kind.INFO_REPLY.value, 0x44)
        got.append(lp.InfoReply.unpack(reply.payload))

    b.run(body)
    assert got == [lp.InfoReply.of(config, max_beats=max_beats, clock_hz=CLOCK_HZ)]
    assert got[0].version == lp.PROTOCOL_VERSION


# Transmit ------------------------------------------------------------------------------------

def test_beat_seq_counts_and_wraps():
    """300 beats from the core, END and ESC bytes frequent, random stalls: each comes back
    once, in order, in a BEAT frame whose seq counts modulo 256."""
    b = Bench(91, tx_stall=0.2, core_idle=0.3)
    rng = random.Random(91)
    beats = random_beats(rng, 300, TINY, special=0.3)

    async def body(ctx, b):
        b.from_core.extend(beats)
        await b.until(ctx, lambda: len(b.beat_frames()) == len(beats), "every BEAT frame",
                      limit=60_000)

    b.run(body)
    assert check_beat_frames(b) == beats
    assert b.core_sent == beats


def test_replies_between_beats():
    """Requests while the core streams beats: every reply comes out between BEAT frames
    (every frame decodes), ahead of the BEAT frames still waiting: the first frame to
    start after a request's END, once the frame then in flight is done, is the reply."""
    b = Bench(92, tx_stall=0.2)
    rng = random.Random(92)
    beats = random_beats(rng, 120, TINY, special=0.3)

    async def body(ctx, b):
        b.from_core.extend(beats)
        for seq in range(10):
            await b.until(ctx, lambda seq=seq: len(b.beat_frames()) >= 8 * seq + 3,
                          "BEAT frames")
            if seq % 2:
                await b.status_reply(ctx, seq=seq)
            else:
                await b.expect_ack(ctx, data_frame(seq, random_beats(rng, 1, TINY)), seq,
                                   "DATA")
        await b.until(ctx, lambda: len(b.beat_frames()) == len(beats), "every BEAT frame")

    b.run(body)
    assert check_beat_frames(b) == beats
    # The reply to each request is the next frame to start, or the one after that (a BEAT
    # frame that started in the request's END cycle or after it).
    order = [f.kind for _, f in b.frames]
    replies_at = [i for i, k in enumerate(order) if k != Kind.BEAT.value]
    assert len(replies_at) == 10
    for i in replies_at:
        start = b.frame_starts[i]
        before = b.frame_starts[:i]
        request_end = max(c for c in b.end_cycles if c < start)
        # Frames that started after the request's END and before its reply: at most one.
        assert sum(1 for s in before if s > request_end) <= 1, (i, request_end, before[-3:])


def test_reply_queue_overflow():
    """With the byte sink stalled, a flood of requests: the replies that fit (the one the
    transmitter holds and REPLY_QUEUE_DEPTH queued) come out in order, the rest are dropped
    (a host that waits for each answer never floods), and the link works on."""
    b = Bench(93)

    async def body(ctx, b):
        b.tx_hold = True
        for seq in range(REPLY_QUEUE_DEPTH + 4):
            b.send(encode_frame(Kind.STATUS, seq))
        await b.until(ctx, lambda: not b.to_link, "requests in")
        b.tx_hold = False
        await b.idle(ctx)
        n = len(b.replies())
        assert [r.seq for r in b.replies()] == list(range(REPLY_QUEUE_DEPTH + 1))
        await b.expect_ack(ctx, encode_frame(Kind.CLEAR, 0x77), 0x77, "CLEAR")
        assert len(b.replies()) == n + 1

    b.run(body)


def test_noise_never_costs_a_reply():
    """With the byte sink stalled: the NAK of a frame failing a framing check (ESCAPE,
    OVERSIZE, too short, CRC) is queued only into an empty queue; other replies (a good
    CRC: KIND, a payload LENGTH, STATUS) until the queue is full. So after any burst of
    noise the answer to the host's next frame comes; a second request is dropped."""
    b = Bench(94)
    oversize = with_crc(bytes([Kind.DATA.value, 0x13]) + bytes(8 * (b.max_beats + 1)))
    frames = [
        (body_frame(with_bad_crc(bytes([Kind.STATUS.value, 0x11]))), 0x11, Nak.CRC),
        (bytes([lp.END, 0x01, 0x12, lp.ESC, 0x00, lp.END]), 0x12, Nak.ESCAPE),
        (body_frame(oversize), 0x13, Nak.OVERSIZE),
        (bytes([lp.END, 0x01, 0x14, lp.END]), 0x14, Nak.LENGTH),
        (encode_frame(0x06, 0x15), 0x15, Nak.KIND),
        (encode_frame(Kind.STATUS, 0x16), 0x16, None),
    ]

    async def body(ctx, b):
        # Noise only: the transmitter takes the first NAK, the queue holds the second.
        b.tx_hold = True
        for wire, _, _ in frames[:4] + frames[:4]:
            b.send(wire)
        await b.until(ctx, lambda: not b.to_link, "noise in")
        b.send(frames[5][0])
        await b.until(ctx, lambda: not b.to_link, "STATUS in")
        b.tx_hold = False
        await b.idle(ctx)
        assert [(r.kind, r.seq) for r in b.replies()] == [
            (Kind.NAK.value, 0x11), (Kind.NAK.value, 0x12), (Kind.STATUS_REPLY.value, 0x16)]
        # Frames with a good CRC fill the queue; the noise after them is dropped.
        n = len(b.replies())
        b.tx_hold = True
        for wire, _, _ in frames[4:] + frames[:4] + frames[4:]:
            b.send(wire)
        await b.until(ctx, lambda: not b.to_link, "requests in")
        b.tx_hold = False
        await b.idle(ctx)
        assert [(r.kind, r.seq, r.payload) for r in b.replies()[n:]] == [
            (Kind.NAK.value, 0x15, bytes([Nak.KIND.value])),
            (Kind.STATUS_REPLY.value, 0x16, b.replies()[n + 1].payload),
            (Kind.NAK.value, 0x15, bytes([Nak.KIND.value]))]

    b.run(body)


def test_escape_decoding():
    """ESC followed by a byte other than ESC_END or ESC_ESC decodes to that byte (it is
    the kind or the seq the NAK reports; ESC ESC is ESC once, then a plain byte); ESC right
    before END: the END still ends the frame. Each is NAK ESCAPE with the protocol model's
    seq, and the next frame is unaffected."""
    b = Bench(44)
    cases = [
        (bytes([lp.END, lp.ESC, 0x33, 0x44, lp.END]), 0x44),
        (bytes([lp.END, 0x01, lp.ESC, 0x55, 0x66, lp.END]), 0x55),
        (bytes([lp.END, lp.ESC, lp.ESC, lp.ESC_END, 0x02, lp.END]), lp.ESC_END),
        (bytes([lp.END, 0x02, 0x07, lp.ESC, lp.END]), 0x07),
    ]
    for wire, seq in cases:
        assert [(e.code, e.seq) for e in FrameDecoder().feed(wire)] == [(Nak.ESCAPE, seq)]

    async def body(ctx, b):
        for wire, seq in cases:
            await b.expect_nak(ctx, wire, Nak.ESCAPE, seq, wire.hex(" "))
            st = await b.status_reply(ctx, seq=0x70)
            assert (st.pending, st.seq_valid) == (0, False), st

    b.run(body)


def test_clear_keeps_the_data_seq():
    """CLEAR drops undelivered frames but keeps the last DATA seq: the same frame sent
    again after it is a retry, ACKed and never delivered; a new seq is."""
    b = Bench(53)
    rng = random.Random(53)
    f1, f2 = (random_beats(rng, n, TINY) for n in (2, 3))

    async def body(ctx, b):
        await b.expect_ack(ctx, data_frame(7, f1), 7, "DATA 7")
        await b.until(ctx, lambda: len(b.delivered) == 2, "its beats")
        await b.expect_ack(ctx, encode_frame(Kind.CLEAR, 8), 8, "CLEAR")
        st = await b.status_reply(ctx)
        assert (st.data_seq, st.seq_valid) == (7, True), st
        await b.expect_ack(ctx, data_frame(7, f2), 7, "DATA 7 after CLEAR")
        await b.idle(ctx)
        assert b.delivered == f1
        await b.expect_ack(ctx, data_frame(9, f2), 9, "DATA 9")
        await b.until(ctx, lambda: len(b.delivered) == 5, "DATA 9's beats")

    b.run(body)
    assert b.delivered == f1 + f2


def test_status_reply_pack_matches_decoder():
    """The STATUS_REPLY layout the gateware fills (13 bytes) is the protocol's."""
    assert struct.calcsize(lp.STATUS_REPLY_FORMAT) == 13


@pytest.mark.parametrize("kwargs, match", [
    ({"max_beats": 0, "clock_hz": CLOCK_HZ}, "max_beats=0"),
    ({"max_beats": 1 << 16, "clock_hz": CLOCK_HZ}, "max_beats=65536"),
    ({"max_beats": 4, "clock_hz": 0}, "clock_hz=0"),
    ({"max_beats": True, "clock_hz": CLOCK_HZ}, "max_beats=True"),
])
def test_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HostLink(TINY, **kwargs)
