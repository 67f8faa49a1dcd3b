"""Attention in one program on the core: the digits Transformer's fused attention block.

    python -m bench.attention [--configs 4x4,8x8,16x16] [--sequences 60] [--transport rtl]
                              [--sim verilator] [--json PATH]

The digits Transformer (:mod:`firmware.models.transformer`) is quantised once to its int8
graph; on each configuration :func:`firmware.compiler.lowering.lower` finds its
:class:`~firmware.compiler.lowering.AttentionBlockStep` (the q, k and v projections, the
scores, exp and the normalised mix) and
:class:`firmware.compiler.attention_block.AttentionBlockExecutable` runs it on the first
``--sequences`` test images' block input (``ref[step.input]``). Where a configuration has no
such step, the executable's CompileError says why.

Prints per configuration:

- sequences per program and programs run;
- cycles per sequence, the block's MACs per sequence (its operators' ``macs``) and the
  array utilisation, MACs / (rows * cols * cycles);
- the counters' shares of the cycles: array active, RAW stall, weight shift;
- the host rows a sequence sends and gets back (nothing else of the block crosses the link);
- the shape bound: the block's MACs over the MAC slots its programs' MATMULs issue
  (``count * rows * cols`` each, from the instruction words), and the utilisation as a share
  of it;
- for comparison, the whole graph run with :func:`firmware.runtime.graph.run_graph` twice on the
  same device: with the block fused (its share of the graph's core cycles) and with the
  block's operators as separate steps (what ``lower`` does where the block does not compile:
  q, k, v, the scores with exp and the mix each its own program), their cycles per sequence
  and utilisation beside the fused block's.

Every output is checked against the int8 reference with ``==`` (the block's output, and the
graph's tensors in both graph runs); the exit status is 1 if any differs. Cycle figures
need the ``rtl`` transport (the ``isa`` one has no counters: they print as n/a). With
``--json PATH`` the figures are written there as JSON (``bench/results/attention.json`` is
the usual place).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from firmware import graph as g
from firmware.asm import instructions
from firmware.compiler import CompileError, lowering
from firmware.compiler.attention_block import AttentionBlockExecutable
from firmware.datasets import digits
from firmware.device import open_device, transport_options
from firmware.models import transformer as tf
from firmware.runtime import run
from firmware.runtime.graph import run_graph
from hdl import isa
from hdl.presets import get_config

__all__ = ["quantised", "block_step", "mac_slots", "measure", "main"]

REPO = Path(__file__).resolve().parent.parent


def quantised(sequences: int):
    """The digits Transformer's int8 graph, its inputs for the first ``sequences`` test
    images and the reference's every tensor."""
    split = digits()
    graph = tf.quantise(tf.load_params(), split.x_train[:tf.CALIBRATION])
    inputs = tf.graph_inputs(split.x_test[:sequences])
    return graph, inputs, graph.reference(inputs, collect=True)


def _attention_ops(graph: g.Graph) -> lowering.AttentionBlockStep:
    """The graph's (first) attention as an AttentionBlockStep, whether or not ``lower`` fuses
    it: the scores, their sole reader (exp), its reader (the mix) and the projections that
    make q, k and v."""
    scores = next(op for op in graph.ops if isinstance(op, g.AttentionScores))
    lookup, = graph.consumers(scores.outputs[0])
    mix, = graph.consumers(lookup.outputs[0])
    producer = {t: op for op in graph.ops for t in op.outputs}
    q, k = (producer[t] for t in scores.inputs)
    v = producer[mix.inputs[1]]
    ops = [op for op in graph.ops if op in (q, k, v, scores, lookup, mix)]
    return lowering.AttentionBlockStep((q, k, v), scores, lookup, mix, ops)


def _executable(graph: g.Graph, step: lowering.AttentionBlockStep,
                config) -> AttentionBlockExecutable:
    x_t = graph.tensors[step.input]
    return AttentionBlockExecutable(step, config, x_t.shape[1], x_t.shape[2],
                                    x_t.dtype == "int8")


def block_step(graph: g.Graph,
               config) -> tuple[lowering.AttentionBlockStep | None, str]:
    """The AttentionBlockStep ``lower`` makes for ``config``, or ``None`` and why not."""
    blocks = [s for s in lowering.lower(graph, config)
              if isinstance(s, lowering.AttentionBlockStep)]
    if blocks:
        return blocks[0], ""
    try:
        _executable(graph, _attention_ops(graph), config)
    except CompileError as e:
        return None, str(e)
    return None, "the block compiles, but lower() does not fuse it on this configuration"


