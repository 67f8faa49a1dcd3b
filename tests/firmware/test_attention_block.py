"""Attention in one program (firmware/compiler/attention_block.py): the q, k and v
projections, the scores with exp (the programmable table) and the normalised mix, fused by
:func:`firmware.compiler.lowering.lower` into one
:class:`~firmware.compiler.lowering.AttentionBlockStep`. Every output
``==`` the graph's integer reference on the ISA simulator for awkward shapes (token counts,
head sizes and input channels that are not multiples of the array, arrays with rows != cols,
more sequences than a program holds), a few on the RTL; the fallback to separate steps where
the core cannot run the block, the errors that say why, and the program's host traffic (the
input before the first MATMUL, the attention output after, nothing else)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from firmware import graph as g
from firmware.asm import disassemble
from firmware.compiler import CompileError, lowering
from firmware.compiler.attention_block import AttentionBlockExecutable
from firmware.models.transformer import exp_table
from firmware.quant import QParams
from firmware.runtime.graph import run_graph
from hdl.isa import RECIPROCAL_SCALE, Func, Rounding
from hdl.presets import PRESETS, get_config

SEED = 20261215

#: The table kinds of the Lookup: uint8 values at random (the extremes in them), softmax's
#: exp (many zeros below its range), and a table that is zero but for the highest scores
#: (whole rows of e zero: a divisor of 0).
TABLES = ("random", "exp", "sparse")


def _config(key: str):
    """A preset, or ``"RxC"``: the default (ub_depth 1024, acc_depth 512, 64 weight tiles)
    with that array."""
    if key in PRESETS:
        return get_config(key)
    rows, cols = map(int, key.split("x"))
    return get_config("default").replace(rows=rows, cols=cols, host_width=None)


def attention_graph(seed: int, n: int, tokens: int, heads: int, d: int, k_in: int, *,
                    table: str = "random", in_dtype: str = "int8", order: str = "qkv",
                    zero_points: bool = False, outputs: tuple[str, ...] = ("att",),
                    extra_reader: str | None = None):
    """A random attention graph and ``n`` sequences of its input: ``x (1, T, K)`` ->
    q, k, v :class:`~firmware.graph.FullyConnected` (int8 weights with -128 and 127 in them,
    int32 biases, one channel's pushed to saturate, per-channel requantisation of random
    reals, IDENTITY or RELU) -> :class:`~firmware.graph.AttentionScores` -> a
    :class:`~firmware.graph.Lookup` (``table``: one of :data:`TABLES`) -> a normalised
    :class:`~firmware.graph.AttentionMix` (shift near 25, any rounding) -> ``att``.

    ``order``: the projections' order in the graph; ``zero_points``: non-zero zero points
    for the input (folded into the projections' biases), the scores and the mix;
    ``outputs``: the graph's outputs; ``extra_reader``: a tensor that a further operator (a
    fully connected one, output ``extra``) reads too."""
    rng = np.random.default_rng(seed)
    c = heads * d
    tensors: dict[str, g.Tensor] = {}

    def tensor(name, shape, dtype="int8"):
        tensors[name] = g.Tensor(name, (1, *shape), dtype, QParams(1.0, 0, dtype != "uint8"))
        return name

    tensor("x", (tokens, k_in), in_dtype)
    lo, hi = (-128, 128) if in_dtype == "int8" else (0, 256)
    x = rng.integers(lo, hi, (n, tokens, k_in))
    x[0, 0] = lo                         # a token of the extremes: saturating products
    x[-1, -1] = hi - 1
    x_mag = 74 if in_dtype == "int8" else 147   # an input's RMS, roughly

    fcs = {}
    for m in "qkv":
        w = rng.integers(-128, 128, (k_in, c))
        w[0, 0], w[-1, -1] = -128, 127
        w[:, -1] = -128 if m == "k" else w[:, -1]   # a column of -128: a saturating channel
        bias = rng.integers(-3000, 3000, c)
        reals = rng.uniform(0.3, 3, c) * 100 / (74 * x_mag * np.sqrt(k_in))
        func = Func.RELU if rng.random() < 0.35 else Func.IDENTITY
        # One channel's bias far past int8 after requantising (upwards where RELU would
        # hide a low one).
        sign = 1 if func == Func.RELU else int(rng.choice([-1, 1]))
        bias[int(rng.integers(c))] = sign * (1 << 24)
        req = g.requant_from_real(reals, 0, func=func, single=rng.random() < 0.75, where=m)
        fcs[m] = g.FullyConnected(m, ["x"], [tensor(m, (tokens, c))], weight=w, bias=bias,
                                  requant=req, keep_dims=True,
                                  input_zp=int(rng.integers(-20, 21)) if zero_points else 0)
    ops: list[g.Op] = [fcs[m] for m in order]
    s_zp = int(rng.integers(-10, 11)) if zero_points else 0
    s_real = float(rng.uniform(0.5, 4)) * 64 / (60 * 60 * np.sqrt(d))
    ops.append(g.AttentionScores("scores", ["q", "k"], [tensor("s", (heads, tokens, tokens))],
                                 heads=heads,
                                 requant=g.requant_from_real(s_real, s_zp,
                                                             single=rng.random() < 0.75,
                                                             where="scores")))
    lookup = g.Lookup("exp", ["s"], [tensor("e", (heads, tokens, tokens), "uint8")],
                      table=np.zeros(256, np.int64))
    ops.append(lookup)
    # The output's scale v's times 2**(shift - 25) (transformer.quantise's choice): the
    # e-weighted mean of v, times 8 down to 1/8.
    shift = int(rng.integers(RECIPROCAL_SCALE - 3, RECIPROCAL_SCALE + 4))
    m_zp = int(rng.integers(-5, 6)) if zero_points else 0
    rounding = Rounding.HALF_UP if rng.random() < 0.6 else \
        Rounding(int(rng.integers(1, 3)))
    ops.append(g.AttentionMix("mix", ["e", "v"], [tensor("att", (tokens, c))],
                              requant=g.Requant([0], [shift], rounding, m_zp),
                              normalise=True))
    if extra_reader is not None:
        width = tensors[extra_reader].shape[-1]
        ops.append(g.FullyConnected("extra", [extra_reader], [tensor("extra", (tokens, 3))],
                                    weight=rng.integers(-128, 128, (width, 3)),
                                    bias=rng.integers(-100, 100, 3),
                                    requant=g.requant_from_real([0.001] * 3, 0, where="extra"),
                                    keep_dims=True))
        outputs = (*outputs, "extra")
    graph = g.Graph("attention", tensors, ops, ["x"], list(outputs))

    if table == "random":
        values = rng.integers(0, 256, 256)
        values[[0, 127, 128, 255]] = [0, 255, 128, 255]
    elif table == "exp":
        values = exp_table(float(rng.uniform(0.02, 0.2)), int(rng.integers(0, 128)))
    elif table == "sparse":
        # Zero but for the scores at or above a threshold that some rows stay below.
        s = graph.reference({"x": x}, collect=True)["s"]
        row_max = np.unique(s.max(axis=-1))
        threshold = int(row_max[len(row_max) // 2]) if len(row_max) > 1 else 200
        values = np.where(np.arange(-128, 128) >= threshold, rng.integers(1, 256, 256), 0)
    else:
        raise ValueError(table)
    lookup.table = np.asarray(values, np.int64)
    return graph, {"x": x}


def _blocks(graph, config) -> list[lowering.AttentionBlockStep]:
    return [s for s in lowering.lower(graph, config) if isinstance(s, lowering.AttentionBlockStep)]


def _executable(graph, config) -> AttentionBlockExecutable:
    step, = _blocks(graph, config)
    x = graph.tensors[step.input]
    return AttentionBlockExecutable(step, config, x.shape[1], x.shape[2], x.dtype == "int8")


def _step(graph) -> lowering.AttentionBlockStep:
    """The graph's six operators as a block, whatever a configuration says."""
    ops = graph.ops
    by = {op.name: op for op in ops}
    return lowering.AttentionBlockStep((by["q"], by["k"], by["v"]), by["scores"], by["exp"],
                                by["mix"], list(ops[:6]))


