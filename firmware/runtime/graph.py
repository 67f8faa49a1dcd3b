"""Running a :class:`~firmware.graph.Graph` on a device: :func:`run_graph` lowers it
(:func:`firmware.compiler.lower`), compiles its core steps, runs them on the device and its
host steps in numpy, and returns every tensor with the core's counters per segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.compiler.attention import MixExecutable, ScoresExecutable
from firmware.compiler.attention_block import AttentionBlockExecutable
from firmware.compiler.lowering import (
    AttentionBlockStep,
    AttentionStep,
    CoreStep,
    HostStep,
    Segment,
    lower,
)
from firmware.compiler.network import compile_stages
from firmware.device import open_device
from firmware.graph import AttentionScores, Graph, GraphError
from firmware.runtime import run
from hdl.presets import get_config

__all__ = ["GraphRun", "run_graph"]


@dataclass
class GraphRun:
    """What :func:`run_graph` returns: ``outputs`` and every computed tensor by name,
    per-segment counters, the totals, and the ``steps`` of the lowering it ran (where each
    operator ran)."""
    outputs: dict[str, np.ndarray]
    tensors: dict[str, np.ndarray]
    segments: list[dict] = field(default_factory=list)
    macs: int = 0
    array_cells: int = 1
    steps: list = field(default_factory=list)

    def _total(self, key: str) -> int | None:
        values = [s["counters"].get(key) for s in self.segments]
        return None if any(v is None for v in values) else sum(values)

    @property
    def counters(self) -> dict[str, int | None]:
        """The core's counters summed over every segment (``None`` where a segment's device
        has no such counter)."""
        total: dict = {}
        for seg in self.segments:
            for key, value in seg["counters"].items():
                total[key] = None if value is None or total.get(key, 0) is None \
                    else total.get(key, 0) + value
        return total

    @property
    def cycles(self) -> int | None:
        """Core cycles over every segment (``None`` when the device has no timing)."""
        return self._total("cycles")

    @property
    def utilisation(self) -> float | None:
        """The model's MACs over the array's capacity in those cycles."""
        c = self.cycles
        return None if not c else self.macs / (c * self.array_cells)


def _segment_input(step: CoreStep, seg: Segment, x: np.ndarray) -> np.ndarray:
    if seg.patches:
        p = step.ops[0].patches(x)[..., seg.in_channels]
        return p.reshape(-1, seg.network.input_shape[0])
    return np.asarray(x, dtype=np.int64).reshape(-1, *seg.network.input_shape)


def run_graph(graph: Graph, inputs: dict[str, np.ndarray], *, device="isa", config=None,
              compiled: dict | None = None, fuse_attention: bool = True) -> GraphRun:
    """Run ``graph`` on ``inputs`` (by name, integers of the input tensors' types, any
    batch): core steps on ``device`` (a :class:`firmware.device.Device`, or a transport name
    opened for ``config``, the default configuration if none), host steps in numpy.
    ``compiled``: a dict the caller keeps to reuse the lowering and the compiled segments
    between calls for the same graph and configuration. ``fuse_attention``: as for
    :func:`lower`. Raises :class:`firmware.compiler.CompileError` naming the segment when
    one does not fit."""

    own = isinstance(device, str)
    if own:
        device = open_device(device, config or get_config("default"))
    config = device.config
    cache = {} if compiled is None else compiled
    key = (id(graph), config, fuse_attention)
    try:
        values = dict(graph.check_inputs(inputs))
        if key not in cache or cache[key][0] is not graph:
            steps = lower(graph, config, fuse_attention=fuse_attention)
            executables = {id(seg): seg.compiled or compile_stages(seg.network, config)
                           for step in steps if isinstance(step, CoreStep)
                           for seg in step.segments}
            for step in steps:
                if isinstance(step, AttentionBlockStep):
                    x_t = graph.tensors[step.input]
                    executables[id(step)] = AttentionBlockExecutable(
                        step, config, x_t.shape[1], x_t.shape[2], x_t.dtype == "int8")
                if isinstance(step, AttentionStep):
                    op = step.op
                    if isinstance(op, AttentionScores):
                        _, t, c = graph.tensors[op.inputs[0]].shape
                        executables[id(step)] = ScoresExecutable(op, config, t, c,
                                                                 lookup=step.lookup)
                    else:
                        _, h, t, _ = graph.tensors[op.inputs[0]].shape
                        c = graph.tensors[op.inputs[1]].shape[-1]
                        executables[id(step)] = MixExecutable(op, config, t, c, h)
            cache[key] = (graph, steps, executables)
        _, steps, executables = cache[key]
        result = GraphRun({}, values, macs=0, array_cells=config.rows * config.cols,
                          steps=steps)
        for step in steps:
            if isinstance(step, HostStep):
                op = step.op
                for name, v in zip(op.outputs, op.reference(*(values[t] for t in op.inputs)),
                                   strict=True):
                    values[name] = v
                continue
            if isinstance(step, AttentionBlockStep):
                x = values[step.input]
                r = run(device, executables[id(step)], x)
                values[step.output] = r.outputs
                result.segments.append({"name": step.name, "counters": r.counters,
                                        "images": r.images})
                result.macs += sum(op.macs(graph) for op in step.ops) * len(x) // \
                    graph.tensors[graph.inputs[0]].shape[0]
                continue
            if isinstance(step, AttentionStep):
                op = step.op
                a, b = (values[t] for t in op.inputs)
                if isinstance(op, AttentionScores):
                    if a.shape != b.shape:
                        raise GraphError(f"{op.name}: q {a.shape} and k {b.shape} must match")
                    x = np.stack([a, b], axis=1)
                else:
                    x = MixExecutable.pack(a, b)
                r = run(device, executables[id(step)], x)
                values[step.output] = r.outputs
                result.segments.append({"name": op.name, "counters": r.counters,
                                        "images": r.images})
                result.macs += op.macs(graph) * len(a) // graph.tensors[
                    graph.inputs[0]].shape[0]
                continue
            x = values[step.input]
            out_t = graph.tensors[step.output]
            n = len(x)
            out = np.zeros((n, *out_t.shape[1:]), dtype=np.int64)
            for seg in step.segments:
                r = run(device, executables[id(seg)], _segment_input(step, seg, x))
                y = r.outputs
                if seg.out_channels is None:
                    out = y.reshape(out.shape)
                else:
                    out[..., seg.out_channels] = y.reshape(*out.shape[:-1], -1)
                result.segments.append({"name": seg.network.name, "counters": r.counters,
                                        "images": r.images})
            values[step.output] = out
            result.macs += sum(op.macs(graph) for op in step.ops) * n // graph.tensors[
                graph.inputs[0]].shape[0]
        result.outputs = {name: values[name] for name in graph.outputs}
        return result
    finally:
        if own:
            device.close()
