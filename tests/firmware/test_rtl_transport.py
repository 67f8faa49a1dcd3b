"""The RTL transport (:class:`firmware.transports.rtl.RtlDevice`) against the ISA simulator's
(:class:`firmware.transports.isa.IsaSimDevice`): the same requests give the same beats
(``==``; the ISA simulator's timing-dependent counters are ``None``), the same errors and the
same status.

The simulator is ``SIM`` (Icarus by default). One simulator process per configuration serves
the tests of this module (one build per design); the refill test and the waveform test use
builds of their own (small rings, tracing).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Sequence

import numpy as np
import pytest

from firmware.asm import Program
from firmware.device import Device, DeviceError, DeviceStatus, DeviceTimeout
from firmware.gemm import GemmProgram, gemm_program, gemm_reference
from firmware.runtime import done_beat, run_program
from firmware.transports.isa import IsaSimDevice
from firmware.transports.rtl import RtlDevice, SimulatorExited
from hdl import isa
from hdl.presets import get_config
from sim.rtl.runner import simulator


@pytest.fixture(scope="module")
def device(rtl_device):
    return rtl_device


def _gemm(config_key: str, m: int, k: int, n: int, seed: int,
          measure: bool = True) -> tuple[GemmProgram, np.ndarray]:
    """A requantised ReLU GEMM program and its numpy result."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k))
    w = rng.integers(-128, 128, (k, n))
    kwargs = dict(bias=rng.integers(-2**12, 2**12, n), multiplier=rng.integers(1, 2**15, n),
                  shift=16, zero_point=-3, func=isa.Func.RELU)
    plan = gemm_program(get_config(config_key), x, w, measure=measure, **kwargs)
    return plan, gemm_reference(x, w, **kwargs)


def _assert_beats(got: Sequence[int], expected: Sequence[int | None], what: str) -> None:
    """Every beat equal, except where the ISA simulator cannot know the value (``None``)."""
    assert len(got) == len(expected), f"{what}: {len(got)} beats, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert isinstance(g, int), f"{what}: beat {i} is {g!r}"
        if e is not None:
            assert g == e, f"{what}: beat {i} is {g:#x}, the ISA simulator sent {e:#x}"


def _run_both(rtl, ref, beats: Sequence[int], count: int, what: str) -> list[int]:
    ref.send(beats)
    expected = ref.receive(count)
    rtl.send(beats)
    got = rtl.receive(count)
    _assert_beats(got, expected, what)
    assert rtl.status() == ref.status(), f"{what}: status {rtl.status()} != {ref.status()}"
    return got


@pytest.mark.parametrize("config_key, m, k, n", [
    ("tiny", 5, 4, 3), ("small", 9, 12, 10),
    pytest.param("wide", 7, 9, 17, marks=pytest.mark.slow)])
def test_gemm_equals_isa(device, config_key: str, m: int, k: int, n: int):
    """A measured GEMM: every beat equals the ISA simulator's, the result numpy's, and the
    hardware's counters are there."""
    rtl = device(config_key)
    plan, expected = _gemm(config_key, m, k, n, seed=m * k * n)
    out = _run_both(rtl, IsaSimDevice(rtl.config), plan.beats, plan.output_beats, "gemm")
    assert np.array_equal(plan.decode(out), expected)
    assert out[-1] == done_beat(plan.instructions)
    counters = plan.counters(out)
    assert counters["cycles"] >= counters["array_active"] > 0
    assert rtl.status().halted


def test_programs_back_to_back(device):
    """Several programs, each sent and received in turn, then several sent before one
    receive: one build and one simulator process, cycles counting on."""
    rtl = device("small")
    ref = IsaSimDevice(rtl.config)
    start = rtl.cycles()
    plans = [_gemm("small", m, k, n, seed)
             for seed, (m, k, n) in enumerate([(4, 4, 4), (13, 5, 9), (6, 16, 3)])]
    last = start
    for i, (plan, expected) in enumerate(plans):
        out = _run_both(rtl, ref, plan.beats, plan.output_beats, f"program {i}")
        assert np.array_equal(plan.decode(out), expected), f"program {i}: result"
        now = rtl.cycles()
        assert now > last, f"program {i}: cycles did not advance"
        last = now
    for plan, _ in plans:
        rtl.send(plan.beats)
        ref.send(plan.beats)
    total = sum(plan.output_beats for plan, _ in plans)
    _assert_beats(rtl.receive(total), ref.receive(total), "three programs in one receive")
    # Partial receives split the same stream anywhere.
    plan, expected = plans[1]
    run_program(ref, plan.beats, plan.output_beats)
    rtl.send(plan.beats)
    out = rtl.receive(3) + rtl.receive(plan.output_beats - 3)
    assert np.array_equal(plan.decode(out), expected)
    assert rtl.receive(0) == []


