"""The host link's frame protocol: one definition for the gateware (:mod:`hdl.link.host_link`),
the board-side model (:mod:`sim.models.link_model`) and the host
(:mod:`firmware.transports.serial`).

A board carries the core's host stream (:mod:`hdl.isa` beats of ``host_width`` bits) over a
byte link (a UART). Bytes are grouped into frames; docs/host-link.md walks through it.

Frame on the wire
-----------------
SLIP (RFC 1055): each frame ends with ``END`` (0xC0); a 0xC0 inside it is sent as ``ESC
ESC_END`` (0xDB 0xDC) and a 0xDB as ``ESC ESC_ESC`` (0xDB 0xDD). The host also sends ``END``
before each frame, so line noise before it ends up in a frame of its own. An empty frame (two
``END`` in a row) is ignored. ``ESC`` followed by any other byte decodes to that byte, and the
frame fails ``ESCAPE``; so does a frame with ``ESC`` right before its ``END`` (which ends it).

Frame body: ``kind`` (1 byte, :class:`Kind`), ``seq`` (1 byte), the payload, and the
CRC-16/CCITT-FALSE (polynomial 0x1021, initial value 0xFFFF, no reflection, no final XOR) of
``kind``, ``seq`` and the payload, low byte first. Multi-byte fields are little-endian;
beats are ``host_width // 8`` bytes, least significant byte first.

Host to device: ``DATA`` (1 to ``max_beats`` whole beats for the core, answered ``ACK``; a
``DATA`` frame with the ``seq`` of the last accepted one is a retry, answered ``ACK`` and not
delivered twice), ``STATUS`` (``STATUS_REPLY``), ``CLEAR`` and ``RESET`` (``ACK``), ``INFO``
(``INFO_REPLY``); control frames have no payload. Device to host: ``ACK``, ``NAK`` (1 byte,
:class:`Nak`; ``seq`` is the dropped frame's second byte, 0 if it had fewer than two),
``BEAT`` (one beat the core sent; ``seq`` counts them modulo 256 from 0 after power-up and
``RESET``), ``STATUS_REPLY``, ``INFO_REPLY``; a reply's ``seq`` is its request's.

Checks on a received frame, in order (the first failing one is the ``NAK`` code): an ``ESC``
not followed by ``ESC_END`` or ``ESC_ESC`` (``ESCAPE``); more than ``max_beats`` beats of
payload plus the header and CRC (``OVERSIZE``); fewer than 4 bytes (``LENGTH``); the CRC
(``CRC``); the kind (``KIND``); the payload length: a whole number of beats, at least one, for
``DATA``, none for the rest (``LENGTH``); a free frame buffer for a new ``DATA`` frame
(``BUSY``).
"""

from __future__ import annotations

import binascii
import struct
from dataclasses import dataclass

from amaranth.lib import enum

__all__ = [
    "END", "ESC", "ESC_END", "ESC_ESC", "Kind", "Nak", "HOST_KINDS", "DEVICE_KINDS",
    "HEADER_BYTES", "CRC_BYTES", "MIN_BODY", "crc16", "slip_encode", "encode_frame",
    "Frame", "FrameDecoder", "FrameError", "max_body", "STATUS_REPLY_FORMAT",
    "StatusReply", "INFO_MAGIC", "PROTOCOL_VERSION", "INFO_REPLY_FORMAT", "InfoReply",
]

END = 0xC0
ESC = 0xDB
ESC_END = 0xDC
ESC_ESC = 0xDD

HEADER_BYTES = 2   # kind, seq
CRC_BYTES = 2
MIN_BODY = HEADER_BYTES + CRC_BYTES


class Kind(enum.Enum, shape=8):
    """What a frame carries."""
    # Host to device.
    DATA = 0x01
    STATUS = 0x02
    CLEAR = 0x03
    RESET = 0x04
    INFO = 0x05
    # Device to host.
    ACK = 0x81
    NAK = 0x82
    BEAT = 0x83
    STATUS_REPLY = 0x84
    INFO_REPLY = 0x85


HOST_KINDS = (Kind.DATA, Kind.STATUS, Kind.CLEAR, Kind.RESET, Kind.INFO)
DEVICE_KINDS = (Kind.ACK, Kind.NAK, Kind.BEAT, Kind.STATUS_REPLY, Kind.INFO_REPLY)


