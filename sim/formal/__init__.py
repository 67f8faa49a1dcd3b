"""The project's formal proofs, in one table; ``python -m sim.formal`` runs them.

Each entry of :data:`PROOFS` is a :class:`sim.formal.harness.Proof`: a harness factory, the mode
(``prove``: k-induction, unbounded; ``bmc``: bounded) and the depth. To add a proof, write a
harness factory in a module of this package (see :mod:`sim.formal.pe`) and register it here.

Usage::

    python -m sim.formal                 # every proof, as registered
    python -m sim.formal pe weight_fifo  # some of them (names or prefixes)
    python -m sim.formal --fast          # each in its fast form, as the tests run them
    python -m sim.formal --list
    python -m sim.formal -j 2            # two at a time (make formal does)
    python -m sim.formal pe --limit 600  # another time limit (0: none)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from amaranth.hdl import UnusedElaboratable

from hdl.config import TPUConfig
from hdl.control.hazards import MATMUL_SLOTS
from hdl.presets import PRESETS
from sim.formal.engines import (
    activation_engine_harness,
    host_writer_harness,
    matrix_engine_harness,
    weight_loader_harness,
    weight_mover_harness,
)
from sim.formal.front_end import front_end_stopped_harness, front_end_streams_harness
from sim.formal.harness import FORMAL_ROOT, Group, Proof, Result, run, stop_all
from sim.formal.hazards import hazards_harness
from sim.formal.pe import pe_harness
from sim.formal.rounding import rounding_harness
from sim.formal.weight_fifo import weight_fifo_harness
from sim.formal.windows import matrix_windows_harness

__all__ = ["PROOFS", "FAST_DEPTH", "SCRUB_FAST_DEPTH", "FAST_GROUP_SIZE", "run_proof",
           "fast_groups", "run_fast_group", "main"]

#: BMC depth of the fast form (tests, ``--fast``): past the PE's 3-cycle pipeline and a
#: whole 2-row tile through the FIFO.
FAST_DEPTH = 8


def _fifo(preset: str):
    cfg = PRESETS[preset]
    return functools.partial(weight_fifo_harness, rows=cfg.rows, cols=cfg.cols,
                             data_width=cfg.data_width, depth=cfg.weight_fifo_depth)


#: The control proofs' configuration: the "tiny" preset (2x2 array, 64-row memories).
CONTROL = PRESETS["tiny"]

#: The range width of the icebreaker preset's hazard tracker (its memories' rows and tiles).
ICEBREAKER_END_BITS = PRESETS["icebreaker"].range_end_bits
#: And its MATMUL slots.
ICEBREAKER_SLOTS = PRESETS["icebreaker"].matmul_slots
#: And its pipeline.
ICEBREAKER_PIPELINE = PRESETS["icebreaker"].pipeline

#: Their fast forms' and the tests': the smallest memories.
CONTROL_FAST = TPUConfig(rows=2, cols=2, ub_depth=16, acc_depth=16, weight_mem_tiles=2,
                         weight_fifo_depth=2, param_slots=2)

#: BMC depth that gets the front end and the matrix engine past their reset scrub of
#: 16-row memories (then a few instructions); for the tests.
SCRUB_FAST_DEPTH = 22


def _control(factory, name: str, summary: str, *, limit: int, depth: int = 4,
             fast_depth: int = 2, **changes) -> Proof:
    # The fast form is the induction itself on the small configuration: a few seconds,
    # where a BMC would need SCRUB_FAST_DEPTH cycles to see more than the reset scrub.
    # `changes`: configuration fields that differ from CONTROL's (and CONTROL_FAST's).
    config, fast = (c.replace(**changes) for c in (CONTROL, CONTROL_FAST))
    return Proof(name, functools.partial(factory, config), "prove", depth, summary,
                 fast_harness=functools.partial(factory, fast), fast_mode="prove",
                 fast_depth=fast_depth, limit=limit)


#: The window proofs' fast form: 3 rows and 4-element buffer rows, where a window starts
#: anywhere in its pair of rows (the tiny preset's 2 and 2, which the full form proves, start
#: a window at lane 0 of a row or lane 1 of the row before).
WINDOWS_FAST = CONTROL_FAST.replace(rows=3, cols=4, host_width=None)


def _windows(part: str, name: str, summary: str, *, limit: int) -> Proof:
    # On yices: a few seconds where z3 took minutes.
    harness = functools.partial(matrix_windows_harness, part=part)
    return Proof(name, functools.partial(harness, CONTROL), "prove", 2, summary,
                 fast_harness=functools.partial(harness, WINDOWS_FAST), fast_mode="prove",
                 fast_depth=2, solver="yices", limit=limit)


def _hazards(check: str, name: str, summary: str, *, limit: int, solver: str = "z3",
             end_bits: int | None = None, slots: int = MATMUL_SLOTS,
             slot: int | None = None) -> Proof:
    # The tracker at the ISA's 17 bits, or as a core builds it for its memories (`end_bits`,
    # see hazards_harness). The fast form is the same induction on a 5-bit tracker: a few
    # seconds, and a proof of that tracker (a BMC of the 17-bit one, with its fields kept
    # small, took up to 44 s and proved nothing past its depth).
    harness = functools.partial(hazards_harness, check, slots=slots, slot=slot)
    return Proof(name, functools.partial(harness, end_bits=end_bits), "prove", 2, summary,
                 fast_harness=functools.partial(harness, end_bits=5), fast_mode="prove",
                 fast_depth=2, solver=solver, limit=limit)


def _table(*proofs: Proof) -> dict[str, Proof]:
    return {proof.name: proof for proof in proofs}


#: Every proof, by name.
PROOFS: dict[str, Proof] = _table(
    Proof("pe", functools.partial(pe_harness, data_width=8, acc_width=32), "prove", 6,
          "PE 8/32 (DSP multiplier): o_psum = i_psum + a*w with its timing; weight switch",
          limit=120),
    # Depth 2: induction closes at k=1, and each further base-case step is another 9x9
    # multiplier equivalence (~40 s).
    Proof("pe_lut", functools.partial(pe_harness, data_width=8, acc_width=32, multiplier="lut"),
          "prove", 2,
          "PE 8/32, shift-and-add multiplier: as pe, so the LUT multiplier equals `*`",
          fast_harness=functools.partial(pe_harness, data_width=4, acc_width=8,
                                         multiplier="lut"), limit=600),
    # 8/32 did not finish in 3 minutes (the block's registers double the state the solver
    # tracks); the 8/32 PE is checked lock-step against the inferred one in simulation
    # (tests/hdl/test_pe_dsp.py).
    Proof("pe_ecp5", functools.partial(pe_harness, data_width=4, acc_width=16,
                                       multiplier="ecp5", pipelined=True), "prove", 6,
          "PE 4/16 on the ECP5 multiplier's registers with the fast pipeline's (the ULX3S "
          "preset's), i_en free: as pe, with the latency 7", limit=120),
    Proof("pe_lut_pipelined", functools.partial(pe_harness, data_width=4, acc_width=16,
                                                multiplier="lut", pipelined=True), "prove", 6,
          "PE 4/16, LUT multiplier with the fast pipeline's registers (a LUT product in a "
          "fast array), i_en free: as pe_ecp5", limit=120),
    Proof("rounding", rounding_harness, "prove", 4,
          "Activation unit's rounding stages: r + carry is HALF_UP, HALF_EVEN or TFLite's "
          "double rounding of any 64-bit product at any shift", fast_mode="bmc",
          fast_depth=4, limit=300),
    Proof("weight_fifo_tiny", _fifo("tiny"), "prove", 6,
          "WeightFIFO 2x2, 4 tiles: counts, whole tiles, no gaps, order, stream rules",
          limit=120),
    Proof("weight_fifo_odd", functools.partial(weight_fifo_harness, rows=3, cols=1,
                                               data_width=8, depth=3), "prove", 6,
          "WeightFIFO 3 rows x 3 tiles (a capacity that is not a power of two): as above",
          limit=120),
    Proof("weight_fifo", _fifo("default"), "prove", 6,
          "WeightFIFO 8x8, 4 tiles (the default configuration): as above", fast_depth=4,
          limit=120),
    Proof("weight_fifo_ring", functools.partial(weight_fifo_harness, rows=2, cols=1,
                                                data_width=4, depth=2, registered=True),
          "bmc", 14, "WeightFIFO 2 rows x 2 tiles with its output ring (pipeline='fast'): "
          "counts, whole tiles, no gaps, order, stream rules, for 14 cycles", limit=600),
    _control(weight_loader_harness, "weight_loader_streams",
             "WeightLoader: stream rules on o_wm.addr, o_weight; busy contract", limit=120),
    _control(matrix_engine_harness, "matrix_engine_streams",
             "MatrixEngine: stream rules on o_ub.addr, o_act, o_acc; MATMUL slots", limit=120),
    _control(activation_engine_harness, "activation_engine_streams",
             "ActivationEngine: stream rules on o_acc.addr, o_row, o_ub; busy contract", limit=120),
    _control(activation_engine_harness, "activation_engine_streams_serial",
             "ActivationEngine for the serial unit (its parameters a column at a time): as "
             "activation_engine_streams", activation_unit="serial", limit=120),
    _control(host_writer_harness, "host_writer_streams",
             "HostWriter: stream rules on o_ub.addr, o_host; busy contract", limit=120),
    _control(weight_mover_harness, "weight_mover_streams",
             "WeightMover (UB_TO_WEIGHTS): stream rules on o_ub.addr, o_wm; busy contract",
             limit=120),
    # MATMUL's reads and rows, window mode or not (sim/formal/windows.py): two proofs, the
    # second under the first's properties (as one, it took minutes).
    _windows("reads", "matrix_engine_reads",
             "MatrixEngine: a MATMUL reads rows ub_addr.. in order, window_rows of them "
             "(count without window), for any lane, step and stalls", limit=120),
    _windows("rows", "matrix_engine_windows",
             "MatrixEngine: row i into the array is elements lane + i*step.. of the rows read "
             "(a plain MATMUL's: row ub_addr + i), in order, each once; under "
             "matrix_engine_reads", limit=120),
    _control(front_end_streams_harness, "front_end_streams",
             "FrontEnd: stream rules on the dispatch streams, o_beat, the memory writes",
             limit=120),
    _control(front_end_stopped_harness, "front_end_stopped",
             "FrontEnd stopped on an error: no dispatch, no writes, one error beat", limit=120),
    _control(matrix_engine_harness, "matrix_engine_streams_icebreaker",
             f"MatrixEngine with pipeline={ICEBREAKER_PIPELINE!r} and {ICEBREAKER_SLOTS} MATMUL "
             f"slots (the icebreaker preset's): as matrix_engine_streams",
             pipeline=ICEBREAKER_PIPELINE, matmul_slots=ICEBREAKER_SLOTS, limit=120),
    _control(matrix_engine_harness, "matrix_engine_streams_compact",
             "MatrixEngine with pipeline='compact': as matrix_engine_streams",
             pipeline="compact", limit=120),
    _control(matrix_engine_harness, "matrix_engine_streams_fast",
             "MatrixEngine with pipeline='fast' (the ULX3S preset's: a MATMUL retires a cycle "
             "after its last write): as matrix_engine_streams", pipeline="fast", limit=120),
    _control(front_end_streams_harness, "front_end_streams_compact",
             "FrontEnd with pipeline='compact' (issues on last cycle's readiness): as "
             "front_end_streams", pipeline="compact", limit=120),
    _control(front_end_stopped_harness, "front_end_stopped_compact",
             "FrontEnd with pipeline='compact': as front_end_stopped", pipeline="compact",
             limit=120),
    _control(front_end_streams_harness, "front_end_streams_fast",
             "FrontEnd with pipeline='fast' (the ULX3S preset's: the engines' readies "
             "registered, the DONE and error beats too): as front_end_streams",
             pipeline="fast", fast_depth=3, limit=120),
    _control(front_end_stopped_harness, "front_end_stopped_fast",
             "FrontEnd with pipeline='fast': as front_end_stopped", pipeline="fast", limit=120),
    _control(weight_loader_harness, "weight_loader_streams_odd",
             "WeightLoader with 3 rows, pipeline='fast' (its counts scaled to rows a cycle "
             "after it takes the instruction): as weight_loader_streams",
             rows=3, pipeline="fast", limit=120),
    _control(front_end_streams_harness, "front_end_streams_odd",
             "FrontEnd with 3 rows, pipeline='fast' (LOAD_WEIGHTS scaled to rows in "
             "WEIGHT_SCALE): as front_end_streams", rows=3, pipeline="fast", fast_depth=3,
             limit=120),
    _hazards("rules", "hazards",
             "HazardTracker: RAW, WAR, WAW on a symbolic row (under the invariants below)",
             limit=300),
    _hazards("ring", "hazards_ring",
             "HazardTracker invariants: MATMUL slots' pointers and valid bits = the shadow's "
             "in-flight ring", limit=300),
    # A slot at a time (see hazards_harness's `slot`).
    *(_hazards("ring_ranges", f"hazards_ring_ranges{k}",
               f"HazardTracker invariants: MATMUL slot {k}'s ranges, while live (on "
               f"hazards_ring's ring)", limit=120, slot=k)
      for k in range(MATMUL_SLOTS)),
    _hazards("ranges", "hazards_ranges",
             "HazardTracker invariants: ACTIVATE, WRITE_HOST, READ_WEIGHTS ranges", limit=300),
    # no_rise on the tracker with word compares, late proves the trees equal them (see
    # sim/formal/hazards.py); each with the solver that finishes it first.
    _hazards("no_rise", "hazards_no_rise",
             "HazardTracker: hazard does not rise for a waiting instruction", solver="z3",
             limit=300),
    _hazards("late", "hazards_late",
             "HazardTracker: hazard_late is hazard a cycle later; its compare trees are `>`",
             solver="yices", limit=300),
    # The same six at the width and slots the icebreaker core builds the tracker with.
    *(_hazards(check, f"hazards_icebreaker{suffix}", f"HazardTracker at the icebreaker "
               f"preset's {ICEBREAKER_END_BITS} bits and {ICEBREAKER_SLOTS} MATMUL slots, "
               f"for ranges its memories hold: as {'hazards' + suffix}",
               end_bits=ICEBREAKER_END_BITS, slots=ICEBREAKER_SLOTS, limit=120,
               solver="yices" if check == "late" else "z3")
      for check, suffix in (("rules", ""), ("ring", "_ring"), ("ring_ranges", "_ring_ranges"),
                            ("ranges", "_ranges"),
                            ("no_rise", "_no_rise"), ("late", "_late"))),
)


def run_proof(proof: Proof, *, fast: bool = False, build_root: Path = FORMAL_ROOT,
              limit: float | None = 0) -> Result:
    """Run *proof* as registered, or (``fast``) as a BMC of :data:`FAST_DEPTH` cycles on its
    fast harness, within *limit* seconds: the proof's own limit unless given (``None``: no
    limit). Past it the result is ``TIMEOUT``."""
    if limit == 0:
        limit = proof.limit
    rerun = f"python -m sim.formal {proof.name}{' --fast' if fast else ''}"
    if fast:
        factory = proof.fast_harness or proof.harness
        return run(proof.name, factory(), mode=proof.fast_mode,
                   depth=proof.fast_depth or FAST_DEPTH, build_root=build_root,
                   limit=limit, solver=proof.fast_solver, rerun=rerun)
    return run(proof.name, proof.harness(), mode=proof.mode, depth=proof.depth,
               build_root=build_root, limit=limit, solver=proof.solver, rerun=rerun)


#: Fast forms per SymbiYosys run in :func:`fast_groups`: few enough that the groups spread
#: over the test workers.
FAST_GROUP_SIZE = 6


def fast_groups(proofs: Sequence[Proof] | None = None,
                size: int = FAST_GROUP_SIZE) -> dict[str, tuple[Proof, ...]]:
    """*proofs* (default: every one) in groups whose fast forms run as one design
    (:func:`run_fast_group`): those of one fast mode, depth and solver, at most *size* a
    group, in the table's order; a fast harness with ``reset="initial"`` alone (see
    :class:`sim.formal.harness.Group`). Keys name each group by its first proof and size."""
    proofs = list(PROOFS.values()) if proofs is None else list(proofs)
    kinds: dict[tuple, list[Proof]] = {}
    # Each harness is built only to read its reset kind, then dropped unelaborated.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        for proof in proofs:
            reset = (proof.fast_harness or proof.harness)().reset
            key = (proof.fast_mode, proof.fast_depth or FAST_DEPTH, proof.fast_solver,
                   reset == "any" or proof.name)
            kinds.setdefault(key, []).append(proof)
        gc.collect()
    groups = {}
    for members in kinds.values():
        for start in range(0, len(members), size):
            chunk = tuple(members[start:start + size])
            name = chunk[0].name + (f"+{len(chunk) - 1}" if len(chunk) > 1 else "")
            groups[name] = chunk
    return groups


def run_fast_group(proofs: Sequence[Proof], *, build_root: Path = FORMAL_ROOT
                   ) -> tuple[Result, dict[str, Result]]:
    """The fast forms of *proofs* (one group of :func:`fast_groups`) in one SymbiYosys run,
    within the sum of their limits. If the group does not pass, each runs alone to name the
    ones that fail: ``(group result, {name: result alone})`` (empty when the group passed)."""
    first = proofs[0]
    mode, depth = first.fast_mode, first.fast_depth or FAST_DEPTH
    if any((p.fast_mode, p.fast_depth or FAST_DEPTH, p.fast_solver)
           != (mode, depth, first.fast_solver) for p in proofs):
        raise ValueError("a group's proofs must share their fast mode, depth and solver")
    if len(proofs) == 1:
        return run_proof(first, fast=True, build_root=build_root), {}
    group = Group({p.name: (p.fast_harness or p.harness)() for p in proofs})
    names = " ".join(p.name for p in proofs)
    result = run(f"{first.name}+{len(proofs) - 1}", group, mode=mode, depth=depth,
                 build_root=build_root, limit=sum(p.limit for p in proofs),
                 solver=first.fast_solver, rerun=f"python -m sim.formal --fast {names}")
    if result.ok:
        return result, {}
    return result, {p.name: run_proof(p, fast=True, build_root=build_root) for p in proofs}


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
    parser = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__.split(
        "\n")[0])
    parser.add_argument("names", nargs="*", help="proofs to run (names or prefixes); all")
    parser.add_argument("--fast", action="store_true",
                        help=f"each in its fast form, mostly a BMC of {FAST_DEPTH} cycles "
                             f"(what the tests run)")
    parser.add_argument("--list", action="store_true", help="list the proofs and exit")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="proofs run at once (each is one solver process); 1")
    parser.add_argument("--limit", type=float, default=None, metavar="SECONDS",
                        help="time limit per proof instead of each proof's own (the table's "
                             "limit column); 0: none")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        parser.error(f"--limit must be 0 (no limit) or a positive number of seconds, "
                     f"not {args.limit:g}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    limit = 0 if args.limit is None else (args.limit or None)
    proofs = _select(args.names)
    if args.list:
        for proof in proofs:
            print(f"{proof.name:<34} {proof.mode} depth {proof.depth:<3} "
                  f"limit {proof.limit:>4} s  {proof.summary}")
        return 0
    # Killed from outside (a CI job's time-out), stop the proof that runs with every process
    # it started, as a time limit does (run() does so on any exception).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    failures = 0
    # Threads only wait for their solver processes; reports come in the table's order.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        try:
            running = [pool.submit(run_proof, proof, fast=args.fast, limit=limit)
                       for proof in proofs]
            for proof, future in zip(proofs, running, strict=True):
                result = future.result()
                print(f"{proof.name}: {proof.summary}", flush=True)
                print(result.report(), flush=True)
                failures += not result.ok
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            raise
    total = time.monotonic() - start
    print(f"formal: {len(proofs) - failures}/{len(proofs)} passed in {total:.1f} s"
          f" (build/formal/<name>/)")
    return 1 if failures else 0
