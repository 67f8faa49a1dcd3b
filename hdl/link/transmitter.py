"""The host link's transmitter: replies and the core's beats, framed and SLIP-escaped, a byte
at a time."""

import struct

from amaranth.hdl import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.link import protocol as lp

__all__ = ["LinkTransmitter", "Reply", "REPLY", "STATUS_REPLY_BYTES", "crc16_byte"]

#: Bytes of a STATUS_REPLY payload (:data:`hdl.link.protocol.STATUS_REPLY_FORMAT`).
STATUS_REPLY_BYTES = struct.calcsize(lp.STATUS_REPLY_FORMAT)


def crc16_byte(crc, byte):
    """``crc`` (16 bits) after ``byte`` (8 bits): one byte of CRC-16/CCITT-FALSE, most
    significant bit first (:func:`hdl.link.protocol.crc16`), as an expression."""
    for i in reversed(range(8)):
        top = crc[15] ^ byte[i]
        crc = (crc << 1)[:16] ^ Mux(top, 0x1021, 0)
    return crc


class Reply(enum.Enum, shape=2):
    """The reply a received frame gets."""
    ACK = 0
    NAK = 1
    STATUS = 2
    INFO = 3


#: A reply waiting to be sent: its kind, the request's ``seq``, and a NAK's code.
REPLY = data.StructLayout({"kind": Reply, "seq": 8, "code": lp.Nak})


