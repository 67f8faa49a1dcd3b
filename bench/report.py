"""The performance report: measure, plot and write docs/performance.md.

    python -m bench.report [--rerun] [--synth] [--cached] [--images 360]   (make report)

- Workloads (always measured, unless ``--cached``): the GEMMs of :data:`bench.measure.GEMMS`
  and the demo MLP and CNN on 4x4, 8x8 and 16x16 cores, on the RTL (Verilator, the fast
  transport), with the core's own counters in TPU v1 Table 3 categories; the networks also
  against their shape bounds (whole and per stage) and beside the UART link of each board
  with that array. Results in ``bench/results/workloads.json``.
- Simulation speed (``bench/results/simspeed.json``): measured only when the file is missing
  or with ``--rerun`` (Icarus and amaranth.sim at 16x16 take minutes).
- Synthesis (``bench/results/synth_sweep.json``, :mod:`bench.synth_sweep`): run only with
  ``--synth`` (up to 40 minutes); otherwise the committed file is read.
- Whole models before and after moving them on chip (``bench/results/models.json``,
  :mod:`bench.models`): only read; ``python -m bench.models`` measures them at a commit.

Writes ``docs/performance.md`` and PNGs under ``docs/img/`` (matplotlib, Agg). None of this is
a test: the figures are what the machine measured on the day, which the report states.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from firmware.cli import TABLE3  # noqa: E402  (the categories `amtpu demo` prints)

__all__ = ["TABLE3", "peak_ops_per_cycle", "host_bytes_per_cycle", "ridge_point",
           "weight_ridge_point", "roof", "network_figures", "stage_figures", "analyse",
           "plot_cycles_utilisation", "plot_roofline", "plot_synthesis", "plot_simspeed",
           "models_before_after", "write_markdown", "main"]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs"


#: TPU v1's measured Table 3 rows (Jouppi et al., ISCA 2017), % of cycles.
TPU_V1_TABLE3 = {
    "MLP0": {"array active": 12.7}, "MLP1": {"array active": 10.6},
    "LSTM0": {"array active": 8.2}, "LSTM1": {"array active": 10.5},
    "CNN0": {"array active": 78.2}, "CNN1": {"array active": 46.2},
}

#: What the parts hold (LUT4 or iCE40 logic cells, DSP multipliers, block RAMs).
PART_CAPACITY = {"ecp5": {"lut4": 83_640, "dsp": 156, "bram": 208},
                 "ice40": {"lut4": 5_280, "dsp": 8, "bram": 30}}

#: Why each workload measures what it does (the mechanism; the figures come from the runs).
WHY = {
    "square 64": "each weight tile serves 64 rows, so the shadow registers hide every "
                 "tile's shift (weight stall 0) and MATMULs stream back to back; what is "
                 "left is each MATMUL's fill and drain and the last job's ACTIVATE and "
                 "WRITE_HOST, which wait for its MATMULs (RAW) with nothing left to overlap. "
                 "At 16x16 the whole program is about 1,200 cycles, so that tail weighs most.",
    "tall-skinny": "K = N = 16 is a single weight tile at 16x16. The tiler "
                   "(`firmware/gemm.py`) puts as many rows in a job as the memories allow, "
                   "so at 16x16 all 512 rows are one job: its ACTIVATE waits for the "
                   "MATMUL and its WRITE_HOST for the ACTIVATE (RAW), three 512-cycle phases "
                   "in a row with nothing to overlap. 8x8 has 4 jobs and 4x4 12, which "
                   "overlap. A tiling limit, not the hardware's: smaller jobs would "
                   "pipeline.",
    "K >> rows": "K = 128 is 8 to 32 chunks accumulated into the same accumulator rows, "
                 "each a MATMUL of 22 to 64 rows (as many as fit the unified buffer with "
                 "all chunks) with its own fill and drain and its own tile; "
                 "N = 8 fills half of a 16x16 array's columns. Its weights are most of what "
                 "crosses the link, so it sits near the host ridge.",
    "batch 1": "one row per weight tile: a tile's `rows`-cycle shift cannot hide behind "
               "a one-row MATMUL, so weight shift (and weight stall, when the FIFO runs "
               "dry) fill the cycles. TPU v1's MLP case, in the array's own weight path.",
    "batch 256": "256 rows per tile hide the weight shift and amortise fill, drain and "
                 "dispatch; what remains is the per-job overhead and the last job's tail, "
                 "which weigh more as the array grows and the matrix time shrinks.",
    "MLP": "three dependent layers a batch: a layer's MATMUL reads the unified-buffer rows "
           "the previous layer's ACTIVATE writes (RAW), and the 16- and 10-wide layers "
           "fill part of a wide array's columns. The batch (as many images as the "
           "unified buffer holds; the table gives it) amortises the weight shifts; the "
           "larger the array, the shorter the matrix phase against the fixed ACTIVATE and "
           "host time.",
    "CNN": "the image crosses the link once, a unified-buffer row a position whose spare "
           "elements carry its neighbours' pixels (as many kernel taps as a row holds; "
           "`firmware/compiler/layout.py`), and the dense stage reads the pooled output on chip: "
           "READ_HOST and the pooling ACTIVATEs are the non-matrix cycles. A 4x4 row holds "
           "4 of the 9 taps, so the input takes several rows a position and few images fit "
           "the unified buffer at a time (the table gives the batch). On the 16x16 a row "
           "carries two positions (a 3x5 patch in 15 of 16 lanes, their 2 x 8 channels in "
           "the 16 columns), so an image is 32 host rows and 40 array rows; but the host's "
           "32 rows and the ACTIVATEs' 9 share the buffer's one write port and the front "
           "end, and the activation engine needs about 39 cycles an image (rows plus 23 a "
           "job): three paths each about as long as the array's 40, so they do not all hide "
           "behind it.",
}

SIM_ORDER = ("verilator", "icarus", "amaranth.sim")


# Roofline arithmetic ------------------------------------------------------------------------

def peak_ops_per_cycle(rows: int, cols: int) -> int:
    """Peak operations per cycle: a multiply and an add in every PE."""
    return 2 * rows * cols


def host_bytes_per_cycle(host_width: int) -> float:
    """Bytes the host stream moves per cycle in one direction: one beat."""
    return host_width / 8


def ridge_point(rows: int, cols: int, host_width: int) -> float:
    """Operations per host byte at which the host link stops limiting: peak / bandwidth."""
    return peak_ops_per_cycle(rows, cols) / host_bytes_per_cycle(host_width)


def weight_ridge_point(rows: int, cols: int) -> float:
    """Operations per weight byte shifted into the array at which weight loading stops
    limiting: a tile shifts in one ``cols``-byte row a cycle, so peak / cols = 2 * rows
    (each weight must be used by ``rows`` activation rows; TPU v1's ridge, for weights from
    its DDR3, was 1350)."""
    return peak_ops_per_cycle(rows, cols) / cols


def roof(intensity: float, rows: int, cols: int, host_width: int) -> float:
    """Attainable operations per cycle at ``intensity`` operations per host byte."""
    return min(peak_ops_per_cycle(rows, cols), intensity * host_bytes_per_cycle(host_width))


def network_figures(r: dict) -> dict:
    """A network record's utilisation in model MACs (the network's multiply-accumulates,
    :meth:`firmware.compiler.CompiledNetwork.useful_macs`, not the counter's, which counts
    zero padding) against its shape bound, in %; empty for records without them (GEMMs)."""
    if "model_macs" not in r:
        return {}
    cells = r["rows"] * r["cols"]
    measured = 100 * r["model_macs"] / (cells * r["counters"]["cycles"])
    bound = 100 * r["bound"]
    return {"model_utilisation": measured, "bound": bound, "of_bound": 100 * measured / bound,
            "cycles_per_image": r["counters"]["cycles"] / r["images"]}


def stage_figures(r: dict) -> list[dict]:
    """Per stage of a network record: the shape bound and the utilisation measured on one
    batch run stage after stage (``profile_*``), in %, and the second as % of the first."""
    out = []
    for st in r.get("stages", []):
        util = st["profile_utilisation"]
        out.append({"name": st["name"], "bound": 100 * st["bound"],
                    "measured": None if util is None else 100 * util,
                    "of_bound": (None if util is None or not st["bound"]
                                 else 100 * util / st["bound"]),
                    "cycles": st["profile_cycles"],
                    "macs_per_image": st["useful_macs_per_image"],
                    "slots_per_image": st["slots_per_image"]})
    return out


def analyse(r: dict) -> dict:
    """Derived figures of one workload record (see :mod:`bench.measure`)."""
    c = r["counters"]
    rows, cols = r["rows"], r["cols"]
    host_width = 8 * r["host_bytes_per_beat"]
    cycles = c["cycles"]
    shares = {label: 100 * c[name] / cycles for label, name in TABLE3}
    intensity = r["ops"] / r["bytes_in"]
    achieved = r["ops"] / r["program_cycles"]
    attainable = roof(intensity, rows, cols, host_width)
    ridge = ridge_point(rows, cols, host_width)
    weight_bytes = c["weight_shift"] * cols
    stalls = {k: v for k, v in shares.items() if k != "array active"}
    worst = max(stalls, key=stalls.get)
    weight_ridge = weight_ridge_point(rows, cols)
    weight_intensity = (2 * c["useful_macs"] / weight_bytes) if weight_bytes else None
    model = network_figures(r)
    return {
        **model,
        "utilisation": 100 * c["useful_macs"] / (rows * cols * cycles),
        "shares": shares, "intensity": intensity, "achieved": achieved,
        "attainable": attainable, "ridge": ridge, "peak": peak_ops_per_cycle(rows, cols),
        "of_roof": 100 * achieved / attainable,
        "weight_intensity": weight_intensity, "weight_ridge": weight_ridge,
        # Roofline regions: left of a ridge point, that link bounds the workload.
        "host_region": "host link" if intensity < ridge else "compute",
        "weight_region": ("-" if weight_intensity is None else
                          "weight shift" if weight_intensity < weight_ridge else "compute"),
        "worst_stall": worst, "worst_share": stalls[worst],
    }


# Plots ------------------------------------------------------------------------------------

def _sizes(records: Iterable[dict]) -> list[str]:
    seen = {}
    for r in records:
        seen.setdefault(r["config"], r["rows"] * r["cols"])
    return sorted(seen, key=seen.get)


def _workloads(records: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(r["workload"] for r in records))


def plot_cycles_utilisation(records: list[dict], path: Path) -> Path:
    """Cycles (counter window) and utilisation of each workload against array size: the
    counter's useful MACs for GEMMs, the model's MACs for networks with their shape bounds
    dashed in the same colour."""
    sizes = _sizes(records)
    fig, (ax_c, ax_u) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in _workloads(records):
        by = {r["config"]: r for r in records if r["workload"] == name}
        xs = [s for s in sizes if s in by]
        (line,) = ax_c.plot(xs, [by[s]["counters"]["cycles"] for s in xs], "o-", label=name)
        figures = [analyse(by[s]) for s in xs]
        if all("model_utilisation" in a for a in figures):
            # Networks: their own MACs (no padding) and, dashed, what their shapes allow.
            ax_u.plot(xs, [a["model_utilisation"] for a in figures], "o-",
                      color=line.get_color(), label=f"{name} (model MACs)")
            ax_u.plot(xs, [a["bound"] for a in figures], "--", color=line.get_color(),
                      label=f"{name} shape bound")
        else:
            ax_u.plot(xs, [a["utilisation"] for a in figures], "o-",
                      color=line.get_color(), label=name)
    ax_c.set_yscale("log")
    ax_c.set_ylabel("core cycles (counters)")
    ax_c.set_title("cycles")
    ax_u.set_ylabel("MACs / (rows x cols x cycles), %")
    ax_u.set_ylim(0, 105)
    ax_u.set_title("array utilisation")
    for ax in (ax_c, ax_u):
        ax.set_xlabel("array")
        ax.grid(True, which="both", alpha=0.3)
    ax_u.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_MARKERS = "osD^v<>Ph*"


def plot_roofline(records: list[dict], path: Path) -> Path:
    """TPU-v1-style log-log rooflines: operations per host byte (left) and per weight byte
    shifted into the array (right) against achieved operations per cycle, one roof per
    array size, each workload a point."""
    sizes = _sizes(records)
    names = _workloads(records)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (ax_h, ax_w) = plt.subplots(1, 2, figsize=(12, 5))
    analysed = [(r, analyse(r)) for r in records]
    xs_h = [a["intensity"] for _, a in analysed]
    xs_w = [a["weight_intensity"] for _, a in analysed if a["weight_intensity"]]
    for i, size in enumerate(sizes):
        r0 = next(r for r in records if r["config"] == size)
        rows, cols, hw = r0["rows"], r0["cols"], 8 * r0["host_bytes_per_beat"]
        colour = colours[i % len(colours)]
        peak = peak_ops_per_cycle(rows, cols)
        for ax, ridge, bw, xs in (
                (ax_h, ridge_point(rows, cols, hw), host_bytes_per_cycle(hw), xs_h),
                (ax_w, weight_ridge_point(rows, cols), cols, xs_w)):
            lo = min([*xs, ridge]) / 4
            hi = max([*xs, ridge]) * 4
            ax.plot([lo, ridge, hi], [lo * bw, peak, peak], "-", color=colour, lw=1.5,
                    label=f"{size} roof: peak {peak}, ridge {ridge:g}")
            ax.axvline(ridge, color=colour, ls=":", lw=0.8)
        for r, a in analysed:
            if r["config"] != size:
                continue
            marker = _MARKERS[names.index(r["workload"]) % len(_MARKERS)]
            ax_h.plot(a["intensity"], a["achieved"], marker, color=colour, ms=7, mfc="none")
            if a["weight_intensity"]:
                ax_w.plot(a["weight_intensity"], 2 * r["counters"]["useful_macs"]
                          / r["counters"]["cycles"], marker, color=colour, ms=7, mfc="none")
    for j, name in enumerate(names):
        ax_h.plot([], [], _MARKERS[j % len(_MARKERS)], color="k", mfc="none", label=name)
    ax_h.set_xlabel("operations per byte the host sends (whole program)")
    ax_h.set_ylabel("operations per cycle (2 per MAC)")
    ax_h.set_title("host link roofline")
    ax_w.set_xlabel("operations per weight byte shifted into the array")
    ax_w.set_ylabel("operations per cycle (counter window)")
    ax_w.set_title("weight roofline (as TPU v1's, on-chip weight memory)")
    for ax in (ax_h, ax_w):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    ax_h.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_synthesis(synth: dict, path: Path) -> Path:
    """Array-in-harness resources and Fmax against array size, per part."""
    builds = [b for b in synth.get("builds", []) if b["kind"] == "array"]
    fig, (ax_r, ax_f) = plt.subplots(1, 2, figsize=(11, 4.2))
    for board, style in (("ecp5", "o-"), ("ice40", "s--")):
        bs = sorted((b for b in builds if b["board"] == board and b["resources"]["lut"]),
                    key=lambda b: b["rows"])
        if not bs:
            continue
        pes = [b["rows"] * b["cols"] for b in bs]
        (lut_line,) = ax_r.plot(pes, [b["resources"]["lut"] or 0 for b in bs], style,
                                label=f"{board} LUT4 / LC")
        ffs = [b["resources"]["ff"] for b in bs]
        if all(f is not None for f in ffs):
            ax_r.plot(pes, ffs, style, alpha=0.5, label=f"{board} FF")
        unplaced = [b for b in builds if b["board"] == board and not b["resources"]["lut"]]
        for b in unplaced:                  # no placement: yosys's LUT4 + carry cells
            ys = b["resources"].get("yosys_array", {})
            ax_r.plot(b["rows"] * b["cols"], ys.get("lut4", 0) + ys.get("carry", 0),
                      style[0], mfc="none", color=lut_line.get_color(),
                      label=f"{board} {b['config']}: yosys LUT4 + carry, not routed")
        ax_f.plot(pes, [b["fmax_mhz"] or b["best_achieved_mhz"] or 0 for b in bs], style,
                  label=board)
        for b, p in zip(bs, pes, strict=True):
            ax_f.annotate(b["config"], (p, b["fmax_mhz"] or b["best_achieved_mhz"] or 0),
                          fontsize=7, textcoords="offset points", xytext=(4, 4))
    for ax in (ax_r, ax_f):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("PEs (rows x cols)")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax, fontsize=8)
        if not builds:
            ax.text(0.5, 0.5, "no synthesis sweep recorded", ha="center",
                    transform=ax.transAxes)
    ax_r.set_yscale("log")
    ax_r.set_ylabel("used (nextpnr, array + harness)")
    ax_r.set_title("resources")
    ax_f.set_ylabel("MHz")
    ax_f.set_title("nextpnr Fmax")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_simspeed(speed: list[dict], path: Path) -> Path:
    """Simulated cycles per second against array size, per simulator and driver."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    keys = list(dict.fromkeys((s["sim"], s["driver"]) for s in speed))
    sims = list(dict.fromkeys(sim for sim, _ in keys))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for sim, driver in keys:
        pts = sorted((s for s in speed if s["sim"] == sim and s["driver"] == driver),
                     key=lambda s: _pes(s["config"]))
        ax.plot([_pes(s["config"]) for s in pts], [s["cycles_per_s"] for s in pts],
                "o-" if "transport" in driver else "s--",
                color=colours[sims.index(sim) % len(colours)], label=f"{sim}: {driver}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("PEs (rows x cols)")
    ax.set_ylabel("simulated cycles per second")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _pes(size: str) -> int:
    rows, _, cols = size.partition("x")
    return int(rows) * int(cols)


# Markdown ---------------------------------------------------------------------------------

def _n(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _gops(build: dict) -> float:
    """Peak GOPS of a synthesised array: 2 operations per PE per cycle at its Fmax."""
    return peak_ops_per_cycle(build["rows"], build["cols"]) * build["fmax_mhz"] / 1e3


def machine() -> str:
    """A line naming the machine: host, CPU model, cores, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def _networks_markdown(workloads: list[dict]) -> list[str]:
    """The networks against their shape bounds, per stage, and beside the boards' links."""
    nets = [r for r in workloads if "model_macs" in r]
    if not nets:
        return []
    out = [
        "## Networks against their shape bounds",
        "",
        "A stage's *shape bound* (`firmware/compiler/network.py`, "
        "`CompiledNetwork.bounds()`) is its "
        "MACs over the MAC slots its passes issue (rows x cols for each accumulator row of "
        "each pass): the utilisation it reaches if the array never waits. Below the bound is "
        "scheduling (waits for the link, the weights, the interlocks); above it, the layer's "
        "shape on this array. The measured utilisation here counts the model's MACs "
        "(`compiled.useful_macs()` x images, no zero padding) over rows x cols x the batch "
        "programs' cycles, so it can reach the bound and no more.",
        "",
    ]
    rows = []
    for r in nets:
        a = analyse(r)
        boards = "; ".join(
            f"{x['board']} ({x['clock_mhz']:g} MHz, {x['baud']:,} baud"
            f"{'' if x['same_core'] else ', its own preset'}): core "
            f"{_n(x['core_images_per_s'])}, link **{_n(x['link_images_per_s'])}**"
            for x in r.get("links", [])) or "no board with this array"
        rows.append([r["config"], r["workload"], f"{r['images']} (batch {r['batch_size']})",
                     _n(a["cycles_per_image"], 1), f"**{a['model_utilisation']:.1f} %**",
                     f"{a['bound']:.1f} %", f"{a['of_bound']:.0f} %", boards])
    out += _table(["array", "network", "images", "cycles per image", "measured utilisation",
                   "shape bound", "of the bound", "images/s on a board: core at its clock, "
                   "UART link"], rows)
    out += [
        "The simulated transports deliver a host beat every cycle; a board receives its beats "
        "through a UART (`docs/host-link.md`), so its images/s is the link's, not the core's. "
        "The core's images/s is its clock over the measured cycles per image; the link's "
        "(`firmware/linkrate.py`) counts the bytes the serial transport exchanges for the "
        "network compiled for that board's preset (framing, escapes and ACKs; the host waits "
        "for each DATA frame's ACK; output escapes taken as none and USB latency not "
        "counted, so it is a ceiling). Boards are those whose preset has the array: the "
        "ULX3S for 8x8 (its preset is the default's programs), the iCEBreaker for 4x4 (its "
        "own preset, with int8 input, smaller memories and the serial activation unit: its "
        "core takes more cycles than the 4x4 measured here, and its batches are smaller). No "
        "board carries 16x16.",
        "",
        "Per stage: one batch run again after the measured run, on the same simulator, the "
        "stages one after another (`compiled.profile`; the batch programs above overlap "
        "them, so only this run tells them apart). Its utilisation is the stage's MACs over "
        "rows x cols x the stage's cycles.",
        "",
    ]
    rows = []
    for r in nets:
        for st in stage_figures(r):
            rows.append([r["config"], r["workload"], st["name"], _n(st["macs_per_image"]),
                         _n(st["slots_per_image"]), f"{st['bound']:.1f} %",
                         "-" if st["measured"] is None else f"**{st['measured']:.1f} %**",
                         "-" if st["of_bound"] is None else f"{st['of_bound']:.0f} %",
                         _n(st["cycles"])])
    out += _table(["array", "network", "stage", "MACs per image", "MAC slots per image",
                   "shape bound", "measured (stage by stage)", "of the bound",
                   "cycles (one batch)"], rows)
    return out


#: The commit before the work of moving whole models on chip (bench/models.py measures both).
MODELS_BEFORE = "12448fc"


def models_before_after(doc: dict) -> tuple[dict | None, dict | None]:
    """The entries of ``bench/results/models.json`` to compare: before (:data:`MODELS_BEFORE`)
    and after (the latest other commit by date; a ``-dirty`` entry, measured on uncommitted
    code, only where there is no other)."""
    before = doc.get(MODELS_BEFORE)
    others = sorted((e for k, e in doc.items() if k != MODELS_BEFORE),
                    key=lambda e: (not e["commit"].endswith("-dirty"), e.get("date", "")))
    return before, others[-1] if others else None


def _change(after, before) -> str:
    if after is None or before is None or not before:
        return ""
    if after == before:
        return " (same)"
    change = 100 * (after / before - 1)
    return f" ({change:+.0f} %)" if abs(change) >= 1 else f" ({change:+.1g} %)"


def _models_markdown(doc: dict) -> list[str]:
    """Whole models before and after, from ``bench/results/models.json`` (bench/models.py)."""
    out = ["## Models on chip: what crosses the link", ""]
    before, after = models_before_after(doc)
    if before is None or after is None:
        return out + ["No before/after model figures recorded yet: run `python -m "
                      "bench.models` at " + MODELS_BEFORE + " and at a later commit.", ""]
    out += [
        f"From `bench/results/models.json`, made by `python -m bench.models` "
        f"(`bench/models.py`) on the 8x8 default core (a `name@preset` row on that preset: "
        f"`person_detect@deep`, the default array with an 8,192-row unified buffer), at two "
        f"commits: **before** "
        f"`{before['commit']}` (measured {before['date']}), the state before the work of "
        f"moving whole models on chip, and **after** `{after['commit']}` (measured "
        f"{after['date']}). Every run's outputs equal the graph's integer reference, on the "
        f"ISA simulator and on the RTL core, and the RTL run sends the same programs as the "
        f"ISA simulator's. Per inference (the figures of a run over *n* inputs, divided by "
        f"*n*; the digits networks' test images, random inputs for the others):",
        "",
        "- *operators*: the graph's operators by where they ran, as the lowering placed them: "
        "in a core step that is one program from its input to its output (a chain of "
        "convolutions with their pooling and tables, a flatten and fully connected operators; "
        "a run of fully connected operators; attention) / in a convolution over patches the "
        "host cuts (im2col: its input goes to the host and comes back as patches) / on the "
        "host;",
        "- *programs*: batch programs the device ran (the resident setup programs and the "
        "counter programs not counted);",
        "- *instructions*: the core's `instructions` counter over the batch programs;",
        f"- *bytes to / from the device*: what the serial transport would exchange with the "
        f"{after['board']} ({after['max_beats']} beats a DATA frame) for the batch programs: "
        "DATA frames to the board; ACKs and a BEAT frame per output beat back; SLIP framing, "
        "escapes, CRCs and sequence numbers counted from the frames themselves "
        "(`firmware/transports/serial.py`, `hdl/link/protocol.py`, as `firmware/linkrate.py` "
        "counts them), on a freshly opened ISA simulator (an answer's rows and lanes outside "
        "the outputs carry what the buffers held, so their escapes depend on what ran "
        "before). The weights a setup program loads once per run are not in them;",
        "- *RTL cycles*: the core's `cycles` counter over the batch programs, Verilator, the "
        "simulated link delivering a beat a cycle (a board's UART is far slower: the bytes "
        "above are its cost); the host's operators are not in them;",
        "- *utilisation*: the graph's MACs over rows x cols x those cycles; *shape bound*: the "
        "graph's MACs over the MAC slots the core segments' passes issue (`CompiledNetwork."
        "bounds()`), the utilisation if the array never waited (`-` where a step has no such "
        "count: attention's programs).",
        "",
    ]
    header = ["model", "commit", "inferences", "operators (core chained / core patches / "
              "host)", "programs", "instructions", "bytes to device", "bytes from device",
              "RTL cycles", "utilisation", "shape bound"]
    rows = []
    for name in dict.fromkeys([*before["models"], *after["models"]]):
        b = before["models"].get(name)
        for label, f in (("before", b), ("after", after["models"].get(name))):
            if f is None:
                continue
            o = f["operators"]
            was = b if label == "after" else None

            def cell(key, digits=0, f=f, was=was):
                return _n(f[key], digits) + (_change(f[key], was[key]) if was else "")

            pct = [("-" if f[k] is None else f"{100 * f[k]:.1f} %")
                   for k in ("utilisation", "shape_bound")]
            rows.append([name if label == "before" or b is None else "",
                         f"{label} `{(before if label == 'before' else after)['commit']}`",
                         f"{f['images']}" + (f" ({f['rtl_images']} on RTL)"
                                             if f["rtl_images"] not in (None, f["images"])
                                             else ""),
                         f"{o['chain']} / {o['patches']} / {o['host']}",
                         cell("programs", 2), cell("instructions"), cell("to_device"),
                         cell("from_device"), cell("cycles"), *pct])
    out += _table(header, rows)
    out += [
        "The after row's percentages are its change from the before row. Few inferences "
        "are run (person_detect one, on Verilator), and a compiled segment's batch program "
        "sends and writes back whole batches of its compiled batch size (images it was not "
        "given are computed from whatever the buffers hold, and dropped): where a run has "
        "fewer inferences than a batch holds, the per-inference figures carry the rest of "
        "the batch, and a program's fixed instructions weigh more than in a long run.",
        "",
    ]
    return out


def write_markdown(path: Path, *, workloads: list[dict], speed: list[dict], synth: dict,
                   meta: dict, img: dict[str, Path], models: dict | None = None) -> Path:
    """docs/performance.md from the measured records."""
    rel = {k: os.path.relpath(v, path.parent) for k, v in img.items()}
    sizes = _sizes(workloads)
    out = [
        "# Performance",
        "",
        f"Generated by `make report` (`python -m bench.report`) on {meta['date']}, commit "
        f"`{meta['commit']}`, on {meta['machine']}. Workload figures come from the core's own "
        f"performance counters (`hdl/isa.py` `COUNTERS`) in RTL simulation (Verilator, the "
        f"RTL transport); no figure is an estimate. Every run's results were checked against "
        f"the ISA simulator, numpy and the int8 reference executor. This report is not a "
        f"test: it records what this machine measured.",
        "",
        "Configurations: the default core (`hdl/config.py`) with the array resized to 4x4, 8x8 "
        "and 16x16, the weight memory at the default's 64 tiles but at least its 4,096 bytes "
        "(4x4: 256 tiles), so every workload's weights stay resident, and 8 MATMUL slots "
        "on the 4x4 and 16x16 (`bench/measure.py` `SWEPT_MATMUL_SLOTS` says why; the 8x8 is "
        "the default core, with 4); unified buffer 1,024 "
        "rows, accumulators 512 rows, weight FIFO 4 tiles, 4 parameter slots. The "
        "host stream is one beat a cycle each way, as wide as the widest row "
        "(`host_width`: 128, 256 and 512 bits).",
        "",
        "## Workloads in TPU v1 Table 3 categories",
        "",
        "GEMMs compute `relu(requantise(X @ W))` for random int8 `X` (M x K) and `W` (K x N) "
        "with `firmware/gemm.py`; their counters cover the matrix phase (from the first "
        "MATMUL to the end of the program; the weights and the first rows of `X` are loaded "
        "before). The digits MLP (64-32-16-10) and CNN (conv 3x3 x 8, ReLU, max-pool 2x2, "
        f"dense) run over {meta['images']} test images with `firmware/compiler/`; their "
        "counters cover the batch programs (the resident weights are loaded before). Shares "
        "are % of the window's cycles; the categories overlap (a weight shift runs behind "
        "array-active cycles), as in TPU v1's table. Utilisation is useful MACs / "
        "(rows x cols x cycles), where a useful MAC is one PE's work on an activation row that "
        "entered the array (zero padding of a partial tile counts).",
        "",
    ]
    header = ["workload", "M x K x N", "array", "cycles", *[label for label, _ in TABLE3],
              "utilisation", "largest loss"]
    rows = []
    for r in workloads:
        a = analyse(r)
        shape = f"{r['m']} x {r['k']} x {r['n']}" if r["kind"] == "gemm" else (
            f"{r['images']} images, batch {r['batch_size']}")
        rows.append([r["workload"], shape, r["config"], _n(r["counters"]["cycles"]),
                     *[f"{a['shares'][label]:.1f} %" for label, _ in TABLE3],
                     f"**{a['utilisation']:.1f} %**",
                     f"{a['worst_stall']} {a['worst_share']:.0f} %"])
    out += _table(header, rows)
    out += [
        "TPU v1's measured Table 3 (array active, % of cycles): " + ", ".join(
            f"{k} {v['array active']} %" for k, v in TPU_V1_TABLE3.items())
        + " (mean 28 %). Its MLPs and LSTMs were bound by weight bandwidth from DDR3 at "
          "small batches; ours keep weights on chip, and only batch 1 shows the same weight "
          "bound (in the array's own weight shift). Other designs: Gemmini reports 51 % "
          "utilisation on ResNet50 (16x16); tinyTPU runs an MNIST MLP in 11 us per input; "
          "VTA's 16x16 GEMM core peaks at 51.2 GOPS at 100 MHz.",
        "",
        f"![cycles and utilisation against array size]({rel['cycles']})",
        "",
        "What limits each number:",
        "",
    ]
    for name in _workloads(workloads):
        rs = [r for r in workloads if r["workload"] == name]
        figures = ", ".join(
            f"{r['config']} {analyse(r)['utilisation']:.1f} % (largest loss "
            f"{analyse(r)['worst_stall']} {analyse(r)['worst_share']:.0f} %)" for r in rs)
        out.append(f"- **{name}** ({rs[0]['what']}; {figures}): {WHY.get(name, '')}")
    out += [
        "",
        "Each MATMUL streams its rows through the array one a cycle and costs about "
        "rows + cols + 3 cycles of fill and drain plus its dispatch; a tile's `rows`-cycle "
        "shift into the shadow registers hides behind a MATMUL of at least `rows` rows. "
        "Padding of a partial tile counts as useful MACs in the counter (the array does "
        "the work), not in the roofline's operations.",
        "",
    ]
    out += _networks_markdown(workloads)
    if models is not None:
        out += _models_markdown(models)
    out += [
        "## Roofline",
        "",
        "TPU v1 drew its workloads on a roofline of operations per weight byte (its weights "
        "came from DDR3; ridge point 1,350). Our weights come from the host into an on-chip "
        "weight memory, so the link that feeds the core is the host stream: one beat of "
        "`host_width` bits a cycle into the core (and a separate one out). Peak is "
        "2 x rows x cols operations a cycle (a multiply and an add per PE); the host roof is "
        "`host_width / 8` bytes a cycle times the operational intensity; the ridge point is "
        "their ratio. The second roof is the array's own weight path: a tile shifts into the "
        "shadow registers one `cols`-byte row a cycle, so the ridge is 2 x rows operations per "
        "weight byte (each weight used by at least `rows` activation rows).",
        "",
    ]
    cfg_rows = []
    for size in sizes:
        r0 = next(r for r in workloads if r["config"] == size)
        hw = 8 * r0["host_bytes_per_beat"]
        cfg_rows.append([size, peak_ops_per_cycle(r0["rows"], r0["cols"]), hw,
                         _n(host_bytes_per_cycle(hw)), _n(ridge_point(r0["rows"], r0["cols"],
                                                                       hw), 1),
                         _n(weight_ridge_point(r0["rows"], r0["cols"]), 0)])
    out += _table(["array", "peak ops/cycle", "host beat, bits", "host bytes/cycle",
                   "ridge, ops per host byte", "ridge, ops per weight byte"], cfg_rows)
    out += [f"![roofline]({rel['roofline']})", ""]
    rows = []
    for r in workloads:
        a = analyse(r)
        rows.append([r["workload"], r["config"], _n(r["bytes_in"]), _n(a["intensity"], 2),
                     _n(a["achieved"], 1), _n(a["attainable"], 1), f"{a['of_roof']:.0f} %",
                     a["host_region"], _n(a["weight_intensity"], 1), a["weight_region"]])
    out += _table(["workload", "array", "host bytes in", "ops per host byte",
                   "achieved ops/cycle", "host roof ops/cycle", "of roof", "host roofline",
                   "ops per weight byte", "weight roofline"], rows)
    out += [
        "The host-roofline point uses the whole program (weights, parameters, rows of `X`, "
        "instructions: every beat the host sends, each `host_width` bits even for a 64-bit "
        "instruction) and its core cycles; the weight-roofline point uses the counter window. "
        "Operations are 2 x M x K x N for GEMMs and 2 x useful MACs for the networks. "
        "\"host link\" / \"weight shift\" marks a workload left of that roofline's ridge "
        "point, bound by that path; \"compute\" one right of it, where the gap to the roof "
        "is the fill, drain, dispatch and dependency losses of the Table 3 columns above. "
        "Batch 1 is left of both ridges: it sends a 64x64 layer's weights over the link "
        "and shifts each tile into the array for one row (2 operations per weight byte, "
        "as TPU v1's MLPs were at small batches). The K >> rows GEMM and the CNN sit near "
        "the host ridge: their weights (K >> rows) or input rows (CNN) are most of "
        "what crosses the link.",
        "",
    ]

    # Synthesis.
    out += ["## Resources and Fmax against array size", ""]
    if synth.get("builds"):
        out += [
            f"From `bench/results/synth_sweep.json`, made by `python -m bench.report --synth` "
            f"(`bench/synth_sweep.py`) on {synth['date']} on {synth.get('machine', '-')}, "
            f"in {synth['total_wall_s'] / 60:.0f} minutes of one core; tools: "
            + ", ".join(f"{k} {v}" for k, v in synth["tools"].items()) + ". What was "
            "synthesised:",
            "",
            "- *array*: the systolic array alone in `boards/harness.py`'s pin harness "
            "(inputs from a shift register on one pin, outputs XOR-folded into registers on "
            "another), synthesised by yosys and placed and routed by nextpnr on the real "
            "package (ECP5: LFE5U-85F-6 CABGA381 of the ULX3S; iCE40: UP5K SG48 of the "
            "iCEBreaker); Fmax is nextpnr's achieved figure at the highest passing "
            "constraint (seed 1; a few % varies with the seed). Resource counts are "
            "nextpnr's, for array and harness. Products beyond the part's DSP blocks are "
            "built in LUTs (`lut_multipliers`).",
            "- *core*: the whole core (`hdl/core.py`, default memories for the preset) "
            "through yosys alone: cell counts after `synth_ecp5` / `synth_ice40 -dsp`, "
            "no placement, no Fmax.",
            "",
        ]
        rows = []
        for b in synth["builds"]:
            b = {**b, "config": b["config"] + (f" ({b['preset']} preset)" if b.get("preset")
                                                 in ("icebreaker", "ulx3s") else "")}
            res = b.get("resources", {})
            if b["kind"] == "array":
                av = b.get("available", {})
                lut_key = "TRELLIS_COMB" if b["board"] == "ecp5" else "ICESTORM_LC"
                dsp_key = "MULT18X18D" if b["board"] == "ecp5" else "ICESTORM_DSP"
                lut = f"{_n(res.get('lut'))} / {_n(av.get(lut_key))}"
                dsp = f"{_n(res.get('dsp'))} / {_n(av.get(dsp_key))}"
                ff = _n(res.get("ff")) if res.get("ff") is not None else "in LCs"
                bram = _n(res.get("bram"))
                if res.get("lut") is None:          # no placement: yosys's figures
                    ys = res.get("yosys_array", {})
                    lut = (f"yosys: {_n(ys.get('lut4'))} LUT4 + {_n(ys.get('carry'))} carry")
                    dsp, ff, bram = (f"yosys: {_n(ys.get('dsp'))}", f"yosys: {_n(ys.get('ff'))}",
                                     "-")
                runs = "; ".join(f"{x['constraint_mhz']:g} -> {x['achieved_mhz']:.1f}"
                                 f"{'' if x['passed'] else ' fail'}" for x in b.get("runs", []))
                fmax = (f"**{b['fmax_mhz']:.1f} MHz**" if b.get("fmax_mhz") else
                        f"none passed (best {_n(b.get('best_achieved_mhz'), 1)})"
                        if b.get("runs") else "not routed")
                note = "; ".join(([f"nextpnr runs: {runs}"] if runs else [])
                                 + b.get("errors", []))
            else:
                cap = PART_CAPACITY[b["board"]]
                lut = f"{_n(res.get('lut4'))} LUT4 + {_n(res.get('carry'))} carry"
                dsp = f"{_n(res.get('dsp'))} / {cap['dsp']}"
                bram = f"{_n(res.get('bram'))} / {cap['bram']}"
                ff = _n(res.get("ff"))
                fmax = "(yosys only)"
                over = [f"{what} {res.get(key)} > {cap[key]}" for key, what in
                        (("lut4", "LUT4"), ("dsp", "DSP"), ("bram", "block RAM"))
                        if (res.get(key) or 0) > cap[key]]
                note = "; ".join(b.get("errors", [])) or (
                    f"does not fit the part: {', '.join(over)}" if over else
                    "within the part's LUT4, DSP and block-RAM counts (yosys, before packing; "
                    "placement decides)")
            rows.append([b["kind"], b["part"].split(":")[0], b["config"], lut, ff, dsp, bram,
                         fmax, f"{b['wall_s']:.0f} s", b.get("date", synth["date"])[:10], note])
        out += _table(["what", "board", "config", "LUT4 (LCs on iCE40)", "FF", "DSP",
                       "block RAM", "Fmax", "time", "date", "notes"], rows)
        if synth.get("skipped"):
            out += [f"Not built within the sweep's budget: {', '.join(synth['skipped'])}.", ""]
        out += [
            f"![resources and Fmax against array size]({rel['synth']})",
            "",
            "What limits them: on ECP5 every product sits in a MULT18X18D (156 on the 85F, "
            "so 16x16 puts 100 products in LUTs), and the array's Fmax is set by the DSP "
            "and its routing (operand register, MULT18X18D, product register); larger arrays "
            "route longer. On the iCE40UP5K the 8 SB_MAC16 hold 8 products and the rest are "
            "LUT multipliers, which set the clock; 8x8 does not fit the part's 5,280 LCs. The "
            "whole core with the host link (`make bitstream`, README): the ULX3S build "
            "(`ulx3s` preset, 8x8) meets 135 MHz (Fmax 137.44 MHz, 17.3 GOPS), limited by "
            "control paths of a few LUTs and much routing (the hazard ranges' compares, "
            "7.3 ns; the front end's state, 7.0-7.1 ns) and the MULT18X18D's routing "
            "(7.1-7.2 ns); "
            "`make bitstream BOARD=ulx3s "
            "BOARD_ARGS=\"--paths 40\"` lists them), not the array; its block RAMs read "
            "through their output registers (without them a read into a flip-flop reaches "
            "149 MHz at best, `python -m bench.ecp5_bram`). The iCEBreaker build "
            "(`icebreaker` preset, 4x4 int8, the products two to an SB_MAC16) meets 24 MHz "
            "(27.24 MHz) in 5,082 of 5,280 logic cells.",
            "",
            "Reference figures: tinyTPU 14x14 at 177.77 MHz on a Zynq-7020 (up to 72.18 GOPS); "
            "VTA 16x16 int8 at 100 MHz on a PYNQ Zynq-7020 (51.2 GOPS peak); Gemmini 16x16 "
            "needs 136k LUTs on an Artix-7 100T; TPU v1 256x256 at 700 MHz (92 TOPS). Peak "
            "for ours is 2 x rows x cols x Fmax: "
            + ", ".join(f"{b['config']} on {b['board']} {_gops(b):.2f} GOPS"
                        for b in synth["builds"] if b["kind"] == "array" and b.get("fmax_mhz"))
            + " for the array alone.",
            "",
        ]
    else:
        out += ["No synthesis sweep recorded yet: run `python -m bench.report --synth`.", ""]

    # Simulation speed.
    out += [
        "## Simulation speed",
        "",
        f"Simulated clock cycles per second of wall time, from `bench/results/simspeed.json` "
        f"(measured {meta.get('simspeed_date', '-')}; `python -m bench.report --rerun` "
        f"measures it again). Two kinds of driver:",
        "",
        "- *stream drivers*: the matrix unit (weight FIFO + array) fed by the unit tests' "
        "per-cycle stream drivers and monitor (`sim/rtl/streams.py`, which insert random "
        "valid/ready stalls in the tests; none here, so a row enters every cycle), every "
        "output row checked against the golden model (`bench/tb_stream.py` under cocotb, "
        "4 tiles x 256 rows on Verilator, fewer on Icarus; an async `amaranth.sim` "
        "testbench doing the same in `bench/measure.py`); builds excluded.",
        "- *fast transport*: the whole core running a GEMM program (checked against the ISA "
        "simulator) whose beats sit in simulator memory. Under cocotb this is the RTL "
        "transport (`firmware/transports/rtl.py`, the host bridge `sim/rtl/host_bridge.py`; "
        "Python visits only between programs), steady state of the second run; in "
        "amaranth.sim a wrapper feeds the core from a ROM of the beats and counts its "
        "answers into a RAM, the testbench waiting for the last one (`bench/measure.py`). "
        "Smaller GEMMs on the slower simulators (the rate is per cycle).",
        "",
    ]
    sims = [s for s in SIM_ORDER if any(x["sim"] == s for x in speed)]
    drivers = list(dict.fromkeys(s["driver"] for s in speed))
    rows = []
    for driver in drivers:
        for size in sorted({s["config"] for s in speed if s["driver"] == driver}, key=_pes):
            cells = []
            for sim in sims:
                hit = [s for s in speed if s["sim"] == sim and s["driver"] == driver
                       and s["config"] == size]
                cells.append(_n(hit[0]["cycles_per_s"]) if hit else "-")
            rows.append([driver, size, *cells])
    out += _table(["driver", "array", *sims], rows)
    out += [
        f"![simulated cycles per second against array size]({rel['simspeed']})",
        "",
        "What limits them: with the stream drivers, Python runs every cycle (a drive, a "
        "sample, a check), so the simulator is waiting on Python; Icarus also interprets "
        "the design, which grows with rows x cols. The RTL transport leaves Verilator "
        "running free, so it is bound by the design's evaluation; Icarus gains less because "
        "its own interpretation dominates. Reference (this project's earlier measurements "
        "of a naive 5,000-row stream with cocotb 2.1, no waves): Icarus 9,835 / 3,387 / 694 "
        "and Verilator 49,024 / 37,686 / 21,481 cycles/s at 4x4 / 8x8 / 16x16; amaranth.sim "
        "5,420 / 1,954 / 508.",
        "",
        "## Reproducing",
        "",
        "```sh",
        "make report                                  # workloads on the RTL, plots, this page",
        ".venv/bin/python -m bench.report --rerun     # also simulation speed (minutes)",
        ".venv/bin/python -m bench.report --synth     # also the synthesis sweep (~40 min)",
        ".venv/bin/python -m bench.report --cached    # only redraw from bench/results/",
        "```",
        "",
    ]
    path.write_text("\n".join(out))
    return path


# Command line -----------------------------------------------------------------------------

def _load(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


def _save(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _commit() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure_speed(sizes, say=print) -> list[dict]:
    """Simulation speed of every simulator and driver on each array size."""
    from bench import measure
    speed = []
    for size in sizes:
        small = _pes(size) <= 16
        for sim in ("verilator", "icarus"):
            rows = 256 if sim == "verilator" else (128 if small else 32)
            speed.append(measure.stream_speed(size, sim, tiles=4, rows=rows))
            say(f"  stream {sim} {size}: {speed[-1]['cycles_per_s']:,.0f} cycles/s")
        speed.append(measure.amaranth_stream_speed(size, tiles=4, rows=128 if small else 32))
        say(f"  stream amaranth.sim {size}: {speed[-1]['cycles_per_s']:,.0f} cycles/s")
        for sim, gemm in (("verilator", 64), ("icarus", 32 if small else 16)):
            speed.append(measure.transport_speed(size, sim, gemm))
            say(f"  transport {sim} {size}: {speed[-1]['cycles_per_s']:,.0f} cycles/s")
        speed.append(measure.amaranth_program_speed(size, 16 if small else 8))
        say(f"  program amaranth.sim {size}: {speed[-1]['cycles_per_s']:,.0f} cycles/s")
    return speed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rerun", action="store_true",
                        help="also measure simulation speed again (minutes)")
    parser.add_argument("--synth", action="store_true",
                        help="also run the synthesis sweep again (up to ~40 minutes)")
    parser.add_argument("--cached", action="store_true",
                        help="measure nothing: redraw from bench/results/")
    parser.add_argument("--sizes", nargs="+", default=None, help="arrays (default 4x4 8x8 16x16)")
    parser.add_argument("--images", type=int, default=360, help="test images per network")
    parser.add_argument("--docs", type=Path, default=DOCS, help="output folder (default docs/)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="folder of the cached measurements (default bench/results/)")
    args = parser.parse_args(argv)
    from bench.measure import SIZES
    sizes = tuple(args.sizes or SIZES)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"report [{time.monotonic() - started:6.0f} s] {message}", flush=True)

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    wl_path = args.results / "workloads.json"
    sp_path = args.results / "simspeed.json"
    sy_path = args.results / "synth_sweep.json"

    if args.cached:
        wl_doc = _load(wl_path, None)
        if wl_doc is None:
            parser.error(f"--cached: {wl_path} is missing; run without --cached first")
    else:
        from bench.measure import measure_workloads
        wl_doc = {"date": now, "machine": machine(), "images": args.images,
                  "commit": _commit(),
                  "records": measure_workloads(sizes, images=args.images, say=say)}
        _save(wl_path, wl_doc)
    sp_doc = _load(sp_path, None)
    if not args.cached and (args.rerun or sp_doc is None):
        say("simulation speed ...")
        sp_doc = {"date": now, "machine": machine(), "records": measure_speed(sizes, say)}
        _save(sp_path, sp_doc)
    sp_doc = sp_doc or {"date": "-", "records": []}
    if args.synth:
        from bench.synth_sweep import sweep
        say("synthesis sweep ...")
        _save(sy_path, sweep(budget_s=1500.0))
    synth = _load(sy_path, {})
    models = _load(args.results / "models.json", None)

    img_dir = args.docs / "img"
    img_dir.mkdir(parents=True, exist_ok=True)
    records = wl_doc["records"]
    img = {"cycles": plot_cycles_utilisation(records, img_dir / "perf_cycles_utilisation.png"),
           "roofline": plot_roofline(records, img_dir / "perf_roofline.png"),
           "synth": plot_synthesis(synth, img_dir / "perf_synthesis.png"),
           "simspeed": plot_simspeed(sp_doc["records"], img_dir / "perf_simspeed.png")}
    # The commit the workloads were measured at (a --cached report of a later tree says
    # the measurement's, not its own).
    meta = {"date": wl_doc["date"], "machine": wl_doc["machine"],
            "commit": wl_doc.get("commit", _commit()),
            "images": wl_doc["images"], "simspeed_date": sp_doc["date"]}
    page = write_markdown(args.docs / "performance.md", workloads=records,
                          speed=sp_doc["records"], synth=synth, meta=meta, img=img,
                          models=models)
    say(f"wrote {page} and {len(img)} plots in {img_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
