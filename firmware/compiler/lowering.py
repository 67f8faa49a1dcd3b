"""Lowering: a :class:`~firmware.graph.Graph` as steps for the core and the host.

:func:`lower` turns the graph into steps for one :class:`~hdl.config.TPUConfig`:

- A *chain* from a convolution (:mod:`~firmware.compiler.chain`): convolutions (depthwise,
  strided, padded unequally on opposite sides), each with the 2x2 max-pooling and the table
  function that alone read it, average poolings whose windows lie inside the input, then a
  flatten and fully connected operators, each output read only by the next, become one
  :class:`firmware.quant.QuantisedNetwork` of stages that
  :func:`~firmware.compiler.network.compile_stages` compiles into one program a batch, every
  tensor between them kept in the unified buffer. Where the chain does not compile (the
  memories), its longest prefix that does; a convolution that fits no chain falls back to
  the patches below, and the lowering goes on from the next operator.
- Runs of fully connected operators (each output read only by the next; a flatten before
  the first is a layout of its input) become one segment of dense stages.
- Any other convolution becomes a dense segment over the patches the host cuts (im2col with
  the stride and the padding, one "image" per output position), so that stride, asymmetric
  padding and groups cost the compiler nothing; a grouped (depthwise) convolution runs one
  block of ``cols`` output channels at a time, each block a dense layer over the patches of
  its own input channels.

The input zero point is folded into the bias (``b - z_in * colsum(W)``) as
:mod:`firmware.quant` does, and a convolution's input is padded with it. A :class:`Lookup`
that alone reads a stage's output is that stage's function: SIGMOID or TANH where its table is
the activation unit's fixed one (any core), TABLE where the core has the programmable table
(:attr:`~hdl.config.TPUConfig.lookup_table`; one table a segment, so a second, different one
starts another). On a core with UB_TO_WEIGHTS (:attr:`~hdl.config.TPUConfig.ub_to_weights`)
an :class:`AttentionScores` becomes an :class:`AttentionStep`: each head's ``q @ k.T`` on the
array, ``k.T`` made on chip (:mod:`firmware.compiler.attention`), and so does an
:class:`AttentionMix` (``p @ v``, ``v`` moved into weight tiles on chip) where the core takes
uint8 activations; elsewhere they run on the host. Where the core has the table, a
:class:`Lookup` that alone reads the scores (softmax's exp) joins their step. Where the core
has all three (UB_TO_WEIGHTS, the table and the row scale), attention's q, k and v
projections, its scores, their exp and the normalised mix become one
:class:`AttentionBlockStep`, one program from the projections' input to the attention output
(:mod:`firmware.compiler.attention_block`), when it fits the core's memories and slots.
:func:`placement` says which operator ran where; :func:`firmware.runtime.graph.run_graph`
runs the steps on a device. :func:`compile_network` is the compiler's entry for a model that
is one program: a graph, or the layer API's quantised network written as one
(:func:`firmware.graph.from_network`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from firmware.compiler.chain import (
    CoreStep,
    Segment,
    _chain_name,
    _conv_chain,
    _fc_stage,
    _function,
    _qparams,
    _sole_reader,
    _stage,
)
from firmware.graph import (
    AttentionMix,
    AttentionScores,
    Conv2D,
    FullyConnected,
    Graph,
    Lookup,
    Op,
    Requant,
    Reshape,
)
from firmware.quant import QuantisedNetwork
from hdl.isa import Func

__all__ = ["Segment", "CoreStep", "HostStep", "AttentionStep", "AttentionBlockStep", "lower",
           "placement", "where_ran", "compile_network"]


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


def _sub_requant(r: Requant, cols: np.ndarray) -> Requant:
    return Requant(r.multiplier[cols], r.shift[cols], r.rounding, r.zero_point, r.func,
                   r.clamp_hi)


def lower(graph: Graph, config, *, fuse_attention: bool = True, options: dict | None = None,
          errors: list | None = None, whole: bool = False) -> list[
        CoreStep | AttentionStep | AttentionBlockStep | HostStep]:
    """The graph as core steps and host steps for ``config`` (see the module notes);
    ``fuse_attention=False`` keeps attention's operators steps of their own (to compare).
    ``options`` go to :func:`~firmware.compiler.network.compile_stages` for the chains it
    compiles; ``errors`` collects the errors of the chains that did not compile. ``whole``:
    only a lowering to one program matters (:func:`compile_network`), so a chain that does
    not compile raises its error at once, no shorter chain tried."""
    options = options or {}
    errors = [] if errors is None else errors
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
        # A flatten that a fully connected operator alone reads is a layout of its input.
        flatten = None
        reader = _sole_reader(graph, ops, op, FullyConnected, i + 1) \
            if isinstance(op, Reshape) and len(op.shape) == 2 else None
        if reader is not None and not reader.keep_dims:
            flatten = op
            i += 1
            op = ops[i]
        if not op.core:
            steps.append(HostStep(op))
            i += 1
            continue
        in_q = _qparams(graph, op.inputs[0])
        chain = _conv_chain(graph, ops, i, config, options, errors, prefixes=not whole) \
            if isinstance(op, Conv2D) else None
        if whole and errors:
            raise errors[0]
        if chain is not None:
            steps.append(chain)
            i += len(chain.ops)
            continue
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
                segments.append(Segment(net, cols, ins, patches=True))
            steps.append(CoreStep([op], segments))
            i += 1
            continue
        # A run of fully connected operators, each output read only by the next; a Lookup
        # that alone reads one's output joins it as its stage's function (the activation
        # unit's table: one table a run, so a second, different one ends it).
        chain: list[Op] = []
        table = None

        def sole_reader(prev: Op, kind, j: int) -> Op | None:
            return _sole_reader(graph, ops, prev, kind, j)

        fc = op
        funcs = []
        while fc is not None:
            chain.append(fc)
            found = sole_reader(fc, Lookup, i + len(chain))
            func, values, lookup = _function(fc, found, table, config)
            if found is not None and lookup is None and config.lookup_table and \
                    fc.requant.func == Func.IDENTITY and len(chain) > 1:
                chain.pop()         # a segment of its own, with its own table
                break
            funcs.append((func, values))
            if lookup is not None:
                chain.append(lookup)
                table = table if values is None else values
            fc = sole_reader(chain[-1], FullyConnected, i + len(chain))
        stages = []
        q = in_q
        fcs = [op for op in chain if not isinstance(op, Lookup)]
        for fc, (func, values) in zip(fcs, funcs, strict=True):
            k = chain.index(fc)
            looked_up = k + 1 < len(chain) and isinstance(chain[k + 1], Lookup)
            out_q = _qparams(graph, chain[k + looked_up].outputs[0])
            stages.append(_fc_stage(fc, fc.weight, q, out_q, func, values))
            q = out_q
        if flatten is not None:
            chain.insert(0, flatten)
        source = graph.tensors[chain[0].inputs[0]].shape[1:] if flatten is not None \
            else (chain[0].weight.shape[0],)
        net = QuantisedNetwork(_chain_name(graph, chain), tuple(source), in_q, stages)
        steps.append(CoreStep(chain, [Segment(net)]))
        i += len(chain) - (flatten is not None)
    return steps


def placement(graph: Graph, config) -> dict[str, str]:
    """Where each operator of ``graph`` runs on ``config``, by name: ``"core"`` or
    ``"host"``."""
    where = where_ran(lower(graph, config))
    return {op.name: "host" if where.get(op.name, "host") == "host" else "core"
            for op in graph.ops}


def where_ran(steps) -> dict[str, str]:
    """Per operator of a lowering's ``steps``, by name, where it ran: ``"core"`` (in a core
    step whose program runs from its input to its output: a chain, a run of fully connected
    operators, attention), ``"patches"`` (a convolution over patches the host cut from its
    input) or ``"host"``."""
    where = {}
    for step in steps:
        if isinstance(step, HostStep):
            where[step.op.name] = "host"
            continue
        patches = isinstance(step, CoreStep) and any(seg.patches for seg in step.segments)
        where.update((op.name, "patches" if patches else "core") for op in step.ops)
    return where


def compile_network(network: QuantisedNetwork | Graph, config, **options):
    """Compile a model for ``config`` as one program a batch: ``network`` a graph (an
    importer's, or :func:`firmware.graph.from_network` of the layer API's quantised network,
    which is what a :class:`~firmware.quant.QuantisedNetwork` becomes first) whose operators
    all run on the core as one chain. ``options``:
    :func:`~firmware.compiler.network.compile_stages`'s (``batch_size``, ``max_batch``,
    ``unit``, ``ring``, ``program_images``, ``pack_positions``). Returns the
    :class:`~firmware.compiler.network.CompiledNetwork`; raises :class:`CompileError` where
    the chain does not fit (naming the memory and its rows) or where the graph needs more
    than one program (:func:`firmware.runtime.graph.run_graph` runs those, step by step)."""
    from firmware.compiler.layout import CompileError
    from firmware.compiler.network import compile_stages
    from firmware.graph import from_network

    graph = network if isinstance(network, Graph) else from_network(network)
    errors: list = []
    steps = lower(graph, config, options=options, errors=errors, whole=True)
    if len(steps) == 1 and isinstance(steps[0], CoreStep) and len(steps[0].segments) == 1 \
            and not steps[0].segments[0].patches:
        seg = steps[0].segments[0]
        return seg.compiled or compile_stages(seg.network, config, **options)
    if errors:
        raise errors[0]
    host = [step.op.name for step in steps if isinstance(step, HostStep)]
    raise CompileError(
        f"{graph.name} does not run as one program on {config.name}: it lowers to "
        f"{len(steps)} steps" + (f" (on the host: {', '.join(host)})" if host else "") +
        "; run it with firmware.runtime.graph.run_graph")
