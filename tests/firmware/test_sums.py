"""Sum tables (:mod:`firmware.compiler.sums`) on every pair of int8 values, through the
activation unit's arithmetic (:func:`sim.models.golden.requantise`, what the ACTIVATE after
the MATMUL_LOOKUPs computes): TFLite's ADD terms and the tables fitted to onnxruntime's
QLinearAdd equal their operators' references on all 65,536 pairs; a function that no two
tables express is refused."""

from __future__ import annotations

import numpy as np
import pytest

from firmware.compiler.chain import _add_stage
from firmware.compiler.sums import BYTES, fit_tables
from firmware.graph import Add
from firmware.importers.onnx import QLinearAdd
from firmware.quant import QParams
from hdl.presets import get_config
from sim.models import golden

SEED = 8080
A, B = np.meshgrid(BYTES, BYTES, indexing="ij")


def _through_the_unit(stage, skip_input: int) -> np.ndarray:
    """The add stage's output for every pair (input 0 = A, input 1 = B): the lookups, the
    ACTIVATE's requantisation and function, as the core runs them."""
    skip, main = (A, B) if skip_input == 0 else (B, A)
    acc = golden.wrap(golden.lookup_sums(skip, stage.sum_tables[0]) +
                      golden.lookup_sums(main, stage.sum_tables[1]))
    q = golden.requantise(acc, 0, stage.multiplier[0], stage.shift, stage.zero_point,
                          stage.rounding.value)
    return golden.activate(q, stage.func.value, stage.zero_point, stage.clamp_hi)


@pytest.mark.parametrize("single", [True, False])
def test_tflite_add_on_every_pair(single):
    """Random scales, zero points and activations, single and double rounding: the stage
    the chain makes of an Add equals ``Add.reference`` on every pair, either input the
    skip."""
    rng = np.random.default_rng(SEED + single)
    print(f"seed {SEED + single}")
    config = get_config("default")
    for _ in range(6):
        s1, s2, so = 10 ** rng.uniform(-2.5, -0.5, 3)
        z1, z2, zo = (int(v) for v in rng.integers(-60, 60, 3))
        act = [(-128, 127), (zo, 127), (zo, min(127, zo + 80))][int(rng.integers(3))]
        add = Add.from_scales("add", ["a", "b"], ["c"], s1, z1, s2, z2, so, zo, act=act,
                              single=single)
        want = add.reference(A, B)[0]
        for skip_input in (0, 1):
            stage = _add_stage(add, 0, skip_input, (1, 1, 4), QParams(s1, z1),
                               QParams(so, zo), config)
            assert stage is not None, (s1, s2, so, act)
            got = _through_the_unit(stage, skip_input)
            assert (got == want).all(), f"{(got != want).sum()} pairs differ: {add}"


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qlinear_add_fitted_on_every_pair(dtype):
    """onnxruntime's QLinearAdd (float32, the importer's reference; uint8 tensors as int8
    plus offsets): tables fitted for random scales reproduce it on every pair."""
    rng = np.random.default_rng(SEED + 2)
    print(f"seed {SEED + 2}")
    config = get_config("default")
    offsets = (128, 128, 128) if dtype == "uint8" else (0, 0, 0)
    out_range = (0, 255) if dtype == "uint8" else (-128, 127)
    for _ in range(8):
        scales = tuple(float(v) for v in np.float32(10 ** rng.uniform(-2, 0, 3)))
        zps = tuple(int(v) for v in rng.integers(-40, 40, 3) + offsets[0])
        op = QLinearAdd("add", ["a", "b"], ["c"], scales=scales, zero_points=zps,
                        offsets=offsets, out_range=out_range)
        want = op.reference(A, B)[0]
        for skip_input in (0, 1):
            stage = _add_stage(op, 0, skip_input, (1, 1, 4), QParams(1.0, 0),
                               QParams(1.0, 0), config)
            assert stage is not None, (scales, zps)
            got = _through_the_unit(stage, skip_input)
            assert (got == want).all(), f"{(got != want).sum()} pairs differ: {scales} {zps}"


def test_no_tables_for_a_product():
    """``a * b / 128`` is no sum of a function of ``a`` and one of ``b``: refused."""
    assert fit_tables(np.clip((A * B) >> 7, -128, 127)) is None
    with pytest.raises(ValueError, match="256, 256"):
        fit_tables(np.zeros((4, 4)))
