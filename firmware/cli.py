"""The ``amtpu`` command line.

``amtpu demo``: train (or load) a network for the bundled 8x8 digits, quantise it to int8,
compile it for a configuration, run the test split on a device (the RTL core under cocotb by
default) and report accuracy, bit-exactness against the int8 reference, cycles per image and
the core's performance counters in TPU v1's Table 3 categories.

``amtpu run MODEL``: an imported model (:mod:`firmware.importers`) on a device, inputs and
outputs in ``.npz`` files keyed by the model's tensor names; ``--check`` compares every layer
with the framework's own interpreter. ``amtpu compile MODEL -o prog.s``: the model's programs
as assembly text with a per-layer report.

``amtpu asm``: the assembler and disassembler (:mod:`firmware.asm`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["main", "demo", "run_model", "compile_model"]

from firmware.linkrate import BOARDS

#: Clock for images per second: the clock the whole 8x8 core meets on the ULX3S 85F
#: (`make bitstream BOARD=ulx3s`, the ulx3s preset), from the boards' link table.
DEFAULT_CLOCK_MHZ = BOARDS["ulx3s"].clock_mhz

#: ... and for the icebreaker preset, the clock it meets on the iCEBreaker
#: (`make bitstream BOARD=icebreaker`).
ICEBREAKER_CLOCK_MHZ = BOARDS["icebreaker"].clock_mhz

#: TPU v1 Table 3 categories and the counters that measure them.
TABLE3 = (
    ("array active", "array_active"),
    ("weight stall", "weight_stall"),
    ("weight shift", "weight_shift"),
    ("non-matrix", "non_matrix"),
    ("RAW stall", "raw_stall"),
    ("input (host) stall", "host_stall"),
)


def _print_counters(counters: dict, config, images: int) -> None:
    cycles = counters.get("cycles")
    print("  performance counters over the run (TPU v1 Table 3 categories):")
    for label, name in TABLE3:
        value = counters.get(name)
        if value is None:
            print(f"    {label:<20} {'n/a':>12}   (timing-dependent: the isa transport has no "
                  f"clock)")
            continue
        share = f"{100 * value / cycles:6.1f} % of cycles" if cycles else ""
        print(f"    {label:<20} {value:>12,}   {share}")
    for name in ("cycles", "instructions", "useful_macs"):
        value = counters.get(name)
        print(f"    {name:<20} {'n/a' if value is None else f'{value:,}':>12}")
    if cycles:
        util = counters["useful_macs"] / (config.rows * config.cols * cycles)
        print(f"  array busy: the counters' MAC slots / ({config.rows}x{config.cols} x cycles) "
              f"= {100 * util:.1f} %")
        print("  reference: TPU v1 array active 12.7/10.6 % (MLP0/1), 78.2/46.2 % (CNN0/1)")


def _print_link(config, compiled, x_q, clock_mhz: float, per_image: float) -> None:
    """What the board's UART allows beside the core's figure (the ULX3S for any core but the
    icebreaker preset's, as the demo's clock is chosen)."""
    import dataclasses

    from firmware.linkrate import board_for, format_link_rate, link_rate
    board = board_for(config)
    if board is None:
        board = dataclasses.replace(BOARDS["ulx3s"],
                                    name="ULX3S's link (no board is built with this core)")
    board = dataclasses.replace(board, clock_mhz=clock_mhz)
    rate = link_rate(compiled.batches(x_q), config=config, board=board,
                     setup=compiled.setup_program(), cycles_per_image=per_image)
    for line in format_link_rate(rate):
        print(f"  {line}")


def _print_bounds(compiled, counters: dict, images: int, stages: list[dict] | None) -> None:
    """Measured utilisation beside each stage's shape bound (firmware.compiler): the whole
    run from its counters, each stage from a batch run stage by stage."""
    config = compiled.config
    cells = config.rows * config.cols
    measured = compiled.useful_macs() * images / (counters["cycles"] * cells)
    bound = compiled.bound()
    print(f"  array utilisation {100 * measured:.1f} % against the network's shape bound "
          f"{100 * bound:.1f} %: {100 * measured / bound:.1f} % of the bound")
    if not stages:
        return
    print(f"  per stage (one batch of {min(images, compiled.batch_size)}, stage after stage):")
    for row in stages:
        util = row["utilisation"]
        print(f"    {row['name']:<14} shape bound {100 * row['bound']:5.1f} %, measured "
              f"{100 * util:5.1f} % ({100 * util / row['bound']:5.1f} % of the bound), "
              f"{row['cycles']:,} cycles")


def demo(args: argparse.Namespace) -> int:
    if args.net == "onnx":                  # an ONNX model quantised by onnxruntime
        from firmware.onnx_demo import demo as onnx_demo
        return onnx_demo(args, print_counters=_print_counters)
    if args.net == "transformer":           # the digits Transformer's int8 graph
        from firmware.transformer_demo import demo as transformer_demo
        return transformer_demo(args, print_counters=_print_counters)
    from tqdm import tqdm

    from firmware.compiler import compile_network
    from firmware.datasets import digits
    from firmware.device import open_device, transport_options
    from firmware.models import digits as models
    from firmware.quant import quantise, reference_forward
    from firmware.runtime import run
    from hdl.presets import PRESETS, get_config

    config = get_config(args.config)
    split = digits()
    n = len(split.x_test) if args.images is None else min(args.images, len(split.x_test))
    if n < 1:
        print("demo: --images must be at least 1", file=sys.stderr)
        return 2
    x, y = split.x_test[:n], split.y_test[:n]

    t0 = time.perf_counter()
    network = models.build(args.net, split)
    float_pred = network.forward(x).argmax(axis=1)
    # A core for int8 only takes the pixels as int8 (a zero point), else as uint8.
    qnet = quantise(network, split.x_train,
                    input_signed=True if config.operands == "int8" else None)
    compiled = compile_network(qnet, config)
    x_q = qnet.quantise_input(x)
    reference = reference_forward(qnet, x_q)
    print(f"amtpu demo: {args.net} on the {config.name} core ({args.config}), {n} test images, "
          f"transport {args.transport}" + (f" ({args.sim})" if args.transport == "rtl" else "")
          + (f" ({args.port}, {args.baud:,} baud)" if args.transport == "serial" else ""))
    print("  " + compiled.summary().replace("\n", "\n  "))
    print(f"  prepared (train/load, quantise, compile) in {time.perf_counter() - t0:.1f} s")

    options = transport_options(args.transport, sim=args.sim, waves=args.waves, port=args.port,
                                baudrate=args.baud)
    t1 = time.perf_counter()
    device = open_device(args.transport, config, **options)
    try:
        t2 = time.perf_counter()
        with tqdm(total=n, unit="img", desc=f"{args.transport}", disable=args.quiet,
                  file=sys.stderr) as bar:
            result = run(device, compiled, x_q, progress=bar.update)
        t3 = time.perf_counter()
        simulated = device.cycles()
        # Per stage: one batch again, the stages one after another (the run overlaps them).
        stages = compiled.profile(device, x_q) if result.counters.get("cycles") else None
    finally:
        device.close()
    waves = getattr(device, "waves_path", None)

    out = result.outputs
    exact = out.shape == reference.shape and bool(np.array_equal(out, reference))
    mismatches = int((out != reference).sum()) if out.shape == reference.shape else out.size
    acc_float = float((float_pred == y).mean())
    acc_ref = float((reference.argmax(axis=1) == y).mean())
    acc_dev = float((out.argmax(axis=1) == y).mean()) if out.shape == reference.shape else 0.0
    print(f"  accuracy: float {100 * acc_float:.2f} %, int8 reference {100 * acc_ref:.2f} %, "
          f"{args.transport} {100 * acc_dev:.2f} %")
    print(f"  {args.transport} outputs equal to the int8 reference: "
          f"{'every one of ' + format(out.size, ',') + ' elements' if exact else 'NO'}"
          + ("" if exact else f" ({mismatches} elements differ)"))
    cycles = result.counters.get("cycles")
    if cycles:
        per_image = cycles / n
        clock_mhz, clock_note = args.clock_mhz, ""
        if clock_mhz is None:
            if config == PRESETS["icebreaker"]:
                clock_mhz, clock_note = (ICEBREAKER_CLOCK_MHZ,
                                         " (this core's clock on the iCEBreaker)")
            else:
                clock_mhz, clock_note = (DEFAULT_CLOCK_MHZ,
                                         " (the 8x8 core's clock on the ULX3S 85F)")
        print(f"  cycles per image: {per_image:,.1f} ({cycles:,} cycles for {n} images); "
              f"at {clock_mhz:g} MHz{clock_note}: "
              f"{clock_mhz * 1e6 / per_image:,.0f} images/s")
        _print_link(config, compiled, x_q, clock_mhz, per_image)
        _print_bounds(compiled, result.counters, n, stages)
    _print_counters(result.counters, config, n)
    wall = t3 - t2
    # A board's cycle count runs from power-up and is no simulation rate.
    rate = (f", {simulated / wall:,.0f} simulated cycles/s"
            if simulated and args.transport != "serial" else "")
    print(f"  wall time: {wall:.1f} s for {n} images{rate}; device start-up {t2 - t1:.1f} s "
          + ("(opening the port, INFO and RESET)" if args.transport == "serial" else
             "(the simulator's build, once per design and configuration, and its launch)"))
    if waves is not None:
        print(f"  waveform: {waves.with_suffix('.fst')}; open it with: "
              f"gtkwave {waves.with_suffix('.gtkw')}")
    if not exact:
        print("demo: FAILED: the device's outputs differ from the int8 reference",
              file=sys.stderr)
        return 1
    return 0


def _model_inputs(graph, path: str) -> dict[str, np.ndarray]:
    """The model's inputs from an ``.npz``: by the input tensors' names (a single input may
    also be the file's only array, or an ``.npy``); floats are quantised by the input's own
    parameters."""
    from firmware.graph import GraphError
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise GraphError(f"{path}: not an .npz or .npy of the inputs ({error})") from None
    if isinstance(loaded, np.ndarray):
        arrays = {"": loaded}           # an .npy: one array
    else:
        with loaded as npz:
            arrays = {k: npz[k] for k in npz.files}
    if len(graph.inputs) == 1 and len(arrays) == 1 and graph.inputs[0] not in arrays:
        arrays = {graph.inputs[0]: next(iter(arrays.values()))}
    missing = [n for n in graph.inputs if n not in arrays]
    if missing:
        raise GraphError(f"{path} has arrays {sorted(arrays)}; the model takes "
                         f"{graph.inputs}")
    out = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        x = np.asarray(arrays[name])
        if x.ndim == len(t.shape) - 1:
            x = x[None]
        if x.dtype.kind == "f" and t.dtype != "float32":
            if not np.isfinite(x).all():
                raise GraphError(f"input {name} has NaN or infinite values; inputs must be "
                                 f"finite")
            if t.q is None:
                raise GraphError(f"input {name} is float but the model's input has no "
                                 f"quantisation to apply; give {t.dtype} integers")
            x = t.q.quantise(x)
        out[name] = x
    return out


def _framework_check(graph, model: str, inputs: dict, result) -> bool:
    """Per layer, the elements the device (or, on the host, the reference) computed equal
    to the framework's interpreter; prints the table, returns whether all are equal."""
    inside = [t for op in graph.ops for t in op.outputs if t not in result.tensors]
    if inside:
        print(f"  --check: {len(inside)} tensors stay inside programs that run on chip from "
              f"their input to their output, so only those programs' outputs are compared")
    if model.endswith(".onnx"):
        return _onnx_check(graph, model, inputs, result)
    if not model.endswith(".tflite"):
        print("  --check: the framework's interpreter is wired for TFLite and ONNX models only")
        return True
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    try:
        it = Interpreter(model_path=model, experimental_preserve_all_tensors=True,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    except ValueError as error:
        from firmware.importers import ModelError
        first = str(error).split(".Tensor")[0]
        raise ModelError(f"--check: LiteRT's interpreter does not load {model} ({first}); "
                         f"the run above is not checked against it") from None
    it.allocate_tensors()
    index = {t["name"]: t["index"] for t in it.get_tensor_details()}
    n = len(next(iter(inputs.values())))
    want: dict[str, list] = {}
    for i in range(n):
        for name in graph.inputs:
            it.set_tensor(index[name], inputs[name][i:i + 1].astype(
                it.get_tensor(index[name]).dtype))
        it.invoke()
        for op in graph.ops:
            for t in op.outputs:
                want.setdefault(t, []).append(it.get_tensor(index[t]))
    print(f"  --check against LiteRT's reference kernels ({n} inputs):")
    print(f"    {'layer':<60} {'operator':<15} {'runs on':<8} {'equal elements':>20}")
    from firmware.compiler.lowering import where_ran

    where = where_ran(result.steps)
    ok = True
    for op in graph.ops:
        for t in op.outputs:
            if t not in result.tensors:
                continue
            got = np.asarray(result.tensors[t])
            ref = np.concatenate(want[t]).reshape(got.shape)
            equal = int((got == ref).sum())
            ok &= equal == got.size
            print(f"    {t[-60:]:<60} {type(op).__name__:<15} "
                  f"{where.get(op.name, 'host'):<8} {f'{equal:,} / {got.size:,}':>20}")
    return ok


def _onnx_check(graph, model: str, inputs: dict, result) -> bool:
    from firmware.compiler.lowering import where_ran
    from firmware.importers.onnx import onnxruntime_check, onnxruntime_pairs_saturate

    rows = onnxruntime_check(graph, model, inputs, result.tensors, where_ran(result.steps))
    n = len(next(iter(inputs.values())))
    print(f"  --check against onnxruntime ({n} inputs):")
    print(f"    {'tensor':<60} {'operator':<18} {'runs on':<8} {'equal elements':>20}")
    for row in rows:
        cell = f"{row['equal']:,} / {row['size']:,}"
        print(f"    {row['tensor'][-60:]:<60} {row['operator']:<18} {row['runs on']:<8} "
              f"{cell:>20}")
    uint8 = any(offset == 128 for _, offset, _ in getattr(graph, "onnx_names", {}).values())
    reason = onnxruntime_pairs_saturate() if uint8 else None
    if reason:
        print(f"  note: {reason}; where this model's int8 weights meet uint8 activations, "
              "a difference above is onnxruntime's (quantise with int8 activations, or with "
              "reduce_range, for an exact comparison)")
    return all(row["equal"] == row["size"] for row in rows)


def run_model(args: argparse.Namespace) -> int:
    from firmware.device import open_device, transport_options
    from firmware.importers import load_model
    from firmware.runtime.graph import run_graph
    from hdl.presets import get_config

    graph = load_model(args.model)
    inputs = _model_inputs(graph, args.inputs)
    config = get_config(args.config)
    device = open_device(args.transport, config,
                         **transport_options(args.transport, port=args.port))
    try:
        result = run_graph(graph, inputs, device=device)
    finally:
        device.close()
    n = len(next(iter(inputs.values())))
    print(f"amtpu run: {graph.name} on the {config.name} core ({args.config}), {n} inputs, "
          f"transport {args.transport}: {len(graph.ops)} operators, "
          f"{graph.macs():,} MACs per inference, {len(result.segments)} core segments")
    from firmware.compiler.lowering import where_ran

    where = where_ran(result.steps)
    counts = {k: sum(v == k for v in where.values()) for k in ("core", "patches", "host")}
    host = [op.name for op in graph.ops if where.get(op.name) == "host"]
    print(f"  operators: {counts['core']} on the core in programs from their input to their "
          f"output, {counts['patches']} convolutions over patches the host cuts, "
          f"{counts['host']} on the host" + (f" ({', '.join(host)})" if host else ""))
    for name, value in result.outputs.items():
        print(f"  output {name}: shape {value.shape}, first {value.reshape(-1)[:8].tolist()}")
    if result.cycles:
        print(f"  cycles: {result.cycles:,} ({result.cycles / n:,.1f} per inference); "
              f"utilisation (model MACs / ({config.rows}x{config.cols} x cycles)): "
              f"{100 * result.utilisation:.1f} %")
    else:
        print("  cycles: n/a (the isa transport has no clock)")
    if args.outputs:
        np.savez(args.outputs, **result.outputs)
        print(f"  outputs written to {args.outputs}")
    if args.check and not _framework_check(graph, args.model, inputs, result):
        print("amtpu run: FAILED: some layers differ from the framework", file=sys.stderr)
        return 1
    return 0


def compile_model(args: argparse.Namespace) -> int:
    from firmware.asm import disassemble
    from firmware.compiler import compile_stages
    from firmware.compiler.lowering import HostStep, lower
    from firmware.importers import load_model
    from hdl.presets import get_config

    graph = load_model(args.model)
    config = get_config(args.config)
    report = [f"{graph.name} for the {config.name} core ({args.config}): {len(graph.ops)} "
              f"operators, {graph.macs():,} MACs per inference",
              f"{'layer':<48} {'operator':<15} {'output shape':<18} {'runs on':<24} "
              f"{'MACs':>10}  memories"]
    text = []
    for step in lower(graph, config):
        if isinstance(step, HostStep):
            op = step.op
            report.append(f"{op.name[-48:]:<48} {type(op).__name__:<15} "
                          f"{str(graph.tensors[op.outputs[0]].shape):<18} {'host':<24} "
                          f"{op.macs(graph):>10,}  -")
            text.append(f"# host: {type(op).__name__} {op.name}\n")
            continue
        patches = any(getattr(seg, "patches", False) for seg in getattr(step, "segments", ()))
        for op in step.ops:
            where = (f"core, host patches x{len(step.segments)}" if patches else
                     "core, one program" if len(step.ops) > 1 else "core")
            report.append(f"{op.name[-48:]:<48} {type(op).__name__:<15} "
                          f"{str(graph.tensors[op.outputs[0]].shape):<18} {where:<24} "
                          f"{op.macs(graph):>10,}  " + ("" if op is step.ops[-1] else
                                                          "(chained on chip)"))
        tiles = slots = 0
        batch = None
        for seg in step.segments:
            compiled = seg.compiled or compile_stages(seg.network, config, batch_size=None)
            tiles += len(compiled.tiles)
            slots += len(compiled._params)
            batch = compiled.batch_size
            setup, _ = compiled.setup_program()
            x = np.full((1, *seg.network.input_shape), seg.network.input_q.zero_point)
            program = compiled.batch_program(x)
            text.append(f"# segment {seg.network.name}: setup program\n"
                        + disassemble(setup, config)
                        + f"# segment {seg.network.name}: batch program (one input, its "
                          f"rows the input's zero point; the runtime sends the real ones)\n"
                        + disassemble(program.beats, config))
        report[-1] += (f"{tiles} weight tiles, {slots} parameter sets, up to {batch} "
                       f"rows (inputs or positions) per batch program")
    header = "".join(f"# {line}\n" for line in report)
    with open(args.output, "w") as f:
        f.write(header + "".join(text))
    print("\n".join(report))
    print(f"amtpu compile: wrote {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from firmware.device import transport_names
    from firmware.models.digits import NETWORKS

    parser = argparse.ArgumentParser(prog="amtpu", description="amtpu: a TPU-v1-style "
                                     "accelerator in Amaranth; host tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a quantised digits network on the simulated core",
                       description=demo.__doc__ or __doc__)
    d.add_argument("--net", choices=(*NETWORKS, "onnx", "transformer"), default="mlp",
                   help="network (default: mlp); onnx: the MLP exported with skl2onnx, "
                        "quantised by onnxruntime, checked against onnxruntime; "
                        "transformer: the digits Transformer encoder's int8 graph, its "
                        "attention and LayerNorm on the host for now")
    d.add_argument("--config", default="default",
                   help="configuration preset (tiny, small, wide, default, large) or RxC "
                        "(default: default, 8x8)")
    d.add_argument("--transport", choices=transport_names(), default="rtl",
                   help="rtl: the RTL core under cocotb; isa: the ISA simulator; serial: a "
                        "board over its UART (needs --port) (default: rtl)")
    d.add_argument("--sim", choices=("verilator", "icarus"), default="verilator",
                   help="RTL simulator (default: verilator)")
    d.add_argument("--port", default=None,
                   help="serial port or pyserial URL of the board (serial only): /dev/ttyUSB1, "
                        "socket://127.0.0.1:PORT for python -m sim.models.link_model")
    d.add_argument("--baud", type=int, default=3_000_000,
                   help="UART baud rate (serial only; default: 3000000)")
    d.add_argument("--images", type=int, default=None,
                   help="test images to run (default: all 360)")
    d.add_argument("--waves", action="store_true",
                   help="write an FST waveform and a .gtkw under build/waves/ (rtl only)")
    d.add_argument("--clock-mhz", type=float, default=None,
                   help=f"clock for images/s (default: {ICEBREAKER_CLOCK_MHZ:g} for the "
                        f"icebreaker preset, its clock on the iCEBreaker, else "
                        f"{DEFAULT_CLOCK_MHZ:g}, the 8x8 core's clock on the ULX3S)")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    r = sub.add_parser("run", help="run an imported model (.tflite, .onnx) on a device")
    r.add_argument("model", help="the model file")
    r.add_argument("--inputs", required=True,
                   help=".npz of the inputs by the model's input names (float: quantised by "
                        "the model's input parameters; integers: already quantised)")
    r.add_argument("--outputs", default=None, help=".npz to write the outputs to, by name")
    r.add_argument("--config", default="default", help="configuration preset or RxC")
    r.add_argument("--transport", choices=transport_names(), default="isa",
                   help="isa (default), rtl or serial (needs --port)")
    r.add_argument("--port", default=None, help="serial port of the board (serial only)")
    r.add_argument("--check", action="store_true",
                   help="compare every layer with the framework's own interpreter")
    c = sub.add_parser("compile", help="write an imported model's programs as assembly")
    c.add_argument("model", help="the model file")
    c.add_argument("-o", "--output", required=True, help="assembly file to write")
    c.add_argument("--config", default="default", help="configuration preset or RxC")
    a = sub.add_parser("asm", help="assemble or disassemble (python -m firmware.asm)",
                       add_help=False)
    a.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "asm":
        from firmware.asm import main as asm_main
        return asm_main(args.rest)
    if args.command in ("run", "compile"):
        from firmware.compiler import CompileError
        from firmware.device import DeviceError
        from firmware.graph import GraphError
        from firmware.importers import ModelError
        from hdl.config import ConfigError
        if args.command == "run" and (args.transport == "serial") != (args.port is not None):
            parser.error("--transport serial needs --port, and --port needs --transport "
                         "serial")
        try:
            return run_model(args) if args.command == "run" else compile_model(args)
        except (ModelError, GraphError, CompileError, ConfigError, OSError) as error:
            print(f"amtpu {args.command}: {error}", file=sys.stderr)
            return 2
        except DeviceError as error:
            print(f"amtpu {args.command}: {error}", file=sys.stderr)
            return 1
    if args.waves and args.transport != "rtl":
        parser.error("--waves needs --transport rtl")
    if (args.transport == "serial") != (args.port is not None):
        parser.error("--transport serial needs --port (e.g. /dev/ttyUSB1), and --port needs "
                     "--transport serial")
    from firmware.device import DeviceError
    from hdl.config import ConfigError
    try:
        return demo(args)
    except (ConfigError, ValueError) as error:
        print(f"amtpu demo: {error}", file=sys.stderr)
        return 2
    except DeviceError as error:
        if args.transport != "serial":
            raise
        print(f"amtpu demo: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
