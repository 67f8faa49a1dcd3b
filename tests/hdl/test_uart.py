# amaranth: UnusedElaboratable=no
"""The 8N1 UART (hdl.link.uart) in amaranth.sim: the receiver fed per-cycle line levels built
from bytes, the transmitter's line decoded bit by bit, and the two looped back.

Seeds are fixed and printed; every comparison is ``==`` on whole byte lists.
(The first line keeps Amaranth from warning about the objects that constructors given
bad arguments leave behind.)
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from hdl.link.uart import UARTReceiver, UARTTransmitter

DIVISORS = [2, 3, 4, 5, 8]


def line_levels(frames: list[tuple[int, int, int]], divisor: int) -> list[int]:
    """Per-cycle levels of a line carrying ``(idle_cycles, byte, stop_bit)`` frames."""
    levels: list[int] = []
    for idle, byte, stop in frames:
        levels += [1] * idle
        for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [stop]:
            levels += [bit] * divisor
    return levels + [1] * (4 * divisor)


def run_receiver(levels: list[int], divisor: int, ready=None) -> tuple[list[int], int]:
    """Bytes the receiver delivers and ``o_error`` pulses for a line; ``ready(cycle)`` is
    ``o_data.ready`` (always high when ``None``)."""
    dut = UARTReceiver(divisor=divisor)
    got: list[int] = []
    errors = 0

    async def bench(ctx):
        nonlocal errors
        for cycle, level in enumerate(levels):
            ctx.set(dut.i_rx, level)
            ctx.set(dut.o_data.ready, 1 if ready is None else ready(cycle))
            _, _, valid, rdy, payload, error = await ctx.tick().sample(
                dut.o_data.valid, dut.o_data.ready, dut.o_data.payload, dut.o_error)
            if valid and rdy:
                got.append(payload)
            errors += error

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return got, errors


@pytest.mark.parametrize("divisor", DIVISORS)
def test_receiver_random_bytes(divisor: int):
    seed = 100 + divisor
    rng = random.Random(seed)
    print(f"seed {seed}")
    data = [rng.randrange(256) for _ in range(40)] + [0x00, 0xFF, 0x55, 0xAA]
    # Gaps of 0 (back to back) to 3 bit times, at any phase of the clock.
    frames = [(rng.choice([0, 0, 1, rng.randrange(3 * divisor)]), b, 1) for b in data]
    got, errors = run_receiver(line_levels(frames, divisor), divisor)
    assert got == data, f"seed {seed}"
    assert errors == 0


@pytest.mark.parametrize("skew", [-0.03, 0.03])
def test_receiver_baud_tolerance(skew: float):
    """A sender 3 % fast or slow, at a random phase of the clock: sampling in the middle of
    each bit still reads every bit (a sample late in the bit would read the next one)."""
    divisor = 16
    seed = 150
    rng = random.Random(seed)
    print(f"seed {seed}")
    data = [rng.randrange(256) for _ in range(20)] + [0x00, 0xFF]
    bit = divisor * (1 + skew)
    levels: list[int] = []
    for byte in data:
        phase = rng.random()
        bits = [0] + [(byte >> i) & 1 for i in range(8)] + [1]
        levels += [1] * rng.randrange(1, 4)
        levels += [bits[int((c + phase) / bit)] for c in range(int(10 * bit - phase))]
    got, errors = run_receiver(levels + [1] * 40, divisor)
    assert got == data, f"seed {seed}"
    assert errors == 0


@pytest.mark.parametrize("divisor", [4, 8])
def test_receiver_rejects_glitch(divisor: int):
    """A low pulse that is over before mid-bit is no start bit: nothing comes out."""
    levels = [1] * 10 + [0] * (divisor // 2 - 1) + [1] * (20 * divisor)
    levels += line_levels([(0, 0x5A, 1)], divisor)
    got, errors = run_receiver(levels, divisor)
    assert got == [0x5A]
    assert errors == 0


@pytest.mark.parametrize("divisor", [4, 5])
def test_receiver_framing_error_and_break(divisor: int):
    """A low stop bit drops the byte with one ``o_error`` pulse; a break (the line held low
    for several byte times) is one error, not a stream of zero bytes; the next byte after
    the line went high again comes through."""
    frames = [(3, 0x11, 1), (3, 0x22, 0), (3, 0x33, 1)]
    levels = line_levels(frames, divisor)
    levels += [0] * (35 * divisor) + [1] * (3 * divisor)       # a break
    levels += line_levels([(0, 0x44, 1)], divisor)
    got, errors = run_receiver(levels, divisor)
    assert got == [0x11, 0x33, 0x44]
    assert errors == 2


def test_receiver_overrun():
    """A byte that completes while the previous one waits is dropped with an error; the
    waiting byte is kept."""
    divisor = 4
    levels = line_levels([(2, 0xA1, 1), (0, 0xB2, 1), (5, 0xC3, 1)], divisor)
    hold_until = 25 * divisor      # past the second byte's stop bit, before the third's
    got, errors = run_receiver(levels, divisor, ready=lambda cycle: int(cycle >= hold_until))
    assert got == [0xA1, 0xC3]
    assert errors == 1


def run_transmitter(data: list[int], divisor: int, seed: int) -> tuple[list[int], list[int]]:
    """The transmitter's line, one level per cycle, for ``data`` offered with random idle
    cycles; also the cycle each byte was first offered."""
    rng = random.Random(seed)
    dut = UARTTransmitter(divisor=divisor)
    levels: list[int] = []
    offered: list[int] = []

    async def source(ctx):
        for byte in data:
            while rng.random() < 0.3:
                await ctx.tick()
            offered.append(len(levels))
            ctx.set(dut.i_data.valid, 1)
            ctx.set(dut.i_data.payload, byte)
            await ctx.tick().until(dut.i_data.ready)
            ctx.set(dut.i_data.valid, 0)

    async def line(ctx):
        async for _, _, level in ctx.tick().sample(dut.o_tx):
            levels.append(level)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(line, background=True)
    sim.run_until(1e-6 * (len(data) * 10 * divisor * 2 + 200))
    return levels, offered


def decode_line(levels: list[int], divisor: int) -> list[tuple[int, int]]:
    """``(start cycle, byte)`` of each frame; every bit must hold for exactly ``divisor``
    cycles and every stop bit must be high."""
    frames = []
    i = 0
    while i < len(levels):
        if levels[i]:
            i += 1
            continue
        bits = []
        for k in range(10):
            cells = levels[i + k * divisor:i + (k + 1) * divisor]
            assert len(cells) == divisor and len(set(cells)) == 1, \
                f"bit {k} of the frame at cycle {i} is not {divisor} equal cycles: {cells}"
            bits.append(cells[0])
        assert bits[0] == 0 and bits[9] == 1, f"bad start/stop at cycle {i}"
        frames.append((i, sum(b << n for n, b in enumerate(bits[1:9]))))
        i += 10 * divisor
    return frames


@pytest.mark.parametrize("divisor", DIVISORS)
def test_transmitter(divisor: int):
    seed = 200 + divisor
    print(f"seed {seed}")
    rng = random.Random(seed)
    data = [rng.randrange(256) for _ in range(30)] + [0x00, 0xFF]
    levels, offered = run_transmitter(data, divisor, seed)
    assert levels[0] == 1
    frames = decode_line(levels, divisor)
    assert [byte for _, byte in frames] == data, f"seed {seed}"
    # A byte offered while the line is busy starts exactly as the previous stop bit ends;
    # one offered on an idle line starts within two cycles.
    starts = [start for start, _ in frames]
    back_to_back = 0
    for k in range(1, len(data)):
        end = starts[k - 1] + 10 * divisor
        if offered[k] < end:
            back_to_back += 1
            assert starts[k] == end, f"seed {seed}: byte {k}"
        else:
            assert starts[k] <= offered[k] + 2, f"seed {seed}: byte {k}"
    assert back_to_back > 5


@pytest.mark.parametrize("divisor", [2, 4, 7])
def test_loopback(divisor: int):
    """Transmitter into receiver: every byte back, in order, with no error."""
    seed = 300 + divisor
    print(f"seed {seed}")
    rng = random.Random(seed)
    data = [rng.randrange(256) for _ in range(50)]
    m = Module()
    m.submodules.tx = tx = UARTTransmitter(divisor=divisor)
    m.submodules.rx = rx = UARTReceiver(divisor=divisor)
    m.d.comb += rx.i_rx.eq(tx.o_tx)
    got: list[int] = []
    errors = 0

    async def source(ctx):
        for byte in data:
            if rng.random() < 0.2:
                await ctx.tick().repeat(rng.randrange(1, 3 * divisor))
            ctx.set(tx.i_data.valid, 1)
            ctx.set(tx.i_data.payload, byte)
            await ctx.tick().until(tx.i_data.ready)
            ctx.set(tx.i_data.valid, 0)

    async def sink(ctx):
        nonlocal errors
        ctx.set(rx.o_data.ready, 1)
        async for _, _, valid, payload, error in ctx.tick().sample(
                rx.o_data.valid, rx.o_data.payload, rx.o_error):
            if valid:
                got.append(payload)
            errors += error

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    sim.add_testbench(sink, background=True)
    sim.run_until(1e-6 * (len(data) * 10 * divisor * 2 + 200))
    assert got == data, f"seed {seed}"
    assert errors == 0


@pytest.mark.parametrize("divisor", [1, 0, 2.5, True])
def test_rejects_bad_divisor(divisor):
    for cls in (UARTReceiver, UARTTransmitter):
        with pytest.raises(ValueError, match="divisor"):
            cls(divisor=divisor)