def _check_bit_exact(graph, inputs, config, what: str, device="isa"):
    """``run_graph`` on ``device`` equals the reference in every output; returns the
    reference's tensors."""
    ref = graph.reference(inputs, collect=True)
    run = run_graph(graph, inputs, device=device, config=config)
    for name in graph.outputs:
        got, want = run.outputs[name], ref[name]
        assert got.shape == want.shape, f"{what}: {name} is {got.shape}, not {want.shape}"
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)
            raise AssertionError(f"{what}: {name} differs in {len(bad)} of {want.size} "
                                 f"elements, first at {tuple(bad[0])}: {got[tuple(bad[0])]} "
                                 f"!= {want[tuple(bad[0])]}")
    return ref


# Bit-exact on the ISA simulator ---------------------------------------------------------

#: (config, sequences, tokens, heads, head size, input channels, table). Every one fits its
#: core (one AttentionBlockStep); ``sequences`` above the program's capacity in some.
CASES = [
    ("small", 5, 5, 2, 3, 3, "random"),
    ("small", 3, 8, 1, 4, 1, "exp"),
    ("small", 4, 9, 3, 1, 3, "sparse"),
    ("small", 2, 1, 1, 7, 3, "random"),
    ("small", 7, 2, 1, 3, 8, "sparse"),
    ("wide", 3, 8, 2, 7, 3, "exp"),
    ("wide", 2, 9, 1, 8, 3, "random"),
    ("wide", 6, 3, 3, 2, 3, "sparse"),
    ("wide", 1, 9, 1, 9, 1, "random"),
    ("wide", 4, 5, 1, 4, 8, "exp"),
    ("3x5", 5, 9, 2, 7, 8, "random"),
    ("3x5", 2, 5, 3, 4, 8, "sparse"),
    ("3x5", 3, 1, 1, 1, 1, "exp"),
    ("3x5", 2, 2, 1, 9, 17, "random"),
    ("5x3", 3, 13, 2, 8, 8, "exp"),
    ("5x3", 2, 8, 3, 3, 17, "random"),
    ("5x3", 3, 3, 1, 9, 3, "sparse"),
    ("default", 3, 13, 3, 9, 17, "random"),
    ("default", 2, 9, 2, 8, 17, "sparse"),
    ("default", 3, 1, 1, 1, 1, "random"),
    ("default", 3, 5, 3, 7, 8, "exp"),
    # The narrowest arrays NORMALISE takes (one column of v a block), a single-row array and
    # a long thin one.
    ("2x2", 3, 5, 2, 3, 3, "random"),
    ("2x2", 2, 9, 1, 4, 8, "sparse"),
    ("1x4", 3, 3, 3, 2, 1, "exp"),
    ("2x7", 3, 5, 2, 3, 3, "exp"),
    ("2x7", 2, 9, 1, 4, 8, "random"),
    ("4x2", 4, 8, 3, 2, 3, "random"),
]


