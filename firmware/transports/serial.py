"""A board as a device: the core's host stream over a serial link (a UART), in the frames of
:mod:`hdl.link.protocol` (docs/host-link.md).

:class:`SerialDevice` opens the port with pyserial's ``serial_for_url``, so a board's port
(``/dev/ttyUSB1``), a simulated board (``socket://127.0.0.1:PORT``,
:func:`sim.models.link_model.serve`)
and ``loop://`` all work. A background thread reads the port all the time, so the board's
output never waits in (and overflows) the operating system's buffers while the host does
something else; beats arrive in a queue that :meth:`SerialDevice.receive` takes from.

Semantics follow :class:`firmware.transports.isa.IsaSimDevice`. :meth:`SerialDevice.send`
returns once the board has stored every frame (not once the core has taken the beats), and
the board's clock runs on its own: :meth:`SerialDevice.receive` waits in wall time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence

import serial

from firmware.device import DeviceError, DeviceStatus, DeviceTimeout, register_transport
from hdl import isa
from hdl.beats import ERROR_MAGIC, error_beat
from hdl.config import TPUConfig
from hdl.link.protocol import (
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameError,
    InfoReply,
    Kind,
    Nak,
    StatusReply,
    encode_frame,
)
from hdl.presets import PRESETS

__all__ = ["SerialDevice", "DEFAULT_BAUDRATE", "CONFIG_FIELDS", "data_payloads"]

#: The UART's rate on the boards (the FT2232H's highest standard rate that 12 MHz divides).
DEFAULT_BAUDRATE = 3_000_000
#: The configuration fields a board reports (``INFO_REPLY``) and the host checks.
CONFIG_FIELDS = ("rows", "cols", "host_width", "ub_depth", "acc_depth", "weight_mem_tiles",
                 "param_slots", "weight_fifo_depth")
#: The default receive budget in core cycles: a base plus so many per beat sent.
TIMEOUT_BASE_CYCLES = 10_000
TIMEOUT_PER_BEAT_CYCLES = 64

#: Seconds the reader thread blocks in one read (how soon close() stops it).
_READ_POLL_S = 0.02
#: Bytes the reader takes from the port before it decodes them.
_READ_CHUNK = 1 << 16
#: First and longest pause before a DATA frame answered ``NAK BUSY`` is sent again.
_BUSY_PAUSE_S = (0.001, 0.05)
_CYCLE_BITS = 48
_LOW64 = (1 << isa.INSTR_BITS) - 1


def data_payloads(beats: Sequence[int], *, beat_bytes: int, max_beats: int) -> list[bytes]:
    """The payloads of the ``DATA`` frames :meth:`SerialDevice.send` sends for ``beats``:
    ``max_beats`` beats a frame in order (the last frame takes the rest), each beat
    ``beat_bytes`` bytes, least significant first. :mod:`firmware.linkrate` counts the link's
    bytes from these, so the count follows the transport."""
    return [b"".join(b.to_bytes(beat_bytes, "little") for b in beats[start:start + max_beats])
            for start in range(0, len(beats), max_beats)]


def _looks_like_error_beat(beat: int) -> bool:
    return (beat & _LOW64) >> 32 == ERROR_MAGIC


class SerialDevice:
    """:class:`firmware.device.Device` backed by a board on a serial link.

    Opening sends ``INFO`` and checks that the board was built with ``config`` (a
    :class:`DeviceError` names the fields that differ), then resets the board unless
    ``reset`` is false.

    Parameters
    ----------
    config : TPUConfig
        The configuration the board must have.
    port : str
        A pyserial port name or URL: ``/dev/ttyUSB1``, ``COM5``, ``socket://HOST:PORT``,
        ``loop://``.
    baudrate : int
        The UART's rate; the board's bitstream fixes it.
    timeout_s : float
        Seconds to wait for the answer to a frame before sending it again; also added to
        every receive's budget.
    retries : int
        Times a frame is sent again after a ``NAK`` (other than ``BUSY``), a corrupted
        answer or no answer, before :class:`DeviceError`.
    busy_timeout_s : float
        Seconds a ``DATA`` frame may be answered ``NAK BUSY`` (the core not taking its
        input) before :class:`DeviceError`.
    reset : bool
        Reset the board when opening (default), so the core starts as the other transports'
        do. Without it the board's state, output numbering and last ``DATA`` seq are kept.

    Attributes
    ----------
    info : InfoReply
        What the board reported: its configuration, ``max_beats`` and clock.
    stats : dict
        ``frames`` sent (retries included), ``resent`` frames sent again, ``naks`` by code
        name, ``bad_frames`` from the board dropped for bad framing or CRC, ``beats`` sent.
    """

    def __init__(self, config: TPUConfig, *, port: str, baudrate: int = DEFAULT_BAUDRATE,
                 timeout_s: float = 0.5, retries: int = 5, busy_timeout_s: float = 10.0,
                 reset: bool = True):
        if not isinstance(config, TPUConfig):
            raise TypeError(f"config must be a TPUConfig, got {type(config).__name__}")
        if not isinstance(port, str) or not port:
            raise ValueError(f"port={port!r} is not supported; allowed: a serial port name "
                             f"or URL such as /dev/ttyUSB1 or socket://127.0.0.1:5555")
        if not isinstance(baudrate, int) or isinstance(baudrate, bool) or baudrate <= 0:
            raise ValueError(f"baudrate={baudrate!r} is not supported; allowed: a positive "
                             f"int (the board's UART rate, default {DEFAULT_BAUDRATE})")
        for name, value in (("timeout_s", timeout_s), ("busy_timeout_s", busy_timeout_s)):
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name}={value!r} is not supported; allowed: seconds > 0")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries={retries!r} is not supported; allowed: an int >= 0")
        self.config = config
        self.port = port
        self.baudrate = baudrate
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.busy_timeout_s = float(busy_timeout_s)
        self.beat_bytes = config.host_width // 8
        self.stats: dict = {"frames": 0, "resent": 0, "naks": {}, "bad_frames": 0, "beats": 0}

        # State shared with the reader thread, under _cond.
        self._cond = threading.Condition()
        self._beats: deque[int] = deque()       # beats the core sent, not yet received
        self._replies: list[Frame | FrameError] = []
        self._beat_seq: int | None = None      # the next BEAT seq due (None: not known)
        self._error_beats: set[int] = set()     # error-like beats seen since clear/reset
        self._lost: str | None = None           # output lost: sticky until clear/reset
        self._suspect: str | None = None        # a corrupted frame that may have been a BEAT
        self._link_error: str | None = None     # the port failed

        self._seq = 0
        self._last_data_seq: int | None = None  # the board's last accepted DATA seq
        self._sent_since_receive = 0
        self._cycles_last: int | None = None
        self._cycles_total = 0
        self._closed = False
        self._stop = threading.Event()
        try:
            self._port = serial.serial_for_url(port, baudrate=baudrate, timeout=_READ_POLL_S)
        except (serial.SerialException, ValueError, OSError) as error:
            raise DeviceError(f"cannot open serial port {port!r}: {error}") from None
        # An FTDI chip holds received bytes up to its latency timer (16 ms by default) before
        # it sends them over USB: each ACK would wait that long. Linux ports can lower it.
        low_latency = getattr(self._port, "set_low_latency_mode", None)
        if low_latency is not None:
            try:
                low_latency(True)
            except (OSError, ValueError, NotImplementedError):
                pass                        # not a USB serial port that has the setting
        self._port.reset_input_buffer()
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"amtpu-serial-{port}")
        self._reader.start()
        try:
            self.info = self._hello()
            if reset:
                self.reset()
            else:
                reply = self._status_reply()
                self._last_data_seq = reply.data_seq if reply.seq_valid else None
        except BaseException:
            self.close()
            raise

    # Reader thread -------------------------------------------------------------------------

    def _read_loop(self) -> None:
        decoder = FrameDecoder()
        try:
            while not self._stop.is_set():
                chunk = self._port.read(1)
                if not chunk:
                    continue
                while len(chunk) < _READ_CHUNK and (waiting := self._port.in_waiting):
                    chunk += self._port.read(min(waiting, _READ_CHUNK))
                items = decoder.feed(chunk)
                if items:
                    with self._cond:
                        for item in items:
                            self._dispatch(item)
                        self._cond.notify_all()
        except Exception as error:        # the port failed: every waiter must hear of it
            with self._cond:
                if not self._stop.is_set():
                    self._link_error = f"reading {self.port!r} failed: {error!r}"
                self._cond.notify_all()

    def _dispatch(self, item: Frame | FrameError) -> None:
        """One frame from the board (under ``_cond``)."""
        if isinstance(item, FrameError) or (
                item.kind == Kind.BEAT.value and len(item.payload) != self.beat_bytes):
            self.stats["bad_frames"] += 1
            what = item.code.name if isinstance(item, FrameError) else "a BEAT of bad length"
            self._suspect = f"a frame from the board was dropped ({what})"
            self._replies.append(item if isinstance(item, FrameError)
                                 else FrameError(Nak.LENGTH, item.seq))
            return
        if item.kind != Kind.BEAT.value:
            self._replies.append(item)
            return
        if self._beat_seq is not None and item.seq != self._beat_seq and self._lost is None:
            missing = (item.seq - self._beat_seq) & 0xFF
            self._lost = (f"BEAT frame {item.seq} came where {self._beat_seq} was due: "
                          f"{missing} beat(s) lost" + (f" ({self._suspect})"
                                                       if self._suspect else ""))
        self._beat_seq = (item.seq + 1) & 0xFF
        self._suspect = None
        beat = int.from_bytes(item.payload, "little")
        self._beats.append(beat)
        if _looks_like_error_beat(beat):
            self._error_beats.add(beat & _LOW64)

    def _check_link(self) -> None:
        """Raise if the port failed or the device is closed (under ``_cond``)."""
        if self._closed:
            raise DeviceError("the device is closed")
        if self._link_error is not None:
            raise DeviceError(f"the serial link failed: {self._link_error}")

    # Frames --------------------------------------------------------------------------------

    def _next_seq(self, kind: Kind) -> int:
        self._seq = (self._seq + 1) & 0xFF
        # A DATA frame with the last accepted one's seq would be taken for its retry.
        if kind == Kind.DATA and self._seq == self._last_data_seq:
            self._seq = (self._seq + 1) & 0xFF
        return self._seq

    def _write(self, frame: bytes) -> None:
        try:
            self._port.write(frame)
        except (serial.SerialException, OSError) as error:
            with self._cond:
                self._link_error = f"writing to {self.port!r} failed: {error!r}"
            raise DeviceError(f"the serial link failed: {self._link_error}") from None
        self.stats["frames"] += 1

    def _transact(self, kind: Kind, payload: bytes = b"") -> Frame:
        """Send one frame and return its answer, sending it again after a NAK, a corrupted
        answer or none (stop-and-wait)."""
        answer = {Kind.STATUS: Kind.STATUS_REPLY, Kind.INFO: Kind.INFO_REPLY}.get(kind, Kind.ACK)
        seq = self._next_seq(kind)
        frame = encode_frame(kind, seq, payload)
        failures = 0
        busy_since: float | None = None
        busy_pause = _BUSY_PAUSE_S[0]
        last = "no answer"
        while True:
            with self._cond:
                self._check_link()
                self._replies.clear()   # answers to earlier frames (or earlier tries)
            self._write(frame)
            outcome = self._await(answer, seq)
            if isinstance(outcome, Frame):
                return outcome
            if outcome == Nak.BUSY:
                now = time.monotonic()
                busy_since = now if busy_since is None else busy_since
                if now - busy_since > self.busy_timeout_s:
                    raise DeviceError(f"the board answered {kind.name} frame {seq} with NAK "
                                      f"BUSY for {self.busy_timeout_s:g} s: the core does not "
                                      f"take its input (is it waiting to send output?)")
                time.sleep(busy_pause)
                busy_pause = min(2 * busy_pause, _BUSY_PAUSE_S[1])
                self.stats["resent"] += 1
                continue
            busy_since = None
            last = outcome
            failures += 1
            if failures > self.retries:
                raise DeviceError(f"no {answer.name} for {kind.name} frame {seq} from "
                                  f"{self.port!r} after {failures} tries (last: {last}); the "
                                  f"link is too noisy, or the board does not answer at "
                                  f"{self.baudrate} baud")
            self.stats["resent"] += 1

    def _await(self, answer: Kind, seq: int) -> Frame | Nak | str:
        """Wait for the answer to frame ``seq``: the frame, ``Nak.BUSY``, or why to send it
        again."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                self._check_link()
                why = None
                for item in self._replies:
                    if isinstance(item, FrameError):
                        why = f"an answer with bad {item.code.name}"
                    elif item.kind == Kind.NAK.value:
                        code = item.payload[0] if len(item.payload) == 1 else None
                        name = Nak(code).name if code in {n.value for n in Nak} else str(code)
                        self.stats["naks"][name] = self.stats["naks"].get(name, 0) + 1
                        if code == Nak.BUSY.value and item.seq == seq:
                            self._replies.clear()
                            return Nak.BUSY
                        why = f"NAK {name}"
                    elif item.kind == answer.value and item.seq == seq:
                        return item
                self._replies.clear()
                if why is not None:
                    return why
                left = deadline - time.monotonic()
                if left <= 0:
                    return f"no answer within {self.timeout_s:g} s"
                self._cond.wait(left)

    def _hello(self) -> InfoReply:
        try:
            reply = self._transact(Kind.INFO)
        except DeviceError as error:
            raise DeviceError(f"{error}. Is {self.port!r} the board's UART (on the "
                              f"iCEBreaker the FT2232H's second interface) and the board "
                              f"programmed with the amtpu bitstream?") from None
        try:
            info = InfoReply.unpack(reply.payload)
        except ValueError as error:
            raise DeviceError(f"{self.port!r} answered INFO with something else: {error}; "
                              f"is it an amtpu board?") from None
        if info.version != PROTOCOL_VERSION:
            raise DeviceError(f"the board on {self.port!r} speaks link protocol version "
                              f"{info.version}; this host speaks {PROTOCOL_VERSION}")
        if info.max_beats < 1 or info.clock_hz < 1:
            raise DeviceError(f"the board on {self.port!r} reports max_beats="
                              f"{info.max_beats}, clock_hz={info.clock_hz}; both must be >= 1")
        differ = [f"{name}: board {getattr(info, name)}, host {getattr(self.config, name)}"
                  for name in CONFIG_FIELDS if getattr(info, name) != getattr(self.config, name)]
        if differ:
            board = {name: getattr(info, name) for name in CONFIG_FIELDS}
            preset = next((key for key, config in PRESETS.items()
                           if all(getattr(config, f) == v for f, v in board.items())), None)
            has = f"the {preset!r} preset" if preset else ", ".join(
                f"{k}={v}" for k, v in board.items())
            raise DeviceError(f"the board on {self.port!r} was built with another "
                              f"configuration ({'; '.join(differ)}); it has {has}: open it "
                              f"with that configuration or rebuild the board")
        return info

    def _status_reply(self) -> StatusReply:
        reply = self._transact(Kind.STATUS)
        try:
            status = StatusReply.unpack(reply.payload)
        except ValueError as error:
            raise DeviceError(f"bad STATUS_REPLY from the board: {error}") from None
        # The board's counter is 48 bits and wraps: keep a running total.
        if self._cycles_last is not None:
            self._cycles_total += (status.cycles - self._cycles_last) % (1 << _CYCLE_BITS)
        else:
            self._cycles_total = status.cycles
        self._cycles_last = status.cycles
        return status

    # Device --------------------------------------------------------------------------------

    def send(self, beats: Sequence[int]) -> None:
        limit = 1 << self.config.host_width
        beats = [int(b) for b in beats]
        for position, beat in enumerate(beats):
            if not 0 <= beat < limit:
                raise ValueError(f"beat {position} = {beat:#x} does not fit in "
                                 f"host_width={self.config.host_width} bits")
        for payload in data_payloads(beats, beat_bytes=self.beat_bytes,
                                     max_beats=self.info.max_beats):
            reply = self._transact(Kind.DATA, payload)
            self._last_data_seq = reply.seq
            self._sent_since_receive += len(payload) // self.beat_bytes
            self.stats["beats"] += len(payload) // self.beat_bytes

    def receive(self, count: int, *, timeout_cycles: int | None = None) -> list[int]:
        """As :meth:`firmware.device.Device.receive`; the budget is wall time: the
        receive gives up after ``timeout_s`` plus ``timeout_cycles`` (default 10,000 plus 64
        per beat sent since the last receive) at the board's clock without a new beat."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"count={count!r} is not supported; allowed: an int >= 0")
        if timeout_cycles is not None and (not isinstance(timeout_cycles, int)
                                           or timeout_cycles < 0):
            raise ValueError(f"timeout_cycles={timeout_cycles!r} is not supported; allowed: "
                             f"an int >= 0 or None")
        cycles = (TIMEOUT_BASE_CYCLES + TIMEOUT_PER_BEAT_CYCLES * self._sent_since_receive
                  if timeout_cycles is None else timeout_cycles)
        budget = self.timeout_s + cycles / self.info.clock_hz
        deadline = time.monotonic() + budget
        checked = 0
        while True:
            with self._cond:
                self._check_link()
                if self._lost is not None:
                    raise DeviceError(f"the link lost output: {self._lost}; clear() or "
                                      f"reset() the device and send the program again")
                got = [self._beats[i] for i in range(min(count, len(self._beats)))]
            if any(_looks_like_error_beat(b) for b in got[checked:]):
                status = self._settled_status(deadline)
                if status.error:
                    beat = error_beat(status.code, status.instr_index)
                    stop = next((i for i, b in enumerate(got) if b & _LOW64 == beat), None)
                    if stop is not None:
                        raise DeviceError(f"the core stopped after {stop} of {count} beats",
                                          status)
            checked = len(got)
            if len(got) >= count:
                with self._cond:
                    for _ in range(count):
                        self._beats.popleft()
                self._sent_since_receive = 0
                return got
            with self._cond:
                if len(self._beats) == len(got) and self._lost is None:
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
                if len(self._beats) > len(got):
                    deadline = time.monotonic() + budget     # a beat came: time starts again
                    continue
            if time.monotonic() >= deadline:
                status = self.status()
                with self._cond:
                    if self._suspect is not None:
                        self._lost = f"{self._suspect} and no beat came after it"
                    lost = self._lost
                if lost is not None:
                    raise DeviceError(f"the link lost output: {lost} ({len(got)} of {count} "
                                      f"beats came); clear() or reset() the device and send "
                                      f"the program again", status)
                raise DeviceTimeout(f"the core sent {len(got)} of {count} beats within "
                                    f"{budget:.2f} s of the last one", status)

    def _settled_status(self, deadline: float) -> DeviceStatus:
        """The status once the board has delivered every frame (as the other transports
        judge an error once the core has taken all input: a RESYNC_WORD in it clears it)."""
        while True:
            reply = self._status_reply()
            status = DeviceStatus.from_bits(reply.status)
            if not status.error or not reply.pending or time.monotonic() >= deadline:
                return status
            time.sleep(0.001)

    def status(self) -> DeviceStatus:
        return DeviceStatus.from_bits(self._status_reply().status)

    def clear(self) -> None:
        status = self.status()
        if status.error:
            # The core ignores i_clear until it has sent its error beat.
            beat = error_beat(status.code, status.instr_index)
            deadline = time.monotonic() + self.timeout_s
            with self._cond:
                while beat not in self._error_beats and time.monotonic() < deadline:
                    self._check_link()
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
        self._transact(Kind.CLEAR)
        self._drop_output()
        if status.error:
            after = self.status()
            if after.error:
                raise DeviceError("CLEAR did not clear the core's error", after)

    def reset(self) -> None:
        self._transact(Kind.RESET)
        self._last_data_seq = None
        self._drop_output()
        with self._cond:
            self._beat_seq = 0

    def _drop_output(self) -> None:
        """Beats from before a CLEAR or RESET (all of them arrived before its ACK)."""
        with self._cond:
            self._beats.clear()
            self._error_beats.clear()
            if self._suspect is not None:
                # A frame that may have been a BEAT was lost: the next BEAT's number is not
                # known (STATUS_REPLY does not say it); take it from that BEAT.
                self._beat_seq = None
            self._lost = None
            self._suspect = None
        self._sent_since_receive = 0

    def cycles(self) -> int | None:
        """Board clock cycles since power-up (48-bit wraps undone while the device is open;
        the link model reports a proxy, see :mod:`sim.models.link_model`)."""
        self._status_reply()
        return self._cycles_total

    def close(self) -> None:
        """Stop the reader and close the port. Safe to call twice."""
        if self._closed:
            return
        self._stop.set()
        reader = getattr(self, "_reader", None)
        if reader is not None and reader is not threading.current_thread():
            reader.join()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        port = getattr(self, "_port", None)
        if port is not None:
            sock = getattr(port, "_socket", None)
            if sock is not None:
                # A socket:// port (the link model): close the socket here. pyserial 3.5's
                # close skips that when the shutdown fails (the other end already gone),
                # and then sleeps 0.3 s "in case of quick reconnects", which the link
                # model does not need (a new connection takes the link over).
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
                port._socket = None
                port.is_open = False
            port.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            self._stop.set()


register_transport("serial", SerialDevice)
