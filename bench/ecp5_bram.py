"""How fast an ECP5 block RAM's read data arrives: a DP16KD without and with its output
register, on the ULX3S's LFE5U-85F-6.

    python -m bench.ecp5_bram [--mhz 250] [--seed 1]

Builds, for each ``REGMODE`` (``NOREG``: yosys's inferred memories, which never use the output
register; ``OUTREG``: the register inside the block, a cycle more of read latency), a DP16KD
(1024 x 18, read on port A, written on port B, every input from a flip-flop) whose read data
goes straight into flip-flops, and places and routes it out of context (``--out-of-context``:
no pins, no global clock promotion) at a clock it cannot meet, so that nextpnr reports the
fastest it reached. Prints the block's clock-to-output and the Fmax of each. Build files in
``build/bench/ecp5-bram/<regmode>/``.

The figure sets a floor on the core's ULX3S clock: every path from an inferred block RAM
starts with its clock-to-output, so none can run faster than that plus one route into a
flip-flop.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from boards.nextpnr import clock_critical_path, clock_fmax
from boards.tools import run_timed, tool_env

__all__ = ["BramRead", "measure", "main"]

REGMODES = ("NOREG", "OUTREG")
OUT_DIR = Path("build") / "bench" / "ecp5-bram"


class BramRead(wiring.Component):
    """A DP16KD, 1024 x 18, read data into flip-flops; every input registered."""

    def __init__(self, regmode: str):
        self.regmode = regmode
        super().__init__({"ra": In(10), "wa": In(10), "wd": In(18), "we": In(1),
                          "q": Out(18)})

    def elaborate(self, platform):
        m = Module()
        ra, wa, wd, we = (Signal.like(s, name=f"{n}_q") for n, s in
                          (("ra", self.ra), ("wa", self.wa), ("wd", self.wd), ("we", self.we)))
        m.d.sync += [ra.eq(self.ra), wa.eq(self.wa), wd.eq(self.wd), we.eq(self.we)]
        do = Signal(18)
        zero = {f"i_{p}": 0 for p in ("WEA", "RSTA", "RSTB", "CSA0", "CSA1", "CSA2",
                                      "CSB0", "CSB1", "CSB2",
                                      "ADA0", "ADA1", "ADA2", "ADA3",
                                      "ADB0", "ADB1", "ADB2", "ADB3")}
        one = {f"i_{p}": 1 for p in ("CEA", "OCEA", "CEB", "OCEB")}
        addr = {**{f"i_ADA{4 + i}": ra[i] for i in range(10)},
                **{f"i_ADB{4 + i}": wa[i] for i in range(10)}}
        data = {**{f"o_DOA{i}": do[i] for i in range(18)},
                **{f"i_DIB{i}": wd[i] for i in range(18)}}
        m.submodules.ram = Instance(
            "DP16KD", p_DATA_WIDTH_A=18, p_DATA_WIDTH_B=18,
            p_REGMODE_A=self.regmode, p_REGMODE_B=self.regmode,
            i_CLKA=ClockSignal("sync"), i_CLKB=ClockSignal("sync"), i_WEB=we,
            **zero, **one, **addr, **data)
        m.d.sync += self.q.eq(do)
        return m


def measure(regmode: str, *, mhz: float = 250.0, seed: int = 1) -> dict:
    """Synthesise, place and route :class:`BramRead`; returns ``{"regmode", "fmax_mhz",
    "from", "clk_to_out_ns", "path_ns"}``: nextpnr's critical path, the cell it starts at and
    that cell's clock to output."""
    if regmode not in REGMODES:
        raise ValueError(f"regmode {regmode!r}; allowed: {', '.join(REGMODES)}")
    out = OUT_DIR / regmode.lower()
    out.mkdir(parents=True, exist_ok=True)
    component = BramRead(regmode)
    (out / "top.v").write_text(verilog.convert(component, name="top"))
    env = tool_env()
    for tool, argv in (("yosys", [env["YOSYS"], "-q", "-p",
                                  "read_verilog top.v; synth_ecp5 -top top -json top.json"]),
                       ("nextpnr", [env["NEXTPNR_ECP5"], "--85k", "--package", "CABGA381",
                                    "--speed", "6", "--out-of-context", "--json", "top.json",
                                    "--freq", str(mhz), "--seed", str(seed),
                                    "--timing-allow-fail", "--report", "report.json"])):
        log = out / f"{tool}.log"
        if run_timed(argv, cwd=out, log=log, env=env).returncode:
            raise RuntimeError(f"{tool} failed; its log: {log}")
    report = json.loads((out / "report.json").read_text())
    fmax, _ = clock_fmax(report)
    path = clock_critical_path(report)
    start = path[0]
    return {"regmode": regmode, "fmax_mhz": round(fmax, 2), "from": start["from"]["cell"],
            "clk_to_out_ns": round(start["delay"], 2),
            "path_ns": round(sum(step["delay"] for step in path), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ecp5_bram", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mhz", type=float, default=250.0,
                        help="clock asked of nextpnr (default 250, above both)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print("LFE5U-85F-6, DP16KD 1024 x 18 read into flip-flops, out of context")
    print(f"{'REGMODE':8} {'critical path':>14} {'from':>6} {'clock to output':>16} "
          f"{'Fmax':>11}")
    for regmode in REGMODES:
        r = measure(regmode, mhz=args.mhz, seed=args.seed)
        start = "block" if r["from"] == "ram" else "fabric"
        print(f"{r['regmode']:8} {r['path_ns']:>11.2f} ns {start:>6} {r['clk_to_out_ns']:>13.2f} "
              f"ns {r['fmax_mhz']:>7.2f} MHz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