def _case_id(case) -> str:
    key, n, t, h, d, k, table = case
    return f"{key}-n{n}-T{t}-H{h}-d{d}-K{k}-{table}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_block_on_the_isa_simulator_equals_the_reference(case):
    key, n, t, h, d, k, table = case
    seed = SEED + CASES.index(case)
    what = f"seed {seed}, {_case_id(case)}"
    print(what)
    config = _config(key)
    graph, inputs = attention_graph(seed, n, t, h, d, k, table=table,
                                    zero_points=CASES.index(case) % 3 == 1)
    steps = lowering.lower(graph, config)
    assert [type(s) for s in steps] == [lowering.AttentionBlockStep], \
        f"{what}: not fused: {[type(s).__name__ for s in steps]}"
    assert set(lowering.placement(graph, config).values()) == {"core"}
    ref = _check_bit_exact(graph, inputs, config, what)
    # The case is as awkward as it says.
    for m in "qkv":
        assert (np.abs(ref[m]) >= 127).any(), f"{what}: no saturated {m}: weak case"
    if table == "sparse":
        assert (ref["e"].sum(axis=-1) == 0).any(), f"{what}: no row of e is zero: weak case"


def test_cases_cover_several_programs_per_run():
    """On each of the main configurations a case of the sweep has more sequences than a
    program holds (several programs, the last one partly full)."""
    over = set()
    for key, n, t, h, d, k, _ in CASES:
        graph, _ = attention_graph(0, n, t, h, d, k, table="random")
        if n > _executable(graph, _config(key)).sequences_per_program:
            over.add(key)
    assert {"small", "wide", "3x5", "5x3", "default"} <= over, over


def test_uint8_input_and_projections_in_another_order():
    """The input uint8 (MATMUL unsigned) and the projections in the graph as v, k, q."""
    config = get_config("wide")
    for i, (in_dtype, order) in enumerate((("uint8", "qkv"), ("int8", "vkq"),
                                           ("uint8", "kvq"))):
        seed = SEED + 100 + i
        what = f"seed {seed}, wide, {in_dtype}, {order}"
        print(what)
        graph, inputs = attention_graph(seed, 4, 7, 2, 3, 3, in_dtype=in_dtype, order=order,
                                        zero_points=True)
        steps = lowering.lower(graph, config)
        assert [type(s) for s in steps] == [lowering.AttentionBlockStep], what
        _check_bit_exact(graph, inputs, config, what)


def test_unfused_lowering_gives_the_same_outputs():
    """``fuse_attention=False`` keeps the six operators steps of their own; both lowerings
    give the reference's outputs."""
    config = get_config("default")
    seed = SEED + 140
    graph, inputs = attention_graph(seed, 4, 9, 2, 5, 8, table="exp", zero_points=True)
    steps = lowering.lower(graph, config, fuse_attention=False)
    assert not any(isinstance(s, lowering.AttentionBlockStep) for s in steps)
    assert len(_blocks(graph, config)) == 1
    want = graph.reference(inputs)["att"]
    for fuse in (True, False):
        got = run_graph(graph, inputs, config=config, fuse_attention=fuse).outputs["att"]
        assert np.array_equal(got, want), f"seed {seed}, fuse_attention={fuse}: differs"


