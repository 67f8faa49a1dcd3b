"""What a board's UART host link carries: bytes on the wire per image, and the images/s that
allows beside the core's own images/s at its clock.

The simulated transports deliver a beat a cycle; a board receives its beats through a UART
(docs/host-link.md), which is far slower. :func:`link_rate` counts the bytes the serial
transport (:mod:`firmware.transports.serial`) and the board exchange for a network's batch
programs (:class:`firmware.runtime.Batch`), framing included, from the very frames they send:

- to the board: ``DATA`` frames grouped as :func:`firmware.transports.serial.data_payloads`
  groups them, encoded by :func:`hdl.link.protocol.encode_frame` (leading and trailing
  ``END``, SLIP escapes counted from the actual bytes, CRC);
- from the board: one ``ACK`` per ``DATA`` frame and one ``BEAT`` frame per output beat. A
  ``BEAT``'s escapes depend on the output's values: exact when they are given, else the
  count with no escape in payload and CRC and the worst case (every one escaped). The DONE
  beat that ends each program is known, so it is always exact.

Sequence numbers (escaped when they are 0xC0 or 0xDB) follow the transport: a ``DATA`` frame
takes the next seq, ``BEAT`` frames count from 0 after the board's reset. A UART byte is
:data:`UART_BITS_PER_BYTE` bit times (8N1, :mod:`hdl.link.uart`, sent back to back).

The link is full duplex, so the slower direction bounds it. The host's direction also waits:
the transport sends a ``DATA`` frame only once the previous one's ``ACK`` has come back
(stop-and-wait), so it is busy for each frame's bytes plus its ``ACK``'s. USB latency and the
host's turnaround come on top on a real board: the link's figures are ceilings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hdl import beats as hdl_beats
from hdl.config import TPUConfig
from hdl.presets import PRESETS

__all__ = ["UART_BITS_PER_BYTE", "BoardLink", "BOARDS", "board_for", "LinkRate", "link_rate",
           "format_link_rate"]

#: Bit times of one UART byte: start, 8 data bits, stop.
UART_BITS_PER_BYTE = 10


@dataclass(frozen=True)
class BoardLink:
    """A board's host link: its core's preset, clock and UART.

    Attributes
    ----------
    name : str
        The board's name as people write it.
    preset : str
        The :data:`hdl.presets.PRESETS` configuration the board is built with.
    clock_mhz : float
        The core's clock.
    baud : int
        The UART's rate.
    max_beats : int
        Beats a ``DATA`` frame carries at most (the host link's frame buffer).
    """
    name: str
    preset: str
    clock_mhz: float
    baud: int
    max_beats: int

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r} is not supported; allowed: "
                             f"{', '.join(PRESETS)}")
        if (not isinstance(self.clock_mhz, int | float) or isinstance(self.clock_mhz, bool)
                or not self.clock_mhz > 0):
            raise ValueError(f"clock_mhz={self.clock_mhz!r} is not supported; allowed: a "
                             f"number > 0 (MHz)")
        for name, value, high in (("baud", self.baud, None), ("max_beats", self.max_beats,
                                                              0xFFFF)):
            if (not isinstance(value, int) or isinstance(value, bool) or value < 1
                    or (high is not None and value > high)):
                raise ValueError(f"{name}={value!r} is not supported; allowed: an int >= 1"
                                 + (f" and <= {high}" if high is not None else ""))


#: The boards' links; the boards' own modules (boards/icebreaker.py, boards/ulx3s.py) hold the
#: same values, and tests/firmware/test_linkrate.py checks that they agree.
BOARDS: dict[str, BoardLink] = {
    "icebreaker": BoardLink("iCEBreaker", preset="icebreaker", clock_mhz=24.0,
                            baud=3_000_000, max_beats=8),
    "ulx3s": BoardLink("ULX3S", preset="ulx3s", clock_mhz=135.0, baud=3_000_000,
                       max_beats=16),
}


def board_for(config: TPUConfig) -> BoardLink | None:
    """The board built with ``config``; the ``default`` preset counts as the ULX3S, whose
    preset differs from it only in how the products are built and pipelined (the same
    programs and beats). ``None`` when no board carries ``config``."""
    for board in BOARDS.values():
        if PRESETS[board.preset] == config:
            return board
    if config == PRESETS["default"]:
        return BOARDS["ulx3s"]
    return None


@dataclass(frozen=True)
class LinkRate:
    """Bytes on the wire for some batch programs, and the rates they allow.

    ``*_low`` and ``*_high`` bound the board's ``BEAT`` frames whose values were not given
    (no escape in payload and CRC, every byte of them escaped); they are equal when
    :attr:`exact`. ``setup_*`` are the resident setup program's, sent once, kept out of the
    per-image figures (``None`` without one).
    """
    board: BoardLink
    images: int
    data_frames: int
    to_board: int
    acks: int
    output_beats: int
    beat_frames_low: int
    beat_frames_high: int
    exact: bool
    cycles_per_image: float | None = None
    setup_to_board: int | None = None
    setup_from_board_low: int | None = None
    setup_from_board_high: int | None = None

    @property
    def byte_rate(self) -> float:
        """UART bytes per second each way."""
        return self.board.baud / UART_BITS_PER_BYTE

    @property
    def to_board_per_image(self) -> float:
        return self.to_board / self.images

    @property
    def from_board_per_image(self) -> tuple[float, float]:
        """(low, high) bytes from the board per image; equal when :attr:`exact`."""
        return ((self.acks + self.beat_frames_low) / self.images,
                (self.acks + self.beat_frames_high) / self.images)

    def _rate(self, from_board: int) -> float:
        busiest = max(self.to_board + self.acks, from_board)
        return self.byte_rate * self.images / busiest

    @property
    def images_per_s(self) -> float:
        """The most images a second the link carries: the slower direction's, where the
        host's counts each ``DATA`` frame's ``ACK`` (stop-and-wait). With the output's
        values unknown, its escapes are taken as none, so this is a ceiling."""
        return self._rate(self.acks + self.beat_frames_low)

    @property
    def images_per_s_worst(self) -> float:
        """:attr:`images_per_s` with every unknown output byte escaped."""
        return self._rate(self.acks + self.beat_frames_high)

    @property
    def full_duplex_images_per_s(self) -> float:
        """Bytes alone, both directions streaming (no waiting for ``ACK``), no escape in
        unknown output: what the wire would carry with a host that did not wait."""
        return self.byte_rate * self.images / max(self.to_board,
                                                  self.acks + self.beat_frames_low)

    @property
    def bound_by(self) -> str:
        """Which direction bounds :attr:`images_per_s`: ``"to"`` or ``"from"`` the board."""
        return "to" if self.to_board + self.acks >= self.acks + self.beat_frames_low else "from"

    @property
    def core_images_per_s(self) -> float | None:
        """The core's images a second at the board's clock (``None`` without
        :attr:`cycles_per_image`)."""
        if self.cycles_per_image is None:
            return None
        return self.board.clock_mhz * 1e6 / self.cycles_per_image


def _check_count(name: str, value, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} is not supported; allowed: an int >= {low}")
    return value


def _beat_frame_bytes(seq: int, beat: int | None, beat_bytes: int) -> tuple[int, int]:
    """(low, high) bytes of a ``BEAT`` frame; equal when the beat is known."""
    from hdl.link.protocol import END, ESC, Kind, encode_frame
    if beat is not None:
        n = len(encode_frame(Kind.BEAT, seq, beat.to_bytes(beat_bytes, "little")))
        return n, n
    # Leading and trailing END, the kind (0x83, never escaped), the seq, payload, CRC.
    fixed = 3 + (2 if seq in (END, ESC) else 1)
    return fixed + beat_bytes + 2, fixed + 2 * (beat_bytes + 2)


def _program_bytes(beats: Sequence[int], outputs: Sequence[int | None], *, beat_bytes: int,
                   max_beats: int, seq: int, beat_seq: int) -> tuple[int, int, int, int, int,
                                                                     int, int]:
    """Bytes of one program: (DATA frames, DATA bytes, ACK bytes, BEAT low, BEAT high, the
    next seq, the next BEAT seq)."""
    from firmware.transports.serial import data_payloads
    from hdl.link.protocol import Kind, encode_frame
    frames = to_board = acks = 0
    for payload in data_payloads(list(beats), beat_bytes=beat_bytes, max_beats=max_beats):
        seq = (seq + 1) & 0xFF
        frames += 1
        to_board += len(encode_frame(Kind.DATA, seq, payload))
        acks += len(encode_frame(Kind.ACK, seq))
    low = high = 0
    for beat in outputs:
        lo, hi = _beat_frame_bytes(beat_seq, beat, beat_bytes)
        low, high = low + lo, high + hi
        beat_seq = (beat_seq + 1) & 0xFF
    return frames, to_board, acks, low, high, seq, beat_seq


def _check_beats(what: str, beats: Sequence[int], beat_bytes: int) -> None:
    limit = 1 << 8 * beat_bytes
    for position, beat in enumerate(beats):
        if not isinstance(beat, int) or not 0 <= beat < limit:
            raise ValueError(f"{what} beat {position} = {beat!r} is not supported; allowed: "
                             f"an int from 0 to 2**{8 * beat_bytes} - 1")


def link_rate(batches: Iterable, *, config: TPUConfig, board: BoardLink,
              setup: tuple[Sequence[int], int] | None = None,
              outputs: Sequence[Sequence[int]] | None = None,
              cycles_per_image: float | None = None) -> LinkRate:
    """The bytes the serial transport and ``board`` exchange for ``batches`` (objects with
    :class:`firmware.runtime.Batch`'s ``beats``, ``output_beats``, ``instructions`` and
    ``images``), as :func:`firmware.runtime.run` sends them on a freshly opened device.

    Parameters
    ----------
    batches : iterable of Batch
        The batch programs, in the order they are sent.
    config : TPUConfig
        The core's configuration (its beat width).
    board : BoardLink
        The link: baud, ``max_beats``, clock.
    setup : (beats, output beats) or None
        The resident setup program (:meth:`firmware.compiler` executables'
        ``setup_program()``), reported apart. It moves the sequence numbers.
    outputs : sequence of beat lists, or None
        Each batch's output beats, to count the ``BEAT`` frames' escapes exactly; without
        them the DONE beats are exact and the rest bounded.
    cycles_per_image : float or None
        The core's cycles per image, for :attr:`LinkRate.core_images_per_s`.
    """
    if not isinstance(config, TPUConfig):
        raise TypeError(f"config must be a TPUConfig, got {type(config).__name__}")
    if not isinstance(board, BoardLink):
        raise TypeError(f"board must be a BoardLink, got {type(board).__name__}")
    if cycles_per_image is not None and (
            not isinstance(cycles_per_image, int | float) or isinstance(cycles_per_image, bool)
            or not cycles_per_image > 0):
        raise ValueError(f"cycles_per_image={cycles_per_image!r} is not supported; allowed: "
                         f"a number > 0 or None")
    beat_bytes = config.host_width // 8
    batches = list(batches)
    if not batches:
        raise ValueError("no batches; allowed: one or more batch programs")
    if outputs is not None and len(outputs) != len(batches):
        raise ValueError(f"{len(outputs)} output lists for {len(batches)} batches; allowed: "
                         f"one per batch, or None")
    # SerialDevice opens with INFO (seq 1) and RESET (seq 2); the BEAT count restarts at 0.
    seq, beat_seq = 2, 0
    setup_fields: dict = {}
    if setup is not None:
        setup_beats, setup_out = setup
        _check_beats("setup", setup_beats, beat_bytes)
        _check_count("setup output beats", setup_out, 0)
        _, to_b, acks, low, high, seq, beat_seq = _program_bytes(
            setup_beats, [None] * setup_out, beat_bytes=beat_bytes, max_beats=board.max_beats,
            seq=seq, beat_seq=beat_seq)
        setup_fields = {"setup_to_board": to_b, "setup_from_board_low": acks + low,
                        "setup_from_board_high": acks + high}
    # run() then sends CLEAR_COUNTERS; HALT (two beats, one DONE beat back) and a STATUS.
    clear_frames = -(-2 // board.max_beats)
    seq, beat_seq = (seq + clear_frames + 1) & 0xFF, (beat_seq + 1) & 0xFF
    images = frames = to_board = acks = low = high = beats_back = 0
    for index, batch in enumerate(batches):
        _check_count(f"batch {index}'s images", batch.images, 1)
        _check_count(f"batch {index}'s output_beats", batch.output_beats, 1)
        _check_beats(f"batch {index}'s", batch.beats, beat_bytes)
        if outputs is not None:
            out = list(outputs[index])
            if len(out) != batch.output_beats:
                raise ValueError(f"batch {index} has {len(out)} output beats given; allowed: "
                                 f"its output_beats, {batch.output_beats}")
            _check_beats(f"batch {index}'s output", out, beat_bytes)
        else:
            out = [None] * (batch.output_beats - 1) + [hdl_beats.done_beat(batch.instructions)]
        f, to_b, a, lo, hi, seq, beat_seq = _program_bytes(
            batch.beats, out, beat_bytes=beat_bytes, max_beats=board.max_beats, seq=seq,
            beat_seq=beat_seq)
        images += batch.images
        frames, to_board, acks = frames + f, to_board + to_b, acks + a
        low, high, beats_back = low + lo, high + hi, beats_back + batch.output_beats
    return LinkRate(board=board, images=images, data_frames=frames, to_board=to_board,
                    acks=acks, output_beats=beats_back, beat_frames_low=low,
                    beat_frames_high=high, exact=low == high,
                    cycles_per_image=cycles_per_image, **setup_fields)


def format_link_rate(rate: LinkRate) -> list[str]:
    """A few lines for ``amtpu demo``: the link's figures beside the core's."""
    b = rate.board
    to_img = rate.to_board_per_image
    lo, hi = rate.from_board_per_image
    back = (f"{lo:,.1f}" if lo == hi else f"{lo:,.1f} to {hi:,.1f}")
    rate_text = (f"{rate.images_per_s:,.0f}" if rate.images_per_s == rate.images_per_s_worst
                 else f"{rate.images_per_s_worst:,.0f} to {rate.images_per_s:,.0f}")
    lines = [
        f"on the {b.name}: the link at {b.baud:,} baud ({UART_BITS_PER_BYTE} bits a byte) "
        f"carries {to_img:,.1f} bytes to / {back} bytes from the board per image -> "
        f"{rate_text} images/s at most (framing, escapes and ACKs counted; bound by the way "
        f"{rate.bound_by} the board, the host waiting for each DATA frame's ACK; USB latency "
        f"not counted)"]
    core = rate.core_images_per_s
    if core is not None:
        slower = core / rate.images_per_s
        verdict = (f"the link bounds it, {slower:,.0f}x fewer" if slower > 1
                   else "the core bounds it")
        lines.append(f"the core at {b.clock_mhz:g} MHz: {core:,.0f} images/s ({verdict}; "
                     f"the cycles above are the core's, not the board's)")
    if rate.setup_to_board is not None:
        lines.append(f"setup (resident weights, sent once): {rate.setup_to_board:,} bytes to "
                     f"the board, {rate.setup_to_board / rate.byte_rate:.3f} s on the wire")
    return lines
