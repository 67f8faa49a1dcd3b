"""A byte-level model of a board's side of the host link: the frame protocol of
:mod:`hdl.link.protocol` in front of the core as :class:`sim.models.isa_sim.IsaSim`.

:class:`LinkModel` takes the bytes a host writes to the board's UART and returns the bytes
the board would write back (:meth:`LinkModel.feed`). :func:`serve` puts a model behind a TCP
port, so pyserial's ``socket://127.0.0.1:PORT`` URL reaches it the way ``/dev/ttyUSB1``
reaches a board, and :mod:`firmware.transports.serial` can be tested without hardware::

    python -m sim.models.link_model --config small --port 5555
    amtpu demo --config small --transport serial --port socket://127.0.0.1:5555

What it models
--------------
Every rule of :mod:`hdl.link.protocol`: SLIP framing, the checks on a received frame in
their order (``ESCAPE``, ``OVERSIZE``, ``LENGTH``, ``CRC``, ``KIND``, ``LENGTH``, ``BUSY``,
decided as the frame's first byte arrives), ``DATA`` retries recognised by their ``seq``
(answered with ``ACK`` and not delivered again), two frame buffers, ``BEAT`` frames numbered
from 0 after power-up and ``RESET``, ``STATUS_REPLY`` with the core's status, ``CLEAR``
(frames not yet delivered dropped, then :meth:`IsaSim.clear`), ``RESET``
(:meth:`IsaSim.reset`) and ``INFO_REPLY``.

And the gateware's transmitter (:class:`hdl.link.host_link.HostLink`): replies wait in a
queue of :data:`REPLY_QUEUE_DEPTH` and go before waiting ``BEAT`` frames, a frame is never
interrupted, the ``NAK`` of a frame that failed a framing check (``ESCAPE``, ``OVERSIZE``,
too short, ``CRC``) is queued only into an empty queue, and other replies are dropped only
when it is full. For that the model counts time in bytes on the line, both ways at the same
rate: the bytes of one :meth:`LinkModel.feed` arrive back to back, and the transmitter takes
the next frame when the one it sends has two bytes left (the gateware's output register and
the UART's); between calls the line is idle long enough for everything waiting to be sent.

What it does not model
----------------------
The core's time. An accepted ``DATA`` frame is delivered to the core at once, after its
``ACK``, and the ``BEAT`` frames of every beat the core sends wait for the transmitter from
then on; so no frame waits and ``NAK BUSY`` never happens, unless :meth:`LinkModel.pause`
holds delivery (as a core that cannot send its output would), which lets the two buffers
fill. Consequently:

- the ``cycles`` of ``STATUS_REPLY`` is a proxy, not a clock: beats the core has taken plus
  beats it has sent since the model was created (it keeps counting over ``RESET``, as a
  board's cycle counter counts from power-up);
- the counters whose values depend on timing (``cycles``, ``weight_stall``, ``non_matrix``,
  ``raw_stall``, ``host_stall``; ``None`` in :class:`IsaSim`) are sent as 0. The counters
  the ISA fixes (:data:`sim.models.isa_sim.DETERMINISTIC_COUNTERS`) are exact.

Fault injection
---------------
:meth:`LinkModel.inject` corrupts (a CRC bit flipped) or drops the next frames of a kind in
either direction, so a host's retry paths can be tested; :attr:`LinkModel.stats` counts what
the model received, answered and injected, and :attr:`LinkModel.delivered` lists every beat
given to the core since the last ``RESET``.
"""

from __future__ import annotations

import argparse
import select
import socket
import socketserver
import sys
import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from hdl.config import TPUConfig
from hdl.link.host_link import REPLY_QUEUE_DEPTH
from hdl.link.protocol import (
    CRC_BYTES,
    HOST_KINDS,
    Frame,
    FrameDecoder,
    FrameError,
    InfoReply,
    Kind,
    Nak,
    StatusReply,
    crc16,
    max_body,
    slip_encode,
)
from sim.models.isa_sim import IsaSim

__all__ = ["LinkModel", "LinkServer", "serve", "FAULTS", "FRAME_BUFFERS",
           "REPLY_QUEUE_DEPTH", "DEFAULT_CLOCK_HZ", "main"]

#: Frames the board holds: one being delivered to the core, one waiting.
FRAME_BUFFERS = 2
#: The iCEBreaker's oscillator: the clock an ``INFO_REPLY`` reports unless told otherwise.
DEFAULT_CLOCK_HZ = 12_000_000
#: What :meth:`LinkModel.inject` can do: to a reply the model sends (``corrupt``, ``drop``)
#: or to a frame it receives (``corrupt_in``: answered ``NAK CRC``; ``drop_in``: ignored, as
#: if it never arrived).
FAULTS = ("corrupt", "drop", "corrupt_in", "drop_in")