class Nak(enum.Enum, shape=8):
    """Why the device dropped a frame (the payload of a ``NAK``)."""
    ESCAPE = 1    # ESC followed by a byte other than ESC_END or ESC_ESC
    OVERSIZE = 2  # longer than a frame buffer: more than max_beats beats
    LENGTH = 3    # shorter than 4 bytes, or a payload of the wrong length for its kind
    CRC = 4       # CRC mismatch
    KIND = 5      # not a host-to-device kind
    BUSY = 6      # a new DATA frame while two frames wait for the core


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE (``crc16(b"123456789") == 0x29B1``)."""
    return binascii.crc_hqx(data, crc)


def slip_encode(body: bytes, *, leading_end: bool = True) -> bytes:
    """``body`` escaped and terminated by ``END`` (and preceded by one if ``leading_end``)."""
    out = bytearray([END]) if leading_end else bytearray()
    for byte in body:
        if byte == END:
            out += bytes((ESC, ESC_END))
        elif byte == ESC:
            out += bytes((ESC, ESC_ESC))
        else:
            out.append(byte)
    out.append(END)
    return bytes(out)


def encode_frame(kind: Kind | int, seq: int, payload: bytes = b"", *,
                 leading_end: bool = True) -> bytes:
    """The bytes on the wire for one frame."""
    if not 0 <= seq <= 0xFF:
        raise ValueError(f"frame seq {seq} is out of range; allowed: 0 to 255")
    head = bytes((int(Kind(kind).value if isinstance(kind, Kind) else kind), seq))
    body = head + bytes(payload)
    return slip_encode(body + crc16(body).to_bytes(CRC_BYTES, "little"),
                       leading_end=leading_end)


def max_body(max_beats: int, beat_bytes: int) -> int:
    """Longest body the device stores: header, ``max_beats`` beats, CRC."""
    return HEADER_BYTES + max_beats * beat_bytes + CRC_BYTES


@dataclass(frozen=True)
class Frame:
    """A received frame whose framing and CRC were good."""
    kind: int
    seq: int
    payload: bytes


class FrameError(Exception):
    """A received frame was dropped; ``code`` says why, ``seq`` is its second byte or 0."""

    def __init__(self, code: Nak, seq: int):
        super().__init__(f"frame dropped: {code.name} (seq {seq})")
        self.code = code
        self.seq = seq


class FrameDecoder:
    """Splits a byte stream into frames, checking SLIP escapes, the length and the CRC the
    way the gateware does (the kind and payload checks belong to the receiver).

    ``feed(data)`` returns, in order, a :class:`Frame` or a :class:`FrameError` for each
    frame that ended in ``data``; empty frames are skipped.

    Parameters
    ----------
    limit : int or None
        Longest body accepted (:func:`max_body`); longer ones are ``OVERSIZE``.
    """

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self._body = bytearray()
        self._count = 0
        self._escaped = False
        self._bad_escape = False

    def feed(self, data: bytes) -> list[Frame | FrameError]:
        out: list[Frame | FrameError] = []
        for byte in data:
            if byte == END:
                if self._count or self._bad_escape or self._escaped:
                    out.append(self._finish())
                self._reset()
                continue
            if self._escaped:
                self._escaped = False
                if byte == ESC_END:
                    byte = END
                elif byte == ESC_ESC:
                    byte = ESC
                else:
                    self._bad_escape = True
            elif byte == ESC:
                self._escaped = True
                continue
            self._count += 1
            if self.limit is None or self._count <= self.limit:
                self._body.append(byte)
        return out

    @property
    def body_bytes(self) -> int:
        """Bytes of the frame being received so far, after unescaping."""
        return self._count

    def _reset(self) -> None:
        self._body.clear()
        self._count = 0
        self._escaped = False
        self._bad_escape = False

    def _finish(self) -> Frame | FrameError:
        body = bytes(self._body)
        seq = body[1] if len(body) >= 2 else 0
        if self._bad_escape or self._escaped:
            return FrameError(Nak.ESCAPE, seq)
        if self.limit is not None and self._count > self.limit:
            return FrameError(Nak.OVERSIZE, seq)
        if len(body) < MIN_BODY:
            return FrameError(Nak.LENGTH, seq)
        if crc16(body[:-CRC_BYTES]) != int.from_bytes(body[-CRC_BYTES:], "little"):
            return FrameError(Nak.CRC, seq)
        return Frame(kind=body[0], seq=seq, payload=body[HEADER_BYTES:-CRC_BYTES])


#: ``STATUS_REPLY`` payload: the core's :class:`hdl.isa.Status` (32 bits), core clock cycles
#: since power-up (48 bits, wrapping), the last accepted ``DATA`` seq, frames accepted but not
#: yet delivered to the core (0 to 2), flags (bit 0: a ``DATA`` seq has been accepted since
#: power-up or ``RESET``).
STATUS_REPLY_FORMAT = "<I6sBBB"


@dataclass(frozen=True)
class StatusReply:
    status: int
    cycles: int
    data_seq: int
    pending: int
    seq_valid: bool

    @classmethod
    def unpack(cls, payload: bytes) -> StatusReply:
        if len(payload) != struct.calcsize(STATUS_REPLY_FORMAT):
            raise ValueError(f"STATUS_REPLY payload of {len(payload)} bytes; expected "
                             f"{struct.calcsize(STATUS_REPLY_FORMAT)}")
        status, cycles, data_seq, pending, flags = struct.unpack(STATUS_REPLY_FORMAT, payload)
        return cls(status, int.from_bytes(cycles, "little"), data_seq, pending,
                   bool(flags & 1))

    def pack(self) -> bytes:
        return struct.pack(STATUS_REPLY_FORMAT, self.status,
                           (self.cycles & (1 << 48) - 1).to_bytes(6, "little"),
                           self.data_seq, self.pending, int(self.seq_valid))


INFO_MAGIC = b"AMTP"
PROTOCOL_VERSION = 1

#: ``INFO_REPLY`` payload: magic ``AMTP``, protocol version, rows, cols, host_width, ub_depth,
#: acc_depth, weight_mem_tiles, param_slots, weight_fifo_depth, max_beats (a DATA frame's
#: limit), core clock in Hz.
INFO_REPLY_FORMAT = "<4sBHHHIIHBBHI"


@dataclass(frozen=True)
class InfoReply:
    rows: int
    cols: int
    host_width: int
    ub_depth: int
    acc_depth: int
    weight_mem_tiles: int
    param_slots: int
    weight_fifo_depth: int
    max_beats: int
    clock_hz: int
    version: int = PROTOCOL_VERSION

    @classmethod
    def unpack(cls, payload: bytes) -> InfoReply:
        if len(payload) != struct.calcsize(INFO_REPLY_FORMAT):
            raise ValueError(f"INFO_REPLY payload of {len(payload)} bytes; expected "
                             f"{struct.calcsize(INFO_REPLY_FORMAT)}")
        (magic, version, rows, cols, host_width, ub_depth, acc_depth, tiles, slots, fifo,
         max_beats, clock_hz) = struct.unpack(INFO_REPLY_FORMAT, payload)
        if magic != INFO_MAGIC:
            raise ValueError(f"INFO_REPLY magic {magic!r}; expected {INFO_MAGIC!r}")
        return cls(rows, cols, host_width, ub_depth, acc_depth, tiles, slots, fifo,
                   max_beats, clock_hz, version)

    def pack(self) -> bytes:
        return struct.pack(INFO_REPLY_FORMAT, INFO_MAGIC, self.version, self.rows, self.cols,
                           self.host_width, self.ub_depth, self.acc_depth,
                           self.weight_mem_tiles, self.param_slots, self.weight_fifo_depth,
                           self.max_beats, self.clock_hz)

    @classmethod
    def of(cls, config, *, max_beats: int, clock_hz: int) -> InfoReply:
        """The reply of a board built with ``config`` (a :class:`hdl.config.TPUConfig`)."""
        return cls(config.rows, config.cols, config.host_width, config.ub_depth,
                   config.acc_depth, config.weight_mem_tiles, config.param_slots,
                   config.weight_fifo_depth, max_beats, clock_hz)
