"""Place and route the whole core (:class:`hdl.core.Core`) on the ULX3S's LFE5U-85F-6 and
print its Fmax, resources and critical paths.

``python -m bench.core_timing --config default --clock 150`` builds the core in a pin-limited
harness (:class:`CoreTimingHarness`) with the amaranth-boards ULX3S 85F platform's own build
plan (:func:`boards.build.prepare` + :func:`boards.build.run_plan`) and the YoWASP tools of
the venv, with the core clock constrained to ``--clock`` MHz, and prints

- nextpnr's achieved Fmax for the core clock, and whether the constraint is met;
- LUT4 (``TRELLIS_COMB``), flip-flop (``TRELLIS_FF``), ``MULT18X18D`` and ``DP16KD`` use;
- nextpnr's critical path (from its ``--report``), hop by hop;
- the next worst paths to *other* endpoints (``--paths``), from a static timing analysis of
  the delays nextpnr back-annotates (``--sdf``): nextpnr itself reports one path per clock.
  Endpoints are grouped by register (the bits of one signal), so each line is a different
  path through the design, not the same path into the neighbouring bit.

``--block activation`` (or ``accumulators``, ``unified_buffer``, ``front_end``, ``hazards``,
``matrix_engine``) builds one block alone in the same harness: a few minutes instead of the
whole core's 15 to 25, for one fix at a time (its Fmax is the block's own; in the core, routes
to the other blocks are longer). ``--multiplier ecp5`` builds with the instantiated
``MULT18X18D`` (the ``ulx3s`` preset's), as the board build does.

Figures go to ``build/core_timing/<block>-<config>-<multiplier>-<clock>MHz-seed<n>/
figures.json``; the build's files (``top.il``, ``top.ys``, ``top.rpt`` yosys log, ``top.tim``
nextpnr log, ``top.report.json``, ``top.sdf``) are in the same folder.

The constraint: Amaranth names the constrained clock net after a submodule the clock reaches,
a name synthesis may not keep; nextpnr then warns and derives the constraint from the PLL's
output frequency, which is the clock asked for whenever the PLL reaches it (150 MHz = 25 MHz
x 6 does). The constraint printed is the one nextpnr used.

The harness
-----------
The core's host ports are far wider than the package's pins (8x8: two 256-bit beats), so, as
:class:`boards.synth_harness.SynthHarness` does for the array alone:

- every core input (``i_host`` valid and payload, ``o_host.ready``, ``i_clear``) is a bit of
  one shift register fed from a button pin, so none is constant and nothing is optimised away;
- every core output (``o_host`` valid and payload, ``i_host.ready``, ``o_status``) is folded
  into an LED pin by a tree of registered 4-input XORs (``o_activity`` is left unconnected, as
  on a board, where synthesis drops it);
- the clock comes from the 25 MHz oscillator through an ``EHXPLLL``, as in the board build,
  and is constrained to ``--clock`` (``platform.add_clock_constraint`` on the PLL output);
- the reset (a button, or the PLL not yet locked) is synchronised by two flip-flops and, with
  ``--global-reset`` (the default), driven onto a global network through a ``DCCA``:
  nextpnr-ecp5 promotes only clocks, and a reset routed in the fabric to the core's
  thousands of flip-flops would measure the reset net, not the core.

Every harness path is register to register through at most one LUT, so the harness does not
set Fmax. The core's inputs come straight from flip-flops and its outputs go straight into
flip-flops: paths that start or end at the core's ports include none of a host link's logic.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from amaranth.hdl import ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from boards.build import BuildError, clock_critical_path, prepare, run_plan
from boards.timing import sdf_worst_paths
from hdl.config import TPUConfig
from hdl.presets import get_config

__all__ = ["CoreTimingHarness", "shift_in", "fold_out", "pll_params", "build", "main"]

BUILD_DIR = Path("build") / "core_timing"
OSC_MHZ = 25.0

#: nextpnr-ecp5 cell types for the resource summary, in print order.
RESOURCES = (("LUT4", "TRELLIS_COMB"), ("FF", "TRELLIS_FF"), ("MULT18", "MULT18X18D"),
             ("DP16KD", "DP16KD"), ("ALU54B", "ALU54B"), ("DCCA", "DCCA"),
             ("EHXPLLL", "EHXPLLL"))


# Harness ---------------------------------------------------------------------------------

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


def pll_params(f_in_mhz: float, f_out_mhz: float) -> dict[str, Any]:
    """``EHXPLLL`` dividers for the output clock closest to *f_out_mhz* (CLKOP feedback):
    ``f_out = f_in * CLKFB_DIV / CLKI_DIV``, VCO ``f_out * CLKOP_DIV`` in 400..800 MHz, PFD
    ``f_in / CLKI_DIV`` in 3.125..400 MHz (the ranges ``ecppll`` uses)."""
    best = None
    for clki in range(1, 129):
        pfd = f_in_mhz / clki
        if not 3.125 <= pfd <= 400:
            continue
        for clkfb in range(1, 81):
            f_out = pfd * clkfb
            for clkop in range(1, 129):
                vco = f_out * clkop
                if not 400 <= vco <= 800:
                    continue
                error = abs(f_out - f_out_mhz)
                if best is None or error < best[0] - 1e-9:
                    best = (error, clki, clkfb, clkop, f_out)
                break
    if best is None:
        raise ValueError(f"no EHXPLLL setting gives {f_out_mhz} MHz from {f_in_mhz} MHz")
    _, clki, clkfb, clkop, f_out = best
    return {"CLKI_DIV": clki, "CLKFB_DIV": clkfb, "CLKOP_DIV": clkop,
            "CLKOP_CPHASE": clkop - 1, "f_out_mhz": f_out}


#: Blocks ``--block`` builds on their own (faster than the whole core, for one fix at a
#: time): name -> the component for a config.
def _blocks() -> dict[str, Any]:
    from hdl.control.front_end import FrontEnd
    from hdl.control.hazards import HazardTracker
    from hdl.control.matrix_engine import MatrixEngine
    from hdl.core import Core
    from hdl.datapath.accumulators import Accumulators
    from hdl.datapath.activation import ActivationUnit
    from hdl.memory.unified_buffer import UnifiedBuffer

    return {
        "core": Core,
        "activation": lambda cfg: ActivationUnit(cols=cfg.cols, acc_width=cfg.acc_width,
                                                 multiplier=cfg.multiplier),
        "accumulators": lambda cfg: Accumulators(depth=cfg.acc_depth, cols=cfg.cols,
                                                 acc_width=cfg.acc_width),
        "unified_buffer": lambda cfg: UnifiedBuffer(depth=cfg.ub_depth, row_elems=cfg.ub_row,
                                                    data_width=cfg.data_width),
        "front_end": FrontEnd,
        "hazards": lambda cfg: HazardTracker(),
        "matrix_engine": MatrixEngine,
    }


BLOCKS = ("core", "activation", "accumulators", "unified_buffer", "front_end", "hazards",
          "matrix_engine")


class CoreTimingHarness(Elaboratable):
    """A component (by default :class:`hdl.core.Core`) fed from one pin and observed on one
    pin, on a PLL clock.

    Every input port of the component's signature is driven from the shift register, every
    output port is folded into the output pin, except the core's ``o_activity`` (coverage
    taps, unconnected on a board).

    Parameters
    ----------
    config : TPUConfig
        Configuration of the core.
    clock_mhz : float
        Constraint on the core clock (the PLL is set as close to it as it gets).
    global_reset : bool
        Drive the synchronised reset through a ``DCCA`` global buffer.
    block : str
        Which component (:data:`BLOCKS`) to build.
    """

    def __init__(self, config: TPUConfig, *, clock_mhz: float, global_reset: bool = True,
                 block: str = "core"):
        if block not in BLOCKS:
            raise ValueError(f"block {block!r} is not supported; allowed: {', '.join(BLOCKS)}")
        self.config = config
        self.clock_mhz = clock_mhz
        self.pll = pll_params(OSC_MHZ, clock_mhz)
        self.global_reset = global_reset
        self.block = block

    def elaborate(self, platform):
        from amaranth.hdl import Value
        from amaranth.lib.wiring import Flow

        m = Module()
        m.submodules.clk25 = clk25 = io.Buffer("i", platform.request("clk25", 0, dir="-"))
        m.submodules.btn = btn = io.Buffer("i", platform.request("button_fire", 0, dir="-"))
        m.submodules.din = din = io.Buffer("i", platform.request("button_fire", 1, dir="-"))
        m.submodules.dout = dout = io.Buffer("o", platform.request("led", 0, dir="-"))

        # The PLL drives the domain's clock signal itself, which keeps its name through
        # synthesis: the LPF constrains it by that name. The constraint is the clock asked
        # for, not the PLL's nearest: Fmax is what is measured here.
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.por = cd_por = ClockDomain("por", reset_less=True)
        clk = cd_sync.clk
        locked = Signal(name="pll_locked")
        pll = self.pll
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{OSC_MHZ:g}",
            a_FREQUENCY_PIN_CLKOP=f"{pll['f_out_mhz']:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
            p_CLKI_DIV=pll["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=pll["CLKOP_DIV"], p_CLKOP_CPHASE=pll["CLKOP_CPHASE"],
            p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=pll["CLKFB_DIV"],
            i_RST=0, i_STDBY=0, i_CLKI=clk25.i, i_CLKFB=clk,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clk, o_LOCK=locked,
        )
        platform.add_clock_constraint(clk, self.clock_mhz * 1e6)
        m.d.comb += cd_por.clk.eq(clk)
        rst_meta = Signal(init=1)
        rst_sync = Signal(init=1)
        m.d.por += [rst_meta.eq(btn.i | ~locked), rst_sync.eq(rst_meta)]
        if self.global_reset:
            rst_global = Signal()
            m.submodules.rst_dcc = Instance("DCCA", i_CLKI=rst_sync, i_CE=1, o_CLKO=rst_global)
            m.d.comb += cd_sync.rst.eq(rst_global)
        else:
            m.d.comb += cd_sync.rst.eq(rst_sync)

        dut = _blocks()[self.block](self.config)
        m.submodules[self.block] = dut
        inputs, outputs = [], []
        for path, member, value in dut.signature.flatten(dut):
            if path[0] == "o_activity":
                continue
            bits = Value.cast(value)
            (inputs if member.flow == Flow.In else outputs).append(bits)
        shift_in(m, inputs, din.i)
        m.d.comb += dout.o.eq(fold_out(m, [bit for value in outputs for bit in value]))
        return m


# Build -----------------------------------------------------------------------------------

def build(config: TPUConfig, *, clock_mhz: float, seed: int, work: Path,
          global_reset: bool = True, block: str = "core") -> dict[str, Any]:
    """Synthesise, place and route the harnessed core in *work*; the figures."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    platform = ULX3S_85F_Platform()
    harness = CoreTimingHarness(config, clock_mhz=clock_mhz, global_reset=global_reset,
                                block=block)
    started = time.monotonic()
    # (Amaranth names the constrained net after one of the submodules the clock reaches, a
    # name synthesis may not keep; nextpnr then warns and derives the constraint from the
    # PLL: its output frequency, which is the clock asked for whenever the PLL reaches it.
    # The constraint reported is the one nextpnr used.)
    plan = prepare(platform, harness, name="top",
                   nextpnr_opts=f"--sdf top.sdf --seed {seed} --timing-allow-fail")
    elaborate_s = time.monotonic() - started
    try:
        run_plan(plan, work)
    except BuildError as error:
        raise SystemExit(f"bench.core_timing: {error}") from None
    total_s = time.monotonic() - started
    report = json.loads((work / "top.report.json").read_text())
    fmax = report.get("fmax", {})
    if not fmax:
        raise SystemExit(f"bench.core_timing: {work / 'top.report.json'} has no clock")
    clock = min(fmax.values(), key=lambda entry: entry["achieved"])
    util = report.get("utilization", {})
    figures: dict[str, Any] = {
        "config": config.to_dict(),
        "block": block,
        "clock_mhz": clock_mhz,
        "pll_mhz": harness.pll["f_out_mhz"],
        "seed": seed,
        "global_reset": global_reset,
        "fmax_mhz": round(float(clock["achieved"]), 2),
        "constraint_mhz": round(float(clock["constraint"]), 2),
        "met": float(clock["achieved"]) >= float(clock["constraint"]),
        "resources": {label: [util.get(cell, {}).get("used", 0),
                              util.get(cell, {}).get("available", 0)]
                      for label, cell in RESOURCES},
        "critical_path": _nextpnr_path(report),
        "elaborate_s": round(elaborate_s, 1),
        "build_s": round(total_s, 1),
        "work_dir": str(work),
    }
    sdf_path = work / "top.sdf"
    if sdf_path.exists():
        period_ns = 1000.0 / clock_mhz
        figures["paths"] = sdf_worst_paths(sdf_path, period_ns=period_ns, count=40)
    (work / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def _nextpnr_path(report: dict) -> dict[str, Any] | None:
    """The clock-to-clock critical path of a nextpnr ``--report``."""
    steps = clock_critical_path(report)
    if steps is None:
        return None
    hops = []
    for step in steps:
        if step["type"] in ("clk-to-q", "logic", "setup", "routing"):
            hops.append({"type": step["type"], "from": f'{step["from"]["cell"]}.'
                                                        f'{step["from"]["port"]}',
                         "to": f'{step["to"]["cell"]}.{step["to"]["port"]}',
                         "net": step.get("net"), "delay_ns": round(step["delay"], 3)})
    logic = sum(s["delay"] for s in steps if s["type"] != "routing")
    routing = sum(s["delay"] for s in steps if s["type"] == "routing")
    return {"total_ns": round(logic + routing, 3), "logic_ns": round(logic, 3),
            "routing_ns": round(routing, 3), "hops": hops}


# Report ----------------------------------------------------------------------------------

def _short(name: str, width: int = 70) -> str:
    name = name.replace("\\", "")
    for prefix in ("core.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name if len(name) <= width else name[:width - 24] + "..." + name[-21:]


def _condensed(hops: list[dict]) -> list[tuple[str, float, int, dict]]:
    """The cell hops of a path, a run of carry-chain hops (``FCI`` -> ``FCO``) as one."""
    out: list[tuple[str, float, int, dict]] = []
    for hop in hops:
        if hop["type"] == "routing":
            continue
        carry = hop["from"].endswith(".FCI") and hop["to"].endswith(".FCO")
        if carry and out and out[-1][0] == "carry":
            kind, delay, count, first = out[-1]
            out[-1] = (kind, delay + hop["delay_ns"], count + 1, first)
        else:
            out.append(("carry" if carry else hop["type"], hop["delay_ns"], 1, hop))
    return out


def format_report(fig: dict[str, Any], *, paths: int) -> str:
    cfg = fig["config"]
    what = "whole core" if fig.get("block", "core") == "core" else f"block {fig['block']} of"
    lines = [f"== {what} {cfg['rows']}x{cfg['cols']} (multiplier "
             f"{cfg.get('multiplier', 'infer')}) on ULX3S 85F (LFE5U-85F-6 CABGA381), "
             f"seed {fig['seed']} ==",
             f"  Fmax      {fig['fmax_mhz']:.2f} MHz against {fig['constraint_mhz']:g} MHz: "
             f"{'MET' if fig['met'] else 'NOT MET'} "
             f"({100 * (fig['fmax_mhz'] / fig['constraint_mhz'] - 1):+.1f}%)"]
    for label, (used, avail) in fig["resources"].items():
        if used or label in ("LUT4", "FF", "MULT18", "DP16KD"):
            share = f" ({100 * used / avail:.1f}%)" if avail else ""
            lines.append(f"  {label:<9} {used:,} / {avail:,}{share}")
    path = fig.get("critical_path")
    if path:
        lines.append(f"  critical path (nextpnr): {path['total_ns']:.2f} ns "
                     f"({path['logic_ns']:.2f} logic, {path['routing_ns']:.2f} routing)")
        for kind, delay, count, first in _condensed(path["hops"]):
            if kind == "carry":
                lines.append(f"    carry    {delay:5.2f} ns  {count} carry cells after "
                             f"{_short(first['from'])}")
            else:
                lines.append(f"    {kind:<8} {delay:5.2f} ns  {_short(first['from'])} -> "
                             f"{first['to'].rpartition('.')[2]}")
    if fig.get("paths") and paths:
        lines.append(f"  worst paths into {paths} different registers (SDF static timing, no "
                     f"clock skew):")
        for entry in fig["paths"][:paths]:
            lines.append(f"    {entry['delay_ns']:5.2f} ns (slack {entry['slack_ns']:+.2f}) "
                         f"{entry['cells']:2d} cells  {_short(entry['from_group'], 50)} -> "
                         f"{_short(entry['to_group'], 50)}")
    lines.append(f"  build {fig['build_s']:.0f} s; files in {fig['work_dir']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core_timing",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="preset or RxC (default: default)")
    parser.add_argument("--multiplier", default=None,
                        help="TPUConfig.multiplier to build with: infer, or ecp5 (the "
                             "instantiated MULT18X18D of the ulx3s preset)")
    parser.add_argument("--clock", type=float, default=150.0,
                        help="core clock constraint, MHz (default 150)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr seed (default 1)")
    parser.add_argument("--block", choices=BLOCKS, default="core",
                        help="build one block alone in the harness (default: the whole core)")
    parser.add_argument("--paths", type=int, default=12,
                        help="worst paths to distinct registers to print (default 12)")
    parser.add_argument("--no-global-reset", action="store_true",
                        help="route the reset in the fabric instead of a DCCA global")
    parser.add_argument("--out", type=Path, default=BUILD_DIR,
                        help=f"output folder (default {BUILD_DIR})")
    args = parser.parse_args(argv)
    config = get_config(args.config)
    if args.multiplier is not None:
        config = config.replace(multiplier=args.multiplier)
    tag = f"{args.block}-{config.name}-{config.multiplier}-{args.clock:g}MHz-seed{args.seed}"
    fig = build(config, clock_mhz=args.clock, seed=args.seed,
                work=(args.out / tag).resolve(), global_reset=not args.no_global_reset,
                block=args.block)
    print(format_report(fig, paths=args.paths))
    return 0 if fig["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