def _prefixed(graph: g.Graph, prefix: str, src: str) -> tuple[dict, list]:
    """``graph``'s tensors and operators renamed with ``prefix``, its input ``x`` read from
    ``src``."""
    names = {name: prefix + name for name in graph.tensors}
    names["x"] = src
    tensors = {names[n]: dataclasses.replace(t, name=names[n])
               for n, t in graph.tensors.items() if n != "x"}
    ops = [dataclasses.replace(op, name=prefix + op.name,
                               inputs=[names[i] for i in op.inputs],
                               outputs=[names[o] for o in op.outputs]) for op in graph.ops]
    return tensors, ops


def test_two_blocks_in_one_graph():
    """Two attention layers, the second reading the first's output, then a fully connected
    operator (attention's output projection): two blocks and a core step, bit-exact."""
    config = get_config("default")
    seed = SEED + 150
    first, inputs = attention_graph(seed, 7, 9, 2, 5, 17, table="exp")
    second, _ = attention_graph(seed + 1, 1, 9, 3, 3, 10, table="sparse")
    tensors, ops = _prefixed(second, "b_", "att")
    tensors.update(first.tensors)
    tensors["y"] = g.Tensor("y", (1, 9, 4), "int8", QParams(1.0, 0, True))
    rng = np.random.default_rng(seed)
    ops = first.ops + ops + [g.FullyConnected(
        "o", ["b_att"], ["y"], weight=rng.integers(-128, 128, (9, 4)),
        bias=rng.integers(-500, 500, 4), requant=g.requant_from_real([0.01] * 4, 3, where="o"),
        keep_dims=True)]
    graph = g.Graph("two", tensors, ops, ["x"], ["y", "att"])
    steps = lowering.lower(graph, config)
    assert [type(s) for s in steps] == [lowering.AttentionBlockStep, lowering.AttentionBlockStep,
                                        lowering.CoreStep], steps
    assert [s.name for s in steps[:2]] == ["q..mix", "b_q..b_mix"]
    _check_bit_exact(graph, inputs, config, f"seed {seed}, two blocks")


def test_table_with_negative_entries_is_refused():
    """A Lookup whose table has int8 (negative) entries makes e signed, which the mix's
    MATMUL reads unsigned (the separate MixExecutable refuses such an e: "p must be
    uint8"): the block refuses it, so lower() leaves it unfused, never a silent wrong
    answer."""
    config = get_config("default")
    seed = SEED + 160
    graph, inputs = attention_graph(seed, 3, 9, 2, 5, 8)
    graph.ops[4].table = np.random.default_rng(seed).integers(-128, 128, 256)
    assert (graph.reference(inputs, collect=True)["e"] < 0).any()
    assert not _blocks(graph, config)
    with pytest.raises(CompileError, match="non-negative"):
        AttentionBlockExecutable(_step(graph), config, 9, 8)


def _random_cases(first_seed: int, count: int, keys: tuple[str, ...]):
    """``count`` random cases over ``keys``: ``(seed, key, case)`` (the seed printed)."""
    for i in range(count):
        seed = first_seed + i
        rng = np.random.default_rng(seed)
        key = keys[i % len(keys)]
        case = (key, int(rng.integers(1, 8)), int(rng.choice([1, 2, 3, 5, 8, 9, 13])),
                int(rng.integers(1, 4)), int(rng.choice([1, 2, 3, 4, 7, 8, 9])),
                int(rng.choice([1, 3, 8, 17])), TABLES[int(rng.integers(3))])
        yield seed, case


def _check_random(seed, case) -> bool:
    """One random case: bit-exact whether fused or not; when not fused, the block must
    have refused the memories (weight tiles, the buffer, the accumulators). Whether it was
    fused."""
    key, n, t, h, d, k, table = case
    what = f"seed {seed}, {_case_id(case)}"
    print(what)
    config = _config(key)
    graph, inputs = attention_graph(seed, n, t, h, d, k, table=table,
                                    zero_points=bool(seed % 2))
    fused = bool(_blocks(graph, config))
    if fused:
        _check_bit_exact(graph, inputs, config, what)
        return True
    with pytest.raises(CompileError, match="weight memory|unified-buffer"):
        AttentionBlockExecutable(_step(graph), config, t, k)
    try:
        _check_bit_exact(graph, inputs, config, what)
    except CompileError as error:        # the separate steps do not fit either
        print(f"{what}: not fused, and the separate steps do not fit: {error}")
    return False


#: The configurations of the random sweeps.
SWEEP = ("small", "wide", "3x5", "5x3", "default", "2x2", "2x7")


