"""The house rules of docs/architecture.md, checked on the code: gpuk8s's modules import downward only (each layer
from the layers below it), there is no import cycle, no import is hidden inside a function (to dodge a cycle or
otherwise) but the CLI's lazy command registration, the pure decision modules never reach SSH or kubectl, and every
error gpuk8s raises for a person derives from gpuk8s.errors.GpuK8sError."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import gpuk8s
from gpuk8s.errors import GpuK8sError

ROOT = Path(gpuk8s.__file__).resolve().parent

# The layers, lowest first: a module may import modules of a lower layer and of its own package (docs/architecture.md
# draws the same map). The longest matching prefix decides a module's layer.
LAYERS: list[tuple[str, ...]] = [
    ("gpuk8s", "gpuk8s.__init__", "gpuk8s.text", "gpuk8s.lines", "gpuk8s.exitcodes", "gpuk8s.options"),  # words
    ("gpuk8s.logs",),
    ("gpuk8s.errors",),
    ("gpuk8s.plainyaml", "gpuk8s.versions"),  # the version matrix: what gpuk8s installs
    ("gpuk8s.localfiles", "gpuk8s.facts"),  # what a host is (typed facts, the probe's parsers)
    ("gpuk8s.mig",),  # MIG profiles and layouts
    ("gpuk8s.inventory",),  # what the user asked for (with the ssh config it names)
    ("gpuk8s.credentials", "gpuk8s.gpuplan", "gpuk8s.runtimeplan", "gpuk8s.driver", "gpuk8s.findings",
     "gpuk8s.mirrors", "gpuk8s.remote", "gpuk8s.ui"),
    ("gpuk8s.kube", "gpuk8s.fabricplan"),  # the cluster: kubectl seam, objects, manifests, images
    ("gpuk8s.bundle",),  # air-gapped bundles: the format, and building one (the images kube names)
    ("gpuk8s.playbook", "gpuk8s.preflight"),
    ("gpuk8s.doctor", "gpuk8s.install", "gpuk8s.health"),
    ("gpuk8s.phases",),
    ("gpuk8s.flows", "gpuk8s.doctor.fixes"),  # doctor --fix runs phases
    ("gpuk8s.report",),
    ("gpuk8s.commands",),
    ("gpuk8s.cli",),
    ("gpuk8s.__main__",),
]
# Imports inside a function that are allowed, and why: a command's start imports its own module only
# (docs/performance.md), so the CLI registers commands lazily.
LAZY = {("gpuk8s.cli", "gpuk8s.commands"), ("gpuk8s.cli", "gpuk8s.commands.inventory_import")}
# The pure decision modules: judging, planning and parsing, with no SSH and no kubectl anywhere below them
PURE = ["gpuk8s.doctor.classify", "gpuk8s.doctor.evidence", "gpuk8s.gpuplan", "gpuk8s.facts.parse",
        "gpuk8s.facts.mig", "gpuk8s.mig.layout", "gpuk8s.versions", "gpuk8s.kube.state", "gpuk8s.kube.allocation",
        "gpuk8s.kube.dra",
        "gpuk8s.preflight.host_checks", "gpuk8s.preflight.cluster_checks", "gpuk8s.mirrors",
        "gpuk8s.playbook.render", "gpuk8s.inventory.loader", "gpuk8s.driver.rules", "gpuk8s.facts.health",
        "gpuk8s.health.checks", "gpuk8s.driver.xid", "gpuk8s.facts.dcgm", "gpuk8s.fabricplan"]
TALKS = {"gpuk8s.remote", "gpuk8s.kube.client"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(("gpuk8s", *p.relative_to(ROOT).with_suffix("").parts))
        out[name.removesuffix(".__init__")] = p
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported gpuk8s module, whether the import is inside a function) of one module; imports under
    `if TYPE_CHECKING:` count too (a cycle for the type checker is a cycle)."""
    tree = ast.parse(path.read_text())
    inner: set[int] = set()
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            inner |= {id(n) for n in ast.walk(f)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for n in names:
            t = _target(n) if n.startswith("gpuk8s") else None
            if t is not None and t != name:
                out.append((t, id(node) in inner))
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> int:
    best, rank = -1, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, rank = len(n), i
    return rank


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer(m) < 0] == []


def test_modules_import_downward_only() -> None:
    wrong = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, deps in GRAPH.items() for b, _ in deps
             if layer(b) > layer(a) or (layer(b) == layer(a) and _package(a) != _package(b))]
    assert wrong == []


def test_no_import_inside_a_function_but_the_lazy_commands() -> None:
    assert sorted({(a, b) for a, deps in GRAPH.items() for b, inner in deps if inner} - LAZY) == []


def test_no_import_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert cycles == []


@pytest.mark.parametrize("module", PURE)
def test_the_decision_modules_never_reach_ssh_or_kubectl(module: str) -> None:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [b for b, _ in GRAPH[m]]
    assert seen & TALKS == set()


def _exception_classes() -> list[type[BaseException]]:
    out = []
    for info in pkgutil.walk_packages(gpuk8s.__path__, "gpuk8s."):
        if info.name == "gpuk8s.__main__":
            continue
        mod = importlib.import_module(info.name)
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                if issubclass(c, BaseException) and c.__module__ == info.name]
    return out


def test_every_error_derives_from_the_one_base_and_no_two_share_a_name() -> None:
    classes = _exception_classes()
    # private ones are control flow inside one module; Interrupted is a signal (SIGINT), not an error
    public = [c for c in classes if not c.__name__.startswith("_") and c.__name__ != "Interrupted"]
    assert len(public) >= 15  # the check below must see them: a walk that found none would pass it
    assert [f"{c.__module__}.{c.__name__}" for c in public if not issubclass(c, GpuK8sError)] == []
    names = [c.__name__ for c in public]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_docs_architecture_puts_every_module_on_the_map() -> None:
    """docs/architecture.md names every module (by its path below gpuk8s/) in the layer the test above enforces."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    table = {}
    for row in doc.splitlines():
        cells = row.split("|")
        if len(cells) > 3 and cells[1].strip().split(" ")[0].isdigit():
            for path in cells[2].replace("`", "").split(","):
                if path.strip().endswith(".py"):
                    table[path.strip()] = int(cells[1].strip().split(" ")[0])
    for name, path in MODULES.items():
        rel = str(path.relative_to(ROOT))
        if rel.endswith("/__init__.py") and "def " not in path.read_text():
            continue  # a package's marker: its modules are on the map
        assert rel in table, f"{rel} is not on the map of docs/architecture.md"
        assert table[rel] == layer(name), f"{rel}: layer {table[rel]} in the doc, {layer(name)} in LAYERS"
