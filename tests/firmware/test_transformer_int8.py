"""The Transformer's integer operators (firmware/graph.py) and the digits Transformer's int8
graph (firmware/models/transformer.py): exact integer semantics, accuracy against the float
model, and the graph's core steps on the ISA simulator and the RTL equal to the reference."""

import functools
import re

import numpy as np
import pytest

from firmware import graph as g
from firmware.compiler import lowering
from firmware.datasets import digits
from firmware.models import transformer as tf
from firmware.runtime.graph import run_graph

SEED = 20261205


def rng(salt: int = 0) -> np.random.Generator:
    print(f"seed {SEED + salt}")
    return np.random.default_rng(SEED + salt)


# Integer helpers -------------------------------------------------------------------------

def test_round_div_rounds_half_up_for_either_sign():
    a = np.array([5, 7, -5, -7, 0, 1, -1, 3, -3])
    assert g.round_div(a, 2).tolist() == [3, 4, -2, -3, 0, 1, 0, 2, -1]
    assert g.round_div(a, 1).tolist() == a.tolist()


def test_isqrt_is_exact_around_squares_up_to_2_52():
    r = np.array([0, 1, 2, 3, 1000, 46340, 2**26 - 1, 2**26 - 2], dtype=np.int64)
    for v, want in ((r * r, r), (r * r - 1, np.maximum(r - 1, 0)), (r * r + 2 * r, r)):
        v = np.maximum(v, 0)
        got = g.isqrt(v)
        assert (got * got <= v).all() and ((got + 1) * (got + 1) > v).all()
        assert got.tolist() == np.where(v == 0, 0, want).tolist()
    top = np.array([2**52 - 1, (2**26 - 1) ** 2], dtype=np.int64)
    assert g.isqrt(top).tolist() == [2**26 - 1, 2**26 - 1]


# Operators -------------------------------------------------------------------------------

def _layer_norm_op(d: int, s_out: float, gain, offset) -> g.LayerNorm:
    return g.LayerNorm("ln", ["x"], ["y"],
                       gain=np.round(np.asarray(gain) / s_out * 2**16).astype(np.int64),
                       offset=np.round(np.asarray(offset) / s_out * 2**16).astype(np.int64),
                       gain_shift=16)


def test_layer_norm_is_within_one_step_of_float_and_exact_on_flat_rows():
    r = rng(1)
    d, s_out = 16, 4 / 127
    gain, offset = r.uniform(0.5, 1.5, d), r.uniform(-0.5, 0.5, d)
    x = r.integers(-128, 128, (200, d))
    x[0] = -128
    x[1] = 127
    x[2] = np.r_[[-128] * 8, [127] * 8]
    x[3, :] = 5
    op = _layer_norm_op(d, s_out, gain, offset)
    got = op.reference(x)[0]
    xf = x.astype(np.float64)
    mu, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
    flt = np.where(var > 0, (xf - mu) / np.sqrt(np.maximum(var, 1e-30)), 0) * gain + offset
    want = np.clip(np.round(flt / s_out), -128, 127)
    assert np.abs(got - want).max() <= 1
    # A flat row normalises to zero: the offset alone.
    for row in (0, 1, 3):
        assert got[row].tolist() == np.clip(np.round(offset / s_out), -128, 127).tolist()
    # Extremes: half at -128, half at 127 is -1 and +1 standard deviations.
    assert np.abs(got[2] - np.round((np.r_[[-1.0] * 8, [1.0] * 8] * gain + offset) / s_out)
                  ).max() <= 1


def test_layer_norm_refuses_what_would_overflow_its_square_root():
    op = g.LayerNorm("ln", ["x"], ["y"], gain=np.ones(4096), offset=np.zeros(4096))
    with pytest.raises(g.GraphError, match="4096 channels with 8 fraction bits overflow"):
        op.reference(np.zeros((1, 4096), np.int64))
    with pytest.raises(g.GraphError, match="16 channels, 8 gains"):
        g.LayerNorm("ln", ["x"], ["y"], gain=np.ones(8), offset=np.zeros(8)).reference(
            np.zeros((1, 16), np.int64))


def test_attention_scores_are_each_heads_dot_products():
    r = rng(2)
    heads, t, d = 2, 5, 3          # awkward sizes: nothing a multiple of the array
    q = r.integers(-128, 128, (4, t, heads * d))
    k = r.integers(-128, 128, (4, t, heads * d))
    q[0] = -128                    # extremes: the largest products
    k[0] = -128
    op = g.AttentionScores("s", ["q", "k"], ["s"], heads=heads,
                           requant=g.requant_from_real(1 / 512, 0))
    acc = op.accumulate(q, k)
    for n in range(4):
        for j in range(heads):
            cols = slice(j * d, (j + 1) * d)
            assert (acc[n, j] == q[n][:, cols] @ k[n][:, cols].T).all()
    assert acc[0].max() == 3 * 128 * 128
    out = op.reference(q, k)[0]
    assert out.shape == (4, heads, t, t)
    assert (out == np.clip(g.round_div(acc, 512), -128, 127)).all()
    with pytest.raises(g.GraphError, match="must match"):
        op.accumulate(q, k[:, :, :5])


