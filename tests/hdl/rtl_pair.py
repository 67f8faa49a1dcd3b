"""The RTL core and the ISA simulator side by side, for tests that drive both with the same
host beats (:mod:`test_interlocks`, :mod:`test_fuzz`).

:class:`Pair` sends every beat to an :class:`~firmware.transports.rtl.RtlDevice` and an
:class:`~firmware.transports.isa.IsaSimDevice` and compares what comes back, beat for beat
(``==``; a timing-dependent counter, ``None`` from the ISA simulator, matches anything, but
every READ_COUNTERS's values must hold :func:`progen.counter_invariants`), and the status
after it. When the ISA simulator stops on an error, the RTL must stop on the same
one: the same beats before the error beat, the error beat itself (the RTL transport raises
:class:`~firmware.device.DeviceError` only once it holds the error beat its status names),
and the same status. A :class:`~firmware.device.DeviceTimeout` (a hang) is always a failure.

:meth:`Pair.check_state` reads back every piece of state the core keeps
(:func:`hoststreams.dump_program`), so a test can prove that an error or an interlock left
nothing behind that the ISA simulator does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hoststreams import dump_program
from progen import check_counter_invariants

from firmware.asm import disassemble
from firmware.device import DeviceError, DeviceTimeout
from firmware.transports.isa import IsaSimDevice
from firmware.transports.rtl import RtlDevice
from hdl import isa
from hdl.config import TPUConfig
from hdl.control.hazards import HAZARD_RULES
from sim.models.isa_sim import IsaSim, beats_match, error_beat

__all__ = ["BARE", "UNIT_BASE", "Pair", "describe", "slow_variants", "unit_variants"]

#: The tiny core built without the optional instructions and functions (UB_TO_WEIGHTS, the
#: programmable table, the row scale), as the boards build it: one build for every test of
#: what a core without them refuses.
BARE = TPUConfig(rows=2, cols=2, ub_depth=64, acc_depth=64, weight_mem_tiles=8,
                 ub_to_weights=False, lookup_table=False, row_scale=False)

#: The tiny array with memories deep enough for every int8 value two to a buffer row: the base
#: of the activation-unit function benches (the programmable table, NORMALISE), one build
#: for both.
UNIT_BASE = TPUConfig(rows=2, cols=2, ub_depth=1024, acc_depth=256, weight_mem_tiles=8)


def unit_variants(base: TPUConfig) -> dict[str, TPUConfig]:
    """*base* (a tiny array) and the variants an activation-unit function is tested on:
    the fast pipeline (block RAMs read through their output registers), the serial unit,
    and 3 columns (a row wider than the array's rows, a partial last beat)."""
    return {"tiny": base, "tiny-fast": base.replace(pipeline="fast"),
            "tiny-serial": base.replace(activation_unit="serial"),
            "2x3": base.replace(cols=3, host_width=None)}


def slow_variants(keys, slow=("tiny-fast", "tiny-serial")) -> list:
    """Configuration keys as test parameters, those in *slow* marked slow (``make
    regression``): by default the fast pipeline's and the serial unit's variants of a
    directed bench, which the random programs cover in ``make test`` (tiny-fast, edge-fast)
    and each of which is a build and a long run of its own."""
    return [pytest.param(k, marks=pytest.mark.slow) if k in slow else k for k in keys]


class Pair:
    """An RTL device and the ISA simulator, fed the same beats.

    ``what`` strings name the test's seed and program in every failure message.
    """

    def __init__(self, rtl: RtlDevice):
        """``rtl`` fresh from a reset (the ``rtl_device`` fixture resets it)."""
        self.rtl = rtl
        self.config = rtl.config
        self.ref = IsaSimDevice(rtl.config)
        self._seen = 0               # ISA simulator output beats already compared

    @property
    def sim(self) -> IsaSim:
        return self.ref.sim

    def reset(self) -> None:
        self.rtl.reset()
        self.ref.reset()
        self._seen = 0

    def run(self, beats: Sequence[int], what: str) -> list[int]:
        """Send ``beats`` to both and compare every beat the ISA simulator sends for them
        (the error beat included when it stops). Returns the RTL's beats (without the error
        beat)."""
        beats = [int(b) for b in beats]
        self.ref.send(beats)
        expected = self.sim.output[self._seen:]
        self._seen = len(self.sim.output)
        status = self.ref.status()
        if status.error:
            # Both devices keep the error beat for the next receive (after the
            # resynchronisation word), unless a clear drops it.
            self._seen -= 1
        self.rtl.send(beats)
        if status.error:
            stop = error_beat(status.code, status.instr_index)
            assert expected and expected[-1] == stop, \
                f"{what}: the ISA simulator's last beat is not its error beat"
            expected = expected[:-1]
            try:
                got = self.rtl.receive(len(expected) + 1)
            except DeviceTimeout as exc:
                raise AssertionError(f"{what}: the RTL did not stop with {status} after "
                                     f"{len(expected)} beats (a hang, or other beats): "
                                     f"{exc}") from None
            except DeviceError as exc:
                assert exc.status == status, \
                    f"{what}: the RTL stopped with {exc.status}, the ISA simulator {status}"
            else:
                raise AssertionError(f"{what}: the RTL sent {len(got)} beats and no error "
                                     f"beat; the ISA simulator stopped with {status}")
            try:
                got = self.rtl.receive(len(expected))
            except DeviceError as exc:
                raise AssertionError(f"{what}: the RTL sent its error beat before the "
                                     f"{len(expected)} beats the ISA simulator sent before "
                                     f"its own: {exc}") from None
            _compare(got, expected, what)
            with pytest.raises(DeviceError) as info:      # the error beat comes next
                self.rtl.receive(1)
            assert not isinstance(info.value, DeviceTimeout), \
                f"{what}: the error beat does not follow the beats before it"
        else:
            # The RTL runs while it receives: a program must answer something (a HALT).
            assert expected, f"{what}: the program sends nothing back, so the RTL never runs it"
            try:
                got = self.rtl.receive(len(expected))
            except DeviceError as exc:
                raise AssertionError(f"{what}: the RTL failed where the ISA simulator "
                                     f"sent {len(expected)} beats: {exc}") from None
            _compare(got, expected, what)
        rtl_status = self.rtl.status()
        assert rtl_status == status, f"{what}: RTL status {rtl_status}, ISA {status}"
        return got

    def stalls(self) -> dict[str, int]:
        """Cycles the RTL core stalled on each hazard rule since its last reset."""
        stalls = self.rtl.coverage()["stalls"]
        assert tuple(stalls) == HAZARD_RULES
        return stalls

    def clear(self) -> None:
        """The out-of-band clear on both (it drops the error beat not received)."""
        self.rtl.clear()
        self.ref.clear()
        self._seen = len(self.sim.output)

    def stop_on(self, bad, code: isa.ErrorCode, what: str, *, seed: int, after=None) -> None:
        """A short program (two random tiles, buffer rows, a MATMUL), then ``bad(program)``:
        the core must stop with ``code`` at the bad instruction's index, as the ISA
        simulator does, the instruction ``after(program)`` appends (default an ACTIVATE)
        discarded, and leave the state the ISA simulator has (read back after the
        resynchronisation word). ``seed`` draws the program's data."""
        from firmware.asm import Program

        cfg = self.config
        rng = np.random.default_rng(seed)
        p = Program(cfg)
        p.load_weights(0, rng.integers(-128, 128, (2, cfg.rows, cfg.cols)))
        p.read_host(0, rng.integers(-128, 128, (max(4, cfg.ub_row), cfg.ub_row)))
        p.read_weights(0, 1)
        p.matmul(0, 0, 4, switch=True)
        good = p.instructions
        start = len(p.beats)
        bad(p)
        what = f"{what}: {describe(p.beats[start:], cfg).splitlines()[0]}"
        (after or (lambda q: q.activate(0, 8, 4)))(p)     # discarded: the core has stopped
        p.halt()
        self.run(p.beats, what)
        status = self.rtl.status()
        assert (status.error, status.code, status.instr_index) == (True, code, good), \
            f"{what}: status {status}, expected {code.name} at {good}"
        self.check_state(what, resync=True)

    def check_state(self, what: str, resync: bool = False) -> None:
        """Read back every memory, the counters and the weight queue on both and compare;
        with ``resync``, after :data:`hdl.isa.RESYNC_WORD` in the stream (which clears a
        pending error: the error beat then comes first, as data)."""
        beats = [isa.RESYNC_WORD] if resync else []
        assert resync or not self.ref.status().error, \
            f"{what}: the ISA simulator has an error pending"
        self.run(beats + dump_program(self.sim).beats,
                 f"{what}: read-back of the state" + (" after RESYNC_WORD" if resync else ""))
        assert not self.rtl.status().error


def _compare(got: Sequence[int], expected: Sequence[int | None], what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} beats, expected {len(expected)}"
    if not beats_match(expected, got):
        first = next(i for i, (e, g) in enumerate(zip(expected, got, strict=True))
                     if e is not None and e != g)
        raise AssertionError(f"{what}: beat {first} is {got[first]:#x}, the ISA simulator "
                             f"sent {expected[first]:#x}")
    check_counter_invariants(expected, got, what)


def describe(beats: Sequence[int], config: TPUConfig) -> str:
    """Assembly text of a stream for a failure message (raw words if it ends mid-data)."""
    try:
        return disassemble(beats, config)
    except ValueError:
        return "".join(f".word {b:#x}\n" for b in beats)
