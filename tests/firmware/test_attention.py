"""Attention's two products on the core (firmware/compiler/attention.py): ``q @ k.T`` with ``k.T``
made on chip by UB_TO_WEIGHTS (and exp after it, by the programmable table), and ``p @ v``
with ``v``'s rows moved on chip as tiles. Every
output ``==`` the integer reference (:class:`firmware.graph.AttentionScores`,
:class:`firmware.graph.AttentionMix`) on the ISA simulator for awkward shapes (token counts
and head sizes that are not multiples of the array, arrays with rows != cols), a few on the
RTL, and a clear error where the core cannot run them."""

import numpy as np
import pytest
from tiers import tiered

from firmware import graph as g
from firmware.compiler import CompileError, lowering
from firmware.compiler.attention import MixExecutable, ScoresExecutable
from firmware.device import open_device
from firmware.runtime import run
from hdl.presets import get_config

SEED = 20261206


def _case(seed: int, n: int, tokens: int, heads: int, d: int, real: float):
    """An AttentionScores operator and int8 q, k with the extremes in them."""
    rng = np.random.default_rng(seed)
    op = g.AttentionScores("scores", ["q", "k"], ["s"], heads=heads,
                           requant=g.requant_from_real(real, int(rng.integers(-20, 20)),
                                                       where="scores"))
    q = rng.integers(-128, 128, (n, tokens, heads * d))
    k = rng.integers(-128, 128, (n, tokens, heads * d))
    q[0, 0] = -128                       # a row of -128 * -128 products: saturates
    k[0, :] = -128
    q[-1, -1] = 127
    k[-1, 0] = -128
    return op, q, k


def _run(device, op, q, k):
    ex = ScoresExecutable(op, device.config, q.shape[1], q.shape[2])
    result = run(device, ex, np.stack([q, k], axis=1))
    return result, ex


#: (sequences, tokens, heads, head size): one of each awkward kind on the 8x8 default, and
#: 3x5 arrays (rows != cols) in the random sweep.
SHAPES = [(3, 8, 2, 8), (2, 11, 3, 5), (1, 5, 1, 19), (2, 17, 2, 9), (4, 1, 1, 1),
          (1, 64, 1, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"n{n}-T{t}-H{h}-d{d}" for n, t, h, d in SHAPES])
def test_scores_on_the_isa_simulator_equal_the_reference(shape):
    n, tokens, heads, d = shape
    seed = SEED + SHAPES.index(shape)
    print(f"seed {seed}, {shape}")
    op, q, k = _case(seed, n, tokens, heads, d, 384 / (16384 * d))   # -128 rows saturate
    device = open_device("isa", get_config("default"))
    result, _ = _run(device, op, q, k)
    want = op.reference(q, k)[0]
    assert result.outputs.shape == want.shape
    assert np.array_equal(result.outputs, want), f"seed {seed}, {shape}: scores differ"
    assert (want == 127).any() or (want == -128).any(), "no saturated score: weak case"


def _odd_array_cases(first_seed: int):
    """Six random shapes (sequences, tokens, heads, head size) on a 3x5 and on a 5x3 array
    of ISA simulators: ``(device, seed, rng, shape, what)``, the seed printed."""
    base = get_config("default")
    for j, (rows, cols) in enumerate(((3, 5), (5, 3))):
        device = open_device("isa", base.replace(rows=rows, cols=cols, host_width=192))
        for i in range(6):
            seed = first_seed + 10 * j + i
            rng = np.random.default_rng(seed)
            shape = (int(rng.integers(1, 4)), int(rng.integers(1, 20)),
                     int(rng.integers(1, 4)), int(rng.integers(1, 12)))
            what = f"seed {seed}, {rows}x{cols}, {shape}"
            print(what)
            yield device, seed, rng, shape, what


def test_random_shapes_on_odd_arrays():
    """Random token counts, heads and head sizes on a 3x5 and a 5x3 array: every score
    equal."""
    for device, seed, rng, shape, what in _odd_array_cases(SEED + 100):
        op, q, k = _case(seed, *shape, float(rng.uniform(0.0005, 0.01)))
        result, _ = _run(device, op, q, k)
        assert np.array_equal(result.outputs, op.reference(q, k)[0]), \
            f"{what}: scores differ"


@pytest.mark.parametrize("config_key, shape", [
    pytest.param("small", (2, 7, 2, 5), marks=pytest.mark.slow),
    pytest.param("default", (2, 11, 2, 9), marks=pytest.mark.slow)])
