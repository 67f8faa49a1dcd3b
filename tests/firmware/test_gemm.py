"""The tiled-GEMM program generator, run on the ISA simulator, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from firmware.gemm import gemm_program, gemm_reference
from hdl import isa
from hdl.config import TPUConfig
from hdl.presets import PRESETS
from sim.models import golden
from sim.models.isa_sim import IsaSim

SEED = 20261203
DEFAULT = PRESETS["default"]


def run(config: TPUConfig, x, w, **kwargs) -> tuple[np.ndarray, np.ndarray, object, IsaSim]:
    program = gemm_program(config, x, w, **kwargs)
    sim = IsaSim(config)
    output = sim.run(program.beats)
    return program.decode(output), gemm_reference(x, w, **kwargs), program, sim


def random_case(rng, m, k, n, x_signed=True, w_signed=True):
    x = rng.integers(*golden.operand_range(x_signed), size=(m, k), endpoint=True)
    w = rng.integers(*golden.operand_range(w_signed), size=(k, n), endpoint=True)
    return x, w


def test_64x64x64_default_config():
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    x, w = random_case(rng, 64, 64, 64)
    bias = rng.integers(-2**15, 2**15, 64)
    multiplier = rng.integers(2**14, 2**16, 64)
    kwargs = dict(bias=bias, multiplier=multiplier, shift=24, zero_point=-5,
                  func=isa.Func.RELU)
    got, want, program, sim = run(DEFAULT, x, w, **kwargs)
    # The reference written out: int32 matmul, then requantise and ReLU per column.
    acc = golden.matmul(x, w)
    explicit = golden.activate(golden.requantise(acc, bias, multiplier, 24, -5), 1, -5)
    assert np.array_equal(want, explicit)
    assert np.array_equal(got, want)
    assert len(np.unique(want)) > 100            # the scaling keeps the result informative
    # One batch, separate accumulator and output regions for the 8 column blocks.
    assert (program.batch_rows, program.k_chunks, program.col_blocks) == (64, 8, 8)
    assert program.acc_regions == program.out_regions == 8
    counters = sim.counters()
    assert counters["array_active"] == 64 * 64 and counters["weight_shift"] == 64 * 8
    assert counters["useful_macs"] == 64 ** 3


SHAPES = [
    ("default", 13, 20, 9),
    ("default", 1, 1, 1),
    ("default", 100, 8, 8),
    ("default", 7, 56, 70),
    ("tiny", 3, 5, 3),
    ("tiny", 70, 3, 4),          # several batches of rows; output regions reused
    ("small", 33, 17, 6),
    ("wide", 50, 9, 17),
    ("large", 5, 40, 20),
]


@pytest.mark.parametrize("preset, m, k, n", SHAPES)
@pytest.mark.parametrize("func", [isa.Func.IDENTITY, isa.Func.CLAMP, isa.Func.SIGMOID])
def test_shapes(preset, m, k, n, func):
    rng = np.random.default_rng([SEED, m, k, n, func.value])
    print(f"seed {SEED} {preset} {m}x{k}x{n} {func.name}")
    config = PRESETS[preset]
    x, w = random_case(rng, m, k, n)
    bias = rng.integers(-2**12 * k, 2**12 * k, n)
    multiplier = rng.integers(1, 2**12, n)
    shift = int(np.ceil(np.log2(max(k, 1) * 2**14 * 2**12))) - 7
    got, want, program, _ = run(config, x, w, bias=bias, multiplier=multiplier, shift=shift,
                                zero_point=3, clamp_hi=100, func=func)
    assert got.shape == (m, n)
    assert np.array_equal(got, want)
    assert len(np.unique(want)) >= min(m * n, 20) // 2     # not all saturated


@pytest.mark.parametrize("x_signed, w_signed", [(True, True), (False, True), (True, False),
                                                (False, False)])
def test_operand_extremes(x_signed, w_signed):
    xl, xh = golden.operand_range(x_signed)
    wl, wh = golden.operand_range(w_signed)
    x = np.array([[xl] * 20, [xh] * 20, [xl, xh] * 10])
    w = np.stack([np.full(20, wl), np.full(20, wh), np.tile([wl, wh], 10)], axis=1)
    kwargs = dict(multiplier=1, shift=10, x_signed=x_signed, w_signed=w_signed)
    got, want, _, _ = run(DEFAULT, x, w, **kwargs)
    assert np.array_equal(got, want)
    raw = golden.matmul(x, w, x_signed=x_signed, w_signed=w_signed)
    assert np.array_equal(want, golden.saturate(golden.rounding_shift(raw, 10)))


def test_bias_wraps_at_int32():
    # acc + bias wraps in 32 bits before the multiply: 2**31 - 1 + 1 becomes -2**31 and
    # -2**31 - 1 becomes 2**31 - 1; saturation happens only after the shift.
    x = np.array([[1, 0], [0, 0], [-1, 0]])
    w = np.array([[1, 1], [0, 0]])
    bias = [2**31 - 1, -2**31]
    got, want, _, _ = run(PRESETS["tiny"], x, w, bias=bias, multiplier=1, shift=24)
    assert got.tolist() == want.tolist() == [[-128, -128], [127, -128], [127, 127]]


def test_accumulation_wraps_at_int32():
    # 33 280 products of 255 * 255 sum to 2.16e9 > 2**31: the accumulator wraps negative.
    config = TPUConfig(rows=256, cols=2, ub_depth=1024, acc_depth=16, weight_mem_tiles=130)
    k = 130 * 256
    x = np.full((2, k), 255)
    x[1, ::2] = 0
    w = np.full((k, 2), 255)
    w[:, 1] = 1
    got, want, program, _ = run(config, x, w, multiplier=1, shift=24, x_signed=False,
                                w_signed=False)
    exact = k * 255 * 255
    assert exact > 2**31 and golden.matmul(x, w, x_signed=False, w_signed=False)[0, 0] < 0
    assert program.k_chunks == 130
    assert np.array_equal(got, want)
    assert got[0, 0] == golden.saturate(golden.rounding_shift(exact - 2**32, 24))


def test_weight_tiles_are_queued_ahead_and_never_overflow():
    config = PRESETS["small"]           # FIFO of 4 (+1 shadow)
    rng = np.random.default_rng(SEED)
    x, w = random_case(rng, 20, 13, 10)
    program = gemm_program(config, x, w)
    sim = IsaSim(config)
    matmuls = 0
    total = program.k_chunks * program.col_blocks * len(range(0, 20, program.batch_rows))
    for beat in program.beats:
        if sim.expecting_data == 0 and beat & 0xF == isa.Opcode.MATMUL.value:
            # The tile of this MATMUL and the next one's are already queued.
            assert len(sim.queue) >= min(2, total - matmuls)
            matmuls += 1
        sim.feed([beat])
        assert len(sim.queue) <= config.weight_fifo_depth + 1 and not sim.status.error
    assert matmuls == total
    assert sim.queue == []


def test_decode_checks_the_done_beat():
    x = np.ones((2, 2), dtype=np.int64)
    program = gemm_program(PRESETS["tiny"], x, x)
    output = IsaSim(PRESETS["tiny"]).run(program.beats)
    with pytest.raises(ValueError, match="not the DONE beat"):
        program.decode(output[:-1] + [output[-1] + 1])
    with pytest.raises(ValueError, match="expected 3 output beats, got 2"):
        program.decode(output[1:])


def test_rejected_arguments():
    tiny = PRESETS["tiny"]
    with pytest.raises(ValueError, match="W needs 12 weight tiles"):
        gemm_program(tiny, np.zeros((1, 6)), np.zeros((6, 8)))
    with pytest.raises(ValueError, match=r"x holds values outside -128..127"):
        gemm_program(tiny, [[128]], [[1]])
    with pytest.raises(ValueError, match=r"w holds values outside 0..255"):
        gemm_program(tiny, [[1]], [[-1]], w_signed=False)
    with pytest.raises(ValueError, match="shift=64"):
        gemm_program(tiny, [[1]], [[1]], shift=64)
    with pytest.raises(ValueError, match="bias holds values outside the int32 range"):
        gemm_program(tiny, [[1]], [[1]], bias=2**31)
    with pytest.raises(ValueError, match=r"\(M, K\) @ \(K, N\)"):
        gemm_program(tiny, np.zeros((2, 3)), np.zeros((2, 3)))