def test_softmax_normalise_rounds_to_255ths_and_zero_rows_give_zeros():
    e = np.array([[[[3, 1, 0], [0, 0, 0], [255, 255, 255]]]])
    out = g.SoftmaxNormalise("n", ["e"], ["p"]).reference(e)[0]
    # 255 * 3 / 4 = 191.25 -> 191; 255 / 4 = 63.75 -> 64; 255 / 3 = 85.
    assert out.tolist() == [[[[191, 64, 0], [0, 0, 0], [85, 85, 85]]]]
    with pytest.raises(g.GraphError, match="non-negative"):
        g.SoftmaxNormalise("n", ["e"], ["p"]).reference(-e)


def test_attention_mix_is_p_at_v_per_head_requantised():
    rng_ = rng(7)
    heads, t, d = 2, 3, 4
    p = rng_.integers(0, 256, (2, heads, t, t))
    p[0, 0] = 255
    v = rng_.integers(-128, 128, (2, t, heads * d))
    v[0] = -128
    req = g.requant_from_real(1 / 512, 0, where="mix")
    op = g.AttentionMix("m", ["p", "v"], ["o"], requant=req)
    out = op.reference(p, v)[0]
    assert out.shape == (2, t, heads * d)
    for j in range(heads):
        cols = slice(j * d, (j + 1) * d)
        want = req.apply((p[:, j] @ v[:, :, cols])[..., None])[..., 0]
        assert (out[:, :, cols] == want).all()
    assert out[0, 0, 0] == -128                   # 3 * 255 * -128 / 512 saturates
    with pytest.raises(g.GraphError, match="do not match"):
        op.reference(np.zeros((1, heads, t, t + 1)), v)


def test_lookup_maps_every_int8_and_refuses_bad_tables_and_inputs():
    table = np.arange(256) - 128
    op = g.Lookup("t", ["x"], ["y"], table=table[::-1].copy())
    x = np.arange(-128, 128)
    assert (op.reference(x)[0] == -x - 1).all()
    with pytest.raises(g.GraphError, match="has 255 entries; a table has 256"):
        g.Lookup("t", ["x"], ["y"], table=np.zeros(255))
    with pytest.raises(g.GraphError, match="allowed: int8 or uint8"):
        g.Lookup("t", ["x"], ["y"], table=np.full(256, 256))
    with pytest.raises(g.GraphError, match="input is not int8"):
        op.reference(np.array([128]))


def test_exp_table_places_the_offset_at_255():
    table = tf.exp_table(0.1, 40)
    assert table[40 + 128] == 255 and table[127 + 128] == 255
    assert table[39 + 128] == round(255 * np.exp(-0.1))
    assert (np.diff(table) >= 0).all() and table[0] == 0


# The digits Transformer ------------------------------------------------------------------

@functools.cache
def quantised():
    data = digits()
    params = tf.load_params()
    return tf.quantise(params, data.x_train[:tf.CALIBRATION]), params, data


def test_int8_accuracy_is_within_two_points_of_float():
    graph, params, data = quantised()
    logits = graph.reference(tf.graph_inputs(data.x_test))["logits"]
    flt = tf.forward(params, data.x_test)
    acc_f = float((flt.argmax(1) == data.y_test).mean())
    acc_q = float((logits.argmax(1) == data.y_test).mean())
    print(f"float {acc_f:.4f}, int8 {acc_q:.4f}, exp offset {graph.exp_offset}")
    assert acc_q >= acc_f - 0.02


def test_the_exp_offset_matters_and_the_chosen_one_beats_the_largest_score():
    """With the table's 255 at the largest int8 score (offset 127) most rows' weights round
    to zero and the model falls apart: the calibrated offset is what makes softmax work."""
    graph, params, data = quantised()
    x = data.x_train[:tf.CALIBRATION]
    fixed = tf.quantise(params, x, offset=127)
    inputs = tf.graph_inputs(data.x_test)
    acc = [float((gr.reference(inputs)["logits"].argmax(1) == data.y_test).mean())
           for gr in (graph, fixed)]
    print(f"offset {graph.exp_offset}: {acc[0]:.4f}; offset 127: {acc[1]:.4f}")
    assert acc[0] > acc[1] + 0.1


def test_the_residual_rows_carry_the_residual():
    """h + a @ W as one matmul over [a, h]: zeroing the identity rows of the FFN's second
    matmul changes the block's output (the residual really flows through the array)."""
    graph, _, data = quantised()
    inputs = tf.graph_inputs(data.x_test[:40])
    before = graph.reference(inputs, collect=True)["l0_h2"]
    op = next(o for o in graph.ops if o.name == "l0_ff2")
    saved = op.weight.copy()
    try:
        op.weight[tf.D_FF:] = 0
        after = graph.reference(inputs, collect=True)["l0_h2"]
    finally:
        op.weight[:] = saved
    assert (op.weight[tf.D_FF:] == np.diag(np.diag(op.weight[tf.D_FF:]))).all()
    assert (np.diag(op.weight[tf.D_FF:]) > 0).all()
    assert np.abs(after - before).mean() > 5