def test_refill_and_small_rings():
    """A program far larger than the bridge's input ring (refilled as the core takes beats)
    and answers larger than its output ring (drained while the core waits)."""
    config = get_config("tiny")
    plan, expected = _gemm("tiny", 40, 4, 6, seed=3)
    assert len(plan.beats) > 8 * 16 and plan.output_beats > 4 * 16
    with RtlDevice(config, sim=simulator(), in_depth=16, out_depth=16) as rtl:
        out = _run_both(rtl, IsaSimDevice(config), plan.beats, plan.output_beats, "refill")
        assert np.array_equal(plan.decode(out), expected)
        # In pieces that are not multiples of the rings.
        rtl.send(plan.beats[:37])
        rtl.send(plan.beats[37:])
        again = []
        while len(again) < plan.output_beats:
            again += rtl.receive(min(23, plan.output_beats - len(again)))
        assert np.array_equal(plan.decode(again), expected)


def _bad_program(config, case: str) -> Program:
    p = Program(config)
    p.read_host(0, np.arange(2 * config.ub_row).reshape(2, config.ub_row) % 100)
    p.write_host(0, 2)
    if case == "UNKNOWN_OPCODE":
        p.word(15)      # reserved (12 to 14 are instructions where they are built)
    else:
        p.read_host(config.ub_depth - 1, np.zeros((2, config.ub_row)))
    p.halt()
    return p


@pytest.mark.parametrize("case", ["UNKNOWN_OPCODE", "UB_RANGE"])
def test_error_then_clear(device, case: str):
    """A bad instruction: receive raises DeviceError with the ISA simulator's status (code
    and instruction index); after clear() a new program runs correctly."""
    rtl = device("tiny")
    ref = IsaSimDevice(rtl.config)
    program = _bad_program(rtl.config, case)
    for dev in (ref, rtl):
        dev.send(program.beats)
    # The two rows of WRITE_HOST come back before the error; the DONE beat never does.
    for dev in (ref, rtl):
        with pytest.raises(DeviceError) as info:
            dev.receive(3)
        assert not isinstance(info.value, DeviceTimeout)
        assert info.value.status == DeviceStatus(
            error=True, code=isa.ErrorCode[case], instr_index=2, halted=False)
    assert rtl.status() == ref.status()
    # The rows sent before the error can still be received; the error beat follows them.
    _assert_beats(rtl.receive(2), ref.receive(2), "the rows sent before the error")
    for dev in (ref, rtl):
        with pytest.raises(DeviceError):
            dev.receive(1)
    rtl.clear()
    ref.clear()
    assert rtl.status() == ref.status()
    assert not rtl.status().error
    plan, expected = _gemm("tiny", 3, 2, 2, seed=11)
    out = _run_both(rtl, ref, plan.beats, plan.output_beats, f"after {case}")
    assert np.array_equal(plan.decode(out), expected)


