"""The RTL core under cocotb as a device: cycle-accurate runs with the hardware's counters.

:class:`RtlDevice` builds :class:`sim.rtl.host_bridge.HostBridge` (the core between an input and
an output ring of host beats) once per configuration, ring depths and simulator, under
``build/`` (:func:`sim.rtl.runner.build`), starts the simulator with :mod:`sim.rtl.server` as its
cocotb test module in a child process (:func:`sim.rtl.runner.launch`) and talks to it over a
local socket. The simulator runs free while a :meth:`RtlDevice.receive` waits for output
beats and is frozen otherwise, so Python costs nothing per simulated cycle.

Semantics follow :class:`firmware.transports.isa.IsaSimDevice`, with one difference in
timing: beats sent are executed while a receive (or a clear or reset) runs, so the core's
status after a send alone is the status before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path

from amaranth.lib import data

from firmware.device import DeviceError, DeviceStatus, DeviceTimeout, register_transport
from hdl import isa
from hdl.config import TPUConfig
from hdl.datapath.activation_serial import element_cycles
from hdl.presets import PRESETS
from sim.rtl import host_bridge, runner
from sim.rtl.host_bridge import DEFAULT_IN_DEPTH, DEFAULT_OUT_DEPTH, HostBridge

__all__ = ["RtlDevice", "SimulatorExited", "TOP", "design"]

#: Verilog name of the simulated design.
TOP = "host_bridge"
PERIOD_NS = 10
#: Seconds the simulator may take to start and connect.
START_TIMEOUT = 120.0
#: Seconds :meth:`RtlDevice.close` waits for the simulator to finish its files.
CLOSE_TIMEOUT = 30.0
_POLL = 0.5


class SimulatorExited(DeviceError):
    """The simulator process ended while the device was in use (the message holds the tail of
    its log)."""


def idle_cycles(config: TPUConfig) -> int:
    """Cycles a receive waits by default with the core neither taking nor sending a beat:
    10,000, plus for the serial activation unit (up to 99 cycles an element) the longest
    ACTIVATE (every accumulator row, at the largest shift)."""
    if config.activation_unit == "serial":
        return 10_000 + element_cycles(63) * config.cols * config.acc_depth
    return 10_000


def _config_key(config: TPUConfig, in_depth: int, out_depth: int) -> str:
    """Build-folder name of a configuration: the preset's name or ``RxC-<hash>``, then the
    ring depths when they are not the defaults."""
    key = next((name for name, preset in PRESETS.items() if preset == config), None)
    if key is None:
        digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
        key = f"{config.name}-{digest.hexdigest()[:10]}"
    if (in_depth, out_depth) != (DEFAULT_IN_DEPTH, DEFAULT_OUT_DEPTH):
        key += f"-in{in_depth}-out{out_depth}"
    return key


def design(config: TPUConfig, *, sim: str, waves: bool = False,
           in_depth: int = DEFAULT_IN_DEPTH, out_depth: int = DEFAULT_OUT_DEPTH
           ) -> tuple[str, Path, Path]:
    """Build (or find built) the bridge for *config*: ``(config_key, build_dir, verilog)``."""
    key = _config_key(config, in_depth, out_depth)
    # The Verilog cache follows hdl/ and the factory's closure: closing over the bridge's
    # source makes an edit of sim/rtl/host_bridge.py rebuild too.
    bridge_source = hashlib.sha256(Path(host_bridge.__file__).read_bytes()).hexdigest()

    def factory() -> HostBridge:
        assert bridge_source
        return HostBridge(config, in_depth=in_depth, out_depth=out_depth)

    # Only the bridge's ports and rings are visible to cocotb: Verilator then evaluates the
    # core only at clock edges (see sim.rtl.runner.build).
    ports = list(HostBridge.signature_for(config, in_depth, out_depth).members)
    build_dir, verilog = runner.build(TOP, factory, key, sim=sim, waves=waves,
                                      public=[*ports, (host_bridge.RING_MODULE, "mem")])
    return key, build_dir, verilog


class RtlDevice:
    """:class:`firmware.device.Device` backed by the RTL core in Icarus or Verilator.

    Parameters
    ----------
    config : TPUConfig
        The core's configuration.
    sim : str, optional
        ``verilator`` or ``icarus``; default ``SIM`` from the environment, else ``verilator``.
    waves : bool
        Record an FST waveform of the whole session; on :meth:`close` it moves to
        ``build/waves/host_bridge-<config>-<label>.fst`` with a ``.gtkw`` beside it
        (:attr:`waves_path` names it).
    label : str, optional
        Names the session's run folder (``build/<sim>/host_bridge-<config>/run/<label>/``,
        holding the simulator's log) and waveform. Default ``rtl-<pid>-<n>``, whose folder
        is removed again when the session closes cleanly (a folder that stays names a
        simulator that died).
    in_depth, out_depth : int
        Beats the bridge's input and output rings hold (powers of two). Programs of any
        length run through any depth; other depths are other builds.

    Attributes
    ----------
    build_seconds : float
        Wall time spent building (or finding built) the design.
    start_seconds : float
        Wall time from starting the simulator to its first answer (reset done).
    log : Path
        The simulator's log.
    sim_pid : int
        The simulator's process id.
    """

    _sessions = 0

    def __init__(self, config: TPUConfig, sim: str | None = None, waves: bool = False,
                 label: str | None = None, *, in_depth: int = DEFAULT_IN_DEPTH,
                 out_depth: int = DEFAULT_OUT_DEPTH):
        sim = (sim or os.environ.get("SIM", "") or "verilator").strip().lower()
        if sim not in runner.SIMULATORS:
            raise ValueError(f"sim={sim!r} is not supported; allowed: "
                             f"{', '.join(runner.SIMULATORS)}")
        self.config = config
        self.sim = sim
        self.waves = bool(waves)
        RtlDevice._sessions += 1
        self.label = label or f"rtl-{os.getpid()}-{RtlDevice._sessions}"
        self._auto_label = label is None
        self.waves_path: Path | None = None
        self._conn: Connection | None = None
        self._process: subprocess.Popen | None = None
        self._closed = False

        start = time.perf_counter()
        self._key, build_dir, self._verilog = design(
            config, sim=sim, waves=self.waves, in_depth=in_depth, out_depth=out_depth)
        self.build_seconds = time.perf_counter() - start

        self._run_dir = build_dir / "run" / self.label
        if self._run_dir.exists():
            shutil.rmtree(self._run_dir)
        self.log = self._run_dir / "sim.log"
        status = data.Layout.cast(isa.Status)
        authkey = secrets.token_bytes(32)
        # A Unix socket in a private folder; the path must stay short (108 bytes).
        self._socket_dir = Path(tempfile.mkdtemp(prefix="amtpu-rtl-"))
        address = str(self._socket_dir / "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        start = time.perf_counter()
        try:
            listener.bind(address)
            listener.listen(1)
            self._process = runner.launch(TOP, build_dir, "sim.rtl.server", self._run_dir,
                                          sim=sim, waves=self.waves, log=self.log, extra_env={
                "AMTPU_RTL_ADDRESS": address,
                "AMTPU_RTL_AUTHKEY": authkey.hex(),
                "AMTPU_RTL_IN_DEPTH": str(in_depth),
                "AMTPU_RTL_OUT_DEPTH": str(out_depth),
                "AMTPU_RTL_ERROR_MASK": str(1 << status["error"].offset),
                "AMTPU_RTL_PERIOD_NS": str(PERIOD_NS),
                "AMTPU_RTL_IDLE_CYCLES": str(idle_cycles(config)),
            })
            self._conn = self._accept(listener, authkey)
            hello = self._recv()
            if hello[0] != "hello":
                raise DeviceError(f"unexpected greeting from the simulator: {hello!r}")
            self.sim_pid: int = hello[1]
        except BaseException:
            self._kill()
            raise
        finally:
            listener.close()
        self.start_seconds = time.perf_counter() - start

    # Connection ----------------------------------------------------------------------------

    def _accept(self, listener: socket.socket, authkey: bytes) -> Connection:
        listener.settimeout(_POLL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                sock, _ = listener.accept()
                break
            except TimeoutError:
                self._check_alive("while starting")
                if time.monotonic() > deadline:
                    raise DeviceError(f"the {self.sim} simulator did not connect within "
                                      f"{START_TIMEOUT:.0f} s; log {self.log}:\n"
                                      f"{runner.tail(self.log)}") from None
        sock.setblocking(True)
        conn = Connection(sock.detach())
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        return conn

    def _check_alive(self, doing: str) -> None:
        """Raise :class:`SimulatorExited` if the simulator's process has ended."""
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            log = self.log if self.log.is_file() else self._run_dir / "launch.log"
            raise SimulatorExited(f"the {self.sim} simulator exited (code {code}) {doing}; "
                                  f"log {log}:\n{runner.tail(log)}")

    def _lost(self, doing: str) -> SimulatorExited:
        """The connection broke: the simulator is ending (give it a moment to)."""
        assert self._process is not None
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            self._check_alive(doing)
        except SimulatorExited as exc:
            return exc
        return SimulatorExited(f"the {self.sim} simulator closed the connection {doing}; "
                               f"log {self.log}:\n{runner.tail(self.log)}")

    def _recv(self):
        assert self._conn is not None
        try:
            while not self._conn.poll(_POLL):
                self._check_alive("during a request")
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._lost("during a request") from None

    def _request(self, *request):
        """Send a request and return its reply's value; a failed receive's reply raises."""
        if self._closed:
            raise DeviceError("the device is closed")
        assert self._conn is not None
        try:
            self._conn.send(request)
        except OSError:
            raise self._lost("before a request") from None
        reply = self._recv()
        if reply[0] == "ok":
            return reply[1]
        _, kind, got, bits, *detail = reply
        status = DeviceStatus.from_bits(bits)
        if kind == "error":
            raise DeviceError(f"the core stopped after {got} of {request[1]} beats", status)
        if kind == "timeout":
            cycles = "the default" if request[2] is None else request[2]
            raise DeviceTimeout(f"the core sent {got} of {request[1]} beats within {cycles} "
                                f"cycles", status)
        raise DeviceError(f"the simulator refused {request[0]!r}: {detail}")

    # Device --------------------------------------------------------------------------------

    def send(self, beats: Sequence[int]) -> None:
        limit = 1 << self.config.host_width
        beats = [int(b) for b in beats]
        for position, beat in enumerate(beats):
            if not 0 <= beat < limit:
                raise ValueError(f"beat {position} = {beat:#x} does not fit in "
                                 f"host_width={self.config.host_width} bits")
        self._request("send", beats)

    def receive(self, count: int, *, timeout_cycles: int | None = None) -> list[int]:
        if count < 0:
            raise ValueError(f"count={count} is negative")
        if timeout_cycles is not None:
            timeout_cycles = int(timeout_cycles)
        return self._request("receive", int(count), timeout_cycles)

    def status(self) -> DeviceStatus:
        return DeviceStatus.from_bits(self._request("status"))

    def clear(self) -> None:
        self._request("clear")

    def reset(self) -> None:
        self._request("reset")

    def cycles(self) -> int | None:
        return self._request("cycles")

    def coverage(self) -> dict[str, dict[str, int]]:
        """Since the last reset: cycles the core stalled on each hazard rule
        (``"stalls"``, :data:`hdl.control.hazards.HAZARD_RULES`) and cycles each pair of
        engines worked at once (``"overlaps"``, :data:`sim.rtl.host_bridge.OVERLAPS`)."""
        return self._request("coverage")

    def close(self) -> None:
        """Stop the simulator (waiting for it to finish its files) and, with ``waves``,
        move the waveform to ``build/waves/``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        clean = False
        try:
            if self._conn is not None and self._process is not None \
                    and self._process.poll() is None:
                try:
                    self._conn.send(("close",))
                    self._recv()
                    clean = self._process.wait(timeout=CLOSE_TIMEOUT) == 0
                except (OSError, DeviceError, subprocess.TimeoutExpired):
                    pass
        finally:
            self._kill()
        if self.waves:
            self.waves_path = runner.save_waves(self.sim, TOP, self._key, self.label,
                                                self._run_dir, self._verilog)
        if clean and self._auto_label:
            shutil.rmtree(self._run_dir, ignore_errors=True)

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            # The session's group: the launcher and the simulator it started.
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._process.wait()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True) and getattr(self, "_process", None) is not None:
            self._kill()


register_transport("rtl", RtlDevice)
