"""The runtime refuses what would otherwise run wrongly: a program compiled for another
configuration than the device's, float or NaN inputs; and it reports a wrong last beat as a
DeviceError whatever the beat is."""

from __future__ import annotations

import numpy as np
import pytest

from firmware import nn
from firmware.asm import encode
from firmware.compiler import compile_network
from firmware.device import DeviceError, open_device
from firmware.quant import QuantError, quantise
from firmware.runtime import check_config, run, run_program
from hdl import isa
from hdl.presets import get_config

SEED = 2026_12_04


def _network(config_key: str = "small"):
    rng = np.random.default_rng(SEED)
    print(f"seed {SEED}")
    net = nn.Network((6,), [nn.Dense(rng.normal(size=(6, 5))), nn.ReLU(),
                            nn.Dense(rng.normal(size=(5, 3)))])
    qnet = quantise(net, rng.normal(size=(8, 6)))
    return qnet, compile_network(qnet, get_config(config_key)), rng


def test_config_mismatch_refused_before_anything_runs():
    """A network compiled for ``wide`` on a ``small`` device (the pair whose outputs came back
    with columns silently zero) is refused by name, and the device is left untouched."""
    qnet, compiled_wide = _network("wide")[:2]
    device = open_device("isa", get_config("small"))
    try:
        with pytest.raises(DeviceError, match=r"compiled for the 4x8 configuration, but the "
                                              r"device is a 4x4 core \(cols: compiled for 8, "
                                              r"device 4.*compile it for the device"):
            run(device, compiled_wide, np.zeros((2, 6), dtype=np.int64))
        assert device.status().instr_index == 0 and not device.status().error
    finally:
        device.close()
    same = open_device("isa", get_config("wide"))
    try:
        check_config(same, compiled_wide)       # the same configuration passes
        got = run(same, compiled_wide, qnet.quantise_input(np.ones((2, 6)))).outputs
        assert got.shape == (2, 3)
    finally:
        same.close()


def test_float_and_nan_inputs_refused():
    qnet, compiled, rng = _network()
    lo, hi = qnet.input_q.range
    with pytest.raises(ValueError, match=rf"inputs are float64; batches take quantised "
                                         rf"integers in {lo}..{hi}.*quantise_input"):
        next(compiled.batches(rng.normal(size=(2, 6))))
    with pytest.raises(ValueError, match="inputs are float64 with NaN or infinity"):
        next(compiled.batches(np.full((2, 6), np.nan)))
    x = rng.normal(size=(3, 6))
    x[1, 4] = np.nan
    with pytest.raises(QuantError, match=r"1 NaN or infinite values \(the first at index "
                                         r"\(1, 4\)\); inputs must be finite"):
        qnet.quantise_input(x)
    assert compiled.batches(qnet.quantise_input(np.nan_to_num(x))) is not None


def test_wrong_last_beat_is_a_device_error_on_the_isa_transport():
    """``READ_COUNTERS; HALT`` checked against a wrong instruction count: the last beat the
    ISA transport returns is the DONE beat (a number), and a counter beat (``None``) in its
    place must not turn into a TypeError either."""
    device = open_device("isa", get_config("tiny"))
    try:
        beats = [encode(isa.Opcode.READ_COUNTERS), encode(isa.Opcode.HALT)]
        with pytest.raises(DeviceError, match=r"last beat \(0x444f4e4500000002\) is not its "
                                              r"DONE beat 0x444f4e4500000005"):
            run_program(device, beats, len(isa.COUNTERS) + 1, instructions=5)
        with pytest.raises(DeviceError, match=r"last beat \(a counter beat\) is not its DONE"):
            run_program(device, [encode(isa.Opcode.READ_COUNTERS)], len(isa.COUNTERS),
                        instructions=1)
    finally:
        device.close()


def test_bad_calibration_and_weights_named():
    """Empty or non-finite calibration data and a NaN weight are refused with the problem
    named (before: numpy's errors, or "a bias does not fit int32" for a NaN weight)."""
    rng = np.random.default_rng(SEED + 1)
    net = nn.Network((4,), [nn.Dense(rng.normal(size=(4, 3)), rng.normal(size=3))])
    with pytest.raises(QuantError, match=r"calibration batch is empty \(shape \(0, 4\)\)"):
        quantise(net, np.zeros((0, 4)))
    data = rng.normal(size=(5, 4))
    data[2, 1] = np.inf
    with pytest.raises(QuantError, match=r"calibration batch has 1 NaN or infinite values "
                                         r"\(the first at index \(2, 1\)\)"):
        quantise(net, data)
    weight = rng.normal(size=(4, 3))
    weight[0, 2] = np.nan
    bad = nn.Network((4,), [nn.Dense(weight)])
    with pytest.raises(QuantError, match=r"layer .*: its weight has NaN or infinite values"):
        quantise(bad, rng.normal(size=(5, 4)))
