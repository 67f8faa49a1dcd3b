"""The host link's receiver: SLIP decoding, the CRC and the checks of a received frame, in
the order of :mod:`hdl.link.protocol`, and the verdict each frame gets."""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.link import protocol as lp
from hdl.link.transmitter import Reply, crc16_byte

__all__ = ["LinkReceiver", "VERDICT"]

#: What a frame gets: the reply (a NAK's code in ``code``), and whether it is stored (a new
#: DATA frame), a CLEAR or a RESET. ``noise``: it failed a framing check (ESCAPE, OVERSIZE,
#: a body shorter than 4 bytes, CRC), so it may be line noise rather than a host's frame.
VERDICT = data.StructLayout({"reply": Reply, "code": lp.Nak, "store": 1, "clear": 1,
                             "reset": 1, "noise": 1})


class LinkReceiver(wiring.Component):
    """Frames in, a verdict per frame and the payload of DATA frames out.

    ``i_rx.ready`` is always high: a UART cannot be held off. Bytes are decoded, counted and
    checked as they arrive (one a cycle at most). A DATA frame's payload goes to
    ``o_write_*`` a byte a cycle, at its offset in the frame, if a frame buffer was free
    (``i_buffer_free``) when the frame's first byte arrived; else the frame is ``NAK BUSY``.
    ``o_frame`` marks the cycle to act on a frame's verdict (its closing ``END``, or the cycle
    after with ``registered_checks``); an empty frame (two ``END`` in a row) has none.

    The receiver remembers the seq of the last stored DATA frame (a DATA frame with that
    seq is a retry: acknowledged, not stored); a RESET forgets it.

    Decoding: ``ESC`` followed by a byte other than ``ESC_END`` or ``ESC_ESC`` decodes to
    that byte (it counts as a body byte) and the frame fails ``ESCAPE``; ``END`` always ends
    a frame, so an ``ESC`` right before it is dropped and the frame fails ``ESCAPE``.

    Parameters
    ----------
    beat_bytes : int
        Bytes of a beat.
    max_beats : int
        Beats a DATA frame may carry.
    registered_checks : bool
        Register the checks' answers and the verdict every cycle and act on the verdict the
        cycle after ``END``, so that the verdict and what it drives start at flip-flops. The
        bytes on ``i_rx`` must then come at least two cycles apart.

    Members
    -------
    i_rx : In(stream.Signature(8))
        Bytes from the host; ``ready`` is always high.
    i_buffer_free : In(1)
        A frame buffer is free (sampled as a frame's first byte arrives).
    o_write_en, o_write_addr, o_write_data : Out(1), Out(abits), Out(8)
        A payload byte and its offset in the frame (modulo the buffer's size).
    o_frame : Out(1)
        A frame's verdict is on ``o_verdict``, its seq on ``o_seq`` and its payload's length
        in bytes on ``o_length``.
    o_verdict : Out(VERDICT)
    o_seq : Out(8)
    o_length : Out(range(max_beats * beat_bytes + 1))
    o_last_seq, o_seq_valid : Out(8), Out(1)
        The seq of the last stored DATA frame; whether there is one since the last RESET.
    """

    def __init__(self, *, beat_bytes: int, max_beats: int, registered_checks: bool = False):
        self.beat_bytes = beat_bytes
        self.max_beats = max_beats
        self.registered_checks = registered_checks
        size = max_beats * beat_bytes
        #: Address bits of one frame buffer.
        self.abits = max(1, (size - 1).bit_length())
        #: The longest body accepted (:func:`hdl.link.protocol.max_body`).
        self.max_body = lp.max_body(max_beats, beat_bytes)
        super().__init__({
            "i_rx":          In(stream.Signature(8)),
            "i_buffer_free": In(1),
            "o_write_en":    Out(1),
            "o_write_addr":  Out(self.abits),
            "o_write_data":  Out(8),
            "o_frame":       Out(1),
            "o_verdict":     Out(VERDICT),
            "o_seq":         Out(8),
            "o_length":      Out(range(size + 1)),
            "o_last_seq":    Out(8),
            "o_seq_valid":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        beat_bytes = self.beat_bytes
        limit = self.max_body
        rx = self.i_rx
        m.d.comb += rx.ready.eq(1)

        n = Signal(range(limit + 2))        # body bytes so far, stops at limit + 1
        escaped = Signal()
        bad_escape = Signal()
        kind = Signal(8, reset_less=True)
        seq = Signal(8)
        d1 = Signal(8, reset_less=True)     # the last body byte
        d2 = Signal(8, reset_less=True)     # the one before: CRC bytes are known only at END
        crc = Signal(16, init=0xFFFF)
        phase = Signal(range(beat_bytes))   # payload bytes modulo a beat
        has_buf = Signal()                  # a buffer was free at the frame's first byte
        last_seq = Signal(8, reset_less=True)
        seq_valid = Signal()

        got = Signal()                      # a body byte (unescaped) this cycle
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
            self.o_write_addr.eq((n - 4)[:self.abits]),
            self.o_write_data.eq(d2),
        ]
        with m.If(got):
            m.d.sync += [d1.eq(byte), d2.eq(d1)]
            with m.If(n != limit + 1):
                m.d.sync += n.eq(n + 1)
            with m.If(n == 0):
                m.d.sync += [kind.eq(byte), has_buf.eq(self.i_buffer_free)]
            with m.If(n == 1):
                m.d.sync += seq.eq(byte)
            with m.If(n >= 2):
                m.d.sync += crc.eq(crc16_byte(crc, d2))
            with m.If(n >= 4):
                m.d.sync += phase.eq(Mux(phase == beat_bytes - 1, 0, phase + 1))
                # (An oversize frame wraps round its own buffer: it is dropped anyway.)
                m.d.comb += self.o_write_en.eq(has_buf)

        # The checks, each a function of the frame so far; with `registered_checks` their
        # answers are registered every cycle, so that the verdict at END starts at
        # flip-flops (the bytes come at least two cycles apart, so the answers include the
        # last byte by then).
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
        data_kind = kind == lp.Kind.DATA.value
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
            is_status.eq(kind == lp.Kind.STATUS.value),
            is_clear.eq(kind == lp.Kind.CLEAR.value),
            is_reset.eq(kind == lp.Kind.RESET.value),
        ]

        # The verdict, from the checks in protocol order. With `registered_checks` it is
        # registered every cycle too, so that acting on it at `end` starts at flip-flops
        # rather than running from the checks through their priority into the delivery.
        v = Signal(VERDICT)
        if self.registered_checks:
            m.d.sync += self.o_verdict.eq(v)
        else:
            m.d.comb += self.o_verdict.eq(v)

        def nak(code, *, noise=False):
            m.d.comb += [v.reply.eq(Reply.NAK), v.code.eq(code), v.noise.eq(noise)]

        with m.If(bad_esc):
            nak(lp.Nak.ESCAPE, noise=True)
        with m.Elif(oversize):
            nak(lp.Nak.OVERSIZE, noise=True)
        with m.Elif(short):
            nak(lp.Nak.LENGTH, noise=True)
        with m.Elif(crc_bad):
            nak(lp.Nak.CRC, noise=True)
        with m.Elif(~host_kind):
            nak(lp.Nak.KIND)
        with m.Elif(length_bad):
            nak(lp.Nak.LENGTH)
        with m.Elif(is_data):
            with m.If(retry):
                m.d.comb += v.reply.eq(Reply.ACK)       # a retry: not stored again
            with m.Elif(~has_buf):
                nak(lp.Nak.BUSY)
            with m.Else():
                m.d.comb += [v.reply.eq(Reply.ACK), v.store.eq(1)]
        with m.Elif(is_status):
            m.d.comb += v.reply.eq(Reply.STATUS)
        with m.Elif(is_clear):
            m.d.comb += [v.reply.eq(Reply.ACK), v.clear.eq(1)]
        with m.Elif(is_reset):
            m.d.comb += [v.reply.eq(Reply.ACK), v.reset.eq(1)]
        with m.Else():
            m.d.comb += v.reply.eq(Reply.INFO)

        # At `end` the seq and the count still hold the frame's: they restart on that edge.
        m.d.comb += [
            self.o_frame.eq(end & is_frame),
            self.o_seq.eq(seq),
            self.o_length.eq((n - 4)[:len(self.o_length)]),
            self.o_last_seq.eq(last_seq),
            self.o_seq_valid.eq(seq_valid),
        ]
        with m.If(self.o_frame):
            with m.If(self.o_verdict.store):
                m.d.sync += [last_seq.eq(seq), seq_valid.eq(1)]
            with m.If(self.o_verdict.reset):
                m.d.sync += seq_valid.eq(0)
        return m
