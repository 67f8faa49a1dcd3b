"""Measurements for the performance report (:mod:`bench.report`): workloads on the RTL core
with the core's own counters, and simulation speed per simulator, driver and array size.

Every measurement checks its results (the RTL's beats against the ISA simulator's, the
GEMM results against numpy, the networks' outputs against the int8 reference executor) and
fails otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from firmware.gemm import gemm_program, gemm_reference
from firmware.runtime import run, run_program
from firmware.transports.isa import IsaSimDevice
from firmware.transports.rtl import RtlDevice
from hdl.config import TPUConfig
from hdl.isa import Func
from hdl.presets import get_config

__all__ = ["SIZES", "GEMMS", "report_config", "measure_gemm", "measure_network",
           "measure_workloads", "board_links", "stream_speed", "amaranth_stream_speed",
           "transport_speed", "amaranth_program_speed"]

#: Array sizes the report sweeps.
SIZES = ("4x4", "8x8", "16x16")

#: Weight memory of every swept configuration at least, in bytes: the default 8x8's.
WEIGHT_MEMORY_BYTES = 4096

#: GEMM workloads: name, shape (M, K, N), what the shape shows.
GEMMS: tuple[tuple[str, tuple[int, int, int], str], ...] = (
    ("square 64", (64, 64, 64), "square"),
    ("tall-skinny", (512, 16, 16), "many rows, small K and N"),
    ("K >> rows", (64, 128, 8), "long reduction, narrow output"),
    ("batch 1", (1, 64, 64), "one row through a 64x64 layer"),
    ("batch 256", (256, 64, 64), "256 rows through the same layer"),
)

SEED = 2026

#: The two kinds of driver whose simulation speed the report compares.
STREAM = "stream drivers, Python every cycle"
PROGRAM = "fast transport, program in simulator memory"


#: MATMULs in flight on the swept cores whose array is not the default's. A MATMUL holds a
#: slot from its issue until its last row is in the accumulators, its rows plus about
#: ``rows + cols + 6`` cycles, so MATMULs of ``c`` rows stream back to back only with
#: ``(c + rows + cols + 6) / c`` slots. The default's 4 keep its 8x8 array streaming the
#: workloads' MATMULs (8 rows and more). On the 4x4 the unified buffer holds few images of
#: a convolution's input at a time, so a later stage's MATMULs (one per unit) are a few rows
#: long, and the 16x16's latency is twice the 8x8's: both get the most the core takes.
SWEPT_MATMUL_SLOTS = 8


def report_config(size: str) -> TPUConfig:
    """The ``RxC`` configuration on top of the default, with the default's 64 weight tiles
    but at least its 4,096 bytes (4x4: 256 tiles), so every workload's weights stay
    resident, and :data:`SWEPT_MATMUL_SLOTS` MATMUL slots unless the array is the
    default's (then it is the default core)."""
    config = get_config(size)
    default = get_config("default")
    slots = (config.matmul_slots if (config.rows, config.cols) == (default.rows, default.cols)
             else SWEPT_MATMUL_SLOTS)
    return config.replace(weight_mem_tiles=max(config.weight_mem_tiles,
                                               WEIGHT_MEMORY_BYTES // config.tile_words),
                          matmul_slots=slots)


def _record(config: TPUConfig, counters: dict, beats_in: int, beats_out: int,
            program_cycles: int, wall_s: float) -> dict:
    beat_bytes = config.host_width // 8
    return {"config": config.name, "rows": config.rows, "cols": config.cols,
            "host_bytes_per_beat": beat_bytes, "counters": counters,
            "beats_in": beats_in, "beats_out": beats_out,
            "bytes_in": beats_in * beat_bytes, "bytes_out": beats_out * beat_bytes,
            "program_cycles": program_cycles, "wall_s": round(wall_s, 3)}


def measure_gemm(device: RtlDevice, config: TPUConfig, shape: tuple[int, int, int]) -> dict:
    """One GEMM (requantised, ReLU) on ``device``; counters over the matrix phase (from the
    first MATMUL to the end), host beats and core cycles over the whole program."""
    m, k, n = shape
    rng = np.random.default_rng(SEED)
    x = rng.integers(-128, 128, (m, k))
    w = rng.integers(-128, 128, (k, n))
    kwargs = dict(bias=rng.integers(-2**16, 2**16, n), multiplier=rng.integers(1, 2**15, n),
                  shift=24, zero_point=-5, func=Func.RELU)
    plan = gemm_program(config, x, w, measure=True, **kwargs)
    expected = run_program(IsaSimDevice(config), plan.beats, plan.output_beats,
                           instructions=plan.instructions)
    start_cycles, start = device.cycles(), time.perf_counter()
    out = run_program(device, plan.beats, plan.output_beats, instructions=plan.instructions)
    wall = time.perf_counter() - start
    cycles = device.cycles() - start_cycles
    bad = [i for i, (e, o) in enumerate(zip(expected, out, strict=True))
           if e is not None and e != o]
    if bad or not np.array_equal(plan.decode(out), gemm_reference(x, w, **kwargs)):
        raise AssertionError(f"GEMM {shape} on {config.name}: the RTL's result differs")
    r = _record(config, plan.counters(out), len(plan.beats), plan.output_beats, cycles, wall)
    r.update({"m": m, "k": k, "n": n, "ops": 2 * m * k * n,
              "window": "matrix phase: first MATMUL to the end (weights loaded before)"})
    return r


def measure_network(device: RtlDevice, config: TPUConfig, net: str, images: int) -> dict:
    """A digits network over ``images`` test images; counters over the batch programs (the
    resident weights' setup excluded). Beside them: the network's MACs per image and shape
    bounds (:mod:`firmware.compiler`), one batch profiled stage after stage on ``device``
    after the run, and the host link of each board with this array (:func:`board_links`)."""
    from firmware.compiler import compile_network
    from firmware.datasets import digits
    from firmware.models import digits as models
    from firmware.quant import quantise, reference_forward

    split = digits()
    network = models.build(net, split)
    qnet = quantise(network, split.x_train)
    compiled = compile_network(qnet, config)
    x_q = qnet.quantise_input(split.x_test[:images])
    reference = reference_forward(qnet, x_q)
    beats_in = sum(len(b.beats) for b in compiled.batches(x_q))
    beats_out = sum(b.output_beats for b in compiled.batches(x_q))
    start = time.perf_counter()
    result = run(device, compiled, x_q)
    wall = time.perf_counter() - start
    if not np.array_equal(result.outputs, reference):
        raise AssertionError(f"{net} on {config.name}: outputs differ from the int8 reference")
    counters = {k: int(v) for k, v in result.counters.items()}
    # The run overlaps the stages; only a batch run stage by stage tells them apart.
    profile = compiled.profile(device, x_q)
    stages = []
    for bound, prof in zip(compiled.bounds(), profile, strict=True):
        if prof["name"] != bound.name:
            raise AssertionError(f"{net} on {config.name}: profile stage {prof['name']!r} "
                                 f"where the bounds have {bound.name!r}")
        stages.append({"name": bound.name, "useful_macs_per_image": float(bound.useful_macs),
                       "slots_per_image": float(bound.slots), "bound": float(bound.bound),
                       "profile_cycles": prof["cycles"],
                       "profile_array_active": int(prof["array_active"]),
                       "profile_useful_macs": float(prof["useful_macs"]),
                       "profile_utilisation": (None if prof["utilisation"] is None
                                               else float(prof["utilisation"]))})
    cycles = counters["cycles"]
    r = _record(config, counters, beats_in, beats_out, cycles, wall)
    r.update({"images": images, "batch_size": compiled.batch_size,
              "weight_tiles": len(compiled.tiles), "resident_weights": compiled.resident_weights,
              "ops": 2 * counters["useful_macs"],
              "useful_macs_per_image": compiled.useful_macs(),
              "model_macs": compiled.useful_macs() * images,
              "bound": float(compiled.bound()), "stages": stages,
              "profile_images": min(images, compiled.batch_size),
              "cycles_per_image": cycles / images,
              "links": board_links(config, network, split.x_train, split.x_test[:images],
                                   cycles / images),
              "window": "the batch programs (resident weights loaded before)"})
    return r


def board_links(config: TPUConfig, network, x_train: np.ndarray, x: np.ndarray,
                cycles_per_image: float) -> list[dict]:
    """The UART link of every board (:data:`firmware.linkrate.BOARDS`) whose preset has
    ``config``'s array, beside the core's images/s at that board's clock from the measured
    ``cycles_per_image``. The link's bytes are those of ``network`` quantised and compiled for
    the board's own preset (int8 input where it takes int8 operands only, as ``amtpu demo``
    does), over the images ``x``: what that board would be sent. The default counts as the
    ULX3S (:func:`firmware.linkrate.board_for`)."""
    from firmware.compiler import compile_network
    from firmware.linkrate import BOARDS, board_for, link_rate
    from firmware.quant import quantise
    from hdl.presets import PRESETS

    boards = [b for b in BOARDS.values()
              if (PRESETS[b.preset].rows, PRESETS[b.preset].cols) == (config.rows, config.cols)]
    links = []
    for board in boards:
        board_config = PRESETS[board.preset]
        qnet = quantise(network, x_train,
                        input_signed=True if board_config.operands == "int8" else None)
        compiled = compile_network(qnet, board_config)
        rate = link_rate(compiled.batches(qnet.quantise_input(x)), config=board_config,
                         board=board, setup=compiled.setup_program(),
                         cycles_per_image=cycles_per_image)
        links.append({"board": board.name, "preset": board.preset,
                      "clock_mhz": board.clock_mhz, "baud": board.baud,
                      "same_core": board_for(config) == board,
                      "batch_size": compiled.batch_size,
                      "to_board_per_image": rate.to_board_per_image,
                      "from_board_per_image": list(rate.from_board_per_image),
                      "link_images_per_s": rate.images_per_s,
                      "link_images_per_s_worst": rate.images_per_s_worst,
                      "bound_by": rate.bound_by,
                      "core_images_per_s": rate.core_images_per_s})
    return links


def measure_workloads(sizes=SIZES, *, images: int = 360, sim: str = "verilator",
                      say: Callable[[str], None] = print) -> list[dict]:
    """Every GEMM of :data:`GEMMS` and both demo networks on each array size."""
    results = []
    for size in sizes:
        config = report_config(size)
        t0 = time.perf_counter()
        with RtlDevice(config, sim=sim, label=f"report-{size}") as device:
            say(f"workloads on {size}: simulator ready in {time.perf_counter() - t0:.0f} s")
            for name, shape, what in GEMMS:
                r = measure_gemm(device, config, shape)
                r.update({"workload": name, "kind": "gemm", "what": what})
                results.append(r)
                say(f"  {name:<12} {r['counters']['cycles']:>8} cycles")
            for net in ("mlp", "cnn"):
                r = measure_network(device, config, net, images)
                r.update({"workload": net.upper(), "kind": "network",
                          "what": f"digits {net.upper()}, {images} images"})
                results.append(r)
                say(f"  {net.upper():<12} {r['counters']['cycles']:>8} cycles")
    return results


# Simulation speed ------------------------------------------------------------------------

def stream_speed(size: str, sim: str, tiles: int, rows: int) -> dict:
    """cocotb's per-cycle stream drivers and monitor on the matrix unit
    (:mod:`bench.tb_stream`, every output row checked): simulated cycles per second."""
    from bench.utilisation import measure
    r = measure(size, tiles, rows, sim)
    return {"driver": STREAM, "sim": sim, "config": size,
            "cycles": r["cycles_with_fill_and_drain"], "wall_s": r["wall_seconds"],
            "cycles_per_s": r["cycles_per_second"]}


def amaranth_stream_speed(size: str, tiles: int, rows: int) -> dict:
    """The same stream through the matrix unit in amaranth.sim: an async testbench driving
    the activation and weight streams a row a cycle and checking every output row against
    the golden model (random valid/ready stalls off, as in the cocotb bench)."""
    from amaranth.sim import Simulator

    from hdl.datapath.matrix_unit import MatrixUnit
    from sim.models.golden import matrix_unit_stream

    config = get_config(size)
    dut = MatrixUnit(config)
    weights, acts, expected = matrix_unit_stream(config.rows, config.cols, tiles, rows,
                                                 np.random.default_rng(1))
    received: list = []
    total = tiles * rows
    figures: dict = {}

    async def drive(ctx, port, items):
        for item in items:
            ctx.set(port.payload, item)
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def weights_tb(ctx):
        await drive(ctx, dut.i_weight, weights)

    async def acts_tb(ctx):
        await drive(ctx, dut.i_act, acts)

    async def monitor(ctx):
        ctx.set(dut.o_psum.ready, 1)
        start, cycles = time.perf_counter(), 0
        while len(received) < total:
            _, _, valid, payload = await ctx.tick().sample(dut.o_psum.valid, dut.o_psum.payload)
            cycles += 1
            if valid:
                received.append([int(v) for v in payload])
            assert cycles < 10 * total + 1000, "timeout"
        figures.update(cycles=cycles, wall=time.perf_counter() - start)

    sim_ = Simulator(dut)
    sim_.add_clock(1e-8)
    sim_.add_testbench(weights_tb, background=True)
    sim_.add_testbench(acts_tb, background=True)
    sim_.add_testbench(monitor)
    sim_.run()
    got = np.array(received, dtype=np.int64)
    if not np.array_equal(got, np.array(expected)):
        raise AssertionError(f"amaranth.sim stream on {size}: output differs from golden")
    return {"driver": STREAM, "sim": "amaranth.sim", "config": size,
            "cycles": figures["cycles"], "wall_s": figures["wall"],
            "cycles_per_s": figures["cycles"] / figures["wall"]}


def transport_speed(size: str, sim: str, gemm: int) -> dict:
    """The fast RTL transport (beats in simulator memory, Python only between programs):
    simulated core cycles per second of a ``gemm x gemm`` GEMM program (requantised, ReLU,
    checked) on the report's configuration, steady state: the second of two runs on one
    simulator (the first creates the simulator's handles of the bridge's memories)."""
    config = report_config(size)
    start = time.perf_counter()
    with RtlDevice(config, sim=sim, label=f"report-speed-{size}") as device:
        ready = time.perf_counter() - start
        for _ in range(2):
            r = measure_gemm(device, config, (gemm, gemm, gemm))
        build = device.build_seconds
    return {"driver": PROGRAM, "sim": sim, "config": size,
            "cycles": r["program_cycles"], "wall_s": r["wall_s"],
            "cycles_per_s": r["program_cycles"] / r["wall_s"], "build_s": build,
            "ready_s": ready}


def amaranth_program_speed(size: str, gemm: int) -> dict:
    """amaranth.sim's counterpart of the RTL transport: the whole core runs a ``gemm x gemm``
    GEMM program whose beats sit in a memory inside the simulation (fed one a cycle, answers
    counted into another), the testbench waiting only for the last answer. The answers are
    checked against the ISA simulator's."""
    from amaranth.hdl import Elaboratable, Module, Signal
    from amaranth.lib import memory
    from amaranth.sim import Simulator

    from hdl.core import Core

    config = report_config(size)
    rng = np.random.default_rng(SEED)
    x = rng.integers(-128, 128, (gemm, gemm))
    w = rng.integers(-128, 128, (gemm, gemm))
    plan = gemm_program(config, x, w, measure=True, func=Func.RELU, shift=8)
    expected = run_program(IsaSimDevice(config), plan.beats, plan.output_beats,
                           instructions=plan.instructions)

    class ProgramHost(Elaboratable):
        """The core between a ROM of the program's beats and a RAM of its answers."""

        def __init__(self):
            self.core = Core(config)
            self.count = Signal(range(plan.output_beats + 1))
            self.done = Signal()
            self.answers = memory.Memory(shape=config.host_width, depth=plan.output_beats,
                                         init=[])

        def elaborate(self, platform):
            m = Module()
            m.submodules.core = core = self.core
            m.submodules.rom = rom = memory.Memory(shape=config.host_width,
                                                   depth=len(plan.beats), init=plan.beats)
            m.submodules.answers = self.answers
            rd = rom.read_port(domain="comb")
            wr = self.answers.write_port()
            index = Signal(range(len(plan.beats) + 1))
            m.d.comb += [rd.addr.eq(index), core.i_host.payload.eq(rd.data),
                         core.i_host.valid.eq(index < len(plan.beats)),
                         core.o_host.ready.eq(1), wr.addr.eq(self.count),
                         wr.data.eq(core.o_host.payload),
                         wr.en.eq(core.o_host.valid & ~self.done),
                         self.done.eq(self.count == plan.output_beats)]
            with m.If(core.i_host.valid & core.i_host.ready):
                m.d.sync += index.eq(index + 1)
            with m.If(core.o_host.valid & ~self.done):
                m.d.sync += self.count.eq(self.count + 1)
            return m

    top = ProgramHost()
    figures: dict = {}

    async def testbench(ctx):
        start = time.perf_counter()
        cycles = 0
        while not ctx.get(top.done):
            await ctx.tick()
            cycles += 1
            assert cycles < 200_000, "timeout"
        figures.update(cycles=cycles, wall=time.perf_counter() - start,
                       out=[ctx.get(top.answers.data[i]) for i in range(plan.output_beats)])

    sim_ = Simulator(top)
    sim_.add_clock(1e-8)
    sim_.add_testbench(testbench)
    sim_.run()
    bad = [i for i, (e, o) in enumerate(zip(expected, figures["out"], strict=True))
           if e is not None and e != o]
    if bad:
        raise AssertionError(f"amaranth.sim program on {size}: beat {bad[0]} differs")
    return {"driver": PROGRAM, "sim": "amaranth.sim",
            "config": size, "cycles": figures["cycles"], "wall_s": figures["wall"],
            "cycles_per_s": figures["cycles"] / figures["wall"]}
