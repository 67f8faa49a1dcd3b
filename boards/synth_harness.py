"""Pin-limited synthesis harness around :class:`hdl.datapath.systolic_array.SystolicArray`.

The array's stream ports (8x8: 2 x 66 input bits, 256 output bits) far exceed the pins of
the iCEBreaker's SG48 package, and nextpnr-ice40 has no out-of-context mode, so the array is
measured inside this harness on the real package with the real clock pin and global clock
network (nextpnr-ecp5's ``--out-of-context`` skips global clock promotion, which would make
the figures unrepresentative; the same harness is used on both boards for like-for-like
figures):

- every array input (both streams' valid and payload, and ``o_psum.ready``) is a bit of one
  shift register fed from the ``din`` pin, so no input is constant and nothing is optimised
  away;
- every array output is folded into ``dout`` by a tree of registered 4-input XORs (one LUT4
  per stage), so every output bit is observable;
- the reset is synchronised from the ``btn`` pin by two reset-less flip-flops and, on ECP5
  (``global_reset=True``), driven onto a global network through a DCCA, as a board top-level
  would: nextpnr-ice40 promotes a high-fanout reset to a global by itself, nextpnr-ecp5 only
  promotes clocks, and the array resets every one of its flip-flops.

:class:`SynthTop` puts the harness on a board: its ports on the pins of an amaranth-boards
platform's resources, so the platform's own build plan (``platform.prepare``) writes the pin
and clock constraints.

All harness paths are register to register through at most one LUT (plus the array's own
combinational ready logic on ``i_act.ready``/``i_weight.ready``), so the harness does not set
the critical path. The harness is for timing and utilisation figures only: it computes
nothing useful.
"""

from amaranth.hdl import ClockDomain, Const, Elaboratable, Instance, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import TPUConfig
from hdl.datapath.systolic_array import SystolicArray

__all__ = ["SynthHarness", "SynthTop"]


class SynthHarness(wiring.Component):
    """A :class:`SystolicArray` fed from one pin and observed on one pin.

    Parameters
    ----------
    config : TPUConfig
        Configuration of the array.
    btn_invert : bool
        The reset button reads 0 when pressed.
    global_reset : bool
        Drive the synchronised reset through an ECP5 ``DCCA`` global buffer.

    Members
    -------
    clk : In(1)
        Clock pin; drives the ``sync`` domain.
    btn : In(1)
        Reset button (synchronised; active high unless ``btn_invert``).
    din : In(1)
        Serial input shifted through all array inputs.
    dout : Out(1)
        XOR of all array outputs, registered.
    """

    def __init__(self, config: TPUConfig, *, btn_invert: bool = False,
                 global_reset: bool = False):
        self.config = config
        self.btn_invert = btn_invert
        self.global_reset = global_reset
        super().__init__({
            "clk":  In(1),
            "btn":  In(1),
            "din":  In(1),
            "dout": Out(1),
        })

    def elaborate(self, platform):
        m = Module()

        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.por = cd_por = ClockDomain("por", reset_less=True)
        m.d.comb += [cd_sync.clk.eq(self.clk), cd_por.clk.eq(self.clk)]
        rst_meta = Signal()
        rst_sync = Signal()
        m.d.por += [rst_meta.eq(~self.btn if self.btn_invert else self.btn),
                    rst_sync.eq(rst_meta)]
        if self.global_reset:
            rst_global = Signal()
            m.submodules.rst_dcc = Instance("DCCA", i_CLKI=rst_sync, i_CE=1,
                                            o_CLKO=rst_global)
            m.d.comb += cd_sync.rst.eq(rst_global)
        else:
            m.d.comb += cd_sync.rst.eq(rst_sync)

        m.submodules.array = array = SystolicArray(self.config)

        # Inputs: one shift register over every input bit of the array.
        inputs = [array.i_act.valid, array.i_act.payload.as_value(),
                  array.i_weight.valid, array.i_weight.payload.as_value(),
                  array.o_psum.ready]
        width = sum(len(value) for value in inputs)
        chain = Signal(width)
        m.d.sync += chain.eq((chain << 1) | self.din)
        offset = 0
        for value in inputs:
            m.d.comb += value.eq(chain[offset:offset + len(value)])
            offset += len(value)

        # Outputs: a tree of registered 4-input XORs down to one bit.
        bits = [*array.o_psum.payload.as_value(), array.o_psum.valid,
                array.i_act.ready, array.i_weight.ready, array.o_weight_stall,
                array.o_weight_shift, array.o_shadow_full]
        stage = 0
        while len(bits) > 1:
            folded = []
            for index in range(0, len(bits), 4):
                reg = Signal(name=f"fold{stage}_{index // 4}")
                group = bits[index:index + 4]
                value = group[0]
                for bit in group[1:]:
                    value = value ^ bit
                m.d.sync += reg.eq(value)
                folded.append(reg)
            bits = folded
            stage += 1
        out = Signal()
        m.d.sync += out.eq(bits[0] if bits else Const(0))
        m.d.comb += self.dout.eq(out)

        return m


class SynthTop(Elaboratable):
    """:class:`SynthHarness` on a board: each harness port on a pin of the platform.

    Parameters
    ----------
    config : TPUConfig
        Configuration of the array.
    pins : dict
        Harness port (``clk``, ``btn``, ``din``, ``dout``) -> ``(resource, number)`` or
        ``(resource, number, subsignal)`` of the platform. Two ports may share a resource
        through different subsignals (a UART's ``rx`` and ``tx``). The clock's resource
        carries the platform's clock constraint; the buffers apply the pins' inversion.
    global_reset : bool
        Drive the synchronised reset through an ECP5 ``DCCA`` global buffer.
    """

    PORTS = {"clk": "i", "btn": "i", "din": "i", "dout": "o"}

    def __init__(self, config: TPUConfig, *, pins: dict[str, tuple],
                 global_reset: bool = False):
        if set(pins) != set(self.PORTS):
            raise ValueError(f"pins {sorted(pins)} are not supported; allowed: exactly "
                             f"{sorted(self.PORTS)}")
        self.config = config
        self.pins = dict(pins)
        self.global_reset = global_reset

    def elaborate(self, platform):
        m = Module()
        m.submodules.harness = harness = SynthHarness(self.config,
                                                      global_reset=self.global_reset)
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
