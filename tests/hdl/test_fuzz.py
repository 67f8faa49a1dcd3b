"""Stream-level fuzzing of the core against the ISA simulator.

Each seed (fixed, printed) is a fuzz stream of :func:`hoststreams.fuzz_case`: a valid prefix
that writes every kind of state, then garbage (random beats, reserved opcodes, fields out of
range, operands the state forbids, valid instructions with reserved bits set, resynchronisation
words, data beats cut short and followed by more instructions, which both the core and the
ISA simulator take as data) until the ISA simulator stops on an error, then beats the core
must discard. The core must stop with the ISA simulator's error: every beat before the error
beat equal, the error beat, the same status (code and index); a hang (``DeviceTimeout``)
fails. Then the whole state is read back (:func:`hoststreams.dump_program`) and must equal
the ISA simulator's: the garbage corrupted nothing.

``test_fuzz_stream`` runs on the RTL transport and recovers in band, with
:data:`hdl.isa.RESYNC_WORD` in the stream (every fourth seed with the out-of-band clear
instead), on two presets and on the tiny core built without UB_TO_WEIGHTS, the programmable
table and the row scale; ``test_fuzz_resync_in_band`` runs the same kind of streams in a cocotb
bench (``tb_fuzz.py``), with random stalls on both host streams, and recovers in band too.
Both seed sets stop on the rare bad fields and write the table from the garbage
(``test_ci_seeds_stop_on_rare_bad_fields`` checks that at the ISA level).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hoststreams import fuzz_case
from rtl_pair import BARE, Pair, describe

from firmware.asm import encode
from firmware.device import DeviceError
from firmware.transports.isa import IsaSimDevice
from hdl import isa
from hdl.beats import done_beat, error_beat
from hdl.core import Core
from hdl.presets import get_config
from sim.models.isa_sim import IsaSim
from sim.rtl.runner import run

HERE = Path(__file__).parent

#: The configurations fuzzed: two presets, and the tiny core without what a core may be built
#: without, as the iCEBreaker's is (UB_TO_WEIGHTS and LOAD_TABLE are then unknown opcodes,
#: ACTIVATE's functions TABLE and NORMALISE bad fields).
CONFIGS = {"tiny": get_config("tiny"), "wide": get_config("wide"),
           "tiny-bare": BARE}

#: (configuration, first seed, seeds) for the RTL transport and for the cocotb bench;
#: ``make regression`` (``slow``) runs the transport's next seeds too.
#: (Chosen so that each set stops on every rare case of test_ci_seeds_stop_on_rare_bad_fields.)
TRANSPORT_SEEDS = (("tiny", 7104, 16), ("tiny-bare", 7760, 8))
TRANSPORT_SEEDS_SLOW = (("wide", 7200, 6), ("tiny", 7120, 24), ("wide", 7206, 6),
                        ("tiny-bare", 7768, 8))
COCOTB_SEEDS = (("tiny", 7505, 12),)


@pytest.mark.parametrize("config_key, seed", [
    pytest.param(key, seed, id=f"{key}-{seed}", marks=marks)
    for seeds, marks in ((TRANSPORT_SEEDS, ()), (TRANSPORT_SEEDS_SLOW, pytest.mark.slow))
    for key, first, n in seeds for seed in range(first, first + n)])
def test_fuzz_stream(rtl_device, config_key: str, seed: int):
    """The core stops with the ISA simulator's error, never hangs, and keeps its state."""
    case = fuzz_case(CONFIGS[config_key], seed)
    recover = "clear" if seed % 4 == 0 else "resync"
    print(f"{case.summary()}; recovery: {recover}")
    pair = Pair(rtl_device(CONFIGS[config_key]))
    what = f"{case.summary()}\ngarbage:\n{describe(case.garbage, pair.config)}"
    pair.run(case.beats, what)
    status = pair.rtl.status()
    assert status.error, f"{what}\nno error: {status}"
    if recover == "clear":
        pair.clear()
    pair.check_state(what, resync=recover == "resync")


@pytest.mark.slow          # 18 s; make test recovers in band on the transport (resync seeds)
@pytest.mark.parametrize("config_key, first, cases", [
    pytest.param(key, first, n, id=f"{key}-{first}") for key, first, n in COCOTB_SEEDS])
def test_fuzz_resync_in_band(config_key: str, first: int, cases: int):
    """The same kind of streams in a cocotb bench, recovered through the stream by the
    resynchronisation word; seeds ``first..first+cases-1``."""
    config = CONFIGS[config_key]
    print(f"seeds {first}..{first + cases - 1}")
    run("core", lambda: Core(config), config_key, "tb_fuzz", HERE, "test_fuzz_resync",
        extra_env={"AMTPU_FUZZ_SEED": str(first), "AMTPU_FUZZ_CASES": str(cases)},
        config=config)


