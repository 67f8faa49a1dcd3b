"""Whole models on the 8x8 default core: what crosses the host link, and how busy the core is.

    python -m bench.models [--models NAME,...] [--images N] [--no-rtl] [--json PATH]

Per model (:data:`MODELS`): the digits MLP, CNN and Transformer, the three TFLite models of
``../shared/models`` (or ``$AMTPU_MODELS``; skipped, saying so, where that folder is absent)
and :func:`mobilenet_style`, a small graph with what a MobileNet has (a strided convolution with
TFLite's asymmetric SAME padding and ReLU6, depthwise convolutions, one with depth multiplier 2,
pointwise ones, a residual add, a global average pool and a classifier); and
``person_detect@deep``, person_detect on the ``deep`` preset (the default array with an
8,192-row unified buffer, where its activations stay on chip: one program). Prints:

- *operators*: where each of the graph's operators ran, as :func:`lower` placed them: in a core
  step that is not over patches (a chain of convolutions, pooling, tables and fully connected
  operators in one program, a run of fully connected operators, attention) / in a
  convolution over patches the host cuts / on the host;
- *programs*, *instructions*: batch programs the device ran, and the ``instructions`` counter
  summed over the core's segments, per inference;
- *bytes to / from the device* per inference: what the serial transport
  (:mod:`firmware.transports.serial`) would send and receive for the batch programs, framing
  included: ``DATA`` frames as :func:`~firmware.transports.serial.data_payloads` groups the
  beats, one ``ACK`` per ``DATA`` frame and one ``BEAT`` frame per output beat, each encoded by
  :func:`hdl.link.protocol.encode_frame` with the sequence numbers a freshly opened serial
  device would use (so escapes and CRCs are the real ones), for the ULX3S's link (the default
  preset's board, :func:`firmware.linkrate.board_for`). The resident setup programs (weights
  sent once per run) are reported apart, in the JSON;
- *RTL cycles* per inference (the core's ``cycles`` counter over the batch programs, Verilator),
  the *utilisation* ``MACs / (cycles * rows * cols)`` with the graph's MACs, and the *shape
  bound*: the graph's MACs over the MAC slots the segments' passes issue
  (:meth:`~firmware.compiler.CompiledNetwork.bounds`, per image times the images a segment runs
  per inference), what the utilisation would be if the array never waited; ``-`` where a core
  step has no such count (attention's programs).

The counts come from a run on a freshly opened ISA simulator through :class:`CountingDevice`,
which forwards every call to the device and records each program it sends and the beats that
come back. Every run's outputs must equal the graph's integer reference, and the RTL run's
programs and the number of beats they answer the ISA run's, or the bench fails. Figures go to
``bench/results/models.json`` (``--json``), keyed by the measured tree's commit (``git rev-parse
--short HEAD``; ``<commit>-dirty`` where firmware/, hdl/ or sim/ have uncommitted changes),
earlier commits' entries kept. To measure another commit, run this file in a worktree of it.

The bench reads the API of the tree it runs in: at 12448fc (before graph.from_network and the
compiler's lowering) the lowering and ``run_graph`` were :mod:`firmware.graph`'s, every
convolution ran over patches, and the digits MLP and CNN run through
``compile_network(qnet)`` and :func:`firmware.runtime.run`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from firmware.asm import encode
from firmware.device import open_device, transport_options
from firmware.graph import (
    INT_RANGES,
    Add,
    AveragePool2D,
    Conv2D,
    FullyConnected,
    Graph,
    Reshape,
    requant_from_real,
)
from firmware.graph import Tensor as GTensor
from firmware.linkrate import board_for
from firmware.quant import QParams
from firmware.transports.serial import data_payloads
from hdl import isa
from hdl.beats import DONE_MAGIC
from hdl.isa import Func
from hdl.link.protocol import Kind, encode_frame
from hdl.presets import get_config

try:        # the compiler's lowering and the runtime's graph runner (b6331bb on)
    from firmware.compiler.lowering import (
        AttentionBlockStep,
        AttentionStep,
        CoreStep,
        HostStep,
    )
    from firmware.runtime.graph import run_graph
except ImportError:     # before: both in firmware.graph
    from firmware.graph import AttentionBlockStep, AttentionStep, CoreStep, HostStep, run_graph
try:
    from firmware.graph import from_network
except ImportError:     # before 24ec6d6: the layer API's networks compile on their own
    from_network = None

__all__ = ["MODELS", "CountingDevice", "Program", "mobilenet_style", "load", "measure",
           "format_table", "main"]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "models.json"
MODELS_DIR = Path(os.environ.get("AMTPU_MODELS", REPO.parent / "shared" / "models"))
CONFIG = "default"

#: Model name -> inferences run by default (person_detect's one is most of the bench's time).
MODELS = {"digits-mlp": 8, "digits-cnn": 8, "digits-transformer": 4, "hello_world_int8": 4,
          "micro_speech_quantized": 4, "person_detect": 1, "mobilenet-style": 4,
          "person_detect@deep": 1}
TFLITE = ("hello_world_int8", "micro_speech_quantized", "person_detect")
#: A model measured on another preset than :data:`CONFIG`: ``name@preset`` (person_detect
#: on the preset whose unified buffer holds its activations, one program an inference).
SEED = 2026

#: The programs firmware.runtime.run sends before and after the batches.
_CLEAR = [encode(isa.Opcode.CLEAR_COUNTERS), encode(isa.Opcode.HALT)]
_READ = [encode(isa.Opcode.READ_COUNTERS), encode(isa.Opcode.HALT)]


# Counting what crosses the link -------------------------------------------------------------

@dataclass
class Program:
    """One program a :class:`CountingDevice` sent: its kind (``setup``, ``clear``, ``batch``,
    ``counters``), its beats, the beats it answered with and the serial link's bytes for it
    (``DATA`` frames to the device, their ``ACK``s and the ``BEAT`` frames from it)."""
    kind: str
    beats: list[int]
    run: int
    out: list = field(default_factory=list)
    to_device: int = 0
    acks: int = 0
    beat_frames: int = 0

    @property
    def from_device(self) -> int:
        return self.acks + self.beat_frames

    @property
    def instructions(self) -> int | None:
        """Instructions in the program (HALT included), from its DONE beat."""
        done = self.out[-1] if self.out else None
        return None if done is None or done >> 32 != DONE_MAGIC else done & 0xFFFF_FFFF


class CountingDevice:
    """A :class:`firmware.device.Device` that forwards every call to ``device`` and records the
    programs sent to it (:attr:`programs`), with the bytes a serial device freshly opened on
    ``board``'s link would exchange for them: its sequence numbers as the transport counts
    them (``INFO`` and ``RESET`` when it opens, a ``STATUS`` for every :meth:`status` and
    :meth:`cycles`), so escapes and CRCs are the real ones.

    :func:`firmware.runtime.run` sends a program per ``send`` (``run_program``): the setup
    program, ``CLEAR_COUNTERS; HALT``, the batch programs, ``READ_COUNTERS; HALT``. The two
    counter programs mark where the batches start and end; a program outside them is a setup
    program, which starts a new run."""

    def __init__(self, device, board):
        self.device = device
        self.config = device.config
        self.board = board
        self.beat_bytes = device.config.host_width // 8
        self.programs: list[Program] = []
        self.runs = 0
        self._in_batches = False
        self._seq = 2           # INFO (1) and RESET (2) when the serial device opens
        self._beat_seq = 0      # the board numbers its BEAT frames from 0 after the reset

    def _frame(self, kind: Kind, payload: bytes = b"") -> int:
        self._seq = (self._seq + 1) & 0xFF
        return len(encode_frame(kind, self._seq, payload))

    def send(self, beats) -> None:
        beats = [int(b) for b in beats]
        if beats == _CLEAR:
            kind = "clear"
        elif beats == _READ:
            kind = "counters"
        else:
            kind = "batch" if self._in_batches else "setup"
        if kind in ("setup", "clear") and (not self.programs or
                                           self.programs[-1].kind == "counters"):
            self.runs += 1
        self._in_batches = kind in ("clear", "batch")
        p = Program(kind, beats, self.runs - 1)
        for payload in data_payloads(beats, beat_bytes=self.beat_bytes,
                                     max_beats=self.board.max_beats):
            p.to_device += self._frame(Kind.DATA, payload)
            p.acks += len(encode_frame(Kind.ACK, self._seq))
        self.programs.append(p)
        self.device.send(beats)

    def receive(self, count: int, **options) -> list[int]:
        out = self.device.receive(count, **options)
        p = self.programs[-1]
        for beat in out:
            if beat is not None:        # (the ISA simulator's timing-dependent counters)
                payload = int(beat).to_bytes(self.beat_bytes, "little")
                p.beat_frames += len(encode_frame(Kind.BEAT, self._beat_seq, payload))
            elif p.kind == "batch":
                raise AssertionError("a batch program answered an unknown beat")
            self._beat_seq = (self._beat_seq + 1) & 0xFF
        p.out += out
        return out

    def status(self):
        self._frame(Kind.STATUS)
        return self.device.status()

    def cycles(self):
        self._frame(Kind.STATUS)       # the serial device asks the board for its cycles
        return self.device.cycles()

    def clear(self) -> None:
        self._frame(Kind.CLEAR)
        self.device.clear()

    def reset(self) -> None:
        self._frame(Kind.RESET)
        self._beat_seq = 0
        self.device.reset()

    def close(self) -> None:
        self.device.close()

    def __getattr__(self, name):
        return getattr(self.device, name)

    def batches(self) -> list[Program]:
        return [p for p in self.programs if p.kind == "batch"]


# The MobileNet-style graph -------------------------------------------------------------------

def mobilenet_style(seed: int = 0, images: int = 4) -> tuple[Graph, dict[str, np.ndarray]]:
    """A small int8 graph shaped like a MobileNet block stack, random int8 weights and int32
    biases (``seed``), and ``images`` random int8 inputs: input 16x16x3; Conv2D 3x3 stride 2
    with TFLite's SAME padding (0, 1, 0, 1) and ReLU6 (CLAMP); depthwise 3x3 with depth
    multiplier 2 and ReLU6; pointwise 1x1 (linear); a residual Add of the first convolution's
    output and the pointwise one's; depthwise 3x3 stride 2, SAME (0, 1, 0, 1), ReLU6;
    pointwise 1x1 with ReLU6; a global AveragePool2D; Reshape; FullyConnected to 10 classes.

    Each layer's scales are set from a calibration batch (32 more random inputs), so that the
    outputs use the int8 range and ReLU6 clips some of them."""
    rng = np.random.default_rng(seed)
    x_cal = rng.integers(-128, 128, (32, 16, 16, 3))
    x = rng.integers(-128, 128, (images, 16, 16, 3))
    tensors: dict[str, GTensor] = {}
    ops: list = []
    values = {"input": x_cal}

    def tensor(name, shape, q):
        tensors[name] = GTensor(name, (1, *shape), "int8", q)
        values.setdefault(name, None)
        return name

    tensor("input", (16, 16, 3), QParams(1 / 32, -1))

    def conv(name, src, kernel, cout, *, stride=1, padding=(0, 0, 0, 0), groups=1,
             relu6=True):
        q_in = tensors[src].q
        cin = tensors[src].shape[-1]
        w = rng.integers(-127, 128, (kernel, kernel, cin // groups, cout))
        b = rng.integers(-2000, 2000, cout)
        probe = Conv2D(name, [src], [name], weight=w, bias=b, input_zp=q_in.zero_point,
                       requant=requant_from_real([1.0], 0), stride=(stride, stride),
                       padding=padding, groups=groups)
        acc = probe.accumulate(values[src]).reshape(-1, cout)
        if relu6:
            # ReLU6's output: 6.0 is 200 steps above the zero point -128; each channel's
            # weight scale puts its 90th percentile at 6.0, so the clamp bites.
            q_out = QParams(6 / 200, -128)
            s_w = 6 / (np.maximum(np.percentile(np.abs(acc), 90, axis=0), 1) * q_in.scale)
            r = requant_from_real(q_in.scale * s_w / q_out.scale, -128, func=Func.CLAMP,
                                  clamp_hi=72, where=name)
        else:
            s_w = np.full(cout, 1 / 64)
            q_out = QParams(float(np.percentile(np.abs(acc), 99)) * q_in.scale / 64 / 120, 0)
            r = requant_from_real(q_in.scale * s_w / q_out.scale, 0, where=name)
        op = Conv2D(name, [src], [name], weight=w, bias=b, input_zp=q_in.zero_point,
                    requant=r, stride=(stride, stride), padding=padding, groups=groups)
        ho, wo = op.out_hw(*tensors[src].shape[1:3])
        tensor(name, (ho, wo, cout), q_out)
        values[name] = op.reference(values[src])[0]
        ops.append(op)
        return name

    c1 = conv("conv1", "input", 3, 8, stride=2, padding=(0, 1, 0, 1))
    dw1 = conv("dw1", c1, 3, 16, padding=(1, 1, 1, 1), groups=8)
    pw1 = conv("pw1", dw1, 1, 8, relu6=False)
    qa, qb = tensors[c1].q, tensors[pw1].q
    real = (values[c1] - qa.zero_point) * qa.scale + (values[pw1] - qb.zero_point) * qb.scale
    lo, hi = float(real.min()), float(real.max())
    q_add = QParams((hi - lo) / 255, int(round(-128 - lo / ((hi - lo) / 255))))
    add = Add.from_scales("add", [c1, pw1], ["add"], qa.scale, qa.zero_point, qb.scale,
                          qb.zero_point, q_add.scale, q_add.zero_point, act=(-128, 127))
    tensor("add", tensors[c1].shape[1:], q_add)
    values["add"] = add.reference(values[c1], values[pw1])[0]
    ops.append(add)
    dw2 = conv("dw2", "add", 3, 8, stride=2, padding=(0, 1, 0, 1), groups=8)
    pw2 = conv("pw2", dw2, 1, 16)
    h, w = tensors[pw2].shape[1:3]
    ops.append(AveragePool2D("pool", [pw2], ["pool"], kernel=(h, w), stride=(h, w)))
    tensor("pool", (1, 1, 16), tensors[pw2].q)
    ops.append(Reshape("flatten", ["pool"], ["flat"], shape=(1, 16)))
    tensors["flat"] = GTensor("flat", (1, 16), "int8", tensors[pw2].q)
    values["flat"] = ops[-2].reference(values[pw2])[0].reshape(-1, 16)
    q_in = tensors["flat"].q
    wf = rng.integers(-127, 128, (16, 10))
    bf = rng.integers(-2000, 2000, 10)
    probe = FullyConnected("fc", ["flat"], ["logits"], weight=wf, bias=bf,
                           input_zp=q_in.zero_point, requant=requant_from_real([1.0], 0))
    top = float(np.percentile(np.abs(probe.accumulate(values["flat"])), 99))
    q_out = QParams(top * q_in.scale / 64 / 120, 0)
    ops.append(FullyConnected("fc", ["flat"], ["logits"], weight=wf, bias=bf,
                              input_zp=q_in.zero_point,
                              requant=requant_from_real(q_in.scale / 64 / q_out.scale, 0,
                                                        where="fc")))
    tensors["logits"] = GTensor("logits", (1, 10), "int8", q_out)
    return Graph("mobilenet-style", tensors, ops, ["input"], ["logits"]), {"input": x}


# The models ----------------------------------------------------------------------------------

@dataclass
class Model:
    """A model to measure: a graph and its inputs, or (before graph.from_network) the layer
    API's quantised network ``qnet`` and its quantised inputs."""
    name: str
    graph: Graph | None
    inputs: dict | np.ndarray
    qnet: object = None

    @property
    def images(self) -> int:
        x = self.inputs if self.graph is None else next(iter(self.inputs.values()))
        return len(x)


