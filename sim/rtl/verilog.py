"""Verilog generation for the cocotb testbenches, cached per design and configuration.

:func:`generate` writes ``build/verilog/<name>-<config_key>/<digest>/<name>.v`` and skips the
work when it is there: the digest covers everything that could change the output, the
configuration key, the factory that builds the component, and the contents of every ``.py``
file under ``hdl/``, subpackages included. Each digest has its folder, so two tests whose
factories differ (a lambda each) but build one design, or a checkout and a mutated worktree,
do not convert it again each time the other ran; the simulator build keys on the Verilog's
text, so they share it too. Several pytest-xdist workers may ask for the same design at once:
a lock file lets one convert while the others wait, and every file is written to a private
temporary file and renamed into place, so a reader only ever sees a complete file.

Designs are elaborated with ``platform=`` :data:`hdl.lib.vendor.VERILOG_SIM_PLATFORM`: Verilog for
Icarus and Verilator, which get simulation models of the vendor primitives a design
instantiates (``sim/rtl/vendor/<MODULE>.v``, one module per file, named as the primitive), and
the project's own simulation-only modules (``sim/rtl/models/<MODULE>.v``) likewise.
:func:`model_sources` finds the ones a generated file needs; :mod:`sim.rtl.runner` compiles them
with it and rebuilds when one changes. ``amaranth.sim`` elaborates with ``platform=None``,
where blocks use their behavioural form instead (see :class:`hdl.datapath.pe.PE`).
"""

from __future__ import annotations

import fcntl
import functools
import gc
import hashlib
import os
import re
import tempfile
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import amaranth
from amaranth.back import verilog
from amaranth.lib import wiring

from hdl.lib.vendor import VERILOG_SIM_PLATFORM

__all__ = ["REPO_ROOT", "BUILD_ROOT", "HDL_DIR", "MODELS_DIR", "SIM_MODELS_DIR", "GC_THRESHOLD",
           "generate", "design_hash", "atomic_write", "locked", "for_icarus", "model_sources"]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_ROOT = REPO_ROOT / "build"
HDL_DIR = REPO_ROOT / "hdl"
MODELS_DIR = Path(__file__).resolve().parent / "vendor"
#: Verilog of the project's own simulation-only modules (the host bridge's rings).
SIM_MODELS_DIR = Path(__file__).resolve().parent / "models"


