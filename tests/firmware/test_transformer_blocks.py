"""Random Transformer encoder blocks of awkward shapes (token counts and head sizes that are
not multiples of the array), built as int8 graphs the way
:func:`firmware.models.transformer.quantise` builds the digits Transformer's, bit-exact on
every tensor on the ISA simulator (and a few on the RTL) against the graph's integer
reference, with attention fused into one :class:`firmware.compiler.lowering.AttentionBlockStep` per
layer where the core can run it; and the int8 block tracks its float model (the builder
makes meaningful blocks, not saturated noise).

Each block: ``x`` int8 ``(1, T, D)`` -> LayerNorm -> q, k, v -> scores (``1 / sqrt(d)``
folded in) -> exp (a :class:`~firmware.graph.Lookup` of
:func:`~firmware.models.transformer.exp_table`) -> the normalised mix -> the output
projection with the residual as extra rows -> LayerNorm -> FFN (ReLU) -> FFN with the
residual -> ``h``; ``layers`` of them in a row."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass

import numpy as np
import pytest
from tiers import tiered

from firmware import graph as g
from firmware.compiler import CompileError, lowering
from firmware.compiler.attention_block import AttentionBlockExecutable
from firmware.models.transformer import LN_EPS, MULT_SHIFT, exp_table
from firmware.quant import QParams
from firmware.runtime.graph import GraphRun, run_graph
from hdl.isa import RECIPROCAL_SCALE, Func, Rounding
from hdl.presets import get_config

SEED = 20261220

#: Sequences of the float model's calibration (the scales and exp's offset).
CALIBRATION = 96
#: exp's offsets the builder tries (as quantise() does over 0..127, coarser).
OFFSETS = range(0, 128, 8)
#: The tensors a fused attention block keeps on chip (per layer prefix).
ON_CHIP = ("q", "k", "v", "s", "e")


# The float model -------------------------------------------------------------------------

def _layer_norm(x, g_, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * g_ + b


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def float_forward(p: dict, x: np.ndarray, heads: int, layers: int,
                  trace: dict | None = None) -> np.ndarray:
    """The float pre-norm encoder (``transformer.forward``'s layers without the embedding
    and the classifier) on ``x`` ``(n, T, D)``; ``trace`` gets every intermediate tensor
    under the int8 graph's names."""
    t = {} if trace is None else trace
    n, tokens, dm = x.shape
    d = dm // heads

    def split(z):
        return z.reshape(n, tokens, heads, d).transpose(0, 2, 1, 3)
    h = t["x"] = x
    for i in range(layers):
        L = f"l{i}_"
        a = t[L + "a1"] = _layer_norm(h, p[L + "ln1_g"], p[L + "ln1_b"])
        for m in "qkv":
            t[L + m] = a @ p[L + m + "_w"] + p[L + m + "_b"]
        q, k, v = (split(t[L + m]) for m in "qkv")
        s = t[L + "s"] = np.einsum("nhtd,nhsd->nhts", q, k) / np.sqrt(d)
        att = np.einsum("nhts,nhsd->nhtd", _softmax(s), v)
        att = t[L + "att"] = att.transpose(0, 2, 1, 3).reshape(n, tokens, dm)
        h = t[L + "h1"] = h + att @ p[L + "o_w"] + p[L + "o_b"]
        a = t[L + "a2"] = _layer_norm(h, p[L + "ln2_g"], p[L + "ln2_b"])
        f = t[L + "f"] = np.maximum(a @ p[L + "ff1_w"] + p[L + "ff1_b"], 0)
        h = t[L + "h2"] = h + f @ p[L + "ff2_w"] + p[L + "ff2_b"]
    return h


def random_params(rng: np.random.Generator, d_model: int, d_ff: int, layers: int) -> dict:
    """Float parameters of ``layers`` encoder layers: LayerNorm gains near 1, weights of
    about unit gain (q and k a little more, so that attention is not uniform), small
    biases."""
    dm, f = d_model, d_ff
    p = {}
    for i in range(layers):
        L = f"l{i}_"
        for ln in ("ln1", "ln2"):
            p[L + ln + "_g"] = rng.uniform(0.6, 1.4, dm)
            p[L + ln + "_b"] = rng.normal(0, 0.2, dm)
        sharp = rng.uniform(1.0, 2.0)
        for m, fan_in, fan_out, gain in (("q", dm, dm, sharp), ("k", dm, dm, sharp),
                                         ("v", dm, dm, 1.0), ("o", dm, dm, 1.0),
                                         ("ff1", dm, f, np.sqrt(2)), ("ff2", f, dm, 1.0)):
            p[L + m + "_w"] = rng.normal(0, gain / np.sqrt(fan_in), (fan_in, fan_out))
            p[L + m + "_b"] = rng.normal(0, 0.1, fan_out)
    return p


