"""Row memory: a memory of rows with several read and write ports, arbitrated round-robin,
and the read-side helpers the blocks built on block RAM share."""

from types import SimpleNamespace

from amaranth.hdl import Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In

from hdl.memory.block_ram import PipelinedMemory
from hdl.ports import MemReadSignature, MemWriteSignature

__all__ = ["RowMemory", "RegisteredRead", "serve_reads", "round_robin"]
def round_robin(m: Module, requests, name: str):
    """Round-robin arbiter: ``(grant, any, last)``. ``grant`` indexes a request, favouring the
    one after ``last``; the caller updates ``last`` to ``grant`` when a request is served."""
    n = len(requests)
    last = Signal(range(n), name=f"{name}_last")
    grant = Signal(range(n), name=f"{name}_grant")
    any_req = Signal(name=f"{name}_any")
    m.d.comb += any_req.eq(sum(requests) != 0 if n > 1 else requests[0])
    # Highest priority first: last+1, last+2, ..., last.
    for offset in reversed(range(1, n + 1)):
        for base in range(n):
            index = (base + offset) % n
            with m.If((last == base) & requests[index]):
                m.d.comb += grant.eq(index)
    return grant, any_req, last


class RegisteredRead:
    """A synchronous read port of *mem* built as an asynchronous one and a register with an
    enable (``addr``, ``en``, ``data`` as :meth:`amaranth.lib.memory.Memory.read_port`'s).

    For a memory whose reads may return anything when they meet a write to their row (the
    ``no_rw_check`` attribute): yosys reads that attribute only as it merges a register into
    an asynchronous read port. Given a synchronous port instead, it keeps read-before-write
    on block RAMs that do not promise it (the iCE40's) by delaying every write a cycle and
    bypassing it to the reads: two registers and a multiplexer per bit of the row."""

    def __init__(self, m: Module, mem: memory.Memory, name: str):
        port = mem.read_port(domain="comb")
        self.addr = port.addr
        self.en = Signal(init=1, name=f"{name}_en")
        self.data = Signal(port.data.shape(), reset_less=True, name=f"{name}_data")
        with m.If(self.en):
            m.d.sync += self.data.eq(port.data)


def serve_reads(m: Module, rd, addr_streams, data_streams, name: str = "r", *,
                latency: int = 1):
    """Share memory read port ``rd`` among clients: each sends addresses on its
    ``addr_streams[i]`` and receives rows on ``data_streams[i]`` in order. One request a
    cycle is served round-robin; a response is held (read enable low) until its client takes
    it, so a stalled client delays the others but nothing is lost or repeated.

    ``latency`` is the port's: its row arrives that many cycles after its address, every
    stage moving only on ``rd.en`` (1: a synchronous read port; 2: a
    :class:`~hdl.memory.block_ram.PipelinedMemory` port). The reads in flight move as one pipeline:
    while the client of the row at its end does not take it, none moves."""
    # valid[k], owner[k]: the read in stage k (the last one's row is on rd.data).
    valid = [Signal(name=f"{name}_held" if k == latency - 1 else f"{name}_valid{k}")
             for k in range(latency)]
    owner = [Signal(range(len(addr_streams)),
                    name=f"{name}_owner" if k == latency - 1 else f"{name}_owner{k}")
             for k in range(latency)]
    held = valid[-1]
    owner_ready = Signal(name=f"{name}_owner_ready")
    for index, r in enumerate(data_streams):
        m.d.comb += [
            r.valid.eq(held & (owner[-1] == index)),
            r.payload.eq(rd.data),
        ]
        with m.If(owner[-1] == index):
            m.d.comb += owner_ready.eq(r.ready)
    advance = ~held | owner_ready
    grant, any_r, last_r = round_robin(m, [r.valid for r in addr_streams], name)
    for index, r in enumerate(addr_streams):
        m.d.comb += r.ready.eq(advance & (grant == index))
        with m.If(grant == index):
            m.d.comb += rd.addr.eq(r.payload)
    m.d.comb += rd.en.eq(advance)
    with m.If(advance):
        m.d.sync += [valid[0].eq(any_r), owner[0].eq(grant)]
        for k in range(1, latency):
            m.d.sync += [valid[k].eq(valid[k - 1]), owner[k].eq(owner[k - 1])]
        with m.If(any_r):
            m.d.sync += last_r.eq(grant)


