"""The import graph keeps its layers and has no cycles (docs/architecture.md, "Layers").

Every ``.py`` file of the shared core (``services``), of every process package (a
top-level ``*_svc`` folder: one per running process) and of the ``meshrl`` command
(``meshrl_cli``) is parsed with :mod:`ast`; every ``import`` statement counts, at module
level or inside a function, under ``if TYPE_CHECKING`` or not (a lazy import is still an
arrow between the two modules). So does a string the core imports from: a string constant
in a core module that names a module of a process package or of the CLI (``"pkg.mod"`` or
``"pkg.mod:attr"``, the form registries and ``importlib.import_module`` take). The checks:

(a) the core imports no process package and not the CLI, by statement or by string, with
    no exemption; the generated ``services.pb`` is not scanned;
(b) a process package imports no other process package and not the CLI;
(c) inside the core, a module imports only modules of its own layer or of a lower one
    (:data:`CORE_LAYERS`), and every core module belongs to a layer;
(d) no two modules import each other, directly or around a loop (a strongly connected
    component of more than one module).

How an import becomes an edge (only edges between the scanned modules are kept):

- ``import a.b.c`` is an edge to the module ``a.b.c``; ``from a.b import c`` is an edge to
  ``a.b.c`` when that is a module, else to ``a.b`` (``c`` is a name defined there);
  relative imports are resolved against the importing module's package.
- A package is its ``__init__`` module. Importing ``a.b.c`` also runs ``a/__init__`` and
  ``a/b/__init__``, but that is *not* an edge: otherwise every package whose ``__init__``
  re-exports a submodule would be a cycle with that submodule. An ``__init__`` that
  re-exports (``from a.b.c import X``) is an edge ``a.b -> a.b.c``; a cycle through it
  exists only when some module imports a name *from the package* (``from a.b import X``)
  and is itself imported, directly or not, by the ``__init__``: that module depends on
  the ``__init__`` having run first, which is the order problem a cycle means. (The one
  place this rule lets through on purpose: ``services.wire``'s ``__init__`` imports
  ``DataProto`` inside ``decode``, as its default class, because ``services.protocol``
  imports ``services.wire.batches`` and so runs that ``__init__`` while it loads.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "services"
#: The ``meshrl`` command: it dispatches to the processes' ``main``s (nothing imports it).
CLI = "meshrl_cli"
#: The layers of the core, lowest first: a core module may import its own layer and the
#: ones before it. Each entry is a module or a subpackage of ``services`` (the longest
#: entry that contains a module gives its layer).
CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("services", "services.net", "services.readiness", "services.placement", "services.registry",
     "services.safe_arith", "services.failures", "services.auth"),
    ("services.wire", "services.protocol"),
    ("services.config", "services.data"),
    ("services.metrics", "services.modelling", "services.sandbox", "services.queues", "services.weights"),
    ("services.procs", "services.supervision", "services.ledger", "services.handoff", "services.entrypoint",
     "services.fleets", "services.ray_launcher"),
)
#: A string that names a module the way ``importlib.import_module`` or a registry entry
#: (``"pkg.mod:attr"``) does.
MODULE_STRING = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*(?::\w+)?")
#: Generated code (protobuf stubs): not written by hand, not checked.
GENERATED = ("services.pb",)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """``{module name: file}`` for every ``.py`` file under the given top-level packages."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not _within(name, GENERATED):
                out[name] = path
    return out


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The scanned module ``target`` names, or its longest scanned prefix (None: external
    or generated)."""
    if _within(target, GENERATED):
        return None
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The scanned modules that ``name`` (at ``path``) imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != name:
                out.add(resolved)
    return out


def is_process_package(top: str) -> bool:
    """A top-level ``*_svc`` package: one per running process."""
    return re.fullmatch(r"[a-z]\w*_svc", top) is not None


def scanned_packages(root: Path) -> tuple[str, ...]:
    """The core, the CLI and every process package under ``root``."""
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                        and (p.name in (CORE, CLI) or is_process_package(p.name))))


def string_imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The process or CLI modules a core file names in a string constant (a registry entry,
    an ``import_module`` argument): an import by another route."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            target = node.value.partition(":")[0]
            if _top(target) == CLI or is_process_package(_top(target)):
                out.add(_resolve(target, modules) or target)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over every scanned module (for a core module, the
    process and CLI modules it names in strings too)."""
    modules = module_files(root, scanned_packages(root))
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    for name, path in modules.items():
        if _top(name) == CORE:
            graph[name] |= string_imports_of(path, modules)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def _top(module: str) -> str:
    return module.partition(".")[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """(a): ``core.module -> process_or_cli.module``, with no exemption."""
    return sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                  if _top(src) == CORE and (_top(dst) == CLI or is_process_package(_top(dst))))


def sideways_imports(graph: dict[str, set[str]]) -> list[str]:
    """(b): ``one_svc.module -> other_svc.module`` or ``some_svc.module -> the CLI``."""
    return sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                  if is_process_package(_top(src)) and _top(dst) != _top(src)
                  and (_top(dst) == CLI or is_process_package(_top(dst))))


