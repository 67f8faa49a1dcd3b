"""``amtpu demo --net transformer``: the digits Transformer encoder
(:mod:`firmware.models.transformer`, committed float weights) quantised to its int8 graph and
run with :func:`firmware.runtime.graph.run_graph`: the embedding, the Q, K, V and output
projections, the FFN (residual adds included, as extra matmul rows), the classifier and, on a
core with UB_TO_WEIGHTS, the programmable table and the row scale, each head's ``q k^T``
(``k^T`` made on chip), its exp (the table) and ``e v`` divided by the row sums (NORMALISE)
on the core, in one program with the q, k and v projections
(:mod:`firmware.compiler.attention_block`); what a core cannot run (LayerNorm on every core;
attention's parts on a core without those instructions) on the host between the core's
steps, each with its integer semantics (:mod:`firmware.graph`).
Every tensor the core computes is compared with the integer reference, element by element.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

__all__ = ["demo", "placement"]


def placement(graph, n: int, config) -> tuple[list[dict], int]:
    """Per operator of ``graph``: where it runs, its MACs and the elements it writes for
    ``n`` sequences; and the bytes that cross between host and core for them (each core
    step's input goes to the core and its output comes back), lowered for ``config``."""
    from firmware.compiler.lowering import AttentionBlockStep, AttentionStep, CoreStep, lower
    from firmware.compiler.lowering import placement as where

    core_io = set()
    for step in lower(graph, config):
        if isinstance(step, CoreStep | AttentionBlockStep):
            core_io.update((step.input, step.output))
        elif isinstance(step, AttentionStep):
            core_io.update((*step.op.inputs, step.output))
    runs_on = where(graph, config)
    rows = []
    for op in graph.ops:
        out = graph.tensors[op.outputs[0]]
        elements = int(np.prod(out.shape[1:])) * n
        rows.append({"name": op.name, "op": type(op).__name__,
                     "runs on": runs_on[op.name],
                     "macs": op.macs(graph) * n // graph.tensors[graph.inputs[0]].shape[0],
                     "elements": elements})
    link = sum(int(np.prod(graph.tensors[t].shape[1:])) * n for t in core_io)
    return rows, link


def demo(args: argparse.Namespace, print_counters=None) -> int:
    """Run the digits Transformer on ``args.transport`` (see the module notes).
    ``print_counters(counters, config, images)`` prints the core's counters."""
    from firmware.compiler.attention_block import AttentionBlockExecutable
    from firmware.compiler.lowering import AttentionBlockStep, lower
    from firmware.datasets import digits
    from firmware.device import open_device, transport_options
    from firmware.models import transformer as tf
    from firmware.runtime.graph import run_graph
    from hdl.presets import get_config

    config = get_config(args.config)
    split = digits()
    n = len(split.x_test) if args.images is None else min(args.images, len(split.x_test))
    if n < 1:
        print("demo: --images must be at least 1", file=sys.stderr)
        return 2
    x, y = split.x_test[:n], split.y_test[:n]
    t0 = time.perf_counter()
    params = tf.load_params()
    graph = tf.quantise(params, split.x_train[:tf.CALIBRATION])
    inputs = tf.graph_inputs(x)
    reference = graph.reference(inputs, collect=True)
    print(f"amtpu demo: transformer (the digits as {tf.TOKENS} tokens of {tf.TOKEN_DIM} "
          f"pixels, d_model {tf.D_MODEL}, {tf.HEADS} heads, FFN {tf.D_FF}, {tf.LAYERS} "
          f"layer) on the {config.name} core ({args.config}), {n} test images, transport "
          f"{args.transport}" + (f" ({args.sim})" if args.transport == "rtl" else ""))
    print(f"  quantised in {time.perf_counter() - t0:.1f} s (scales from "
          f"{tf.CALIBRATION} training images; exp's table offset {graph.exp_offset})")

    options = transport_options(args.transport, sim=args.sim, waves=args.waves, port=args.port,
                                baudrate=args.baud)
    t1 = time.perf_counter()
    device = open_device(args.transport, config, **options)
    try:
        result = run_graph(graph, inputs, device=device)
    finally:
        device.close()
    wall = time.perf_counter() - t1

    acc_float = float((tf.forward(params, x).argmax(axis=1) == y).mean())
    acc_ref = float((reference["logits"].argmax(axis=1) == y).mean())
    out = result.outputs["logits"]
    acc_dev = float((out.argmax(axis=1) == y).mean())
    print(f"  accuracy: float {100 * acc_float:.2f} %, int8 reference {100 * acc_ref:.2f} %, "
          f"{args.transport} {100 * acc_dev:.2f} %")
    rows, link = placement(graph, n, config)
    # (A tensor that never left the core, the scores an exp table reads, is not compared:
    # its readers' outputs are.)
    differing = [op.name for op in graph.ops if op.outputs[0] in result.tensors and
                 not np.array_equal(result.tensors[op.outputs[0]], reference[op.outputs[0]])]
    seen = {op.name for op in graph.ops if op.outputs[0] in result.tensors}
    core_elements = sum(r["elements"] for r in rows if r["runs on"] == "core" and
                        r["name"] in seen)
    print(f"  {args.transport} outputs equal to the int8 reference: "
          + ("every one of " f"{out.size:,} logits and {core_elements:,} elements the core "
             "computed" if not differing else f"NO: {', '.join(differing)} differ"))
    print("  where each operator ran:")
    for row in rows:
        unit = row["runs on"]
        if unit == "core":      # (a table lookup is the activation unit's; the rest the array's)
            unit = "activation unit" if row["op"] == "Lookup" else "array"
        print(f"    {row['name']:<12} {row['op']:<16} {unit:<15} "
              f"{row['macs'] // n:>6,} MACs a sequence")
    host = [r for r in rows if r["runs on"] == "host" and r["op"] not in ("Concat", "Reshape")]
    print(f"  on the host: {len(host)} operators ({', '.join(r['name'] for r in host)}), "
          f"{sum(r['macs'] for r in host) // n:,} MACs and "
          f"{sum(r['elements'] for r in host) // n:,} output elements a sequence; "
          f"{link // n:,} bytes a sequence cross between host and core")
    cycles = result.cycles
    if cycles:
        print(f"  core cycles per sequence: {cycles / n:,.1f} ({cycles:,} cycles for {n} "
              f"sequences, {len(result.segments)} core steps; the host's operators are "
              f"not in these cycles)")
        steps: dict[str, int] = {}
        for seg in result.segments:
            c = seg["counters"].get("cycles")
            if c is not None:
                steps[seg["name"]] = steps.get(seg["name"], 0) + c
        macs = {r["name"]: r["macs"] for r in rows}
        blocks = [step for step in lower(graph, config) if isinstance(step, AttentionBlockStep)]
        for step in blocks:
            macs[step.name] = sum(macs[op.name] for op in step.ops)
        cells = config.rows * config.cols

        def used(name: str, c: int) -> str:
            # The step's MACs over the array's slots in its cycles (a step named for one
            # operator; a chain's segment is named for its first and last).
            return f", array {100 * macs[name] / (cells * c):.1f} %" if name in macs else ""

        print("  core cycles per sequence by step (share of the core's cycles, array "
              "utilisation in the step):")
        for name, c in steps.items():
            print(f"    {name:<14} {c / n:>8,.1f} ({100 * c / cycles:4.1f} %{used(name, c)})")
        for step in blocks:
            x_t = graph.tensors[step.input]
            block = AttentionBlockExecutable(step, config, x_t.shape[1], x_t.shape[2],
                                             x_t.dtype == "int8")
            rows_in, rows_out = block.host_rows()
            print(f"  {step.name}: one program per {block.sequences_per_program} sequences "
                  f"from the projections' input to the attention output; per sequence "
                  f"{rows_in} buffer rows in ({step.input}) and {rows_out} out "
                  f"({step.output}), no host beat between the projections and the output "
                  f"(q, k, v and exp's e stay in the unified buffer)")
        if print_counters is not None:
            print_counters(result.counters, config, n)
        print(f"  array utilisation over the core's cycles: {result.macs:,} MACs / "
              f"({config.rows}x{config.cols} x {cycles:,} cycles) = "
              f"{100 * result.utilisation:.1f} %")
    print(f"  wall time: {wall:.1f} s for {n} sequences (device start-up included)")
    if differing:
        print("demo: FAILED: the device's tensors differ from the int8 reference",
              file=sys.stderr)
        return 1
    return 0