# The int8 graph ---------------------------------------------------------------------------

def _weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel symmetric int8 weights and their scales (as quantise())."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127
    return np.clip(np.round(w / scale), -127, 127).astype(np.int64), scale


@dataclass
class Block:
    """A random block: its int8 graph, float parameters and what relates the two."""
    seed: int
    tokens: int
    d_model: int
    heads: int
    d_ff: int
    layers: int
    graph: g.Graph
    params: dict
    x_scale: float
    out_scale: float
    exp_offset: int

    @property
    def output(self) -> str:
        return self.graph.outputs[0]

    def inputs(self, n: int, salt: int = 1) -> dict[str, np.ndarray]:
        """``n`` random int8 sequences from the calibration's distribution (another draw)."""
        rng = np.random.default_rng((self.seed, salt))
        x = _float_inputs(rng, n, self.tokens, self.d_model)
        return {"x": np.clip(np.round(x / self.x_scale), -127, 127).astype(np.int64)}

    def __str__(self) -> str:
        return (f"seed {self.seed}: T{self.tokens} D{self.d_model} H{self.heads} "
                f"d{self.d_model // self.heads} F{self.d_ff} L{self.layers}")


def _float_inputs(rng, n, tokens, d_model) -> np.ndarray:
    """A residual stream: per-channel offsets and spreads, a heavy-ish tail."""
    mean = rng.normal(0, 0.5, d_model)
    spread = rng.uniform(0.5, 1.5, d_model)
    return mean + spread * rng.standard_t(8, (n, tokens, d_model))