def atomic_write(path: Path, text: str) -> None:
    """Write *text* to *path* through a temporary file in the same folder and a rename, so
    concurrent writers and readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide build products from other users
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive lock on the file *path* (created if missing), across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _factory_identity(factory: Callable) -> str:
    """A string that changes when the factory could build something different: its bytecode
    and constants, what its globals name, and the values it closes over or binds."""
    if isinstance(factory, functools.partial):
        return (f"partial({_factory_identity(factory.func)}, {factory.args!r}, "
                f"{sorted(factory.keywords.items())!r})")
    code = getattr(factory, "__code__", None)
    if code is None:            # a class or a builtin: its name says what it builds
        return f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', factory)}"
    # A function by what it does, not by where it is written: the same `lambda: Core(config)`
    # in two test modules is one design (one conversion, seconds for a core), so its globals
    # count by what they name (the class `Core`), and its own name and module not at all.
    scope = getattr(factory, "__globals__", {})
    parts = [code.co_code.hex(), repr(code.co_consts), repr(code.co_names)]
    for name in code.co_names:
        if name in scope:
            value = scope[name]
            named = isinstance(value, (type, types.FunctionType, types.ModuleType))
            parts.append(f"{name}=" + (f"{getattr(value, '__module__', '')}."
                                       f"{getattr(value, '__qualname__', value.__name__)}"
                                       if named else repr(value)))
    for cell in getattr(factory, "__closure__", None) or ():
        parts.append(repr(cell.cell_contents))
    return "\n".join(parts)


def design_hash(config_key: str, factory: Callable) -> str:
    """Hash of everything :func:`generate`'s output depends on (Amaranth's version too)."""
    h = hashlib.sha256()
    h.update(f"{config_key}\n{_factory_identity(factory)}\n{amaranth.__version__}\n".encode())
    for source in sorted(HDL_DIR.rglob("*.py")):     # subpackages too
        name = source.relative_to(HDL_DIR).as_posix()
        h.update(name.encode() + b"\0" + source.read_bytes() + b"\0")
    return h.hexdigest()


#: Thresholds of the cyclic garbage collector for work that builds large, long-lived object
#: graphs (Python's default is (700, 10, 10)): a conversion here, and the test processes
#: (tests/conftest.py). Amaranth builds millions of netlist objects, and with the default
#: the collector's passes over them were a third of a large design's conversion time.
GC_THRESHOLD = (100_000, 50, 100)


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """:data:`GC_THRESHOLD` (or the thresholds set, where higher) for a conversion."""
    old = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(old, GC_THRESHOLD, strict=True)))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def generate(name: str, factory: Callable[[], wiring.Component], config_key: str,
             build_root: Path = BUILD_ROOT) -> Path:
    """Verilog for ``factory()`` as module *name*, cached; returns the ``.v`` path.

    Parameters
    ----------
    name : str
        Top-level module name (and file name).
    factory : callable
        Builds a fresh component, e.g. ``lambda: SystolicArray(config)``.
    config_key : str
        Names the configuration (a preset name such as ``small``); part of the folder name.
    build_root : Path
        Root of the build tree (``build/``).
    """
    digest = design_hash(config_key, factory)
    out_dir = Path(build_root) / "verilog" / f"{name}-{config_key}" / digest[:16]
    out = out_dir / f"{name}.v"
    stamp = out_dir / f"{name}.stamp"
    if out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    # The lock only saves a second worker the same conversion; the renames alone keep
    # readers safe (a reader that skips the lock sees the old or the new file, whole).
    with locked(out_dir.parent / f".{out_dir.name}.lock"):
        if out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
            return out
        with _fewer_collections():
            text = verilog.convert(factory(), name=name, platform=VERILOG_SIM_PLATFORM)
        # Verilog first, stamp second: a matching stamp always means a complete, current file.
        atomic_write(out, text)
        atomic_write(stamp, digest + "\n")
    return out


# Yosys makes every `always @*` block also wait on a dummy register declared as
# `reg \$auto$verilog_backend...$N = 0;`, so that each block runs once at time 0. Under
# SystemVerilog rules (cocotb's runner calls `iverilog -g2012`) a declaration's initial value is
# set before time 0 without an event, the blocks never run, and their outputs stay X until an
# input changes (seen: WeightFIFO's o_tiles X after reset). An `initial` assignment restores the
# time-0 event.
_TIME0_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S*)\s*= 0;$", re.MULTILINE)


def for_icarus(verilog_path: Path) -> Path:
    """A copy of *verilog_path* (``<name>.icarus.v``) whose time-0 triggers work in Icarus
    Verilog's SystemVerilog mode; rewritten only when it would change."""
    verilog_path = Path(verilog_path)
    out = verilog_path.with_name(verilog_path.stem + ".icarus.v")
    text = _TIME0_TRIGGER.sub(lambda m: f"{m[1]}reg {m[2]} ;\n{m[1]}initial {m[2]} = 1'h0;",
                              verilog_path.read_text())
    if not out.is_file() or out.read_text() != text:
        atomic_write(out, text)
    return out


def model_sources(verilog_path: Path,
                  models_dirs: tuple[Path, ...] = (MODELS_DIR, SIM_MODELS_DIR)) -> list[Path]:
    """The simulation models (``<dir>/<MODULE>.v`` for each of *models_dirs*) of the modules
    that the Verilog file *verilog_path* instantiates, sorted by name."""
    text = Path(verilog_path).read_text()
    found = []
    models = (model for folder in models_dirs for model in Path(folder).glob("*.v"))
    for model in sorted(models, key=lambda path: path.name):
        # Yosys writes an instance as `  NAME #(` or `  NAME instance_name (`.
        if re.search(rf"^\s*{re.escape(model.stem)}\s+(#|[\\\w])", text, re.MULTILINE):
            found.append(model)
    return found