def test_scores_on_the_rtl_equal_the_reference(rtl_device, config_key, shape):
    seed = SEED + 200
    print(f"seed {seed}, {config_key}, {shape}")
    op, q, k = _case(seed, *shape, 0.003)
    result, _ = _run(rtl_device(config_key), op, q, k)
    assert np.array_equal(result.outputs, op.reference(q, k)[0]), \
        f"seed {seed}, {config_key}, {shape}: scores differ"
    counters = result.counters
    print(f"counters: {counters}")
    # Only q and k came from the host: k.T was made on chip (no LOAD_WEIGHTS in the programs).
    assert counters["array_active"] == shape[0] * shape[2] * shape[1] * \
        -(-shape[1] // get_config(config_key).cols) * -(-shape[3] // get_config(config_key).rows)


def test_programs_move_k_on_chip_and_load_no_weights():
    """The programs' instructions: UB_TO_WEIGHTS transposed, and no LOAD_WEIGHTS at all."""
    from firmware.asm import disassemble

    op, q, k = _case(SEED, 2, 11, 2, 9, 0.003)
    config = get_config("default")
    ex = ScoresExecutable(op, config, 11, 18)
    beats = ex.setup_program()[0] + [b for batch in ex.batches(np.stack([q, k], axis=1))
                                     for b in batch.beats]
    mnemonics = [line.split()[0] for line in disassemble(beats, config).splitlines()
                 if line and not line.startswith(".")]
    moves = [line for line in disassemble(beats, config).splitlines()
             if line.startswith("ub_to_weights")]
    assert all(line.endswith("transpose") for line in moves), moves
    assert "load_weights" not in mnemonics
    # 2 sequences x 2 heads x 2 key blocks x 2 chunks of 9 channels on 8 rows.
    assert len(moves) == 16


def test_clear_errors_where_it_does_not_fit():
    op, _, _ = _case(SEED, 1, 8, 2, 8, 0.01)
    with pytest.raises(CompileError, match="no UB_TO_WEIGHTS"):
        ScoresExecutable(op, get_config("icebreaker"), 8, 16)
    with pytest.raises(CompileError, match=r"scores: .*unified buffer holds 64"):
        ScoresExecutable(op, get_config("tiny"), 8, 16)
    with pytest.raises(CompileError, match=r"scores: 300 tokens .*accumulators hold 512"):
        ScoresExecutable(op, get_config("default"), 300, 16)
    with pytest.raises(CompileError, match="do not split into 2 heads"):
        ScoresExecutable(op, get_config("default"), 8, 15)


# exp after the scores, by the activation unit's table -------------------------------------

def _lookup(seed: int) -> g.Lookup:
    """A table of uint8 values (exp's kind), most past 127 (negative if read as int8), with
    the extremes at both ends."""
    table = np.random.default_rng(seed).integers(128, 256, 256)    # as int8: negative
    table[[0, 127, 128, 255]] = [0, 255, 128, 127]
    return g.Lookup("exp", ["s"], ["e"], table=table)


def _run_lookup(device, op, lookup, q, k):
    ex = ScoresExecutable(op, device.config, q.shape[1], q.shape[2], lookup=lookup)
    return run(device, ex, np.stack([q, k], axis=1))


@pytest.mark.parametrize("shape", SHAPES[:4], ids=[f"n{n}-T{t}-H{h}-d{d}"
                                                   for n, t, h, d in SHAPES[:4]])
def test_scores_with_exp_on_the_isa_simulator(shape):
    """The scores' ACTIVATE looks the table up: the output is the lookup's of the
    reference's scores, uint8, every element equal, saturated scores included."""
    n, tokens, heads, d = shape
    seed = SEED + 300 + SHAPES.index(shape)
    print(f"seed {seed}, {shape}")
    op, q, k = _case(seed, n, tokens, heads, d, 384 / (16384 * d))
    lookup = _lookup(seed)
    result = _run_lookup(open_device("isa", get_config("default")), op, lookup, q, k)
    scores = op.reference(q, k)[0]
    want = lookup.reference(scores)[0]
    assert np.array_equal(result.outputs, want), f"seed {seed}, {shape}: exp(scores) differ"
    assert (want > 127).any(), "no entry past 127: the uint8 reading is untested"


def test_scores_with_exp_on_odd_arrays():
    """Random shapes on a 3x5 and a 5x3 array (the table's last beat partial on 5 columns
    and on 3)."""
    for device, seed, rng, shape, what in _odd_array_cases(SEED + 400):
        op, q, k = _case(seed, *shape, float(rng.uniform(0.0005, 0.01)))
        lookup = _lookup(seed)
        result = _run_lookup(device, op, lookup, q, k)
        want = lookup.reference(op.reference(q, k)[0])[0]
        assert np.array_equal(result.outputs, want), f"{what}: exp(scores) differ"


def test_scores_with_exp_on_the_rtl(rtl_device):
    seed = SEED + 500
    shape = (2, 7, 2, 5)
    print(f"seed {seed}, small, {shape}")
    op, q, k = _case(seed, *shape, 0.003)
    lookup = _lookup(seed)
    result = _run_lookup(rtl_device("small"), op, lookup, q, k)
    want = lookup.reference(op.reference(q, k)[0])[0]
    assert np.array_equal(result.outputs, want), f"seed {seed}, small, {shape}: differ"


def test_lookup_refused_where_the_core_cannot_run_it():
    op, _, _ = _case(SEED, 1, 8, 2, 8, 0.01)
    lookup = _lookup(SEED)
    with pytest.raises(CompileError, match="exp: the 8x8 core has no programmable table"):
        ScoresExecutable(op, get_config("default").replace(lookup_table=False), 8, 16,
                         lookup=lookup)
    op.requant.func = g.Func.RELU
    with pytest.raises(CompileError, match="exp: scores's function is RELU"):
        ScoresExecutable(op, get_config("default"), 8, 16, lookup=lookup)


# p @ v: v moved on chip as tiles ------------------------------------------------------------

def _mix_case(seed: int, n: int, tokens: int, heads: int, d: int, real: float):
    rng = np.random.default_rng(seed)
    op = g.AttentionMix("mix", ["p", "v"], ["o"],
                        requant=g.requant_from_real(real, int(rng.integers(-20, 20)),
                                                    where="mix"))
    p = rng.integers(0, 256, (n, heads, tokens, tokens))
    v = rng.integers(-128, 128, (n, tokens, heads * d))
    p[0, 0] = 255                        # a row of 255 * -128 products: saturates
    v[0] = -128
    v[-1, -1] = 127
    return op, p, v


def _run_mix(device, op, p, v):
    ex = MixExecutable(op, device.config, p.shape[2], v.shape[2], p.shape[1])
    return run(device, ex, MixExecutable.pack(p, v))


@pytest.mark.parametrize("shape", SHAPES, ids=[f"n{n}-T{t}-H{h}-d{d}" for n, t, h, d in SHAPES])
def test_mix_on_the_isa_simulator_equals_the_reference(shape):
    n, tokens, heads, d = shape
    seed = SEED + 300 + SHAPES.index(shape)
    print(f"seed {seed}, {shape}")
    op, p, v = _mix_case(seed, n, tokens, heads, d, 3 / (255 * tokens))
    result = _run_mix(open_device("isa", get_config("default")), op, p, v)
    want = op.reference(p, v)[0]
    assert np.array_equal(result.outputs, want), f"seed {seed}, {shape}: outputs differ"
    assert (want == -128).any(), "no saturated output: weak case"


def test_mix_random_shapes_on_odd_arrays():
    for device, seed, rng, shape, what in _odd_array_cases(SEED + 400):
        op, p, v = _mix_case(seed, *shape, float(rng.uniform(0.0001, 0.002)))
        result = _run_mix(device, op, p, v)
        assert np.array_equal(result.outputs, op.reference(p, v)[0]), \
            f"{what}: outputs differ"


@pytest.mark.parametrize("config_key, shape", tiered([("small", (2, 7, 2, 5)),
                                                    ("default", (2, 11, 2, 9))],
                                                   fast=[("small", (2, 7, 2, 5))]))
def test_mix_on_the_rtl_equals_the_reference(rtl_device, config_key, shape):
    seed = SEED + 500
    print(f"seed {seed}, {config_key}, {shape}")
    op, p, v = _mix_case(seed, *shape, 0.0005)
    result = _run_mix(rtl_device(config_key), op, p, v)
    assert np.array_equal(result.outputs, op.reference(p, v)[0]), \
        f"seed {seed}, {config_key}, {shape}: outputs differ"


def test_mix_refused_where_the_core_cannot_run_it():
    op, _, _ = _mix_case(SEED, 1, 8, 2, 8, 0.001)
    with pytest.raises(CompileError, match="no UB_TO_WEIGHTS"):
        MixExecutable(op, get_config("default").replace(ub_to_weights=False), 8, 16, 2)
    with pytest.raises(CompileError, match="uint8"):
        MixExecutable(op, get_config("icebreaker").replace(ub_to_weights=True), 8, 16, 2)
    with pytest.raises(CompileError, match=r"mix: .*unified buffer holds 64"):
        MixExecutable(op, get_config("tiny"), 16, 16, 2)


# p @ v normalised after the product (NORMALISE: the division by the row sums on chip) ----

def _normalised_case(seed: int, n: int, tokens: int, heads: int, d: int):
    """A normalised AttentionMix (shift 25: the e-weighted mean of v) and exp-like weights
    with zero rows (a divisor of 0), rows of one 255 (d = 255, exact) and full rows of 255
    (d = 255 T, cut where T > 2)."""
    op, e, v = _mix_case(seed, n, tokens, heads, d, 0.001)
    op.normalise = True
    op.requant = g.Requant([0], [25], g.Rounding.HALF_UP,
                           int(np.random.default_rng(seed).integers(-5, 5)))
    e[0, 0, 0] = 0                       # a divisor of 0: the zero point
    e[-1, -1, -1] = 0
    e[-1, -1, -1, 0] = 255               # a divisor of 255: exactly v's row
    return op, e, v


@pytest.mark.parametrize("shape", SHAPES, ids=[f"n{n}-T{t}-H{h}-d{d}" for n, t, h, d in SHAPES])
def test_normalised_mix_on_the_isa_simulator(shape):
    n, tokens, heads, d = shape
    seed = SEED + 600 + SHAPES.index(shape)
    print(f"seed {seed}, {shape}")
    op, e, v = _normalised_case(seed, n, tokens, heads, d)
    result = _run_mix(open_device("isa", get_config("default")), op, e, v)
    want = op.reference(e, v)[0]
    assert np.array_equal(result.outputs, want), f"seed {seed}, {shape}: outputs differ"
    # The meaning: each output is its row's e-weighted mean of v (plus the zero point),
    # within one where the row's sum is not 0.
    w = e / np.maximum(e.sum(axis=-1, keepdims=True), 1)
    mean = np.einsum("nhts,nhsd->nhtd", w, v.reshape(n, tokens, heads, d).transpose(0, 2, 1, 3))
    mean = np.clip(mean.transpose(0, 2, 1, 3).reshape(want.shape) + op.requant.zero_point,
                   -128, 127)
    assert (np.abs(want - mean) <= 1).all(), f"seed {seed}: not the weighted mean"


def test_normalised_mix_on_odd_arrays():
    for device, seed, _, shape, what in _odd_array_cases(SEED + 700):
        op, e, v = _normalised_case(seed, *shape)
        result = _run_mix(device, op, e, v)
        assert np.array_equal(result.outputs, op.reference(e, v)[0]), f"{what}: differ"


def test_normalised_mix_on_the_rtl(rtl_device):
    seed = SEED + 800
    shape = (2, 7, 2, 5)
    print(f"seed {seed}, small, {shape}")
    op, e, v = _normalised_case(seed, *shape)
    result = _run_mix(rtl_device("small"), op, e, v)
    assert np.array_equal(result.outputs, op.reference(e, v)[0]), f"seed {seed}: differ"


def test_normalised_mix_refused_where_the_core_cannot_run_it():
    op, _, _ = _normalised_case(SEED, 1, 8, 2, 8)
    with pytest.raises(CompileError, match="NORMALISE, which the 8x8 core is built without"):
        MixExecutable(op, get_config("default").replace(row_scale=False), 8, 16, 2)
    with pytest.raises(CompileError, match="allowed: cols >= 2"):
        MixExecutable(op, get_config("default").replace(cols=1, host_width=None), 8, 16, 2)
    graph_config = get_config("default").replace(row_scale=False)
    tensors = {"e": g.Tensor("e", (1, 2, 8, 8), "uint8"), "v": g.Tensor("v", (1, 8, 16), "int8"),
               "o": g.Tensor("o", (1, 8, 16), "int8")}
    graph = g.Graph("mix", tensors, [op.__class__("mix", ["e", "v"], ["o"], requant=op.requant,
                                                  normalise=True)], ["e", "v"], ["o"])
    assert lowering.placement(graph, graph_config)["mix"] == "host"
    assert lowering.placement(graph, get_config("default"))["mix"] == "core"