@pytest.mark.parametrize("key", SWEEP)
def test_random_shapes(key):
    """Eight random shapes a configuration: the fused ones and the fallbacks bit-exact."""
    first = SEED + 200 + 10 * SWEEP.index(key)
    fused = [_check_random(seed, case) for seed, case in _random_cases(first, 8, (key,))]
    print(f"{key}: {sum(fused)} of {len(fused)} fused")
    assert sum(fused) >= (1 if key in ("small", "wide", "2x2") else 4), fused


@pytest.mark.slow
@pytest.mark.parametrize("key", SWEEP)
def test_random_shapes_sweep(key):
    """Many random shapes a configuration: the fused ones and the fallbacks bit-exact."""
    first = SEED + 1000 + 100 * SWEEP.index(key)
    fused = [_check_random(seed, case) for seed, case in _random_cases(first, 80, (key,))]
    print(f"{key}: {sum(fused)} of {len(fused)} fused")
    assert sum(fused) >= (10 if key in ("small", "wide", "2x2") else 40), fused


def _smallest(graph, base, field: str, depths=(16, 32, 64, 128, 256, 512, 1024)):
    """``base`` with the smallest power-of-two ``field`` (ub_depth or acc_depth) on which
    the block compiles."""
    for depth in depths:
        config = base.replace(**{field: depth})
        if _blocks(graph, config):
            return config
    raise AssertionError(f"the block compiles with no {field} up to {depths[-1]}")


def test_tight_memories_and_slots():
    """The block at its limits: weight tiles for exactly the projections and the moved
    tiles, a shallow weight queue (one tile ahead), three parameter slots (the projections'
    sets reloaded inside the program, one slot for all), eight (the sets resident where
    they fit), the smallest buffer and the smallest accumulators it compiles for (down to
    one sequence a program, one unit a job)."""
    base = get_config("default").replace(rows=4, cols=4, host_width=None)
    seed = SEED + 300
    seen, resident = set(), 0
    for i, (n, t, h, d, k) in enumerate(((5, 5, 2, 3, 3), (4, 7, 3, 5, 8), (3, 13, 1, 9, 17),
                                         (5, 3, 2, 4, 3))):
        graph, inputs = attention_graph(seed + i, n, t, h, d, k, table="exp",
                                        zero_points=True)
        tiles = _executable(graph, base).tiles_used
        variants = {
            "exact tiles": base.replace(weight_mem_tiles=tiles + 6),
            "fifo 1": base.replace(weight_fifo_depth=1, weight_mem_tiles=tiles + 4),
            "3 slots": base.replace(param_slots=3),
            "8 slots": base.replace(param_slots=8),
            "smallest buffer": _smallest(graph, base, "ub_depth"),
            "smallest accumulators": _smallest(graph, base, "acc_depth"),
            "both smallest": _smallest(graph, _smallest(graph, base, "ub_depth"),
                                       "acc_depth"),
        }
        for name, config in variants.items():
            ex = _executable(graph, config)
            what = (f"seed {seed + i}, T{t}-H{h}-d{d}-K{k}, {name}: {ex.sequences_per_program}"
                    f" a program, {ex.group} a job")
            print(what)
            seen.add((ex.sequences_per_program, ex.group))
            if name == "3 slots":
                assert not ex.resident_params, what
            if name == "8 slots":       # six sets stay in the slots, loaded by the setup
                assert ex.resident_params == (len(ex.blocks) <= 6), what
                resident += ex.resident_params
            if name in ("exact tiles", "fifo 1"):         # one tile fewer does not fit
                fewer = config.replace(weight_mem_tiles=config.weight_mem_tiles - 1)
                with pytest.raises(CompileError, match="weight memory"):
                    AttentionBlockExecutable(ex.step, fewer, t, k)
            _check_bit_exact(graph, inputs, config, what)
    assert (1, 1) in seen, seen
    assert resident, "no case with the projections' sets resident"


# The fallback and the errors -------------------------------------------------------------

#: (name, config, what the error says, the graph's shape (T, H, d, K)).
FALLBACKS = [
    ("no row scale", get_config("small").replace(row_scale=False), r"NORMALISE",
     (5, 2, 3, 3)),
    ("no table", get_config("small").replace(lookup_table=False),
     r"programmable table", (5, 2, 3, 3)),
    ("no UB_TO_WEIGHTS", get_config("small").replace(ub_to_weights=False),
     r"UB_TO_WEIGHTS", (5, 2, 3, 3)),
    ("two slots", get_config("small").replace(param_slots=2), r"three parameter slots",
     (5, 2, 3, 3)),
    ("int8 operands", get_config("small").replace(operands="int8"), r"uint8 operands",
     (5, 2, 3, 3)),
    ("too few tiles", get_config("small"), r"weight memory holds 16", (5, 2, 3, 8)),
    ("tiny", get_config("tiny"), r"weight memory holds 8", (3, 1, 2, 2)),
    ("small buffer", get_config("small").replace(ub_depth=64), r"unified-buffer rows",
     (5, 2, 3, 3)),
    ("small accumulators", get_config("default").replace(acc_depth=32),
     r"accumulator rows", (9, 1, 3, 3)),
    ("one column", get_config("default").replace(cols=1, host_width=None), r"two columns",
     (5, 2, 3, 3)),
]


