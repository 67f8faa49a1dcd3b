"""Simulated core cycles per second of the RTL transport over a whole program.

    python -m bench.transport [--config default] [--size 64] [--sim verilator icarus]
                              [--repeat 3] [--fresh-build]

Runs the measured ``size x size`` GEMM of :mod:`firmware.gemm` (requantised, ReLU) on the RTL
core through :class:`firmware.transports.rtl.RtlDevice` and divides the core cycles the
program took (``RtlDevice.cycles()``) by the wall time of ``send`` + ``receive``: loading the
program's beats into the bridge, the run, and reading every answer back. The build (once per
design, cached under ``build/``) and the simulator's start are reported separately. The
first run pays for creating the simulator's handles of the bridge's memories; the later ones
are the steady state. Every run's beats must equal the ISA simulator's (``None`` for its
timing-dependent counters) and the result numpy's, or the bench fails.

The old path, cocotb stepping Python every cycle (``python -m bench.gemm``), did about 4,300
cycles/s on Verilator and 850 on Icarus for the same program on the 8x8 core.
"""

from __future__ import annotations

import argparse
import shutil
import time

import numpy as np

from firmware.gemm import gemm_program, gemm_reference
from firmware.transports.isa import IsaSimDevice
from firmware.transports.rtl import RtlDevice, design
from hdl.isa import Func
from hdl.presets import get_config
from sim.rtl.verilog import locked


def measure(config_key: str, size: int, sim: str, repeat: int = 3,
            fresh_build: bool = False) -> dict:
    """Run the GEMM ``repeat`` times on one device; returns the figures."""
    config = get_config(config_key)
    rng = np.random.default_rng(2026)
    x = rng.integers(-128, 128, (size, size))
    w = rng.integers(-128, 128, (size, size))
    kwargs = dict(bias=rng.integers(-2**16, 2**16, size),
                  multiplier=rng.integers(1, 2**15, size), shift=24, zero_point=-5,
                  func=Func.RELU)
    plan = gemm_program(config, x, w, measure=True, **kwargs)
    expected = gemm_reference(x, w, **kwargs)
    ref = IsaSimDevice(config)
    ref.send(plan.beats)
    reference = ref.receive(plan.output_beats)

    if fresh_build:
        _, build_dir, _ = design(config, sim=sim)
        with locked(build_dir.with_name(f".{build_dir.name}.lock")):
            shutil.rmtree(build_dir)
    runs = []
    with RtlDevice(config, sim=sim, label=f"bench-transport-{config_key}") as dev:
        for _ in range(repeat):
            start_cycles = dev.cycles()
            start = time.perf_counter()
            dev.send(plan.beats)
            out = dev.receive(plan.output_beats)
            wall = time.perf_counter() - start
            cycles = dev.cycles() - start_cycles
            bad = [i for i, (e, g) in enumerate(zip(reference, out, strict=True))
                   if e is not None and e != g]
            if bad or not np.array_equal(plan.decode(out), expected):
                raise AssertionError(f"{sim}: beat {bad[0] if bad else '?'} differs from the "
                                     f"ISA simulator's, or the result from numpy's")
            runs.append({"cycles": cycles, "wall": wall, "rate": cycles / wall,
                         "counters": plan.counters(out)})
        build, start_time = dev.build_seconds, dev.start_seconds
    return {"sim": sim, "config": config.name, "size": size, "beats_in": len(plan.beats),
            "beats_out": plan.output_beats, "build_seconds": build,
            "start_seconds": start_time, "runs": runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--sim", nargs="+", default=["verilator", "icarus"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fresh-build", action="store_true",
                        help="delete the simulator build first, so the build time is a real one "
                             "(the Verilog stays cached)")
    args = parser.parse_args(argv)
    for sim in args.sim:
        r = measure(args.config, args.size, sim, args.repeat, args.fresh_build)
        print(f"{sim}: {r['size']}x{r['size']} GEMM on the {r['config']} core "
              f"({r['beats_in']} beats in, {r['beats_out']} out), every beat equal to the "
              f"ISA simulator's")
        print(f"  build {r['build_seconds']:.1f} s"
              f"{'' if args.fresh_build else ' (cached unless the design changed)'}, "
              f"simulator start {r['start_seconds']:.2f} s")
        for i, run in enumerate(r["runs"]):
            print(f"  run {i + 1}: {run['cycles']:>7} core cycles in {run['wall']:7.3f} s = "
                  f"{run['rate']:>9,.0f} cycles/s"
                  f"{'  (first: memory handles created)' if i == 0 else ''}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
