"""The main job: a quantised matrix multiply on the simulated RTL core.

    python -m bench.gemm [--config default] [--size 64] [--sim icarus]

Compiles ``relu(requantise(X @ W))`` for random int8 ``X``, ``W`` (``size x size``) with
``firmware.gemm``, streams the program into the RTL core under cocotb, checks every result
byte against the ISA simulator and numpy (the run fails otherwise), and prints the core's
performance counters for the matrix phase in TPU v1's Table 3 categories.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hdl.config import get_config
from hdl.core import Core
from sim.runner import run

TESTS = Path(__file__).resolve().parent.parent / "tests" / "hdl"


def measure(config_key: str, size: int, sim: str | None = None) -> dict:
    config = get_config(config_key)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gemm.json"
        run("core", lambda: Core(config), config_key, "tb_core", TESTS, "test_gemm",
            sim=sim, config=config, extra_env={"AMTPU_GEMM_SIZE": str(size),
                                      "AMTPU_BENCH_OUT": str(out)})
        return json.loads(out.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--sim", default=None, help="icarus or verilator (default: $SIM or "
                                                     "icarus)")
    args = parser.parse_args(argv)
    r = measure(args.config, args.size, args.sim)
    c = r["counters"]
    cfg = get_config(args.config)
    cycles = c["cycles"]
    print(f"{args.size}x{args.size} @ {args.size}x{args.size} int8 GEMM, requantised + ReLU, "
          f"on the {r['config']} core (seed {r['seed']}): result equals the ISA simulator "
          f"and numpy")
    print(f"matrix phase, from the core's counters ({cycles} cycles):")
    for name, value in c.items():
        share = f"{100 * value / cycles:6.1f} %" if name not in (
            "useful_macs", "instructions", "cycles") else ""
        print(f"  {name:<13} {value:>10} {share}")
    print(f"  useful MACs / (rows*cols*cycles) = "
          f"{100 * c['useful_macs'] / (cfg.rows * cfg.cols * cycles):.1f} %")
    print("reference: TPU v1 array active 12.7/10.6 % (MLP0/1), 8.2/10.5 % (LSTM0/1), "
          "78.2/46.2 % (CNN0/1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