def load(name: str, images: int) -> Model:
    """The model called ``name`` (a key of :data:`MODELS`) with ``images`` inputs. Raises
    :class:`FileNotFoundError` for a TFLite model whose file is absent."""
    if name in ("digits-mlp", "digits-cnn"):
        from firmware.datasets import digits
        from firmware.models import digits as networks
        from firmware.quant import quantise
        split = digits()
        qnet = quantise(networks.build(name.split("-")[1], split), split.x_train)
        x_q = qnet.quantise_input(split.x_test[:images])
        if from_network is None:
            return Model(name, None, x_q, qnet)
        return Model(name, from_network(qnet), {"input": x_q}, qnet)
    if name == "digits-transformer":
        from firmware.datasets import digits
        from firmware.models import transformer as tf
        split = digits()
        graph = tf.quantise(tf.load_params(), split.x_train[:tf.CALIBRATION])
        return Model(name, graph, tf.graph_inputs(split.x_test[:images]))
    base, _, preset = name.partition("@")
    if preset:
        model = load(base, images)
        model.name = name
        return model
    if name in TFLITE:
        from firmware.importers import load_model
        path = MODELS_DIR / f"{name}.tflite"
        if not path.exists():
            raise FileNotFoundError(f"{path} is absent (the shared models; set AMTPU_MODELS "
                                    f"to their folder)")
        graph = load_model(path)
        t = graph.tensors[graph.inputs[0]]
        lo, hi = INT_RANGES[t.dtype]
        x = np.random.default_rng(SEED).integers(lo, hi + 1, (images, *t.shape[1:]))
        return Model(name, graph, {graph.inputs[0]: x})
    if name == "mobilenet-style":
        graph, inputs = mobilenet_style(seed=0, images=images)
        return Model(name, graph, inputs)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")


