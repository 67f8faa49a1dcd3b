"""The PE's multiplier as an instantiated ECP5 ``MULT18X18D`` (``multiplier="ecp5"``).

- the configuration field and the PE's choice of circuit per platform;
- ``amaranth.sim`` (behavioural registers): the same cycles as ``multiplier="infer"``;
- the simulation model ``sim/rtl/vendor/MULT18X18D.v`` alone against numpy, on Icarus and
  Verilator, and its refusal of parameters outside the subset it models;
- the PE with the instance, lock-step against its cycle model with a random clock enable;
- the systolic array and the whole core with every PE on the instance, against the golden
  model and the ISA simulator, on Icarus and Verilator.

Each Verilator build costs 10-30 s of C++ compilation: CI runs the model alone, the PE
(the enable every cycle), the array (back-pressure: the core's accumulators never stall its
array) and the core (every instance in place) on Icarus, and ``test_random_volume.py``'s
``mixed`` and ``edge-fast`` cores (every PE on the model) on Verilator;
``make regression`` (``slow``) adds the model, the PE, the array and the core on Verilator.
"""

from __future__ import annotations

import gc
import json
import random
import re
import warnings
from pathlib import Path

import pytest
from amaranth.back import verilog
from amaranth.hdl import (
    ClockSignal,
    Const,
    EnableInserter,
    Fragment,
    Instance,
    Module,
    Signal,
    UnusedElaboratable,
)
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from progen import program_block

from firmware.transports.rtl import RtlDevice
from hdl.config import ConfigError, TPUConfig
from hdl.core import Core
from hdl.datapath.pe import PE
from hdl.datapath.systolic_array import SystolicArray
from hdl.lib.vendor import VERILOG_SIM_PLATFORM
from hdl.presets import PRESETS, get_config
from sim.models.isa_sim import beats_match
from sim.rtl.runner import run
from sim.rtl.verilog import MODELS_DIR, generate, model_sources

HERE = Path(__file__).parent


# Configuration ----------------------------------------------------------------------------

def test_config_field():
    assert TPUConfig().multiplier == "infer"
    # Only the board presets instantiate vendor multipliers (MULT18X18D, SB_MAC16).
    assert {name: preset.multiplier for name, preset in PRESETS.items()
            if preset.multiplier != "infer"} == {"ulx3s": "ecp5", "icebreaker": "ice40"}
    assert get_config("small").replace(multiplier="ecp5").multiplier == "ecp5"
    for bad in ("dsp", "ECP5", None, 1):
        with pytest.raises(ConfigError, match=rf"TPUConfig.multiplier={bad!r} is not "
                                              r"supported; allowed: 'infer' or 'ecp5'"):
            TPUConfig(multiplier=bad)


def _used(pe: PE) -> PE:
    Fragment.get(pe, None)      # elaborated, so Amaranth does not warn about it
    return pe


def test_pe_keywords():
    infer, lut, ecp5 = _used(PE()), _used(PE(multiplier="lut")), _used(PE(multiplier="ecp5"))
    fast = _used(PE(multiplier="ecp5", pipelined=True))
    assert infer.multiplier == "infer" and infer.use_dsp
    assert lut.multiplier == "lut" and not lut.use_dsp
    assert ecp5.use_dsp
    assert "i_en" in ecp5.signature.members and "i_en" not in infer.signature.members
    # The primitive does not change the cycles; the fast pipeline's registers do.
    assert (infer.latency, lut.latency, ecp5.latency, fast.latency) == (3, 3, 3, 7)
    _refused("allowed: 'infer', 'ecp5', 'lut'", multiplier="dsp")
    _refused("not supported with multiplier='ice40'", multiplier="ice40", pipelined=True)


