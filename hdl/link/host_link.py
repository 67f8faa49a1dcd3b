"""The board side of the host link: the core's host stream carried in frames
(:mod:`hdl.link.protocol`) over a pair of byte streams, such as a UART's."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.isa import Status
from hdl.link import protocol as lp
from hdl.link.transmitter import REPLY, LinkTransmitter, Reply, crc16_byte
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

    Receive. ``i_rx.ready`` is always high: a UART cannot be held off. Bytes are decoded,
    counted and checked as they arrive (one a cycle at most); a DATA payload is written
    into a free frame buffer, one byte a cycle, and the frame is accepted (``ACK``) or
    dropped (``NAK``) in the cycle its closing ``END`` arrives. A DATA frame is stored only
    if a buffer was free when its first byte arrived; else it is answered ``NAK BUSY``.
    The two buffers (``max_beats`` beats each) are the two halves of one byte-wide
    :class:`~amaranth.lib.memory.Memory` with one synchronous read port (one iCE40 block
    RAM for 2 x 256 bytes).

    Delivery. Accepted frames go to the core in order: the feeder reads a buffer one byte
    a cycle into a beat register (least significant byte first) and offers each whole beat
    on ``o_host``; a buffer is free again once the core has taken its last beat.

    Transmit (:class:`~hdl.link.transmitter.LinkTransmitter`). Between frames, a waiting reply
    (``ACK``, ``NAK``, ``STATUS_REPLY``, ``INFO_REPLY``) goes before a ``BEAT``; a frame is
    never interrupted. A ``BEAT`` frame copies the core's beat as it starts (the stream rules
    keep it stable) and takes it as its last payload byte is sent. Every frame starts and ends
    with ``END``. Replies wait in a queue of :data:`REPLY_QUEUE_DEPTH`; a reply that finds it
    full is dropped (the request's effect still happens): a host that waits for each reply
    never fills it, and a host that floods the link loses replies and retries.

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
        a :class:`~hdl.memory.block_ram.PipelinedMemory` too (on the ECP5, read through the block
        RAM's output register: its bare output took 5.8 ns), so the platform must be one
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
        limit = self.max_body
        abits = max(1, (size - 1).bit_length())
        kind_of = {k: k.value for k in lp.Kind}

        if self.registered_checks:
            m.submodules.buffers = mem = PipelinedMemory(shape=8, depth=2 << abits)
            wr, rd = mem.w, mem.r[0]
            read_latency = 2
        else:
            m.submodules.buffers = mem = Memory(shape=8, depth=2 << abits, init=[])
            wr, rd = mem.write_port(), mem.read_port()
            read_latency = 1
        # With registered_checks the replies leave the queue from its output register: its
        # level ran through the transmitter's IDLE decision into the payload register
        # (7.9 ns on the ULX3S).
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
        last_seq = Signal(8, reset_less=True)
        seq_valid = Signal()
        clear_pending = Signal()
        reset_pending = Signal()
        sending_beat = Signal()         # the transmitter sends a BEAT frame
        cycles = self.o_cycles
        m.d.sync += cycles.eq(cycles + 1)

        # Receive ---------------------------------------------------------------------------
        rx = self.i_rx
        m.d.comb += rx.ready.eq(1)
        n = Signal(range(limit + 2))    # body bytes so far, stops at limit + 1
        escaped = Signal()
        bad_escape = Signal()
        kind = Signal(8, reset_less=True)
        seq = Signal(8)
        d1 = Signal(8, reset_less=True)     # the last body byte
        d2 = Signal(8, reset_less=True)     # the one before: CRC bytes are known only at END
        crc = Signal(16, init=0xFFFF)
        phase = Signal(range(beat_bytes))   # payload bytes modulo a beat
        has_buf = Signal()

        got = Signal()                  # a body byte (unescaped) this cycle
        byte = Signal(8)
        # `end`: act on the frame's verdict and start the next frame. With `registered_checks`
        # that is the cycle after the END byte (from a flip-flop, not from the byte's decode;
        # the next byte comes a cycle later still).
        end = Signal()
        end_byte = rx.valid & (rx.payload == lp.END)
        if self.registered_checks:
            m.d.sync += end.eq(end_byte)
        else:
            m.d.comb += end.eq(end_byte)
        with m.If(end):
            m.d.sync += [n.eq(0), escaped.eq(0), bad_escape.eq(0), seq.eq(0),
                         crc.eq(crc.init), phase.eq(0)]
        with m.If(rx.valid & (rx.payload != lp.END)):
            with m.If(escaped):
                m.d.comb += [got.eq(1), byte.eq(rx.payload)]
                m.d.sync += escaped.eq(0)
                with m.If(rx.payload == lp.ESC_END):
                    m.d.comb += byte.eq(lp.END)
                with m.Elif(rx.payload == lp.ESC_ESC):
                    m.d.comb += byte.eq(lp.ESC)
                with m.Else():
                    m.d.sync += bad_escape.eq(1)
            with m.Elif(rx.payload == lp.ESC):
                m.d.sync += escaped.eq(1)
            with m.Else():
                m.d.comb += [got.eq(1), byte.eq(rx.payload)]

        m.d.comb += [
            wr.addr.eq(Cat((n - 4)[:abits], wbuf)),
            wr.data.eq(d2),
        ]
        with m.If(got):
            m.d.sync += [d1.eq(byte), d2.eq(d1)]
            with m.If(n != limit + 1):
                m.d.sync += n.eq(n + 1)
            with m.If(n == 0):
                m.d.sync += [kind.eq(byte), has_buf.eq(pending != 2)]
            with m.If(n == 1):
                m.d.sync += seq.eq(byte)
            with m.If(n >= 2):
                m.d.sync += crc.eq(crc16_byte(crc, d2))
            with m.If(n >= 4):
                m.d.sync += phase.eq(Mux(phase == beat_bytes - 1, 0, phase + 1))
                # (An oversize frame wraps round its own buffer: it is dropped anyway.)
                m.d.comb += wr.en.eq(has_buf)

        # The checks of a frame, in protocol order, as its END arrives. Each check's answer
        # is a function of the frame so far; with `registered_checks` it is registered every
        # cycle, so the verdict at END starts at flip-flops (the bytes must then come at
        # least two cycles apart, as from a UART, for the answers to include the last one).
        reply = Signal(REPLY)
        m.d.comb += replies.w_data.eq(reply)
        checks = m.d.sync if self.registered_checks else m.d.comb
        host_kind_now = Signal()
        for k in lp.HOST_KINDS:
            with m.If(kind == k.value):
                m.d.comb += host_kind_now.eq(1)
        is_data, host_kind, length_bad, is_frame, bad_esc, oversize, short, crc_bad, retry = (
            Signal(name=name) for name in ("is_data", "host_kind", "length_bad", "is_frame",
                                           "bad_esc", "oversize", "short", "crc_bad",
                                           "retry"))
        is_status, is_clear, is_reset = (Signal(name=f"is_{k}") for k in ("status", "clear",
                                                                          "reset"))
        data_kind = kind == kind_of[lp.Kind.DATA]
        checks += [
            is_data.eq(data_kind),
            host_kind.eq(host_kind_now),
            length_bad.eq(Mux(data_kind, (n == 4) | (phase != 0), n != 4)),
            is_frame.eq((n != 0) | escaped),        # (an ESC alone is a frame too)
            bad_esc.eq(bad_escape | escaped),
            oversize.eq(n == limit + 1),
            short.eq(n < lp.MIN_BODY),
            crc_bad.eq(crc != Cat(d2, d1)),
            retry.eq(seq_valid & (seq == last_seq)),
            is_status.eq(kind == kind_of[lp.Kind.STATUS]),
            is_clear.eq(kind == kind_of[lp.Kind.CLEAR]),
            is_reset.eq(kind == kind_of[lp.Kind.RESET]),
        ]

        # The verdict: the reply, and whether the frame is stored, a CLEAR or a RESET. With
        # `registered_checks` it is registered every cycle too, from the registered checks:
        # as the bytes come at least two cycles apart, the frame is complete a cycle before
        # END arrives, so at `end` the verdict is the whole frame's (acting on it from the
        # checks ran through their priority into the delivery: 6.9 ns on the ULX3S).
        verdict_layout = data.StructLayout({"reply": REPLY, "store": 1, "clear": 1,
                                            "reset": 1})
        verdict_now = Signal(verdict_layout)
        verdict = Signal(verdict_layout)
        m.d.comb += verdict_now.reply.seq.eq(seq)
        if self.registered_checks:
            m.d.sync += verdict.eq(verdict_now)
        else:
            m.d.comb += verdict.eq(verdict_now)
        v = verdict_now

        def nak(code):
            m.d.comb += [v.reply.kind.eq(Reply.NAK), v.reply.code.eq(code)]

        with m.If(bad_esc):
            nak(lp.Nak.ESCAPE)
        with m.Elif(oversize):
            nak(lp.Nak.OVERSIZE)
        with m.Elif(short):
            nak(lp.Nak.LENGTH)
        with m.Elif(crc_bad):
            nak(lp.Nak.CRC)
        with m.Elif(~host_kind):
            nak(lp.Nak.KIND)
        with m.Elif(length_bad):
            nak(lp.Nak.LENGTH)
        with m.Elif(is_data):
            with m.If(retry):
                m.d.comb += v.reply.kind.eq(Reply.ACK)       # a retry: not stored again
            with m.Elif(~has_buf):
                nak(lp.Nak.BUSY)
            with m.Else():
                m.d.comb += [v.reply.kind.eq(Reply.ACK), v.store.eq(1)]
        with m.Elif(is_status):
            m.d.comb += v.reply.kind.eq(Reply.STATUS)
        with m.Elif(is_clear):
            m.d.comb += [v.reply.kind.eq(Reply.ACK), v.clear.eq(1)]
        with m.Elif(is_reset):
            m.d.comb += [v.reply.kind.eq(Reply.ACK), v.reset.eq(1)]
        with m.Else():
            m.d.comb += v.reply.kind.eq(Reply.INFO)

        m.d.comb += reply.eq(verdict.reply)
        with m.If(end & is_frame):
            m.d.comb += replies.w_en.eq(1)
            with m.If(verdict.store):
                m.d.comb += accept.eq(1)
                m.d.sync += [last_seq.eq(seq), seq_valid.eq(1)]
                for i in range(2):
                    with m.If(wbuf == i):
                        m.d.sync += nbytes[i].eq(n - 4)
            with m.If(verdict.clear):
                m.d.comb += drop.eq(1)
                m.d.sync += clear_pending.eq(1)
            with m.If(verdict.reset):
                m.d.comb += drop.eq(1)
                m.d.sync += [reset_pending.eq(1), clear_pending.eq(0), seq_valid.eq(0)]

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
            tx.i_status_reply.eq(Cat(self.i_status.as_value(), cycles, last_seq, pending,
                                     Const(0, 6), seq_valid)),
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
