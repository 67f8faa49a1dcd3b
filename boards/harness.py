"""A pin-limited harness: any block of the design (the systolic array, one block, the whole
core) placed and routed on a board's real package, clock pin and global clock network.

A block's ports (an 8x8 array: 2 x 66 input bits, 256 output bits; the core: two 256-bit
beats) far exceed a package's pins, and nextpnr-ice40 has no out-of-context mode
(nextpnr-ecp5's ``--out-of-context`` skips global clock promotion, which would not measure
what a board build gets), so :class:`Harness` wraps the block:

- every input of the block's signature is a bit of one shift register fed from the ``din``
  pin, so no input is constant and nothing is optimised away;
- every output is folded into ``dout`` by a tree of registered 4-input XORs (one LUT4 a
  stage), so every output bit is observable (the core's ``o_activity`` coverage taps are left
  unconnected, as on a board);
- the reset is synchronised from the ``btn`` pin by two reset-less flip-flops and, with
  ``global_reset`` (ECP5), driven onto a global network through a ``DCCA``, as a board top
  level does: nextpnr-ecp5 promotes only clocks, nextpnr-ice40 promotes a high-fanout reset
  by itself.

Every harness path is register to register through at most one LUT, so the harness does not
set the critical path; a block whose outputs follow its inputs through logic (the hazard
tracker's answer to a query) is measured with that logic between two harness registers. It
computes nothing useful: it is for timing and utilisation figures.
:class:`HarnessTop` puts it on the pins of an amaranth-boards platform, so the platform's own
build plan writes the pin and clock constraints.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal, Value
from amaranth.lib import io, wiring
from amaranth.lib.wiring import Flow, In, Out

from hdl.config import TPUConfig

__all__ = ["BLOCKS", "block", "shift_in", "fold_out", "Harness", "HarnessTop"]


def _blocks() -> dict[str, Callable[[TPUConfig], wiring.Component]]:
    """Each block as :class:`hdl.core.Core` builds it for a configuration (its pipeline
    policy and activation unit)."""
    from hdl.control.front_end import FrontEnd
    from hdl.control.hazards import HazardTracker
    from hdl.control.matrix_engine import MatrixEngine
    from hdl.core import Core
    from hdl.datapath.accumulators import Accumulators
    from hdl.datapath.activation import ActivationUnit
    from hdl.datapath.activation_serial import SerialActivationUnit
    from hdl.datapath.systolic_array import SystolicArray
    from hdl.memory.unified_buffer import UnifiedBuffer

    def activation(cfg: TPUConfig) -> wiring.Component:
        if cfg.activation_unit == "serial":
            return SerialActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width)
        return ActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width,
                              multiplier="ecp5" if cfg.multiplier == "ecp5" else "infer")

    return {
        "array": SystolicArray,
        "core": Core,
        "activation": activation,
        "accumulators": lambda cfg: Accumulators(depth=cfg.acc_depth, cols=cfg.cols,
                                                 acc_width=cfg.acc_width,
                                                 registered=cfg.pipeline == "fast"),
        "unified_buffer": lambda cfg: UnifiedBuffer(depth=cfg.ub_depth, row_elems=cfg.ub_row,
                                                    data_width=cfg.data_width,
                                                    pipelined=cfg.pipeline == "fast"),
        "front_end": FrontEnd,
        "hazards": lambda cfg: HazardTracker(end_bits=cfg.range_end_bits,
                                             slots=cfg.matmul_slots,
                                             late=cfg.pipeline == "fast"),
        "matrix_engine": MatrixEngine,
    }


#: What a harness can hold: the array, the whole core, or one block of the core (a few
#: minutes to place and route instead of the whole core's many, for one fix at a time).
BLOCKS = ("array", "core", "activation", "accumulators", "unified_buffer", "front_end",
          "hazards", "matrix_engine")


def block(name: str, config: TPUConfig) -> wiring.Component:
    """The component *name* (one of :data:`BLOCKS`) for *config*."""
    if name not in BLOCKS:
        raise ValueError(f"block {name!r} is not supported; allowed: {', '.join(BLOCKS)}")
    return _blocks()[name](config)


def shift_in(m: Module, values, din, *, domain: str = "sync") -> int:
    """Drive every bit of *values* from one shift register fed by *din*; returns its width."""
    width = sum(len(value) for value in values)
    chain = Signal(width, name="chain")
    m.d[domain] += chain.eq((chain << 1) | din)
    offset = 0
    for value in values:
        m.d.comb += value.eq(chain[offset:offset + len(value)])
        offset += len(value)
    return width


def fold_out(m: Module, bits, *, domain: str = "sync") -> Signal:
    """A registered bit that is the XOR of every bit in *bits*, through a tree of registered
    4-input XORs (one LUT4 a stage)."""
    bits = list(bits)
    stage = 0
    while len(bits) > 1:
        folded = []
        for index in range(0, len(bits), 4):
            reg = Signal(name=f"fold{stage}_{index // 4}")
            value = bits[index]
            for bit in bits[index + 1:index + 4]:
                value = value ^ bit
            m.d[domain] += reg.eq(value)
            folded.append(reg)
        bits = folded
        stage += 1
    out = Signal(name="fold_out")
    m.d[domain] += out.eq(bits[0] if bits else 0)
    return out


class Harness(wiring.Component):
    """One block (:data:`BLOCKS`) fed from one pin and observed on one pin.

    Parameters
    ----------
    config : TPUConfig
        Configuration of the block.
    block : str
        Which block to build; it is the submodule of that name.
    global_reset : bool
        Drive the synchronised reset through an ECP5 ``DCCA`` global buffer.

    Members
    -------
    clk : In(1)
        Clock pin; drives the ``sync`` domain.
    btn : In(1)
        Reset button (synchronised, active high).
    din : In(1)
        Serial input shifted through all the block's inputs.
    dout : Out(1)
        XOR of all the block's outputs, registered.
    """

    def __init__(self, config: TPUConfig, *, block: str = "array", global_reset: bool = False):
        if block not in BLOCKS:
            raise ValueError(f"block {block!r} is not supported; allowed: {', '.join(BLOCKS)}")
        self.config = config
        self.block = block
        self.global_reset = global_reset
        super().__init__({"clk": In(1), "btn": In(1), "din": In(1), "dout": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.por = cd_por = ClockDomain("por", reset_less=True)
        m.d.comb += [cd_sync.clk.eq(self.clk), cd_por.clk.eq(self.clk)]
        rst_meta = Signal(init=1)
        rst_sync = Signal(init=1)
        m.d.por += [rst_meta.eq(self.btn), rst_sync.eq(rst_meta)]
        if self.global_reset:
            rst_global = Signal()
            m.submodules.rst_dcc = Instance("DCCA", i_CLKI=rst_sync, i_CE=1,
                                            o_CLKO=rst_global)
            m.d.comb += cd_sync.rst.eq(rst_global)
        else:
            m.d.comb += cd_sync.rst.eq(rst_sync)

        dut = block(self.block, self.config)
        m.submodules[self.block] = dut
        inputs, outputs = [], []
        for path, member, value in dut.signature.flatten(dut):
            if path[0] == "o_activity":
                continue
            (inputs if member.flow == Flow.In else outputs).append(Value.cast(value))
        shift_in(m, inputs, self.din)
        m.d.comb += self.dout.eq(fold_out(m, [bit for value in outputs for bit in value]))
        return m


class HarnessTop(Elaboratable):
    """:class:`Harness` on a board: each harness port on a pin of the platform.

    Parameters
    ----------
    config : TPUConfig
        Configuration of the block.
    pins : dict
        Harness port (``clk``, ``btn``, ``din``, ``dout``) -> ``(resource, number)`` or
        ``(resource, number, subsignal)`` of the platform. Two ports may share a resource
        through different subsignals (a UART's ``rx`` and ``tx``). The clock's resource
        carries the platform's clock constraint; the buffers apply the pins' inversion.
    block : str
        Which block to build (:data:`BLOCKS`).
    global_reset : bool
        Drive the synchronised reset through an ECP5 ``DCCA`` global buffer.
    """

    PORTS = {"clk": "i", "btn": "i", "din": "i", "dout": "o"}

    def __init__(self, config: TPUConfig, *, pins: dict[str, tuple], block: str = "array",
                 global_reset: bool = False):
        if set(pins) != set(self.PORTS):
            raise ValueError(f"pins {sorted(pins)} are not supported; allowed: exactly "
                             f"{sorted(self.PORTS)}")
        self.harness = Harness(config, block=block, global_reset=global_reset)
        self.pins = dict(pins)

    def elaborate(self, platform):
        m = Module()
        m.submodules.harness = harness = self.harness
        requested = {}
        for port, spec in self.pins.items():
            name, number = spec[0], spec[1]
            if (name, number) not in requested:
                subsignals = [sub.name for sub in platform.lookup(name, number).ios
                              if hasattr(sub, "name")]
                direction = {sub: "-" for sub in subsignals} if subsignals else "-"
                requested[name, number] = platform.request(name, number, dir=direction)
            pin = requested[name, number]
            if len(spec) > 2:
                pin = getattr(pin, spec[2])
            m.submodules[f"{port}_buffer"] = buffer = io.Buffer(self.PORTS[port], pin)
            if self.PORTS[port] == "i":
                m.d.comb += getattr(harness, port).eq(buffer.i)
            else:
                m.d.comb += buffer.o.eq(getattr(harness, port))
        return m