def _refused(match: str, **kwargs) -> None:
    """``PE(**kwargs)`` raises a ValueError matching *match*. The half-built PE is collected
    here, with Amaranth's warning that it was never elaborated silenced (left to the garbage
    collector, the warning would fail whichever test runs then)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=match) as info:
            PE(**kwargs)
        del info
        gc.collect()


# Which circuit each platform gets ---------------------------------------------------------

def _registers(text: str, *names: str) -> list[str]:
    """Those of *names* that the Verilog *text* declares as registers."""
    return [name for name in names
            if re.search(rf"^\s*reg (signed )?(\[\d+:0\] )?{name} ", text, re.MULTILINE)]


def _verilog(platform, *, pipelined: bool = True) -> str:
    return verilog.convert(PE(multiplier="ecp5", pipelined=pipelined), name="pe",
                           platform=platform)


@pytest.mark.parametrize("platform", [VERILOG_SIM_PLATFORM, ULX3S_85F_Platform()],
                         ids=["verilog-sim", "ulx3s"])
def test_instance_on_ecp5_and_verilog_sim(platform):
    text = _verilog(platform)
    assert text.count("MULT18X18D #(") == 1
    for name in ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_OUTPUT_CLK"):
        assert f'.{name}("CLK0")' in text
    assert '.REG_PIPELINE_CLK("NONE")' in text
    for port, value in [("SIGNEDA", "1'h1"), ("SIGNEDB", "1'h1"), ("RST0", "1'h0"),
                        ("CLK0", "clk"), ("CE0", "i_en"), ("A17", "a_pre[8]"),
                        ("B0", "w_pipe[0]")]:
        assert f".{port}({value})" in text, port
    # The block's registers replace the fabric's operand and product registers; its inputs
    # come from registers (a_pre and w_pipe), its output goes to one (product_pipe).
    assert not _registers(text, "a", "w", "product")
    pipeline = ["o_act", "w_pre", "a_pre", "w_pipe", "product_pipe", "addend"]
    assert _registers(text, *pipeline) == pipeline


@pytest.mark.parametrize("platform", [VERILOG_SIM_PLATFORM, ULX3S_85F_Platform()],
                         ids=["verilog-sim", "ulx3s"])
def test_instance_without_the_fast_registers(platform):
    """The primitive with the reference pipeline: the block's registers are the operand and
    product registers, and no fabric register sits before or after it (latency 3)."""
    text = _verilog(platform, pipelined=False)
    assert text.count("MULT18X18D #(") == 1
    assert ".CE0(i_en)" in text
    assert not _registers(text, "a", "w", "product", "w_pre", "a_pre", "w_pipe",
                          "product_pipe", "addend")


@pytest.mark.parametrize("platform", [None, "formal"])
def test_behavioural_without_models(platform):
    """amaranth.sim reads an instance's outputs as 0 without a word: there, and in formal
    proofs, the PE builds the block's registers in the fabric."""
    text = _verilog(platform)
    assert "MULT18X18D" not in text
    assert _registers(text, "a", "w", "product") == ["a", "w", "product"]


def test_other_parts_refused():
    with pytest.raises(ValueError, match="MULT18X18D, which platform 'ICEBreakerPlatform'"):
        _verilog(ICEBreakerPlatform())


def test_model_sources_follow_the_instances():
    ecp5 = generate("pe", lambda: PE(multiplier="ecp5"), "dsp-ecp5")
    infer = generate("pe", lambda: PE(), "dsp-infer")
    assert model_sources(ecp5) == [MODELS_DIR / "MULT18X18D.v"]
    assert model_sources(infer) == []


# amaranth.sim: the behavioural path -------------------------------------------------------

@pytest.mark.parametrize("pipelined", [True, False], ids=["fast", "reference"])
def test_amaranth_sim_matches_infer(pipelined: bool):
    """Side by side in amaranth.sim, the ``ecp5`` PE (behavioural here) and an ``infer`` PE
    under an ``EnableInserter`` of the same enable, the enable high for a while, then random:
    ``o_act``, ``o_switch``, ``o_wbus`` agree every cycle, and the ``ecp5`` PE's ``o_psum``
    is its ``i_psum`` plus the product four enabled cycles later than the ``infer`` PE's with
    the fast pipeline's registers (``w_pre`` and ``a_pre``/``w_pipe`` before the block,
    ``product_pipe`` and ``addend`` after it), in the same cycle without them: the ``infer``
    PE, fed ``i_psum`` = 0, shows the products on its ``o_psum``."""
    m = Module()
    en = Signal(init=1)
    m.submodules.ecp5 = ecp5 = PE(multiplier="ecp5", row=1, row_bits=2, pipelined=pipelined)
    infer = PE(row=1, row_bits=2)
    m.submodules.infer = EnableInserter(en)(infer)
    m.d.comb += ecp5.i_en.eq(en)
    sim = Simulator(m)
    sim.add_clock(1e-6)
    rng = random.Random(5)
    outputs = ("o_act", "o_switch", "o_wbus")

    def wrap32(value: int) -> int:
        return (value + 2**31) % 2**32 - 2**31

    async def bench(ctx):
        held = 0
        checked = 0
        lag = ecp5.latency - infer.latency
        assert lag == (4 if pipelined else 0)
        products = []               # the infer PE's o_psum before each enabled cycle
        expected = None             # the ecp5 PE's o_psum, once it no longer shows reset junk
        for cycle in range(400):
            values = {"i_act": rng.randint(-256, 255), "i_switch": int(rng.random() < 0.2)}
            psum = rng.randint(-(2**31), 2**31 - 1)
            wbus = {"valid": int(rng.random() < 0.5), "row": rng.randrange(4),
                    "data": rng.randint(-256, 255)}
            enabled = cycle < 100 or rng.random() < 0.6
            held += not enabled
            for pe in (ecp5, infer):
                for name, value in values.items():
                    ctx.set(getattr(pe, name), value)
                ctx.set(pe.i_wbus, wbus)
            ctx.set(ecp5.i_psum, psum)
            ctx.set(infer.i_psum, 0)
            ctx.set(en, int(enabled))
            if enabled:
                products.append(ctx.get(infer.o_psum))
            await ctx.tick()
            got = [ctx.get(getattr(ecp5, name)) for name in outputs]
            want = [ctx.get(getattr(infer, name)) for name in outputs]
            assert got == want, f"cycle {cycle}: ecp5 {got}, infer {want}"
            if enabled and lag == 0:
                # The product both adders took in this cycle.
                expected = wrap32(psum + ctx.get(infer.o_psum))
            elif enabled and len(products) >= lag:
                # The product the ecp5 PE's adder took in this cycle.
                expected = wrap32(psum + products[-lag])
            if expected is not None:
                assert ctx.get(ecp5.o_psum) == expected, (
                    f"cycle {cycle}: ecp5 o_psum {ctx.get(ecp5.o_psum)}, expected {expected}")
                checked += 1
        assert held > 50 and checked > 300

    sim.add_testbench(bench)
    sim.run()


