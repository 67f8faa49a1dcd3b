"""The golden model's own semantics, checked against plain Python integers."""

import numpy as np
import pytest

from sim.models.golden import (
    MatrixUnitModel,
    activate,
    from_raw,
    matmul,
    operand_range,
    table_values,
    to_raw,
    wrap,
)

SEED = 20261130


def test_wrap_is_twos_complement():
    assert list(wrap([2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 + 5])) == \
        [2**31 - 1, -2**31, -2**31, 2**31 - 1, 5]


def test_raw_round_trip():
    for signed in (False, True):
        lo, hi = operand_range(signed)
        values = np.arange(lo, hi + 1)
        assert np.array_equal(from_raw(to_raw(values), signed), values)
    assert list(to_raw([-128, -1, 0, 127])) == [128, 255, 0, 127]


@pytest.mark.parametrize("x_signed", [False, True])
@pytest.mark.parametrize("w_signed", [False, True])
def test_matmul_matches_python_integers(x_signed, w_signed):
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    xl, xh = operand_range(x_signed)
    wl, wh = operand_range(w_signed)
    x = rng.integers(xl, xh + 1, (5, 7))
    w = rng.integers(wl, wh + 1, (7, 3))
    got = matmul(x, w, x_signed=x_signed, w_signed=w_signed)
    for i in range(5):
        for j in range(3):
            assert got[i, j] == sum(int(x[i, k]) * int(w[k, j]) for k in range(7))


def test_matmul_extremes():
    k = 8
    assert matmul(np.full((1, k), -128), np.full((k, 1), -128))[0, 0] == k * 16384
    assert matmul(np.full((1, k), 255), np.full((k, 1), 255),
                  x_signed=False, w_signed=False)[0, 0] == k * 65025
    assert matmul(np.full((1, k), -128), np.full((k, 1), 255), w_signed=False)[0, 0] == \
        k * -32640


def test_matmul_wraps_at_int32():
    # 2**16 products of 255 * 255 sum to 4.26e9, past 2**32: the result wraps.
    k = 1 << 16
    x = np.full((1, k), 255)
    w = np.full((k, 1), 255)
    exact = k * 255 * 255
    assert matmul(x, w, x_signed=False, w_signed=False)[0, 0] == \
        ((exact + 2**31) % 2**32) - 2**31


def test_matmul_rejects_out_of_range_operands():
    with pytest.raises(ValueError, match=r"x holds values outside -128\.\.127"):
        matmul([[128]], [[1]])
    with pytest.raises(ValueError, match=r"w holds values outside 0\.\.255"):
        matmul([[1]], [[-1]], w_signed=False)
    with pytest.raises(ValueError, match=r"\(M, K\) @ \(K, N\)"):
        matmul([[1, 2]], [[1, 2]])


def test_matrix_unit_model_switches_tiles_in_order():
    model = MatrixUnitModel(rows=2, cols=2)
    model.push_tile([[1, 0], [0, 1]], signed=True)
    model.push_tile([[2, 0], [0, 2]], signed=True)
    assert list(model.push_act([3, 4], signed=True, switch=True)) == [3, 4]
    assert list(model.push_act([5, 6], signed=True, switch=False)) == [5, 6]
    assert list(model.push_act([5, 6], signed=True, switch=True)) == [10, 12]
    with pytest.raises(ValueError, match="no weight tile queued"):
        model.push_act([1, 1], signed=True, switch=True)


def test_matrix_unit_model_needs_a_switch_first():
    model = MatrixUnitModel(rows=1, cols=1)
    with pytest.raises(ValueError, match="before the first tile switch"):
        model.push_act([1], signed=True, switch=False)


def test_activate_table_takes_bytes_or_int8():
    """Function 5 (TABLE) reads ``table[q + 128]`` as an int8, the table given as raw bytes
    (a list, an array or ``bytes``) or as int8 values; the extremes of both ends."""
    raw = (np.arange(256) * 37 + 11) % 256
    raw[[0, 255, 128]] = [0x80, 0xFF, 0x7F]
    int8 = np.where(raw >= 128, raw - 256, raw)
    q = np.array([[-128, 127], [0, -1]])
    want = [[-128, -1], [127, int8[127]]]
    for table in (raw, raw.tolist(), bytes(raw.tolist()), int8, int8.astype(np.int8)):
        assert activate(q, 5, table=table).tolist() == want
    assert activate(np.arange(-128, 128), 5, table=raw).tolist() == int8.tolist()
    assert table_values(raw).tolist() == int8.tolist()


@pytest.mark.parametrize("table, message", [
    (None, r"func=5 \(TABLE\) needs the table"),
    (np.zeros(255), r"the table has shape \(255,\); allowed: 256 entries"),
    (np.zeros((2, 128)), r"the table has shape \(2, 128\)"),
    (np.full(256, 0.5), r"the table holds float64 values; allowed: integers -128 to 255"),
    (np.full(256, 256), r"the table holds values outside -128..255 \(int8 or uint8\): "
                        r"min 256, max 256"),
    (np.full(256, -129), r"outside -128..255"),
])
def test_activate_table_errors(table, message):
    with pytest.raises(ValueError, match=message):
        activate([0], 5, table=table)


def test_activate_functions_6_and_7_are_not_functions():
    for func in (6, 7):
        with pytest.raises(ValueError, match=rf"func={func} is not an activation function; "
                                             r"allowed: 0 to 5"):
            activate([0], func, table=np.zeros(256, dtype=np.int64))