_CYCLE_MASK = (1 << 48) - 1
#: Bytes of a frame still to go on the line when the gateware's transmitter takes the next
#: frame: one in its output register, one in the UART's shift register.
_TX_AHEAD = 2
#: Seconds a connection's thread waits for bytes before it sends output made meanwhile
#: (by :meth:`LinkModel.resume`).
_POLL_S = 0.01


@dataclass
class _Fault:
    action: str
    kind: Kind | None
    remaining: int


class LinkModel:
    """The board side of the host link, byte for byte, with :class:`IsaSim` as the core.

    Thread-safe: a server thread may feed it while a test injects faults or inspects it.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration (what ``INFO_REPLY`` reports).
    max_beats : int
        Beats a ``DATA`` frame may carry (the frame buffers' size), 1 to 65535.
    clock_hz : int
        The core clock ``INFO_REPLY`` reports, 1 to 2**32 - 1.

    Attributes
    ----------
    sim : IsaSim
        The core.
    info : InfoReply
        What ``INFO`` is answered with.
    delivered : list of int
        Every beat given to the core since creation or the last ``RESET``, in order.
    stats : collections.Counter
        ``"rx KIND"`` frames received with good framing and CRC, ``"nak CODE"`` NAKs made,
        ``"tx KIND"`` frames sent, ``"lost KIND"`` replies dropped by the reply queue,
        ``"retry"`` DATA retries acknowledged without delivery, ``"fault ACTION"`` faults
        applied.
    """

    def __init__(self, config: TPUConfig, *, max_beats: int,
                 clock_hz: int = DEFAULT_CLOCK_HZ):
        if not isinstance(config, TPUConfig):
            raise TypeError(f"config must be a TPUConfig, got {type(config).__name__}")
        for name, value, high in (("max_beats", max_beats, 0xFFFF),
                                  ("clock_hz", clock_hz, 0xFFFF_FFFF)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(f"{name}={value!r} is not supported; allowed: an int from 1 "
                                 f"to {high} (the INFO_REPLY field's range)")
        self.config = config
        self.max_beats = max_beats
        self.clock_hz = clock_hz
        self.beat_bytes = config.host_width // 8
        self.info = InfoReply.of(config, max_beats=max_beats, clock_hz=clock_hz)
        self.sim = IsaSim(config)
        self.stats: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._decoder = FrameDecoder(limit=max_body(max_beats, self.beat_bytes))
        self._out = bytearray()
        self._faults: list[_Fault] = []
        self._paused = False
        self._cycles = 0
        # The transmitter, in byte times since the line was last idle: replies and BEAT
        # frames waiting (with the time each became ready), when the transmitter takes its
        # next frame, when the last frame it took leaves the line.
        self._clock = 0
        self._replies: deque[tuple[int, bytes]] = deque()
        self._beat_frames: deque[tuple[int, bytes]] = deque()
        self._tx_free = 0
        self._wire_end = 0
        self._buffer_free = True        # a frame buffer was free at the frame's first byte
        self._data_seq = 0
        self._power_up()

    def _power_up(self) -> None:
        """The state ``RESET`` returns to (the cycle counter aside)."""
        self._pending: deque[list[int]] = deque()
        self._beat_seq = 0
        self._seq_valid = False         # (the seq itself stays, as on the board)
        self._taken = 0                 # IsaSim output beats already sent as BEAT frames
        self.delivered: list[int] = []

    # Bytes in, bytes out -------------------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        """Process bytes from the host; returns the bytes the board sends back (including any
        made since the last call by :meth:`resume`). ``feed(b"")`` only collects those."""
        with self._lock:
            for byte in bytes(data):
                self._clock += 1
                first = self._decoder.body_bytes == 0
                items = self._decoder.feed(bytes((byte,)))
                if first and self._decoder.body_bytes == 1:
                    self._buffer_free = len(self._pending) < FRAME_BUFFERS
                for item in items:
                    self._transmit(self._clock)
                    self._receive(item)
            self._drain()
            out = bytes(self._out)
            self._out.clear()
            return out

    @property
    def cycles(self) -> int:
        """The ``cycles`` figure of ``STATUS_REPLY`` (a proxy: beats in plus beats out)."""
        with self._lock:
            return self._cycles

    @property
    def pending(self) -> int:
        """Frames accepted and not yet delivered to the core."""
        with self._lock:
            return len(self._pending)

    # Delivery ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Hold delivery to the core: accepted frames stay in the buffers, so a third new
        ``DATA`` frame is answered ``NAK BUSY``."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        """Deliver the held frames and go on delivering at once; the ``BEAT`` frames this
        produces come out of the next :meth:`feed`."""
        with self._lock:
            self._paused = False
            self._deliver()
            self._drain()

    def _deliver(self) -> None:
        while self._pending and not self._paused:
            for beat in self._pending.popleft():
                self.sim.feed([beat])
                self.delivered.append(beat)
                self._cycles += 1
                self._send_output()

    def _send_output(self) -> None:
        new = self.sim.output[self._taken:]
        self._taken = len(self.sim.output)
        for beat in new:
            # Timing-dependent counters: the ISA simulator does not know them.
            value = 0 if beat is None else beat
            self._emit(Kind.BEAT, self._beat_seq, value.to_bytes(self.beat_bytes, "little"))
            self._beat_seq = (self._beat_seq + 1) & 0xFF
            self._cycles += 1
        self._cycles &= _CYCLE_MASK

    # The transmitter -----------------------------------------------------------------------

    def _transmit(self, now: int) -> None:
        """Send what the transmitter takes up to byte time ``now``: a waiting reply before a
        waiting BEAT frame, each frame whole."""
        while self._replies or self._beat_frames:
            waiting = self._replies or self._beat_frames
            take = max(self._tx_free, waiting[0][0])
            if take > now:
                return
            frame = waiting.popleft()[1]
            start = max(take, self._wire_end)
            self._wire_end = start + len(frame)
            self._tx_free = self._wire_end - _TX_AHEAD
            self._out += frame

    def _drain(self) -> None:
        """The line idles: everything waiting is sent, and time starts again."""
        self._transmit(self._clock + (1 << 62))
        self._clock = self._tx_free = self._wire_end = 0

    def _queue_reply(self, kind: Kind, frame: bytes, noise: bool) -> bool:
        """Queue a reply as the gateware does; False if there is no room for it."""
        self._transmit(self._clock)
        if len(self._replies) >= REPLY_QUEUE_DEPTH - (1 if noise else 0):
            self.stats[f"lost {kind.name}"] += 1
            return False
        self._replies.append((self._clock, frame))
        self._transmit(self._clock)
        return True

    # Frames --------------------------------------------------------------------------------

    def _receive(self, item: Frame | FrameError) -> None:
        if isinstance(item, FrameError):
            self._nak(item.code, item.seq, noise=True)
            return
        kind = self._kind(item.kind)
        fault = self._take_fault(("corrupt_in", "drop_in"), kind)
        if fault == "drop_in":
            return
        if fault == "corrupt_in":
            self._nak(Nak.CRC, item.seq, noise=True)
            return
        self.stats[f"rx {kind.name if kind is not None else hex(item.kind)}"] += 1
        if kind not in HOST_KINDS:
            self._nak(Nak.KIND, item.seq)
            return
        payload = item.payload
        if kind == Kind.DATA:
            if not payload or len(payload) % self.beat_bytes:
                self._nak(Nak.LENGTH, item.seq)
                return
            if self._seq_valid and item.seq == self._data_seq:
                self.stats["retry"] += 1            # its ACK was lost: not delivered twice
                self._emit(Kind.ACK, item.seq)
                return
            if not self._buffer_free:
                self._nak(Nak.BUSY, item.seq)
                return
            self._pending.append([
                int.from_bytes(payload[i:i + self.beat_bytes], "little")
                for i in range(0, len(payload), self.beat_bytes)])
            self._data_seq = item.seq
            self._seq_valid = True
            self._emit(Kind.ACK, item.seq)
            self._deliver()
            return
        if payload:
            self._nak(Nak.LENGTH, item.seq)
            return
        if kind == Kind.STATUS:
            reply = StatusReply(status=self.sim.status.as_bits(), cycles=self._cycles,
                                data_seq=self._data_seq, pending=len(self._pending),
                                seq_valid=self._seq_valid)
            self._emit(Kind.STATUS_REPLY, item.seq, reply.pack())
        elif kind == Kind.CLEAR:
            self._pending.clear()
            self.sim.clear()
            self._emit(Kind.ACK, item.seq)
        elif kind == Kind.RESET:
            self.sim.reset()
            self._power_up()
            self._beat_frames.clear()       # the reset core's output not yet sent is lost
            self._emit(Kind.ACK, item.seq)
        else:
            self._emit(Kind.INFO_REPLY, item.seq, self.info.pack())

    @staticmethod
    def _kind(value: int) -> Kind | None:
        try:
            return Kind(value)
        except ValueError:
            return None

    def _nak(self, code: Nak, seq: int, *, noise: bool = False) -> None:
        self.stats[f"nak {code.name}"] += 1
        self._emit(Kind.NAK, seq, bytes((code.value,)), noise=noise)

    def _emit(self, kind: Kind, seq: int, payload: bytes = b"", *, noise: bool = False
              ) -> None:
        body = bytes((kind.value, seq)) + payload
        crc = crc16(body)
        fault = self._take_fault(("corrupt", "drop"), kind)
        if fault == "drop":
            return
        if fault == "corrupt":
            crc ^= 0x0001
        # Every frame starts and ends with END, as the gateware sends them.
        frame = slip_encode(body + crc.to_bytes(CRC_BYTES, "little"))
        if kind == Kind.BEAT:
            self._beat_frames.append((self._clock, frame))
            self._transmit(self._clock)
        elif not self._queue_reply(kind, frame, noise):
            return
        self.stats[f"tx {kind.name}"] += 1

    # Fault injection -----------------------------------------------------------------------

    def inject(self, action: str, kind: Kind | None = None, count: int = 1) -> None:
        """Apply ``action`` (one of :data:`FAULTS`) to the next ``count`` frames of ``kind``
        (any kind if ``None``) in its direction. Faults queue up in the order injected."""
        if action not in FAULTS:
            raise ValueError(f"fault {action!r} is not supported; allowed: {', '.join(FAULTS)}")
        if kind is not None and not isinstance(kind, Kind):
            raise TypeError(f"kind must be a link_protocol.Kind or None, got {kind!r}")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count={count!r} is not supported; allowed: an int >= 1")
        with self._lock:
            self._faults.append(_Fault(action, kind, count))

    def faults_pending(self) -> int:
        """Frames still to be hit by injected faults."""
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def _take_fault(self, actions: Sequence[str], kind: Kind | None) -> str | None:
        for fault in self._faults:
            if fault.action in actions and (fault.kind is None or fault.kind == kind):
                fault.remaining -= 1
                if not fault.remaining:
                    self._faults.remove(fault)
                self.stats[f"fault {fault.action}"] += 1
                return fault.action
        return None


# TCP server ----------------------------------------------------------------------------------

class _Connection(socketserver.BaseRequestHandler):
    server: LinkServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        me = self.server._take_over(self)
        try:
            while self.server._owner is me and not self.server._closing:
                readable, _, _ = select.select([sock], [], [], _POLL_S)
                data = sock.recv(65536) if readable else b""
                if readable and not data:
                    break                               # the host closed the port
                out = self.server.model.feed(data)
                if out:
                    sock.sendall(out)
        except OSError:
            pass                                        # the host went away mid-write


class LinkServer(socketserver.ThreadingTCPServer):
    """A TCP port that behaves like a board's UART: one host at a time (a new connection
    takes the link over, as reopening a serial port would); the model outlives connections,
    as a board outlives the host program. :meth:`close` stops it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, model: LinkModel, address: tuple[str, int]):
        super().__init__(address, _Connection)
        self.model = model
        self._owner: object | None = None
        self._closing = False
        self._thread = threading.Thread(target=self.serve_forever, args=(_POLL_S,),
                                        name="link-model", daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        """The pyserial URL of the port."""
        host, port = self.server_address[:2]
        return f"socket://{host}:{port}"

    def _take_over(self, handler: object) -> object:
        self._owner = handler
        return handler

    def close(self) -> None:
        """Stop serving and drop the connection. Safe to call twice."""
        if self._closing:
            return
        self._closing = True
        self.shutdown()
        self.server_close()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(model: LinkModel, host: str = "127.0.0.1", port: int = 0) -> tuple[LinkServer, int]:
    """Serve ``model`` on a TCP port in a background thread: ``(server, port)``; port 0
    picks a free one. ``server.close()`` stops it."""
    server = LinkServer(model, (host, port))
    server._thread.start()
    return server, server.port


# Command line --------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    from hdl.config import ConfigError
    from hdl.presets import get_config

    parser = argparse.ArgumentParser(
        prog="python -m sim.models.link_model",
        description="A simulated board on a TCP port: the host link's frame protocol in "
                    "front of the ISA simulator. Connect with pyserial's socket://HOST:PORT "
                    "(amtpu demo --transport serial --port socket://127.0.0.1:PORT).")
    parser.add_argument("--config", default="default",
                        help="configuration preset or RxC (default: default)")
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    parser.add_argument("--max-beats", type=int, default=16,
                        help="beats a DATA frame may carry (default: 16)")
    parser.add_argument("--clock-hz", type=int, default=DEFAULT_CLOCK_HZ,
                        help=f"clock INFO reports (default: {DEFAULT_CLOCK_HZ})")
    args = parser.parse_args(argv)
    try:
        model = LinkModel(get_config(args.config), max_beats=args.max_beats,
                          clock_hz=args.clock_hz)
        server, _ = serve(model, args.host, args.port)
    except (ConfigError, ValueError, OSError) as error:
        print(f"sim.models.link_model: {error}", file=sys.stderr)
        return 2
    print(f"amtpu link model: {model.config.name} core ({args.config}), max_beats "
          f"{model.max_beats}, on {server.url}; Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