def transformer_block(seed: int, tokens: int, d_model: int, heads: int, d_ff: int,
                      layers: int = 1) -> Block:
    """Random float parameters (``seed``), per-tensor scales from the float model on random
    calibration sequences (largest magnitude / 127), and the int8 graph of ``layers``
    encoder layers exactly as :func:`firmware.models.transformer.quantise` builds its
    layers; exp's offset the one of :data:`OFFSETS` whose graph's output is nearest the
    float model's on the calibration."""
    if d_model % heads or d_model < 2:
        # One channel normalises to a constant: LayerNorm's scale degenerates.
        raise ValueError(f"d_model {d_model}: at least 2, a multiple of {heads} heads")
    rng = np.random.default_rng(seed)
    p = random_params(rng, d_model, d_ff, layers)
    x_cal = _float_inputs(np.random.default_rng((seed, 0)), CALIBRATION, tokens, d_model)
    x_scale = float(np.abs(x_cal).max()) / 127
    x_cal = np.clip(np.round(x_cal / x_scale), -127, 127) * x_scale
    trace: dict = {}
    float_forward(p, x_cal, heads, layers, trace)
    scale = {k: max(float(np.abs(v).max()), 1e-9) / 127 for k, v in trace.items()}
    scale["x"] = x_scale
    d = d_model // heads
    T, D = tokens, d_model
    tensors, ops = {}, []

    def tensor(name, shape, dtype="int8", s=1.0):
        tensors[name] = g.Tensor(name, (1, *shape), dtype, QParams(s, 0, dtype != "uint8"))
        return name

    def fc(name, src, s_in, w, b, out, s_out, shape, func=Func.IDENTITY):
        wq, sw = _weights(w)
        bias = np.round(b / (s_in * sw)).astype(np.int64)
        req = g.requant_from_real(s_in * sw / s_out, 0, func=func, where=name)
        ops.append(g.FullyConnected(name, [src], [tensor(out, shape, s=s_out)], weight=wq,
                                    bias=bias, requant=req, keep_dims=True))
        return out

    def layer_norm(name, src, gain, bias, out, s_out):
        ops.append(g.LayerNorm(
            name, [src], [tensor(out, (T, D), s=s_out)],
            gain=np.round(gain / s_out * 2 ** MULT_SHIFT).astype(np.int64),
            offset=np.round(bias / s_out * 2 ** MULT_SHIFT).astype(np.int64),
            gain_shift=MULT_SHIFT))
        return out

    def residual(name, a, s_a, width, h, s_h, w, b, out, s_out):
        cat = f"{name}_in"
        ops.append(g.Concat(f"{name}_cat", [a, h], [tensor(cat, (T, width + D), s=s_a)]))
        joint = np.vstack([w, (s_h / s_a) * np.eye(D)])
        return fc(name, cat, s_a, joint, b, out, s_out, (T, D))

    h = tensor("x", (T, D), s=x_scale)
    s_h = x_scale
    exp_ops = []
    for i in range(layers):
        L, sc = f"l{i}_", lambda k, i=i: scale[f"l{i}_{k}"]
        a = layer_norm(L + "ln1", h, p[L + "ln1_g"], p[L + "ln1_b"], L + "a1", sc("a1"))
        q, k, v = (fc(L + m, a, sc("a1"), p[L + m + "_w"], p[L + m + "_b"], L + m, sc(m),
                      (T, D)) for m in "qkv")
        ops.append(g.AttentionScores(
            L + "scores", [q, k], [tensor(L + "s", (heads, T, T), s=sc("s"))],
            heads=heads, requant=g.requant_from_real(
                sc("q") * sc("k") / (np.sqrt(d) * sc("s")), 0, where=L + "scores")))
        exp_ops.append(g.Lookup(L + "exp", [L + "s"],
                                [tensor(L + "e", (heads, T, T), "uint8", 1 / 255)],
                                table=exp_table(sc("s"), 127)))
        ops.append(exp_ops[-1])
        shift = RECIPROCAL_SCALE - round(np.log2(sc("v") / sc("att")))
        scale[L + "att"] = sc("v") * 2.0 ** (shift - RECIPROCAL_SCALE)
        ops.append(g.AttentionMix(
            L + "mix", [L + "e", v], [tensor(L + "att", (T, D), s=sc("att"))],
            requant=g.Requant([0], [shift], Rounding.HALF_UP, 0), normalise=True))
        h = residual(L + "o", L + "att", sc("att"), D, h, s_h, p[L + "o_w"], p[L + "o_b"],
                     L + "h1", sc("h1"))
        s_h = sc("h1")
        a = layer_norm(L + "ln2", h, p[L + "ln2_g"], p[L + "ln2_b"], L + "a2", sc("a2"))
        f = fc(L + "ff1", a, sc("a2"), p[L + "ff1_w"], p[L + "ff1_b"], L + "f", sc("f"),
               (T, d_ff), func=Func.RELU)
        h = residual(L + "ff2", f, sc("f"), d_ff, h, s_h, p[L + "ff2_w"], p[L + "ff2_b"],
                     L + "h2", sc("h2"))
        s_h = sc("h2")
    graph = g.Graph("block", tensors, ops, ["x"], [h])

    inputs = {"x": np.round(x_cal / x_scale).astype(np.int64)}
    want = trace[h]
    best = None
    for c in OFFSETS:
        for op in exp_ops:
            op.table = exp_table(scale[op.inputs[0]], c)
        err = float(((graph.reference(inputs)[h] * s_h - want) ** 2).mean())
        if best is None or err < best[0]:
            best = (err, c)
    for op in exp_ops:
        op.table = exp_table(scale[op.inputs[0]], best[1])
    return Block(seed, tokens, d_model, heads, d_ff, layers, graph, p, x_scale, s_h, best[1])


# Checking a run ---------------------------------------------------------------------------

def _layer_steps(block: Block) -> list[lowering.AttentionBlockStep]:
    """Each layer's six attention operators as a block, whatever a configuration says."""
    by = {op.name: op for op in block.graph.ops}
    steps = []
    for i in range(block.layers):
        L = f"l{i}_"
        ops = [by[L + m] for m in ("q", "k", "v", "scores", "exp", "mix")]
        steps.append(lowering.AttentionBlockStep(tuple(ops[:3]), *ops[3:], ops))
    return steps


def fusable(block: Block, config) -> dict[str, str | None]:
    """Per layer prefix: ``None`` when its attention compiles as one program on ``config``,
    else the compiler's reason."""
    out = {}
    for i, step in enumerate(_layer_steps(block)):
        try:
            AttentionBlockExecutable(step, config, block.tokens, block.d_model)
            out[f"l{i}_"] = None
        except CompileError as error:
            out[f"l{i}_"] = str(error)
    return out