@pytest.mark.parametrize("name, config, message, shape", FALLBACKS,
                         ids=[f[0].replace(" ", "-") for f in FALLBACKS])
def test_fallback_to_separate_steps(name, config, message, shape):
    """lower() leaves the block out; the separate steps run bit-exact where they can;
    the executable, built directly, says what the core lacks, naming the block."""
    t, h, d, k = shape
    seed = SEED + 400 + [f[0] for f in FALLBACKS].index(name)
    what = f"seed {seed}, {name}, T{t}-H{h}-d{d}-K{k}"
    print(what)
    graph, inputs = attention_graph(seed, 3, t, h, d, k, table="exp")
    steps = lowering.lower(graph, config)
    assert not any(isinstance(s, lowering.AttentionBlockStep) for s in steps), f"{what}: fused"
    step = _step(graph)
    with pytest.raises(CompileError, match=message) as error:
        AttentionBlockExecutable(step, config, t, k)
    assert str(error.value).startswith(f"{step.name}: "), str(error.value)
    try:
        _check_bit_exact(graph, inputs, config, what)
    except CompileError as e:        # the separate steps do not fit either: say which
        assert name in ("small buffer", "small accumulators", "tiny"), f"{what}: {e}"
        print(f"{what}: the separate steps do not fit either: {e}")


def test_graph_rule_errors():
    """What the block itself refuses, whatever the core: each error names the block and
    the operator."""
    config = get_config("default")
    graph, _ = attention_graph(SEED + 500, 1, 5, 2, 3, 3)
    step = _step(graph)
    name = re.escape(step.name)

    def refused(pattern, tokens=5, in_channels=3):
        with pytest.raises(CompileError, match=rf"^{name}: .*{pattern}"):
            AttentionBlockExecutable(step, config, tokens, in_channels)

    step.mix.normalise = False
    refused("mix is not normalised")
    step.mix.normalise = True
    req = step.scores.requant
    step.scores.requant = g.Requant(req.multiplier, req.shift, req.rounding, 0, Func.RELU)
    refused("scores's function is RELU")
    step.scores.requant = g.Requant([1 << 30, 1 << 29], [40, 40], req.rounding, 0)
    refused("one requantisation multiplier")
    step.scores.requant = req
    refused("q takes 3 channels, the input has 4", in_channels=4)
    v_req = step.projections[2].requant
    step.projections[2].requant = g.Requant(v_req.multiplier, v_req.shift, v_req.rounding, 0,
                                            Func.CLAMP, 0)
    refused("v clamps at 0")
    step.projections[2].requant = v_req
    q_req = step.projections[0].requant
    step.projections[0].requant = g.Requant(q_req.multiplier, q_req.shift, q_req.rounding, 3)
    refused("q's output zero point is 3")
    step.projections[0].requant = q_req
    AttentionBlockExecutable(step, config, 5, 3)         # all restored: it compiles
    odd = _step(attention_graph(SEED + 501, 1, 5, 1, 5, 3)[0])
    odd.scores.heads = 2
    with pytest.raises(CompileError, match="multiple of 2 heads"):
        AttentionBlockExecutable(odd, config, 5, 3)


#: How an intermediate tensor is used outside the block.
USES = ["q output", "s output", "e output", "k read", "v read"]


@pytest.mark.parametrize("how", USES)
def test_intermediate_tensor_used_elsewhere_is_not_fused(how):
    """An intermediate tensor that is a graph output or read by another operator keeps the
    operators apart (the block never sends it to the host); the steps still run
    bit-exact."""
    config = get_config("default")
    tensor, kind = how.split()
    kwargs = {"outputs": ("att", tensor)} if kind == "output" else {"extra_reader": tensor}
    seed = SEED + 600 + USES.index(how)
    print(f"seed {seed}, {how}")
    graph, inputs = attention_graph(seed, 2, 5, 2, 3, 3, **kwargs)
    assert not _blocks(graph, config), f"{how}: fused"
    _check_bit_exact(graph, inputs, config, f"seed {seed}, {how}")
    # The same graph without the extra use is fused.
    plain, _ = attention_graph(seed, 2, 5, 2, 3, 3)
    assert len(_blocks(plain, config)) == 1


