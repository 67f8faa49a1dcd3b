"""Lowering: a :class:`~firmware.graph.Graph` as steps for the core and the host.

:func:`lower` turns the graph into steps for one :class:`~hdl.config.TPUConfig`:

- A *chain* from a convolution: convolutions (groups 1, equal strides, padding equal on
  opposite sides), each with the 2x2 max-pooling and the table function that alone read it,
  then a flatten and fully connected operators, each output read only by the next, become
  one :class:`firmware.quant.QuantisedNetwork` of stages that
  :func:`~firmware.compiler.network.compile_stages` compiles into one program a batch, every
  tensor between them kept in the unified buffer. Where the chain does not compile (the
  memories), its first convolution falls back to the patches below and the lowering goes on
  from the next operator.
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

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from firmware.graph import (
    FIXED_TABLES,
    AttentionMix,
    AttentionScores,
    AveragePool2D,
    Conv2D,
    FullyConnected,
    Graph,
    GraphError,
    Lookup,
    MaxPool2D,
    Op,
    Requant,
    Reshape,
    Transpose,
)
from firmware.quant import QParams, QuantisedNetwork, Stage
from hdl.isa import Func, Rounding
from sim.models import golden

__all__ = ["Segment", "CoreStep", "HostStep", "AttentionStep", "AttentionBlockStep", "lower",
           "placement", "where_ran", "compile_network"]


@dataclass(eq=False)
class Segment:
    """One :class:`QuantisedNetwork` run on the core: what it reads of its input tensor
    (``in_channels`` of a convolution's patches cut on the host, with ``patches``; else the
    whole tensor) and which output channels it writes. ``compiled``: its
    :class:`~firmware.compiler.network.CompiledNetwork` where the lowering compiled it (to
    know that it fits)."""
    network: QuantisedNetwork
    out_channels: np.ndarray | None = None
    in_channels: np.ndarray | None = None
    patches: bool = False
    compiled: object = None


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


def _conv_stage(op: Conv2D, in_shape, pool: bool, in_q: QParams, out_q: QParams,
                func: Func, table) -> Stage | None:
    """The chain compiler's stage for a convolution (with its 2x2 max-pooling), or ``None``
    where it has no such stage: unequal strides."""
    t, b, left, r = op.padding
    if op.stride[0] != op.stride[1]:
        return None
    # A grouped (depthwise) convolution as a dense one whose weights are zero between an
    # output channel and the input channels outside its group: the emitter leaves out the
    # passes whose tiles are all zero.
    weight = op.dense_weight(np.arange(op.weight.shape[3]))[1].reshape(
        *op.weight.shape[:2], op.cin, op.weight.shape[3]) if op.groups > 1 else op.weight
    kh, kw, cin, n = weight.shape
    colsum = weight.reshape(-1, n).sum(axis=0)
    ho, wo = op.out_hw(*in_shape[:2])
    out_shape = (ho // 2, wo // 2, n) if pool else (ho, wo, n)
    r_ = op.requant
    return Stage(name=op.name, kind="conv", weight=weight,
                 bias=golden.wrap(op.bias - op.input_zp * colsum, 32),
                 multiplier=r_.multiplier, shift=r_.scalar_shift, zero_point=r_.zero_point,
                 clamp_hi=r_.clamp_hi, func=func, pool=pool, pad=(t, left),
                 pad_end=(b, r) if (b, r) != (t, left) else None,
                 in_shape=tuple(in_shape), out_shape=out_shape, in_q=in_q, out_q=out_q,
                 rounding=r_.rounding, stride=op.stride[0], table=table)


def _function(op: Op, lookup: Lookup | None, table, config):
    """A stage's function, its programmable table and the Lookup it takes in: the
    requantisation's function, or the table ``lookup`` (which alone reads ``op``'s output)
    where the activation unit has it: a fixed one (SIGMOID, TANH) on any core, a
    programmable one where the core has the table and the segment's ``table`` is the same or
    none yet."""
    if lookup is None or op.requant.func != Func.IDENTITY:
        return op.requant.func, None, None
    for func, values in FIXED_TABLES.items():
        if np.array_equal(lookup.table, golden.table_values(values)):
            return func, None, lookup
    if config.lookup_table and (table is None or np.array_equal(table, lookup.table)):
        return Func.TABLE, lookup.table, lookup
    return op.requant.func, None, None


@dataclass(eq=False)
class _AverageConv(Conv2D):
    """An :class:`AveragePool2D` as the convolution that computes it (``pool``: the
    operator)."""
    pool: AveragePool2D = None


def _average_as_conv(op: AveragePool2D, channels: int) -> Conv2D | None:
    """The convolution that computes an average pooling exactly, or ``None``: each channel's
    window summed by a weight of 1 (a depthwise convolution), then multiplied by ``m / 2**s``
    with ``m = floor(2**s / n) + 1`` for a window of ``n`` positions and ``2**s > 256 n**2``.
    For an int8 sum ``|t| <= 128 n`` the product is ``t / n`` moved away from zero by less
    than ``1 / (2 n)``, the distance from any quotient of ``n`` that is not a tie to the next
    half, and a tie moves past it: a single rounding (HALF_UP here, HALF_EVEN alike) then
    rounds ``t / n`` half away from zero, TFLite's ``(t + n/2) / n``. Only where every
    window lies inside the input (no padding: the count is the same everywhere) and the
    output clamps to the whole int8 range."""
    if any(op.padding) or op.act != (-128, 127):
        return None
    kh, kw = op.kernel
    n = kh * kw
    shift = 30 + int(n).bit_length() - 1
    while (1 << shift) <= 256 * n * n:
        shift += 1
    mult = (1 << shift) // n + 1
    if mult >= 1 << 31 or shift > 63:
        return None
    weight = np.zeros((kh, kw, 1, channels), dtype=np.int64)
    weight[...] = 1
    return _AverageConv(op.name, list(op.inputs), list(op.outputs), weight=weight,
                        bias=np.zeros(channels, dtype=np.int64), input_zp=0,
                        requant=Requant(np.full(channels, mult), np.full(channels, shift),
                                        Rounding.HALF_UP, 0),
                        stride=tuple(op.stride), padding=(0, 0, 0, 0), groups=channels,
                        pool=op)


def _conv_chain(graph: Graph, ops: list[Op], i: int, config, options: dict,
                errors: list) -> CoreStep | None:
    """The longest chain from the convolution ``ops[i]`` that the network compiler runs in
    one program, its tensors kept in the unified buffer: convolutions (each with a 2x2
    max-pooling and a table function that alone read it), then, after a flatten, fully
    connected operators; each output read only by the next operator. Where the whole chain
    does not compile for ``config`` (its error goes to ``errors``), its longest prefix that
    does; ``None`` where even the first convolution has no such stage or does not compile
    alone (it then runs over patches the host cuts). ``options``:
    :func:`~firmware.compiler.network.compile_stages`'s."""
    from firmware.compiler.layout import CompileError
    from firmware.compiler.network import RINGS, _fits, compile_stages

    outputs = set(graph.outputs)

    def sole(prev: Op, kind, j: int) -> Op | None:
        nxt = ops[j] if j < len(ops) else None
        if (isinstance(nxt, kind) and prev.outputs[0] not in outputs
                and graph.consumers(prev.outputs[0]) == [nxt] and len(nxt.inputs) == 1):
            return nxt
        return None

    def function(op: Op, j: int, table):
        lookup = sole(op, Lookup, j) if op.requant.func == Func.IDENTITY else None
        return _function(op, lookup, table, config)

    # The compiler pads a convolution's input (on the host for the first, as a frame on chip
    # for the later ones) with its input's zero point: the operator's own.
    q0 = _qparams(graph, ops[i].inputs[0])
    in_q = QParams(q0.scale, ops[i].input_zp, q0.signed)
    shape = graph.tensors[ops[i].inputs[0]].shape[1:]
    if len(shape) != 3:
        return None
    groups: list[list[Op]] = []     # each stage's operators
    stages: list[Stage] = []
    frames: list[int | None] = []   # the zero point of the frame around each stage's output
    table = None
    j = i
    op = ops[i]
    q = in_q
    while isinstance(op, Conv2D | AveragePool2D):
        if isinstance(op, AveragePool2D):
            op = _average_as_conv(op, shape[2])
            if op is None:
                break
        if stages:
            if not stages[-1].out_q.signed:
                break
            # The frame the previous stage's output is written in holds this zero point.
            frames[-1] = op.input_zp
        func, values, lookup = function(op, j + 1, table)
        last = lookup or op
        pool = sole(last, MaxPool2D, j + 1 + (lookup is not None))
        # (A clamp wider than int8 clamps nothing on the core's int8 values.)
        if pool is not None and not (pool.kernel == (2, 2) and pool.stride == (2, 2) and
                                     pool.padding == (0, 0, 0, 0) and pool.act[0] <= -128
                                     and pool.act[1] >= 127):
            pool = None
        taken = [getattr(op, "pool", op)] + [x for x in (lookup, pool) if x is not None]
        out_q = _qparams(graph, taken[-1].outputs[0])
        st = _conv_stage(op, shape, pool is not None, q, out_q, func, values)
        if st is None:
            if stages:
                frames[-1] = None
            break
        stages.append(st)
        groups.append(taken)
        frames.append(None)
        table = table if values is None else values
        q, shape = out_q, st.out_shape
        j += len(taken)
        op = sole(taken[-1], Conv2D | AveragePool2D, j)
    if not stages:
        return None
    # A flatten, or NCHW's flatten (ONNX: a transpose to NCHW, then the flatten), before a
    # fully connected operator is a layout: NCHW's order becomes the weights' row order.
    nchw = sole(groups[-1][-1], Transpose, j)
    if nchw is not None and tuple(nchw.perm) != (0, 3, 1, 2):
        nchw = None
    flat = sole(nchw or groups[-1][-1], Reshape, j + (nchw is not None))
    fc = sole(flat, FullyConnected, j + 1 + (nchw is not None)) \
        if flat is not None and len(flat.shape) == 2 else None
    lead = ([nchw] if nchw is not None else []) + [flat] if fc is not None else []
    j += len(lead)
    order = None
    if fc is not None and nchw is not None:
        h, w, c = shape
        # Row (y * w + x) * c + ch of the core's flatten is row ch * h * w + y * w + x of
        # the model's.
        order = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
    while fc is not None and not fc.keep_dims:
        func, values, lookup = function(fc, j + 1, table)
        taken = [fc] + ([lookup] if lookup is not None else [])
        out_q = _qparams(graph, taken[-1].outputs[0])
        weight = fc.weight if order is None else fc.weight[order]
        order = None
        st = _stage(fc.name, weight, fc.bias, fc.input_zp, fc.requant, q, out_q,
                    table=values)
        if func != fc.requant.func and values is None:
            st = dataclasses.replace(st, func=func)
        stages.append(st)
        groups.append(lead + taken)
        frames.append(None)
        lead = []
        table = table if values is None else values
        q = out_q
        j += len(taken)
        fc = sole(taken[-1], FullyConnected, j)
    # The whole chain, else its longest prefix of which one image fits (fitting grows
    # monotonically harder with each stage, so the prefixes are tried from the shortest).
    input_shape = tuple(graph.tensors[ops[i].inputs[0]].shape[1:])

    def prefix(length: int) -> tuple[list[Op], QuantisedNetwork]:
        chain = [x for grp in groups[:length] for x in grp]
        kept = [st if k + 1 == length or frames[k] is None else dataclasses.replace(
                    st, out_q=QParams(st.out_q.scale, frames[k], True))
                for k, st in enumerate(stages[:length])]
        return chain, QuantisedNetwork(_chain_name(graph, chain), input_shape, in_q, kept)

    chain, net = prefix(len(stages))
    try:
        compiled = compile_stages(net, config, **options)
        # A reshape that alone reads the chain's output is a layout of it (the host reads
        # the output in its row-major order either way).
        shaped = sole(chain[-1], Reshape, i + len(chain))
        return CoreStep(chain + ([shaped] if shaped is not None else []),
                        [Segment(net, compiled=compiled)])
    except CompileError as error:
        errors.append(error)
    length = 0
    while length + 1 < len(stages) and _fits(config, prefix(length + 1)[1], 1, 1, min(RINGS)):
        length += 1
    if not length:
        return None
    chain, net = prefix(length)
    try:
        return CoreStep(chain, [Segment(net, compiled=compile_stages(net, config,
                                                                     **options))])
    except CompileError:
        return None


