"""A quantised matrix multiply on the simulated RTL core, through the runtime.

    python -m bench.gemm [--config default] [--size 64] [--sim verilator]

Compiles ``relu(requantise(X @ W))`` for random int8 ``X``, ``W`` (``size x size``, seed
2026) with :mod:`firmware.gemm`, runs it on the RTL core through
:class:`firmware.transports.rtl.RtlDevice`, checks every result byte against the ISA
simulator and numpy (the run fails otherwise), and prints the core's performance counters for
the matrix phase in TPU v1's Table 3 categories.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from firmware.device import open_device
from firmware.gemm import gemm_program, gemm_reference
from firmware.runtime import run_program
from firmware.transports.isa import IsaSimDevice
from hdl.isa import Func
from hdl.presets import get_config

SEED = 2026


def measure(config_key: str, size: int, sim: str = "verilator") -> dict:
    """Run the GEMM on the RTL core; returns its counters, wall time and exactness."""
    config = get_config(config_key)
    rng = np.random.default_rng(SEED)
    x = rng.integers(-128, 128, (size, size))
    w = rng.integers(-128, 128, (size, size))
    x[0, :] = -128                       # extremes: a row and a column at the limits
    w[:, 0] = -128
    kwargs = dict(bias=rng.integers(-2**16, 2**16, size),
                  multiplier=rng.integers(1, 2**15, size), shift=24, zero_point=-5,
                  func=Func.RELU)
    plan = gemm_program(config, x, w, measure=True, **kwargs)
    expected = run_program(IsaSimDevice(config), plan.beats, plan.output_beats,
                           instructions=plan.instructions)
    t0 = time.perf_counter()
    with open_device("rtl", config, sim=sim) as device:
        t1 = time.perf_counter()
        out = run_program(device, plan.beats, plan.output_beats,
                          instructions=plan.instructions)
        t2 = time.perf_counter()
        simulated = device.cycles()
    exact = all(e is None or e == o for e, o in zip(expected, out, strict=True))
    result = plan.decode(out)
    exact = exact and bool(np.array_equal(result, gemm_reference(x, w, **kwargs)))
    return {"config": config.name, "size": size, "seed": SEED, "sim": sim,
            "counters": plan.counters(out), "exact": exact, "start_s": t1 - t0,
            "run_s": t2 - t1, "simulated_cycles": simulated}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    args = parser.parse_args(argv)
    r = measure(args.config, args.size, args.sim)
    c = r["counters"]
    cfg = get_config(args.config)
    cycles = c["cycles"]
    print(f"{args.size}x{args.size} @ {args.size}x{args.size} int8 GEMM, requantised + ReLU, "
          f"on the {r['config']} core (seed {r['seed']}, {args.sim}): result "
          f"{'equals' if r['exact'] else 'DIFFERS FROM'} the ISA simulator and numpy")
    print(f"matrix phase, from the core's counters ({cycles} cycles):")
    for name, value in c.items():
        share = f"{100 * value / cycles:6.1f} %" if name not in (
            "useful_macs", "instructions", "cycles") else ""
        print(f"  {name:<13} {value:>10} {share}")
    print(f"  useful MACs / (rows*cols*cycles) = "
          f"{100 * c['useful_macs'] / (cfg.rows * cfg.cols * cycles):.1f} %")
    print("reference: TPU v1 array active 12.7/10.6 % (MLP0/1), 8.2/10.5 % (LSTM0/1), "
          "78.2/46.2 % (CNN0/1)")
    print(f"wall: simulator start {r['start_s']:.1f} s, run {r['run_s']:.2f} s for "
          f"{r['simulated_cycles']:,} simulated cycles")
    return 0 if r["exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