def test_core_steps_on_the_isa_simulator_equal_the_reference_on_every_tensor():
    graph, _, data = quantised()
    inputs = tf.graph_inputs(data.x_test)
    ref = graph.reference(inputs, collect=True)
    run = run_graph(graph, inputs, device="isa")
    _check_tensors(run, ref)
    core = [row["name"] for row in graph.summary() if row["runs on"] == "core"]
    assert core == ["embed", "l0_q", "l0_k", "l0_v", "l0_o", "l0_ff1", "l0_ff2", "cls"]
    # On a core with UB_TO_WEIGHTS and the programmable table (the default) each head's
    # q @ k.T, its exp and p @ v run on the core too; the scores never leave it. Without the
    # table, exp runs on the host; without UB_TO_WEIGHTS (the iCEBreaker), all three.
    from hdl.presets import get_config
    placed = lowering.placement(graph, get_config("default"))
    assert [name for name, where in placed.items() if where == "core"] == [
        "embed", "l0_q", "l0_k", "l0_v", "l0_scores", "l0_exp", "l0_mix", "l0_o", "l0_ff1",
        "l0_ff2", "cls"]
    steps = lowering.lower(graph, get_config("default"))
    blocks = [step for step in steps if isinstance(step, lowering.AttentionBlockStep)]
    assert [op.name for block in blocks for op in block.ops] == [
        "l0_q", "l0_k", "l0_v", "l0_scores", "l0_exp", "l0_mix"]
    no_table = lowering.placement(graph, get_config("default").replace(lookup_table=False))
    assert (no_table["l0_scores"], no_table["l0_exp"]) == ("core", "host")
    on_ice = lowering.placement(graph, get_config("icebreaker"))
    assert (on_ice["l0_scores"], on_ice["l0_exp"], on_ice["l0_mix"]) == ("host",) * 3


def _check_tensors(run, ref) -> None:
    """Every tensor the run computed equals the reference; only those that stay on chip may
    be missing: in attention run as one program, q, k, v, the scores and exp's e."""
    missing = [name for name in ref if name not in run.tensors]
    assert missing in ([], ["l0_s"], ["l0_q", "l0_k", "l0_v", "l0_s", "l0_e"]), missing
    for name, want in ref.items():
        if name in run.tensors:
            assert np.array_equal(run.tensors[name], want), name


@pytest.mark.slow       # (the demo's test below runs the same on the RTL in CI)
def test_core_steps_on_the_rtl_equal_the_reference():
    graph, _, data = quantised()
    inputs = tf.graph_inputs(data.x_test[:24])
    ref = graph.reference(inputs, collect=True)
    run = run_graph(graph, inputs, device="rtl")
    _check_tensors(run, ref)
    print(f"core cycles for 24 sequences: {run.cycles}, utilisation {run.utilisation:.3f}")
    assert run.cycles > 0


def _demo(capsys, transport: str, *options: str) -> str:
    """``amtpu demo --net transformer`` on two sequences: its output, after the lines every
    transport prints (every tensor equal to the int8 reference, where each operator ran)."""
    from firmware.cli import main

    assert main(["demo", "--net", "transformer", "--transport", transport, "--images", "2",
                 *options, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"{transport} outputs equal to the int8 reference: every one of 20 logits" in out
    assert "l0_scores    AttentionScores  array" in out
    assert "l0_exp       Lookup           activation unit" in out
    assert "l0_mix       AttentionMix     array" in out
    assert "on the host: 3 operators (l0_ln1, l0_ln2, lnf)" in out
    return out


def test_demo_on_the_isa_simulator(capsys):
    """The demo on the ISA simulator (the RTL form below, which also prints the core's
    cycles, is in make regression)."""
    _demo(capsys, "isa")


@pytest.mark.slow           # the 8x8 core on Icarus: 13 s (make regression)
def test_demo_on_the_rtl_core(capsys):
    """The demo on the RTL core, in a short form (two sequences, one program), and the
    core's cycles by step."""
    out = _demo(capsys, "rtl", "--sim", "icarus")
    assert "core cycles per sequence by step" in out
    assert "l0_q..l0_mix: one program per" in out
    assert "no host beat between the projections and the output" in out
    assert re.search(r"l0_mix +[\d.,]+ \( *[\d.]+ %, array [\d.]+ %\)", out), out
    assert "core cycles per sequence" in out


def test_demo_fails_when_the_core_differs(capsys, monkeypatch):
    """A core step that computes one element wrong fails the demo and names the tensor."""
    from firmware.cli import main
    from firmware.runtime import graph as graph_module

    real = graph_module.run_graph

    def corrupt(graph, inputs, **kwargs):
        result = real(graph, inputs, **kwargs)
        result.tensors["l0_att"][0, 0, 0] += 1
        return result
    monkeypatch.setattr(graph_module, "run_graph", corrupt)
    assert main(["demo", "--net", "transformer", "--transport", "isa", "--images", "5",
                 "--quiet"]) == 1
    assert "NO: l0_mix differ" in capsys.readouterr().out