def _chain_name(graph: Graph, chain: list[Op]) -> str:
    """A segment's name: the graph's where the chain is the whole graph."""
    if chain == graph.ops:
        return graph.name
    return chain[0].name if len(chain) == 1 else f"{chain[0].name}..{chain[-1].name}"


def lower(graph: Graph, config, *, fuse_attention: bool = True, options: dict | None = None,
          errors: list | None = None) -> list[
        CoreStep | AttentionStep | AttentionBlockStep | HostStep]:
    """The graph as core steps and host steps for ``config`` (see the module notes);
    ``fuse_attention=False`` keeps attention's operators steps of their own (to compare).
    ``options`` go to :func:`~firmware.compiler.network.compile_stages` for the chains it
    compiles; ``errors`` collects the errors of the chains that did not compile."""
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
        if isinstance(op, Reshape) and len(op.shape) == 2 and i + 1 < len(ops) and \
                isinstance(ops[i + 1], FullyConnected) and not ops[i + 1].keep_dims and \
                op.outputs[0] not in outputs and graph.consumers(op.outputs[0]) == [ops[i + 1]]:
            flatten = op
            i += 1
            op = ops[i]
        if not op.core:
            steps.append(HostStep(op))
            i += 1
            continue
        in_q = _qparams(graph, op.inputs[0])
        chain = _conv_chain(graph, ops, i, config, options, errors) \
            if isinstance(op, Conv2D) else None
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
            """The operator at ``j`` if it is a ``kind`` and alone reads ``prev``'s output."""
            nxt = ops[j] if j < len(ops) else None
            if (isinstance(nxt, kind) and prev.outputs[0] not in outputs
                    and graph.consumers(prev.outputs[0]) == [nxt]):
                return nxt
            return None

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
            st = _stage(fc.name, fc.weight, fc.bias, fc.input_zp, fc.requant, q, out_q,
                        table=values)
            if func != st.func and values is None:
                st = dataclasses.replace(st, func=func)     # a fixed table
            stages.append(st)
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
    where = {op.name: "host" for op in graph.ops}
    for step in lower(graph, config):
        if not isinstance(step, HostStep):
            where.update((op.name, "core") for op in step.ops)
    return where


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
    steps = lower(graph, config, options=options, errors=errors)
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