class RowMemory(wiring.Component):
    """A memory of ``depth`` rows with one write port shared by several clients and a read
    port for each read client, all through valid/ready streams.

    Write clients send ``{addr, data}`` requests; they share the write port round-robin, one
    request a cycle, so no client starves and no request is lost or served twice. Read
    clients send an address on ``addr`` and receive the row on ``data``, in order; each
    has a read port of its own (FPGA block RAMs give two ports, or synthesis duplicates the
    memory), so the matrix unit is fed a row every cycle while the host reads too. A read and
    a write of the same row in one cycle return an undefined row on a part (the block RAM is
    told it may, ``no_rw_check``, so it need not emulate read-before-write; simulation gives
    the old one); clients that need ordering are serialised by the controller's interlocks,
    so the core never uses such a read.

    Parameters
    ----------
    depth : int
        Rows.
    row_shape : shape-like
        Shape of one row.
    readers : int or tuple of int
        Read clients: an int ``n`` for ``n`` ports with one client each, or the number of
        clients of each port (``(1, 2)``: a port of its own for client 0, one that clients 1
        and 2 share round-robin, as :func:`serve_reads` serves them).
    writers : int
        Clients of the write port.
    pipelined : bool
        The rows in a :class:`~hdl.memory.block_ram.PipelinedMemory`: a read's row leaves the
        block RAM's output register, one cycle later (the fast pipeline), and a write lands a
        cycle after it is accepted: a read accepted in that cycle returns the old row, one
        accepted in the next an undefined row, and only one after that the new row (the
        core's engines read from the cycle after they take an instruction, and the one that
        writes, or its ``busy``, lets a reader of the rows issue at the earliest in the cycle
        after the last write is accepted).

    Members
    -------
    w : In(MemWriteSignature(addr_bits, row_shape)).array(writers)
        Write requests.
    r : In(MemReadSignature(addr_bits, row_shape)).array(readers)
        Read clients: requests on ``r[i].addr``, responses on ``r[i].data``, one per
        request, in request order.
    """

    def __init__(self, *, depth: int, row_shape, readers: int | tuple[int, ...] = 1,
                 writers: int = 1, pipelined: bool = False):
        self.pipelined = pipelined
        self.port_clients = (1,) * readers if isinstance(readers, int) else tuple(readers)
        self.depth = depth
        self.row_shape = row_shape
        self.addr_bits = max(1, (depth - 1).bit_length())
        super().__init__({
            "w": In(MemWriteSignature(self.addr_bits, row_shape)).array(writers),
            "r": In(MemReadSignature(self.addr_bits, row_shape)).array(
                sum(self.port_clients)),
        })

    def elaborate(self, platform):
        m = Module()
        if self.pipelined:
            m.submodules.mem = mem = PipelinedMemory(shape=self.row_shape, depth=self.depth,
                                                     readers=len(self.port_clients))
            # The granted write lands a cycle later, from flip-flops beside the arbiter: the
            # grant comes from the clients' valid, deep in the control logic, and would
            # otherwise run on across the die into the block RAMs' data inputs.
            wr = SimpleNamespace(addr=Signal(self.addr_bits), data=Signal(self.row_shape),
                                 en=Signal())
            m.d.sync += [mem.w.addr.eq(wr.addr), mem.w.data.eq(wr.data), mem.w.en.eq(wr.en)]
        else:
            m.submodules.mem = mem = memory.Memory(shape=self.row_shape, depth=self.depth,
                                                   init=[], attrs={"no_rw_check": 1})
            wr = mem.write_port()

        # Write port.
        grant, any_w, last_w = round_robin(m, [w.valid for w in self.w], "w")
        for index, w in enumerate(self.w):
            m.d.comb += w.ready.eq(grant == index)
            with m.If(grant == index):
                m.d.comb += [wr.addr.eq(w.payload.addr), wr.data.eq(w.payload.data)]
        m.d.comb += wr.en.eq(any_w)
        with m.If(any_w):
            m.d.sync += last_w.eq(grant)

        first = 0
        for index, clients in enumerate(self.port_clients):
            served = list(self.r)[first:first + clients]
            first += clients
            addrs, datas = [r.addr for r in served], [r.data for r in served]
            if self.pipelined:
                serve_reads(m, mem.r[index], addrs, datas, name=f"r{index}", latency=2)
                continue
            port = RegisteredRead(m, mem, f"r{index}_port")
            serve_reads(m, port, addrs, datas, name=f"r{index}")
        return m