def mac_slots(executable: AttentionBlockExecutable, x: np.ndarray) -> tuple[int, int]:
    """MAC slots the MATMULs of ``executable``'s programs for ``x`` issue (``count * rows *
    cols`` each, read from the instruction words: each word is followed by its data beats),
    and the MATMULs."""
    config = executable.config
    cells = config.rows * config.cols
    slots = matmuls = 0
    for batch in executable.batches(x):
        for opcode, fields in instructions(batch.beats, config):
            if opcode == isa.Opcode.MATMUL:
                slots += fields["count"] * cells
                matmuls += 1
    return slots, matmuls


def _share(counters: dict, key: str) -> float | None:
    value, cycles = counters.get(key), counters.get("cycles")
    return None if value is None or not cycles else value / cycles


def _graph_run(graph, inputs, ref, device, names: list[str], n: int,
               fuse: bool = True) -> dict:
    """``run_graph`` on ``device``: every tensor it computed equal to the reference, and the
    cycles of the steps named ``names`` (the block's) against the graph's."""
    try:
        r = run_graph(graph, inputs, device=device, fuse_attention=fuse)
    except CompileError as e:
        return {"error": str(e)}
    differing = [t for t in r.tensors if t in ref and not np.array_equal(r.tensors[t], ref[t])]
    steps: dict[str, dict] = {}
    for seg in r.segments:
        c = seg["counters"]
        s = steps.setdefault(seg["name"], {"cycles": 0, "array_active": 0, "raw_stall": 0,
                                           "weight_shift": 0})
        for key in s:
            s[key] = None if s[key] is None or c.get(key) is None else s[key] + c[key]
    mine = {name: s for name, s in steps.items() if name in names}
    cycles = r.cycles
    block = None if cycles is None else sum(s["cycles"] for s in mine.values())
    return {"equal": not differing, "differing": differing,
            "steps": list(mine), "block_steps": len(mine),
            "graph_cycles_per_sequence": None if cycles is None else cycles / n,
            "block_cycles_per_sequence": None if block is None else block / n,
            "block_share": None if not cycles else block / cycles,
            "by_step": {name: (None if s["cycles"] is None else s["cycles"] / n)
                        for name, s in mine.items()}}


