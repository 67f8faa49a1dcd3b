"""cocotb testbench: fuzz streams (:func:`hoststreams.fuzz_case`) into the core, recovered in
band with the resynchronisation word, against the ISA simulator.

Each seed: reset, a valid prefix that writes state, garbage until the ISA simulator stops on
an error, a few beats the core must discard; every beat up to the error beat must equal the
ISA simulator's, and the status its code and index. Then :data:`hdl.isa.RESYNC_WORD` and a
read-back of the whole state (:func:`hoststreams.dump_program`), which must equal the ISA
simulator's too. Host beats arrive with random idle cycles, the core's answers meet random
back-pressure. ``AMTPU_FUZZ_SEED`` is the first seed, ``AMTPU_FUZZ_CASES`` how many.
"""

from __future__ import annotations

import os

import cocotb
from hoststreams import dump_program, fuzz_case
from tb_core import Testbench

from hdl.isa import RESYNC_WORD
from sim.models.isa_sim import error_beat
from sim.rtl.streams import reset


@cocotb.test()
async def test_fuzz_resync(dut):
    """Fuzz streams, each recovered through the stream."""
    first = int(os.environ.get("AMTPU_FUZZ_SEED", "7500"))
    cases = int(os.environ.get("AMTPU_FUZZ_CASES", "10"))
    tb = Testbench(dut, first, idle=0.2, backpressure=0.3)
    for seed in range(first, first + cases):
        await reset(dut)
        tb.ref.reset()
        tb.monitor.received.clear()
        tb.expected = []
        tb.seed = seed
        case = fuzz_case(tb.config, seed)
        dut._log.info(case.summary())
        tb.ref.feed(case.beats)
        status = tb.ref.status
        assert status.error, f"seed {seed}: the fuzz stream must stop the ISA simulator"
        tb.expected.extend(tb.ref.output)
        tb.drive(case.beats)
        await tb.check(f"{case.summary()}: up to the error beat", fail_on_error=False)
        assert tb.monitor.received[-1] == error_beat(status.code, status.instr_index), \
            f"{case.summary()}: the last beat is not the error beat"
        got = tb.status()
        assert (got["error"], got["code"], got["instr_index"]) == \
            (1, status.code, status.instr_index), f"{case.summary()}: status {got}"
        tb.send([RESYNC_WORD] + dump_program(tb.ref).beats)
        await tb.check(f"{case.summary()}: read-back after the resynchronisation word")
        assert not tb.status()["error"]