def test_batches_refuse_wrong_inputs():
    config = get_config("small")
    graph, inputs = attention_graph(SEED + 700, 2, 5, 2, 3, 3)
    ex = _executable(graph, config)
    x = inputs["x"]
    for bad in (x[0], x[:, :4], x[..., :2], np.zeros((2, 5, 4), np.int64),
                np.concatenate([x, x], axis=-1)):
        with pytest.raises(ValueError, match=r"q\.\.mix: inputs are .* per sequence"):
            next(ex.batches(bad))
    for value in (128, -129):
        y = x.copy()
        y[-1, -1, -1] = value
        with pytest.raises(ValueError, match="must be int8"):
            next(ex.batches(y))
    graph_u, inputs_u = attention_graph(SEED + 701, 2, 5, 2, 3, 3, in_dtype="uint8")
    ex_u = _executable(graph_u, config)
    for value in (-1, 256):
        y = inputs_u["x"].copy()
        y[0, 0, 0] = value
        with pytest.raises(ValueError, match="must be uint8"):
            next(ex_u.batches(y))
    assert list(ex.batches(x[:0])) == []


# No host traffic inside the block ------------------------------------------------------------

def _instructions(beats, config) -> list[tuple[str, dict[str, str]]]:
    """The instructions of ``beats`` (the disassembler's text, data lines left out; a raw
    ``.word`` instruction by its comment): the mnemonic and the fields."""
    out = []
    for line in disassemble(beats, config).splitlines():
        if line.startswith(".word") and "#" in line:
            line = line.split("#", 1)[1]
        elif not line or line.startswith("."):
            continue
        words = line.split("#")[0].split()
        out.append((words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)))
    return out


@pytest.mark.parametrize("key, shape, slots", [("small", (5, 5, 2, 3, 3), 4),
                                               ("small", (5, 5, 2, 3, 3), 8),
                                               ("3x5", (4, 9, 2, 7, 8), 4),
                                               ("default", (3, 13, 3, 9, 17), 4)],
                         ids=["small-T5-H2-d3", "small-T5-H2-d3-8slots", "3x5-T9-H2-d7",
                              "default-T13-H3-d9"])
