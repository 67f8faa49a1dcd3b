"""The formal proofs stay alive (each as a short BMC) and have teeth: deliberately broken
models, harnesses and designs must come back FAILED with a counterexample, and a proof whose
induction cannot close must not pass."""

from pathlib import Path

import pytest
from amaranth.hdl import Fragment, Module, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.control.hazards import HazardTracker
from hdl.datapath.pe import PE
from hdl.datapath.weight_fifo import WeightFIFO
from sim.formal import CONTROL_FAST, FAST_DEPTH, PROOFS, run_proof
from sim.formal import harness as formal
from sim.formal.engines import matrix_engine_harness
from sim.formal.harness import Harness, Result, run
from sim.formal.hazards import RuleDroppedTracker, hazards_harness
from sim.formal.pe import pe_harness
from sim.formal.weight_fifo import weight_fifo_harness
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


@pytest.mark.parametrize("name", sorted(PROOFS))
def test_fast_form(name: str, tmp_path: Path):
    """Every registered proof in its fast form (a BMC of FAST_DEPTH cycles, or a cheap
    induction on a small configuration) finds no counterexample."""
    proof = PROOFS[name]
    result = run_proof(proof, fast=True, build_root=tmp_path)
    assert result.status == ("bounded" if proof.fast_mode == "bmc" else "proved"), \
        result.report()
    assert result.ok and result.trace is None
    assert result.depth == (proof.fast_depth or FAST_DEPTH)


def test_pe_model_bug_fails(tmp_path: Path):
    result = run("pe_bug", pe_harness(data_width=4, acc_width=8, model_bug=True),
                 mode="bmc", depth=4, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/pe.py")


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


def test_fifo_corrupting_design_fails(tmp_path: Path):
    """The picked-row argument catches a design that damages data (counts stay right)."""
    result = run("fifo_corrupt", weight_fifo_harness(rows=2, depth=2,
                                                     dut_class=_CorruptingFIFO),
                 mode="bmc", depth=6, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/weight_fifo.py")


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


def test_stream_rules_catch_a_withdrawn_beat(tmp_path: Path):
    result = run("source_bad", Harness(_Source(lawful=False), _rules), mode="bmc", depth=4,
                 build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/harness.py")


def test_stream_rules_prove_a_lawful_source(tmp_path: Path):
    result = run("source_good", Harness(_Source(lawful=True), _rules), mode="prove",
                 depth=3, build_root=tmp_path)
    assert result.status == "proved", result.report()


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


def test_hazard_rules_hold_with_the_rule(tmp_path: Path):
    """The same short BMC on the real tracker passes (so the failure above is the rule's)."""
    result = run("hazards_ok", hazards_harness("rules", small=4), mode="bmc", depth=4,
                 build_root=tmp_path)
    assert result.status == "bounded", result.report()


class _NarrowerTracker(HazardTracker):
    """A tracker built a bit narrower than the ranges it is given (as if a core passed its
    memories' width wrong)."""

    def __init__(self, *, end_bits: int, slots: int, late: bool = False):
        super().__init__(end_bits=end_bits - 1, slots=slots, late=late)


@pytest.mark.parametrize("check", ["rules", "ranges"])
def test_narrow_tracker_too_narrow_fails(check: str, tmp_path: Path):
    """The narrow proofs' assumption is no licence: ranges that end at 2**4 or later, on a
    4-bit tracker, are caught (wrapped range ends miss conflicts, or record wrong ranges)."""
    result = run("hazards_narrow_bug", hazards_harness(check, end_bits=5,
                                                       dut_class=_NarrowerTracker),
                 mode="bmc", depth=3, build_root=tmp_path)
    _assert_counterexample(result, "sim/formal/hazards.py")


def test_matrix_engine_scrub_waits_for_ready(tmp_path: Path):
    """The matrix engine's post-reset accumulator scrub holds each zero row on o_acc until
    it is taken (it used to advance every cycle: the stream rule failed in cycle 1)."""
    result = run("me_scrub", matrix_engine_harness(CONTROL_FAST), mode="bmc", depth=4,
                 build_root=tmp_path)
    assert result.status == "bounded", result.report()


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
