"""Lowering: a :class:`~firmware.graph.Graph` as steps for the core and the host.

:func:`lower` turns the graph into steps for one :class:`~hdl.config.TPUConfig`: runs of
fully connected operators (each output read only by the next) become one
:class:`firmware.quant.QuantisedNetwork` of dense stages, kept on chip between them; every
convolution becomes a dense segment over the patches the host cuts (im2col with the stride and
the padding, one "image" per output position), so that stride, asymmetric padding and groups
cost the compiler nothing; a grouped (depthwise) convolution runs one block of ``cols`` output
channels at a time, each block a dense layer over the patches of its own input channels.
The input zero point is folded into the bias (``b - z_in * colsum(W)``) as
:mod:`firmware.quant` does. On a core with UB_TO_WEIGHTS
(:attr:`~hdl.config.TPUConfig.ub_to_weights`) an :class:`AttentionScores` becomes a
:class:`AttentionStep`: each head's ``q @ k.T`` on the array, ``k.T`` made on chip
(:mod:`firmware.compiler.attention`), and so does an :class:`AttentionMix` (``p @ v``, ``v`` moved
into weight tiles on chip) where the core takes uint8 activations; elsewhere they run on the
host. Where the core has the programmable table (:attr:`~hdl.config.TPUConfig.lookup_table`)
a :class:`Lookup` that alone reads the scores (softmax's exp) joins their step, and one that
alone reads a fully connected operator's output (GELU, sigmoid, any function of an int8)
joins its run as the stage's function: the ACTIVATE looks it up, and only its output leaves
the core. Where the core has all three (UB_TO_WEIGHTS, the table and the row scale),
attention's q, k and v projections, its scores, their exp and the normalised mix become one
:class:`AttentionBlockStep`, one program from the projections' input to the attention
output (:mod:`firmware.compiler.attention_block`), when it fits the core's memories and slots.
:func:`placement` says which
operator ran where. :func:`firmware.runtime.graph.run_graph` runs the steps on a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.graph import (
    AttentionMix,
    AttentionScores,
    Conv2D,
    FullyConnected,
    Graph,
    GraphError,
    Lookup,
    Op,
    Requant,
)
from firmware.quant import QParams, QuantisedNetwork, Stage
from hdl.isa import Func
from sim.models import golden

__all__ = ["Segment", "CoreStep", "HostStep", "AttentionStep", "AttentionBlockStep", "lower",
           "placement"]


@dataclass(eq=False)
class Segment:
    """One :class:`QuantisedNetwork` run on the core: what it reads of its input tensor
    (``in_channels`` of a convolution's patches, or all) and which output channels it
    writes."""
    network: QuantisedNetwork
    out_channels: np.ndarray | None = None
    in_channels: np.ndarray | None = None


@dataclass(eq=False)
class CoreStep:
    """Core operators run as segments: a chain of fully connected operators (one segment)
    or one convolution (one segment per block of output channels)."""
    ops: list[Op]
    segments: list[Segment]

    @property
    def input(self) -> str:
        return self.ops[0].inputs[0]

    @property
    def output(self) -> str:
        return self.ops[-1].outputs[0]


@dataclass(eq=False)
class HostStep:
    op: Op


@dataclass(eq=False)
class AttentionStep:
    """One of attention's products on the core (:mod:`firmware.compiler.attention`): an
    :class:`AttentionScores` (``q`` and ``k`` in, the int8 scores out) or an
    :class:`AttentionMix` (``p`` and ``v`` in, the int8 output out). ``lookup``: a
    :class:`Lookup` of the scores (softmax's exp) run in the same step, by the activation
    unit's programmable table, so the scores never leave the core."""
    op: Op
    lookup: Lookup | None = None

    @property
    def ops(self) -> list[Op]:
        return [self.op] + ([self.lookup] if self.lookup else [])

    @property
    def output(self) -> str:
        return self.ops[-1].outputs[0]


@dataclass(eq=False)
class AttentionBlockStep:
    """Attention from its projections to its output in one program
    (:mod:`firmware.compiler.attention_block`): ``projections`` (q, k, v :class:`FullyConnected`
    operators of one input), ``scores`` of q and k, ``lookup`` (exp) of the scores, and the
    normalised ``mix`` of exp's output and v. Only the input and the output cross the
    link."""
    projections: tuple[FullyConnected, FullyConnected, FullyConnected]
    scores: AttentionScores
    lookup: Lookup
    mix: AttentionMix
    #: The ops in the graph's order.
    ops: list[Op] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.ops[0].name}..{self.ops[-1].name}"

    @property
    def input(self) -> str:
        return self.projections[0].inputs[0]

    @property
    def output(self) -> str:
        return self.mix.outputs[0]


def _attention_block(graph: Graph, ops: list[Op], config) -> AttentionBlockStep | None:
    """The :class:`AttentionBlockStep` of ``ops`` (six consecutive operators: three
    projections, the scores, their exp and the normalised mix, wired as attention, their
    intermediate tensors read by nothing else), or ``None``; ``None`` too when the block
    does not compile for ``config`` (the operators then run as steps of their own)."""
    from firmware.compiler.attention_block import AttentionBlockExecutable
    from firmware.compiler.layout import CompileError

    if len(ops) < 6 or not (config.ub_to_weights and config.lookup_table and
                            config.row_scale):
        return None
    fcs = [op for op in ops[:6] if isinstance(op, FullyConnected)]
    rest = [op for op in ops[:6] if not isinstance(op, FullyConnected)]
    if len(fcs) != 3 or [type(op) for op in rest] != [AttentionScores, Lookup, AttentionMix]:
        return None
    scores, lookup, mix = rest
    by_out = {fc.outputs[0]: fc for fc in fcs}
    q, k = (by_out.get(t) for t in scores.inputs)
    v = by_out.get(mix.inputs[1])
    if q is None or k is None or v is None or len({id(q), id(k), id(v)}) != 3:
        return None
    outputs = set(graph.outputs)
    readers = {q.outputs[0]: [scores], k.outputs[0]: [scores], v.outputs[0]: [mix],
               scores.outputs[0]: [lookup], lookup.outputs[0]: [mix]}
    if (q.inputs != k.inputs or q.inputs != v.inputs or lookup.inputs != scores.outputs
            or mix.inputs[0] != lookup.outputs[0] or not mix.normalise
            or any(t in outputs or graph.consumers(t) != r for t, r in readers.items())):
        return None
    step = AttentionBlockStep((q, k, v), scores, lookup, mix, list(ops[:6]))
    x = graph.tensors[q.inputs[0]]
    if len(x.shape) != 3 or x.dtype not in ("int8", "uint8"):
        return None
    try:
        AttentionBlockExecutable(step, config, x.shape[1], x.shape[2], x.dtype == "int8")
    except CompileError:
        return None
    return step


def _qparams(graph: Graph, name: str) -> QParams:
    t = graph.tensors[name]
    if t.dtype not in ("int8", "uint8"):
        raise GraphError(f"tensor {name} is {t.dtype}; the core reads and writes int8/uint8")
    q = t.q or QParams(1.0, 0, t.dtype == "int8")
    return QParams(q.scale, q.zero_point, t.dtype == "int8")


def _stage(name, weight, bias, input_zp, requant: Requant, in_q, out_q,
           table=None) -> Stage:
    """A dense stage; with ``table``, a Lookup's, as its function (TABLE)."""
    colsum = weight.sum(axis=0)
    folded = golden.wrap(bias - input_zp * colsum, 32)
    n = weight.shape[1]
    return Stage(name=name, kind="dense", weight=weight, bias=folded,
                 multiplier=requant.multiplier, shift=requant.scalar_shift,
                 zero_point=requant.zero_point, clamp_hi=requant.clamp_hi,
                 func=requant.func if table is None else Func.TABLE,
                 pool=False, pad=(0, 0), in_shape=(weight.shape[0],), out_shape=(n,),
                 in_q=in_q, out_q=out_q, rounding=requant.rounding, table=table)


def _sub_requant(r: Requant, cols: np.ndarray) -> Requant:
    return Requant(r.multiplier[cols], r.shift[cols], r.rounding, r.zero_point, r.func,
                   r.clamp_hi)


def lower(graph: Graph, config, *, fuse_attention: bool = True) -> list[
        CoreStep | AttentionStep | AttentionBlockStep | HostStep]:
    """The graph as core steps and host steps for ``config`` (see the module notes);
    ``fuse_attention=False`` keeps attention's operators steps of their own (to compare)."""
    steps: list[CoreStep | AttentionStep | AttentionBlockStep | HostStep] = []
    outputs = set(graph.outputs)
    i = 0
    ops = graph.ops
    while i < len(ops):
        op = ops[i]
        block = _attention_block(graph, ops[i:i + 6], config) \
            if fuse_attention and isinstance(op, FullyConnected) else None
        if block is not None:
            steps.append(block)
            i += len(block.ops)
            continue
        if config.ub_to_weights and (isinstance(op, AttentionScores) or (
                isinstance(op, AttentionMix) and config.operands != "int8" and
                (not op.normalise or (config.row_scale and config.cols > 1)))):
            lookup = ops[i + 1] if i + 1 < len(ops) else None
            if not (isinstance(op, AttentionScores) and config.lookup_table and
                    isinstance(lookup, Lookup) and lookup.inputs == op.outputs and
                    op.outputs[0] not in outputs and graph.consumers(op.outputs[0]) == [lookup]
                    and op.requant.func == Func.IDENTITY):
                lookup = None
            steps.append(AttentionStep(op, lookup))
            i += len(steps[-1].ops)
            continue
        if not op.core:
            steps.append(HostStep(op))
            i += 1
            continue
        in_q = _qparams(graph, op.inputs[0])
        if isinstance(op, Conv2D):
            out_q = _qparams(graph, op.outputs[0])
            cout = op.weight.shape[3]
            block = cout if op.groups == 1 else config.cols
            segments = []
            for start in range(0, cout, block):
                cols = np.arange(start, min(start + block, cout))
                ins, w = op.dense_weight(cols)
                stage = _stage(op.name, w, op.bias[cols], op.input_zp,
                               _sub_requant(op.requant, cols), in_q, out_q)
                net = QuantisedNetwork(f"{op.name}[{start}:{cols[-1] + 1}]", (w.shape[0],),
                                       in_q, [stage])
                segments.append(Segment(net, cols, ins))
            steps.append(CoreStep([op], segments))
            i += 1
            continue
        # A run of fully connected operators, each output read only by the next; a Lookup
        # that alone reads one's output joins it as its stage's function (the activation
        # unit's table: one table a run, so a second, different one ends it).
        chain: list[Op] = []
        table = None

        def sole_reader(prev: Op, kind, j: int) -> Op | None:
            """The operator at ``j`` if it is a ``kind`` and alone reads ``prev``'s output."""
            nxt = ops[j] if j < len(ops) else None
            if (isinstance(nxt, kind) and prev.outputs[0] not in outputs
                    and graph.consumers(prev.outputs[0]) == [nxt]):
                return nxt
            return None

        fc = op
        while fc is not None:
            chain.append(fc)
            lookup = sole_reader(fc, Lookup, i + len(chain)) if config.lookup_table else None
            if lookup is not None and fc.requant.func == Func.IDENTITY:
                if table is not None and not np.array_equal(table, lookup.table):
                    chain.pop()     # a segment of its own, with its own table
                    break
                chain.append(lookup)
                table = lookup.table
            fc = sole_reader(chain[-1], FullyConnected, i + len(chain))
        stages = []
        q = in_q
        for k, fc in enumerate(chain):
            if isinstance(fc, Lookup):
                continue
            looked_up = k + 1 < len(chain) and isinstance(chain[k + 1], Lookup)
            out_q = _qparams(graph, chain[k + looked_up].outputs[0])
            stages.append(_stage(fc.name, fc.weight, fc.bias, fc.input_zp, fc.requant, q,
                                 out_q, table=chain[k + 1].table if looked_up else None))
            q = out_q
        net = QuantisedNetwork(chain[0].name if len(chain) == 1 else
                               f"{chain[0].name}..{chain[-1].name}",
                               (chain[0].weight.shape[0],), in_q, stages)
        steps.append(CoreStep(chain, [Segment(net)]))
        i += len(chain)
    return steps


def placement(graph: Graph, config) -> dict[str, str]:
    """Where each operator of ``graph`` runs on ``config``, by name: ``"core"`` or
    ``"host"``."""
    where = {op.name: "host" for op in graph.ops}
    for step in lower(graph, config):
        if not isinstance(step, HostStep):
            where.update((op.name, "core") for op in step.ops)
    return where


