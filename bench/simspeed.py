"""Simulated cycles per second of the cocotb benches, per simulator and array size.

    python -m bench.simspeed [--configs small default] [--sims icarus verilator]

Streams back-to-back tiles through the matrix unit (``bench/tb_stream.py``, every output
row checked) and divides the simulated cycles by the wall time of the streaming alone
(builds excluded). Compare with the measured figures in ../shared/TOOLCHAIN.md.
"""

from __future__ import annotations

import argparse

from bench.utilisation import measure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simspeed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["small", "default"])
    parser.add_argument("--sims", nargs="+", default=["icarus", "verilator"])
    parser.add_argument("--tiles", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args(argv)
    print(f"{'simulator':<10} {'array':<6} {'cycles':>7} {'wall s':>7} {'cycles/s':>9}")
    for sim in args.sims:
        for key in args.configs:
            r = measure(key, args.tiles, args.rows, sim)
            print(f"{sim:<10} {r['config']:<6} {r['cycles_with_fill_and_drain']:>7} "
                  f"{r['wall_seconds']:>7.2f} {r['cycles_per_second']:>9.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