def programs(block: Block, config, n: int) -> list[int]:
    """Per fused layer, the programs ``n`` sequences take (its sequences a program)."""
    out = []
    for step in _layer_steps(block):
        try:
            ex = AttentionBlockExecutable(step, config, block.tokens, block.d_model)
        except CompileError:
            continue
        out.append(-(-n // ex.sequences_per_program))
    return out


def check_block(block: Block, inputs, config, what: str, device="isa") -> GraphRun:
    """Lowering fuses each layer's attention exactly where it compiles as one program (else
    the reason is a memory's, printed), and ``run_graph`` on ``device`` equals the graph's
    reference on every tensor it returns; the only ones it does not return are those a
    fused block keeps on chip."""
    can = fusable(block, config)
    steps = lowering.lower(block.graph, config)
    fused = {s.ops[0].name[:3]: s for s in steps if isinstance(s, lowering.AttentionBlockStep)}
    for prefix, reason in can.items():
        if reason is None:
            assert prefix in fused, f"{what}: {prefix} attention compiles but was not fused"
            assert [op.name for op in fused[prefix].ops] == [
                prefix + m for m in ("q", "k", "v", "scores", "exp", "mix")], what
        else:
            assert prefix not in fused, f"{what}: {prefix} fused though it does not compile"
            assert re.search("weight memory|unified-buffer|accumulator rows", reason), \
                f"{what}: {prefix} not fused for another reason: {reason}"
            print(f"{what}: {prefix} attention not fused: {reason}")
    assert len(fused) == sum(r is None for r in can.values()), what
    ref = block.graph.reference(inputs, collect=True)
    t0 = time.perf_counter()
    run = run_graph(block.graph, inputs, device=device, config=config)
    seconds = time.perf_counter() - t0
    # What stays on chip: a fused block's q, k, v, scores and e; the scores of a separate
    # scores step that runs exp too.
    on_chip = {t for s in steps if not isinstance(s, lowering.HostStep) for op in s.ops
               for t in op.outputs if t != s.output}
    assert {p + t for p in fused for t in ON_CHIP} <= on_chip, what
    missing = set(ref) - set(run.tensors)
    assert missing == on_chip, f"{what}: missing {sorted(missing)}, not {sorted(on_chip)}"
    assert set(run.tensors) <= set(ref), f"{what}: {sorted(set(run.tensors) - set(ref))}"
    for name, got in run.tensors.items():
        want = ref[name]
        assert got.shape == want.shape, f"{what}: {name} is {got.shape}, not {want.shape}"
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)
            raise AssertionError(f"{what}: {name} differs in {len(bad)} of {want.size} "
                                 f"elements, first at {tuple(bad[0])}: {got[tuple(bad[0])]} "
                                 f"!= {want[tuple(bad[0])]}")
    out = block.output
    assert np.array_equal(run.outputs[out], ref[out]), f"{what}: output {out} differs"
    n = len(inputs["x"])
    print(f"{what}: {n} sequences, fused {sorted(fused)}, programs per fused layer "
          f"{programs(block, config, n)}, {len(steps)} steps, {seconds:.2f} s")
    return run


def tracking(block: Block, inputs) -> dict[str, float]:
    """Correlations of the int8 graph's tensors (dequantised) with the float model's on
    the same input: each layer's attention output, the block's output, and the block's
    update (output minus input: the residual left out, so that attention and the FFN
    count)."""
    ref = block.graph.reference(inputs, collect=True)
    trace: dict = {}
    float_forward(block.params, inputs["x"] * block.x_scale, block.heads, block.layers, trace)

    def corr(a, b):
        return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])

    def real(name):
        return ref[name] * block.graph.tensors[name].q.scale
    out = {f"l{i}_att": corr(real(f"l{i}_att"), trace[f"l{i}_att"])
           for i in range(block.layers)}
    out["out"] = corr(real(block.output), trace[block.output])
    out["update"] = corr(real(block.output) - real("x"), trace[block.output] - trace["x"])
    return out


def assert_tracks(block: Block, inputs, what: str, *, att=0.8, update=0.85, out=0.9):
    """The int8 block follows the float model, and its output is not saturated."""
    c = tracking(block, inputs)
    y = block.graph.reference(inputs)[block.output]
    sat = float((np.abs(y) >= 127).mean())
    print(f"{what}: exp offset {block.exp_offset}, correlations "
          f"{ {k: round(v, 3) for k, v in c.items()} }, output saturated {sat:.4f}, "
          f"RMS {np.sqrt((y.astype(float) ** 2).mean()):.1f}")
    assert c["out"] > out, f"{what}: output correlation {c['out']:.3f}"
    assert c["update"] > update, f"{what}: update correlation {c['update']:.3f}"
    for i in range(block.layers):
        assert c[f"l{i}_att"] > att, f"{what}: l{i}_att correlation {c[f'l{i}_att']:.3f}"
    assert sat < 0.02, f"{what}: {sat:.1%} of the output saturated"
    assert np.sqrt((y.astype(float) ** 2).mean()) > 10, f"{what}: output near zero"