class LinkTransmitter(wiring.Component):
    """Sends replies and the core's beats as frames (:mod:`hdl.link.protocol`) on a byte
    stream, such as a UART transmitter's.

    Between frames, a waiting reply goes before a beat; a frame is never interrupted. A
    ``BEAT`` frame copies the core's beat as it starts (the stream rules keep it stable) and
    takes it as its last payload byte is sent; ``BEAT`` frames are numbered from 0 (``seq``),
    and again after ``i_restart``. Every frame starts and ends with ``END``; the CRC covers
    kind, ``seq`` and payload.

    Parameters
    ----------
    host_width : int
        Bits of a beat (a multiple of 8).
    info : bytes
        The INFO_REPLY payload.

    Members
    -------
    i_reply : In(stream.Signature(REPLY))
        Replies to send (a queue's read side).
    i_status_reply : In(STATUS_REPLY_BYTES * 8)
        A STATUS_REPLY's payload, sampled as the reply starts.
    i_beat : In(stream.Signature(unsigned(host_width)))
        The core's beats.
    i_restart : In(1)
        Number the next ``BEAT`` frame 0 (not while :attr:`o_sending_beat`).
    o_sending_beat : Out(1)
        A ``BEAT`` frame is being sent (its beat not yet taken, or its CRC and END left).
    o_tx : Out(stream.Signature(8))
        Bytes to the host.
    """

    def __init__(self, *, host_width: int, info: bytes):
        self.host_width = host_width
        self.info = bytes(info)
        super().__init__({
            "i_reply":        In(stream.Signature(REPLY)),
            "i_status_reply": In(STATUS_REPLY_BYTES * 8),
            "i_beat":         In(stream.Signature(unsigned(host_width))),
            "i_restart":      In(1),
            "o_sending_beat": Out(1),
            "o_tx":           Out(stream.Signature(8)),
        })

    def elaborate(self, platform):
        m = Module()
        beat_bytes = self.host_width // 8
        kind_of = {k: k.value for k in lp.Kind}
        beat_seq = Signal(8)
        lb_valid = Signal()     # a logical byte: a frame byte before escaping, or a raw END
        lb_raw = Signal()
        lb_data = Signal(8)
        lb_ready = Signal()
        tx_kind = Signal(8)
        tx_seq = Signal(8, reset_less=True)
        tx_crc = Signal(16, reset_less=True)
        idx = Signal(range(max(beat_bytes, STATUS_REPLY_BYTES, len(self.info))))
        info = Const(int.from_bytes(self.info, "little"), len(self.info) * 8)
        entry = self.i_reply.payload
        last = Signal()

        # The payload of a NAK, STATUS_REPLY or BEAT frame: one register, loaded as the frame
        # starts (the core's beat is stable until taken, at the last byte) and shifted right a
        # byte as each byte is sent, so that the byte to send is always its low byte. No byte
        # select, and the core's output logic ends at these flip-flops rather than running on
        # into the CRC and the transmit register. INFO_REPLY's constant is selected by `idx`
        # instead: its 29 bytes would widen the register beyond an iCEBreaker beat (128 bits
        # at most), and there the flip-flops added cost more than the select.
        tx_buf = Signal(max(self.host_width, STATUS_REPLY_BYTES * 8), reset_less=True)
        payload = Signal(8)
        m.d.comb += payload.eq(tx_buf[:8])
        with m.Switch(tx_kind):
            with m.Case(kind_of[lp.Kind.NAK]):
                m.d.comb += last.eq(1)
            with m.Case(kind_of[lp.Kind.STATUS_REPLY]):
                m.d.comb += last.eq(idx == STATUS_REPLY_BYTES - 1)
            with m.Case(kind_of[lp.Kind.INFO_REPLY]):
                m.d.comb += [payload.eq(info.word_select(idx, 8)),
                             last.eq(idx == len(self.info) - 1)]
            with m.Case(kind_of[lp.Kind.BEAT]):
                m.d.comb += last.eq(idx == beat_bytes - 1)

        with m.FSM(name="tx") as fsm:
            with m.State("IDLE"):
                # The payload register loads in every IDLE cycle, whether or not a frame
                # starts: what it loads depends on the reply queue's output alone, so that
                # the decision whether a reply or a beat goes next does not run into every
                # bit's load enable.
                m.d.sync += tx_buf.eq(Mux(self.i_reply.valid,
                                          Mux(entry.kind == Reply.NAK, entry.code,
                                              self.i_status_reply),
                                          self.i_beat.payload))
                with m.If(self.i_reply.valid):
                    m.d.comb += self.i_reply.ready.eq(1)
                    m.d.sync += tx_seq.eq(entry.seq)
                    with m.Switch(entry.kind):
                        for reply_kind, frame_kind in (
                                (Reply.ACK, lp.Kind.ACK), (Reply.NAK, lp.Kind.NAK),
                                (Reply.STATUS, lp.Kind.STATUS_REPLY),
                                (Reply.INFO, lp.Kind.INFO_REPLY)):
                            with m.Case(reply_kind):
                                m.d.sync += tx_kind.eq(frame_kind.value)
                    m.next = "START"
                with m.Elif(self.i_beat.valid):
                    m.d.sync += [tx_kind.eq(kind_of[lp.Kind.BEAT]), tx_seq.eq(beat_seq)]
                    m.next = "START"
            with m.State("START"):
                m.d.comb += [lb_valid.eq(1), lb_raw.eq(1), lb_data.eq(lp.END)]
                with m.If(lb_ready):
                    m.d.sync += tx_crc.eq(0xFFFF)
                    m.next = "KIND"
            with m.State("KIND"):
                m.d.comb += [lb_valid.eq(1), lb_data.eq(tx_kind)]
                with m.If(lb_ready):
                    m.next = "SEQ"
            with m.State("SEQ"):
                m.d.comb += [lb_valid.eq(1), lb_data.eq(tx_seq)]
                with m.If(lb_ready):
                    m.d.sync += idx.eq(0)
                    with m.If(tx_kind == kind_of[lp.Kind.ACK]):
                        m.next = "CRC_LO"
                    with m.Else():
                        m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += [lb_valid.eq(1), lb_data.eq(payload)]
                with m.If(lb_ready):
                    m.d.sync += [idx.eq(idx + 1), tx_buf.eq(tx_buf[8:])]
                    with m.If(last):
                        m.next = "CRC_LO"
                        with m.If(tx_kind == kind_of[lp.Kind.BEAT]):
                            m.d.comb += self.i_beat.ready.eq(1)
                            m.d.sync += beat_seq.eq(beat_seq + 1)
            with m.State("CRC_LO"):
                m.d.comb += [lb_valid.eq(1), lb_data.eq(tx_crc[:8])]
                with m.If(lb_ready):
                    m.next = "CRC_HI"
            with m.State("CRC_HI"):
                m.d.comb += [lb_valid.eq(1), lb_data.eq(tx_crc[8:])]
                with m.If(lb_ready):
                    m.next = "STOP"
            with m.State("STOP"):
                m.d.comb += [lb_valid.eq(1), lb_raw.eq(1), lb_data.eq(lp.END)]
                with m.If(lb_ready):
                    m.next = "IDLE"
        m.d.comb += self.o_sending_beat.eq(~fsm.ongoing("IDLE") &
                                           (tx_kind == kind_of[lp.Kind.BEAT]))
        # The CRC takes each covered byte from the output register below, in the cycle after
        # it is registered (so that the byte's selection does not run on into the CRC's eight
        # XOR levels); the register holds it for that cycle, and CRC_LO's byte is taken from
        # the CRC only when the register is empty again, after the update.
        crc_take = Signal()
        m.d.sync += crc_take.eq(lb_valid & lb_ready & (fsm.ongoing("KIND") | fsm.ongoing("SEQ") |
                                                       fsm.ongoing("PAYLOAD")))

        # The logical byte is registered before the escaping, so that the UART's handshake
        # and the escape logic do not reach back into the core's ready (on the iCE40 that
        # path set the clock). The register takes a byte only when empty, a byte every other
        # cycle at most: far above any baud rate.
        out_valid = Signal()
        out_raw = Signal(reset_less=True)
        out_data = Signal(8, reset_less=True)
        m.d.comb += lb_ready.eq(~out_valid)
        with m.If(lb_valid & lb_ready):
            m.d.sync += [out_valid.eq(1), out_raw.eq(lb_raw), out_data.eq(lb_data)]
        with m.If(crc_take):
            m.d.sync += tx_crc.eq(crc16_byte(tx_crc, out_data))

        # SLIP escaping: END and ESC inside a frame go out as two bytes.
        second = Signal()       # the escape code is sent, its second byte is next
        special = ~out_raw & ((out_data == lp.END) | (out_data == lp.ESC))
        m.d.comb += [
            self.o_tx.valid.eq(out_valid),
            self.o_tx.payload.eq(
                Mux(second, Mux(out_data == lp.END, lp.ESC_END, lp.ESC_ESC),
                    Mux(special, lp.ESC, out_data))),
        ]
        with m.If(self.o_tx.valid & self.o_tx.ready):
            m.d.sync += second.eq(special & ~second)
            with m.If(~special | second):
                m.d.sync += out_valid.eq(0)
        with m.If(self.i_restart):
            m.d.sync += beat_seq.eq(0)
        return m
