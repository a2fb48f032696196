"""The import graph keeps its layers and has no cycles (docs/architecture.md, "Layers").

Every ``.py`` file of the shared core (``services``) and of the service packages
(``trainer_svc``, ``rollout_svc``, ``reward_svc``, ``feeder_svc``) is parsed with
:mod:`ast`; every ``import`` statement counts, at module level or inside a function, under
``if TYPE_CHECKING`` or not (a lazy import is still an arrow between the two modules).
The checks:

(a) a module of the shared core imports no service package, except ``services.cli``
    (the application's top, which starts the services); the generated ``services.pb``
    is not scanned;
(b) a service package imports no other service package;
(c) no two modules import each other, directly or around a loop (a strongly connected
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
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "services"
SERVICE_PACKAGES = ("trainer_svc", "rollout_svc", "reward_svc", "feeder_svc")
#: Core modules allowed to import service packages: the CLI is the application's top.
CORE_TOP = ("services.cli",)
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


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = (CORE, *SERVICE_PACKAGES)) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over every scanned module."""
    present = tuple(p for p in packages if (root / p).is_dir())
    modules = module_files(root, present)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


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
    """(a): ``core.module -> service.module`` for every core module outside the CLI."""
    return sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                  if _top(src) == CORE and not _within(src, CORE_TOP) and _top(dst) in SERVICE_PACKAGES)


def sideways_imports(graph: dict[str, set[str]]) -> list[str]:
    """(b): ``one_svc.module -> other_svc.module``."""
    return sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts
                  if _top(src) in SERVICE_PACKAGES and _top(dst) in SERVICE_PACKAGES and _top(src) != _top(dst))


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


def test_the_shared_core_imports_no_service_package(graph):
    bad = upward_imports(graph)
    assert not bad, "the shared core imports a service package:\n" + "\n".join(bad)


def test_no_service_package_imports_another(graph):
    bad = sideways_imports(graph)
    assert not bad, "a service package imports another:\n" + "\n".join(bad)


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
        "services/cli/__init__.py": "def main():\n    import reward_svc\n",
        "services/pb/x_pb2.py": "import rollout_svc\n",
        "trainer_svc/__init__.py": "",
        "trainer_svc/algo.py": "from reward_svc.scorers import f\n",
        "reward_svc/__init__.py": "",
        "reward_svc/scorers.py": "from services import config\nf = 1\n",
        "rollout_svc/__init__.py": "",
    })
    assert upward_imports(g) == ["services.config -> trainer_svc.algo"]
    assert sideways_imports(g) == ["trainer_svc.algo -> reward_svc.scorers"]
