"""The project's formal proofs, in one table; ``python -m sim.proofs`` runs them.

Each entry of :data:`PROOFS` is a :class:`sim.formal.Proof`: a harness factory, the mode
(``prove``: k-induction, unbounded; ``bmc``: bounded) and the depth. To add a proof, write a
harness factory in a module of this package (see :mod:`sim.proofs.pe`) and register it here.

Usage::

    python -m sim.proofs                 # every proof, as registered
    python -m sim.proofs pe weight_fifo  # some of them (names or prefixes)
    python -m sim.proofs --fast          # each as a short BMC, as the tests run them
    python -m sim.proofs --list
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from pathlib import Path

from hdl.config import PRESETS

from ..formal import FORMAL_ROOT, Proof, Result, run
from .pe import pe_harness
from .weight_fifo import weight_fifo_harness

__all__ = ["PROOFS", "FAST_DEPTH", "run_proof", "main"]

#: BMC depth of the fast form (tests, ``--fast``): past the PE's 3-cycle pipeline and a
#: whole 2-row tile through the FIFO.
FAST_DEPTH = 8


def _fifo(preset: str):
    cfg = PRESETS[preset]
    return functools.partial(weight_fifo_harness, rows=cfg.rows, cols=cfg.cols,
                             data_width=cfg.data_width, depth=cfg.weight_fifo_depth)


def _table(*proofs: Proof) -> dict[str, Proof]:
    return {proof.name: proof for proof in proofs}


#: Every proof, by name.
PROOFS: dict[str, Proof] = _table(
    Proof("pe", functools.partial(pe_harness, data_width=8, acc_width=32), "prove", 6,
          "PE 8/32 (DSP multiplier): o_psum = i_psum + a*w with its timing; weight switch"),
    # Depth 2: induction closes at k=1, and each further base-case step is another 9x9
    # multiplier equivalence (~40 s).
    Proof("pe_lut", functools.partial(pe_harness, data_width=8, acc_width=32, use_dsp=False),
          "prove", 2,
          "PE 8/32, shift-and-add multiplier: as pe, so the LUT multiplier equals `*`",
          fast_harness=functools.partial(pe_harness, data_width=4, acc_width=8,
                                         use_dsp=False)),
    Proof("weight_fifo_tiny", _fifo("tiny"), "prove", 6,
          "WeightFIFO 2x2, 4 tiles: counts, whole tiles, no gaps, order, stream rules"),
    Proof("weight_fifo_odd", functools.partial(weight_fifo_harness, rows=3, cols=1,
                                               data_width=8, depth=3), "prove", 6,
          "WeightFIFO 3 rows x 3 tiles (a capacity that is not a power of two): as above"),
    Proof("weight_fifo", _fifo("default"), "prove", 6,
          "WeightFIFO 8x8, 4 tiles (the default configuration): as above"),
)


def run_proof(proof: Proof, *, fast: bool = False, build_root: Path = FORMAL_ROOT,
              timeout: int | None = None) -> Result:
    """Run *proof* as registered, or (``fast``) as a BMC of :data:`FAST_DEPTH` cycles on its
    fast harness."""
    if fast:
        factory = proof.fast_harness or proof.harness
        return run(proof.name, factory(), mode="bmc", depth=FAST_DEPTH,
                   build_root=build_root, timeout=timeout)
    return run(proof.name, proof.harness(), mode=proof.mode, depth=proof.depth,
               build_root=build_root, timeout=timeout)


def _select(names: Sequence[str]) -> list[Proof]:
    if not names:
        return list(PROOFS.values())
    chosen = []
    for name in names:
        matches = [p for p in PROOFS.values() if p.name == name] or \
                  [p for p in PROOFS.values() if p.name.startswith(name)]
        if not matches:
            raise SystemExit(f"no proof named {name!r}; known: {', '.join(PROOFS)}")
        chosen += [p for p in matches if p not in chosen]
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proofs; exit status 1 if any is not proved (or, bounded, not passed)."""
    parser = argparse.ArgumentParser(prog="python -m sim.proofs", description=__doc__.split(
        "\n")[0])
    parser.add_argument("names", nargs="*", help="proofs to run (names or prefixes); all")
    parser.add_argument("--fast", action="store_true",
                        help=f"each as a BMC of {FAST_DEPTH} cycles (what the tests run)")
    parser.add_argument("--list", action="store_true", help="list the proofs and exit")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per proof")
    args = parser.parse_args(argv)
    proofs = _select(args.names)
    if args.list:
        for proof in proofs:
            print(f"{proof.name:<22} {proof.mode} depth {proof.depth:<3} {proof.summary}")
        return 0
    start = time.monotonic()
    failures = 0
    for proof in proofs:
        print(f"{proof.name}: {proof.summary}", flush=True)
        result = run_proof(proof, fast=args.fast, timeout=args.timeout)
        print(result.report(), flush=True)
        failures += not result.ok
    total = time.monotonic() - start
    print(f"formal: {len(proofs) - failures}/{len(proofs)} passed in {total:.1f} s"
          f" (build/formal/<name>/)")
    return 1 if failures else 0