# Bit-exact on the ISA simulator --------------------------------------------------------------

#: The array shapes of the fast tests: the default 8x8, 4x4 and 5x3 (the default's memories).
CONFIGS = ("default", "4x4", "5x3")

#: (seed, tokens, heads, head size, d_ff, layers, sequences, configurations whose weight
#: memory does not hold the fused attention). Tokens and head sizes not multiples of any
#: array; d_ff not a multiple of 8; ``sequences`` more than one program holds on some.
CASES = [
    (SEED + 0, 3, 1, 5, 13, 2, 36, ()),
    (SEED + 1, 5, 2, 3, 10, 1, 20, ()),
    (SEED + 2, 7, 3, 3, 20, 1, 10, ()),
    (SEED + 3, 9, 1, 7, 17, 2, 18, ()),
    (SEED + 4, 11, 2, 6, 21, 1, 8, ()),
    (SEED + 5, 5, 3, 5, 30, 1, 13, ("4x4", "5x3")),
    (SEED + 6, 7, 2, 9, 26, 2, 8, ("4x4", "5x3")),
    (SEED + 7, 9, 2, 5, 19, 1, 9, ()),
    (SEED + 8, 3, 3, 7, 22, 2, 20, ("4x4", "5x3")),
    (SEED + 9, 11, 3, 9, 35, 1, 3, ("default", "4x4", "5x3")),
    (SEED + 10, 11, 1, 9, 12, 1, 6, ()),
]


def _case_id(case) -> str:
    seed, t, h, d, f, layers, n, _ = case
    return f"s{seed}-T{t}-H{h}-d{d}-F{f}-L{layers}-n{n}"


def _block(case) -> Block:
    seed, t, h, d, f, layers, _, _ = case
    return transformer_block(seed, t, h * d, h, f, layers)


@functools.cache
def _built(case) -> tuple[Block, dict]:
    """A case's block and its ``sequences`` inputs (built once a session)."""
    block = _block(case)
    return block, block.inputs(case[6])


@pytest.mark.parametrize("key", tiered(CONFIGS, fast=["4x4"]))
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_block_on_the_isa_simulator_equals_the_reference(case, key):
    block, inputs = _built(case)
    what = f"{block} on {key}"
    config = get_config(key)
    can = fusable(block, config)
    unfused = key in case[-1]
    assert all((r is not None) == unfused for r in can.values()), \
        f"{what}: fusable {can}, expected {'not ' if unfused else ''}fused"
    check_block(block, inputs, config, what)


def test_cases_span_several_programs():
    """On each configuration some fast cases have more sequences than a fused program
    holds."""
    for key in CONFIGS:
        over = [_case_id(c) for c in CASES
                if any(p > 1 for p in programs(_built(c)[0], get_config(key), c[6]))]
        print(f"{key}: several programs in {over}")
        assert len(over) >= 3, key


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_int8_block_tracks_the_float_model(case):
    block, _ = _built(case)
    assert_tracks(block, block.inputs(64, salt=2), str(block))


def test_the_tracking_check_has_teeth():
    """A broken softmax (a flat exp table: uniform attention) or a lost residual (the
    identity rows of the output projection zeroed) fails the tracking check the good
    graph passes."""
    block, _ = _built(CASES[1])
    inputs = block.inputs(64, salt=2)
    lookup = next(op for op in block.graph.ops if op.name == "l0_exp")
    o = next(op for op in block.graph.ops if op.name == "l0_o")
    saved_table, saved_w = lookup.table.copy(), o.weight.copy()
    assert_tracks(block, inputs, "good")
    try:
        lookup.table = np.full(256, 100)
        with pytest.raises(AssertionError, match="l0_att correlation"):
            assert_tracks(block, inputs, "flat exp")
        lookup.table = saved_table
        o.weight[block.d_model:] = 0
        with pytest.raises(AssertionError, match="output correlation"):
            assert_tracks(block, inputs, "no residual")
    finally:
        lookup.table, o.weight = saved_table, saved_w
    assert_tracks(block, inputs, "restored")


