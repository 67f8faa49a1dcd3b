"""The board side of the host link: the core's host stream carried in frames
(:mod:`hdl.link.protocol`) over a pair of byte streams, such as a UART's."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.isa import Status
from hdl.link import protocol as lp
from hdl.link.receiver import LinkReceiver
from hdl.link.transmitter import REPLY, LinkTransmitter
from hdl.memory.block_ram import PipelinedMemory

__all__ = ["HostLink", "REPLY_QUEUE_DEPTH", "CYCLE_BITS"]

#: Replies (ACK, NAK, STATUS_REPLY, INFO_REPLY) waiting for the transmitter.
REPLY_QUEUE_DEPTH = 2
#: Width of the free-running cycle counter STATUS_REPLY reports.
CYCLE_BITS = 48


class HostLink(wiring.Component):
    """Frames in, beats to the core; beats from the core and replies, frames out.

    Implements the device side of :mod:`hdl.link.protocol` (SLIP, CRC-16, the checks in
    their order and the NAK codes, DATA deduplication by ``seq``, two frame buffers).

    Receive (:class:`~hdl.link.receiver.LinkReceiver`). ``i_rx.ready`` is always high: a
    UART cannot be held off. A DATA payload is written into a free frame buffer as it
    arrives, and the frame is accepted (``ACK``) or dropped (``NAK``) as its closing ``END``
    arrives. A DATA frame is stored only if a buffer was free when its first byte arrived;
    else it is answered ``NAK BUSY``. The two buffers (``max_beats`` beats each) are the two
    halves of one byte-wide :class:`~amaranth.lib.memory.Memory` with one synchronous read
    port (one iCE40 block RAM for 2 x 256 bytes).

    Delivery. Accepted frames go to the core in order: the feeder reads a buffer one byte
    a cycle into a beat register (least significant byte first) and offers each whole beat
    on ``o_host``; a buffer is free again once the core has taken its last beat.

    Transmit (:class:`~hdl.link.transmitter.LinkTransmitter`). Between frames, a waiting reply
    (``ACK``, ``NAK``, ``STATUS_REPLY``, ``INFO_REPLY``) goes before a ``BEAT``; a frame is
    never interrupted. Every frame starts and ends with ``END``. Replies wait in a queue of
    :data:`REPLY_QUEUE_DEPTH` (and one more is being sent). The NAK of a frame that failed a
    framing check (ESCAPE, OVERSIZE, shorter than 4 bytes, CRC: line noise, as far as the link
    can tell) is queued only while the queue is empty, and dropped otherwise; every other
    reply is queued unless the queue is full. So the answer to a frame with a good CRC always
    finds room while the host has at most one such frame unanswered, however much noise came
    before it; a host that floods the link loses replies (the requests' effects still happen).

    CLEAR drops the frames not yet delivered (a beat being assembled or offered included)
    and holds ``o_clear`` until the core's ``error`` flag is low (one cycle when no error
    is pending; an error whose error beat has not been sent yet is cleared once it has
    been), delivering nothing meanwhile. RESET drops the frames, forgets the last DATA
    ``seq``, and pulses ``o_core_reset`` once no ``BEAT`` frame is being sent (its beat is
    taken at its last byte); the ``BEAT`` numbering restarts then.

    ``STATUS_REPLY`` reports ``i_status`` and a free-running :data:`CYCLE_BITS`-bit cycle
    counter sampled as the reply starts; ``INFO_REPLY`` the constants the link was built
    with (:meth:`hdl.link.protocol.InfoReply.of`).

    Parameters
    ----------
    config : TPUConfig
        The core's configuration (its ``host_width`` and the INFO_REPLY fields).
    max_beats : int
        Beats a DATA frame may carry, 1 to 65535 (each buffer holds this many).
    clock_hz : int
        The core's clock, for INFO_REPLY (1 to 2**32 - 1).
    registered_checks : bool
        Register the frame checks' answers every cycle and act on a frame's verdict the cycle
        after its END, so that the verdict and what it drives (the buffer's length, the reply)
        start at flip-flops (for fast clocks: the ULX3S's). The bytes on ``i_rx`` must then
        come at least two cycles apart, which a UART's are by far. The frame buffers are then
        a :class:`~hdl.memory.block_ram.PipelinedMemory` too (on the ECP5, read through the
        block RAM's output register, whose bare output is slow), so the platform must be one
        it supports; and the reply queue is read from its output register.

    Members
    -------
    i_rx : In(stream.Signature(8))
        Bytes from the host (a UART receiver); ``ready`` is always high.
    o_tx : Out(stream.Signature(8))
        Bytes to the host (a UART transmitter).
    o_host : Out(stream.Signature(unsigned(host_width)))
        Beats to the core's ``i_host``.
    i_host : In(stream.Signature(unsigned(host_width)))
        Beats from the core's ``o_host``.
    i_status : In(Status)
        The core's ``o_status``.
    o_clear : Out(1)
        To the core's ``i_clear``.
    o_core_reset : Out(1)
        One-cycle pulse: reset the core (a synchronous reset of its clock domain).
    o_cycles : Out(CYCLE_BITS)
        The free-running cycle counter (for the board's LED timing).
    """

    def __init__(self, config: TPUConfig, *, max_beats: int = 16, clock_hz: int,
                 registered_checks: bool = False):
        for name, value, high in (("max_beats", max_beats, 0xFFFF),
                                  ("clock_hz", clock_hz, 0xFFFF_FFFF)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(f"HostLink {name}={value!r} is not supported; "
                                 f"allowed: an int from 1 to {high}")
        self.config = config
        self.max_beats = max_beats
        self.clock_hz = clock_hz
        self.registered_checks = registered_checks
        self.beat_bytes = config.host_width // 8
        #: Payload bytes a frame buffer holds.
        self.buffer_bytes = max_beats * self.beat_bytes
        #: The longest body accepted (:func:`hdl.link.protocol.max_body`).
        self.max_body = lp.max_body(max_beats, self.beat_bytes)
        self.info = lp.InfoReply.of(config, max_beats=max_beats, clock_hz=clock_hz)
        host = stream.Signature(unsigned(config.host_width))
        super().__init__({
            "i_rx":         In(stream.Signature(8)),
            "o_tx":         Out(stream.Signature(8)),
            "o_host":       Out(host),
            "i_host":       In(host),
            "i_status":     In(Status),
            "o_clear":      Out(1),
            "o_core_reset": Out(1),
            "o_cycles":     Out(CYCLE_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        beat_bytes = self.beat_bytes
        size = self.buffer_bytes
        abits = max(1, (size - 1).bit_length())

        if self.registered_checks:
            m.submodules.buffers = mem = PipelinedMemory(shape=8, depth=2 << abits)
            wr, rd = mem.w, mem.r[0]
            read_latency = 2
        else:
            m.submodules.buffers = mem = Memory(shape=8, depth=2 << abits, init=[])
            wr, rd = mem.write_port(), mem.read_port()
            read_latency = 1
        # With registered_checks the replies leave the queue from its output register, so
        # that its level does not run through the transmitter's IDLE decision into the
        # payload register.
        reply_fifo = SyncFIFOBuffered if self.registered_checks else SyncFIFO
        m.submodules.replies = replies = reply_fifo(width=REPLY.size, depth=REPLY_QUEUE_DEPTH)

        # Frame buffers: a two-entry ring; `head` is being delivered, the one after it waits.
        pending = Signal(range(3))
        head = Signal()
        nbytes = [Signal(range(size + 1), name=f"nbytes{i}", reset_less=True)
                  for i in range(2)]
        wbuf = Signal()                 # the buffer a new DATA frame goes to
        m.d.comb += wbuf.eq(head ^ pending[0])
        accept = Signal()               # a DATA frame stored, this cycle
        pop = Signal()                  # the core took the head frame's last beat
        drop = Signal()                 # CLEAR or RESET
        clear_pending = Signal()
        reset_pending = Signal()
        sending_beat = Signal()         # the transmitter sends a BEAT frame
        cycles = self.o_cycles
        m.d.sync += cycles.eq(cycles + 1)

        # Receive ---------------------------------------------------------------------------
        m.submodules.receiver = rx = LinkReceiver(beat_bytes=beat_bytes,
                                                  max_beats=self.max_beats,
                                                  registered_checks=self.registered_checks)
        wiring.connect(m, wiring.flipped(self.i_rx), rx.i_rx)
        m.d.comb += [
            rx.i_buffer_free.eq(pending != 2),
            wr.addr.eq(Cat(rx.o_write_addr, wbuf)),
            wr.data.eq(rx.o_write_data),
            wr.en.eq(rx.o_write_en),
        ]

        # Replies. A frame that failed a framing check (noise, as far as the link can tell)
        # is answered only while the queue is empty, so that a slot is always left for the
        # answer to a host's frame: noise on the line never costs a waiting host its reply.
        verdict = rx.o_verdict
        noise_room = replies.w_level < REPLY_QUEUE_DEPTH - 1
        m.d.comb += [
            replies.w_data.eq(Cat(verdict.reply, rx.o_seq, verdict.code)),     # REPLY's fields
            replies.w_en.eq(rx.o_frame & (~verdict.noise | noise_room)),
        ]
        with m.If(rx.o_frame):
            with m.If(verdict.store):
                m.d.comb += accept.eq(1)
                for i in range(2):
                    with m.If(wbuf == i):
                        m.d.sync += nbytes[i].eq(rx.o_length)
            with m.If(verdict.clear):
                m.d.comb += drop.eq(1)
                m.d.sync += clear_pending.eq(1)
            with m.If(verdict.reset):
                m.d.comb += drop.eq(1)
                m.d.sync += [reset_pending.eq(1), clear_pending.eq(0)]

        with m.If(drop):
            m.d.sync += pending.eq(0)
        with m.Else():
            m.d.sync += [pending.eq(pending + accept - pop), head.eq(head ^ pop)]

        # CLEAR: hold the core's i_clear until its error flag is low (the core ignores
        # i_clear while its error beat waits to be sent).
        m.d.comb += self.o_clear.eq(clear_pending)
        with m.If(clear_pending & ~self.i_status.error & ~drop):
            m.d.sync += clear_pending.eq(0)

        # Delivery ----------------------------------------------------------------------------
        rd_addr = Signal(range(size + 1))
        fill = Signal(range(beat_bytes + 1))    # bytes read for the beat being assembled
        # inflight[k]: a byte read k + 1 cycles ago; the last one's is on rd.data.
        inflight = [Signal(name=f"inflight{k}") for k in range(read_latency)]
        beat = Signal(self.config.host_width, reset_less=True)
        issue = (pending != 0) & ~clear_pending & ~reset_pending & (fill != beat_bytes)
        # The transfer is acted on a cycle later (`taken`; the beat is not offered again
        # meanwhile), so that the core's ready, which comes from deep in its dispatch logic,
        # ends at a flip-flop here (a beat takes beat_bytes cycles to assemble anyway).
        taken = Signal()
        m.d.comb += [
            rd.addr.eq(Cat(rd_addr[:abits], head)),
            # (A pipelined read moves every cycle: the bytes follow `inflight`.)
            rd.en.eq(issue if read_latency == 1 else 1),
            self.o_host.valid.eq((fill == beat_bytes) & ~Cat(*inflight).any() & ~taken),
            self.o_host.payload.eq(beat),
        ]
        m.d.sync += [inflight[0].eq(issue),
                     *(inflight[k].eq(inflight[k - 1]) for k in range(1, read_latency)),
                     taken.eq(self.o_host.valid & self.o_host.ready & ~drop)]
        with m.If(issue):
            m.d.sync += [rd_addr.eq(rd_addr + 1), fill.eq(fill + 1)]
        with m.If(inflight[-1]):
            m.d.sync += beat.eq(Cat(beat[8:], rd.data))
        with m.If(taken):
            m.d.sync += fill.eq(0)
            with m.If(rd_addr == Mux(head, nbytes[1], nbytes[0])):
                m.d.comb += pop.eq(1)
                m.d.sync += rd_addr.eq(0)
        with m.If(drop):
            m.d.sync += [fill.eq(0), rd_addr.eq(0)]

        # Transmit ----------------------------------------------------------------------------
        m.submodules.transmitter = tx = LinkTransmitter(host_width=self.config.host_width,
                                                        info=self.info.pack())
        wiring.connect(m, tx.o_tx, wiring.flipped(self.o_tx))
        m.d.comb += [
            tx.i_reply.payload.eq(replies.r_data),
            tx.i_reply.valid.eq(replies.r_rdy),
            replies.r_en.eq(tx.i_reply.ready),
            tx.i_status_reply.eq(Cat(self.i_status.as_value(), cycles, rx.o_last_seq, pending,
                                     Const(0, 6), rx.o_seq_valid)),
            tx.i_beat.payload.eq(self.i_host.payload),
            tx.i_beat.valid.eq(self.i_host.valid & ~reset_pending),
            self.i_host.ready.eq(tx.i_beat.ready),
            sending_beat.eq(tx.o_sending_beat),
        ]

        # RESET: once no BEAT frame is being sent (it takes the core's beat at its last byte).
        fire = reset_pending & ~sending_beat
        m.d.comb += [self.o_core_reset.eq(fire), tx.i_restart.eq(fire)]
        with m.If(fire):
            m.d.sync += reset_pending.eq(0)
        return m