# Measuring -----------------------------------------------------------------------------------

def _where(step) -> str:
    """``chain`` (a core step not over patches: one program from its input to its output),
    ``patches`` (a convolution over patches the host cuts) or ``host``."""
    if isinstance(step, HostStep):
        return "host"
    if isinstance(step, AttentionStep | AttentionBlockStep):
        return "chain"
    # Before b96611b a Segment had no ``patches``: every convolution ran over patches then.
    patches = [getattr(seg, "patches", isinstance(step.ops[0], Conv2D))
               for seg in step.segments]
    return "patches" if any(patches) else "chain"


def _network_ops(qnet) -> int:
    """The operators graph.from_network writes for ``qnet``: a stage, its table, its pooling
    and a flatten before a dense stage on an image (the layer API's network, compiled as one
    program before from_network existed)."""
    count, shape = 0, qnet.input_shape
    for st in qnet.stages:
        table = st.func in (Func.SIGMOID, Func.TANH) or st.func.name == "TABLE"
        count += 1 + bool(table) + bool(st.pool) + (st.kind == "dense" and len(shape) > 1)
        shape = st.out_shape
    return count


def _run(model: Model, device, cache: dict):
    """Run ``model`` on ``device``: (outputs, the reference's, per-run records of (where,
    images, counters, executable), the steps)."""
    if model.graph is None:
        from firmware.compiler import compile_network
        from firmware.quant import reference_forward
        from firmware.runtime import run
        compiled = cache.setdefault("compiled", compile_network(model.qnet, device.config))
        r = run(device, compiled, model.inputs)
        return (r.outputs, reference_forward(model.qnet, model.inputs),
                [("chain", r.images, r.counters, compiled)], None)
    r = run_graph(model.graph, model.inputs, device=device, compiled=cache)
    (_, steps, executables), = cache.values()
    # run_graph runs a core step's segments in order, one record each.
    units = []
    for s in steps:
        if isinstance(s, CoreStep):
            units += [(_where(s), executables[id(seg)]) for seg in s.segments]
        elif not isinstance(s, HostStep):
            units.append(("chain", executables[id(s)]))
    records = [(where, seg["images"], seg["counters"], exe)
               for (where, exe), seg in zip(units, r.segments, strict=True)]
    reference = model.graph.reference(model.inputs)
    return r.outputs, reference, records, steps


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    return np.array_equal(a, b)


