"""A block-RAM memory whose reads leave through the block's output register: two cycles from
address to data, and no logic between the RAM and the first flip-flop it feeds.

An ECP5 DP16KD read without its output register delivers its data late in the cycle, so a
read straight into a flip-flop limits the clock; with the register (``REGMODE "OUTREG"``) the
data is out just after the clock edge (``python -m bench.ecp5_bram`` measures both). Yosys's
memory inference never uses that register, so this block instantiates the DP16KD itself.
"""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Shape, Signal, Value
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import Out

from hdl.lib.vendor import vendor_instance

__all__ = ["PipelinedMemory", "dp16kd_width"]

#: DP16KD data widths (one port) and the address bits each leaves (16,384 bits plus parity).
DP16KD_ABITS = {18: 10, 9: 11, 4: 12, 2: 13, 1: 14}


def dp16kd_width(depth: int) -> int:
    """The widest DP16KD port that holds *depth* rows in one block (deeper memories are not
    built: the core's are at most 1,024 rows on the ECP5 presets)."""
    for width, abits in DP16KD_ABITS.items():
        if depth <= 1 << abits:
            return width
    raise ValueError(f"PipelinedMemory on the ECP5 holds at most {1 << 14} rows (one DP16KD "
                     f"deep); got depth={depth}")


class PipelinedMemory(wiring.Component):
    """``depth`` rows of ``shape``, one write port and ``readers`` read ports; a read's row
    arrives two cycles after its address.

    Each read port is a :class:`amaranth.lib.memory.ReadPort` interface (``addr``, ``en``,
    ``data``) whose ``en`` stalls both read stages together: with ``en`` high at a clock edge
    the RAM reads ``addr`` into its output latch and the output register takes the row the
    latch held, so ``data`` shows in cycle ``c + 2`` the row addressed in cycle ``c`` when
    ``en`` was high in both; with ``en`` low neither stage moves. The write port is a
    :class:`amaranth.lib.memory.WritePort` interface (``addr``, ``data``, ``en``). Rows start
    at zero.

    A read that meets a write to its row in the same cycle returns an undefined row on the
    part: the clients (:func:`hdl.memory.row_memory.serve_reads`, the accumulators' forwarding)
    never use one. Each read port is a copy of the memory.

    Which circuit it elaborates to depends on ``platform``, as for
    :class:`hdl.datapath.pe.PE`'s ``multiplier="ecp5"``: on an ECP5 platform and
    :data:`hdl.lib.vendor.VERILOG_SIM_PLATFORM`, DP16KD blocks with their output registers
    (``sim/rtl/vendor/DP16KD.v`` models them, returning a colliding read's row inverted so that a
    client using one fails its test); for ``None`` (``amaranth.sim``) and ``"formal"`` an
    :class:`~amaranth.lib.memory.Memory` read port and a register behind it, both on ``en``
    (a colliding read returns the old row there). Any other platform raises ``ValueError``.

    Members
    -------
    w : Out(memory.WritePort.Signature(addr_width=addr_bits, shape=shape))
    r : Out(memory.ReadPort.Signature(addr_width=addr_bits, shape=shape)).array(readers)
    """

    def __init__(self, *, shape, depth: int, readers: int = 1):
        if depth < 1 or readers < 1:
            raise ValueError(f"PipelinedMemory needs depth >= 1 and readers >= 1; got "
                             f"depth={depth}, readers={readers}")
        self.shape = shape
        self.depth = depth
        self.addr_bits = max(1, (depth - 1).bit_length())
        super().__init__({
            # The ports' signatures are written from the memory's side (addr, en and the
            # written data in, read data out), as this block sees them: not flipped.
            "w": Out(memory.WritePort.Signature(addr_width=self.addr_bits, shape=shape)),
            "r": Out(memory.ReadPort.Signature(addr_width=self.addr_bits,
                                               shape=shape)).array(readers),
        })

    def elaborate(self, platform):
        m = Module()
        if vendor_instance(platform, "ecp5",
                           "PipelinedMemory instantiates ECP5 DP16KD block RAMs"):
            self._dp16kd(m)
            return m
        m.submodules.mem = mem = memory.Memory(shape=self.shape, depth=self.depth, init=[])
        wr = mem.write_port()
        m.d.comb += [wr.addr.eq(self.w.addr), wr.data.eq(self.w.data), wr.en.eq(self.w.en)]
        for index, r in enumerate(self.r):
            port = mem.read_port()
            out = Signal(self.shape, reset_less=True, name=f"r{index}_out")
            m.d.comb += [port.addr.eq(r.addr), port.en.eq(r.en), r.data.eq(out)]
            with m.If(r.en):
                m.d.sync += out.eq(port.data)
        return m

    def _dp16kd(self, m: Module):
        """The memory as DP16KD blocks side by side (a slice of the row each), one set per
        read port: port A writes, port B reads through its output register. The port and
        parameter names are those of yosys's ``share/ecp5/cells_bb.v``, which nextpnr-ecp5
        reads: every bus is one port per bit."""
        width = Shape.cast(self.shape).width
        block = dp16kd_width(self.depth)
        abits = DP16KD_ABITS[block]
        low = 14 - abits        # address bits below the row address (byte enables at 18)
        w_data = Signal(width, name="w_bits")
        m.d.comb += w_data.eq(Value.cast(self.w.data))
        for index, r in enumerate(self.r):
            r_data = Signal(width, name=f"r{index}_bits")
            m.d.comb += r.data.eq(r_data)
            for base in range(0, width, block):
                bits = min(block, width - base)
                ports = {
                    "i_CLKA": ClockSignal("sync"), "i_CEA": Const(1, 1),
                    "i_OCEA": Const(1, 1), "i_WEA": self.w.en, "i_RSTA": Const(0, 1),
                    "i_CLKB": ClockSignal("sync"), "i_CEB": r.en, "i_OCEB": r.en,
                    "i_WEB": Const(0, 1), "i_RSTB": Const(0, 1),
                }
                for cs in range(3):
                    ports[f"i_CSA{cs}"] = ports[f"i_CSB{cs}"] = Const(0, 1)
                for bit in range(14):
                    if bit < low:
                        # At 18 bits the two low address bits enable the port's two 9-bit
                        # bytes on a write: both on the write port.
                        ports[f"i_ADA{bit}"] = Const(int(block == 18), 1)
                        ports[f"i_ADB{bit}"] = Const(0, 1)
                    elif bit - low < self.addr_bits:
                        ports[f"i_ADA{bit}"] = self.w.addr[bit - low]
                        ports[f"i_ADB{bit}"] = r.addr[bit - low]
                    else:
                        ports[f"i_ADA{bit}"] = ports[f"i_ADB{bit}"] = Const(0, 1)
                for bit in range(block):
                    ports[f"i_DIA{bit}"] = w_data[base + bit] if bit < bits else Const(0, 1)
                    ports[f"i_DIB{bit}"] = Const(0, 1)
                    if bit < bits:
                        ports[f"o_DOB{bit}"] = r_data[base + bit]
                m.submodules[f"r{index}_ram{base // block}"] = Instance(
                    "DP16KD",
                    p_DATA_WIDTH_A=block, p_DATA_WIDTH_B=block,
                    p_REGMODE_A="NOREG", p_REGMODE_B="OUTREG",
                    p_WRITEMODE_A="NORMAL", p_WRITEMODE_B="NORMAL",
                    p_CSDECODE_A="0b000", p_CSDECODE_B="0b000",
                    p_RESETMODE="SYNC", p_GSR="DISABLED",
                    **ports)
