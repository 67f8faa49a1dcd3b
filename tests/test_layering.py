"""The project imports in one direction (docs/architecture.md).

- Packages: hdl <- sim <- firmware, boards -> hdl, and nothing outside tests/ imports from
  tests/.
- Modules: no import circle among the modules of hdl, sim, firmware, boards and bench.
- Sub-packages: inside hdl/, sim/ and firmware/ each part imports only the parts below it
  (:data:`LAYERS`).

Imports are read from the source, not executed: absolute and relative ones, at the top of a
file or inside a function or an ``if``. ``import a.b`` and ``from a import b`` (when ``a.b``
is a module) are an edge to ``a.b`` alone; the package ``a`` it passes through is not counted,
since a package's ``__init__`` importing its own modules is no circle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What each package may import of the project's packages.
ALLOWED = {
    "hdl": {"hdl"},
    "sim": {"hdl", "sim"},
    "firmware": {"hdl", "sim", "firmware"},
    "boards": {"hdl", "boards"},
    "bench": {"hdl", "sim", "firmware", "boards", "bench"},
}
PROJECT = {"hdl", "sim", "firmware", "boards", "bench", "tests"}

_HDL_GROUND = ("hdl.lib", "hdl.config", "hdl.presets", "hdl.isa", "hdl.beats", "hdl.layouts",
               "hdl.ports")
_HDL_MEMORY = (*_HDL_GROUND, "hdl.memory")
_HDL_DATAPATH = (*_HDL_MEMORY, "hdl.datapath")
_HDL_CONTROL = (*_HDL_DATAPATH, "hdl.control")
_HDL_CORE = (*_HDL_CONTROL, "hdl.core")
_SIM_MODELS = ("hdl", "sim.models")
_SIM_RTL = (*_SIM_MODELS, "sim.rtl")
_SIM_WAVES = (*_SIM_RTL, "sim.waves")

#: Per package, its parts (a module or a sub-package, matched as a name prefix) and the parts
#: each may import; a part always may import itself. A module of the package that no part
#: names fails the test: a new part needs a place in its layer.
LAYERS: dict[str, dict[str, tuple[str, ...]]] = {
    "hdl": {
        # Ground: the configuration, the ISA, shared layouts and ports, generic helpers.
        **{part: _HDL_GROUND for part in _HDL_GROUND},
        "hdl.memory": _HDL_MEMORY,
        "hdl.datapath": _HDL_DATAPATH,
        "hdl.control": _HDL_CONTROL,
        "hdl.core": _HDL_CORE,
        # board_core composes the UART, the host link and the core.
        "hdl.link": (*_HDL_CORE, "hdl.link"),
    },
    "sim": {
        "sim.models": _SIM_MODELS,
        "sim.rtl": _SIM_RTL,
        "sim.waves": _SIM_WAVES,
        "sim.formal": (*_SIM_WAVES, "sim.formal"),
    },
    "firmware": {
        # The Device protocol and the transport registry: a leaf that opens a transport by
        # name, never by an import.
        "firmware.device": ("hdl",),
        "firmware.transports": ("hdl", "sim", "firmware.device"),
        "firmware.asm": ("hdl", "sim"),
        "firmware.runtime": ("hdl", "firmware.device", "firmware.asm"),
        "firmware.nn": ("hdl", "sim"),
        "firmware.datasets": ("hdl", "sim"),
        # The demo's networks; the Transformer's quantiser builds an integer graph.
        "firmware.models": ("hdl", "sim", "firmware.nn", "firmware.datasets",
                            "firmware.quant", "firmware.graph"),
        "firmware.quant": ("hdl", "sim", "firmware.nn"),
        "firmware.gemm": ("hdl", "sim", "firmware.asm"),
        "firmware.isadoc": ("hdl", "sim", "firmware.asm"),
        # The compiler takes the integer graph (and, for now, the layer API's quantised
        # networks); its executables implement the runtime's protocol.
        "firmware.compiler": ("hdl", "sim", "firmware.asm", "firmware.nn", "firmware.quant",
                              "firmware.fixedpoint", "firmware.graph", "firmware.runtime"),
        # Running a graph: lowered and compiled, then run on a device.
        "firmware.runtime.graph": ("hdl", "sim", "firmware.device", "firmware.asm",
                                   "firmware.runtime", "firmware.graph", "firmware.compiler"),
        # Model import: gemmlowp's fixed point and the format-neutral integer graph (below the
        # compiler), and the importers that produce it.
        "firmware.fixedpoint": ("hdl", "sim"),
        "firmware.graph": ("hdl", "sim", "firmware.fixedpoint", "firmware.quant"),
        "firmware.importers": ("hdl", "sim", "firmware.fixedpoint", "firmware.nn",
                               "firmware.quant", "firmware.graph"),
        # The ONNX demo: a digits MLP exported, imported and run on a device.
        "firmware.onnx_demo": ("hdl", "sim", "firmware.models", "firmware.datasets",
                               "firmware.device", "firmware.graph", "firmware.importers",
                               "firmware.runtime"),
        # The Transformer demo: its int8 graph run on a device.
        "firmware.transformer_demo": ("hdl", "sim", "firmware.models", "firmware.datasets",
                                      "firmware.device", "firmware.graph", "firmware.compiler",
                                      "firmware.runtime"),
        # The host link's bytes per image, counted with the serial transport's own frames.
        "firmware.linkrate": ("hdl", "sim", "firmware.device", "firmware.transports"),
        # The command line sits on top and opens devices through firmware.device.
        "firmware.cli": ("hdl", "sim", "firmware"),
    },
}

#: The packages whose modules must not import in a circle.
GRAPH_PACKAGES = tuple(ALLOWED)


@dataclass(frozen=True)
class Import:
    """One import of a project module: who imports what, and where."""
    source: str         # importing module, dotted
    target: str         # imported module, dotted
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@cache
def _modules(packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` (a package by its __init__)."""
    return {_module_name(path): path
            for package in packages for path in sorted((ROOT / package).rglob("*.py"))}


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names, relative imports resolved; empty for
    other nodes."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    # `from a import b` names the module a.b when there is one, else something in a.
    return [f"{stem}.{alias.name}" for alias in node.names]