def measure(model: Model, config, *, rtl=None) -> dict:
    """The figures of ``model`` (see the module notes): counted on the ISA simulator, cycles
    on ``rtl`` (an open RTL device) when given. A preset no board carries (``deep``) is
    counted on the default's board's link (the ULX3S: its 85F holds ``deep``'s memories)."""
    board = board_for(config) or board_for(get_config(CONFIG))
    n = model.images
    isa_dev = CountingDevice(open_device("isa", config), board)
    cache: dict = {}
    try:
        outputs, reference, records, steps = _run(model, isa_dev, cache)
    finally:
        isa_dev.close()
    if not _same(outputs, reference):
        raise AssertionError(f"{model.name}: the ISA simulator's outputs differ from the "
                             f"integer reference")
    if len(records) != isa_dev.runs:
        raise AssertionError(f"{model.name}: {isa_dev.runs} runs seen for {len(records)} "
                             f"segments")
    if steps is None:
        operators = {"chain": _network_ops(model.qnet), "patches": 0, "host": 0}
        kinds = {"chain": 1}
        macs = records[0][3].useful_macs()
    else:
        operators = {"chain": 0, "patches": 0, "host": 0}
        kinds: dict[str, int] = {}
        for s in steps:
            where = _where(s)
            operators[where] += len(s.ops) if not isinstance(s, HostStep) else 1
            kind = ("host" if where == "host" else "attention" if not isinstance(s, CoreStep)
                    else "patches" if where == "patches"
                    else "chain" if any(isinstance(op, Conv2D) for op in s.ops) else "fc")
            kinds[kind] = kinds.get(kind, 0) + 1
        macs = model.graph.macs()

    batches = isa_dev.batches()
    by_where: dict[str, dict] = {}
    for p in batches:
        where = records[p.run][0]
        w = by_where.setdefault(where, {"programs": 0, "to_device": 0, "from_device": 0})
        w["programs"] += 1
        w["to_device"] += p.to_device
        w["from_device"] += p.from_device
    instructions = sum(rec[2]["instructions"] for rec in records)
    slots = None
    if all(hasattr(rec[3], "bounds") for rec in records):
        slots = sum(sum(b.slots for b in rec[3].bounds()) * rec[1] for rec in records) / n
    figures = {
        "images": n,
        "macs": int(macs),
        "operators": operators,
        "steps": kinds,
        "segments": len(records),
        "programs": len(batches) / n,
        "instructions": instructions / n,
        "instruction_beats": sum(p.instructions for p in batches) / n,
        "data_beats": sum(len(p.beats) - p.instructions for p in batches) / n,
        "output_beats": sum(len(p.out) for p in batches) / n,
        "to_device": sum(p.to_device for p in batches) / n,
        "from_device": sum(p.from_device for p in batches) / n,
        "setup_to_device": sum(p.to_device for p in isa_dev.programs if p.kind == "setup"),
        "by_where": {k: {key: v / n for key, v in w.items()} for k, w in by_where.items()},
        "shape_bound": None if slots is None else macs / slots,
        "rtl_images": None, "cycles": None, "utilisation": None,
    }
    if rtl is not None:
        dev = CountingDevice(rtl, board)
        out_rtl, _, rtl_records, _ = _run(model, dev, {})
        if not _same(out_rtl, reference):
            raise AssertionError(f"{model.name}: the RTL core's outputs differ from the "
                                 f"integer reference")
        # The answers' values are not compared: lanes and rows outside the outputs carry
        # whatever the buffers held, which differs after the models run before.
        if [(p.beats, len(p.out)) for p in dev.batches()] != \
                [(p.beats, len(p.out)) for p in batches]:
            raise AssertionError(f"{model.name}: the RTL run's batch programs or the beats "
                                 f"they answered differ from the ISA simulator's")
        cycles = sum(rec[2]["cycles"] for rec in rtl_records)
        figures.update(rtl_images=n, cycles=cycles / n,
                       utilisation=macs * n / (cycles * config.rows * config.cols))
    return figures


