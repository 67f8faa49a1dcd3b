"""The formal proofs stay alive (each as a short BMC) and have teeth: deliberately broken
models, harnesses and designs must come back FAILED with a counterexample, and a proof whose
induction cannot close must not pass."""

import dataclasses
import gc
import os
import re
import warnings
from pathlib import Path
from unittest import mock

import pytest
from amaranth.hdl import Assert, Assume, Fragment, Module, Signal, UnusedElaboratable, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

import hdl.control.hazards as tracker_module
from hdl.control.hazards import HazardTracker
from hdl.datapath.pe import PE
from hdl.datapath.weight_fifo import WeightFIFO
from hdl.isa import Opcode
from hdl.lib.compare import greater_than
from sim.formal import (
    CONTROL_FAST,
    FAST_DEPTH,
    FAST_GROUP_SIZE,
    PROOFS,
    SCRUB_FAST_DEPTH,
    fast_groups,
    run_fast_group,
    run_proof,
)
from sim.formal import harness as formal
from sim.formal import hazards as formal_hazards
from sim.formal.engines import matrix_engine_harness
from sim.formal.harness import Harness, Proof, Result, run
from sim.formal.hazards import RuleDroppedTracker, hazards_harness, word_compares
from sim.formal.pe import pe_harness
from sim.formal.rounding import rounding_harness
from sim.formal.weight_fifo import weight_fifo_harness
from sim.formal.windows import matrix_windows_harness
from sim.rtl.gtkw import gtkw_traces


def _assert_counterexample(result: Result, source: str) -> None:
    """FAILED, with a VCD trace, a .gtkw beside it naming the trace's signals, and the failed
    assertion located in *source*."""
    assert result.status == "FAILED", result.report()
    assert not result.ok
    assert result.trace is not None and result.trace.is_file()
    assert result.trace.parent.name == "engine_0"
    assert result.gtkw is not None and result.gtkw.parent == result.trace.parent
    text = result.gtkw.read_text()
    assert f'[dumpfile] "{result.trace.resolve()}"' in text
    traces = gtkw_traces(text)
    assert traces and set(traces) <= set(formal.vcd_signals(result.trace).values())
    assert any(source in where for where in result.failed), result.failed
    assert "FAILED" in result.report() and str(result.gtkw.name) in result.report()


#: Proofs whose fast forms run in make regression rather than make test (the budget):
#: matrix_engine_windows (the rows into the array, 6 s) stands on matrix_engine_reads, which
#: make test keeps, and make test's RTL window test catches each of the engine's window
#: mutations.
REGRESSION_ONLY = ("matrix_engine_windows",)

FAST_GROUPS = fast_groups([p for p in PROOFS.values() if p.name not in REGRESSION_ONLY])
REGRESSION_GROUPS = fast_groups([PROOFS[name] for name in REGRESSION_ONLY])


@pytest.mark.parametrize("group", [
    *FAST_GROUPS, *(pytest.param(g, marks=pytest.mark.slow) for g in REGRESSION_GROUPS)])
def test_fast_forms(group: str, tmp_path: Path):
    """Every registered proof in its fast form (a BMC of FAST_DEPTH cycles, or a cheap
    induction on a small configuration) finds no counterexample: several at a time, one
    SymbiYosys run a group (sim.formal.fast_groups); a group that fails is run a proof at a
    time, and the failure names the proofs that fail alone."""
    proofs = {**FAST_GROUPS, **REGRESSION_GROUPS}[group]
    result, alone = run_fast_group(proofs, build_root=tmp_path)
    failing = [r.report() for r in alone.values() if not r.ok]
    assert result.ok and result.trace is None, "\n".join(
        [result.report(), "alone:" if failing else "each passes alone", *failing])
    assert result.status == ("bounded" if proofs[0].fast_mode == "bmc" else "proved")
    assert result.depth == (proofs[0].fast_depth or FAST_DEPTH)