@cache
def _graph() -> tuple[Import, ...]:
    """Every import from a module of :data:`GRAPH_PACKAGES` of a module of the project's
    packages (``tests`` included, so a forbidden import of tests/ shows too)."""
    modules = _modules(GRAPH_PACKAGES)
    known = _modules(tuple(sorted(PROJECT)))
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        seen = set()
        for node in ast.walk(tree):
            for name in _imported_names(node, module, path.name == "__init__.py"):
                target = name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != module and (target, node.lineno) not in seen:
                    seen.add((target, node.lineno))
                    edges.append(Import(module, target, path, node.lineno))
    return tuple(sorted(edges, key=lambda e: (e.source, e.line, e.target)))


def _cycles(edges: tuple[Import, ...]) -> list[tuple[list[Import], set[str]]]:
    """One circle of imports in each strongly connected set of modules (Tarjan): the imports
    that close it, in order, and every module of the set."""
    succ: dict[str, list[Import]] = {}
    for edge in edges:
        succ.setdefault(edge.source, []).append(edge)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in succ.get(node, []):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(succ):
        if node not in index:
            visit(node)

    cycles = []
    for component in components:
        # Shortest way back to the component's first module (breadth first).
        start = min(component)
        came: dict[str, Import] = {}
        frontier = [start]
        while frontier and start not in came:
            nxt = []
            for node in frontier:
                for edge in succ.get(node, []):
                    if edge.target in component and edge.target not in came:
                        came[edge.target] = edge
                        nxt.append(edge.target)
            frontier = nxt
        path, node = [], start
        while True:
            edge = came[node]
            path.append(edge)
            node = edge.source
            if node == start:
                break
        cycles.append((path[::-1], component))
    return cycles


def _part(package: str, module: str) -> str | None:
    """The part of ``LAYERS[package]`` a module belongs to (the longest matching prefix)."""
    matches = [part for part in LAYERS[package]
               if module == part or module.startswith(part + ".")]
    return max(matches, key=len, default=None)


def _in(module: str, parts: tuple[str, ...]) -> bool:
    return any(module == part or module.startswith(part + ".") for part in parts)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package: str):
    bad = []
    for edge in _graph():
        top = edge.source.split(".")[0]
        if top == package and edge.target.split(".")[0] not in ALLOWED[package]:
            bad.append(str(edge))
    assert not bad, (f"{package}/ may import only {', '.join(sorted(ALLOWED[package]))}:\n"
                     + "\n".join(bad))


def test_no_import_cycle():
    cycles = _cycles(_graph())
    text = []
    for cycle, component in cycles:
        text += [f"  {edge}" for edge in cycle]
        if len(component) > len(cycle):
            text.append(f"  (in circles with each other: {', '.join(sorted(component))})")
        text.append("")
    if cycles:
        print("import circles:", *text, sep="\n")
        pytest.fail(f"{len(cycles)} import circle(s), each as the imports closing it:\n"
                    + "\n".join(text))


def _part_params():
    for package, layers in LAYERS.items():
        for part in layers:
            yield pytest.param(package, part, id=part)


@pytest.mark.parametrize(("package", "part"), list(_part_params()))
def test_subpackage_direction(package: str, part: str):
    allowed = (part, *LAYERS[package][part])
    bad = [f"{edge}" for edge in _graph()
           if _part(package, edge.source) == part and edge.target != package
           and not _in(edge.target, allowed)]
    assert not bad, (f"{part} may import only {', '.join(LAYERS[package][part])} of the "
                     f"project:\n" + "\n".join(bad))


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_has_a_layer(package: str):
    unplaced = sorted(module for module in _modules((package,))
                      if module != package and _part(package, module) is None)
    assert not unplaced, (f"modules of {package}/ in no part of LAYERS[{package!r}]: "
                          f"{', '.join(unplaced)}; add them to their layer")


def test_cycle_finder_reports_a_circle():
    """The finder itself: a three-module circle beside a straight line comes back whole."""
    path = ROOT / "x.py"
    edges = (Import("a", "b", path, 1), Import("b", "c", path, 2), Import("c", "a", path, 3),
             Import("c", "d", path, 4))
    assert [([(e.source, e.target) for e in cycle], component)
            for cycle, component in _cycles(edges)] == \
        [([("a", "b"), ("b", "c"), ("c", "a")], {"a", "b", "c"})]