# Output --------------------------------------------------------------------------------------

COLUMNS = ("model", "operators (core chained / core patches / host)", "programs/inference",
           "instructions/inference", "bytes to device/inference",
           "bytes from device/inference", "RTL cycles/inference", "utilisation", "shape bound")


def _n(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def row(name: str, f: dict) -> list[str]:
    """A model's figures as the table's cells."""
    o = f["operators"]
    return [name, f"{o['chain']} / {o['patches']} / {o['host']}", _n(f["programs"], 2),
            _n(f["instructions"]), _n(f["to_device"]), _n(f["from_device"]), _n(f["cycles"]),
            _pct(f["utilisation"]), _pct(f["shape_bound"])]


def format_table(models: dict[str, dict]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return lines + ["| " + " | ".join(row(name, f)) + " |" for name, f in models.items()]


def commit(repo: Path = REPO) -> str:
    """The measured tree's commit, ``git rev-parse --short HEAD``."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, text=True,
                          capture_output=True, check=True).stdout.strip()


def dirty(repo: Path = REPO) -> bool:
    """Whether the code the figures depend on differs from the commit's."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                          "firmware", "hdl", "sim"], cwd=repo, text=True,
                         capture_output=True, check=True).stdout
    return bool(out.strip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated (default all: {','.join(MODELS)})")
    parser.add_argument("--images", type=int, default=None,
                        help="inferences per model (default: " + ", ".join(
                            f"{k} {v}" for k, v in MODELS.items()) + ")")
    parser.add_argument("--no-rtl", action="store_true",
                        help="counts only (ISA simulator), no RTL cycles")
    parser.add_argument("--json", type=Path, default=RESULTS,
                        help=f"results file (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; allowed: {', '.join(MODELS)}")
    if args.images is not None and args.images < 1:
        parser.error("--images must be at least 1")
    config = get_config(CONFIG)
    key = commit()
    if dirty():
        print(f"models: note: firmware/, hdl/ or sim/ differ from {key}; the figures are "
              f"recorded as {key}-dirty", file=sys.stderr)
        key += "-dirty"
    rtls: dict = {}         # an RTL device per preset, opened as a model needs it

    def rtl_for(preset: str):
        if args.no_rtl:
            return None
        if preset not in rtls:
            rtls[preset] = open_device("rtl", get_config(preset),
                                       **transport_options("rtl", sim="verilator"))
        return rtls[preset]

    measured: dict[str, dict] = {}
    try:
        for name in names:
            try:
                model = load(name, args.images or MODELS[name])
            except FileNotFoundError as error:
                print(f"models: {name} skipped: {error}", file=sys.stderr)
                continue
            start = time.perf_counter()
            preset = name.partition("@")[2] or CONFIG
            measured[name] = measure(model, get_config(preset), rtl=rtl_for(preset))
            measured[name]["config"] = preset
            print(f"models: {name}: {model.images} inferences measured in "
                  f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    finally:
        for device in rtls.values():
            device.close()
    board = board_for(config)
    print(f"\nWhole models on the {config.name} core ({CONFIG} preset), commit {key}; bytes "
          f"as the serial transport frames them on the {board.name}'s link "
          f"({board.max_beats} beats a DATA frame), batch programs only:\n")
    print("\n".join(format_table(measured)))
    doc = json.loads(args.json.read_text()) if args.json.exists() else {}
    entry = doc.get(key, {})
    entry.update(commit=key, date=datetime.datetime.now(datetime.UTC).strftime(
        "%Y-%m-%d %H:%M UTC"), config=CONFIG, board=board.name, max_beats=board.max_beats)
    entry.setdefault("models", {})
    for name, f in measured.items():
        old = entry["models"].get(name, {})
        if f["cycles"] is None and old.get("cycles") is not None and \
                old.get("images") == f["images"]:
            # A --no-rtl run of the same tree keeps the cycles measured before.
            f.update({k: old[k] for k in ("rtl_images", "cycles", "utilisation")})
        entry["models"][name] = f
    doc[key] = entry
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nmodels: wrote {args.json} ({key})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