def test_program_has_no_host_traffic_inside_the_block(key, shape, slots):
    """Per batch program: every READ_HOST before the first MATMUL, only WRITE_HOSTs of the
    attention output after (heads * ceil(d / (cols - 1)) * T rows a sequence), no
    LOAD_WEIGHTS or LOAD_TABLE; the setup program loads the weights, the table and the
    slots. The projections' parameter sets are the one thing a batch program loads, once
    each, unless they all stay in the slots (eight slots)."""
    config = _config(key).replace(param_slots=slots)
    n, t, h, d, k = shape
    graph, inputs = attention_graph(SEED + 800, n, t, h, d, k)
    ex = _executable(graph, config)
    setup = [m for m, _ in _instructions(ex.setup_program()[0], config)]
    assert "load_weights" in setup and "load_table" in setup
    assert setup.count("load_params") == 2 + (len(ex.blocks) if ex.resident_params else 0)
    assert ex.resident_params == (slots == 8 and key == "small")
    assert not {"read_host", "write_host", "matmul"} & set(setup), setup
    batches = list(ex.batches(inputs["x"]))
    assert len(batches) == -(-n // ex.sequences_per_program)
    out_rows = h * -(-d // (config.cols - 1)) * t
    assert ex.host_rows() == (-(-k // config.rows) * t, out_rows)
    for batch in batches:
        instrs = _instructions(batch.beats, config)
        names = [m for m, _ in instrs]
        assert not {"load_weights", "load_table"} & set(names), "weights or the table sent"
        assert "ub_to_weights" in names
        assert names.count("load_params") == (0 if ex.resident_params else len(ex.blocks))
        first_matmul = names.index("matmul")
        reads = [i for i, m in enumerate(names) if m == "read_host"]
        assert reads and max(reads) < first_matmul, "a READ_HOST after the first MATMUL"
        assert sum(int(f["count"]) for m, f in instrs if m == "read_host") == \
            batch.images * ex.host_rows()[0]
        writes = [f for m, f in instrs if m == "write_host"]
        assert sum(int(f["count"]) for f in writes) == batch.images * out_rows
        assert batch.output_beats == batch.images * out_rows + 1
        # Each WRITE_HOST sends the rows the NORMALISE just before it wrote (whole
        # sequences' heads: a multiple of T rows).
        for i, (m, f) in enumerate(instrs):
            if m == "write_host":
                prev = [pf for pm, pf in instrs[:i] if pm == "activate"][-1]
                assert prev["func"] == "normalise", prev
                assert (prev["ub"], prev["count"]) == (f["ub"], f["count"]), (prev, f)
                assert int(f["count"]) % t == 0, f
        assert names[-1] == "halt"
    # And the outputs decode to the reference.
    assert np.array_equal(run_graph(graph, inputs, config=config).outputs["att"],
                          graph.reference(inputs)["att"])


# On the RTL ------------------------------------------------------------------------------------

#: RTL variants of the 4x4 core: three parameter slots (the projections' sets reloaded in
#: the program) and weight tiles for exactly six projection tiles and the moved ones; one
#: tile ahead in a shallow weight queue.
RTL_CONFIGS = {
    "small": get_config("small"),
    "small-3slots-12tiles": get_config("small").replace(param_slots=3, weight_mem_tiles=12),
    "small-fifo1-10tiles": get_config("small").replace(weight_fifo_depth=1,
                                                      weight_mem_tiles=10),
    "default": get_config("default"),
}

#: (configuration, (sequences, tokens, heads, head size, input channels, table)); make test
#: runs the second, the smallest (the Transformer demo runs the block on the RTL too); the
#: others take 12 to 15 s each on Icarus.
RTL_CASES = [
    pytest.param("small", (5, 5, 2, 3, 3, "exp"), marks=pytest.mark.slow),
    ("small", (2, 4, 1, 2, 4, "sparse")),
    pytest.param("small-3slots-12tiles", (6, 5, 2, 3, 3, "random"), marks=pytest.mark.slow),
    pytest.param("default", (14, 5, 3, 7, 8, "exp"), marks=pytest.mark.slow),
    pytest.param("small-fifo1-10tiles", (5, 5, 2, 3, 3, "sparse"), marks=pytest.mark.slow),
    pytest.param("default", (7, 9, 2, 8, 17, "random"), marks=pytest.mark.slow),
    pytest.param("default", (3, 13, 3, 9, 17, "exp"), marks=pytest.mark.slow),
]


def _rtl_id(case) -> str:
    key, (n, t, h, d, k, table) = case.values if hasattr(case, "values") else case
    return f"{key}-n{n}-T{t}-H{h}-d{d}-K{k}-{table}"


@pytest.mark.parametrize("key, shape", RTL_CASES, ids=[_rtl_id(c) for c in RTL_CASES])
def test_block_on_the_rtl_equals_the_reference(rtl_device, key, shape):
    n, t, h, d, k, table = shape
    seed = SEED + 900 + 10 * n + t
    what = f"seed {seed}, {key} RTL, {shape}"
    print(what)
    config = RTL_CONFIGS[key]
    device = rtl_device(config)
    graph, inputs = attention_graph(seed, n, t, h, d, k, table=table, zero_points=True)
    assert [type(s) for s in lowering.lower(graph, config)] == [lowering.AttentionBlockStep], what
    ex = _executable(graph, config)
    print(f"{ex.sequences_per_program} sequences a program, {ex.group} units a job, "
          f"projection sets resident: {ex.resident_params}, tiles {ex.tiles_used} of "
          f"{config.weight_mem_tiles}")
    if key != "small" or n == 5:
        assert n > ex.sequences_per_program, f"{what}: one program only"
    ref = graph.reference(inputs)["att"]
    run = run_graph(graph, inputs, device=device)
    assert run.cycles, f"{what}: no core cycles: not the RTL?"
    print(f"core cycles: {run.cycles}")
    assert np.array_equal(run.outputs["att"], ref), \
        f"{what}: differs in {(run.outputs['att'] != ref).sum()} of {ref.size}"


@pytest.mark.parametrize("key", ["small", pytest.param("wide", marks=pytest.mark.slow),
                                 pytest.param("3x5", marks=pytest.mark.slow)])
def test_random_shapes_on_the_rtl(rtl_device, key):
    """Random shapes that fuse, on the RTL core: four on the 4x4, eight on the others."""
    config = RTL_CONFIGS.get(key) or _config(key)
    device = rtl_device(config)
    want = 4 if key == "small" else 8
    done = 0
    for seed, case in _random_cases(SEED + 2000 + 100 * len(key), 60, (key,)):
        _, n, t, h, d, k, table = case
        graph, inputs = attention_graph(seed, n, t, h, d, k, table=table,
                                        zero_points=bool(seed % 2))
        if not _blocks(graph, config):
            continue
        what = f"seed {seed}, {_case_id(case)} on the RTL"
        print(what)
        ref = graph.reference(inputs)["att"]
        run = run_graph(graph, inputs, device=device)
        assert np.array_equal(run.outputs["att"], ref), \
            f"{what}: differs in {(run.outputs['att'] != ref).sum()} of {ref.size}"
        done += 1
        if done == want:
            break
    assert done == want, f"{key}: only {done} of 60 random shapes fused"
