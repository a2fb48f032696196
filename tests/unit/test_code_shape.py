"""No class of the repository's own packages is over 400 lines or 25 methods.

Every ``.py`` file of the shared core (``services``, without the generated ``services.pb``),
of every process package (a top-level ``*_svc`` folder) and of the ``meshrl`` command
(``meshrl_cli``) is parsed with :mod:`ast`; every class, nested ones included, is measured:
its lines (``class`` line to its last line, docstring and comments included) and its
methods (the ``def`` / ``async def`` statements directly in its body, properties and
static methods included; inherited ones are not counted). A class over either limit is a
sign it does several things: split it by concern (docs/weights.md's module table shows how
the weight channel was split).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400
MAX_METHODS = 25
SKIP = ("services/pb",)  # generated gRPC / protobuf code


def packages(root: Path) -> list[Path]:
    """The repository's own packages: services, every *_svc folder, meshrl_cli."""
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and (p.name in ("services", "meshrl_cli") or p.name.endswith("_svc")))


def class_shapes(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified class name, lines, methods)`` of every class in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in child.body)
                out.append((name, lines, methods))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def oversized(root: Path, max_lines: int = MAX_LINES, max_methods: int = MAX_METHODS) -> list[str]:
    """Every class under ``root``'s packages over a limit, as ``path:Class (N lines, M methods)``."""
    bad = []
    for pkg in packages(root):
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SKIP):
                continue
            for name, lines, methods in class_shapes(path):
                if lines > max_lines or methods > max_methods:
                    bad.append(f"{rel}:{name} ({lines} lines, {methods} methods)")
    return bad


def test_packages_are_found():
    names = {p.name for p in packages(REPO)}
    assert {"services", "trainer_svc", "rollout_svc", "meshrl_cli"} <= names


def test_no_class_over_the_limits():
    bad = oversized(REPO)
    assert not bad, (f"classes over {MAX_LINES} lines or {MAX_METHODS} methods (split them by concern):\n  "
                     + "\n  ".join(bad))


def test_the_check_finds_an_oversized_class(tmp_path):
    """The check itself can fail: a synthetic package with one class of too many methods,
    one of too many lines (a nested class among them), one within the limits, and a
    generated-code folder that is skipped."""
    pkg = tmp_path / "demo_svc"
    pkg.mkdir()
    many = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(MAX_METHODS + 1))
    (pkg / "many.py").write_text(f"class Many:\n{many}\n")
    long_body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "long.py").write_text(f"class Outer:\n    class Long:\n        '''doc'''\n{long_body}\n")
    fine = "\n".join(f"    @property\n    def p{i}(self):\n        return {i}\n" for i in range(MAX_METHODS))
    (pkg / "fine.py").write_text(f"class Fine:\n{fine}\n")
    gen = tmp_path / "services" / "pb"
    gen.mkdir(parents=True)
    (gen / "big_pb2.py").write_text(f"class Generated:\n{many}\n")
    bad = oversized(tmp_path)
    assert bad == [
        f"demo_svc/long.py:Outer ({MAX_LINES + 3} lines, 0 methods)",
        f"demo_svc/long.py:Outer.Long ({MAX_LINES + 2} lines, 0 methods)",
        f"demo_svc/many.py:Many ({3 * (MAX_METHODS + 1)} lines, {MAX_METHODS + 1} methods)",
    ]