def test_fast_groups_hold_every_proof_once():
    names = [p.name for groups in (FAST_GROUPS, REGRESSION_GROUPS)
             for group in groups.values() for p in group]
    assert sorted(names) == sorted(PROOFS)
    assert all(len(group) <= FAST_GROUP_SIZE for group in FAST_GROUPS.values())
    assert [p.name for p in FAST_GROUPS["rounding"]] == ["rounding"]   # reset="initial"


def _with_broken(name: str, harness, mode: str, depth: int) -> list[Proof]:
    """A passing proof's fast form and a broken harness, as one group of *mode* and *depth*."""
    passing = dataclasses.replace(PROOFS["hazards"], fast_mode=mode, fast_depth=depth)
    return [passing, Proof(name, harness, mode, depth, limit=120, fast_mode=mode,
                           fast_depth=depth)]


@pytest.mark.slow       # the harness's own teeth, 5 s (make regression)
def test_a_broken_proof_fails_its_group(tmp_path: Path):
    """A group of a passing fast form and a broken harness fails with the broken one's
    counterexample; run alone, only the broken one fails."""
    result, alone = run_fast_group(_with_broken(
        "hazards_bug", lambda: hazards_harness("rules", small=4, dut_class=RuleDroppedTracker),
        "bmc", 4), build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert {name for name, r in alone.items() if not r.ok} == {"hazards_bug"}


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_an_unclosed_induction_fails_its_group(tmp_path: Path):
    """A group one of whose members' induction cannot close is not proved."""
    result, alone = run_fast_group(_with_broken(
        "pe_weak", lambda: pe_harness(data_width=4, acc_width=8, invariants=False),
        "prove", 4), build_root=tmp_path)
    assert result.status == "UNKNOWN", result.report()
    assert {name for name, r in alone.items() if not r.ok} == {"pe_weak"}


def test_a_group_takes_no_initial_reset_harness():
    with warnings.catch_warnings():      # the refused group and its harness are never used
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="reset='initial'.*runs alone"):
            formal.Group({"rounding": rounding_harness()})
        gc.collect()


# Time limits --------------------------------------------------------------------------------

class _Factors(wiring.Component):
    """Nothing but a multiplier: the harness below asks for two factors of a 64-bit product
    of two 32-bit primes, which no SAT solver finds in minutes."""

    i_x: In(32)
    i_y: In(32)
    o_product: Out(64)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.o_product.eq(self.i_x * self.i_y)
        return m


#: Two 32-bit primes drawn at random (their bit patterns irregular: the two largest 32-bit
#: primes, 2**32 - 5 and 2**32 - 17, the solver finds in seconds).
_SEMIPRIME = 3375443983 * 3435831071


def _no_factors(m, dut, inside):
    m.d.comb += Assume((dut.i_x > 1) & (dut.i_y > 1))
    m.d.comb += Assert(dut.o_product != _SEMIPRIME, "no two factors")