def measure(graph, inputs, ref, config_key: str, transport: str, sim: str | None,
            compare: bool = True) -> dict:
    """The fused block on ``config_key`` (see the module notes); with ``compare``, the
    whole graph run fused and unfused on the same device."""
    config = get_config(config_key)
    n = len(next(iter(inputs.values())))
    r: dict = {"config": config_key, "rows": config.rows, "cols": config.cols,
               "transport": transport, "sequences": n}
    step, why = block_step(graph, config)
    if step is None:
        r["no_block"] = why
        return r
    exe = _executable(graph, step, config)
    x, want = ref[step.input], ref[step.output]
    macs = int(sum(op.macs(graph) for op in step.ops))       # the graph's batch is 1
    slots, matmuls = mac_slots(exe, x)
    t0 = time.perf_counter()
    device = open_device(transport, config, **transport_options(transport, sim=sim))
    try:
        r["device_start_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = run(device, exe, x)
        r["run_s"] = time.perf_counter() - t0
        if compare:
            t0 = time.perf_counter()
            names = [step.name]
            r["graph_fused"] = _graph_run(graph, inputs, ref, device, names, n)
            sep = [s for s in lowering.lower(graph, config, fuse_attention=False)
                   if not isinstance(s, lowering.HostStep) and any(op in step.ops for op in s.ops)]
            names = [s.segments[0].network.name if isinstance(s, lowering.CoreStep)
                     else s.op.name for s in sep]
            r["graph_separate"] = _graph_run(graph, inputs, ref, device, names, n, fuse=False)
            r["graph_s"] = time.perf_counter() - t0
    finally:
        device.close()
    counters = result.counters
    cycles = counters.get("cycles")
    rows_in, rows_out = exe.host_rows()
    r.update({
        "block": step.name, "ops": [op.name for op in step.ops],
        "equal": bool(np.array_equal(result.outputs, want)),
        "sequences_per_program": exe.sequences_per_program,
        "programs": -(-n // exe.sequences_per_program),
        "counters": counters,
        "cycles_per_sequence": None if cycles is None else cycles / n,
        "macs_per_sequence": macs,
        "utilisation": None if not cycles else macs * n / (config.rows * config.cols * cycles),
        "array_active": _share(counters, "array_active"),
        "raw_stall": _share(counters, "raw_stall"),
        "weight_shift": _share(counters, "weight_shift"),
        "host_rows_in": rows_in, "host_rows_out": rows_out,
        "matmuls_per_sequence": matmuls / n,
        "mac_slots_per_sequence": slots / n,
        "bound": macs * n / slots,
    })
    return r


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _num(v: float | None, fmt: str = ",.1f") -> str:
    return "n/a" if v is None else format(v, fmt)


def report(r: dict) -> None:
    """Print one configuration's figures."""
    print(f"{r['config']} ({r['rows']}x{r['cols']}), {r['transport']}:")
    if "no_block" in r:
        print(f"  no fused attention block: {r['no_block']}")
        return
    cells = r["rows"] * r["cols"]
    print(f"  {r['block']}: {r['sequences']} sequences, {r['sequences_per_program']} a "
          f"program, {r['programs']} programs; outputs == reference: {r['equal']}")
    print(f"  cycles per sequence      {_num(r['cycles_per_sequence'])}")
    print(f"  MACs per sequence        {r['macs_per_sequence']:,}")
    print(f"  array utilisation        {_pct(r['utilisation'])}  (MACs / ({r['rows']}x"
          f"{r['cols']} x cycles))")
    print(f"  array active             {_pct(r['array_active'])} of cycles")
    print(f"  RAW stall                {_pct(r['raw_stall'])} of cycles")
    print(f"  weight shift             {_pct(r['weight_shift'])} of cycles")
    print(f"  host rows per sequence   {r['host_rows_in']} in, {r['host_rows_out']} out")
    print(f"  shape bound              {_pct(r['bound'])}  ({r['macs_per_sequence']:,} MACs / "
          f"{r['mac_slots_per_sequence']:,.1f} MAC slots a sequence, "
          f"{r['matmuls_per_sequence']:.1f} MATMULs a sequence)")
    if r["utilisation"] is not None:
        slots = r["mac_slots_per_sequence"] * r["sequences"]
        print(f"  utilisation of bound     {_pct(r['utilisation'] / r['bound'])}  (the "
              f"MATMULs' rows over the cycles; the counters' useful_macs == the programs' "
              f"MAC slots: {r['counters'].get('useful_macs') == slots})")
    for key, what in (("graph_fused", "whole graph, block fused"),
                      ("graph_separate", "whole graph, block as separate steps")):
        if key not in r:
            continue
        gr = r[key]
        if "error" in gr:
            print(f"  {what}: does not compile: {gr['error']}")
            continue
        print(f"  {what}: tensors == reference: {gr['equal']}"
              + ("" if gr["equal"] else f" ({', '.join(gr['differing'])} differ)"))
        if gr["graph_cycles_per_sequence"] is None:
            continue
        block = gr["block_cycles_per_sequence"]
        util = None if not block else r["macs_per_sequence"] / (cells * block)
        print(f"    graph {_num(gr['graph_cycles_per_sequence'])} cycles a sequence; the "
              f"block's {gr['block_steps']} step(s) {_num(block)} ({_pct(gr['block_share'])} of "
              f"the graph's), array utilisation {_pct(util)}")
        if len(gr["by_step"]) > 1:
            print("    " + ", ".join(f"{name} {_num(c)}" for name, c in gr["by_step"].items()))
    sep, fused = r.get("graph_separate", {}), r.get("graph_fused", {})
    if sep.get("block_cycles_per_sequence") and fused.get("block_cycles_per_sequence"):
        print(f"  fused / separate         {_num(fused['block_cycles_per_sequence'])} / "
              f"{_num(sep['block_cycles_per_sequence'])} cycles a sequence = "
              f"{fused['block_cycles_per_sequence'] / sep['block_cycles_per_sequence']:.2f}")


def _ok(r: dict) -> bool:
    """Whether every output the record compared equals the reference."""
    runs = [r.get("graph_fused", {}), r.get("graph_separate", {})]
    return r.get("equal", True) and all(run.get("equal", True) for run in runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="4x4,8x8,16x16")
    parser.add_argument("--sequences", type=int, default=60)
    parser.add_argument("--transport", default="rtl", choices=("rtl", "isa"))
    parser.add_argument("--sim", default=os.environ.get("SIM"))
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the whole-graph runs (fused and separate steps)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="write the figures as JSON to PATH")
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be at least 1")
    t0 = time.perf_counter()
    graph, inputs, ref = quantised(args.sequences)
    print(f"digits Transformer, int8 graph ({tf.TOKENS} tokens, d_model {tf.D_MODEL}, "
          f"{tf.HEADS} heads), the first {args.sequences} test images, transport "
          f"{args.transport}")
    records = []
    for key in args.configs.split(","):
        r = measure(graph, inputs, ref, key.strip(), args.transport,
                    args.sim if args.transport == "rtl" else None, not args.no_compare)
        report(r)
        records.append(r)
    wall = time.perf_counter() - t0
    failed = [r["config"] for r in records if not _ok(r)]
    print(f"wall time {wall:.0f} s; "
          + (f"FAILED: outputs differ on {', '.join(failed)}" if failed
             else "every output equal to the int8 reference"))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}",
            "wall_s": wall, "records": records}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