# The simulation model alone ---------------------------------------------------------------

class MultHarness(wiring.Component):
    """``MULT18X18D`` blocks on shared operand buses ``a``, ``b`` and clock enable ``ce``,
    one per entry of *variants* (register stages and signedness), each with its product on
    ``p_<name>``; *extra* parameters go to every block."""

    def __init__(self, variants: dict[str, dict], extra: dict | None = None):
        self.variants = variants
        self.extra = extra or {}
        super().__init__({"a": In(18), "b": In(18), "ce": In(1),
                          **{f"p_{name}": Out(36) for name in variants}})

    def elaborate(self, platform):
        m = Module()
        for name, variant in self.variants.items():
            reg_input = "CLK0" if variant["reg_input"] else "NONE"
            params = {"REG_INPUTA_CLK": reg_input, "REG_INPUTB_CLK": reg_input,
                      "REG_OUTPUT_CLK": "CLK0" if variant["reg_output"] else "NONE",
                      **self.extra}
            sign = Const(int(variant["signed"]), 1)
            p = getattr(self, f"p_{name}")
            ports = {f"i_A{i}": self.a[i] for i in range(18)}
            ports |= {f"i_B{i}": self.b[i] for i in range(18)}
            ports |= {f"o_P{i}": p[i] for i in range(36)}
            m.submodules[f"mult_{name}"] = Instance(
                "MULT18X18D", **{f"p_{k}": v for k, v in params.items()},
                i_SIGNEDA=sign, i_SIGNEDB=sign, i_CLK0=ClockSignal("sync"), i_CE0=self.ce,
                i_RST0=Const(0, 1), **ports)
        return m


MODEL_VARIANTS = {
    "registered": {"reg_input": True, "reg_output": True, "signed": True},
    "combinational": {"reg_input": False, "reg_output": False, "signed": True},
    "input_only": {"reg_input": True, "reg_output": False, "signed": True},
    "output_only": {"reg_input": False, "reg_output": True, "signed": True},
    "unsigned": {"reg_input": True, "reg_output": True, "signed": False},
    "unsigned_comb": {"reg_input": False, "reg_output": False, "signed": False},
}


@pytest.mark.parametrize("sim", ["icarus", pytest.param("verilator", marks=pytest.mark.slow)])
def test_model_against_numpy(sim: str):
    """Every variant of the model at once (one simulator build)."""
    run("mult18x18d", lambda: MultHarness(MODEL_VARIANTS), "model", "tb_pe_dsp", HERE,
        "test_model_products", extra_env={"AMTPU_MULT": json.dumps(MODEL_VARIANTS)},
        sim=sim)


