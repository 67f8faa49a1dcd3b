"""Chains: the runs of a graph's operators that the stage compiler
(:func:`~firmware.compiler.network.compile_stages`) runs as one program, every tensor between
them kept in the unified buffer.

:func:`_conv_chain` collects, from a convolution, the operators each read only by the next:
convolutions (depthwise ones as dense ones with zeros outside each output channel's group,
strides, padding that differs between opposite sides), with the 2x2 max-pooling and the table
function that alone read them, average poolings whose windows lie inside the input (as a
depthwise convolution of ones requantised by ``1 / n``, :func:`_average_as_conv`), then a
flatten (NCHW's too, folded into the weights' row order) and fully connected operators; it
compiles the longest prefix that fits. :class:`Segment` and :class:`CoreStep` are the core
steps :mod:`~firmware.compiler.lowering` makes of them and of its other core operators.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from firmware.compiler.sums import BYTES, fit_tables, tflite_terms
from firmware.graph import (
    FIXED_TABLES,
    Add,
    AveragePool2D,
    Conv2D,
    ElementwiseBinary,
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

__all__ = ["Segment", "CoreStep"]


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


def _sole_reader(graph: Graph, ops: list[Op], prev: Op, kind, j: int) -> Op | None:
    """``ops[j]`` if it is a ``kind`` of one input that alone reads ``prev``'s output, which
    is no graph output (so the two may run in one program)."""
    nxt = ops[j] if j < len(ops) else None
    if (isinstance(nxt, kind) and prev.outputs[0] not in graph.outputs
            and graph.consumers(prev.outputs[0]) == [nxt] and len(nxt.inputs) == 1):
        return nxt
    return None


def _fc_stage(fc: FullyConnected, weight: np.ndarray, in_q: QParams, out_q: QParams,
              func: Func, table) -> Stage:
    """A fully connected operator's stage with the function :func:`_function` chose (a
    fixed table's function where it took a fixed table's Lookup)."""
    st = _stage(fc.name, weight, fc.bias, fc.input_zp, fc.requant, in_q, out_q, table=table)
    return dataclasses.replace(st, func=func) if func != st.func and table is None else st


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


def _add_stage(add: Add | ElementwiseBinary, skip: int, skip_input: int, shape,
               in_q: QParams, out_q: QParams, config) -> Stage | None:
    """A residual :class:`~firmware.graph.Add` as a stage of the chain (:attr:`Stage.skip
    <firmware.quant.Stage.skip>`), or ``None`` where the core cannot compute it exactly:
    each addend's term ``mbqm((x - zp) << left_shift, m, s)`` as a sum table of its 256
    bytes (``skip_input``: which of the Add's inputs is stage ``skip``'s output), their sum
    requantised by the output multiplier (single rounding: HALF_UP at ``31 - shift``; double:
    DOUBLE there, for ``shift <= 0``), the output's zero point, and the activation's clamp as
    the unit's function (the full int8 range, or from the zero point up)."""
    if not config.sum_tables or len(shape) != 3:
        return None
    c = shape[2]
    if not isinstance(add, Add):
        # Another elementwise function of two int8 values (onnxruntime's float32
        # QLinearAdd): two tables that reproduce it on all 65,536 pairs, if they exist.
        a, b = np.meshgrid(BYTES, BYTES, indexing="ij")
        fit = fit_tables(add.reference(a, b)[0])
        if fit is None:
            return None
        t0, t1, s = fit
        tables = np.stack([t0, t1] if skip_input == 0 else [t1, t0])
        return Stage(name=add.name, kind="conv",
                     weight=np.eye(c, dtype=np.int64).reshape(1, 1, c, c),
                     bias=np.zeros(c, dtype=np.int64), multiplier=np.ones(c, dtype=np.int64),
                     shift=s, zero_point=0, clamp_hi=127, func=Func.IDENTITY, pool=False,
                     pad=(0, 0), in_shape=tuple(shape), out_shape=tuple(shape), in_q=in_q,
                     out_q=out_q, rounding=Rounding.HALF_EVEN, skip=skip, sum_tables=tables)
    terms = [tflite_terms(add.zps[k], add.left_shift, *add.scales[k], single=add.single)
             for k in (0, 1)]
    tables = np.stack([terms[skip_input], terms[1 - skip_input]]).astype(np.int64)
    if np.abs(tables).max() >= 1 << 30:         # (the sum of two then fits int32)
        return None
    mult, shift = add.out_scale
    total = 31 - shift
    if not 0 <= total <= 63 or (not add.single and shift > 0):
        return None
    lo, hi = add.act
    zo = add.out_zp
    if lo <= -128 and hi >= 127:
        func, clamp_hi = Func.IDENTITY, 127
    elif lo == zo and hi >= 127:
        func, clamp_hi = Func.RELU, 127
    elif lo == zo and hi >= zo:
        func, clamp_hi = Func.CLAMP, hi
    else:
        return None
    return Stage(name=add.name, kind="conv",
                 weight=np.eye(c, dtype=np.int64).reshape(1, 1, c, c),
                 bias=np.zeros(c, dtype=np.int64), multiplier=np.full(c, mult, dtype=np.int64),
                 shift=total, zero_point=zo, clamp_hi=clamp_hi, func=func, pool=False,
                 pad=(0, 0), in_shape=tuple(shape), out_shape=tuple(shape), in_q=in_q,
                 out_q=out_q, rounding=Rounding.HALF_UP if add.single else Rounding.DOUBLE,
                 skip=skip, sum_tables=tables)


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
                errors: list, prefixes: bool = True) -> CoreStep | None:
    """The longest chain from the convolution ``ops[i]`` that the network compiler runs in
    one program, its tensors kept in the unified buffer: convolutions (each with a 2x2
    max-pooling and a table function that alone read it), then, after a flatten, fully
    connected operators; each output read only by the next operator. Where the whole chain
    does not compile for ``config`` (its error goes to ``errors``), its longest prefix that
    does; ``None`` where even the first convolution has no such stage or does not compile
    alone (it then runs over patches the host cuts). ``options``:
    :func:`~firmware.compiler.network.compile_stages`'s; ``prefixes=False``: the whole
    chain or ``None``."""
    from firmware.compiler.layout import CompileError
    from firmware.compiler.network import RINGS, _fits, compile_stages

    def sole(prev: Op, kind, j: int) -> Op | None:
        return _sole_reader(graph, ops, prev, kind, j)

    def function(op: Op, j: int, table):
        lookup = sole(op, Lookup, j) if op.requant.func == Func.IDENTITY else None
        return _function(op, lookup, table, config)

    def follow(prev: Op, j: int) -> Op | None:
        """The next stage's operator ``ops[j]``: a convolution, average pooling or residual
        Add that reads ``prev``'s output, which only it and Adds read (those Adds must join
        the chain later, :func:`closed`) and which is no graph output."""
        nxt = ops[j] if j < len(ops) else None
        name = prev.outputs[0]
        if nxt is None or name in graph.outputs:
            return None
        consumers = graph.consumers(name)
        if nxt not in consumers or any(not isinstance(c, Add | ElementwiseBinary)
                                       for c in consumers if c is not nxt):
            return None
        if isinstance(nxt, Add | ElementwiseBinary):
            return nxt if len(nxt.inputs) == 2 and len(set(nxt.inputs)) == 2 else None
        return nxt if isinstance(nxt, Conv2D | AveragePool2D) and len(nxt.inputs) == 1 \
            else None

    def add_stage(add: Add | ElementwiseBinary) -> Stage | None:
        """A residual Add of the previous stage's output and an earlier stage's."""
        prev = groups[-1][-1].outputs[0]
        if prev not in add.inputs or not stages[-1].out_q.signed:
            return None
        other = add.inputs[0] if add.inputs[1] == prev else add.inputs[1]
        k = next((n for n, grp in enumerate(groups[:-1]) if grp[-1].outputs[0] == other),
                 None)
        if k is None or tuple(stages[k].out_shape) != tuple(shape) \
                or not stages[k].out_q.signed \
                or tuple(graph.tensors[add.outputs[0]].shape[1:]) != tuple(shape):
            return None
        return _add_stage(add, k, add.inputs.index(other), shape, q,
                          _qparams(graph, add.outputs[0]), config)

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
    while isinstance(op, Conv2D | AveragePool2D | Add | ElementwiseBinary):
        if isinstance(op, Add | ElementwiseBinary):
            st = add_stage(op) if stages else None
            if st is None:
                break
            stages.append(st)
            groups.append([op])
            frames.append(None)
            q = st.out_q
            j += 1
            op = follow(op, j)
            continue
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
        op = follow(taken[-1], j) if len(taken) == 1 else \
            sole(taken[-1], Conv2D | AveragePool2D, j)
    if not stages:
        return None

    def closed(length: int) -> bool:
        """Whether every operator that reads a tensor of the first ``length`` stages (but
        the last's, the chain's output) is in them: a residual Add outside would read a
        tensor that never leaves the core."""
        inside = {id(x) for grp in groups[:length] for x in grp}
        return all(id(c) in inside for grp in groups[:length - 1]
                   for c in graph.consumers(grp[-1].outputs[0]))

    # Where an Add the chain does not hold reads one of its tensors, its longest prefix that
    # has no such tensor.
    if not closed(len(stages)):
        cut = max(n for n in range(1, len(stages) + 1) if closed(n))
        stages, groups, frames = stages[:cut], groups[:cut], frames[:cut]
        frames[-1] = None
        shape, q = stages[-1].out_shape, stages[-1].out_q
        j = i + sum(len(grp) for grp in groups)
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
        stages.append(_fc_stage(fc, weight, q, out_q, func, values))
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
        if not prefixes:
            return None
    length, fitting = 0, 0
    while fitting + 1 < len(stages) and _fits(config, prefix(fitting + 1)[1], 1, 1, min(RINGS)):
        fitting += 1
        if closed(fitting):         # (no cut between a residual Add and its skip)
            length = fitting
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