def core_layer(module: str, layers: tuple[tuple[str, ...], ...] = CORE_LAYERS) -> int | None:
    """The index of ``module``'s layer: that of the longest entry containing it (None: in none)."""
    best: tuple[int, int] | None = None
    for i, layer in enumerate(layers):
        for entry in layer:
            hit = module == entry if entry == CORE else _within(module, (entry,))  # the bare core: its __init__ only
            if hit and (best is None or len(entry) > best[1]):
                best = (i, len(entry))
    return None if best is None else best[0]


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = CORE_LAYERS) -> list[str]:
    """(c): a core module in no layer, or one that imports a core module of a higher layer."""
    core = sorted(m for m in graph if _top(m) == CORE)
    out = [f"{m} is in no layer of CORE_LAYERS" for m in core if core_layer(m, layers) is None]
    for src in core:
        for dst in sorted(graph[src]):
            hi, lo = core_layer(src, layers), core_layer(dst, layers)
            if _top(dst) == CORE and hi is not None and lo is not None and lo > hi:
                out.append(f"{src} (layer {hi}) -> {dst} (layer {lo})")
    return out


def shortest_loop(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One shortest import loop through the component's first module (breadth-first)."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    loop = [node]
                    while loop[-1] != start:
                        loop.append(came_from[loop[-1]])
                    return [*reversed(loop), start]
                if child not in came_from:
                    came_from[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{component} is not a strongly connected component")


def _cycle_report(components: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "\n".join(f"{len(c)} modules ({', '.join(c)}), e.g. " + " -> ".join(shortest_loop(c, graph))
                     for c in components)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_scan_sees_the_packages(graph):
    """A scan that found nothing would pass every check: make sure it sees real edges."""
    assert "services.sandbox.process" in graph["reward_svc.sandbox.pool"]
    assert "services.registry" in graph["trainer_svc.algos.registry"]  # module level
    assert "services.sandbox.child" in graph["reward_svc.sandbox.worker"]
    assert "reward_svc.loader" in graph["reward_svc.sandbox.worker"]  # inside a function


def test_every_process_is_a_top_level_package(graph):
    tops = {_top(m) for m in graph}
    assert {"trainer_svc", "rollout_svc", "reward_svc", "feeder_svc", "controller_svc", "gateway_svc",
            "worker_svc", CLI, CORE} <= tops
    assert not any(_top(m) == CORE and m.split(".")[1:2] in (["gateway"], ["launch"], ["cli"]) for m in graph)


def test_the_shared_core_imports_no_process_package(graph):
    bad = upward_imports(graph)
    assert not bad, "the shared core imports a process package or the CLI:\n" + "\n".join(bad)


def test_no_process_package_imports_another_or_the_cli(graph):
    bad = sideways_imports(graph)
    assert not bad, "a process package imports another, or the CLI:\n" + "\n".join(bad)


def test_the_core_keeps_its_layers(graph):
    bad = layer_violations(graph)
    assert not bad, "the core's layers are broken:\n" + "\n".join(bad)


def test_no_import_cycles(graph):
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + _cycle_report(cycles, graph)


# -- the checks themselves can fail ---------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return import_graph(tmp_path)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    g = _tree(tmp_path, {
        "services/__init__.py": "",
        "services/a.py": "from services import b\n",
        "services/b.py": "def f():\n    from .c import x\n",
        "services/c.py": "import services.a\nx = 1\n",
        "services/d.py": "from services.a import y\n",
    })
    assert strongly_connected(g) == [["services.a", "services.b", "services.c"]]
    assert shortest_loop(["services.a", "services.b", "services.c"], g) == [
        "services.a", "services.b", "services.c", "services.a"]


def test_package_reexports_are_no_cycle_unless_a_submodule_imports_the_package(tmp_path):
    files = {
        "services/__init__.py": "",
        "services/p/__init__.py": "from services.p.m import X\n",
        "services/p/m.py": "from services.p.n import Y\nX = Y\n",
        "services/p/n.py": "Y = 1\n",
    }
    assert strongly_connected(_tree(tmp_path, files)) == []
    files["services/p/n.py"] = "from services.p import X as Y\n"
    assert strongly_connected(_tree(tmp_path, files)) == [["services.p", "services.p.m", "services.p.n"]]


def test_upward_and_sideways_arrows_are_found(tmp_path):
    g = _tree(tmp_path, {
        "services/__init__.py": "",
        "services/config/__init__.py": "import typing\nif typing.TYPE_CHECKING:\n    import trainer_svc.algo\n",
        "services/registry.py": "LAUNCHERS = {'local': 'gateway_svc.launch:Local'}\nHELP = 'see gateway_svc.launch'\n",
        "meshrl_cli/__init__.py": "def main():\n    import reward_svc\n",
        "services/pb/x_pb2.py": "import rollout_svc\n",
        "trainer_svc/__init__.py": "",
        "trainer_svc/algo.py": "from reward_svc.scorers import f\n",
        "reward_svc/__init__.py": "",
        "reward_svc/scorers.py": "from services import config\nf = 1\n",
        "rollout_svc/__init__.py": "def f():\n    from meshrl_cli import main\n",
        "gateway_svc/__init__.py": "",
        "gateway_svc/launch.py": "",
    })
    assert upward_imports(g) == ["services.config -> trainer_svc.algo", "services.registry -> gateway_svc.launch"]
    assert sideways_imports(g) == ["rollout_svc -> meshrl_cli", "trainer_svc.algo -> reward_svc.scorers"]


def test_an_import_up_the_cores_layers_is_found(tmp_path):
    g = _tree(tmp_path, {
        "services/__init__.py": "",
        "services/net.py": "",
        "services/wire/__init__.py": "from services import net\n",
        "services/config/__init__.py": "from services.wire import x\n",
        "services/new_thing.py": "",
    })
    layers = (("services", "services.net"), ("services.wire",), ("services.config",))
    assert layer_violations(g, layers) == ["services.new_thing is in no layer of CORE_LAYERS"]
    (tmp_path / "services/net.py").write_text("def f():\n    import services.config\n")
    g = import_graph(tmp_path)
    assert "services.net (layer 0) -> services.config (layer 2)" in layer_violations(g, layers)