def _processes_in(folder: Path) -> list[str]:
    """Command lines of the live processes working in *folder* or below (SymbiYosys runs
    its engines in ``<folder>/work``)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.slow       # the harness's time limit, 4 s (make regression)
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs /proc (Linux)")
def test_time_limit_kills_the_proof(tmp_path: Path):
    """A proof that cannot finish in its limit comes back TIMEOUT, a failure that names the
    proof, its limit and how to run it alone, and leaves no SymbiYosys, smtbmc or solver
    process behind."""
    proof = Proof("factors", lambda: Harness(_Factors(), _no_factors), "bmc", 1,
                  "a 64-bit product has no two factors (false, and hopeless)", limit=4)
    result = run_proof(proof, build_root=tmp_path)
    assert result.status == "TIMEOUT", result.report()
    assert not result.ok and result.limit == 4 and result.trace is None
    report = result.report()
    assert "TIMEOUT" in report and "limit of 4 s" in report
    assert "factors did not finish in 4 s" in report
    assert "python -m sim.formal factors --limit SECONDS" in report
    assert _processes_in(tmp_path.resolve()) == []
    # The solver had started: the limit stopped a proof in progress, not its set-up.
    log = (result.workdir / "logfile.txt").read_text()
    assert re.search(r"engine_0.*starting process", log), log


def test_time_limit_is_checked():
    with pytest.raises(ValueError, match="limit=0 is not supported; allowed"):
        Proof("p", lambda: None, "bmc", 1, limit=0)
    with pytest.raises(TypeError, match="limit"):        # no default: each proof says
        Proof("p", lambda: None, "bmc", 1)
    with pytest.raises(ValueError, match="limit must be a positive number"):
        run("p", None, mode="bmc", depth=1, limit=-1)


def test_pe_model_bug_fails(tmp_path: Path):
    result = run("pe_bug", pe_harness(data_width=4, acc_width=8, model_bug=True),
                 mode="bmc", depth=4, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/pe.py")


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_rounding_bug_fails(tmp_path: Path):
    """The rounding proof fails when the increment is inverted."""
    result = run("rounding_bug", rounding_harness(bug=True), mode="bmc", depth=6,
                 build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/rounding.py")


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_fifo_count_bug_fails(tmp_path: Path):
    result = run("fifo_bug", weight_fifo_harness(rows=2, depth=2, count_bug=True),
                 mode="prove", depth=4, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/weight_fifo.py")


class _CorruptingFIFO(WeightFIFO):
    """A broken weight FIFO: every row leaves with its signedness cleared."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.o_row.payload.signed.eq(0)
        return m


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_fifo_corrupting_design_fails(tmp_path: Path):
    """The picked-row argument catches a design that damages data (counts stay right)."""
    result = run("fifo_corrupt", weight_fifo_harness(rows=2, depth=2,
                                                     dut_class=_CorruptingFIFO),
                 mode="bmc", depth=6, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/weight_fifo.py")


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_fifo_ring_corrupting_design_fails(tmp_path: Path):
    """The same for the FIFO with its output ring (registered=True), in a BMC."""
    result = run("fifo_ring_corrupt", weight_fifo_harness(rows=2, depth=2, registered=True,
                                                          dut_class=_CorruptingFIFO),
                 mode="bmc", depth=8, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/weight_fifo.py")


def test_unclosed_induction_is_not_a_pass(tmp_path: Path):
    """Without the invariants on the PE's weights, the base case holds but induction cannot
    close: UNKNOWN, not proved."""
    result = run("pe_weak", pe_harness(data_width=4, acc_width=8, invariants=False),
                 mode="prove", depth=4, build_root=tmp_path)
    assert result.status == "UNKNOWN", result.report()
    assert not result.ok and result.k is None
    assert result.trace is not None and result.trace.name == "trace_induct.vcd"


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_pe_proof_closes(tmp_path: Path):
    """The small PE closes by k-induction (what `make formal` runs at 8/32)."""
    result = run("pe_small", pe_harness(data_width=4, acc_width=8), mode="prove", depth=3,
                 build_root=tmp_path)
    assert result.status == "proved", result.report()
    assert result.k is not None and 0 <= result.k <= 3


# The stream-rule helper on toy components --------------------------------------------------

class _Source(wiring.Component):
    """Offers a counter; ``lawful=False`` counts on while its beat waits for ready."""

    o_stream: Out(stream.Signature(4))

    def __init__(self, *, lawful: bool):
        self.lawful = lawful
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        count = Signal(4)
        with m.If(self.o_stream.ready | ~self.o_stream.valid | (not self.lawful)):
            m.d.sync += count.eq(count + 1)
        m.d.comb += [self.o_stream.payload.eq(count), self.o_stream.valid.eq(count[0])]
        return m


class _Wire(wiring.Component):
    """A stream passed straight through: its output is lawful exactly when its input is."""

    i_stream: In(stream.Signature(4))
    o_stream: Out(stream.Signature(4))

    def elaborate(self, platform):
        m = Module()
        wiring.connect(m, wiring.flipped(self.i_stream), wiring.flipped(self.o_stream))
        return m


def _rules(m, dut, inside):
    formal.all_stream_rules(m, dut)


def test_stream_ports_sides():
    wire = _Wire()
    assert [(name, port, side) for name, port, side in formal.stream_ports(wire)] == [
        ("i_stream", wire.i_stream, "env"), ("o_stream", wire.o_stream, "dut")]
    Fragment.get(wire, None)  # used, so Amaranth does not warn about it


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_stream_rules_catch_a_withdrawn_beat(tmp_path: Path):
    result = run("source_bad", Harness(_Source(lawful=False), _rules), mode="bmc", depth=4,
                 build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/harness.py")


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_stream_rules_prove_a_lawful_source(tmp_path: Path):
    result = run("source_good", Harness(_Source(lawful=True), _rules), mode="prove",
                 depth=3, build_root=tmp_path)
    assert result.status == "proved", result.report()


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_stream_rules_assume_the_environment(tmp_path: Path):
    """The wire's output is lawful because its input is assumed lawful; without that
    assumption (a free input may withdraw a beat), the output check fails."""
    proved = run("wire", Harness(_Wire(), _rules), mode="prove", depth=3,
                 build_root=tmp_path)
    assert proved.status == "proved", proved.report()

    def output_only(m, dut, inside):
        formal.stream_rules(m, dut.o_stream, side="dut")

    failed = run("wire_free", Harness(_Wire(), output_only), mode="bmc", depth=4,
                 build_root=tmp_path)
    _assert_counterexample(failed, "sim/formal/harness.py")


def test_inside_finds_internal_state_by_name():
    inside = formal.Inside(Fragment.get(PE(data_width=4, acc_width=8), None))
    assert inside.signal("active").name == "active"
    with pytest.raises(KeyError, match="active"):    # the message lists what exists
        inside.signal("no_such_signal")
    with pytest.raises(KeyError, match="no submodule"):
        inside.signal("rows.level")


# Control proofs: teeth and findings ----------------------------------------------------------

def test_hazard_rule_dropped_fails(tmp_path: Path):
    """A tracker that lets READ_HOST through while an unfinished instruction reads or writes
    its rows: the shadow model catches it (an ACTIVATE or WRITE_HOST dispatched, then a
    READ_HOST of the same row)."""
    result = run("hazards_bug", hazards_harness("rules", small=4, dut_class=RuleDroppedTracker),
                 mode="bmc", depth=4, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert any("write after" in where for where in result.failed), result.failed


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_hazard_rules_hold_with_the_rule(tmp_path: Path):
    """The same short BMC on the real tracker passes (so the failure above is the rule's)."""
    result = run("hazards_ok", hazards_harness("rules", small=4), mode="bmc", depth=4,
                 build_root=tmp_path)
    assert result.status == "bounded", result.report()


class _MoveRuleDroppedTracker(HazardTracker):
    """A broken tracker: UB_TO_WEIGHTS does not wait while an ACTIVATE runs (``"raw"``) or
    while a READ_WEIGHTS runs (``"war"``), the other engine idle (so that the counterexample
    is the dropped rule's)."""

    drop = "raw"

    def elaborate(self, platform):
        m = super().elaborate(platform)
        act, rw = self.i_activate_busy, self.i_read_weights_busy
        busy = act & ~rw if self.drop == "raw" else rw & ~act
        with m.If((self.i_query.instr.opcode == Opcode.UB_TO_WEIGHTS) & busy):
            m.d.comb += self.i_query.hazard.eq(0)
        return m


@pytest.mark.parametrize("drop, what", [("raw", "read after write"),
                                        ("war", "write after read")])
@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_ub_to_weights_rule_dropped_fails(drop: str, what: str, tmp_path: Path):
    """The shadow model knows UB_TO_WEIGHTS' reads (buffer rows) and its write (a tile): a
    tracker without either of its rules is caught."""
    broken = type(f"MoveRuleDropped_{drop}", (_MoveRuleDroppedTracker,), {"drop": drop})
    result = run(f"hazards_move_{drop}_bug",
                 hazards_harness("rules", small=4, dut_class=broken),
                 mode="bmc", depth=4, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert any(what in where for where in result.failed), result.failed


class _RisingTracker(HazardTracker):
    """A broken tracker: a READ_HOST that has waited a cycle (nothing dispatched) gets a
    hazard, as from a range recorded a cycle after its dispatch."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        waited = Signal()
        m.d.sync += waited.eq(~self.i_query.dispatch)
        with m.If(waited & (self.i_query.instr.opcode == Opcode.READ_HOST)):
            m.d.comb += self.i_query.hazard.eq(1)
        return m


class _EarlyLateTracker(HazardTracker):
    """A broken tracker: ``hazard_late`` is ``hazard`` of the same cycle."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.i_query.hazard_late.eq(self.i_query.hazard)
        return m


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
@pytest.mark.parametrize("end_bits", [None, 5])
def test_hazard_rise_fails(end_bits, tmp_path: Path):
    """no_rise has teeth at both widths (on the tracker with word compares it proves): a
    hazard that rises for a waiting instruction is caught."""
    result = run("hazards_rise_bug", hazards_harness("no_rise", small=4, end_bits=end_bits,
                                                     dut_class=_RisingTracker),
                 mode="bmc", depth=3, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert any("does not rise" in where for where in result.failed), result.failed


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_hazard_late_early_fails(tmp_path: Path):
    result = run("hazards_late_bug", hazards_harness("late", end_bits=5,
                                                     dut_class=_EarlyLateTracker),
                 mode="bmc", depth=3, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert any("a cycle later" in where for where in result.failed), result.failed


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_hazard_compare_lemma_fails_for_wrong_trees(tmp_path: Path):
    """The lemma that lets no_rise prove the tracker with `>` in place of its trees: trees
    that answer `>=` fail it (and no_rise, on word compares, would not notice them)."""
    def wrong(a, b):
        return greater_than(a, b) | (a == b)

    with mock.patch.object(formal_hazards, "greater_than", wrong), \
            mock.patch.object(tracker_module, "greater_than", wrong):
        result = run("hazards_trees_bug", hazards_harness("late", end_bits=5),
                     mode="bmc", depth=1, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")
    assert any("compare trees" in where for where in result.failed), result.failed


def test_word_compares_replace_the_trees():
    """The tracker no_rise proves has no compare trees left (else the solver would be back
    on the bit-level problem), and is the tracker otherwise."""
    built = formal.Inside(Fragment.get(HazardTracker(end_bits=5, late=True), None))
    proved = formal.Inside(Fragment.get(word_compares(HazardTracker)(end_bits=5, late=True),
                                        None))
    assert proved.signal("mm0_ub_lo").name == built.signal("mm0_ub_lo").name
    calls = []
    with mock.patch.object(tracker_module, "greater_than",
                           lambda a, b: calls.append(1) or greater_than(a, b)):
        Fragment.get(word_compares(HazardTracker)(end_bits=5, late=True), None)
        assert not calls
        Fragment.get(HazardTracker(end_bits=5, late=True), None)
        assert calls


class _NarrowerTracker(HazardTracker):
    """A tracker built a bit narrower than the ranges it is given (as if a core passed its
    memories' width wrong)."""

    def __init__(self, *, end_bits: int, slots: int, late: bool = False):
        super().__init__(end_bits=end_bits - 1, slots=slots, late=late)


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
@pytest.mark.parametrize("check", ["rules", "ranges", "ring_ranges"])
def test_narrow_tracker_too_narrow_fails(check: str, tmp_path: Path):
    """The narrow proofs' assumption is no licence: ranges that end at 2**4 or later, on a
    4-bit tracker, are caught (wrapped range ends miss conflicts, or record wrong ranges)."""
    result = run("hazards_narrow_bug", hazards_harness(check, end_bits=5,
                                                       dut_class=_NarrowerTracker),
                 mode="bmc", depth=3, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_matrix_engine_scrub_waits_for_ready(tmp_path: Path):
    """The matrix engine's post-reset accumulator scrub holds each zero row on o_acc until
    it is taken (it used to advance every cycle: the stream rule failed in cycle 1)."""
    result = run("me_scrub", matrix_engine_harness(CONTROL_FAST), mode="bmc", depth=4,
                 build_root=tmp_path)
    assert result.status == "bounded", result.report()


def _broken_engine(old: str, new: str) -> type:
    """MatrixEngine with *old* (one line of hdl/control/matrix_engine.py) replaced by *new*,
    as tests/mutations' patches plant a break, loaded from the changed text."""
    import types

    path = Path(__file__).resolve().parents[2] / "hdl" / "control" / "matrix_engine.py"
    source = path.read_text()
    assert source.count(old) == 1, f"{old!r} moved in {path}: update the broken engine"
    module = types.ModuleType("broken_matrix_engine")
    exec(compile(source.replace(old, new), str(path), "exec"), module.__dict__)
    return module.MatrixEngine


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_matrix_windows_catch_a_late_window(tmp_path: Path):
    """An engine that takes each window an element late out of its kept rows (the
    window-offset-late mutation): the rows proof's contract alone, past the reset scrub,
    finds an element that is not the one the ISA names."""
    broken = _broken_engine("meta_a_in.offset.eq(lane - (cfg.ub_row - cfg.rows + 1)),",
                            "meta_a_in.offset.eq(lane + 1 - (cfg.ub_row - cfg.rows + 1)),")
    result = run("windows_late", matrix_windows_harness(CONTROL_FAST, "rows", invariants=False,
                                                        dut_class=broken),
                 mode="bmc", depth=SCRUB_FAST_DEPTH, solver="yices", build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/windows.py")
    assert any("element" in where for where in result.failed), result.failed


@pytest.mark.slow          # a broken variant; make test keeps one of each kind
def test_matrix_windows_catch_a_lost_carry(tmp_path: Path):
    """An engine that moves a window on by the lowest bit of the lane's carry only (the
    window-row-carry-lost mutation): the reads proof's contract alone finds a MATMUL that
    does not read the rows its windows need."""
    broken = _broken_engine("win_row.eq(win_row + (next_lane >> lg)),",
                            "win_row.eq(win_row + next_lane[lg]),")
    result = run("windows_carry", matrix_windows_harness(CONTROL_FAST, "reads",
                                                         invariants=False, dut_class=broken),
                 mode="bmc", depth=SCRUB_FAST_DEPTH, solver="yices", build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/windows.py")


def test_stream_ports_inside_port_groups():
    """The streams of a memory read client count, named with dots, each on its side."""
    from hdl.control.host_writer import HostWriter

    writer = HostWriter(CONTROL_FAST)
    assert [(name, side) for name, _, side in formal.stream_ports(writer)] == [
        ("i_write_host", "env"), ("o_ub.addr", "dut"), ("o_ub.data", "env"),
        ("i_beat", "env"), ("o_host", "dut")]
    ports = {name: port for name, port, _ in formal.stream_ports(writer)}
    assert ports["o_ub.addr"] is writer.o_ub.addr
    Fragment.get(writer, None)


def test_inside_in_state():
    from hdl.control.front_end import FrontEnd

    inside = formal.Inside(Fragment.get(FrontEnd(CONTROL_FAST), None))
    assert isinstance(inside.in_state("front_end_state", "ERROR", "FETCH"), Value)
    with pytest.raises(KeyError, match="FETCH"):       # the message lists the states
        inside.in_state("front_end_state", "NO_SUCH_STATE")