def _stopping_instruction(case) -> tuple[int, isa.ErrorCode, bool]:
    """The instruction word the ISA simulator stopped on, the error, and whether the
    garbage before it changed the programmable table."""
    sim = IsaSim(case.config)
    sim.feed(case.prefix)
    table = sim.table.copy()
    for beat in case.garbage:
        sim.feed([beat])
        if sim.error != isa.ErrorCode.NONE:
            return beat, sim.error, bool((sim.table != table).any())
    raise AssertionError(f"{case.summary()}: no error")


def test_ci_seeds_stop_on_rare_bad_fields():
    """Among the seeds make test runs through the RTL transport, and those the cocotb bench
    runs (make regression), some
    stop on a LOAD_PARAMS with rounding 3 (BAD_FIELD in the ISA simulator), some on a bad
    UB_TO_WEIGHTS and some on an ACTIVATE of function 7 (BAD_FIELD), and
    in some the garbage writes the programmable table (a LOAD_TABLE, whole or cut short,
    which the read-back then checks); among the transport's, some stop on a LOAD_TABLE
    (UNKNOWN_OPCODE), some on the function TABLE and some on NORMALISE (BAD_FIELD) on a
    core built without the table and the row scale. So the core's checks of them are fuzzed
    too. ISA level only: no RTL runs here."""
    for seeds in (TRANSPORT_SEEDS, COCOTB_SEEDS):
        found: dict[str, list] = {"rounding=3": [], "UB_TO_WEIGHTS": [], "func 7": [],
                                  "table written": []}
        if seeds is TRANSPORT_SEEDS:
            found |= {"LOAD_TABLE unknown": [], "func TABLE without the table": [],
                      "NORMALISE without the row scale": []}
        for key, first, n in seeds:
            for seed in range(first, first + n):
                word, code, written = _stopping_instruction(fuzz_case(CONFIGS[key], seed))
                opcode, fields = isa.decode(word)
                if opcode == isa.Opcode.LOAD_PARAMS and fields["rounding"] == 3:
                    assert code == isa.ErrorCode.BAD_FIELD, (key, seed, code)
                    found["rounding=3"].append((key, seed))
                if opcode == isa.Opcode.UB_TO_WEIGHTS:
                    found["UB_TO_WEIGHTS"].append((key, seed, code.name))
                if opcode == isa.Opcode.ACTIVATE and fields["func"] == 7:
                    assert code == isa.ErrorCode.BAD_FIELD, (key, seed, code)
                    found["func 7"].append((key, seed))
                if (opcode == isa.Opcode.ACTIVATE and fields["func"] == isa.Func.NORMALISE
                        and not CONFIGS[key].row_scale):
                    assert code == isa.ErrorCode.BAD_FIELD, (key, seed, code)
                    found["NORMALISE without the row scale"].append((key, seed))
                if written:
                    found["table written"].append((key, seed))
                if opcode == isa.Opcode.LOAD_TABLE and not CONFIGS[key].lookup_table:
                    assert code == isa.ErrorCode.UNKNOWN_OPCODE, (key, seed, code)
                    found["LOAD_TABLE unknown"].append((key, seed))
                if (opcode == isa.Opcode.ACTIVATE and fields["func"] == isa.Func.TABLE
                        and not CONFIGS[key].lookup_table):
                    assert code == isa.ErrorCode.BAD_FIELD, (key, seed, code)
                    found["func TABLE without the table"].append((key, seed))
        print(f"{seeds}: " + "; ".join(f"{what}: {hits}" for what, hits in found.items()))
        missing = [what for what, hits in found.items() if not hits]
        assert not missing, f"no seed of {seeds} stops on (or has) {', '.join(missing)}"


def test_resync_through_the_rtl_transport(rtl_device):
    """A reserved opcode, then RESYNC_WORD and HALT: the ISA transport sends the error beat
    and the DONE beat; the RTL transport must do the same."""
    rtl = rtl_device("tiny")
    ref = IsaSimDevice(rtl.config)
    for dev in (ref, rtl):
        dev.send([15])      # (12 to 14 are instructions on a core with them)
        with pytest.raises(DeviceError) as info:
            dev.receive(1)
        assert info.value.status.code == isa.ErrorCode.UNKNOWN_OPCODE
        dev.send([isa.RESYNC_WORD, encode(isa.Opcode.HALT)])
    expected = ref.receive(2)
    assert expected == [error_beat(isa.ErrorCode.UNKNOWN_OPCODE, 0), done_beat(1)]
    assert rtl.receive(2) == expected