# On the RTL ---------------------------------------------------------------------------------

#: (configuration, case): a two-layer block on the 4x4 and one on the 8x8, each fused and
#: with more sequences than a program holds, a one-layer block on the 4x4 and two-layer
#: blocks on the 5x3 and the 8x8: all in make regression (20 to 32 s each on Icarus; make
#: test runs the Transformer demo on the RTL, test_transformer_int8.py).
RTL_CASES = [
    pytest.param("4x4", (SEED + 50, 11, 2, 6, 21, 1, 5, ()), marks=pytest.mark.slow),
    pytest.param("4x4", (SEED + 51, 7, 3, 3, 20, 2, 8, ()), marks=pytest.mark.slow),
    pytest.param("default", (SEED + 52, 9, 2, 5, 19, 1, 9, ()), marks=pytest.mark.slow),
    pytest.param("5x3", (SEED + 53, 9, 1, 7, 17, 2, 7, ()), marks=pytest.mark.slow),
    pytest.param("default", (SEED + 54, 11, 2, 6, 21, 2, 8, ()), marks=pytest.mark.slow),
]


def _rtl_id(case) -> str:
    key, c = case.values if hasattr(case, "values") else case
    return f"{key}-{_case_id(c)}"


@pytest.mark.parametrize("key, case", RTL_CASES,
                         ids=[_rtl_id(c) for c in RTL_CASES])
def test_block_on_the_rtl_equals_the_reference(rtl_device, key, case):
    block, inputs = _built(case)
    config = get_config(key)
    what = f"{block} on the {key} RTL"
    assert all(r is None for r in fusable(block, config).values()), what
    assert max(programs(block, config, len(inputs["x"]))) > 1, f"{what}: one program only"
    t0 = time.perf_counter()
    run = check_block(block, inputs, config, what, device=rtl_device(config))
    print(f"{what}: {run.cycles} core cycles, {time.perf_counter() - t0:.1f} s")
    assert run.cycles, f"{what}: no core cycles: not the RTL?"


# The slow sweep ----------------------------------------------------------------------------

#: The configurations of the sweep: the fast set's, rows < cols, a two-row array, and the
#: "wide" preset (4x8 with small memories: fewer blocks fuse).
SWEEP = ("default", "4x4", "5x3", "3x5", "2x7", "wide")
#: Random shapes a configuration.
SWEEP_SHAPES = 10


def _random_case(seed: int, key: str) -> tuple:
    """A random case for ``key`` (the seed printed): awkward tokens, heads and head sizes,
    one or two layers; often one more sequence or a few than a fused program holds."""
    rng = np.random.default_rng(seed)
    t = int(rng.choice([2, 3, 5, 6, 7, 9, 10, 11, 13]))
    h = int(rng.integers(1, 4))
    d = int(rng.choice([2, 3, 5, 6, 7, 9, 10]))
    f = int(rng.integers(5, 41))
    layers = 2 if rng.random() < 0.35 else 1
    n = int(rng.integers(1, 8))
    if rng.random() < 0.5:
        block = _block((seed, t, h, d, f, layers, n, ()))
        config = get_config(key)
        per = [AttentionBlockExecutable(step, config, t, h * d).sequences_per_program
               for step, why in zip(_layer_steps(block), fusable(block, config).values(),
                                    strict=True) if why is None]
        if per:
            n = min(per) + int(rng.integers(1, 4))
    return (seed, t, h, d, f, layers, n, ())


@pytest.mark.slow
@pytest.mark.parametrize("key", SWEEP)
def test_random_blocks_on_the_isa_simulator(key):
    """Random blocks a configuration, bit-exact on every tensor, tracking the float
    model."""
    config = get_config(key)
    first = SEED + 1000 + 100 * SWEEP.index(key)
    fused = layers = 0
    for seed in range(first, first + SWEEP_SHAPES):
        case = _random_case(seed, key)
        block = _block(case)
        what = f"{block} on {key} ({_case_id(case)})"
        inputs = block.inputs(case[6])
        check_block(block, inputs, config, what)
        assert_tracks(block, block.inputs(48, salt=2), what)
        fused += sum(r is None for r in fusable(block, config).values())
        layers += block.layers
    print(f"{key}: {fused} of {layers} layers' attention fused")
    # The narrow and small-memory arrays fuse the smaller shapes only (weight tiles).
    assert fused >= (2 if key in ("wide", "2x7") else layers // 2), (fused, layers)