def test_hang_times_out(device):
    """A READ_HOST that waits for data beats never sent: DeviceTimeout naming the beats
    that arrived, the same as the ISA simulator's; reset() recovers."""
    rtl = device("tiny")
    config = rtl.config
    p = Program(config)
    p.read_host(0, np.full((1, config.ub_row), 7))
    p.write_host(0, 1)
    p.read_host(1, np.ones((4, config.ub_row)))
    beats = p.beats[:-2]                     # the last two data beats never come
    ref = IsaSimDevice(config)
    for dev in (ref, rtl):
        dev.send(beats)
    with pytest.raises(DeviceTimeout, match="sent 1 of 2 beats"):
        ref.receive(2)
    with pytest.raises(DeviceTimeout, match="sent 1 of 2 beats within 2000 cycles") as info:
        rtl.receive(2, timeout_cycles=2000)
    status = info.value.status
    assert (status.error, status.code, status.halted) == (False, isa.ErrorCode.NONE, False)
    # The index moves on as READ_HOST issues, before its data, in both.
    assert status == ref.status() and status.instr_index == 3
    start = rtl.cycles()
    with pytest.raises(DeviceTimeout, match="sent 1 of 2 beats within the default"):
        rtl.receive(2)                       # 10,000 cycles with no beat in or out
    assert 10_000 <= rtl.cycles() - start <= 10_000 + 64 * len(beats) + 10
    # The beat that did arrive stays for the next receive.
    assert rtl.receive(1) == ref.receive(1)
    rtl.reset()
    ref.reset()
    assert rtl.status() == ref.status()
    plan, expected = _gemm("tiny", 3, 3, 3, seed=5)
    out = _run_both(rtl, ref, plan.beats, plan.output_beats, "after the hang")
    assert np.array_equal(plan.decode(out), expected)


def test_reset_drops_beats(device):
    """reset(): queued input and unread output beats are dropped, the status and the output
    count start again; cycles() keeps counting."""
    rtl = device("tiny")
    ref = IsaSimDevice(rtl.config)
    plan, expected = _gemm("tiny", 6, 2, 4, seed=8)
    for dev in (ref, rtl):
        dev.send(plan.beats)
        dev.receive(2)                       # the rest stays unread
        dev.send(plan.beats)                 # and this queued
    before = rtl.cycles()
    for dev in (ref, rtl):
        dev.reset()
    assert rtl.cycles() > before
    assert rtl.status() == ref.status() == DeviceStatus(
        error=False, code=isa.ErrorCode.NONE, instr_index=0, halted=False)
    out = _run_both(rtl, ref, plan.beats, plan.output_beats, "after reset")
    assert np.array_equal(plan.decode(out), expected)
    with pytest.raises(DeviceTimeout, match="sent 0 of 1"):
        rtl.receive(1, timeout_cycles=100)


def test_beats_checked(device):
    rtl = device("tiny")
    assert isinstance(rtl, Device)
    with pytest.raises(ValueError, match="does not fit"):
        rtl.send([1 << rtl.config.host_width])
    with pytest.raises(ValueError, match="negative"):
        rtl.receive(-1)


def test_simulator_exit_is_reported():
    """A simulator that dies mid-session: a SimulatorExited naming its log, not a hang."""
    rtl = RtlDevice(get_config("tiny"), sim=simulator(), label=f"test-killed-{os.getpid()}")
    try:
        os.kill(rtl.sim_pid, signal.SIGKILL)
        with pytest.raises(SimulatorExited, match=r"simulator (exited|closed).*log .*sim\.log"):
            rtl.status()
    finally:
        rtl.close()
    with pytest.raises(DeviceError, match="closed"):
        rtl.status()
    shutil.rmtree(rtl.log.parent)


def test_waves():
    """waves=True: an FST and a .gtkw under build/waves/, written on close."""
    label = f"test-waves-{os.getpid()}"
    with RtlDevice(get_config("tiny"), sim=simulator(), waves=True, label=label) as rtl:
        plan, expected = _gemm("tiny", 2, 2, 2, seed=1)
        out = run_program(rtl, plan.beats, plan.output_beats, instructions=plan.instructions)
        assert np.array_equal(plan.decode(out), expected)
    gtkw = rtl.waves_path
    assert gtkw is not None and gtkw.name == f"host_bridge-tiny-{label}.gtkw"
    fst = gtkw.with_suffix(".fst")
    assert fst.is_file() and fst.stat().st_size > 0
    text = gtkw.read_text()
    assert "o_event" in text
    if shutil.which("fst2vcd") is not None:       # internal names come from the dump
        # The core inside the bridge: its instruction decoded, the opcode by name.
        assert "-core.instruction" in text and "core.front_end.fetch_opcode[3:0]" in text
        assert "opcode.gtkwfilter" in text
    gtkw.unlink()
    fst.unlink()
    shutil.rmtree(rtl.log.parent)