# One refusal in make test, the others in make regression (a simulator build each).
@pytest.mark.parametrize("extra, message", [
    ({"REG_PIPELINE_CLK": "CLK0"}, 'REG_PIPELINE_CLK="CLK0" unsupported'),
    pytest.param({"REG_OUTPUT_CLK": "CLK1"}, 'REG_OUTPUT_CLK="CLK1" unsupported',
                 marks=pytest.mark.slow),
    pytest.param({"REG_INPUTA_CE": "CE1"}, "REG_*_CE other than CE0 unsupported",
                 marks=pytest.mark.slow),
    pytest.param({"MULT_BYPASS": "ENABLED"},
                 "CAS_MATCH_REG, SOURCEB_MODE, MULT_BYPASS, RESETMODE: only",
                 marks=pytest.mark.slow),
], ids=["pipeline", "clk1", "ce1", "bypass"])
def test_model_refuses_unmodelled_parameters(extra: dict, message: str):
    key = "refuse-" + "-".join(f"{k}-{v}" for k, v in extra.items())
    variants = {"registered": MODEL_VARIANTS["registered"]}
    with pytest.raises(AssertionError) as info:
        run("mult18x18d", lambda: MultHarness(variants, extra), key, "tb_pe_dsp", HERE,
            "test_runs", sim="icarus")
    assert f"MULT18X18D model: {message}" in str(info.value)


def test_model_harness_runs():
    """The refusal test's bench passes on parameters the model takes."""
    variants = {"registered": MODEL_VARIANTS["registered"]}
    run("mult18x18d", lambda: MultHarness(variants), "accept", "tb_pe_dsp", HERE, "test_runs",
        sim="icarus")


# The PE, the array and the core on the instance -------------------------------------------

def make_pe() -> PE:
    return PE(data_width=8, acc_width=32, row=1, row_bits=2, multiplier="ecp5", pipelined=True)


@pytest.mark.parametrize("sim", ["icarus", pytest.param("verilator", marks=pytest.mark.slow)])
def test_pe_lockstep(sim: str):
    run("pe", make_pe, "row1-ecp5", "tb_pe_dsp", HERE, "test_pe_enable", sim=sim)


ARRAY_CONFIG = get_config("small").replace(multiplier="ecp5", pipeline="fast")


@pytest.mark.parametrize("sim", ["icarus", pytest.param("verilator", marks=pytest.mark.slow)])
def test_array_random_and_stalls(sim: str):
    """Random tiles and activations of every signedness, tiles back to back (each row
    exactly ``array_latency`` cycles, four more than with ``infer``), uneven tiles, then
    random valid/ready stalls and back-pressure (the registered enable and its skid, the
    enable reaching the blocks' CE0), against the golden model, with the stream rules on
    ``o_psum`` and the enable's invariants checked every cycle."""
    run("systolic_array", lambda: SystolicArray(ARRAY_CONFIG), "small-ecp5",
        "tb_systolic_array", HERE, ["test_random", "test_extremes", "test_back_to_back",
                                    "test_uneven_tiles", "test_shadow_interlock",
                                    "test_stalls", "test_backpressure"],
        config=ARRAY_CONFIG, sim=sim)


CORE_CONFIG = get_config("tiny").replace(multiplier="ecp5", pipeline="fast")


@pytest.mark.slow          # 19 s; make test runs the tiny ULX3S core (test_core.py)
@pytest.mark.parametrize("sim", ["icarus", "verilator"])
def test_core_random_programs(sim: str):
    """A block of random programs from a reset on the whole core, every output beat
    compared with the ISA simulator's."""
    device = RtlDevice(CORE_CONFIG, sim=sim)
    try:
        device.reset()
        programs = 0
        for seed, program, expected in program_block(CORE_CONFIG, range(900_000, 900_012)):
            device.send(program.beats)
            got = device.receive(len(expected))
            assert beats_match(expected, got), f"seed {seed}: {got} != {expected}"
            status = device.status()
            assert status.halted and not status.error, f"seed {seed}: {status}"
            programs += 1
        assert programs == 12
    finally:
        device.close()


def test_core_elaborates_the_instances():
    """Every PE of the core is on a MULT18X18D in the Verilog the simulators get (other
    units may instantiate blocks of their own: only the PEs' modules are counted)."""
    # test_core.py's 3x2-ulx3s directed core: the same Verilog, converted once.
    config = TPUConfig(rows=3, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=8,
                       pipeline="fast", multiplier="ecp5")
    text = generate("core", lambda: Core(config), "3x2-ulx3s").read_text()
    per_module = {}
    for module in text.split("\nmodule ")[1:]:
        name = module.split(None, 1)[0]
        per_module[name] = module.count("MULT18X18D #(")
    pes = {name: count for name, count in per_module.items()
           if re.search(r"\.pe_\d+_\d+$", name)}
    assert len(pes) == config.macs and set(pes.values()) == {1}, pes
